// SPDX-License-Identifier: Apache-2.0
// TRL 1.16 golden losses and gradients: GRPOTrainer._compute_loss itself (on a stub trainer),
// per loss_type, reproduced through rlpt::compat::trl::grpo.
#include <rlpt/objective.hpp>

#include "golden_check.hpp"

#include <doctest/doctest.h>

#include <numeric>
#include <string>
#include <tuple>

namespace trl = rlpt::compat::trl;
using rlpt::test::check_golden_case;
using rlpt::test::golden_inputs;

namespace {
double items_in_batch(const std::string& name) {
  const rlpt::test::golden_case g(name);
  return 2.0 * std::accumulate(g.mask.begin(), g.mask.end(), 0.0) + 5.0; // as the generator
}
} // namespace

TEST_CASE("golden trl loss types grpo, bnpo, dr_grpo, dapo, cispo, sapo") {
  const double n = items_in_batch("trl_grpo");
  for (const char* lt : {"grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo"}) {
    trl::grpo_config c{
        .loss_type = lt, .max_completion_length = 32, .gradient_accumulation_steps = 2, .num_items_in_batch = n};
    if (std::string(lt) == "cispo") c.epsilon_high = 5.0;
    // SAPO's temperatures are float32 tensors in TRL even for float64 inputs.
    check_golden_case(std::string("trl_") + lt, trl::grpo(c), golden_inputs{.entropy = true, .seq_adv = true}, false,
                      false, /*peer_fp32_only=*/std::string(lt) == "sapo");
  }
}

TEST_CASE("golden trl dapo with delta, clip-higher and a k3 KL term") {
  const double n = items_in_batch("trl_grpo");
  const auto obj = trl::grpo({.loss_type = "dapo",
                              .epsilon_high = 0.28,
                              .delta = 4.0,
                              .beta = 0.04,
                              .use_bias_correction_kl = false,
                              .num_items_in_batch = n});
  check_golden_case("trl_dapo_delta_beta", obj, golden_inputs{.ref = true, .entropy = true, .seq_adv = true});
}

TEST_CASE("golden trl bnpo with the bias-corrected KL and an entropy bonus") {
  const auto obj = trl::grpo({.loss_type = "bnpo",
                              .beta = 0.1,
                              .use_bias_correction_kl = true,
                              .entropy_coef = 0.02,
                              .gradient_accumulation_steps = 3});
  check_golden_case("trl_bnpo_bias_kl_entropy", obj, golden_inputs{.ref = true, .entropy = true, .seq_adv = true},
                    true);
}

TEST_CASE("golden trl sequence-level importance sampling (GSPO)") {
  const double n = items_in_batch("trl_grpo");
  for (const char* lt : {"grpo", "dapo"}) {
    const auto obj = trl::grpo({.loss_type = lt, .importance_sampling_level = "sequence", .num_items_in_batch = n});
    check_golden_case(std::string("trl_") + lt + "_sequence", obj, golden_inputs{.entropy = true});
  }
}

TEST_CASE("golden trl sapo with sequence-level importance sampling: the gate on the sequence ratio") {
  const auto obj = trl::grpo({.loss_type = "sapo",
                              .importance_sampling_level = "sequence",
                              .max_completion_length = 32,
                              .gradient_accumulation_steps = 2});
  // SAPO's temperatures are float32 tensors in TRL even for float64 inputs.
  check_golden_case("trl_sapo_sequence", obj, golden_inputs{.entropy = true}, false, false, /*peer_fp32_only=*/true);
}

TEST_CASE("golden trl cispo at sequence level: every token's weight is its row's clamped sequence ratio") {
  const double n = items_in_batch("trl_grpo");
  const auto obj = trl::grpo(
      {.loss_type = "cispo", .epsilon_high = 1.05, .importance_sampling_level = "sequence", .num_items_in_batch = n});
  const auto r = check_golden_case("trl_cispo_sequence", obj, golden_inputs{.entropy = true});
  CHECK(r.r64.clip_frac_high > 0.0); // the cap binds for some rows, not all
  CHECK(r.r64.clip_frac_high < 1.0);
}

TEST_CASE("golden trl bias-corrected KL at sequence level: the KL times the sequence ratio, through its mean") {
  const auto grpo = trl::grpo({.loss_type = "grpo",
                               .importance_sampling_level = "sequence",
                               .beta = 0.1,
                               .use_bias_correction_kl = true,
                               .gradient_accumulation_steps = 2});
  CHECK(grpo.kl.importance_per_sequence);
  check_golden_case("trl_grpo_sequence_bias_kl", grpo, golden_inputs{.ref = true, .entropy = true, .seq_adv = true});
  const double n = items_in_batch("trl_grpo");
  const auto cispo = trl::grpo({.loss_type = "cispo",
                                .epsilon_high = 1.05,
                                .importance_sampling_level = "sequence",
                                .beta = 0.1,
                                .use_bias_correction_kl = true,
                                .num_items_in_batch = n});
  check_golden_case("trl_cispo_sequence_bias_kl", cispo, golden_inputs{.ref = true, .entropy = true, .seq_adv = true});
  const auto sapo = trl::grpo(
      {.loss_type = "sapo", .importance_sampling_level = "sequence", .beta = 0.05, .use_bias_correction_kl = true});
  check_golden_case("trl_sapo_sequence_bias_kl", sapo, golden_inputs{.ref = true, .entropy = true}, false, false,
                    /*peer_fp32_only=*/true);
}

