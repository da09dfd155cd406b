// SPDX-License-Identifier: Apache-2.0
// Host micro-benchmarks of rlpt::evaluate at 1M tokens (1024 x 1024 padded, 80% valid) for
// several configurations, serial and on a 2-thread pool, with the bytes each call must move.
// Compare the bytes/s column with BM_copy (read + write) from bench_core on the same machine.
#include <rlpt/objective.hpp>
#include <rlpt/core/thread_pool.hpp>

#include <benchmark/benchmark.h>

#include <random>
#include <vector>

namespace {

using namespace rlpt;

struct inputs_1m {
  static constexpr index_t B = 1024, T = 1024;
  std::vector<float> lp, old, behav, ref, adv, ent, grad, grad_ent;
  std::vector<mask_t> mask;
  inputs_1m() {
    const auto n = static_cast<std::size_t>(B * T);
    std::mt19937 g(3);
    std::normal_distribution<float> nd;
    lp.resize(n), old.resize(n), behav.resize(n), ref.resize(n), adv.resize(n), ent.resize(n), mask.resize(n);
    grad.resize(n), grad_ent.resize(n);
    for (std::size_t i = 0; i < n; ++i) {
      lp[i] = -1.0f + 0.5f * nd(g);
      old[i] = lp[i] + 0.1f * nd(g);
      behav[i] = old[i] + 0.1f * nd(g);
      ref[i] = lp[i] + 0.2f * nd(g);
      adv[i] = nd(g);
      ent[i] = 1.0f + 0.3f * nd(g);
      mask[i] = static_cast<index_t>(i) % T < 820 ? 1 : 0;
    }
  }
  objective_inputs view() const {
    return {.layout = token_layout::padded(B, T),
            .mask = mask,
            .logp = lp,
            .old_logp = old,
            .behav_logp = behav,
            .ref_logp = ref,
            .adv = adv,
            .entropy = ent};
  }
};

const inputs_1m& data() {
  static const inputs_1m d;
  return d;
}

void run(benchmark::State& state, const objective& obj, double bytes_per_token, bool entropy_grad) {
  auto& d = const_cast<inputs_1m&>(data());
  const unsigned threads = static_cast<unsigned>(state.range(0));
  thread_pool pool(threads);
  const host_executor ex{threads > 1 ? &pool : nullptr};
  objective_grads g{.logp = d.grad};
  if (entropy_grad) g.entropy = d.grad_ent;
  for (auto _ : state) benchmark::DoNotOptimize(evaluate(obj, d.view(), g, ex).loss);
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) *
                          static_cast<std::int64_t>(bytes_per_token * static_cast<double>(d.lp.size())));
}

const double valid_tokens = 1024.0 * 820.0;

void BM_ppo_k3_token_mean(benchmark::State& s) {
  run(s, {.policy = ppo_clip{}, .kl = {.coef = 1e-3}, .agg = {.global_tokens = valid_tokens}}, 4 * 4 + 1 + 4, false);
}
void BM_ppo_tis_k3_entropy(benchmark::State& s) {
  run(s,
      {.policy = ppo_clip{.eps_high = 0.28},
       .correction = token_tis(2.0),
       .kl = {.coef = 1e-3},
       .entropy = {.coef = 1e-3},
       .agg = {.global_tokens = valid_tokens}},
      6 * 4 + 1 + 8, true);
}
void BM_gspo_seq_is_seq_mean(benchmark::State& s) {
  run(s,
      {.policy = gspo{.token_level = false}, .correction = seq_is(2.0), .agg = {.mode = agg_mode::seq_mean_token_mean}},
      3 * 4 + 1 + 4, false);
}
void BM_cispo_local_denominators(benchmark::State& s) {
  run(s, {.policy = cispo{}, .kl = {.coef = 1e-3}}, 4 * 4 + 1 + 4, false);
}
BENCHMARK(BM_ppo_k3_token_mean)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_ppo_tis_k3_entropy)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_gspo_seq_is_seq_mean)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_cispo_local_denominators)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();

} // namespace

BENCHMARK_MAIN();
