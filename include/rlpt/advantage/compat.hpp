// SPDX-License-Identifier: Apache-2.0
//! @file
//! Presets that reproduce each framework's advantage conventions exactly: epsilons, std
//! flavour, single-sample groups, mask semantics and whitening. Each returns a plain options
//! struct, so a preset can be adjusted with ordinary member assignment.
//!
//! Parameters take each framework's own spelling of its option: verl's and OpenRLHF's booleans
//! and numbers, TRL's and AReaL's strings (an unknown string raises rlpt.advantage.bad_option
//! naming the allowed values).
//!
//! Where a peer silently produces NaN (OpenRLHF's group of one, NaN rewards anywhere but TRL) the
//! preset raises instead; docs/advantage.md lists every difference. Versions read: verl 0.9.1,
//! TRL 1.16.0, OpenRLHF 0.11.2, AReaL (2026-05 snapshot), slime (2026 snapshot).
#pragma once

#include <rlpt/config.hpp>
#include <rlpt/advantage/common.hpp>
#include <rlpt/advantage/gae.hpp>
#include <rlpt/advantage/gigpo.hpp>
#include <rlpt/advantage/grpo.hpp>
#include <rlpt/advantage/multi_reward.hpp>
#include <rlpt/advantage/opo.hpp>
#include <rlpt/advantage/reinforce.hpp>
#include <rlpt/advantage/remax.hpp>
#include <rlpt/advantage/rloo.hpp>
#include <rlpt/advantage/shaping.hpp>
#include <rlpt/advantage/whiten.hpp>

#include <algorithm>
#include <cmath>
#include <string>
#include <string_view>
#include <vector>

