// SPDX-License-Identifier: Apache-2.0
// AReaL 1.0.4 golden losses and gradients: ppo_actor_loss_fn (with RejectionSamplingConfig's
// metrics, levels, aggregations and actions) and sapo_loss_fn, reproduced through
// rlpt::compat::areal::actor.
#include <rlpt/objective.hpp>

#include "golden_check.hpp"

#include <doctest/doctest.h>

#include <string>

namespace areal = rlpt::compat::areal;
using rlpt::test::check_golden_case;
using rlpt::test::golden_inputs;

namespace {

// AReaL computes the rejection metric and the behaviour weight in float32 whatever the inputs'
// dtype, so its float64 run is float32-accurate wherever they enter.
constexpr bool fp32_weights = true;

//! Runs one case, with the decoupled loss and rejection sampling on (the golden cases pass a
//! RejectionSamplingConfig), and checks that it both rejects (or clamps) and keeps tokens, as its
//! thresholds were chosen to.
void check_rejecting(const std::string& name, areal::actor_config c) {
  c.use_decoupled_loss = true;
  c.rejection_sampling = true;
  const auto r = check_golden_case(name, areal::actor(c), golden_inputs{.behav = true}, false, false, fp32_weights);
  if (c.rejection_action == "mask") {
    CHECK(r.r64.rejected_frac > 0.0);
    CHECK(r.r64.rejected_frac < 1.0);
  }
}

} // namespace

TEST_CASE("golden areal ppo_actor_loss_fn: token-level ratio rejection, clamp, dual clip, none") {
  check_rejecting("areal_ppo_token_mask", {});
  check_rejecting("areal_ppo_token_ratio_band", {.rejection_upper = 1.2, .rejection_lower = 0.85});
  check_rejecting("areal_ppo_token_clamp_dual", {.eps_clip_higher = 0.28,
                                                 .c_clip = 3.0,
                                                 .rejection_action = "clamp",
                                                 .rejection_upper = 1.2,
                                                 .rejection_lower = 0.8});
  check_golden_case("areal_ppo_no_rejection", areal::actor({.c_clip = 3.0, .rejection_sampling = false}),
                    golden_inputs{});
  // PPOActorConfig's defaults: no RejectionSamplingConfig, so nothing is filtered or weighted.
  check_golden_case("areal_ppo_no_rejection", areal::actor({.c_clip = 3.0}), golden_inputs{});
}

TEST_CASE("golden areal ppo_actor_loss_fn: sequence-level ratio, aggregated in log space") {
  check_rejecting("areal_seq_ratio_mean",
                  {.rejection_level = "sequence", .rejection_upper = 1.04, .rejection_lower = 0.97});
  check_rejecting(
      "areal_seq_ratio_sum",
      {.rejection_level = "sequence", .rejection_agg = "sum", .rejection_upper = 1.6, .rejection_lower = 0.7});
  check_rejecting("areal_seq_ratio_max",
                  {.rejection_level = "sequence", .rejection_agg = "max", .rejection_upper = 1.5});
  check_rejecting(
      "areal_seq_ratio_clamp",
      {.rejection_level = "sequence", .rejection_action = "clamp", .rejection_upper = 1.03, .rejection_lower = 0.98});
}

TEST_CASE("golden areal ppo_actor_loss_fn: sequence-level clamp on the sum and the max") {
  // The geometric-mean weight is clamped only where the aggregate is out of bounds: each case has a
  // row whose weight is out of bounds and its aggregate in them (left as it is), and a clamped row.
  check_rejecting("areal_seq_ratio_clamp_sum", {.rejection_level = "sequence",
                                                .rejection_action = "clamp",
                                                .rejection_agg = "sum",
                                                .rejection_upper = 1.6,
                                                .rejection_lower = 1.01});
  check_rejecting("areal_seq_ratio_clamp_max", {.rejection_level = "sequence",
                                                .rejection_action = "clamp",
                                                .rejection_agg = "max",
                                                .rejection_upper = 1.15,
                                                .rejection_lower = 0.95});
}

TEST_CASE("golden areal ppo_actor_loss_fn: KL-metric rejection k1, k2, k3 per token") {
  check_rejecting("areal_token_kl_k1", {.rejection_metric = "kl_k1", .rejection_upper = 0.2, .rejection_lower = -0.15});
  check_rejecting("areal_token_kl_k1_upper", {.rejection_metric = "kl_k1", .rejection_upper = -0.05});
  check_rejecting("areal_token_kl_k2", {.rejection_metric = "kl_k2", .rejection_upper = 0.03});
  check_rejecting("areal_token_kl_k3", {.rejection_metric = "kl_k3", .rejection_upper = 0.03});
  check_rejecting("areal_token_kl_k2_band",
                  {.rejection_metric = "kl_k2", .rejection_upper = 0.03, .rejection_lower = 0.0015});
}

TEST_CASE("golden areal ppo_actor_loss_fn: KL-metric rejection per sequence: sum, mean, max") {
  check_rejecting(
      "areal_seq_kl_k1_mean",
      {.rejection_level = "sequence", .rejection_metric = "kl_k1", .rejection_upper = 0.05, .rejection_lower = -0.04});
  check_rejecting(
      "areal_seq_kl_k2_sum",
      {.rejection_level = "sequence", .rejection_metric = "kl_k2", .rejection_agg = "sum", .rejection_upper = 0.3});
  check_rejecting(
      "areal_seq_kl_k3_max",
      {.rejection_level = "sequence", .rejection_metric = "kl_k3", .rejection_agg = "max", .rejection_upper = 0.1});
  check_rejecting(
      "areal_seq_kl_k3_band",
      {.rejection_level = "sequence", .rejection_metric = "kl_k3", .rejection_upper = 0.032, .rejection_lower = 0.013});
  check_rejecting(
      "areal_seq_kl_k1_max",
      {.rejection_level = "sequence", .rejection_metric = "kl_k1", .rejection_agg = "max", .rejection_upper = 0.4});
}

TEST_CASE("golden areal ppo_actor_loss_fn: GSPO with token and sequence rejection") {
  check_rejecting("areal_gspo_token_mask",
                  {.rejection_metric = "kl_k2", .rejection_upper = 0.03, .importance_sampling_level = "sequence"});
  check_rejecting("areal_gspo_seq_adv", {.eps_clip_higher = 0.3,
                                         .rejection_level = "sequence",
                                         .rejection_upper = 1.04,
                                         .rejection_lower = 0.97,
                                         .importance_sampling_level = "sequence"});
}

TEST_CASE("golden areal sapo_loss_fn, token and sequence level") {
  check_golden_case("areal_sapo", areal::actor({.use_decoupled_loss = false, .use_sapo_loss = true}), golden_inputs{});
  const auto seq =
      areal::actor({.use_decoupled_loss = false, .importance_sampling_level = "sequence", .use_sapo_loss = true});
  check_golden_case("areal_sapo_sequence", seq, golden_inputs{});
  check_golden_case("areal_sapo_sequence_token_adv", seq, golden_inputs{});
}
