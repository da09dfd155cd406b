// SPDX-License-Identifier: Apache-2.0
// Host advantage estimators: GAE (raw and verl-whitened), REINFORCE++, GRPO over many groups.
// Bytes counted: GAE reads rewards, values (4 B) and mask (1 B) and writes advantages and
// returns (4 B): 17 B per token slot. The copy-bandwidth roofline is printed by bench_advantage_runner.
#include <rlpt/advantage.hpp>
#include <rlpt/core/thread_pool.hpp>

#include "advantage/inputs.hpp"

#include <benchmark/benchmark.h>

#include <memory>
#include <vector>

namespace {

rlpt::host_executor executor(benchmark::State& state, std::unique_ptr<rlpt::thread_pool>& pool) {
  const auto threads = static_cast<unsigned>(state.range(2));
  if (threads > 1) pool = std::make_unique<rlpt::thread_pool>(threads);
  return rlpt::host_executor{pool.get()};
}

void gae(benchmark::State& state, bool whiten) {
  const auto in = rlpt::bench::make_tokens(state.range(0), state.range(1));
  std::unique_ptr<rlpt::thread_pool> pool;
  const auto ex = executor(state, pool);
  std::vector<float> adv(in.rewards.size()), ret(adv.size());
  const auto layout = rlpt::token_layout::padded(in.B, in.T);
  const auto o = whiten ? rlpt::compat::verl::gae(1.0, 0.95) : rlpt::gae_options{.lambda = 0.95};
  for (auto _ : state) {
    auto r =
        rlpt::gae({.layout = layout, .rewards = in.rewards, .values = in.values, .mask = in.mask}, adv, ret, o, ex);
    benchmark::DoNotOptimize(r);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * in.B * in.T * 17);
}

void BM_gae(benchmark::State& state) { gae(state, false); }
void BM_gae_verl_whitened(benchmark::State& state) { gae(state, true); }

void BM_reinforce_pp(benchmark::State& state) {
  const auto in = rlpt::bench::make_tokens(state.range(0), state.range(1));
  std::unique_ptr<rlpt::thread_pool> pool;
  const auto ex = executor(state, pool);
  std::vector<float> adv(in.rewards.size()), ret(adv.size());
  const auto layout = rlpt::token_layout::padded(in.B, in.T);
  for (auto _ : state) {
    auto r =
        rlpt::reinforce_pp_advantages(layout, in.rewards, in.mask, adv, ret, rlpt::compat::verl::reinforce_pp(), ex);
    benchmark::DoNotOptimize(r);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * in.B * in.T * 13);
}

void BM_grpo(benchmark::State& state) {
  const auto in = rlpt::bench::make_outcomes(state.range(0), state.range(1));
  std::unique_ptr<rlpt::thread_pool> pool;
  const auto ex = executor(state, pool);
  const auto g = rlpt::groups::from_ids(in.ids);
  std::vector<float> adv(in.rewards.size());
  rlpt::group_stats stats;
  for (auto _ : state) {
    rlpt::grpo_advantages(in.rewards, g, adv, rlpt::compat::verl::grpo(), stats, ex);
    benchmark::DoNotOptimize(adv.data());
  }
  state.SetItemsProcessed(state.iterations() * state.range(0));
}

void BM_grpo_with_grouping(benchmark::State& state) { // groups::from_ids inside the timed loop, as verl's index
  const auto in = rlpt::bench::make_outcomes(state.range(0), state.range(1));
  std::vector<float> adv(in.rewards.size());
  for (auto _ : state) {
    const auto g = rlpt::groups::from_ids(in.ids);
    auto s = rlpt::grpo_advantages(in.rewards, g, adv, rlpt::compat::verl::grpo());
    benchmark::DoNotOptimize(s);
  }
  state.SetItemsProcessed(state.iterations() * state.range(0));
}

} // namespace

BENCHMARK(BM_gae)
    ->Args({1024, 1024, 1})
    ->Args({1024, 8192, 1})
    ->Args({1024, 8192, 2})
    ->Args({8192, 1024, 2})
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_gae_verl_whitened)->Args({1024, 8192, 1})->Args({1024, 8192, 2})->Unit(benchmark::kMillisecond);
BENCHMARK(BM_reinforce_pp)->Args({1024, 8192, 2})->Unit(benchmark::kMillisecond);
BENCHMARK(BM_grpo)
    ->Args({65536, 4, 1})
    ->Args({65536, 16, 1})
    ->Args({65536, 64, 1})
    ->Args({65536, 16, 2})
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_grpo_with_grouping)->Args({65536, 16, 1})->Unit(benchmark::kMicrosecond);
BENCHMARK_MAIN();
