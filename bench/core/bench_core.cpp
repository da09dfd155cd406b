// SPDX-License-Identifier: Apache-2.0
// Core micro-benchmarks: the copy-bandwidth probe every other benchmark is measured against,
// and the statistics kernels several blocks share.
#include <rlpt/core/executor.hpp>
#include <rlpt/core/stats.hpp>

#include "support/bandwidth.hpp"

#include <benchmark/benchmark.h>

#include <cstring>
#include <random>
#include <vector>

namespace {

void BM_copy(benchmark::State& state) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  std::vector<char> src(bytes, 1), dst(bytes);
  for (auto _ : state) {
    std::memcpy(dst.data(), src.data(), bytes);
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * static_cast<std::int64_t>(2 * bytes));
}
BENCHMARK(BM_copy)->Arg(1 << 28)->Unit(benchmark::kMillisecond);

void BM_moments_masked(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  std::mt19937 g(1);
  std::normal_distribution<float> d;
  std::vector<float> x(n);
  std::vector<std::uint8_t> m(n);
  for (std::size_t i = 0; i < n; ++i) {
    x[i] = d(g);
    m[i] = static_cast<std::uint8_t>(i % 7 != 0);
  }
  for (auto _ : state) benchmark::DoNotOptimize(rlpt::moments_of(x, m));
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * static_cast<std::int64_t>(n * 5));
}
BENCHMARK(BM_moments_masked)->Arg(1 << 20)->Arg(1 << 24)->Unit(benchmark::kMicrosecond);

} // namespace

BENCHMARK_MAIN();
