// SPDX-License-Identifier: Apache-2.0
// OpenRLHF 0.11.2 golden losses and gradients (PolicyLoss, ValueLoss, compute_approx_kl,
// aggregate_loss), reproduced through rlpt::compat::openrlhf presets.
#include <rlpt/objective.hpp>

#include "golden_check.hpp"

#include <doctest/doctest.h>

namespace orl = rlpt::compat::openrlhf;
using rlpt::test::check_golden_case;
using rlpt::test::golden_inputs;

TEST_CASE("golden openrlhf PolicyLoss ppo: token and sample level, dual clip, global batch info") {
  check_golden_case("openrlhf_ppo", orl::policy_loss({}), golden_inputs{});
  check_golden_case(
      "openrlhf_ppo_dual_clip_global",
      orl::policy_loss({.clip_eps_high = 0.28, .dual_clip = 3.0, .dp_size = 2, .batch_num_tokens = 300.0}),
      golden_inputs{});
  check_golden_case("openrlhf_ppo_sample_level", orl::policy_loss({.token_level_loss = false}), golden_inputs{});
  check_golden_case("openrlhf_ppo_sample_level_global",
                    orl::policy_loss({.token_level_loss = false, .dp_size = 2, .global_batch_size = 20.0}),
                    golden_inputs{});
}

TEST_CASE("golden openrlhf PolicyLoss gspo") {
  check_golden_case("openrlhf_gspo", orl::policy_loss({.policy_loss_type = "gspo"}), golden_inputs{});
}

TEST_CASE("golden openrlhf PolicyLoss train/rollout corrections: tis clip, icepop, seq-mask-tis") {
  check_golden_case("openrlhf_tis_clip",
                    orl::policy_loss({.is_correction_level = "token", .is_correction_mode = "clip"}),
                    golden_inputs{.behav = true});
  check_golden_case("openrlhf_icepop", orl::policy_loss({.is_correction_level = "token", .is_correction_mode = "mask"}),
                    golden_inputs{.behav = true});
  const auto r = check_golden_case("openrlhf_seq_mask_tis",
                                   orl::policy_loss({.is_correction_level = "seq",
                                                     .is_correction_mode = "mask",
                                                     .is_correction_low = 0.8,
                                                     .is_correction_high = 1.25}),
                                   golden_inputs{.behav = true});
  CHECK(r.r64.rejected_frac > 0.0);
}

TEST_CASE("golden openrlhf PolicyLoss divergence gates: token binary KL, sequence-mean total variation") {
  const auto kl = check_golden_case("openrlhf_gate_binary_kl",
                                    orl::policy_loss({.is_correction_level = "token",
                                                      .is_correction_gating = "binary_kl",
                                                      .is_correction_low = 0.0,
                                                      .is_correction_high = 0.005}),
                                    golden_inputs{.behav = true});
  CHECK(kl.r64.rejected_frac > 0.0);
  CHECK(kl.r64.rejected_frac < 1.0);
  const auto tv = check_golden_case("openrlhf_gate_tv_seq",
                                    orl::policy_loss({.is_correction_level = "seq",
                                                      .is_correction_gating = "tv",
                                                      .is_correction_low = 0.0,
                                                      .is_correction_high = 0.15}),
                                    golden_inputs{.behav = true});
  CHECK(tv.r64.rejected_frac > 0.0);
  CHECK(tv.r64.rejected_frac < 1.0);
}

TEST_CASE("golden openrlhf compute_approx_kl k1, k2, k3 with and without unbiased_gradient") {
  for (const char* est : {"k1", "k2", "k3"}) {
    for (bool unbiased : {false, true}) {
      rlpt::objective obj{.policy = rlpt::no_policy{}, .kl = orl::kl(est, 1.0, unbiased), .agg = orl::agg(true)};
      // compute_approx_kl upcasts to float32 even for float64 inputs.
      check_golden_case(std::string("openrlhf_kl_") + est + (unbiased ? "_unbiased" : ""), obj,
                        golden_inputs{.ref = true}, false, false, /*peer_fp32_only=*/true);
    }
  }
}

TEST_CASE("golden openrlhf ValueLoss") {
  check_golden_case("openrlhf_value", orl::value(0.5), golden_inputs{.old = false, .values = true}, false, true);
  // ValueLoss()'s default clip_eps is None: no clipped branch.
  check_golden_case("openrlhf_value_unclipped", orl::value(), golden_inputs{.old = false, .values = true}, false, true);
}
