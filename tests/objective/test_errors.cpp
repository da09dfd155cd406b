// SPDX-License-Identifier: Apache-2.0
// Bad configurations and inputs get an rlpt::error with a stable id and a message that names
// what is missing or wrong, with the values.
#include <rlpt/objective.hpp>

#include "batch.hpp"
#include "support/errors.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <string>
#include <variant>
#include <vector>

using rlpt::test::batch;
using namespace rlpt;

TEST_CASE("errors: inputs a configuration needs but did not get") {
  const batch<float> b(3, 6, 31);
  auto in = b.inputs();

  auto no_old = in;
  no_old.old_logp = {};
  RLPT_CHECK_ERROR(evaluate(objective{}, no_old), "rlpt.objective.missing_input", "ppo_clip needs old_logp");

  auto no_behav = in;
  no_behav.behav_logp = {};
  RLPT_CHECK_ERROR(evaluate(objective{.correction = token_tis(2.0)}, no_behav), "rlpt.objective.missing_input",
                   "off_policy_correction needs behav_logp");

  auto no_ref = in;
  no_ref.ref_logp = {};
  RLPT_CHECK_ERROR(evaluate(objective{.kl = {.coef = 0.1}}, no_ref), "rlpt.objective.missing_input",
                   "kl_penalty needs ref_logp");

  RLPT_CHECK_ERROR(evaluate(objective{.correction = {.weight = {.batch_normalize = true}}}, in),
                   "rlpt.objective.bad_option", "is_weighting.level is none");
  RLPT_CHECK_ERROR(evaluate(objective{.correction = {.weight = {.level = is_level::token,
                                                                .batch_normalize = true,
                                                                .batch_mean = std::nan("")}}},
                            in),
                   "rlpt.objective.bad_option", "is_weighting.batch_mean = nan must be finite");
  RLPT_CHECK_ERROR((void)local_is_weights(objective{}, in), "rlpt.objective.bad_option", "is_weighting.level is none");
  RLPT_CHECK_ERROR(evaluate(objective{.correction = {.weight = {.level = is_level::token, .batch_normalize = true},
                                                     .reject = {.stat = rs_stat::k2, .hi = 0.5},
                                                     .rejected = rejected_tokens::zero_weight}},
                            in),
                   "rlpt.objective.bad_option", "needs rejected = removed");

  auto no_adv = in;
  no_adv.adv = {};
  RLPT_CHECK_ERROR(evaluate(objective{}, no_adv), "rlpt.objective.missing_input", "needs advantages");

  auto no_entropy = in;
  no_entropy.entropy = {};
  RLPT_CHECK_ERROR(evaluate(objective{.entropy = {.coef = 0.01}}, no_entropy), "rlpt.objective.missing_input",
                   "entropy_bonus needs entropy");

  auto no_returns = in;
  no_returns.returns = {};
  RLPT_CHECK_ERROR(evaluate(objective{.value = {.coef = 1.0}}, no_returns), "rlpt.objective.missing_input",
                   "value_loss needs returns");

  auto no_teachers = in;
  no_teachers.teacher_logp = {};
  RLPT_CHECK_ERROR(evaluate(objective{.distill = {.coef = 1.0}}, no_teachers), "rlpt.objective.missing_input",
                   "teacher_logp", "got 0");

  RLPT_CHECK_ERROR(evaluate(objective{.kl = {.coef = 0.1, .importance_corrected = true}}, no_old),
                   "rlpt.objective.missing_input", "ppo_clip needs old_logp");

  // No mask means every token is valid (the convention of every block); a mask of the wrong
  // size is an error like any other per-token input.
  std::vector<mask_t> short_mask(b.mask.begin(), b.mask.end() - 1);
  auto bad_mask = in;
  bad_mask.mask = short_mask;
  RLPT_CHECK_ERROR(evaluate(objective{}, bad_mask), "rlpt.view.size_mismatch", "mask has 26 elements, expected 27");
}

