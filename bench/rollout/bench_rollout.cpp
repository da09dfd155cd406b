// SPDX-License-Identifier: Apache-2.0
// Rollout micro-benchmarks: rank balancing, micro-batch planning, packing, and the buffer's
// single-thread push/pop cost. Side-by-side figures against verl: scripts/bench-peers
// (bench/peers/blocks/rollout.py).
#include <rlpt/rollout.hpp>

#include <benchmark/benchmark.h>

#include <cmath>
#include <random>
#include <vector>

namespace {

std::vector<rlpt::index_t> lognormal_lengths(std::size_t n, unsigned seed = 1) {
  std::mt19937_64 g(seed);
  std::lognormal_distribution<double> d(std::log(2000.0), 0.8);
  std::vector<rlpt::index_t> l(n);
  for (auto& x : l) x = std::min<rlpt::index_t>(16384, 256 + static_cast<rlpt::index_t>(d(g)));
  return l;
}

void BM_balance(benchmark::State& state) {
  const auto len = lognormal_lengths(static_cast<std::size_t>(state.range(0)));
  const rlpt::balance_options o{.ranks = state.range(1),
                                .algorithm = static_cast<rlpt::partition_algorithm>(state.range(2))};
  double imbalance = 0;
  for (auto _ : state) {
    const rlpt::partition p = rlpt::balance(len, o);
    imbalance = p.imbalance();
    benchmark::DoNotOptimize(imbalance);
  }
  state.counters["max/mean"] = imbalance;
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations()) * state.range(0));
}
BENCHMARK(BM_balance)
    ->ArgNames({"N", "k", "algo"})
    ->ArgsProduct({{1024, 65536}, {8, 64}, {0, 1, 2}})
    ->Unit(benchmark::kMicrosecond);

void BM_plan_microbatches(benchmark::State& state) {
  const auto len = lognormal_lengths(static_cast<std::size_t>(state.range(0)));
  const rlpt::microbatch_options o{.token_budget = 16384,
                                   .algorithm = static_cast<rlpt::pack_algorithm>(state.range(1))};
  for (auto _ : state) benchmark::DoNotOptimize(rlpt::plan_microbatches(len, o));
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations()) * state.range(0));
}
BENCHMARK(BM_plan_microbatches)
    ->ArgNames({"N", "algo"})
    ->ArgsProduct({{256, 4096}, {0, 1}})
    ->Unit(benchmark::kMicrosecond);

rlpt::trajectory record(std::int64_t group, std::int32_t sample, std::size_t n) {
  rlpt::trajectory t;
  t.group_id = group;
  t.sample_index = sample;
  t.prompt_len = 1;
  t.tokens.assign(n, 3);
  t.loss_mask.assign(n, 1);
  t.loss_mask[0] = 0;
  t.logprobs.assign(n, -1.0f);
  t.versions.assign(n, 0);
  t.versions[0] = -1;
  t.rewards = {static_cast<float>(sample % 2)};
  return t;
}

// One thread pushes groups of 8 and pops them: the uncontended cost per record.
void BM_buffer_push_pop(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  rlpt::rollout_buffer buf({.capacity_groups = 64, .group_size = 8});
  std::vector<rlpt::trajectory> group(8);
  std::int64_t id = 0;
  for (auto _ : state) {
    state.PauseTiming();
    for (std::int32_t s = 0; s < 8; ++s) group[static_cast<std::size_t>(s)] = record(id, s, n);
    state.ResumeTiming();
    for (auto& t : group) buf.push(std::move(t));
    benchmark::DoNotOptimize(buf.pop(1));
    ++id;
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations()) * 8);
}
BENCHMARK(BM_buffer_push_pop)->Arg(16)->Arg(1024)->Unit(benchmark::kMicrosecond);

void BM_pack(benchmark::State& state) {
  const auto len = lognormal_lengths(256);
  std::vector<rlpt::trajectory> recs;
  for (std::size_t i = 0; i < len.size(); ++i)
    recs.push_back(record(static_cast<std::int64_t>(i), 0, static_cast<std::size_t>(len[i])));
  const rlpt::rollout_batch batch = rlpt::rollout_batch::gather(recs, {});
  const std::vector<rlpt::index_t> lengths = batch.lengths();
  const rlpt::microbatch_plan plan = rlpt::plan_microbatches(lengths, {.token_budget = 16384});
  for (auto _ : state)
    for (rlpt::index_t m = 0; m < plan.num_microbatches(); ++m)
      benchmark::DoNotOptimize(rlpt::pack(batch, plan.microbatch(m)));
  // Read and written per token: id 4 + mask 1 + logprob 4 + version 4, plus position, target and id written.
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * batch.num_tokens() * (13 + 25));
}
BENCHMARK(BM_pack)->Unit(benchmark::kMicrosecond);

} // namespace

BENCHMARK_MAIN();
