// The fused lm-head from an installed rlpt (component lm_head): logprobs of a tiny head equal
// log_softmax(hidden · weightᵀ) at the targets.
#include <rlpt/logprob/lm_head.hpp>

#include <cmath>
#include <cstdio>
#include <vector>

int main() {
  const rlpt::index_t n = 2, d = 3, v = 4;
  const std::vector<float> hidden{1, 0, 0, 0, 1, 0};                   // [n, d]
  const std::vector<float> weight{1, 0, 0, 0, 1, 0, 0, 0, 1, 1, 1, 1}; // [v, d]
  const std::vector<rlpt::index_t> targets{0, 3};
  std::vector<float> logp(n);
  rlpt::fused_lm_head_logprob(rlpt::view2d<const float>(hidden.data(), n, d),
                              rlpt::view2d<const float>(weight.data(), v, d), targets, {.logp = logp});
  // Both rows have logits {1, 0, 0, 1} (up to order): log-sum-exp = log(2e + 2).
  const double lse = std::log(2 * std::exp(1.0) + 2);
  const bool ok = std::fabs(logp[0] - (1 - lse)) < 1e-5 && std::fabs(logp[1] - (1 - lse)) < 1e-5;
  std::printf("lm-head logp %.6f %.6f (want %.6f): %s\n", logp[0], logp[1], 1 - lse, ok ? "ok" : "WRONG");
  return ok ? 0 : 1;
}