RLPT_NAMESPACE_BEGIN
namespace compat {

namespace detail {
//! A framework's std-scaling option spelled as that framework spells it, as an rlpt::scale.
inline scale parse_scale(std::string_view framework, std::string_view option, std::string_view value) {
  if (value == "group") return scale::group_std;
  if (value == "batch") return scale::batch_std;
  if (value == "none") return scale::none;
  RLPT_FAIL(errors::advantage::bad_option, "{} {} = \"{}\" is not reproduced by rlpt (supported: group, batch, none)",
            framework, option, value);
}
} // namespace detail

namespace verl {

//! verl_F.masked_whiten: unbiased, rsqrt(var + 1e-8), raises below 2 valid tokens.
inline whiten_options whiten() { return {}; }

//! compute_grpo_outcome_advantage (and grpo_vectorized, the same numbers in 0.9.1):
//! (R - mean) / (std_unbiased + 1e-6); a group of one gets mean 0, std 1; Dr. GRPO when
//! norm_adv_by_std_in_grpo is false.
inline grpo_options grpo(bool norm_adv_by_std_in_grpo = true) {
  return {.scale = norm_adv_by_std_in_grpo ? scale::group_std : scale::none, .epsilon = 1e-6, .single = single::raw};
}
//! Dr. GRPO (norm_adv_by_std_in_grpo=False): R - mean.
inline grpo_options dr_grpo() { return grpo(false); }

//! compute_rloo_outcome_advantage: a group of one keeps its reward.
inline rloo_options rloo() { return {.single = single::raw}; }
//! compute_rloo_vectorized_outcome_advantage: a group of one gets 0.
inline rloo_options rloo_vectorized() { return {.single = single::zero}; }

//! compute_opo_outcome_advantage: length-weighted baseline, 0 for a group of one.
inline opo_options opo() { return {.single = single::raw}; }

//! compute_gpg_outcome_advantage: f_norm 1, mean 0 for a group of one.
inline gpg_options gpg() { return {.f_norm = 1.0, .single = single::raw}; }

//! compute_grpo_passk_outcome_advantage: raises for a group of one.
inline passk_options grpo_passk(bool norm_adv_by_std_in_grpo = true) {
  return {.scale_by_std = norm_adv_by_std_in_grpo, .epsilon = 1e-6, .single = single::raise};
}

//! compute_gae_advantage_return: skip masked tokens, V after the end 0, then masked_whiten.
inline gae_options gae(double gamma = 1.0, double lam = 1.0) {
  return {.gamma = gamma, .lambda = lam, .masked = mask_mode::skip, .whiten = whiten()};
}

//! compute_reinforce_plus_plus_outcome_advantage (0.9.1: the return skips masked tokens).
inline reinforce_pp_options reinforce_pp(double gamma = 1.0) {
  return {.gamma = gamma, .masked = mask_mode::skip, .whiten = whiten()};
}

//! compute_reinforce_plus_plus_baseline_outcome_advantage: mean 0 for a group of one.
inline reinforce_baseline_options reinforce_pp_baseline() { return {.single = single::raw, .whiten = whiten()}; }

//! compute_remax_outcome_advantage.
inline remax_options remax() { return {}; }

//! compute_gdpo_outcome_advantage: per-channel verl GRPO, weighted sum, no per-sequence batch
//! normalisation; then broadcast_to_tokens and whiten(verl::whiten()) over the tokens.
inline gdpo_options gdpo() { return {.channel = grpo(), .batch_normalize = false}; }

//! DAPO reward manager overlong_buffer: linear penalty, not capped.
inline overlong_options overlong(index_t max_resp_len, index_t buffer_len, double penalty_factor = 1.0) {
  return {.max_len = max_resp_len, .buffer_len = buffer_len, .factor = penalty_factor, .cap = false};
}

} // namespace verl

namespace trl {

//! GRPOTrainer, multi_objective_aggregation="sum_then_normalize": scale_rewards "group"
//! (default), "batch" (group mean, batch std) or "none"; std + 1e-4; unscorable (NaN) rewards
//! are left out of the statistics and get advantage 0; a group with one scorable sample gets 0.
inline grpo_options grpo(std::string_view scale_rewards = "group") {
  return {.scale = detail::parse_scale("trl", "scale_rewards", scale_rewards),
          .epsilon = 1e-4,
          .single = single::zero,
          .on_nonfinite = nonfinite::mask};
}

//! RLOOTrainer: leave-one-out over scorable siblings (a lone scorable sample gets 0), optional
//! normalize_advantages over the batch with std + 1e-4.
inline rloo_options rloo(bool normalize_advantages = false) {
  return {.single = single::zero,
          .on_nonfinite = nonfinite::mask,
          .batch_normalize = normalize_advantages,
          .batch_epsilon = 1e-4};
}

//! multi_objective_aggregation="normalize_then_sum".
inline gdpo_options gdpo() { return {}; }

//! Reward functions returning None are NaN; nansum across channels (all-NaN = unscorable).
inline channel_options channels() { return {.on_nonfinite = nonfinite::mask}; }

//! trl.rewards.get_soft_overlong_punishment(max_completion_len, soft_punish_cache): capped at -1.
inline overlong_options soft_overlong(index_t max_completion_len, index_t soft_punish_cache) {
  return {.max_len = max_completion_len, .buffer_len = soft_punish_cache, .factor = 1.0, .cap = true};
}

} // namespace trl

namespace openrlhf {

//! Token whitening in compute_advantages_and_returns: biased variance, rsqrt(max(var, 1e-8));
//! no_std_norm centres only.
inline whiten_options whiten(bool no_std_norm = false) {
  return {.unbiased = false,
          .eps = 1e-8,
          .eps_at = eps_mode::floor_var,
          .scale = !no_std_norm,
          .on_too_few = too_few::unit_std};
}

//! advantage.estimator=group_norm: (R - mean) / (std_unbiased + 1e-9). OpenRLHF gives NaN for a
//! group of one (torch.std of one value); rlpt raises.
inline grpo_options group_norm() { return {.epsilon = 1e-9, .single = single::raise}; }

//! advantage.estimator=dr_grpo: R - mean (a group of one gets 0).
inline grpo_options dr_grpo() { return {.scale = scale::none, .single = single::zero}; }

//! advantage.estimator=rloo: OpenRLHF divides by n - 1 = 0 for a group of one; rlpt raises.
inline rloo_options rloo() { return {.single = single::raise}; }

//! advantage.estimator=reinforce_baseline: R - mean (0 for a group of one), whitened over tokens.
inline reinforce_baseline_options reinforce_baseline() { return {.single = single::zero, .whiten = whiten()}; }

//! advantage.estimator=reinforce: discounted return over r * mask (masked tokens still
//! discount), whitened over tokens.
inline reinforce_pp_options reinforce(double gamma = 1.0) {
  return {.gamma = gamma, .masked = mask_mode::zero, .whiten = whiten()};
}

//! advantage.estimator=gae: values and rewards zeroed at masked tokens, the recurrence runs
//! through them, V after the end 0; then token whitening.
inline gae_options gae(double gamma = 1.0, double lambd = 0.95) {
  return {.gamma = gamma, .lambda = lambd, .masked = mask_mode::zero, .whiten = whiten()};
}

//! reward.overlong_buffer_len / overlong_penalty_factor: excess capped at the buffer.
inline overlong_options overlong(index_t max_new_tokens, index_t overlong_buffer_len, double penalty_factor = 1.0) {
  return {.max_len = max_new_tokens, .buffer_len = overlong_buffer_len, .factor = penalty_factor, .cap = true};
}

//! reward.stop_properly_penalty_coef (ProRL): scale in [0, 1], or set when negative.
inline truncation_options stop_properly(double coef) {
  return {.action = coef < 0.0 ? truncation::set_reward : truncation::scale_reward, .value = coef};
}

//! reward.clip_range (default (-10, 10)), applied to the baseline-subtracted reward.
inline reward_transform clip(double low = -10.0, double high = 10.0) { return {.clip_low = low, .clip_high = high}; }

} // namespace openrlhf

namespace areal {

//! Normalization(mean_level=group, std_level=group) on scalar rewards (reward_norm): unbiased,
//! (R - mean) / (std + 1e-5); a group of one gets 0 (its own mean, std 1). std_level "group",
//! "batch" or "none" (AReaL's None).
inline grpo_options reward_norm(std::string_view std_level = "group") {
  const scale s = detail::parse_scale("areal", "reward_norm.std_level", std_level);
  return {.scale = s, .epsilon = s == scale::none ? 0.0 : 1e-5, .single = single::zero};
}

//! Normalization(batch, batch) on token advantages (adv_norm): unbiased, / (std + 1e-5),
//! std 1 with fewer than 2 tokens.
inline whiten_options adv_norm() {
  return {.unbiased = true, .eps = 1e-5, .eps_at = eps_mode::add_std, .on_too_few = too_few::unit_std};
}

//! GAE with verl-style skipping (discount, gae_lambda default 1); pass bootstrap values for
//! sequences without EOS in gae_inputs::bootstrap. Whitening is adv_norm when configured: pass
//! with_adv_norm = true for an `adv_norm` block (PPOActorConfig's default is None, no whitening).
inline gae_options gae(double discount = 1.0, double gae_lambda = 1.0, bool with_adv_norm = false) {
  gae_options o{.gamma = discount, .lambda = gae_lambda, .masked = mask_mode::skip};
  if (with_adv_norm) o.whiten = adv_norm();
  return o;
}

//! reward_bias, reward_scaling and reward_clip (defaults 0, 1, 20).
inline reward_transform rewards(double bias = 0.0, double scaling = 1.0, double clip = 20.0) {
  return {.bias = bias, .scaling = scaling, .clip_low = -clip, .clip_high = clip};
}

//! overlong_reward_penalty (overlong_tokens, overlong_penalty_factor): linear, as verl.
inline overlong_options overlong(index_t max_new_tokens, index_t overlong_tokens, double penalty_factor) {
  return {.max_len = max_new_tokens, .buffer_len = overlong_tokens, .factor = penalty_factor, .cap = false};
}

//! mask_no_eos_with_zero: reward 0 for sequences without EOS.
inline truncation_options mask_no_eos_with_zero() { return {.action = truncation::zero_reward}; }

//! NormConfig (reward_norm, adv_norm), with its defaults.
struct norm_config {
  std::string mean_level = "batch"; //!< batch, group, none
  bool mean_leave1out = false;      //!< each value's mean leaves it out
  std::string std_level = "batch";  //!< batch, group, none
  bool std_unbiased = true;
  double eps = 1e-5; //!< added to the std (none: no eps)
  index_t group_size = 1;
};

//! AReaL's Normalization(config)(x, loss_mask) on one rank: x holds `rows` rows of
//! x.size() / rows values (rewards: one per row; advantages: a padded [rows, T] with its loss
//! mask; an empty mask is AReaL's None), a group is `group_size` consecutive rows. Each value's
//! mean m (leave-one-out: the group's or batch's masked sum without it over the count less its
//! mask; with at most one value, 0) and the std around those means, sqrt(sum m'(x - m)^2 / (n - 1))
//! (unbiased; with at most one value, 1; a group of one row is 0 and 1 as AReaL's special cases),
//! give out = (x - m) m' / (std + eps) in double, rounded to float. With every value masked, out
//! is x, as AReaL's early return. Differs on purpose: a non-finite valid value raises (AReaL
//! propagates it to its whole group or batch), a masked one is left out (AReaL multiplies it by
//! 0, which keeps a NaN); rows that leave a partial group raise (AReaL leaves them at mean 0 and
//! std 0, x / eps). The batch is this call's: AReaL all-reduces batch-level sums over ranks.
inline void normalize(const norm_config& c, index_t rows, view<const float> x, view<const mask_t> mask,
                      view<float> out) {
  auto level = [](std::string_view option, std::string_view v) {
    if (v != "batch" && v != "group" && v != "none")
      RLPT_FAIL(errors::advantage::bad_option,
                "areal {} = \"{}\" is not reproduced by rlpt (supported: batch, group, none)", option, v);
    return v;
  };
  const std::string_view mean_level = level("mean_level", c.mean_level), std_level = level("std_level", c.std_level);
  RLPT_CHECK(std::isfinite(c.eps) && c.eps >= 0.0, errors::advantage::bad_option,
             "areal norm eps = {} must be finite and >= 0", c.eps);
  RLPT_CHECK(rows >= 0 && (rows == 0 ? x.empty() : x.size() % rows == 0), errors::advantage::bad_shape,
             "areal normalize: {} values do not make {} rows", x.size(), rows);
  const bool grouped = mean_level == "group" || std_level == "group";
  RLPT_CHECK(!grouped || (c.group_size >= 1 && rows % c.group_size == 0), errors::advantage::bad_groups,
             "areal normalize: {} rows are not groups of group_size = {} (AReaL leaves the rows of a partial group "
             "at x / eps)",
             rows, c.group_size);
  rlpt::detail::expect_size("areal normalize out", out.size(), x.size(), "one per value of x");
  RLPT_CHECK(mask.empty() || mask.size() == x.size(), errors::advantage::bad_shape,
             "areal normalize: mask has {} values, x has {}", mask.size(), x.size());
  const index_t n = x.size();
  const index_t cols = rows == 0 ? 0 : n / rows;
  auto m_of = [&](index_t i) { return mask.empty() || mask[i] != 0 ? 1.0 : 0.0; };
  double total = 0.0;
  for (index_t i = 0; i < n; ++i) {
    const double m = m_of(i);
    RLPT_CHECK(m == 0.0 || std::isfinite(x[i]), errors::advantage::nonfinite,
               "areal normalize: x[{}] (row {}) = {} is not finite", i, i / cols, static_cast<double>(x[i]));
    total += m;
  }
  if (!mask.empty() && total == 0.0) { // AReaL returns x unchanged
    std::copy(x.begin(), x.end(), out.begin());
    return;
  }
  // Each value's mean, then its std, over a span of rows [r0, r1): a group or the batch.
  std::vector<double> mean(static_cast<std::size_t>(n), 0.0), stdev(static_cast<std::size_t>(n), 1.0);
  auto span_mean = [&](index_t r0, index_t r1) {
    double sum = 0.0, count = 0.0;
    for (index_t i = r0 * cols; i < r1 * cols; ++i) {
      const double m = m_of(i);
      sum += m != 0.0 ? static_cast<double>(x[i]) : 0.0;
      count += m;
    }
    for (index_t i = r0 * cols; i < r1 * cols; ++i) {
      double& v = mean[static_cast<std::size_t>(i)];
      if (c.mean_leave1out) {
        const double m = m_of(i);
        v = count <= 1.0 ? 0.0 : m > 0.0 ? (sum - static_cast<double>(x[i])) / std::max(count - m, 1.0) : sum / count;
      } else {
        v = count == 0.0 ? 0.0 : sum / count;
      }
    }
  };
  auto span_std = [&](index_t r0, index_t r1) {
    double sq = 0.0, count = 0.0;
    for (index_t i = r0 * cols; i < r1 * cols; ++i) {
      const double m = m_of(i);
      if (m == 0.0) continue;
      const double d = static_cast<double>(x[i]) - mean[static_cast<std::size_t>(i)];
      sq += d * d;
      count += m;
    }
    const double s = c.std_unbiased ? (count <= 1.0 ? 1.0 : std::sqrt(sq / (count - 1.0)))
                                    : (count == 0.0 ? 1.0 : std::sqrt(sq / count));
    for (index_t i = r0 * cols; i < r1 * cols; ++i) stdev[static_cast<std::size_t>(i)] = s;
  };
  if (mean_level == "batch") {
    span_mean(0, rows);
  } else if (mean_level == "group") {
    for (index_t r = 0; r < rows; r += c.group_size)
      if (!(c.group_size == 1 && c.mean_leave1out)) span_mean(r, r + c.group_size); // else 0
  }
  if (std_level == "batch") {
    span_std(0, rows);
  } else if (std_level == "group") {
    for (index_t r = 0; r < rows; r += c.group_size)
      if (!(c.group_size == 1 && c.std_unbiased)) span_std(r, r + c.group_size); // else 1
  }
  const double eps = std_level == "none" ? 0.0 : c.eps;
  for (index_t i = 0; i < n; ++i) {
    const std::size_t k = static_cast<std::size_t>(i);
    const double centred = m_of(i) != 0.0 ? static_cast<double>(x[i]) - mean[k] : 0.0;
    out[i] = static_cast<float>(centred / (stdev[k] + eps));
  }
}

} // namespace areal

namespace slime {

//! grpo / gspo / cispo reward post-processing: R - mean, and / (std_unbiased + 1e-6) with
//! --grpo-std-normalization. A group of one would take torch's std of one value (NaN): raise.
inline grpo_options grpo(bool grpo_std_normalization = true) {
  return {.scale = grpo_std_normalization ? scale::group_std : scale::none, .epsilon = 1e-6, .single = single::raise};
}

//! advantage_estimator=ppo: GAE (vanilla_gae / chunked_gae) without mask skipping, V_T = 0.
inline gae_options gae(double gamma = 1.0, double lambd = 1.0) {
  return {.gamma = gamma, .lambda = lambd, .masked = mask_mode::zero};
}

} // namespace slime

namespace verl_agent {

//! GiGPO as verl-agent's algorithm.gigpo config spells it: mode "mean_norm" (its default) or
//! "mean_std_norm", step_advantage_w, and compute_gigpo_outcome_advantage's epsilon 1e-6. The
//! discount of the step returns is algorithm.gamma (verl-agent's examples: 0.95), given to
//! rlpt::step_returns.
inline gigpo_options gigpo(std::string_view mode = "mean_norm", double step_advantage_w = 1.0, double epsilon = 1e-6) {
  gigpo_norm norm = gigpo_norm::mean;
  if (mode == "mean_std_norm")
    norm = gigpo_norm::mean_std;
  else if (mode != "mean_norm")
    RLPT_FAIL(errors::advantage::bad_option,
              "verl-agent algorithm.gigpo.mode = \"{}\" is not reproduced by rlpt (supported: mean_norm, "
              "mean_std_norm)",
              mode);
  return {.norm = norm, .step_weight = step_advantage_w, .epsilon = epsilon};
}

} // namespace verl_agent

} // namespace compat
RLPT_NAMESPACE_END
