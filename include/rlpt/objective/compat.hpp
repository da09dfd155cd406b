// SPDX-License-Identifier: Apache-2.0
//! @file
//! Presets that reproduce each framework's policy loss, value and gradient: verl (0.9.1
//! core_algos + rollout_corr_helper), TRL (1.16 GRPOTrainer._compute_loss, each loss_type),
//! OpenRLHF (0.11.2 PolicyLoss / ValueLoss / compute_approx_kl) and AReaL (ppo_actor_loss_fn).
//! Each takes the framework's own option names and values and returns an rlpt::objective, so
//! a configuration can be copied over verbatim. Denominators the framework takes from its
//! batch (global token / sequence counts) are inputs here too. The config structs own their
//! strings, so a config filled from a parsed file may outlive the file's buffer.
#pragma once

#include <rlpt/config.hpp>
#include <rlpt/core/error.hpp>
#include <rlpt/objective/evaluate.hpp>

#include <optional>
#include <string>
#include <string_view>

RLPT_NAMESPACE_BEGIN
namespace compat {

namespace detail {
[[noreturn]] inline void unknown(std::string_view framework, std::string_view option, std::string_view value,
                                 std::string_view allowed) {
  RLPT_FAIL(errors::objective::compat, "{} {} = \"{}\" is not reproduced by rlpt (supported: {})", framework, option,
            value, allowed);
}

//! Parses a positive double from a verl threshold string piece.
inline double parse_number(std::string_view framework, std::string_view option, std::string_view s) {
  std::string str(s);
  std::size_t used = 0;
  double v = 0.0;
  bool ok = !str.empty();
  if (ok) {
#if RLPT_USE_EXCEPTIONS
    try {
      v = std::stod(str, &used);
    } catch (...) {
      ok = false;
    }
#else
    char* end = nullptr;
    v = std::strtod(str.c_str(), &end);
    used = static_cast<std::size_t>(end - str.c_str());
#endif
  }
  RLPT_CHECK(ok && used == str.size(), errors::objective::compat, "{} {} = \"{}\" is not a number", framework, option,
             s);
  return v;
}
//! Calls f with each comma-separated item of s, spaces around it trimmed, empty items skipped
//! (Python's `[p.strip() for p in s.split(",") if p.strip()]`).
template <class F> void for_each_item(std::string_view s, F f) {
  constexpr std::string_view space = " \t\n\r\f\v";
  while (!s.empty()) {
    const auto comma = s.find(',');
    std::string_view item = s.substr(0, comma);
    s = comma == std::string_view::npos ? std::string_view{} : s.substr(comma + 1);
    const auto b = item.find_first_not_of(space);
    if (b == std::string_view::npos) continue;
    item = item.substr(b, item.find_last_not_of(space) - b + 1);
    f(item);
  }
}
} // namespace detail

// ============================================================================================
namespace verl {

//! verl's aggregation (core_algos.agg_loss): `loss_agg_mode` with the global batch info
//! (dp_size, batch_num_tokens, global_batch_size, loss_scale_factor).
//! Differs on purpose: with every token masked (and no global count), verl divides 0 by 0 and
//! returns NaN; rlpt returns a loss and gradients of 0 (rows without a token weigh nothing).
inline aggregation agg(std::string_view loss_agg_mode = "token-mean", int dp_size = 1,
                       std::optional<double> batch_num_tokens = {}, std::optional<double> global_batch_size = {},
                       std::optional<double> loss_scale_factor = {}) {
  aggregation a;
  a.factor = static_cast<double>(dp_size);
  a.global_tokens = batch_num_tokens;
  a.global_seqs = global_batch_size;
  RLPT_CHECK(dp_size == 1 || loss_agg_mode == "token-sum" ||
                 (loss_agg_mode == "token-mean" ? batch_num_tokens.has_value() : global_batch_size.has_value()),
             errors::objective::compat, "verl agg_loss with dp_size = {} needs the global {} (verl raises too)",
             dp_size, loss_agg_mode == "token-mean" ? "batch_num_tokens" : "global_batch_size");
  if (loss_agg_mode == "token-mean") {
    a.mode = agg_mode::token_mean;
  } else if (loss_agg_mode == "token-sum") {
    a.mode = agg_mode::token_sum;
  } else if (loss_agg_mode == "seq-mean-token-sum") {
    a.mode = agg_mode::seq_mean_token_sum;
  } else if (loss_agg_mode == "seq-mean-token-mean") {
    // verl adds 1e-8 to the per-row token count, but its trainer passes a bool response_mask:
    // the int64 count + 1e-8 becomes a float32 tensor and the 1e-8 rounds away (len_eps = 0).
    a.mode = agg_mode::seq_mean_token_mean;
    a.len_eps = 0.0;
  } else if (loss_agg_mode == "seq-mean-token-sum-norm") {
    a.mode = agg_mode::seq_mean_token_sum_norm;
    RLPT_CHECK(loss_scale_factor.has_value(), errors::objective::compat,
               "verl seq-mean-token-sum-norm: pass loss_scale_factor (verl's fallback, the padded width of each "
               "micro-batch, makes the loss depend on padding)");
    a.norm = *loss_scale_factor;
  } else {
    detail::unknown("verl", "loss_agg_mode", loss_agg_mode,
                    "token-mean, token-sum, seq-mean-token-sum, seq-mean-token-mean, seq-mean-token-sum-norm");
  }
  return a;
}

//! verl's KL loss (kl_penalty + agg_loss): kl_loss_type in k1/kl, abs, k2/mse, k3/low_var_kl, each
//! optionally with the straight-through "+" suffix.
inline kl_penalty kl(std::string_view kl_loss_type = "low_var_kl", double kl_loss_coef = 0.001) {
  kl_penalty k;
  k.coef = kl_loss_coef;
  std::string_view base = kl_loss_type;
  const bool plus = !base.empty() && base.back() == '+';
  if (plus) base.remove_suffix(1);
  k.output_clamp = 0.0;
  if (base == "kl" || base == "k1") {
    k.estimator = kl_estimator::k1;
  } else if (base == "abs") {
    k.estimator = kl_estimator::abs;
  } else if (base == "mse" || base == "k2") {
    k.estimator = kl_estimator::k2;
  } else if (base == "low_var_kl" || base == "k3") {
    k.estimator = kl_estimator::k3;
    k.k3_x_min = -20.0;
    k.k3_x_max = 20.0;
    k.output_clamp = 10.0;
  } else {
    detail::unknown("verl", "kl_loss_type", kl_loss_type, "kl, k1, abs, mse, k2, low_var_kl, k3 (optionally with +)");
  }
  if (plus && k.estimator != kl_estimator::k2) k.gradient = kl_gradient::straight_through;
  return k;
}

//! verl's KL loss in one preset, kl_penalty + agg_loss: `agg_loss(kl_penalty(logp, ref_logp,
//! kl_loss_type), response_mask, loss_agg_mode, global batch info)` as an objective with no policy
//! term. result.kl_loss is verl's `actor/kl_loss` metric and result.loss = kl_loss_coef * kl_loss,
//! the term verl adds to the actor loss (inputs: logp, ref_logp, mask).
inline objective kl_loss(std::string_view kl_loss_type = "low_var_kl", double kl_loss_coef = 0.001,
                         std::string_view loss_agg_mode = "token-mean", int dp_size = 1,
                         std::optional<double> batch_num_tokens = {}, std::optional<double> global_batch_size = {},
                         std::optional<double> loss_scale_factor = {}) {
  objective o;
  o.policy = no_policy{};
  o.kl = kl(kl_loss_type, kl_loss_coef);
  o.agg = agg(loss_agg_mode, dp_size, batch_num_tokens, global_batch_size, loss_scale_factor);
  return o;
}

//! verl's rollout correction (rollout_corr_helper): rollout_is in {"", "token", "sequence"} with
//! rollout_is_threshold "hi" (TIS, upper only) or "lo_hi" (IcePop); rollout_rs up to four
//! comma-separated options of token_k1/k2/k3, seq_sum_k1/k2/k3, seq_mean_k1/k2/k3,
//! seq_max_k2/k3, all of which must pass (reject, then reject_also), with rs_threshold one
//! threshold for all or one per option, comma-separated ("hi", or "lo_hi" for k1). bypass = true
//! takes the ratio against the current policy (bypass_mode; then old_logp = behav_logp). Rejected
//! tokens leave the loss (verl overwrites response_mask). batch_normalize:
//! rollout_is_batch_normalize, the weights divided by their mean; verl takes that mean over the
//! whole training batch, so a call that is one micro-batch of it sets weight.batch_mean from
//! rlpt::local_is_weights (else the mean is the call's own).
inline off_policy_correction rollout_correction(std::string_view rollout_is = "", std::string_view is_threshold = "2.0",
                                                std::string_view rollout_rs = "", std::string_view rs_threshold = "",
                                                bool bypass = false, bool batch_normalize = false) {
  off_policy_correction c;
  c.weight.batch_normalize = batch_normalize && !rollout_is.empty(); // without weights verl ignores it
  c.numerator = bypass ? ratio_numerator::current : ratio_numerator::proximal;
  c.rejected = rejected_tokens::removed;
  c.log_ratio_clamp = 20.0;
  if (!rollout_is.empty()) {
    if (rollout_is == "token")
      c.weight.level = is_level::token;
    else if (rollout_is == "sequence")
      c.weight.level = is_level::seq_product;
    else
      detail::unknown("verl", "rollout_is", rollout_is, "token, sequence");
    const auto us = is_threshold.find('_');
    if (us == std::string_view::npos) {
      c.weight.bound = is_bound::truncate;
      c.weight.lo = 0.0;
      c.weight.hi = detail::parse_number("verl", "rollout_is_threshold", is_threshold);
    } else {
      c.weight.bound = is_bound::mask;
      c.weight.lo = detail::parse_number("verl", "rollout_is_threshold", is_threshold.substr(0, us));
      c.weight.hi = detail::parse_number("verl", "rollout_is_threshold", is_threshold.substr(us + 1));
    }
  }
  if (!rollout_rs.empty()) {
    // Comma-separated options, each once in first-seen order; every one must pass. Thresholds:
    // one shared by every option, or one per (distinct) option in that order.
    constexpr std::string_view allowed = "token_k1/k2/k3, seq_sum_k*, seq_mean_k*, seq_max_k2/k3, comma-separated";
    std::string_view opts[max_rejections];
    int n_opts = 0;
    detail::for_each_item(rollout_rs, [&](std::string_view opt) {
      for (int i = 0; i < n_opts; ++i)
        if (opts[i] == opt) return;
      RLPT_CHECK(n_opts < max_rejections, errors::objective::compat,
                 "verl rollout_rs = \"{}\" has more than {} distinct options; rlpt takes at most {}", rollout_rs,
                 max_rejections, max_rejections);
      opts[n_opts++] = opt;
    });
    if (n_opts == 0) detail::unknown("verl", "rollout_rs", rollout_rs, allowed);
    std::string_view thresholds[max_rejections];
    int n_thresholds = 0;
    detail::for_each_item(rs_threshold, [&](std::string_view t) {
      RLPT_CHECK(n_thresholds < n_opts, errors::objective::compat,
                 "verl rollout_rs_threshold = \"{}\" has more thresholds than rollout_rs = \"{}\" has options ({})",
                 rs_threshold, rollout_rs, n_opts);
      thresholds[n_thresholds++] = t;
    });
    RLPT_CHECK(n_thresholds == 1 || n_thresholds == n_opts, errors::objective::compat,
               "verl rollout_rs_threshold = \"{}\" needs one threshold shared by every option or one per option of "
               "rollout_rs = \"{}\" ({}), as verl",
               rs_threshold, rollout_rs, n_opts);
    for (int i = 0; i < n_opts; ++i) {
      const std::string_view opt = opts[i];
      rejection& r = i == 0 ? c.reject : c.reject_also[static_cast<std::size_t>(i - 1)];
      if (opt.size() < 3 || opt[opt.size() - 2] != 'k' || opt[opt.size() - 3] != '_')
        detail::unknown("verl", "rollout_rs", opt, allowed);
      const char kc = opt.back();
      r.stat = kc == '1' ? rs_stat::k1 : kc == '2' ? rs_stat::k2 : kc == '3' ? rs_stat::k3 : rs_stat::none;
      const std::string_view lvl = opt.substr(0, opt.size() - 3);
      if (lvl == "token")
        r.level = rs_level::token;
      else if (lvl == "seq_sum")
        r.level = rs_level::seq_sum;
      else if (lvl == "seq_mean")
        r.level = rs_level::seq_mean;
      else if (lvl == "seq_max" && r.stat != rs_stat::k1)
        r.level = rs_level::seq_max;
      else
        r.stat = rs_stat::none;
      if (r.stat == rs_stat::none) detail::unknown("verl", "rollout_rs", opt, allowed);
      const std::string_view t = thresholds[n_thresholds == 1 ? 0 : i];
      const auto us = t.find('_');
      if (us == std::string_view::npos) {
        r.hi = detail::parse_number("verl", "rollout_rs_threshold", t);
        r.lo = r.stat == rs_stat::k1 ? 1.0 / r.hi : 0.0;
      } else {
        RLPT_CHECK(r.stat == rs_stat::k1, errors::objective::compat,
                   "verl rollout_rs_threshold \"{}\" for rollout_rs option {} has a lower bound, which only k1 options "
                   "take",
                   t, opt);
        r.lo = detail::parse_number("verl", "rollout_rs_threshold", t.substr(0, us));
        r.hi = detail::parse_number("verl", "rollout_rs_threshold", t.substr(us + 1));
      }
    }
  }
  return c;
}

//! The actor part of verl's config (ActorConfig / PolicyLossConfig) that the loss reads, with
//! ActorConfig's defaults (verl 0.9.1).
struct actor_config {
  std::string loss_mode = "vanilla"; //!< vanilla, gspo, geo_mean, cispo, sapo, dppo_tv, dppo_kl, dro, gpg
  double clip_ratio = 0.2;
  // ActorConfig's defaults are 0.2, not None: setting clip_ratio alone changes no bound in verl.
  // Unset (std::nullopt, verl's None), each bound is clip_ratio.
  std::optional<double> clip_ratio_low = 0.2;
  std::optional<double> clip_ratio_high = 0.2;
  double clip_ratio_c = 3.0;
  double tau_pos = 1.0;
  double tau_neg = 1.05;
  std::optional<double> dro_beta{}; //!< policy_loss.dro_beta: loss_mode dro needs it (> 0; no default)
  std::string loss_agg_mode = "token-mean";
  bool use_kl_loss = false;
  double kl_loss_coef = 0.001;
  std::string kl_loss_type = "low_var_kl";
  double entropy_coeff = 0.0;
  // global_batch_info
  int dp_size = 1;
  std::optional<double> batch_num_tokens{};
  std::optional<double> global_batch_size{};
  std::optional<double> loss_scale_factor{};
};

//! verl's actor loss (workers/utils/losses.ppo_loss): policy_loss_fn(loss_mode) with rollout IS
//! weights, + kl_loss_coef * agg(kl_penalty), - entropy_coeff * agg(entropy), every term with
//! loss_agg_mode except where the kernel forces its own (gspo, sapo: seq-mean-token-mean;
//! geo_mean: mean over all rows).
inline objective actor(const actor_config& c, const off_policy_correction& correction = {}) {
  objective o;
  const double lo = c.clip_ratio_low.value_or(c.clip_ratio);
  const double hi = c.clip_ratio_high.value_or(c.clip_ratio);
  o.agg = agg(c.loss_agg_mode, c.dp_size, c.batch_num_tokens, c.global_batch_size, c.loss_scale_factor);
  if (c.loss_mode == "vanilla") {
    o.policy =
        ppo_clip{.eps_low = lo, .eps_high = hi, .dual_clip = c.clip_ratio_c, .delta = 0.0, .log_ratio_clamp = 20.0};
  } else if (c.loss_mode == "gspo") {
    // verl's registered default aggregation for gspo is its argument; the trainer passes loss_agg_mode.
    o.policy = gspo{.eps_low = lo, .eps_high = hi, .token_level = true, .log_ratio_max = 10.0};
  } else if (c.loss_mode == "sapo") {
    o.policy = sapo{.tau_pos = c.tau_pos, .tau_neg = c.tau_neg, .log_ratio_clamp = 20.0};
    o.policy_agg = agg("seq-mean-token-mean", c.dp_size, c.batch_num_tokens, c.global_batch_size, c.loss_scale_factor);
  } else if (c.loss_mode == "geo_mean") {
    o.policy = gmpo{.eps_low = lo, .eps_high = hi};
    aggregation a;
    a.mode = agg_mode::seq_mean_token_sum;
    a.count_empty_rows = true; // torch.mean over every row
    o.policy_agg = a;
  } else if (c.loss_mode == "cispo") {
    o.policy = cispo{.eps_low = lo, .eps_high = hi, .bounds = cispo_bounds::relative};
  } else if (c.loss_mode == "dppo_tv" || c.loss_mode == "dppo_kl") {
    // clip_ratio_low/high bound the divergence; clip_ratio_c truncates the ratio.
    o.policy = dppo{.divergence = c.loss_mode == "dppo_tv" ? dppo_divergence::tv : dppo_divergence::binary_kl,
                    .eps_low = lo,
                    .eps_high = hi,
                    .trunc = c.clip_ratio_c,
                    .log_ratio_clamp = 20.0};
  } else if (c.loss_mode == "dro") {
    // verl raises ValueError unless dro_beta is set and positive.
    RLPT_CHECK(c.dro_beta.has_value(), errors::objective::compat,
               "verl loss_mode \"dro\" needs policy_loss.dro_beta (> 0; it has no default)");
    RLPT_CHECK(*c.dro_beta > 0.0, errors::objective::compat,
               "verl loss_mode \"dro\" needs policy_loss.dro_beta > 0, got {}", *c.dro_beta);
    o.policy = dro{.beta = *c.dro_beta};
  } else if (c.loss_mode == "gpg") {
    o.policy = policy_gradient{};
  } else {
    detail::unknown("verl", "policy_loss.loss_mode", c.loss_mode,
                    "vanilla, gspo, sapo, geo_mean, cispo, dppo_tv, dppo_kl, dro, gpg");
  }
  o.correction = correction;
  if (c.use_kl_loss) o.kl = kl(c.kl_loss_type, c.kl_loss_coef);
  o.entropy.coef = c.entropy_coeff;
  return o;
}

//! verl's critic loss (compute_value_loss): 0.5 * agg(max((v - R)^2, (clip(v) - R)^2)).
inline objective critic(double cliprange_value = 0.5, std::string_view loss_agg_mode = "token-mean", int dp_size = 1,
                        std::optional<double> batch_num_tokens = {}, std::optional<double> global_batch_size = {}) {
  objective o;
  o.policy = no_policy{};
  o.value = value_loss{.coef = 1.0, .clip = cliprange_value, .half = true};
  o.agg = agg(loss_agg_mode, dp_size, batch_num_tokens, global_batch_size);
  return o;
}

} // namespace verl

// ============================================================================================
namespace trl {

//! The GRPOConfig fields GRPOTrainer._compute_loss reads, with GRPOConfig's defaults (TRL 1.16), plus
//! the batch facts it takes from the trainer (gradient accumulation, processes, the generation
//! batch's token count).
struct grpo_config {
  std::string loss_type = "dapo"; //!< grpo, bnpo, dr_grpo, dapo, luspo, cispo, sapo, vespo
  double epsilon = 0.2;
  std::optional<double> epsilon_high{};
  std::optional<double> delta{};
  std::string importance_sampling_level = "token"; //!< token, sequence
  double beta = 0.0;
  bool use_bias_correction_kl = true; //!< TRL's default: the KL times the importance ratio
  double sapo_temperature_pos = 1.0;
  double sapo_temperature_neg = 1.05;
  double vespo_k_pos = 2.0;
  double vespo_lambda_pos = 3.0;
  double vespo_k_neg = 3.0;
  double vespo_lambda_neg = 2.0;
  double entropy_coef = 0.0;
  int max_completion_length = 512;
  int gradient_accumulation_steps = 1; //!< current_gradient_accumulation_steps (train mode)
  int num_processes = 1;
  std::optional<int> steps_per_generation{}; //!< default: gradient_accumulation_steps
  //! inputs["num_items_in_batch"]: loss-mask tokens of the whole generation batch, all processes
  //! (dapo, cispo). Required for those loss types.
  std::optional<double> num_items_in_batch{};
  //! vLLM importance sampling (applied when use_vllm): mode token_truncate, token_mask,
  //! sequence_truncate, sequence_mask; bounds clip_min (none) and clip_max (3.0).
  bool vllm_importance_sampling_correction = false;
  std::string vllm_importance_sampling_mode = "sequence_mask";
  std::optional<double> vllm_importance_sampling_min{};
  double vllm_importance_sampling_max = 3.0;
};

//! TRL GRPOTrainer._compute_loss as an rlpt objective (train mode). TRL does not clamp
//! log-ratios; rlpt clamps at 80 (identical while |log-ratio| < 80).
inline objective grpo(const grpo_config& c) {
  objective o;
  const double eh = c.epsilon_high.value_or(c.epsilon);
  const double ga = static_cast<double>(c.gradient_accumulation_steps);
  RLPT_CHECK(ga >= 1.0 && c.num_processes >= 1, errors::objective::compat,
             "trl gradient_accumulation_steps = {} and num_processes = {} must be >= 1", c.gradient_accumulation_steps,
             c.num_processes);
  const bool seq = c.importance_sampling_level == "sequence";
  if (!seq && c.importance_sampling_level != "token")
    detail::unknown("trl", "importance_sampling_level", c.importance_sampling_level, "token, sequence");
  const std::string_view lt = c.loss_type;
  if (lt == "grpo" || lt == "bnpo" || lt == "dr_grpo" || lt == "dapo" || lt == "luspo") {
    if (seq)
      o.policy = gspo{.eps_low = c.epsilon,
                      .eps_high = eh,
                      .token_level = false,
                      .log_ratio_max = 80.0,
                      .dual_clip = 0.0,
                      .delta = c.delta.value_or(0.0)};
    else
      o.policy = ppo_clip{.eps_low = c.epsilon,
                          .eps_high = eh,
                          .dual_clip = 0.0,
                          .delta = c.delta.value_or(0.0),
                          .log_ratio_clamp = 80.0};
  } else if (lt == "cispo") {
    o.policy = cispo{.bounds = cispo_bounds::absolute, .cap = eh, .log_ratio_clamp = 80.0, .token_level = !seq};
  } else if (lt == "sapo") {
    o.policy = sapo{.tau_pos = c.sapo_temperature_pos,
                    .tau_neg = c.sapo_temperature_neg,
                    .log_ratio_clamp = 80.0,
                    .token_level = !seq};
  } else if (lt == "vespo") {
    // VESPO forms its own sequence weight from the token log-ratios at either level; at sequence
    // level TRL's coef_1 reaches only the bias-corrected KL (kl.importance_per_sequence, below).
    // VESPO folds TRL's vLLM importance ratio into its sequence weight instead of weighting the
    // loss with it, and TRL refuses the sequence modes for it.
    const std::string_view m = c.vllm_importance_sampling_mode;
    RLPT_CHECK(!c.vllm_importance_sampling_correction || m == "token_truncate" || m == "token_mask",
               errors::objective::compat,
               "trl loss_type = \"vespo\" needs vllm_importance_sampling_mode token_truncate or token_mask, got "
               "\"{}\" (TRL raises too)",
               m);
    o.policy = vespo{.k_pos = c.vespo_k_pos,
                     .lambda_pos = c.vespo_lambda_pos,
                     .k_neg = c.vespo_k_neg,
                     .lambda_neg = c.vespo_lambda_neg,
                     .fold_is_weight = c.vllm_importance_sampling_correction};
  } else {
    detail::unknown("trl", "loss_type", lt, "grpo, bnpo, dr_grpo, dapo, luspo, sapo, cispo, vespo");
  }
  aggregation a;
  a.factor = 1.0 / ga;
  if (lt == "grpo" || lt == "sapo") {
    a.mode = agg_mode::seq_mean_token_mean;
    a.count_empty_rows = true; // .mean() over every row, each divided by max(L_i, 1)
  } else if (lt == "luspo") {
    a.mode = agg_mode::seq_mean_token_sum; // (per_token_loss * mask).sum(-1).mean()
    a.count_empty_rows = true;
  } else if (lt == "bnpo") {
    a.mode = agg_mode::token_mean;
  } else if (lt == "dr_grpo") {
    a.mode = agg_mode::seq_mean_token_sum_norm;
    a.count_empty_rows = true; // per_token_loss.size(0)
    a.norm = static_cast<double>(c.max_completion_length);
  } else { // dapo, cispo: sum / (num_items_in_batch / num_processes * GA / steps_per_generation)
    RLPT_CHECK(c.num_items_in_batch.has_value(), errors::objective::compat,
               "trl loss_type = \"{}\" normalises by num_items_in_batch (the generation batch's tokens on all "
               "processes); pass it",
               lt);
    const double spg = static_cast<double>(c.steps_per_generation.value_or(c.gradient_accumulation_steps));
    a.mode = agg_mode::token_mean;
    a.global_tokens = std::max(*c.num_items_in_batch, 1.0) * ga / spg;
    a.factor = static_cast<double>(c.num_processes);
  }
  o.agg = a;
  if (c.beta != 0.0) {
    o.kl = kl_penalty{.coef = c.beta,
                      .estimator = kl_estimator::k3,
                      .k3_x_min = -80.0,
                      .k3_x_max = 80.0,
                      .output_clamp = 0.0,
                      .importance_corrected = c.use_bias_correction_kl,
                      // at sequence level TRL's coef_1, which multiplies the KL, is the sequence ratio
                      .importance_per_sequence = c.use_bias_correction_kl && seq};
  }
  if (c.entropy_coef != 0.0) {
    o.entropy.coef = c.entropy_coef;
    aggregation e; // mean over the effective mask of this micro-batch, / GA
    e.mode = agg_mode::token_mean;
    e.factor = 1.0 / ga;
    o.entropy_agg = e;
  }
  if (c.vllm_importance_sampling_correction) {
    const std::string_view m = c.vllm_importance_sampling_mode;
    off_policy_correction& k = o.correction;
    k.numerator = ratio_numerator::proximal;
    k.rejected = rejected_tokens::zero_weight;
    k.log_ratio_clamp = 80.0;
    if (m == "token_truncate" || m == "token_mask")
      k.weight.level = is_level::token;
    else if (m == "sequence_truncate" || m == "sequence_mask")
      k.weight.level = is_level::seq_product;
    else
      detail::unknown("trl", "vllm_importance_sampling_mode", m,
                      "token_truncate, token_mask, sequence_truncate, sequence_mask");
    k.weight.bound = (m == "token_mask" || m == "sequence_mask") ? is_bound::mask : is_bound::truncate;
    k.weight.lo = c.vllm_importance_sampling_min.value_or(0.0);
    k.weight.hi = c.vllm_importance_sampling_max;
  }
  return o;
}

//! The RLOOConfig fields RLOOTrainer._compute_loss reads (TRL 1.16; its KL is in the rewards).
struct rloo_config {
  double epsilon = 0.2;
  std::optional<double> epsilon_high{};
};

//! TRL RLOOTrainer._compute_loss: the PPO clip on each sequence's likelihood ratio
//! exp(sum_t logp - old), -min(r A, clip(r) A), averaged over the micro-batch's rows. The loss is
//! unscaled, as TRL's (the Trainer divides by gradient accumulation). A row with no completion
//! token (mask_truncated_completions) has no gradient on either side; TRL's loss counts it as -A
//! (its ratio is exp(0)), rlpt's as 0, both dividing by every row. TRL does not clamp the log-ratio;
//! rlpt clamps it at 80.
inline objective rloo(const rloo_config& c) {
  objective o;
  o.policy = gspo{.eps_low = c.epsilon,
                  .eps_high = c.epsilon_high.value_or(c.epsilon),
                  .token_level = false,
                  .log_ratio_max = 80.0,
                  .dual_clip = 0.0,
                  .delta = 0.0,
                  .length_normalized = false};
  // every token of a row carries the row's loss: the mean of the rows' token means is the rows' mean
  o.agg.mode = agg_mode::seq_mean_token_mean;
  o.agg.count_empty_rows = true;
  return o;
}

} // namespace trl

// ============================================================================================
namespace openrlhf {

//! PolicyLoss(...) constructor arguments and forward()'s batch info, plus the actor's KL and
//! entropy settings.
struct policy_loss_config {
  double clip_eps_low = 0.2;
  double clip_eps_high = 0.2;
  std::optional<double> dual_clip{};
  bool token_level_loss = true;
  std::string policy_loss_type = "ppo";       //!< ppo, gspo
  std::string is_correction_level = "off";    //!< off, token, seq
  std::string is_correction_mode = "mask";    //!< mask, clip
  std::string is_correction_gating = "ratio"; //!< ratio, binary_kl, tv
  double is_correction_low = 0.5;
  double is_correction_high = 5.0;
  int dp_size = 1;
  std::optional<double> batch_num_tokens{};
  std::optional<double> global_batch_size{};
  double kl_coef = 0.0;            //!< actor KL loss coefficient (kl_ctl) when use_kl_loss
  std::string kl_estimator = "k1"; //!< k1, k2, k3
  bool kl_unbiased_gradient = false;
  double entropy_coef = 0.0;
};

inline aggregation agg(bool token_level_loss, int dp_size = 1, std::optional<double> batch_num_tokens = {},
                       std::optional<double> global_batch_size = {}) {
  aggregation a;
  if (token_level_loss) {
    a.mode = agg_mode::token_mean;
    if (batch_num_tokens) {
      a.global_tokens = batch_num_tokens;
      a.factor = static_cast<double>(dp_size);
    }
  } else {
    a.mode = agg_mode::seq_mean_token_mean;
    a.len_eps = 1e-8;
    if (global_batch_size) {
      a.global_seqs = global_batch_size;
      a.factor = static_cast<double>(dp_size);
    }
  }
  return a;
}

//! OpenRLHF compute_approx_kl as a loss term: every estimator's value clamped to [-10, 10],
//! k3's log-ratio clamped below at -10; unbiased_gradient keeps the value and differentiates
//! sg(min(exp(logp - old), 10)) * k2.
inline kl_penalty kl(std::string_view estimator = "k1", double coef = 0.0, bool unbiased_gradient = false) {
  kl_penalty k;
  k.coef = coef;
  if (estimator == "k1")
    k.estimator = kl_estimator::k1;
  else if (estimator == "k2")
    k.estimator = kl_estimator::k2;
  else if (estimator == "k3")
    k.estimator = kl_estimator::k3;
  else
    detail::unknown("openrlhf", "kl_estimator", estimator, "k1, k2, k3");
  k.k3_x_min = -10.0;
  k.k3_x_max = 80.0;
  k.output_clamp = 10.0;
  k.gradient = unbiased_gradient ? kl_gradient::k2_importance : kl_gradient::natural;
  k.is_cap = 10.0;
  return k;
}

//! OpenRLHF PolicyLoss (+ its actor's KL loss and entropy bonus). Differs on purpose: with every
//! token masked, PolicyLoss's masked mean divides 0 by 0 and returns NaN; rlpt returns a loss and
//! gradients of 0 (rows without a token weigh nothing).
inline objective policy_loss(const policy_loss_config& c) {
  objective o;
  const bool gspo_type = c.policy_loss_type == "gspo";
  if (c.policy_loss_type == "ppo") {
    o.policy = ppo_clip{.eps_low = c.clip_eps_low,
                        .eps_high = c.clip_eps_high,
                        .dual_clip = c.dual_clip.value_or(0.0),
                        .delta = 0.0,
                        .log_ratio_clamp = 20.0};
  } else if (gspo_type) {
    RLPT_CHECK(c.is_correction_level == "off", errors::objective::compat,
               "openrlhf gspo with is_correction_level = \"{}\" takes its ratio against the rollout log-probs; pass "
               "behav_logp as old_logp with is_correction_level = \"off\" instead",
               c.is_correction_level);
    o.policy = gspo{.eps_low = c.clip_eps_low,
                    .eps_high = c.clip_eps_high,
                    .token_level = false,
                    .log_ratio_max = 80.0,
                    .dual_clip = c.dual_clip.value_or(0.0)};
  } else {
    detail::unknown("openrlhf", "policy_loss_type", c.policy_loss_type, "ppo, gspo");
  }
  o.agg = agg(c.token_level_loss && !gspo_type, c.dp_size, c.batch_num_tokens, c.global_batch_size);
  if (c.is_correction_level != "off") {
    off_policy_correction& k = o.correction;
    k.numerator = ratio_numerator::proximal;
    k.rejected = rejected_tokens::zero_weight;
    k.log_ratio_clamp = 80.0;
    const bool seq = c.is_correction_level == "seq";
    if (!seq && c.is_correction_level != "token")
      detail::unknown("openrlhf", "is_correction_level", c.is_correction_level, "off, token, seq");
    const std::string_view gating = c.is_correction_gating;
    if (gating != "ratio" && gating != "binary_kl" && gating != "tv")
      detail::unknown("openrlhf", "is_correction_gating", gating, "ratio, binary_kl, tv");
    if (gating != "ratio") {
      // A divergence gate: survivors keep their raw token ratio, the others weigh 0. OpenRLHF takes
      // an upper bound only and drops nothing from the denominators.
      RLPT_CHECK(c.is_correction_mode == "mask", errors::objective::compat,
                 "openrlhf is_correction_gating = {} needs is_correction_mode = mask", gating);
      RLPT_CHECK(c.is_correction_low <= 0.0, errors::objective::compat,
                 "openrlhf is_correction_gating = {} takes an upper bound only, got is_correction_low = {}", gating,
                 c.is_correction_low);
      k.weight = {.level = is_level::token, .bound = is_bound::none};
      k.reject = {.stat = gating == "tv" ? rs_stat::tv : rs_stat::binary_kl,
                  .level = seq ? rs_level::seq_mean : rs_level::token,
                  .hi = c.is_correction_high};
    } else if (c.is_correction_mode == "clip") {
      RLPT_CHECK(!seq, errors::objective::compat,
                 "openrlhf is_correction_mode = clip needs is_correction_level = token");
      k.weight = {
          .level = is_level::token, .bound = is_bound::truncate, .lo = c.is_correction_low, .hi = c.is_correction_high};
    } else if (c.is_correction_mode == "mask") {
      if (seq) {
        // seq-mask-tis: gate on the geometric-mean ratio, weight survivors by their token ratio.
        k.weight = {.level = is_level::token, .bound = is_bound::none};
        k.reject = {
            .stat = rs_stat::ratio, .level = rs_level::seq_mean, .lo = c.is_correction_low, .hi = c.is_correction_high};
      } else {
        k.weight = {
            .level = is_level::token, .bound = is_bound::mask, .lo = c.is_correction_low, .hi = c.is_correction_high};
      }
    } else {
      detail::unknown("openrlhf", "is_correction_mode", c.is_correction_mode, "mask, clip");
    }
  }
  if (c.kl_coef != 0.0) o.kl = kl(c.kl_estimator, c.kl_coef, c.kl_unbiased_gradient);
  o.entropy.coef = c.entropy_coef;
  return o;
}

//! OpenRLHF ValueLoss(clip_eps): 0.5 * aggregate_loss(max(...)); clip_eps unset (the constructor's
//! default, None) = plain square. OpenRLHF's trainer passes --critic.value_clip (default 0.5).
inline objective value(std::optional<double> clip_eps = std::nullopt, bool token_level_loss = true, int dp_size = 1,
                       std::optional<double> batch_num_tokens = {}, std::optional<double> global_batch_size = {}) {
  objective o;
  o.policy = no_policy{};
  o.value = value_loss{.coef = 1.0, .clip = clip_eps.value_or(0.0), .half = true};
  o.agg = agg(token_level_loss, dp_size, batch_num_tokens, global_batch_size);
  return o;
}

} // namespace openrlhf

// ============================================================================================
namespace areal {

//! PPOActorConfig fields ppo_actor_loss_fn reads, with PPOActorConfig's defaults (AReaL 1.0.4:
//! no decoupled loss, rejection_sampling None). `rejection_*` mirror RejectionSamplingConfig (its
//! defaults when `rejection_sampling` is true), checked as its __post_init__ does. Loss =
//! sum m' L / count_nonzero(m) with the pre-rejection count, the micro-batches combined
//! token-weighted: pass the step's token count as global_tokens.
struct actor_config {
  double eps_clip = 0.2;
  std::optional<double> eps_clip_higher{};
  std::optional<double> c_clip{};
  bool use_decoupled_loss = false;
  bool rejection_sampling = false;        //!< false: the field is None (no weight, no rejection)
  std::string rejection_level = "token";  //!< token, sequence
  std::string rejection_action = "mask";  //!< mask, clamp (ratio only)
  std::string rejection_metric = "ratio"; //!< ratio, kl_k1, kl_k2, kl_k3
  std::string rejection_agg = "mean";     //!< sum, mean, max (sequence level; ignored at token level)
  double rejection_upper = 5.0;
  std::optional<double> rejection_lower{};
  std::string importance_sampling_level = "token"; //!< token, sequence (GSPO)
  bool use_sapo_loss = false;
  double sapo_tau_pos = 1.0;
  double sapo_tau_neg = 1.05;
  std::optional<double> global_tokens{};
};

//! AReaL's rejection sampling (apply_rejection_sampling) as a correction: the one actor() uses when
//! rejection_sampling is set (and SAPO is not). Token weights are pi_prox / pi_behave, or at
//! sequence level with the ratio metric their geometric mean; the metric is the ratio (a
//! sequence's aggregated in log space: its product, geometric mean or largest ratio) or AReaL's KL
//! estimators of log r = prox - behave (k1 = log r, k2 = (log r)^2 / 2, k3 = exp(-log r) - 1 +
//! log r), a sequence's summed, averaged or maximal.
inline off_policy_correction rejection_sampling(const actor_config& c) {
  off_policy_correction k;
  k.numerator = ratio_numerator::proximal;
  // The updated loss_mask drives every term (GSPO's sequence means too); the denominator is the
  // pre-rejection token count.
  k.rejected = rejected_tokens::masked;
  k.log_ratio_clamp = 80.0;
  const bool seq = c.rejection_level == "sequence";
  if (!seq && c.rejection_level != "token")
    detail::unknown("areal", "rejection_sampling.level", c.rejection_level, "token, sequence");
  const bool clamp = c.rejection_action == "clamp";
  if (!clamp && c.rejection_action != "mask")
    detail::unknown("areal", "rejection_sampling.action", c.rejection_action, "mask, clamp");
  const std::string& m = c.rejection_metric;
  if (m != "ratio" && m != "kl_k1" && m != "kl_k2" && m != "kl_k3")
    detail::unknown("areal", "rejection_sampling.metric", m, "ratio, kl_k1, kl_k2, kl_k3");
  const std::string& a = c.rejection_agg;
  if (a != "sum" && a != "mean" && a != "max") detail::unknown("areal", "rejection_sampling.agg", a, "sum, mean, max");
  const double hi = c.rejection_upper;
  const std::optional<double>& lower = c.rejection_lower;
  // RejectionSamplingConfig.__post_init__'s checks, in its order.
  RLPT_CHECK(!lower || *lower <= hi, errors::objective::compat,
             "areal rejection_sampling.lower = {} cannot be greater than upper = {}", lower.value_or(0.0), hi);
  if (m == "ratio") {
    RLPT_CHECK(hi > 1.0, errors::objective::compat,
               "areal rejection_sampling.upper = {} must be > 1.0 for metric = ratio", hi);
    RLPT_CHECK(!lower || *lower > 0.0, errors::objective::compat,
               "areal rejection_sampling.lower = {} must be positive for metric = ratio", lower.value_or(0.0));
  }
  if (m == "kl_k2" || m == "kl_k3")
    RLPT_CHECK(hi > 0.0, errors::objective::compat,
               "areal rejection_sampling.upper = {} must be positive for metric = {}", hi, m);
  RLPT_CHECK(!clamp || m == "ratio", errors::objective::compat,
             "areal rejection_sampling.action = clamp supports only metric = ratio, got metric = {}", m);

  const rs_level level = !seq         ? rs_level::token
                         : a == "sum" ? rs_level::seq_sum
                         : a == "max" ? rs_level::seq_max
                                      : rs_level::seq_mean;
  const bool geo = seq && m == "ratio"; // the weight too is the sequence's geometric mean
  k.weight = {.level = geo ? is_level::seq_geomean : is_level::token, .bound = is_bound::none};
  if (clamp) {
    k.weight.bound = is_bound::truncate;
    k.weight.lo = lower.value_or(0.0);
    k.weight.hi = hi;
    // Per token, and per sequence on the mean, the weight is out of bounds exactly where it is
    // clamped. On the sum or the max, AReaL clamps the geometric-mean weight of the sequences whose
    // aggregate is out of bounds: the criterion chooses which weights are bounded.
    if (seq && a != "mean") {
      k.reject = {.stat = rs_stat::ratio, .level = level, .lo = lower.value_or(0.0), .hi = hi};
      k.action = rejection_action::bound_weight;
    }
  } else if (m == "ratio") {
    k.reject = {.stat = rs_stat::ratio, .level = level, .lo = lower.value_or(0.0), .hi = hi};
  } else if (m == "kl_k1") {
    k.reject = {.stat = rs_stat::log_ratio,
                .level = level,
                .lo = lower.value_or(-std::numeric_limits<double>::infinity()),
                .hi = hi};
  } else {
    // k2 and k3 are >= 0: a lower bound <= 0 keeps every k2 (its float value is a square), but
    // k3 can round a few ulp below 0, which AReaL's lower = 0 would reject and rlpt's none not.
    RLPT_CHECK(!lower || *lower > 0.0 || m == "kl_k2", errors::objective::compat,
               "areal rejection_sampling.lower = {} with metric = kl_k3 is not reproduced by rlpt: k3 >= 0, so a lower "
               "bound <= 0 rejects only values that rounding took below it; leave lower unset or make it positive",
               lower.value_or(0.0));
    k.reject = {.stat = m == "kl_k2" ? rs_stat::k2 : rs_stat::k3_inverse,
                .level = level,
                .lo = lower.value_or(0.0) > 0.0 ? *lower : 0.0,
                .hi = hi};
  }
  return k;
}

inline objective actor(const actor_config& c) {
  objective o;
  const double eh = c.eps_clip_higher.value_or(c.eps_clip);
  if (c.use_sapo_loss) {
    RLPT_CHECK(!c.use_decoupled_loss, errors::objective::compat,
               "areal use_sapo_loss requires use_decoupled_loss = false");
    const bool seq = c.importance_sampling_level == "sequence";
    if (!seq && c.importance_sampling_level != "token")
      detail::unknown("areal", "importance_sampling_level", c.importance_sampling_level, "token, sequence");
    o.policy = sapo{.tau_pos = c.sapo_tau_pos,
                    .tau_neg = c.sapo_tau_neg,
                    .log_ratio_clamp = 80.0,
                    .token_level = !seq,
                    .mean_advantage = seq}; // sapo_loss_fn averages the advantages in sequence mode only
  } else if (c.importance_sampling_level == "sequence") {
    o.policy = gspo{.eps_low = c.eps_clip,
                    .eps_high = eh,
                    .token_level = false,
                    .log_ratio_max = 80.0,
                    .dual_clip = c.c_clip.value_or(0.0),
                    .mean_advantage = true};
  } else if (c.importance_sampling_level == "token") {
    o.policy = ppo_clip{.eps_low = c.eps_clip,
                        .eps_high = eh,
                        .dual_clip = c.c_clip.value_or(0.0),
                        .delta = 0.0,
                        .log_ratio_clamp = 80.0};
  } else {
    detail::unknown("areal", "importance_sampling_level", c.importance_sampling_level, "token, sequence");
  }
  o.agg = aggregation{.mode = agg_mode::token_mean, .global_tokens = c.global_tokens};
  // ppo_actor_loss_fn filters whenever rejection_sampling is set, use_decoupled_loss or not;
  // without the decoupled loss AReaL's trainer passes the same log-probs as proximal and behaviour
  // (pass behav_logp = old_logp), so the weights are 1. sapo_loss_fn takes no rejection.
  if (c.rejection_sampling && !c.use_sapo_loss) o.correction = rejection_sampling(c);
  return o;
}

} // namespace areal
} // namespace compat
RLPT_NAMESPACE_END