TEST_CASE("errors: mismatched lengths, conflicting inputs, bad layout") {
  const batch<float> b(3, 6, 32);
  auto in = b.inputs();
  std::vector<float> short_lp(b.lp.begin(), b.lp.end() - 1);
  auto bad = in;
  bad.logp = short_lp;
  RLPT_CHECK_ERROR(evaluate(objective{}, bad), "rlpt.view.size_mismatch", "logp has 26 elements, expected 27");

  std::vector<float> g(10);
  RLPT_CHECK_ERROR(evaluate(objective{}, in, {.logp = g}), "rlpt.view.size_mismatch", "grads.logp has 10 elements");

  auto both = in;
  both.seq_adv = b.seq_adv;
  RLPT_CHECK_ERROR(evaluate(objective{}, both), "rlpt.objective.conflicting_input", "both adv", "and seq_adv");

  auto seq = in;
  seq.adv = {};
  std::vector<float> two(2);
  seq.seq_adv = two;
  RLPT_CHECK_ERROR(evaluate(objective{}, seq), "rlpt.view.size_mismatch", "seq_adv has 2 elements, expected 3");

  std::vector<mask_t> m(0);
  std::vector<float> none(0);
  basic_objective_inputs<float> empty_rows{.layout = token_layout::padded(4, 0), .mask = m, .logp = none};
  RLPT_CHECK_ERROR(evaluate(objective{.policy = policy_gradient{}}, empty_rows), "rlpt.objective.bad_layout",
                   "4 sequences of length T = 0");

  auto wrong_teachers = in;
  std::vector<float> t(30);
  wrong_teachers.teacher_logp = view2d<const float>(t.data(), 1, 30);
  RLPT_CHECK_ERROR(evaluate(objective{.distill = {.coef = 1.0, .student = student_logp::proximal}}, wrong_teachers),
                   "rlpt.view.size_mismatch", "teacher_logp columns has 30 elements, expected 27");
}

