// SPDX-License-Identifier: Apache-2.0
// What the optimisation level of a user's build does to the objective's host pass: CPU time per
// evaluate call for verl's low_var_kl loss alone, k1 alone, and PPO clip, on 64 x 2048 float
// tokens (the shapes of python/bench/ops_cpu.py), warm, one thread. Built by hand, once per level:
//
//   g++ -std=c++20 -O2 -DFMT_HEADER_ONLY -Iinclude bench/objective/opt_level.cpp -o /tmp/opt_o2
//   g++ -std=c++20 -O3 -DFMT_HEADER_ONLY -Iinclude bench/objective/opt_level.cpp -o /tmp/opt_o3
//   /tmp/opt_o2 && /tmp/opt_o3
//
// docs/design/objective-host-pass.md records the figures (the -O2 build ran 15x slower before
// the stages carried -O3's vectoriser cost model).
#include <rlpt/objective.hpp>

#include <cstdint>
#include <cstdio>
#include <ctime>
#include <random>
#include <vector>

int main() {
  constexpr rlpt::index_t B = 64, T = 2048, N = B * T;
  std::mt19937 g(1);
  std::uniform_real_distribution<float> uniform(-3.0f, 0.0f);
  std::normal_distribution<float> normal(0.0f, 0.2f);
  std::vector<float> lp(N), ref(N), old(N), adv(N), grad(N);
  std::vector<std::uint8_t> mask(N);
  for (rlpt::index_t i = 0; i < N; ++i) {
    const auto u = static_cast<std::size_t>(i);
    lp[u] = uniform(g);
    ref[u] = lp[u] + normal(g);
    old[u] = lp[u] + 0.1f;
    adv[u] = normal(g);
    mask[u] = (i % T) < 1000;
  }
  const char* names[] = {"low_var_kl (k3) alone", "k1 alone", "PPO clip"};
  for (int c = 0; c < 3; ++c) {
    rlpt::objective obj;
    if (c < 2) {
      obj.policy = rlpt::no_policy{};
      obj.kl = rlpt::compat::verl::kl(c == 0 ? "low_var_kl" : "k1", 1.0);
    }
    rlpt::basic_objective_inputs<float> in;
    in.layout = rlpt::token_layout::padded(B, T);
    in.logp = lp;
    in.mask = mask;
    in.ref_logp = ref;
    if (c == 2) {
      in.old_logp = old;
      in.adv = adv;
    }
    rlpt::basic_objective_grads<float> grads;
    grads.logp = grad;
    double loss = rlpt::evaluate(obj, in, grads).loss; // warm-up
    constexpr int calls = 200;
    const std::clock_t t0 = std::clock();
    for (int i = 0; i < calls; ++i) loss += rlpt::evaluate(obj, in, grads).loss;
    const double ms = static_cast<double>(std::clock() - t0) / CLOCKS_PER_SEC * 1e3 / calls;
    std::printf("%-22s %.3f ms per call (loss sum %.3g)\n", names[c], ms, loss);
  }
}
