// SPDX-License-Identifier: Apache-2.0
// The smallest rlpt program: rewards of 2 prompts x 4 samples -> GRPO advantages -> the PPO-clip
// loss of a padded [8, 5] batch of token log-probs and its gradient. Eigen holds every array;
// rlpt reads and writes it in place: vectors and row-major matrices pass as views directly.
// Presets: verl's numbers.
#include <rlpt/advantage.hpp>
#include <rlpt/objective.hpp>

#include <Eigen/Core>
#include <cmath>
#include <cstdio>

using Tokens = Eigen::Matrix<float, 8, 5, Eigen::RowMajor>; // [B, T] row-major = padded layout
using Mask = Eigen::Matrix<rlpt::mask_t, 8, 5, Eigen::RowMajor>;

int main() {
  Eigen::VectorXf rewards(8), adv(8);
  rewards << 1, 0, 0, 1, 1, 1, 0, 1; // e.g. exact-match checks of 8 answers
  Eigen::Matrix<std::int64_t, 8, 1> prompt;
  prompt << 0, 0, 0, 0, 1, 1, 1, 1; // which prompt each answer belongs to
  const rlpt::group_stats st =
      rlpt::grpo_advantages(rewards, rlpt::groups::from_ids(prompt), adv, rlpt::compat::verl::grpo());

  const Tokens old_logp = Tokens::Constant(-1.2f);
  const Tokens logp = old_logp + 0.3f * Tokens::Random(); // the policy moved since sampling
  Mask mask = Mask::Ones();
  mask.block<4, 2>(4, 3).setZero(); // four shorter answers: padding at the end
  Tokens grad;
  const rlpt::objective obj = rlpt::compat::verl::actor({.clip_ratio_low = 0.2, .clip_ratio_high = 0.28});
  const rlpt::objective_result r = rlpt::evaluate(
      obj,
      rlpt::objective_inputs{
          .layout = rlpt::token_layout::padded(8, 5), .mask = mask, .logp = logp, .old_logp = old_logp, .seq_adv = adv},
      {.logp = grad});

  std::printf("advantages: ");
  for (float a : adv) std::printf("%+.3f ", a);
  std::printf("(degenerate groups %lld)\nloss %.6f  clip_frac %.3f  |d loss/d logp| %.4f\n",
              static_cast<long long>(st.num_degenerate), r.loss, r.clip_frac_low + r.clip_frac_high, grad.norm());
  return std::isfinite(r.loss) && grad.allFinite() ? 0 : 1;
}