TEST_CASE("errors: bad options name the field and the value") {
  const batch<float> b(3, 6, 33);
  const auto in = b.inputs();
  RLPT_CHECK_ERROR(evaluate(objective{.policy = ppo_clip{.eps_low = -0.1}}, in), "rlpt.objective.bad_option",
                   "ppo_clip.eps_low = -0.1");
  RLPT_CHECK_ERROR(evaluate(objective{.policy = ppo_clip{.dual_clip = 0.5}}, in), "rlpt.objective.bad_option",
                   "ppo_clip.dual_clip = 0.5", "> 1");
  RLPT_CHECK_ERROR(evaluate(objective{.policy = ppo_clip{.log_ratio_clamp = 200.0}}, in), "rlpt.objective.bad_option",
                   "ppo_clip.log_ratio_clamp = 200");
  RLPT_CHECK_ERROR(evaluate(objective{.policy = sapo{.tau_neg = 0.0}}, in), "rlpt.objective.bad_option",
                   "sapo.tau_neg = 0");
  RLPT_CHECK_ERROR(evaluate(objective{.policy = cispo{.bounds = cispo_bounds::absolute, .cap = -1.0}}, in),
                   "rlpt.objective.bad_option", "cispo.cap = -1");
  RLPT_CHECK_ERROR(evaluate(objective{.policy = dppo{.trunc = 0.0}}, in), "rlpt.objective.bad_option",
                   "dppo.trunc = 0");
  RLPT_CHECK_ERROR(evaluate(objective{.policy = dppo{.eps_low = -0.1}}, in), "rlpt.objective.bad_option",
                   "dppo.eps_low = -0.1");
  RLPT_CHECK_ERROR(evaluate(objective{.policy = vespo{.k_neg = -1.0}}, in), "rlpt.objective.bad_option",
                   "vespo.k_neg = -1");
  RLPT_CHECK_ERROR(evaluate(objective{.policy = vespo{.lambda_pos = std::numeric_limits<double>::quiet_NaN()}}, in),
                   "rlpt.objective.bad_option", "vespo.lambda_pos = nan");
  RLPT_CHECK_ERROR(evaluate(objective{.policy = dro{}}, in), "rlpt.objective.bad_option", "dro.beta = 0", "no default");
  RLPT_CHECK_ERROR(evaluate(objective{.policy = dro{.beta = std::numeric_limits<double>::infinity()}}, in),
                   "rlpt.objective.bad_option", "dro.beta = inf");
  RLPT_CHECK_ERROR(evaluate(objective{.correction = token_tis(0.5, 1.0)}, in), "rlpt.objective.bad_option",
                   "is_weighting.hi = 0.5", ">= lo");
  // log_ratio bounds the log-ratio itself: any sign, lo <= hi, no NaN.
  RLPT_CHECK_ERROR(
      evaluate(objective{.correction = {.reject = {.stat = rs_stat::log_ratio, .lo = 0.5, .hi = -0.5}}}, in),
      "rlpt.objective.bad_option", "rejection.lo = 0.5", "<= hi");
  RLPT_CHECK_ERROR(evaluate(objective{.correction = {.reject = {.stat = rs_stat::log_ratio,
                                                                .lo = -1.0,
                                                                .hi = std::numeric_limits<double>::quiet_NaN()}}},
                            in),
                   "rlpt.objective.bad_option", "rejection.hi = nan");
  RLPT_CHECK_ERROR(evaluate(objective{.policy = vespo{.fold_is_weight = true}}, in), "rlpt.objective.bad_option",
                   "vespo.fold_is_weight", "must be token, got none");
  RLPT_CHECK_ERROR(evaluate(objective{.policy = vespo{.fold_is_weight = true}, .correction = seq_is(2.0)}, in),
                   "rlpt.objective.bad_option", "got a sequence level");
  // The KL weighted by the sequence ratio: an importance correction, of a policy in sequence form.
  RLPT_CHECK_ERROR(
      evaluate(objective{.policy = gspo{.token_level = false}, .kl = {.coef = 0.1, .importance_per_sequence = true}},
               in),
      "rlpt.objective.bad_option", "kl.importance_corrected is false");
  RLPT_CHECK_ERROR(
      evaluate(objective{.kl = {.coef = 0.1, .importance_corrected = true, .importance_per_sequence = true}}, in),
      "rlpt.objective.bad_option", "needs gspo, sapo or cispo with token_level = false, or vespo");
  // The summed log-ratio is a sequence form: GSPO-token's detached ratio is written for the mean.
  RLPT_CHECK_ERROR(evaluate(objective{.policy = gspo{.length_normalized = false}}, in), "rlpt.objective.bad_option",
                   "gspo.length_normalized = false", "needs gspo.token_level = false");
  // The divergences' lower bound: positive and <= hi, or <= 0 for none.
  RLPT_CHECK_ERROR(evaluate(objective{.correction = {.reject = {.stat = rs_stat::k3, .lo = 0.5, .hi = 0.1}}}, in),
                   "rlpt.objective.bad_option", "rejection.lo = 0.5", "<= 0 for no lower bound");
  RLPT_CHECK_ERROR(evaluate(objective{.correction = {.reject = {.stat = rs_stat::tv,
                                                                .lo = std::numeric_limits<double>::quiet_NaN(),
                                                                .hi = 0.1}}},
                            in),
                   "rlpt.objective.bad_option", "rejection.lo = nan");
  // bound_weight: sequence criteria choosing which sequence weights are bounded.
  RLPT_CHECK_ERROR(evaluate(objective{.correction = {.weight = {.level = is_level::seq_geomean, .hi = 2.0},
                                                     .reject = {.stat = rs_stat::ratio, .hi = 2.0},
                                                     .action = rejection_action::bound_weight}},
                            in),
                   "rlpt.objective.bad_option", "rejection.level = token", "must be at a sequence level");
  RLPT_CHECK_ERROR(evaluate(objective{.correction = {.weight = {.level = is_level::token},
                                                     .action = rejection_action::bound_weight}},
                            in),
                   "rlpt.objective.bad_option", "action = bound_weight needs a rejection criterion");
  RLPT_CHECK_ERROR(
      evaluate(objective{.correction = {.weight = {.level = is_level::token},
                                        .reject = {.stat = rs_stat::ratio, .level = rs_level::seq_max, .hi = 2.0},
                                        .action = rejection_action::bound_weight}},
               in),
      "rlpt.objective.bad_option", "action = bound_weight needs a sequence-level weight with a bound");
  // Each further criterion is checked under its own name.
  RLPT_CHECK_ERROR(
      evaluate(objective{.correction = {.reject = {.stat = rs_stat::k2, .hi = 0.1},
                                        .reject_also = {{{.stat = rs_stat::k3, .hi = 0.1},
                                                         {.stat = rs_stat::log_ratio, .lo = 1.0, .hi = 0.0}}}}},
               in),
      "rlpt.objective.bad_option", "reject_also[1].lo = 1");
  RLPT_CHECK_ERROR(
      evaluate(objective{.correction = {.reject_also = {{{}, {}, {.stat = rs_stat::k2, .hi = -1.0}}}}}, in),
      "rlpt.objective.bad_option", "reject_also[2].hi = -1");
  RLPT_CHECK_ERROR(
      evaluate(objective{.correction = {.reject_also = {{{.stat = rs_stat::k1, .lo = 3.0, .hi = 2.0}}}}}, in),
      "rlpt.objective.bad_option", "reject_also[0].lo = 3", "[0, hi]");
  RLPT_CHECK_ERROR(evaluate(objective{.agg = {.mode = agg_mode::seq_mean_token_sum_norm}}, in),
                   "rlpt.objective.bad_option", "needs norm > 0", "got 0");
  RLPT_CHECK_ERROR(evaluate(objective{.policy = gmpo{}}, in), "rlpt.objective.bad_option",
                   "gmpo gives one loss per sequence", "not token_mean");
  RLPT_CHECK_ERROR(evaluate(objective{.agg = {.global_tokens = -3.0}}, in), "rlpt.objective.bad_denominator",
                   "global_tokens = -3");
  RLPT_CHECK_ERROR(evaluate(objective{.kl = {.coef = std::numeric_limits<double>::quiet_NaN()}}, in),
                   "rlpt.objective.bad_option", "kl.coef = nan");
}

