// SPDX-License-Identifier: Apache-2.0
// Micro-benchmarks of the host logprob kernels on synthetic logits: forward and backward from
// logits (bf16, f32), the sampling-consistent top-k/top-p mode, sequences, and the fused lm-head.
// Each reports bytes/s of logits read (or FLOP/s for the lm-head) and the copy bandwidth
// measured in the same run with the same thread count. The side-by-side comparison with torch,
// verl and TRL is scripts/bench-peers (bench/peers/blocks/logprob.py).
#include <rlpt/logprob.hpp>
#include <rlpt/logprob/lm_head.hpp>
#include <rlpt/core/thread_pool.hpp>

#include "support/bandwidth.hpp"

#include <benchmark/benchmark.h>

#include <random>
#include <vector>

namespace {

using rlpt::index_t;

template <class T> const std::vector<T>& logits(index_t n, index_t v) {
  static std::vector<T> x;
  static index_t have = -1;
  if (have != n * v) {
    x.resize(static_cast<std::size_t>(n * v));
    std::mt19937 g(7);
    std::normal_distribution<float> d(0.0f, 3.0f);
    for (auto& e : x) e = T(d(g));
    have = n * v;
  }
  return x;
}

std::vector<index_t> targets(index_t n, index_t v) {
  std::vector<index_t> t(static_cast<std::size_t>(n));
  for (index_t i = 0; i < n; ++i) t[static_cast<std::size_t>(i)] = (i * 7919) % v;
  return t;
}

void report_copy(benchmark::State& st, unsigned threads) {
  static double copy[8] = {};
  if (copy[threads] == 0)
    copy[threads] = rlpt::bench::measure_copy_bandwidth(std::size_t{1} << 29, 3, threads).copy_gbps;
  st.counters["copy_GBps"] = copy[threads];
}

template <class T> void forward(benchmark::State& st) {
  const index_t n = st.range(0), v = st.range(1);
  const auto threads = static_cast<unsigned>(st.range(2));
  const auto& x = logits<T>(n, v);
  const auto t = targets(n, v);
  std::vector<float> lp(static_cast<std::size_t>(n)), ent(lp.size());
  rlpt::thread_pool pool(threads);
  const rlpt::host_executor ex{threads > 1 ? &pool : nullptr};
  for (auto _ : st) {
    rlpt::logprob_entropy(rlpt::view2d<const T>(x.data(), n, v), t, lp, ent, {.temperature = 0.7f}, ex);
    benchmark::DoNotOptimize(lp.data());
  }
  st.SetBytesProcessed(st.iterations() * n * v * static_cast<index_t>(sizeof(T)));
  report_copy(st, threads);
}

template <class T> void backward(benchmark::State& st) {
  const index_t n = st.range(0), v = st.range(1);
  const auto threads = static_cast<unsigned>(st.range(2));
  const auto& x = logits<T>(n, v);
  const auto t = targets(n, v);
  std::vector<float> lp(static_cast<std::size_t>(n)), ent(lp.size()), lse(lp.size()), dl(lp.size(), 1.0f),
      dh(lp.size(), -0.1f);
  std::vector<T> grad(x.size());
  rlpt::thread_pool pool(threads);
  const rlpt::host_executor ex{threads > 1 ? &pool : nullptr};
  const rlpt::view2d<const T> xv(x.data(), n, v);
  rlpt::logprob_entropy(xv, t, {.logp = lp, .entropy = ent, .saved = {.lse = lse}}, {}, ex);
  for (auto _ : st) {
    rlpt::logprob_entropy_backward(xv, t, {.dlogp = dl, .dentropy = dh, .entropy = ent, .saved = {.lse = lse}},
                                   rlpt::view2d<T>(grad.data(), n, v), {}, ex);
    benchmark::DoNotOptimize(grad.data());
  }
  st.SetBytesProcessed(st.iterations() * 2 * n * v * static_cast<index_t>(sizeof(T))); // read + write
  report_copy(st, threads);
}

void sampled(benchmark::State& st) {
  const index_t n = st.range(0), v = st.range(1);
  const auto& x = logits<rlpt::bf16>(n, v);
  const auto t0 = targets(n, v);
  std::vector<index_t> t(t0.size(), -100); // entropy of the truncated distribution only
  std::vector<float> lp(static_cast<std::size_t>(n)), ent(lp.size());
  for (auto _ : st) {
    rlpt::logprob_entropy(rlpt::view2d<const rlpt::bf16>(x.data(), n, v), t, lp, ent,
                          {.temperature = 0.7f, .top_k = st.range(2), .top_p = 0.9f});
    benchmark::DoNotOptimize(lp.data());
  }
  st.SetBytesProcessed(st.iterations() * n * v * 2);
}

void lm_head(benchmark::State& st) {
  const index_t n = st.range(0), d = st.range(1), v = st.range(2);
  const auto threads = static_cast<unsigned>(st.range(3));
  const auto& h = logits<rlpt::bf16>(n, d);
  std::vector<rlpt::bf16> w(static_cast<std::size_t>(v * d));
  std::mt19937 g(3);
  std::normal_distribution<float> dist(0.0f, 0.05f);
  for (auto& e : w) e = rlpt::bf16(dist(g));
  const auto t = targets(n, v);
  std::vector<float> lp(static_cast<std::size_t>(n)), ent(lp.size()), lse(lp.size());
  rlpt::thread_pool pool(threads);
  const rlpt::host_executor ex{threads > 1 ? &pool : nullptr};
  for (auto _ : st) {
    rlpt::fused_lm_head_logprob(rlpt::view2d<const rlpt::bf16>(h.data(), n, d),
                                rlpt::view2d<const rlpt::bf16>(w.data(), v, d), t,
                                {.logp = lp, .entropy = ent, .saved = {.lse = lse}}, {}, ex);
    benchmark::DoNotOptimize(lp.data());
  }
  st.counters["GFLOPs"] = benchmark::Counter(
      2.0 * static_cast<double>(n * d * v) * static_cast<double>(st.iterations()) / 1e9, benchmark::Counter::kIsRate);
}

} // namespace

BENCHMARK_TEMPLATE(forward, rlpt::bf16)
    ->Args({4096, 32768, 1})
    ->Args({4096, 32768, 2})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_TEMPLATE(forward, float)
    ->Args({4096, 32768, 1})
    ->Args({4096, 32768, 2})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_TEMPLATE(backward, rlpt::bf16)->Args({4096, 32768, 2})->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_TEMPLATE(backward, float)->Args({4096, 32768, 2})->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(sampled)->Args({256, 151936, 0})->Args({256, 151936, 50})->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(lm_head)->Args({1024, 1024, 32768, 2})->Unit(benchmark::kMillisecond)->UseRealTime();

BENCHMARK_MAIN();
