// SPDX-License-Identifier: Apache-2.0
// An empty batch (a layout without token slots) is a complete input, not a missing one
// (issue 18): evaluate returns a zero loss instead of "needs logp ... but none was given".
#include <rlpt/objective.hpp>

#include "support/errors.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <vector>

using namespace rlpt;

namespace {

void check_zero(const objective_result& r) {
  CHECK(r.loss == 0.0);
  CHECK(r.policy_loss == 0.0);
  CHECK(r.tokens == 0.0);
  CHECK(r.seqs == 0.0);
  CHECK(std::isfinite(r.approx_kl));
}

} // namespace

TEST_CASE("objective: an empty batch evaluates to zero, it is not a missing input") {
  const std::vector<float> none;
  const std::vector<mask_t> no_mask;
  const objective ppo{.correction = token_tis(2.0), .kl = {.coef = 1e-3}};
  // Padded [0, T] (no rows) and packed with only empty sequences.
  const std::vector<index_t> empty_seqs{0, 0, 0};
  const std::vector<float> seq_adv{0.5f, -0.5f};
  for (const token_layout& layout : {token_layout::padded(0, 8), token_layout::packed(empty_seqs)}) {
    CAPTURE(layout.num_seqs());
    objective_inputs in{.layout = layout,
                        .mask = no_mask,
                        .logp = none,
                        .old_logp = none,
                        .behav_logp = none,
                        .ref_logp = none,
                        .adv = none};
    std::vector<float> grad;
    check_zero(evaluate(ppo, in, {.logp = grad}));
    if (layout.num_seqs() == 2) { // per-sequence advantages of the empty sequences
      in.seq_adv = seq_adv;
      check_zero(evaluate(objective{}, in));
    }
  }
  // Inputs of the wrong size are still errors, and absent inputs still absent when there are tokens.
  const std::vector<float> three(3, 0.0f);
  objective_inputs wrong{
      .layout = token_layout::padded(0, 8), .mask = no_mask, .logp = three, .old_logp = none, .adv = none};
  RLPT_CHECK_ERROR(evaluate(objective{}, wrong), "rlpt.view.size_mismatch", "logp has 3 elements, expected 0");
  const std::vector<mask_t> mask(6, 1);
  const std::vector<float> six(6, -1.0f);
  objective_inputs absent{
      .layout = token_layout::padded(2, 3), .mask = mask, .logp = none, .old_logp = six, .adv = six};
  RLPT_CHECK_ERROR(evaluate(objective{}, absent), "rlpt.objective.missing_input", "needs logp");
}