TEST_CASE("errors: a global denominator smaller than this call's own count") {
  const batch<float> b(4, 8, 34);
  const auto in = b.inputs();
  const double local = local_denominators(objective{}, in).tokens;
  RLPT_CHECK_ERROR(evaluate(objective{.agg = {.global_tokens = local - 1.0}}, in), "rlpt.objective.bad_denominator",
                   "global_tokens", "is smaller than the", "tokens in the loss in this call alone");
  RLPT_CHECK_ERROR(evaluate(objective{.agg = {.mode = agg_mode::seq_mean_token_sum, .global_seqs = 1.0}}, in),
                   "rlpt.objective.bad_denominator", "global_seqs = 1", "sequences in this call alone");

  // With seq_in_denominator the call's own count leaves the marked sequences out: their count is
  // the least a global denominator may be, and one token fewer is the error.
  const std::vector<mask_t> counted{1, 0, 1, 0};
  auto marked = in;
  marked.seq_in_denominator = counted;
  const loss_denominators own = local_denominators(objective{}, marked);
  CHECK(own.tokens < local);
  CHECK(evaluate(objective{.agg = {.global_tokens = own.tokens}}, marked).loss_tokens == local);
  RLPT_CHECK_ERROR(evaluate(objective{.agg = {.global_tokens = own.tokens - 1.0}}, marked),
                   "rlpt.objective.bad_denominator", "is smaller than the", "tokens in the loss in this call alone");
  RLPT_CHECK_ERROR(
      evaluate(objective{.agg = {.mode = agg_mode::seq_mean_token_sum, .global_seqs = own.seqs - 1.0}}, marked),
      "rlpt.objective.bad_denominator", "sequences in this call alone");
  const std::vector<mask_t> short_mask{1, 0, 1};
  marked.seq_in_denominator = short_mask;
  RLPT_CHECK_ERROR(evaluate(objective{}, marked), "rlpt.view.size_mismatch",
                   "seq_in_denominator has 3 elements, expected 4");
}

