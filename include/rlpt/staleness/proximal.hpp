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
#include <algorithm>
#include <cstdint>
#include <limits>

RLPT_NAMESPACE_BEGIN

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

//! Interpolation weight for a token generated at version `u` (AReaL's α), computed as
//! clamp(v_prox − u, 0, v_θ − u) / (v_θ − u) with one float division (exact ratios of small
//! integers, identical on every backend).
[[nodiscard]] RLPT_HD float proximal_alpha(policy_version u, policy_version v_prox, policy_version v_theta) noexcept {
  if (u < 0 || u >= v_theta) return 0.0f; // untagged, or already on-policy
  const std::int64_t den = std::int64_t{v_theta} - u;
  std::int64_t num = std::int64_t{v_prox} - u;
  num = num < 0 ? 0 : (num > den ? den : num);
  return static_cast<float>(num) / static_cast<float>(den);
}

//! One token's approximate proximal log-prob from behaviour and current log-probs.
[[nodiscard]] RLPT_HD float proximal_logprob(float behav, float current, float alpha, prox_method m) noexcept {
  if (m == prox_method::behaviour || alpha <= 0.0f) return behav;
  if (alpha >= 1.0f) return current;
  if (m == prox_method::loglinear) {
    const double b = behav;
    return static_cast<float>(b + static_cast<double>(alpha) * (static_cast<double>(current) - b));
  }
  // log((1 − α) e^b + α e^c) = top + log(w·e^d + 1 − w), top = max(b, c), d = min − top <= 0,
  // w = the weight of the smaller term: the log's argument is in (0, 1], nothing overflows,
  // and its rounding (~1e-7 absolute) is below the float resolution of `top`. expf/logf, not
  // expm1f/log1pf: several times faster in glibc for the same float result.
  const bool b_big = behav >= current;
  const float top = b_big ? behav : current;
  const float d = (b_big ? current : behav) - top;
  const float w = b_big ? alpha : 1.0f - alpha;
  return top + std::log(w * std::exp(d) + (1.0f - w));
}

struct proximal_result {
  index_t tokens = 0;       //!< valid tokens written
  index_t interpolated = 0; //!< tokens with 0 < α < 1 (the rest equal behaviour or current exactly)
};

//! Writes the approximate proximal log-probs of every valid token (mask != 0; empty mask =
//! all). Inputs are per token in any layout (padded rows or packed), all of the same length.
//! `v_theta` is the version of the policy that produced `current` (the policy being
//! optimised). Masked tokens get their behaviour log-prob (finite, never read by a masked
//! loss). A non-finite log-prob or a version newer than v_theta on a valid token is an error.
RLPT_DEFER proximal_result proximal_logprobs(view<const float> behav, view<const float> current,
                                             view<const policy_version> versions, view<const mask_t> mask,
                                             policy_version v_theta, view<float> out, const proximal_options& opt = {});

RLPT_NAMESPACE_END

#if RLPT_HEADER_IMPL()
RLPT_NAMESPACE_BEGIN

