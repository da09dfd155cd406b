// SPDX-License-Identifier: Apache-2.0
//! @file
//! One composable objective and one entry point that evaluates it: loss, gradients with respect
//! to the current log-probs (and entropies and values when those terms are on) and metrics.
//!
//!     rlpt::objective obj{
//!         .policy     = rlpt::ppo_clip{.eps_low = 0.2, .eps_high = 0.28},
//!         .correction = rlpt::token_tis(2.0),
//!         .kl         = {.coef = 1e-3, .estimator = rlpt::kl_estimator::k3},
//!         .agg        = {.mode = rlpt::agg_mode::token_mean, .global_tokens = step_tokens},
//!     };
//!     rlpt::objective_result r = rlpt::evaluate(obj, inputs, {.logp = grad_logp});
//!
//! The objective is policy x correction x KL x entropy x value x aggregation: each part is an
//! option struct, and evaluate() runs any combination in one pass over the tokens per row
//! (plus a row-statistics pass when a sequence-level piece needs one). The total loss is
//!   policy + kl.coef * KL - entropy.coef * H + value.coef * V,
//! each term aggregated with its own aggregation (`agg` unless overridden).
#pragma once

#include <rlpt/config.hpp>
#include <rlpt/core/copy.hpp>
#include <rlpt/core/error.hpp>
#include <rlpt/core/executor.hpp>
#include <rlpt/core/layout.hpp>
#include <rlpt/core/nonfinite.hpp>
#include <rlpt/core/views.hpp>
#include <rlpt/objective/aggregate.hpp>
#include <rlpt/objective/correction.hpp>
#include <rlpt/objective/detail/math.hpp>
#include <rlpt/objective/detail/host_row.hpp>
#include <rlpt/objective/detail/plan.hpp>
#include <rlpt/objective/distill.hpp>
#include <rlpt/objective/entropy.hpp>
#include <rlpt/objective/inputs.hpp>
#include <rlpt/objective/kl.hpp>
#include <rlpt/objective/policy.hpp>
#include <rlpt/objective/value.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string_view>
#include <type_traits>
#include <variant>
#include <vector>

RLPT_NAMESPACE_BEGIN

//! A complete objective. Every part defaults to verl's behaviour (see each struct).
struct objective {
  policy_term policy = ppo_clip{};
  off_policy_correction correction{};
  kl_penalty kl{};
  entropy_bonus entropy{};
  value_loss value{};
  distillation distill{};
  //! Aggregation of every term unless the term's override below is set.
  aggregation agg{};
  //! verl forces seq-mean-token-mean on its gspo / sapo policy term while KL and entropy keep
  //! loss_agg_mode; TRL aggregates entropy as a local token mean whatever the loss type.
  std::optional<aggregation> policy_agg{};
  std::optional<aggregation> kl_agg{};
  std::optional<aggregation> entropy_agg{};
  std::optional<aggregation> value_agg{};
  //! A valid token with a non-finite input: raise (the default) names it in an rlpt::error; mask
  //! leaves it out of the loss and the local denominators and counts it (nonfinite_tokens).
  rlpt::nonfinite nonfinite = rlpt::nonfinite::raise;
};

