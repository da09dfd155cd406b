// SPDX-License-Identifier: Apache-2.0
//! @file
//! Entropy bonus: the term -coef * agg(H) of the loss, which consumes the per-token entropy the
//! logprob kernel produced (same index set and mask as the loss) and returns d loss / d H_t, and
//! the helpers that choose coef per step: static, scheduled (linear or cosine from a start to an
//! end value), or target-tracking (Skywork-OR1 / TRL use_adaptive_entropy).
#pragma once

#include <rlpt/config.hpp>
#include <rlpt/core/error.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>

RLPT_NAMESPACE_BEGIN

struct entropy_bonus {
  //! Loss -= coef * agg(H). verl entropy_coeff and OpenRLHF entropy_coef default 0 (off), TRL
  //! entropy_coef 0. Entropies are read only when coef != 0 (or the metric is wanted: pass them).
  double coef = 0.0;
};

enum class schedule_shape : std::uint8_t { constant, linear, cosine };

//! A coefficient that moves from `start` to `end` over `steps` optimizer steps, then stays.
struct entropy_schedule {
  double start = 0.0;
  double end = 0.0;
  std::int64_t steps = 1;
  schedule_shape shape = schedule_shape::linear;

  [[nodiscard]] double at(std::int64_t step) const {
    RLPT_CHECK(steps >= 1, errors::objective::bad_option, "entropy_schedule steps = {} must be >= 1", steps);
    RLPT_CHECK(step >= 0, errors::objective::bad_option, "entropy_schedule step = {} must be >= 0", step);
    if (shape == schedule_shape::constant) return start;
    const double t = std::min(1.0, static_cast<double>(step) / static_cast<double>(steps));
    const double f = shape == schedule_shape::linear ? t : 0.5 * (1.0 - std::cos(t * 3.14159265358979323846));
    return static_cast<double>(static_cast<double>(start) +
                               (static_cast<double>(end) - static_cast<double>(start)) * f);
  }
};

//! Target-tracking coefficient (Skywork-OR1, TRL use_adaptive_entropy): after each optimizer step,
//! given the step's global mean entropy H, coef += delta if H <= target else coef -= delta,
//! clamped to [min, max]. The bonus applies only while the last H was <= target (TRL's gating).
//! Defaults are TRL's: coef 0, delta 0.005, min 0, max 1, target 0.2.
struct adaptive_entropy {
  double coef = 0.0;
  double target = 0.2;
  double delta = 0.005;
  double min = 0.0;
  double max = 1.0;
  //! Whether the last measured entropy was <= target. TRL starts with last entropy = inf, i.e.
  //! gated off until the first measurement.
  bool active = false;

  //! The coefficient to use for the coming step (0 while gated off).
  [[nodiscard]] double current() const noexcept { return active ? coef : 0.0; }

  //! Feeds the step's global (all ranks, all micro-batches, token-weighted) mean entropy.
  void update(double mean_entropy) {
    RLPT_CHECK(std::isfinite(mean_entropy), errors::objective::nonfinite,
               "adaptive_entropy::update got a non-finite mean entropy {}", mean_entropy);
    RLPT_CHECK(min <= max && delta >= 0.0, errors::objective::bad_option,
               "adaptive_entropy needs min <= max and delta >= 0, got min {} max {} delta {}", min, max, delta);
    if (mean_entropy <= static_cast<double>(target))
      coef = std::min(coef + delta, max);
    else
      coef = std::max(coef - delta, min);
    active = mean_entropy <= static_cast<double>(target);
  }
};

RLPT_NAMESPACE_END