TEST_CASE("golden trl vLLM importance sampling (token_truncate) applied before the KL term") {
  const double n = items_in_batch("trl_grpo");
  const auto obj = trl::grpo({.loss_type = "dapo",
                              .beta = 0.04,
                              .use_bias_correction_kl = false,
                              .num_items_in_batch = n,
                              .vllm_importance_sampling_correction = true,
                              .vllm_importance_sampling_mode = "token_truncate",
                              .vllm_importance_sampling_min = 0.5,
                              .vllm_importance_sampling_max = 3.0});
  for (const char* name : {"trl_dapo_vllm_token_truncate", "trl_dapo_vllm_token_truncate_plain"})
    check_golden_case(name, obj, golden_inputs{.behav = true, .ref = true, .entropy = true, .seq_adv = true});
}

TEST_CASE("golden trl luspo: each row's token sum, the mean over rows") {
  // Sequence level (TRL's recommendation) with a k3 KL term and GA 2, and token level.
  const auto seq = trl::grpo({.loss_type = "luspo",
                              .importance_sampling_level = "sequence",
                              .beta = 0.04,
                              .use_bias_correction_kl = false,
                              .gradient_accumulation_steps = 2});
  check_golden_case("trl_luspo_sequence", seq, golden_inputs{.ref = true, .entropy = true, .seq_adv = true});
  const auto tok = trl::grpo({.loss_type = "luspo", .epsilon_high = 0.28});
  check_golden_case("trl_luspo_token", tok, golden_inputs{.entropy = true});
  check_golden_case("trl_luspo_token_plain", tok, golden_inputs{.entropy = true});
}

TEST_CASE("golden trl vespo: a soft sequence weight by the advantage's sign, with a k3 KL term") {
  const double n = items_in_batch("trl_grpo");
  const auto obj =
      trl::grpo({.loss_type = "vespo", .beta = 0.04, .use_bias_correction_kl = false, .num_items_in_batch = n});
  check_golden_case("trl_vespo", obj, golden_inputs{.ref = true, .entropy = true});
  // At sequence level TRL's coef_1 reaches only the bias-corrected KL: the same loss.
  check_golden_case("trl_vespo_sequence",
                    trl::grpo({.loss_type = "vespo",
                               .importance_sampling_level = "sequence",
                               .beta = 0.04,
                               .use_bias_correction_kl = false,
                               .num_items_in_batch = n}),
                    golden_inputs{.ref = true, .entropy = true});
  // Without the KL term, whose gradients here are 1e7 times VESPO's and set the bound's scale.
  check_golden_case("trl_vespo_no_kl", trl::grpo({.loss_type = "vespo", .num_items_in_batch = n}),
                    golden_inputs{.entropy = true});
  // With the bias-corrected KL at sequence level (TRL's default): the KL times exp(s), s the row's
  // mean log-ratio, differentiated through the mean.
  check_golden_case(
      "trl_vespo_sequence_bias_kl",
      trl::grpo({.loss_type = "vespo", .importance_sampling_level = "sequence", .beta = 0.1, .num_items_in_batch = n}),
      golden_inputs{.ref = true, .entropy = true, .seq_adv = true});
}

TEST_CASE("golden trl vespo with the vLLM importance ratio folded into its sequence weight") {
  const double n = items_in_batch("trl_grpo");
  for (const auto& [mode, lo, hi] : {std::tuple{"token_truncate", 0.5, 3.0}, std::tuple{"token_mask", 0.5, 2.0}}) {
    INFO(mode);
    const auto obj = trl::grpo({.loss_type = "vespo",
                                .num_items_in_batch = n,
                                .vllm_importance_sampling_correction = true,
                                .vllm_importance_sampling_mode = mode,
                                .vllm_importance_sampling_min = lo,
                                .vllm_importance_sampling_max = hi});
    const auto r =
        check_golden_case(std::string("trl_vespo_vllm_") + mode, obj, golden_inputs{.behav = true, .entropy = true});
    CHECK(r.r64.is_weight_max <= hi); // the ratio is bounded, and it weighs phi, not the loss
  }
}

TEST_CASE("golden trl RLOOTrainer: the PPO clip on each sequence's summed log-ratio, the mean over rows") {
  check_golden_case("trl_rloo", trl::rloo({}), golden_inputs{.seq_adv = true});
  check_golden_case("trl_rloo_clip_higher", trl::rloo({.epsilon = 0.1, .epsilon_high = 0.28}),
                    golden_inputs{.seq_adv = true});
}
