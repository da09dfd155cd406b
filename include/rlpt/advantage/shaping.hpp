// SPDX-License-Identifier: Apache-2.0
//! @file
//! Reward shaping that runs before an advantage estimator: DAPO's soft overlong punishment,
//! policies for truncated completions, weighted sums of several reward channels, and the affine
//! transform + clip that AReaL and OpenRLHF apply to scalar rewards.
//!
//! The frameworks differ in the details (arXiv 2503.14476 gives the idea, not the edge cases):
//! - overlong: verl and AReaL add min(-(L - (L_max - L_buf)) / L_buf * factor, 0), unbounded past
//!   L_max; OpenRLHF caps the excess at L_buf (penalty >= -factor); TRL's reward function is the
//!   capped form with factor 1.
//! - truncated completions: OpenRLHF scales the reward (coef in [0, 1]) or sets it (coef < 0),
//!   AReaL sets it to 0, TRL keeps the reward but zeroes the completion's loss mask.
#pragma once

#include <rlpt/config.hpp>
#include <rlpt/advantage/common.hpp>
#include <rlpt/core/error.hpp>
#include <rlpt/core/layout.hpp>
#include <rlpt/core/views.hpp>

#include <cmath>
#include <limits>
#include <string>

RLPT_NAMESPACE_BEGIN

// --- DAPO overlong punishment ----------------------------------------------------------------

struct overlong_options {
  index_t max_len = 0;    //!< L_max: verl max_resp_len, OpenRLHF max_new_tokens, TRL max_completion_len
  index_t buffer_len = 0; //!< L_buf: verl overlong_buffer.len, OpenRLHF overlong_buffer_len, TRL soft_punish_cache
  double factor = 1.0;    //!< verl overlong_buffer.penalty_factor (1.0), OpenRLHF overlong_penalty_factor (1.0)
  bool cap = false;       //!< verl/AReaL: linear past L_max; true: at most -factor (OpenRLHF, TRL)
};

//! The penalty (<= 0) a completion of `length` tokens receives.
RLPT_HD double overlong_penalty(index_t length, const overlong_options& o) {
  if (o.buffer_len == 0) return length > o.max_len ? -o.factor : 0.0; // TRL with soft_punish_cache = 0
  double exceed = static_cast<double>(length - (o.max_len - o.buffer_len));
  if (o.cap && exceed > static_cast<double>(o.buffer_len)) exceed = static_cast<double>(o.buffer_len);
  if (exceed <= 0.0) return 0.0;
  return -exceed / static_cast<double>(o.buffer_len) * o.factor;
}

//! rewards[i] += overlong_penalty(lengths[i]). Returns how many were penalised.
inline index_t apply_overlong_penalty(view<const index_t> lengths, view<float> rewards, const overlong_options& o) {
  RLPT_CHECK(o.max_len > 0 && o.buffer_len >= 0 && o.buffer_len <= o.max_len, errors::advantage::bad_option,
             "overlong_options: need 0 <= buffer_len ({}) <= max_len ({}) and max_len > 0", o.buffer_len, o.max_len);
  RLPT_CHECK(o.buffer_len > 0 || o.cap, errors::advantage::bad_option,
             "overlong_options: buffer_len = 0 needs cap = true (a step penalty past max_len); verl requires a "
             "positive buffer");
  RLPT_CHECK(std::isfinite(o.factor) && o.factor >= 0.0, errors::advantage::bad_option,
             "overlong_options: factor must be finite and >= 0, got {}", o.factor);
  detail::expect_size("rewards", rewards.size(), lengths.size(), "one reward per length");
  index_t n = 0;
  for (index_t i = 0; i < lengths.size(); ++i) {
    RLPT_CHECK(lengths[i] >= 0, errors::advantage::bad_length, "lengths[{}] = {} is negative", i, lengths[i]);
    const double p = overlong_penalty(lengths[i], o);
    if (p < 0.0) {
      rewards[i] = static_cast<float>(static_cast<double>(rewards[i]) + p);
      ++n;
    }
  }
  return n;
}

// --- truncated completions -------------------------------------------------------------------

enum class truncation : std::uint8_t {
  keep,         //!< leave the reward alone (verl, and every framework by default)
  zero_reward,  //!< reward 0 (AReaL mask_no_eos_with_zero)
  scale_reward, //!< reward * value (OpenRLHF stop_properly_penalty_coef in [0, 1])
  set_reward,   //!< reward = value (OpenRLHF stop_properly_penalty_coef < 0)
};

struct truncation_options {
  rlpt::truncation action = rlpt::truncation::keep;
  double value = 0.0; //!< the coefficient of scale_reward / set_reward
};

//! Applies a reward policy to truncated completions (truncated[i] != 0: no EOS, finish_reason
//! "length"). Returns how many rewards changed. For TRL's mask_truncated_completions use
//! mask_truncated_tokens instead.
inline index_t apply_truncation(view<const mask_t> truncated, view<float> rewards, const truncation_options& o) {
  detail::expect_size("rewards", rewards.size(), truncated.size(), "one reward per truncation flag");
  RLPT_CHECK(std::isfinite(o.value), errors::advantage::bad_option, "truncation_options: value must be finite, got {}",
             o.value);
  index_t n = 0;
  if (o.action == truncation::keep) return 0;
  for (index_t i = 0; i < rewards.size(); ++i) {
    if (!truncated[i]) continue;
    switch (o.action) {
    case truncation::zero_reward:
      rewards[i] = 0.0f;
      break;
    case truncation::scale_reward:
      rewards[i] = static_cast<float>(static_cast<double>(rewards[i]) * o.value);
      break;
    case truncation::set_reward:
      rewards[i] = static_cast<float>(o.value);
      break;
    case truncation::keep:
      break;
    }
    ++n;
  }
  return n;
}