TEST_CASE("errors: a non-finite input at a valid token is reported with its place") {
  batch<float> b(3, 6, 35);
  std::size_t at = 0;
  while (!b.mask[at]) ++at;
  b.lp[at] = std::numeric_limits<float>::infinity();
  RLPT_CHECK_ERROR(evaluate(objective{}, b.inputs()), "rlpt.objective.nonfinite",
                   fmt::format("logp[{}] = inf is not finite at a valid token", at), "rlpt::nonfinite::mask");
}

TEST_CASE("errors: compat presets reject what they do not reproduce") {
  RLPT_CHECK_ERROR(compat::verl::actor({.loss_mode = "clip_cov"}), "rlpt.objective.compat",
                   "policy_loss.loss_mode = \"clip_cov\"");
  RLPT_CHECK_ERROR(compat::verl::actor({.loss_mode = "dro"}), "rlpt.objective.compat", "dro_beta", "no default");
  RLPT_CHECK_ERROR(compat::verl::actor({.loss_mode = "dro", .dro_beta = -1.0}), "rlpt.objective.compat",
                   "dro_beta > 0, got -1");
  RLPT_CHECK_ERROR(compat::verl::agg("seq-mean-token-sum-norm"), "rlpt.objective.compat", "loss_scale_factor");
  RLPT_CHECK_ERROR(compat::verl::agg("token-mean", 8), "rlpt.objective.compat", "dp_size = 8", "batch_num_tokens");
  RLPT_CHECK_ERROR(compat::verl::kl("full"), "rlpt.objective.compat", "kl_loss_type = \"full\"");
  RLPT_CHECK_ERROR(compat::verl::rollout_correction("token", "abc"), "rlpt.objective.compat",
                   "\"abc\" is not a number");
  RLPT_CHECK_ERROR(compat::verl::rollout_correction("", "", "token_k2", "0.5_2"), "rlpt.objective.compat",
                   "only k1 options");
  // Comma-separated rollout_rs: each option named where it fails; the thresholds one or one each.
  RLPT_CHECK_ERROR(compat::verl::rollout_correction("", "", "token_k1,seq_max_k1", "2.0"), "rlpt.objective.compat",
                   "rollout_rs = \"seq_max_k1\"");
  RLPT_CHECK_ERROR(compat::verl::rollout_correction("", "", "token_k1,seq_mean_k2", "0.5_2.0,0.1_0.2"),
                   "rlpt.objective.compat", "\"0.1_0.2\" for rollout_rs option seq_mean_k2", "only k1 options");
  RLPT_CHECK_ERROR(compat::verl::rollout_correction("", "", "token_k1,seq_mean_k2,seq_max_k3", "2.0,0.1"),
                   "rlpt.objective.compat", "one threshold shared by every option or one per option", "(3)");
  RLPT_CHECK_ERROR(compat::verl::rollout_correction("", "", "token_k1,seq_mean_k2", "2.0,0.1,0.2"),
                   "rlpt.objective.compat", "more thresholds than", "(2)");
  RLPT_CHECK_ERROR(compat::verl::rollout_correction("", "", "token_k2", ""), "rlpt.objective.compat",
                   "rollout_rs_threshold = \"\" needs one threshold");
  RLPT_CHECK_ERROR(compat::verl::rollout_correction("", "", " , ", "2.0"), "rlpt.objective.compat",
                   "rollout_rs = \" , \"");
  // Every verl option at once is 11 criteria, rlpt's most; a twelfth distinct one is not verl's.
  constexpr const char* all_eleven =
      "token_k1,token_k2,token_k3,seq_sum_k1,seq_sum_k2,seq_sum_k3,seq_mean_k1,seq_mean_k2,seq_mean_k3,seq_max_k2,"
      "seq_max_k3";
  CHECK(compat::verl::rollout_correction("", "", all_eleven, "2.0").reject_also.back().stat == rs_stat::k3);
  RLPT_CHECK_ERROR(compat::verl::rollout_correction("", "", std::string(all_eleven) + ",seq_max_k4", "2.0"),
                   "rlpt.objective.compat", "more than 11 distinct options");
  RLPT_CHECK_ERROR(compat::trl::grpo({.loss_type = "dapo"}), "rlpt.objective.compat", "num_items_in_batch");
  RLPT_CHECK_ERROR(compat::trl::grpo({.loss_type = "luspo_x"}), "rlpt.objective.compat", "loss_type = \"luspo_x\"");
  RLPT_CHECK_ERROR(compat::trl::grpo({.loss_type = "vespo", .vllm_importance_sampling_correction = true}),
                   "rlpt.objective.compat", "token_truncate or token_mask", "\"sequence_mask\"");
  RLPT_CHECK_ERROR(compat::openrlhf::policy_loss({.is_correction_level = "token", .is_correction_gating = "js"}),
                   "rlpt.objective.compat", "is_correction_gating = \"js\"");
  RLPT_CHECK_ERROR(compat::openrlhf::policy_loss({.is_correction_level = "token", .is_correction_gating = "tv"}),
                   "rlpt.objective.compat", "upper bound only", "is_correction_low = 0.5");
  RLPT_CHECK_ERROR(compat::openrlhf::policy_loss({.is_correction_level = "token",
                                                  .is_correction_mode = "clip",
                                                  .is_correction_gating = "binary_kl",
                                                  .is_correction_low = 0.0}),
                   "rlpt.objective.compat", "needs is_correction_mode = mask");
  RLPT_CHECK_ERROR(compat::openrlhf::policy_loss({.policy_loss_type = "gspo", .is_correction_level = "token"}),
                   "rlpt.objective.compat", "rollout log-probs");
  // AReaL: RejectionSamplingConfig's own checks, then what rlpt does not reproduce.
  namespace areal = compat::areal;
  RLPT_CHECK_ERROR(areal::actor({.rejection_sampling = true, .rejection_metric = "kl_k4"}), "rlpt.objective.compat",
                   "rejection_sampling.metric = \"kl_k4\"", "ratio, kl_k1, kl_k2, kl_k3");
  RLPT_CHECK_ERROR(areal::actor({.rejection_sampling = true, .rejection_agg = "median"}), "rlpt.objective.compat",
                   "rejection_sampling.agg = \"median\"");
  RLPT_CHECK_ERROR(areal::actor({.rejection_sampling = true, .rejection_upper = 0.5, .rejection_lower = 0.6}),
                   "rlpt.objective.compat", "lower = 0.6 cannot be greater than upper = 0.5");
  RLPT_CHECK_ERROR(areal::actor({.rejection_sampling = true, .rejection_upper = 1.0}), "rlpt.objective.compat",
                   "upper = 1 must be > 1.0", "metric = ratio");
  RLPT_CHECK_ERROR(areal::actor({.rejection_sampling = true, .rejection_lower = 0.0}), "rlpt.objective.compat",
                   "lower = 0 must be positive");
  RLPT_CHECK_ERROR(areal::actor({.rejection_sampling = true, .rejection_metric = "kl_k3", .rejection_upper = 0.0}),
                   "rlpt.objective.compat", "upper = 0 must be positive for metric = kl_k3");
  RLPT_CHECK_ERROR(areal::actor({.rejection_sampling = true,
                                 .rejection_action = "clamp",
                                 .rejection_metric = "kl_k2",
                                 .rejection_upper = 0.1}),
                   "rlpt.objective.compat", "clamp supports only metric = ratio, got metric = kl_k2");
  RLPT_CHECK_ERROR(
      areal::actor(
          {.rejection_sampling = true, .rejection_metric = "kl_k3", .rejection_upper = 0.1, .rejection_lower = 0.0}),
      "rlpt.objective.compat", "lower = 0 with metric = kl_k3 is not reproduced",
      "leave lower unset or make it positive");
  RLPT_CHECK_ERROR(areal::actor({.rejection_sampling = true,
                                 .rejection_level = "sequence",
                                 .rejection_metric = "kl_k3",
                                 .rejection_upper = 0.1,
                                 .rejection_lower = -1.0}),
                   "rlpt.objective.compat", "lower = -1 with metric = kl_k3");
  RLPT_CHECK_ERROR(
      areal::actor({.use_decoupled_loss = false, .importance_sampling_level = "seq", .use_sapo_loss = true}),
      "rlpt.objective.compat", "importance_sampling_level = \"seq\"", "token, sequence");
  // PPOActorConfig's defaults: rejection_sampling None, so no correction; set, it filters whether or
  // not the loss is decoupled (ppo_actor_loss_fn does), except under SAPO, whose loss takes none.
  CHECK(areal::actor({}).correction.reject.stat == rs_stat::none);
  CHECK(areal::actor({}).correction.weight.level == is_level::none);
  CHECK(areal::actor({.rejection_sampling = true}).correction.reject.stat == rs_stat::ratio);
  CHECK(areal::actor({.rejection_sampling = true, .use_sapo_loss = true}).correction.weight.level == is_level::none);
  // What AReaL accepts and rlpt builds: k1 with an upper bound below 0; agg ignored at token level.
  CHECK(std::holds_alternative<gspo>(areal::actor({.importance_sampling_level = "sequence"}).policy));
  CHECK(areal::actor({.rejection_sampling = true, .rejection_metric = "kl_k1", .rejection_upper = -0.1})
            .correction.reject.lo == -std::numeric_limits<double>::infinity());
  CHECK(areal::actor({.rejection_sampling = true, .rejection_agg = "max"}).correction.reject.level == rs_level::token);
  // A lower bound <= 0 on k2 keeps every token, as AReaL's does (k2 is a square).
  CHECK(areal::actor(
            {.rejection_sampling = true, .rejection_metric = "kl_k2", .rejection_upper = 0.1, .rejection_lower = -0.5})
            .correction.reject.lo == 0.0);
  // Clamp at sequence level: the criterion chooses the weights to bound on the sum and the max only.
  const auto clamp_seq = [](const char* agg) {
    return areal::actor({.rejection_sampling = true,
                         .rejection_level = "sequence",
                         .rejection_action = "clamp",
                         .rejection_agg = agg})
        .correction;
  };
  CHECK(clamp_seq("max").action == rejection_action::bound_weight);
  CHECK(clamp_seq("sum").reject.level == rs_level::seq_sum);
  CHECK(clamp_seq("mean").action == rejection_action::reject);
  CHECK(clamp_seq("mean").reject.stat == rs_stat::none);
}

TEST_CASE("compat configs own their strings: a config outlives the buffer it was read from") {
  compat::verl::actor_config verl_cfg;
  compat::trl::grpo_config trl_cfg;
  {
    std::string parsed = "gspo"; // as read from a YAML file whose buffer is then freed
    verl_cfg.loss_mode = parsed;
    parsed = "sequence";
    trl_cfg.importance_sampling_level = parsed;
    parsed.assign(64, 'x'); // overwrite (and reallocate) the source
  }
  trl_cfg.loss_type = "grpo";
  CHECK(std::holds_alternative<gspo>(compat::verl::actor(verl_cfg).policy));
  CHECK(std::get<gspo>(compat::trl::grpo(trl_cfg).policy).token_level == false);
}
