// SPDX-License-Identifier: Apache-2.0
//! @file
//! The proximal policy of decoupled PPO without an extra forward pass (AReaL
//! `prox_logp_method`).
//!
//! Decoupled PPO uses three log-probabilities per token: behaviour (the engine that sampled it,
//! version u), proximal (the policy one step behind the one being optimised, version
//! v_prox = v_θ − 1) and current (θ, version v_θ). The proximal term anchors the trust region;
//! the behaviour term only reweights (objective/correction.hpp). Recomputing π_prox costs a
//! forward pass; AReaL approximates it per token from the versions:
//!
//!     α = clamp((v_prox − u) / (v_θ − u), 0, 1)      (α = 0 when u = v_θ or u < 0)
//!     loglinear: log π_prox = log π_b + α·(log π_θ − log π_b)
//!     linear:    log π_prox = log((1 − α)·π_b + α·π_θ)
//!     behaviour: log π_prox = log π_b                 (AReaL "rollout", a metrics baseline)
//!
//! At α = 0 the result is exactly the behaviour log-prob, at α = 1 exactly the current one,
//! and it moves monotonically between them as v_prox goes from u to v_θ.
#pragma once

#include <rlpt/config.hpp>
#include <rlpt/core/error.hpp>
#include <rlpt/core/views.hpp>
#include <rlpt/staleness/clock.hpp>

#include <cmath>
#include <cstdint>

namespace rlpt {

enum class prox_method : std::uint8_t {
  loglinear, //!< AReaL "loglinear" (recommended there): linear in log space
  linear,    //!< AReaL "linear": linear in probability space
  behaviour  //!< AReaL "rollout": π_prox = π_behav
};

struct proximal_options {
  prox_method method = prox_method::loglinear; //!< AReaL's recommended approximation
  //! v_prox = v_θ − lag: AReaL's proximal policy is one training step behind θ.
  index_t lag = 1;
};

//! Interpolation weight for a token generated at version `u` (AReaL's α).
[[nodiscard]] RLPT_HD float proximal_alpha(policy_version u, policy_version v_prox, policy_version v_theta) noexcept {
  if (u < 0 || u >= v_theta) return 0.0f; // untagged, or already on-policy
  const double a = (static_cast<double>(v_prox) - static_cast<double>(u)) /
                   (static_cast<double>(v_theta) - static_cast<double>(u));
  return static_cast<float>(a < 0.0 ? 0.0 : (a > 1.0 ? 1.0 : a));
}

//! One token's approximate proximal log-prob from behaviour and current log-probs.
[[nodiscard]] RLPT_HD float proximal_logprob(float behav, float current, float alpha, prox_method m) noexcept {
  if (m == prox_method::behaviour || alpha <= 0.0f) return behav;
  if (alpha >= 1.0f) return current;
  if (m == prox_method::loglinear) {
    const double b = behav;
    return static_cast<float>(b + static_cast<double>(alpha) * (static_cast<double>(current) - b));
  }
  // log((1 − α) e^b + α e^c), evaluated stably around the larger exponent.
  const double lb = std::log1p(-static_cast<double>(alpha)) + static_cast<double>(behav);
  const double lc = std::log(static_cast<double>(alpha)) + static_cast<double>(current);
  const double hi = lb > lc ? lb : lc;
  const double lo = lb > lc ? lc : lb;
  return static_cast<float>(hi + std::log1p(std::exp(lo - hi)));
}

struct proximal_result {
  index_t tokens = 0;        //!< valid tokens written
  index_t interpolated = 0;  //!< tokens with 0 < α < 1
  double mean_alpha = 0.0;   //!< over valid tokens
};

//! Writes the approximate proximal log-probs of every valid token (mask != 0; empty mask =
//! all). Inputs are per token in any layout (padded rows or packed), all of the same length.
//! `v_theta` is the version of the policy that produced `current` (the policy being
//! optimised). Masked tokens get their behaviour log-prob (finite, never read by a masked
//! loss). A non-finite log-prob or a version newer than v_theta on a valid token is an error.
inline proximal_result proximal_logprobs(view<const float> behav, view<const float> current,
                                         view<const policy_version> versions, view<const mask_t> mask,
                                         policy_version v_theta, view<float> out, const proximal_options& opt = {}) {
  const index_t n = behav.size();
  detail::expect_size("current logprobs", current.size(), n, "one per token, like behav");
  detail::expect_size("versions", versions.size(), n, "one per token, like behav");
  detail::expect_size_or_empty("mask", mask.size(), n, "one per token, like behav");
  detail::expect_size("out", out.size(), n, "one per token, like behav");
  RLPT_CHECK(opt.lag >= 0, "rlpt.staleness.bad_option", "proximal lag must be >= 0, got {}", opt.lag);
  RLPT_CHECK(v_theta >= 0, "rlpt.staleness.bad_version", "v_theta must be >= 0, got {}", v_theta);
  const auto v_prox = static_cast<policy_version>(static_cast<index_t>(v_theta) - opt.lag);
  proximal_result r;
  double alpha_sum = 0.0;
  for (index_t i = 0; i < n; ++i) {
    if (!mask.empty() && mask[i] == 0) {
      out[i] = std::isfinite(behav[i]) ? behav[i] : 0.0f;
      continue;
    }
    RLPT_CHECK(std::isfinite(behav[i]) && std::isfinite(current[i]), "rlpt.staleness.non_finite",
               "token {} has behaviour logprob {} and current logprob {}; both must be finite on a valid token", i,
               behav[i], current[i]);
    RLPT_CHECK(versions[i] <= v_theta, "rlpt.staleness.future_version",
               "token {} has version {}, newer than v_theta {}", i, versions[i], v_theta);
    const float a = proximal_alpha(versions[i], v_prox, v_theta);
    out[i] = proximal_logprob(behav[i], current[i], a, opt.method);
    ++r.tokens;
    r.interpolated += (a > 0.0f && a < 1.0f) ? 1 : 0;
    alpha_sum += static_cast<double>(a);
  }
  r.mean_alpha = r.tokens > 0 ? alpha_sum / static_cast<double>(r.tokens) : 0.0;
  return r;
}

} // namespace rlpt