//! TRL mask_truncated_completions: zeroes every token-mask entry of the truncated sequences (the
//! samples still count in the reward statistics). Returns how many sequences were masked.
inline index_t mask_truncated_tokens(const token_layout& layout, view<const mask_t> truncated, view<mask_t> mask) {
  detail::expect_size("truncated", truncated.size(), layout.num_seqs(), "one flag per sequence");
  layout.expect_tokens("mask", mask);
  index_t n = 0;
  for (index_t b = 0; b < layout.num_seqs(); ++b) {
    if (!truncated[b]) continue;
    const index_t base = layout.begin(b), len = layout.length(b);
    for (index_t t = 0; t < len; ++t) mask[base + t] = 0;
    ++n;
  }
  return n;
}

// --- reward channels -------------------------------------------------------------------------

struct channel_options {
  //! raise: any non-finite channel value is an error. mask: TRL's nansum semantics: a NaN channel
  //! contributes nothing, and a row whose channels are all NaN gives NaN (an unscorable sample,
  //! which an estimator with nonfinite::mask then leaves out with advantage 0).
  rlpt::nonfinite on_nonfinite = rlpt::nonfinite::raise;
};

//! out[b] = sum_k weights[k] * channels(b, k) (TRL reward_weights, verl gdpo_reward_weights).
//! Returns the number of unscorable rows (all channels non-finite) under nonfinite::mask.
inline index_t combine_reward_channels(view2d<const float> channels, view<const float> weights, view<float> out,
                                       const channel_options& o = {}) {
  detail::expect_size("weights", weights.size(), channels.cols(), "one weight per reward channel");
  detail::expect_size("out", out.size(), channels.rows(), "one reward per row");
  for (index_t k = 0; k < weights.size(); ++k)
    RLPT_CHECK(detail::finite(weights[k]), errors::advantage::bad_option, "weights[{}] = {} is not finite", k,
               weights[k]);
  if (o.on_nonfinite == nonfinite::raise) {
    index_t count = 0;
    std::string listed;
    for (index_t b = 0; b < channels.rows(); ++b)
      for (index_t k = 0; k < channels.cols(); ++k)
        if (!detail::finite(channels(b, k))) {
          if (count < detail::max_named)
            listed += rlpt::detail::format("{}(row {}, channel {}) = {}", count ? ", " : "", b, k, channels(b, k));
          ++count;
        }
    RLPT_CHECK(count == 0, errors::advantage::nonfinite,
               "{} reward channel values are not finite: {}{} (set "
               "channel_options::on_nonfinite = rlpt::nonfinite::mask for TRL's nansum semantics)",
               count, listed, count > detail::max_named ? ", ..." : "");
  }
  index_t unscorable = 0;
  for (index_t b = 0; b < channels.rows(); ++b) {
    double s = 0.0;
    bool any = false;
    for (index_t k = 0; k < channels.cols(); ++k) {
      const float x = channels(b, k);
      if (!detail::finite(x)) continue;
      s += static_cast<double>(weights[k]) * static_cast<double>(x);
      any = true;
    }
    if (!any && channels.cols() > 0) ++unscorable;
    out[b] = any || channels.cols() == 0 ? static_cast<float>(s) : std::numeric_limits<float>::quiet_NaN();
  }
  return unscorable;
}

// --- affine transform and clip ---------------------------------------------------------------

struct reward_transform {
  double bias = 0.0;    //!< AReaL reward_bias (0)
  double scaling = 1.0; //!< AReaL reward_scaling (1)
  double clip_low =
      -std::numeric_limits<double>::infinity(); //!< AReaL -reward_clip (-20), OpenRLHF clip_range[0] (-10)
  double clip_high = std::numeric_limits<double>::infinity(); //!< AReaL reward_clip (20), OpenRLHF clip_range[1] (10)
};

//! x <- clamp((x + bias) * scaling, clip_low, clip_high) in place. Non-finite values stay
//! non-finite (the estimator's policy handles them); they are not clipped into range.
inline void transform_rewards(view<float> rewards, const reward_transform& t) {
  RLPT_CHECK(std::isfinite(t.bias) && std::isfinite(t.scaling) && !(t.clip_low > t.clip_high),
             errors::advantage::bad_option,
             "reward_transform: bias ({}) and scaling ({}) must be finite and clip_low ({}) <= clip_high ({})", t.bias,
             t.scaling, t.clip_low, t.clip_high);
  for (float& x : rewards) {
    if (!detail::finite(x)) continue;
    double v = (static_cast<double>(x) + t.bias) * t.scaling;
    v = v < t.clip_low ? t.clip_low : v > t.clip_high ? t.clip_high : v;
    x = static_cast<float>(v);
  }
}

RLPT_NAMESPACE_END