namespace detail {

inline void check_option(bool ok, std::string_view what, double value, std::string_view need) {
  if (RLPT_UNLIKELY(!ok)) RLPT_FAIL(errors::objective::bad_option, "{} = {} {}", what, value, need);
}

inline void check_nonnegative(double v, std::string_view what) {
  check_option(v >= 0.0 && std::isfinite(v), what, v, "must be finite and >= 0");
}

inline void check_positive(double v, std::string_view what, std::string_view need = "must be finite and > 0") {
  check_option(v > 0.0 && std::isfinite(v), what, v, need);
}

inline void check_clamp(double c, std::string_view what) {
  check_option(c > 0.0 && c <= 80.0, what, static_cast<double>(c),
               "must be in (0, 80] (the log-ratio clamp keeps exp finite in fp32)");
}

inline void require(bool present, std::string_view who, std::string_view input, std::string_view why) {
  if (RLPT_UNLIKELY(!present))
    RLPT_FAIL(errors::objective::missing_input, "{} needs {} ({}), but none was given", who, input, why);
}

//! Validates the configuration against the inputs that are present and returns its plan.
template <class T, memory_space S>
objective_plan make_plan(const objective& obj, const basic_objective_inputs<T, S>& in,
                         const basic_objective_grads<T, S>& gr) {
  objective_plan p;
  const auto& L = in.layout;
  if (!L.is_packed())
    RLPT_CHECK(L.num_seqs() == 0 || L.max_len() > 0, errors::objective::bad_layout,
               "padded layout has {} sequences of length T = {}; T must be > 0", L.num_seqs(), L.max_len());
  const index_t n = L.storage_size();
  if (in.mask.size() != 0) L.expect_tokens("mask", in.mask); // no mask: every token is valid
  // An input is absent when it is empty and the layout has token slots. A layout without any
  // (an empty batch) makes every per-token input empty and complete: empty is not absent.
  const bool no_tokens = n == 0;
  auto token_input = [&](auto v, std::string_view what) {
    if (v.size() != 0) L.expect_tokens(what, v);
    return v.size() != 0 || no_tokens;
  };
  const bool has_logp = token_input(in.logp, "logp");
  p.has_old = token_input(in.old_logp, "old_logp");
  p.has_behav = token_input(in.behav_logp, "behav_logp");
  p.has_ref = token_input(in.ref_logp, "ref_logp");
  p.has_adv = token_input(in.adv, "adv");
  p.has_entropy = token_input(in.entropy, "entropy");
  const bool has_values = token_input(in.values, "values");
  const bool has_old_values = token_input(in.old_values, "old_values");
  const bool has_returns = token_input(in.returns, "returns");
  if (in.seq_adv.size() != 0) {
    detail::expect_size("seq_adv", in.seq_adv.size(), L.num_seqs(), "one per sequence");
    p.has_seq_adv = true;
    if (no_tokens) p.has_adv = false; // empty sequences with seq_adv: the advantages are seq_adv
  }
  if (in.seq_in_denominator.size() != 0) {
    detail::expect_size("seq_in_denominator", in.seq_in_denominator.size(), L.num_seqs(), "one per sequence");
    p.has_den_mask = true;
  }
  RLPT_CHECK(!(p.has_adv && p.has_seq_adv), errors::objective::conflicting_input,
             "both adv ({} per-token values) and seq_adv ({} per-sequence values) were given; pass one", in.adv.size(),
             in.seq_adv.size());
  if (gr.logp.size() != 0) L.expect_tokens("grads.logp", gr.logp);
  if (gr.entropy.size() != 0) L.expect_tokens("grads.entropy", gr.entropy);
  if (gr.values.size() != 0) L.expect_tokens("grads.values", gr.values);

  // --- policy -------------------------------------------------------------------------------
  p.policy = static_cast<policy_kind>(obj.policy.index());
  p.use_policy = p.policy != policy_kind::none;
  const bool distill_on = obj.distill.coef != 0.0;
  const std::string_view pname = name(p.policy);
  if (p.use_policy) {
    require(has_logp, pname, "logp", "the current policy's log-probs");
    require(p.has_adv || p.has_seq_adv || distill_on, pname, "advantages",
            "adv per token or seq_adv per sequence, or a distillation term");
    if (p.policy != policy_kind::policy_gradient)
      require(p.has_old, pname, "old_logp",
              "the proximal policy's log-probs that the ratio is taken against; for a single on-policy step pass "
              "the current log-probs (detached) as old_logp");
  }
  std::visit(
      [&](const auto& t) {
        using P = std::decay_t<decltype(t)>;
        if constexpr (std::is_same_v<P, ppo_clip>) {
          check_option(t.eps_low >= 0.0 && t.eps_low <= 1.0, "ppo_clip.eps_low", t.eps_low, "must be in [0, 1]");
          check_nonnegative(t.eps_high, "ppo_clip.eps_high");
          check_option(t.dual_clip == 0.0 || t.dual_clip > 1.0, "ppo_clip.dual_clip", t.dual_clip,
                       "must be 0 (off) or > 1");
          check_option(t.delta == 0.0 || t.delta > 1.0, "ppo_clip.delta", t.delta, "must be 0 (off) or > 1");
          check_clamp(t.log_ratio_clamp, "ppo_clip.log_ratio_clamp");
          p.ppo = t;
        } else if constexpr (std::is_same_v<P, gspo>) {
          check_option(t.eps_low >= 0.0 && t.eps_low <= 1.0, "gspo.eps_low", t.eps_low, "must be in [0, 1]");
          check_nonnegative(t.eps_high, "gspo.eps_high");
          check_option(t.dual_clip == 0.0 || t.dual_clip > 1.0, "gspo.dual_clip", t.dual_clip,
                       "must be 0 (off) or > 1");
          check_option(t.delta == 0.0 || t.delta > 1.0, "gspo.delta", t.delta, "must be 0 (off) or > 1");
          check_clamp(t.log_ratio_max, "gspo.log_ratio_max");
          RLPT_CHECK(t.length_normalized || !t.token_level, errors::objective::bad_option,
                     "gspo.length_normalized = false (the summed log-ratio) needs gspo.token_level = false, the "
                     "sequence form");
          p.gs = t;
          p.seq_sum = !t.length_normalized;
          p.sequence_form = !t.token_level;
          p.seq_ratio = true;
          p.mean_advantage = t.mean_advantage;
        } else if constexpr (std::is_same_v<P, gmpo>) {
          check_nonnegative(t.eps_low, "gmpo.eps_low");
          check_nonnegative(t.eps_high, "gmpo.eps_high");
          check_clamp(t.log_ratio_clamp, "gmpo.log_ratio_clamp");
          p.gm = t;
        } else if constexpr (std::is_same_v<P, cispo>) {
          check_option(t.eps_low >= 0.0 && std::isfinite(t.eps_low), "cispo.eps_low", t.eps_low,
                       "must be finite and >= 0 (>= 1 means no lower bound)");
          check_nonnegative(t.eps_high, "cispo.eps_high");
          check_positive(t.cap, "cispo.cap");
          check_clamp(t.log_ratio_clamp, "cispo.log_ratio_clamp");
          p.ci = t;
          p.seq_ratio = !t.token_level;
        } else if constexpr (std::is_same_v<P, sapo>) {
          check_option(t.tau_pos > 0.0 && t.tau_pos <= 80.0, "sapo.tau_pos", t.tau_pos, "must be in (0, 80]");
          check_option(t.tau_neg > 0.0 && t.tau_neg <= 80.0, "sapo.tau_neg", t.tau_neg, "must be in (0, 80]");
          check_clamp(t.log_ratio_clamp, "sapo.log_ratio_clamp");
          p.sa = t;
          p.sequence_form = !t.token_level;
          p.seq_ratio = p.sequence_form;
          p.mean_advantage = t.mean_advantage;
        } else if constexpr (std::is_same_v<P, dppo>) {
          check_nonnegative(t.eps_low, "dppo.eps_low");
          check_nonnegative(t.eps_high, "dppo.eps_high");
          check_positive(t.trunc, "dppo.trunc");
          check_clamp(t.log_ratio_clamp, "dppo.log_ratio_clamp");
          p.dp = t;
        } else if constexpr (std::is_same_v<P, dro>) {
          check_positive(t.beta, "dro.beta",
                         "must be finite and > 0 (it has no default, as verl's policy_loss.dro_beta)");
          p.dr = t;
        } else if constexpr (std::is_same_v<P, vespo>) {
          check_nonnegative(t.k_pos, "vespo.k_pos");
          check_nonnegative(t.k_neg, "vespo.k_neg");
          check_option(std::isfinite(t.lambda_pos), "vespo.lambda_pos", t.lambda_pos, "must be finite");
          check_option(std::isfinite(t.lambda_neg), "vespo.lambda_neg", t.lambda_neg, "must be finite");
          const is_level lw = obj.correction.weight.level;
          RLPT_CHECK(!t.fold_is_weight || lw == is_level::token, errors::objective::bad_option,
                     "vespo.fold_is_weight folds token importance weights into the sequence weight; "
                     "correction.weight.level must be token, got {}",
                     lw == is_level::none ? "none" : "a sequence level");
          p.ve = t;
        }
      },
      obj.policy);

  // --- correction ---------------------------------------------------------------------------
  const off_policy_correction& c = obj.correction;
  p.corr = c;
  p.use_is = c.weight.level != is_level::none;
  p.use_rs = c.rejects();
  p.is_seq = c.weight.level == is_level::seq_product || c.weight.level == is_level::seq_geomean;
  // Under rejection_action::bound_weight no token is rejected: the criteria choose the weight's bound.
  const bool rejecting = p.use_rs && c.action == rejection_action::reject;
  p.removes = rejecting && c.rejected != rejected_tokens::zero_weight;
  p.drops_count = rejecting && c.rejected == rejected_tokens::removed;
  if (c.active()) {
    require(p.use_policy, "off_policy_correction", "a policy term", "its weights scale the policy term");
    require(p.has_behav, "off_policy_correction", "behav_logp", "the rollout engine's log-probs");
    if (c.numerator == ratio_numerator::proximal)
      require(p.has_old, "off_policy_correction", "old_logp",
              "the ratio numerator is the proximal policy; use ratio_numerator::current for bypass mode");
    else
      require(has_logp, "off_policy_correction", "logp", "the ratio numerator is the current policy");
    check_clamp(c.log_ratio_clamp, "off_policy_correction.log_ratio_clamp");
  }
  if (p.use_is) {
    check_option(c.weight.lo >= 0.0 && std::isfinite(c.weight.lo), "is_weighting.lo", c.weight.lo,
                 "must be finite and >= 0 (0 = no lower bound)");
    check_option(c.weight.hi > 0.0 && c.weight.hi >= c.weight.lo, "is_weighting.hi", c.weight.hi,
                 "must be > 0 and >= lo");
  }
  if (c.weight.batch_normalize) {
    RLPT_CHECK(p.use_is, errors::objective::bad_option,
               "is_weighting.batch_normalize divides importance weights by their mean, but is_weighting.level is none");
    // verl removes rejected tokens; a mean over weights that rejection zeroed is no peer's.
    RLPT_CHECK(!p.use_rs || c.rejected == rejected_tokens::removed, errors::objective::bad_option,
               "is_weighting.batch_normalize with rejection needs rejected = removed (verl's), not zero_weight");
    const double m = c.weight.batch_mean;
    check_option(std::isfinite(m), "is_weighting.batch_mean", m,
                 "must be finite (the step's mean weight, or < 0 for this call's own)");
    if (m < 0.0)
      p.w_norm_local = true; // resolved from count_local
    else
      p.w_norm = m > 1e-8 ? m : 1.0;
  }
  // Every criterion in use, each checked under its own name; all must pass (verl's comma-separated
  // rollout_rs).
  struct rs_names {
    const char *lo, *hi, *level, *stat;
  };
  auto add_rejection = [&](const rejection& r, const rs_names& name) {
    if (r.stat == rs_stat::none) return;
    if (r.stat == rs_stat::log_ratio) {
      check_option(!std::isnan(r.hi), name.hi, r.hi, "must be a number (inf for no upper bound)");
      check_option(!std::isnan(r.lo) && r.lo <= r.hi, name.lo, r.lo, "must be <= hi (-inf for no lower bound)");
    } else {
      check_option(r.hi > 0.0, name.hi, r.hi, "must be > 0");
      if (r.stat != rs_stat::k1 && r.stat != rs_stat::ratio)
        check_option(!std::isnan(r.lo) && (r.lo <= 0.0 || r.lo <= r.hi), name.lo, r.lo,
                     "must be <= hi (<= 0 for no lower bound)");
    }
    if (c.action == rejection_action::bound_weight)
      RLPT_CHECK(r.level != rs_level::token, errors::objective::bad_option,
                 "{} = token, but off_policy_correction.action = bound_weight bounds sequence weights: every "
                 "criterion must be at a sequence level",
                 name.level);
    rs_plan& q = p.rs[p.rs_count++];
    q.stat = r.stat;
    q.level = r.level;
    q.lo = r.lo;
    q.hi = r.hi;
    if (r.stat == rs_stat::k1 || r.stat == rs_stat::ratio) {
      check_option(r.lo >= 0.0 && r.lo <= r.hi, name.lo, r.lo, "must be in [0, hi]");
      if (r.stat == rs_stat::k1 && q.lo == 0.0) q.lo = 1.0 / r.hi; // verl: a single number means [1/hi, hi]
      q.log_lo = q.lo > 0.0 ? std::log(q.lo) : -std::numeric_limits<double>::infinity();
      q.log_hi = std::log(r.hi);
    }
    (r.level == rs_level::token ? p.rs_token : p.rs_seq) = true;
    if (r.level == rs_level::token) p.rs_held = r.stat;
  };
  add_rejection(c.reject, {"rejection.lo", "rejection.hi", "rejection.level", "rejection.stat"});
  static constexpr rs_names also_names[] = {
      {"reject_also[0].lo", "reject_also[0].hi", "reject_also[0].level", "reject_also[0].stat"},
      {"reject_also[1].lo", "reject_also[1].hi", "reject_also[1].level", "reject_also[1].stat"},
      {"reject_also[2].lo", "reject_also[2].hi", "reject_also[2].level", "reject_also[2].stat"},
      {"reject_also[3].lo", "reject_also[3].hi", "reject_also[3].level", "reject_also[3].stat"},
      {"reject_also[4].lo", "reject_also[4].hi", "reject_also[4].level", "reject_also[4].stat"},
      {"reject_also[5].lo", "reject_also[5].hi", "reject_also[5].level", "reject_also[5].stat"},
      {"reject_also[6].lo", "reject_also[6].hi", "reject_also[6].level", "reject_also[6].stat"},
      {"reject_also[7].lo", "reject_also[7].hi", "reject_also[7].level", "reject_also[7].stat"},
      {"reject_also[8].lo", "reject_also[8].hi", "reject_also[8].level", "reject_also[8].stat"},
      {"reject_also[9].lo", "reject_also[9].hi", "reject_also[9].level", "reject_also[9].stat"}};
  static_assert(std::size(also_names) == std::tuple_size_v<decltype(c.reject_also)>);
  for (std::size_t i = 0; i < c.reject_also.size(); ++i) add_rejection(c.reject_also[i], also_names[i]);
  if (c.action == rejection_action::bound_weight) {
    RLPT_CHECK(p.use_rs, errors::objective::bad_option,
               "off_policy_correction.action = bound_weight needs a rejection criterion (it decides which sequences' "
               "weights are bounded)");
    RLPT_CHECK(p.is_seq && c.weight.bound != is_bound::none, errors::objective::bad_option,
               "off_policy_correction.action = bound_weight needs a sequence-level weight with a bound (is_weighting "
               "level seq_product or seq_geomean, bound truncate or mask)");
  }

  // --- KL -----------------------------------------------------------------------------------
  const kl_penalty& k = obj.kl;
  check_option(std::isfinite(k.coef), "kl.coef", k.coef, "must be finite");
  p.kl = k;
  p.use_kl = k.coef != 0.0;
  if (p.use_kl) {
    require(has_logp, "kl_penalty", "logp", "the current policy's log-probs");
    require(p.has_ref, "kl_penalty", "ref_logp", "the reference policy's log-probs");
    check_option(k.k3_x_min < k.k3_x_max, "kl.k3_x_min", k.k3_x_min, "must be < k3_x_max");
    check_option(k.output_clamp >= 0.0, "kl.output_clamp", k.output_clamp, "must be >= 0 (0 = none)");
    check_option(k.is_cap > 0.0, "kl.is_cap", k.is_cap, "must be > 0");
    if (k.importance_corrected)
      require(p.has_old, "kl_penalty.importance_corrected", "old_logp", "the weight is exp(logp - old_logp)");
    if (k.importance_per_sequence) {
      RLPT_CHECK(k.importance_corrected, errors::objective::bad_option,
                 "kl.importance_per_sequence chooses the sequence ratio as the KL term's importance weight, but "
                 "kl.importance_corrected is false");
      RLPT_CHECK(p.sequence_form || (p.policy == policy_kind::cispo && !p.ci.token_level) ||
                     p.policy == policy_kind::vespo,
                 errors::objective::bad_option,
                 "kl.importance_per_sequence weights the KL term by the row's sequence ratio exp(s): it needs gspo, "
                 "sapo or cispo with token_level = false, or vespo (TRL's sequence level)");
      p.kl_seq_ic = true;
      p.seq_ratio = true; // vespo's own weight uses the clamped sum; the KL's ratio the plain mean
    }
  }

  // --- entropy, value, distillation ---------------------------------------------------------
  check_option(std::isfinite(obj.entropy.coef), "entropy.coef", obj.entropy.coef, "must be finite");
  p.entropy_coef = obj.entropy.coef;
  p.use_entropy = obj.entropy.coef != 0.0;
  if (p.use_entropy) require(p.has_entropy, "entropy_bonus", "entropy", "the per-token entropies");

  const value_loss& v = obj.value;
  check_option(std::isfinite(v.coef), "value.coef", v.coef, "must be finite");
  p.value = v;
  p.use_value = v.coef != 0.0;
  p.has_values = has_values;
  if (p.use_value) {
    require(has_values, "value_loss", "values", "the critic's predictions");
    require(has_returns, "value_loss", "returns", "the value targets");
    if (v.clip > 0.0) require(has_old_values, "value_loss", "old_values", "the clip is centred on them");
    check_nonnegative(v.clip, "value.clip");
    check_nonnegative(v.huber_delta, "value.huber_delta");
  }

  const distillation& d = obj.distill;
  check_option(std::isfinite(d.coef), "distill.coef", d.coef, "must be finite");
  p.distill_coef = d.coef;
  p.student = d.student;
  if (distill_on) {
    require(p.use_policy, "distillation", "a policy term", "its advantage feeds the policy term");
    const index_t teachers = in.teacher_logp.rows();
    RLPT_CHECK(teachers >= 1 && teachers <= max_teachers, errors::objective::missing_input,
               "distillation needs teacher_logp with 1 to {} teacher rows, got {}", max_teachers, teachers);
    detail::expect_size("teacher_logp columns", in.teacher_logp.cols(), n, "one per token slot");
    p.teachers = static_cast<int>(teachers);
    if (d.student == student_logp::behaviour) require(p.has_behav, "distillation", "behav_logp", "student = behaviour");
    if (d.student == student_logp::proximal) require(p.has_old, "distillation", "old_logp", "student = proximal");
    if (d.student == student_logp::current) require(has_logp, "distillation", "logp", "student = current");
    if (!d.teacher_weights.empty()) {
      detail::expect_size("distillation.teacher_weights", static_cast<index_t>(d.teacher_weights.size()), teachers,
                          "one per teacher row");
      for (int t = 0; t < p.teachers; ++t) {
        check_option(std::isfinite(d.teacher_weights[static_cast<std::size_t>(t)]), "distillation.teacher_weights[i]",
                     d.teacher_weights[static_cast<std::size_t>(t)], "must be finite");
        p.teacher_w[t] = d.teacher_weights[static_cast<std::size_t>(t)];
      }
    } else {
      for (int t = 0; t < p.teachers; ++t) p.teacher_w[t] = 1.0 / static_cast<double>(teachers);
    }
  }

  // --- aggregation --------------------------------------------------------------------------
  p.agg_policy = make_agg_plan(obj.policy_agg ? *obj.policy_agg : obj.agg, "policy");
  p.agg_kl = make_agg_plan(obj.kl_agg ? *obj.kl_agg : obj.agg, "kl");
  p.agg_entropy = make_agg_plan(obj.entropy_agg ? *obj.entropy_agg : obj.agg, "entropy");
  p.agg_value = make_agg_plan(obj.value_agg ? *obj.value_agg : obj.agg, "value");
  if (p.policy == policy_kind::gmpo)
    RLPT_CHECK(p.agg_policy.mode == agg_mode::seq_mean_token_sum || p.agg_policy.mode == agg_mode::seq_mean_token_mean,
               errors::objective::bad_option,
               "gmpo gives one loss per sequence; aggregate it with seq_mean_token_mean or seq_mean_token_sum "
               "(verl: torch.mean over rows), not {}",
               name(p.agg_policy.mode));
  p.nonfinite = obj.nonfinite;
  p.fold_w = p.policy == policy_kind::vespo && p.ve.fold_is_weight && p.use_is;
  p.coupled = p.sequence_form || p.kl_seq_ic;
  p.need_row_pass = p.is_seq || p.rs_seq || p.seq_ratio || p.policy == policy_kind::gmpo ||
                    p.policy == policy_kind::vespo || p.needs_length();
  if (!p.use_policy) {
    p.use_is = p.use_rs = p.removes = p.drops_count = p.is_seq = p.rs_seq = p.rs_token = false;
    p.rs_count = 0;
    p.rs_held = rs_stat::none;
  }
  // An input no term reads is neither loaded nor checked for non-finite values: a caller may pass
  // the rollout's and the reference's log-probs whether or not this objective uses them.
  if (!(p.use_is || p.use_rs || (p.distill_coef != 0.0 && p.student == student_logp::behaviour))) p.has_behav = false;
  if (!p.use_kl) p.has_ref = false;
  return p;
}

//! In-loss tokens and rows of a call (its contribution to the global denominators; sequences
//! that seq_in_denominator leaves out are not counted).
struct local_counts {
  double tokens = 0.0;
  double loss_seqs = 0.0;
  double rows = 0.0;
  double w_sum = 0.0;   //!< w_norm_local: the weights the batch mean averages (is_weighting::batch_normalize)
  double w_count = 0.0; //!< and how many
};

//! Whether count_local computes each row's statistics for a plan, and whether the rows kernel can
//! take them from it instead of computing them again: the statistics do not read the
//! denominators count_local resolves, but read the batch-normalised weights' divisor
//! (w_norm_local) it does.
inline bool counts_from_stats(const objective_plan& p) {
  return p.w_norm_local || p.drops_count || p.nonfinite == nonfinite::mask;
}
inline bool reuses_stats(const objective_plan& p) { return p.need_row_pass && counts_from_stats(p) && !p.w_norm_local; }

//! kept: when not null (reuses_stats), each row's statistics, for the rows kernel.
template <class T>
local_counts count_local(const objective_plan& p, const basic_objective_inputs<T>& in, const host_executor& ex,
                         row_stats* kept = nullptr) {
  const token_layout& L = in.layout;
  const index_t grain = std::max<index_t>(1, 65536 / std::max<index_t>(1, L.max_len()));
  const auto host_row_stats = host_row_stats_kernel<T>();
  return ex.parallel_reduce(
      L.num_seqs(), grain, local_counts{},
      [&](index_t b0, index_t b1) {
        local_counts c;
        host_chunk_data<T> chunk{}; // zeroed: absent inputs and padded slots read as 0 (host_lanes)
        for (index_t b = b0; b < b1; ++b) {
          double len = 0.0;
          const index_t base = L.begin(b);
          const index_t n = L.length(b);
          if (p.w_norm_local) {
            const row_stats st = host_row_stats(p, in, b, chunk);
            const row_consts rc = row_finish(p, st);
            len = rc.len_loss;
            if (p.is_seq) { // one weight per sequence with a valid token, as verl's masked mean of the
                            // row's (equal) token weights: w L / (L + 1e-8)
              c.w_sum += st.len > 0.0 ? rc.w_seq * st.len / (st.len + 1e-8) : 0.0;
              c.w_count += st.len > 0.0 ? 1.0 : 0.0;
            } else {
              c.w_sum += st.sum_w;
              c.w_count += st.len;
            }
          } else if (counts_from_stats(p)) {
            const row_stats st = host_row_stats(p, in, b, chunk);
            if (kept != nullptr) kept[b] = st;
            len = row_finish(p, st).len_loss;
          } else {
            len = static_cast<double>(count_valid(in.mask.size() == 0 ? nullptr : in.mask.data() + base, n));
          }
          if (p.has_den_mask && in.seq_in_denominator[b] == 0) continue; // in the loss, not in N or B
          c.tokens += len;
          c.loss_seqs += len > 0.0 ? 1.0 : 0.0;
          c.rows += 1.0;
        }
        return c;
      },
      [](local_counts& a, const local_counts& b) {
        a.tokens += b.tokens;
        a.loss_seqs += b.loss_seqs;
        a.rows += b.rows;
        a.w_sum += b.w_sum;
        a.w_count += b.w_count;
      });
}

inline void resolve_local(agg_plan& a, const local_counts& c) {
  if (a.tokens < 0.0) a.tokens = c.tokens;
  if (a.seqs < 0.0) a.seqs = a.count_empty_rows ? c.rows : c.loss_seqs;
}

//! The batch-normalisation divisor from this call's own weights (w_norm_local).
inline void resolve_local_weights(objective_plan& p, const local_counts& c) {
  if (!p.w_norm_local) return;
  const double mean = c.w_count > 0.0 ? c.w_sum / c.w_count : 0.0;
  p.w_norm = mean > 1e-8 ? mean : 1.0;
  p.w_norm_local = false;
}

//! Throws for the first valid token with a non-finite input.
template <class T>
[[noreturn]] void raise_nonfinite(const objective_plan& p, const basic_objective_inputs<T>& in, double count) {
  const token_layout& L = in.layout;
  auto bad_value = [](T x) { return !finite(x); };
  for (index_t b = 0; b < L.num_seqs(); ++b) {
    for (index_t t = 0; t < L.length(b); ++t) {
      const index_t i = L.at(b, t);
      if (!mask_valid(in, i)) continue;
      auto report = [&](std::string_view what, T x) {
        RLPT_FAIL(errors::objective::nonfinite,
                  "{}[{}] = {} is not finite at a valid token (sequence {}, position {}); {} valid tokens have a "
                  "non-finite input (set nonfinite = rlpt::nonfinite::mask to leave them out and count them)",
                  what, i, static_cast<double>(x), b, t, count);
      };
      if (in.logp.size() != 0 && bad_value(in.logp[i])) report("logp", in.logp[i]);
      if (p.has_old && bad_value(in.old_logp[i])) report("old_logp", in.old_logp[i]);
      if (p.has_behav && bad_value(in.behav_logp[i])) report("behav_logp", in.behav_logp[i]);
      if (p.has_ref && bad_value(in.ref_logp[i])) report("ref_logp", in.ref_logp[i]);
      if (p.has_adv && bad_value(in.adv[i])) report("adv", in.adv[i]);
      if (p.has_seq_adv && bad_value(in.seq_adv[b])) report("seq_adv", in.seq_adv[b]);
      if (p.has_entropy && bad_value(in.entropy[i])) report("entropy", in.entropy[i]);
      if (p.use_value) {
        if (bad_value(in.values[i])) report("values", in.values[i]);
        if (bad_value(in.returns[i])) report("returns", in.returns[i]);
        if (in.old_values.size() != 0 && bad_value(in.old_values[i])) report("old_values", in.old_values[i]);
      }
      if (p.distill_coef != 0.0)
        for (int k = 0; k < p.teachers; ++k)
          if (bad_value(in.teacher_logp(k, i))) report("teacher_logp", in.teacher_logp(k, i));
    }
  }
  RLPT_FAIL(errors::objective::nonfinite, "{} valid tokens have a non-finite input", count);
}

//! This call's own counts as the sums of its rows give them (every sequence counted).
inline local_counts counts_of(const objective_sums& s) {
  local_counts c;
  c.tokens = s.in_loss;
  c.loss_seqs = s.loss_seqs;
  c.rows = s.rows;
  return c;
}

//! Checks explicit global denominators against this call's own counts: a global count smaller
//! than the local one means the caller's plumbing is wrong (the classic gradient-accumulation bug).
inline void check_global(const agg_plan& a, const local_counts& own, bool used, std::string_view term) {
  if (!used) return;
  if (a.needs_tokens() && a.tokens + 1e-6 < own.tokens)
    RLPT_FAIL(errors::objective::bad_denominator,
              "{} aggregation global_tokens = {} is smaller than the {} tokens in the loss in this call alone; it must "
              "count the tokens of every micro-batch and rank of the step",
              term, a.tokens, own.tokens);
  if (a.needs_seqs()) {
    const double local = a.count_empty_rows ? own.rows : own.loss_seqs;
    if (a.seqs + 1e-6 < local)
      RLPT_FAIL(
          errors::objective::bad_denominator,
          "{} aggregation global_seqs = {} is smaller than the {} sequences in this call alone; it must count the "
          "sequences of every micro-batch and rank of the step",
          term, a.seqs, local);
  }
}

} // namespace detail

