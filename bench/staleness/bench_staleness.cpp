// SPDX-License-Identifier: Apache-2.0
// Staleness micro-benchmarks: the control-plane cost per group (gate round trip, selection,
// the buffer adapter over a plain rollout_buffer) and the per-token kernels (stale-token mask,
// proximal interpolation) as a fraction of the copy bandwidth measured in the same run
// (counter `of_copy_bw`).
#include <rlpt/rollout/buffer.hpp>
#include <rlpt/staleness/buffer.hpp>
#include <rlpt/staleness/gate.hpp>
#include <rlpt/staleness/proximal.hpp>
#include <rlpt/staleness/selection.hpp>
#include <rlpt/staleness/token_mask.hpp>

#include "staleness/inputs.hpp"
#include "support/bandwidth.hpp"

#include <benchmark/benchmark.h>

#include <random>
#include <vector>

namespace {

using rlpt::index_t;

double copy_bw() {
  static const double bw = rlpt::bench::measure_copy_bandwidth(std::size_t{1} << 28, 3, 1).copy_gbps * 1e9;
  return bw;
}

void report_bandwidth(benchmark::State& state, double bytes_per_iter) {
  state.SetBytesProcessed(static_cast<std::int64_t>(static_cast<double>(state.iterations()) * bytes_per_iter));
  state.counters["of_copy_bw"] =
      benchmark::Counter(bytes_per_iter / copy_bw(), benchmark::Counter::kIsIterationInvariantRate);
}

// One group's life in the gate: admit, accept, consume (a publish every B groups).
void BM_gate_round_trip(benchmark::State& state) {
  rlpt::staleness_gate g({.max_staleness = 2, .batch_groups = 64, .max_concurrent = 256});
  index_t n = 0;
  for (auto _ : state) {
    const rlpt::ticket t = g.try_admit();
    g.accept(t);
    g.consume(t);
    if (++n % 64 == 0) g.publish();
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_gate_round_trip);

// pick_batch over `range(0)` ready groups (versions spread over the window), 64 wanted.
void BM_pick_batch(benchmark::State& state, rlpt::stale_policy pol) {
  const auto n = static_cast<std::size_t>(state.range(0));
  std::mt19937 rng(3);
  std::vector<rlpt::candidate> ready(n);
  for (auto& c : ready) c.version = static_cast<rlpt::policy_version>(10 + rng() % 5);
  const std::vector<rlpt::version_count> flying{{11, -1, 20}, {13, -1, 40}, {14, -1, 64}};
  for (auto _ : state)
    benchmark::DoNotOptimize(rlpt::pick_batch(ready, 64, 14, {.max_staleness = 4, .on_stale = pol}, flying));
  state.SetItemsProcessed(state.iterations() * static_cast<std::int64_t>(n));
}
BENCHMARK_CAPTURE(BM_pick_batch, drop, rlpt::stale_policy::drop)->Arg(64)->Arg(1024)->Arg(16384);
BENCHMARK_CAPTURE(BM_pick_batch, wait, rlpt::stale_policy::wait)->Arg(64)->Arg(1024)->Arg(16384);

rlpt::trajectory small_record(std::int64_t gid, std::int32_t s, rlpt::policy_version v) {
  const std::vector<rlpt::token_id> prompt{1, 2, 3, 4};
  const std::vector<rlpt::token_id> out{5, 6, 7, 8, 9, 10, 11, 12};
  const std::vector<float> lp(out.size(), -0.5f);
  rlpt::trajectory_builder b(gid, prompt);
  b.model(out, lp, v).reward(static_cast<float>(s));
  rlpt::trajectory t = std::move(b).finish();
  t.sample_index = s;
  return t;
}

// Push 8 groups of 4 records and pop them as one batch: through the adapter (gate, tickets,
// selector) or straight into the rollout buffer. The difference is the adapter's overhead.
void BM_buffer_groups(benchmark::State& state, bool adapter) {
  constexpr index_t groups = 8, size = 4;
  std::vector<std::vector<rlpt::trajectory>> recs(groups);
  for (index_t g = 0; g < groups; ++g)
    for (index_t s = 0; s < size; ++s)
      recs[static_cast<std::size_t>(g)].push_back(small_record(g, static_cast<std::int32_t>(s), 0));
  rlpt::staleness_gate gate({.max_staleness = 1000000, .batch_groups = groups, .max_concurrent = 64});
  rlpt::staleness_buffer sb(gate, {.capacity_groups = 64, .group_size = size}, {.select = {.max_staleness = 1}});
  rlpt::rollout_buffer plain({.capacity_groups = 64, .group_size = size});
  std::int64_t base = 0;
  for (auto _ : state) {
    state.PauseTiming();
    auto batch = recs;
    for (auto& g : batch)
      for (auto& r : g) r.group_id += base;
    base += groups;
    state.ResumeTiming();
    if (adapter) {
      for (auto& g : batch) {
        const rlpt::ticket t = gate.try_admit();
        for (auto& r : g) sb.push(t, std::move(r));
      }
      benchmark::DoNotOptimize(sb.pop(groups));
    } else {
      for (auto& g : batch)
        for (auto& r : g) plain.push(std::move(r));
      benchmark::DoNotOptimize(plain.pop(groups));
    }
  }
  state.SetItemsProcessed(state.iterations() * groups);
}
BENCHMARK_CAPTURE(BM_buffer_groups, rollout_buffer, false);
BENCHMARK_CAPTURE(BM_buffer_groups, staleness_buffer, true);

void BM_mask_stale_tokens(benchmark::State& state) {
  const index_t n = state.range(0);
  const auto in = rlpt::bench::make_token_inputs(n);
  const rlpt::token_layout layout = rlpt::token_layout::packed(in.offsets);
  std::vector<rlpt::mask_t> out(static_cast<std::size_t>(n));
  for (auto _ : state) {
    benchmark::DoNotOptimize(rlpt::mask_stale_tokens(layout, in.versions, in.mask, in.current, out, {.max_age = 3}));
    benchmark::ClobberMemory();
  }
  report_bandwidth(state, static_cast<double>(n) * (4 + 1 + 1)); // versions + mask in, mask out
}
BENCHMARK(BM_mask_stale_tokens)->Arg(1 << 22)->Unit(benchmark::kMillisecond);

void BM_proximal_logprobs(benchmark::State& state) {
  const index_t n = state.range(0);
  const auto in = rlpt::bench::make_token_inputs(n);
  std::vector<float> out(static_cast<std::size_t>(n));
  for (auto _ : state) {
    benchmark::DoNotOptimize(rlpt::proximal_logprobs(in.behav, in.cur, in.versions, in.mask, in.current, out));
    benchmark::ClobberMemory();
  }
  report_bandwidth(state, static_cast<double>(n) * (4 + 4 + 4 + 1 + 4)); // behav, cur, versions, mask in; out
}
BENCHMARK(BM_proximal_logprobs)->Arg(1 << 22)->Unit(benchmark::kMillisecond);

} // namespace

BENCHMARK_MAIN();