RLPT_DEFER RLPT_INLINE proximal_result proximal_logprobs(view<const float> behav, view<const float> current,
                                                         view<const policy_version> versions, view<const mask_t> mask,
                                                         policy_version v_theta, view<float> out,
                                                         const proximal_options& opt) {
  const index_t n = behav.size();
  detail::expect_size("current logprobs", current.size(), n, "one per token, like behav");
  detail::expect_size("versions", versions.size(), n, "one per token, like behav");
  detail::expect_size_or_empty("mask", mask.size(), n, "one per token, like behav");
  detail::expect_size("out", out.size(), n, "one per token, like behav");
  RLPT_CHECK(opt.lag >= 0, errors::staleness::bad_option, "proximal lag must be >= 0, got {}", opt.lag);
  RLPT_CHECK(v_theta >= 0, errors::staleness::bad_version, "v_theta must be >= 0, got {}", v_theta);
  // Below -1 every tagged token has α = 0 already; clamping keeps the integer maths in range.
  const auto v_prox = static_cast<policy_version>(std::max<index_t>(index_t{v_theta} - opt.lag, -1));
  RLPT_CHECK(v_theta < std::numeric_limits<policy_version>::max(), errors::staleness::bad_version,
             "v_theta {} leaves no room above it", v_theta);
  proximal_result r;
  index_t tokens = 0, interpolated = 0;
  const float* bp = behav.data();
  const float* cp = current.data();
  const policy_version* vp = versions.data();
  const mask_t* mp = mask.data();
  float* op = out.data();
  // Blocks of branch-free passes (each vectorises): validate and count, compute every token,
  // then give masked tokens a finite placeholder. Only the error path rescans.
  constexpr index_t block = 2048;
  for (index_t b0 = 0; b0 < n; b0 += block) {
    const auto len = static_cast<std::int32_t>(std::min(block, n - b0));
    std::int32_t bad = 0, tok = 0, mid = 0;
    for (std::int32_t t = 0; t < len; ++t) {
      const index_t i = b0 + t;
      const std::int32_t m = mp == nullptr ? 1 : static_cast<std::int32_t>(mp[i] != 0);
      const policy_version u = vp[i];
      bad |= m & (static_cast<std::int32_t>(!std::isfinite(bp[i])) | static_cast<std::int32_t>(!std::isfinite(cp[i])) |
                  static_cast<std::int32_t>(u > v_theta));
      tok += m;
      // 0 < α < 1  <=>  0 <= u < v_prox < v_theta
      mid += m & static_cast<std::int32_t>(u >= 0) & static_cast<std::int32_t>(u < v_prox);
    }
    if (bad != 0)
      for (index_t i = b0; i < b0 + len; ++i) {
        if (mp != nullptr && mp[i] == 0) continue;
        RLPT_CHECK(std::isfinite(bp[i]) && std::isfinite(cp[i]), errors::staleness::non_finite,
                   "token {} has behaviour logprob {} and current logprob {}; both must be finite on a valid token", i,
                   bp[i], cp[i]);
        RLPT_CHECK(vp[i] <= v_theta, errors::staleness::future_version,
                   "token {} has version {}, newer than v_theta {}", i, vp[i], v_theta);
      }
    tokens += tok;
    interpolated += v_prox < v_theta ? mid : 0;
    if (opt.method == prox_method::loglinear) {
      // α = clamp(v_prox − u, 0, v_θ − u) / (v_θ − u) in integers (0 for u < 0 or u >= v_θ),
      // which is proximal_alpha exactly; the blend in fp64 as proximal_logprob.
      for (std::int32_t t = 0; t < len; ++t) {
        const index_t i = b0 + t;
        const policy_version u = vp[i];
        const policy_version tagged = (u >> 31) + 1; // 0 for u < 0, 1 otherwise
        // Differences wrap (well defined) for the garbage versions masked tokens may hold;
        // valid tokens have -1 <= u <= v_theta, where nothing wraps.
        const auto diff = [u](policy_version v) {
          return static_cast<policy_version>(static_cast<std::uint32_t>(v) - static_cast<std::uint32_t>(u));
        };
        const policy_version den = std::max(diff(v_theta), policy_version{1});
        const policy_version num = std::min(std::max(diff(v_prox), policy_version{0}), den) * tagged;
        const float a = static_cast<float>(num) / static_cast<float>(den);
        const double b = bp[i];
        op[i] = static_cast<float>(b + static_cast<double>(a) * (static_cast<double>(cp[i]) - b));
      }
    } else {
      for (index_t i = b0; i < b0 + len; ++i)
        op[i] = proximal_logprob(bp[i], cp[i], proximal_alpha(vp[i], v_prox, v_theta), opt.method);
    }
    if (mp != nullptr)
      for (std::int32_t t = 0; t < len; ++t) {
        const index_t i = b0 + t;
        const float ph = std::isfinite(bp[i]) ? bp[i] : 0.0f;
        op[i] = mp[i] != 0 ? op[i] : ph;
      }
  }
  r.tokens = tokens;
  r.interpolated = interpolated;
  return r;
}

RLPT_NAMESPACE_END
#endif // RLPT_HEADER_IMPL()