//! What this call contributes to the global denominators of `obj` (tokens that stay in the loss,
//! and sequences counted as obj.agg counts them; none of the sequences in.seq_in_denominator leaves
//! out). Sum over the step's micro-batches, all-reduce over the ranks, and pass the total with
//! rlpt::with_denominators.
template <class T>
[[nodiscard]] loss_denominators local_denominators(const objective& obj, const basic_objective_inputs<T>& in,
                                                   const host_executor& ex = {}) {
  const detail::objective_plan p = detail::make_plan(obj, in, basic_objective_grads<T>{});
  const detail::local_counts c = detail::count_local(p, in, ex);
  return {c.tokens, obj.agg.count_empty_rows ? c.rows : c.loss_seqs};
}

//! What this call contributes to the batch mean of is_weighting::batch_normalize: the bounded
//! importance weights' sum and count (over valid tokens, or sequences with a valid token at the
//! sequence levels). Sum both over the step's micro-batches and ranks and pass the total's mean()
//! as is_weighting::batch_mean.
template <class T>
[[nodiscard]] is_weight_sums local_is_weights(const objective& obj, const basic_objective_inputs<T>& in,
                                              const host_executor& ex = {}) {
  detail::objective_plan p = detail::make_plan(obj, in, basic_objective_grads<T>{});
  RLPT_CHECK(p.use_is, errors::objective::bad_option,
             "local_is_weights sums importance weights, but is_weighting.level is none");
  p.w_norm_local = true;
  p.w_norm = 1.0;
  const detail::local_counts c = detail::count_local(p, in, ex);
  return {c.w_sum, c.w_count};
}

//! Evaluates `obj` on host inputs: writes the requested gradients (every token slot) and
//! returns the loss terms and metrics. Throws rlpt::error for a bad configuration, missing or
//! mis-sized inputs, an inconsistent global denominator, or (nonfinite::raise) a
//! non-finite input at a valid token. Multi-threaded over sequences when `ex` has a pool; the
//! result does not depend on the number of threads.
template <class T>
objective_result evaluate(const objective& obj, const basic_objective_inputs<T>& in,
                          const basic_objective_grads<T>& grads = {}, const host_executor& ex = {}) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>, "rlpt::evaluate takes float or double inputs");
  detail::objective_plan p = detail::make_plan(obj, in, grads);
  const token_layout& L = in.layout;
  auto local = [](const detail::agg_plan& a, bool used) {
    return used && ((a.needs_tokens() && a.tokens < 0.0) || (a.needs_seqs() && a.seqs < 0.0));
  };
  const bool local_needed = local(p.agg_policy, p.use_policy) || local(p.agg_kl, p.use_kl) ||
                            local(p.agg_entropy, p.use_entropy || p.has_entropy) || local(p.agg_value, p.use_value);
  // With seq_in_denominator the rows' sums count every sequence, so the explicit global
  // denominators are checked against the counts that leave the marked ones out.
  detail::local_counts own;
  // Where the counts come from the rows' statistics, the rows kernel takes them from here rather
  // than making a pass over each row again (a third of a call with token and sequence rejection).
  const bool counting = local_needed || p.w_norm_local || p.has_den_mask;
  std::vector<detail::row_stats> stats;
  if (counting && detail::reuses_stats(p)) stats.resize(static_cast<std::size_t>(L.num_seqs()));
  detail::row_stats* const kept = stats.empty() ? nullptr : stats.data();
  if (counting) {
    const detail::local_counts c = detail::count_local(p, in, ex, kept);
    own = c;
    detail::resolve_local(p.agg_policy, c);
    detail::resolve_local(p.agg_kl, c);
    detail::resolve_local(p.agg_entropy, c);
    detail::resolve_local(p.agg_value, c);
    detail::resolve_local_weights(p, c);
  }
  const index_t grain = std::max<index_t>(1, 16384 / std::max<index_t>(1, L.max_len()));
  // The gradients are often just allocated: their pages mapped in one call each, not a fault
  // per page among the rows' stores (core/copy.hpp).
  detail::prefault_for_write(grads.logp);
  detail::prefault_for_write(grads.entropy);
  detail::prefault_for_write(grads.values);
  const auto rows = detail::host_rows_kernel<T>();
  const detail::objective_sums s = ex.parallel_reduce(
      L.num_seqs(), grain, detail::objective_sums{},
      [&](index_t b0, index_t b1) { return rows(p, in, grads, kept, b0, b1); },
      [](detail::objective_sums& a, const detail::objective_sums& b) { a.merge(b); });
  if (s.nonfinite > 0.0 && p.nonfinite == nonfinite::raise) detail::raise_nonfinite(p, in, s.nonfinite);
  if (!p.has_den_mask) own = detail::counts_of(s);
  detail::check_global(p.agg_policy, own, p.use_policy, "policy");
  detail::check_global(p.agg_kl, own, p.use_kl, "kl");
  detail::check_global(p.agg_entropy, own, p.use_entropy, "entropy");
  detail::check_global(p.agg_value, own, p.use_value, "value");
  return detail::finish_result(p, s);
}

#if defined(RLPT_COMPILED_LIB)
// Separate compilation: evaluate's host pass (its chunk stages for every instruction set, most of
// a calling TU's compile time) is instantiated once, in rlpt::compiled, for both input types.
#if RLPT_HEADER_IMPL()
#define RLPT_OBJECTIVE_INSTANTIATION template
#else
#define RLPT_OBJECTIVE_INSTANTIATION extern template
#endif
RLPT_OBJECTIVE_INSTANTIATION objective_result evaluate<float>(const objective&, const basic_objective_inputs<float>&,
                                                              const basic_objective_grads<float>&,
                                                              const host_executor&);
RLPT_OBJECTIVE_INSTANTIATION objective_result evaluate<double>(const objective&, const basic_objective_inputs<double>&,
                                                               const basic_objective_grads<double>&,
                                                               const host_executor&);
#undef RLPT_OBJECTIVE_INSTANTIATION
#endif

RLPT_NAMESPACE_END
