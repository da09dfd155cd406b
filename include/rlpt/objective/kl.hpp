// SPDX-License-Identifier: Apache-2.0
//! @file
//! KL penalties against a reference policy, as a loss term: the Schulman estimators k1, k2, k3
//! (low_var_kl) and abs, each with the clamps its framework applies, the gradient they are
//! differentiated with (the estimator's own, k2's straight-through, or OpenRLHF's importance-
//! weighted k2) and the importance-corrected KL (DeepSeek-V3.2, TRL use_bias_correction_kl).
//!
//! x = logp - ref_logp. Value and d value / d logp per estimator:
//!
//! | estimator | value                       | natural gradient          |
//! |-----------|-----------------------------|---------------------------|
//! | k1        | x                           | 1                         |
//! | abs       | abs(x)                      | sign(x)                   |
//! | k2        | x^2 / 2                     | x                         |
//! | k3        | exp(-x') + x' - 1, x' = clamp(x) | 1 - exp(-x') inside the clamp, else 0 |
//!
//! The expected gradient of k1 and k3 under samples from pi_theta is not the gradient of
//! KL(pi_theta || pi_ref); k2's (x * grad logp) is, which is why the straight-through forms
//! exist. Importance correction multiplies the value by r = exp(logp - old_logp) *with* its
//! gradient (TRL, slime), which makes k3's gradient unbiased for samples from pi_old.
#pragma once

#include <rlpt/config.hpp>
#include <rlpt/objective/detail/math.hpp>

#include <cstdint>
#include <string_view>
#include <type_traits>

RLPT_NO_CONTRACT_BEGIN
RLPT_NAMESPACE_BEGIN

enum class kl_estimator : std::uint8_t { k1, abs, k2, k3 };

[[nodiscard]] constexpr std::string_view name(kl_estimator e) noexcept {
  switch (e) {
  case kl_estimator::k1:
    return "k1";
  case kl_estimator::abs:
    return "abs";
  case kl_estimator::k2:
    return "k2";
  case kl_estimator::k3:
    return "k3";
  }
  return "?";
}

enum class kl_gradient : std::uint8_t {
  natural,          //!< the estimator's own gradient
  straight_through, //!< value of the estimator, gradient of k2: x (verl "k1+", "k3+", "low_var_kl+", "abs+")
  k2_importance //!< value of the estimator, gradient sg(w) x, w = min(exp(logp - old), is_cap) (OpenRLHF unbiased_gradient)
};

struct kl_penalty {
  //! Weight of the KL term in the total loss (verl kl_loss_coef 0.001 when use_kl_loss, TRL beta,
  //! OpenRLHF init_kl_coef). 0 (the default) turns the term off.
  double coef = 0.0;
  kl_estimator estimator = kl_estimator::k3; //!< verl kl_loss_type "low_var_kl"; TRL's only estimator
  //! k3 clamps x to [x_min, x_max] before exp: verl [-20, 20], OpenRLHF and AReaL [-10, inf),
  //! TRL none. Bounds beyond +-80 are capped there so exp stays finite in fp32.
  double k3_x_min = -20.0;
  double k3_x_max = 20.0;
  //! The value is clamped to [-output_clamp, output_clamp]: verl 10 for k3 only, OpenRLHF/AReaL 10
  //! for every estimator, slime 10 for low_var_kl only, TRL none. 0 = no clamp.
  double output_clamp = 10.0;
  kl_gradient gradient = kl_gradient::natural;
  double is_cap = 10.0; //!< k2_importance weight cap: OpenRLHF KL_IS_WEIGHT_CLIP 10
  //! Multiply the value by r = exp(logp - old_logp), r differentiated (TRL use_bias_correction_kl,
  //! slime use_unbiased_kl). The log-ratio is clamped to +-20 before exp. Needs old_logp.
  bool importance_corrected = false;
  //! With importance_corrected: r is the row's sequence ratio exp(s), s the mean of logp - old_logp
  //! over its tokens in the loss (the sequence form's s, clamped to +-20 before exp), differentiated
  //! through the mean (TRL use_bias_correction_kl at importance_sampling_level "sequence", whose KL
  //! is multiplied by that coef_1). Needs gspo or sapo in sequence form, cispo with
  //! token_level = false, or vespo (the policies TRL runs at that level).
  bool importance_per_sequence = false;
};

namespace detail {

template <class R> struct kl_token {
  R value;
  R grad;
};

//! The estimator's value and natural gradient for x = logp - ref, with the output clamp. The
//! host runs this, kl_regrad and kl_importance as separate loops (4 + 2 + 1 instantiations
//! instead of 4 x 3 x 2 fused ones: the fused set dominated the compile time of every TU that
//! calls evaluate); kl_value_t composes them per token. Same operations either way.
template <kl_estimator E, class R> RLPT_HD_FORCEINLINE kl_token<R> kl_estimate(const kl_penalty& k, R x) {
  R v = R(0);
  R g = R(0);
  if constexpr (E == kl_estimator::k1) {
    v = x;
    g = R(1);
  } else if constexpr (E == kl_estimator::abs) {
    v = sel(x < R(0), -x, x);
    g = sign_r(x);
  } else if constexpr (E == kl_estimator::k2) {
    v = R(0.5) * (x * x);
    g = x;
  } else {
    const R lo = max_r(R(k.k3_x_min), R(-80));
    const R hi = min_r(R(k.k3_x_max), R(80));
    const R d = -clamp_r(x, lo, hi); // ref - logp, clamped
    const R e = exp_r(d);
    v = e - d - R(1);
    const R ge = R(1) - e;
    g = sel((x >= lo) & (x <= hi), ge, R(0));
  }
  const bool oc = k.output_clamp > 0.0;
  const R c = R(k.output_clamp);
  g = sel(oc & ((v < -c) | (v > c)), R(0), g);
  const R vc = clamp_r(v, -c, c);
  v = sel(oc, vc, v);
  return {v, g};
}

//! The gradient a non-natural gradient mode G puts in place of the estimator's (x = logp - ref,
//! xo = logp - old).
template <kl_gradient G, class R> RLPT_HD_FORCEINLINE R kl_regrad(const kl_penalty& k, R x, R xo) {
  static_assert(G != kl_gradient::natural, "the natural gradient is kl_estimate's");
  if constexpr (G == kl_gradient::straight_through) {
    return x;
  } else {
    const R w = min_r(exp_r(min_r(xo, R(80))), R(k.is_cap));
    return w * x;
  }
}

//! Importance correction of a KL term: value times r = exp(xo), r differentiated.
template <class R> RLPT_HD_FORCEINLINE kl_token<R> kl_importance(kl_token<R> q, R xo) {
  const R xc = clamp_r(xo, R(-20), R(20));
  const R r = exp_r(xc);
  const R dr = sel((xo >= R(-20)) & (xo <= R(20)), r, R(0));
  return {q.value * r, q.grad * r + q.value * dr};
}

//! KL term of one token with the estimator, gradient mode and importance correction fixed
//! at compile time; x = logp - ref, xo = logp - old.
template <kl_estimator E, kl_gradient G, bool IC, class R>
RLPT_HD_FORCEINLINE kl_token<R> kl_value_t(const kl_penalty& k, R x, R xo) {
  kl_token<R> q = kl_estimate<E>(k, x);
  if constexpr (G != kl_gradient::natural) q.grad = kl_regrad<G>(k, x, xo);
  if constexpr (IC) q = kl_importance(q, xo);
  return q;
}

//! Calls f.template operator()<E, G, IC>() for the KL configuration k (a runtime-to-compile-time
//! dispatch, done once per chunk on the host and once per thread on the device).
template <class F> RLPT_HD_FORCEINLINE void dispatch_kl(const kl_penalty& k, F&& f) {
  auto with_ic = [&](auto e, auto g) RLPT_INLINE_LAMBDA {
    if (k.importance_corrected)
      f.template operator()<decltype(e)::value, decltype(g)::value, true>();
    else
      f.template operator()<decltype(e)::value, decltype(g)::value, false>();
  };
  auto with_g = [&](auto e) RLPT_INLINE_LAMBDA {
    switch (k.gradient) {
    case kl_gradient::natural:
      with_ic(e, std::integral_constant<kl_gradient, kl_gradient::natural>{});
      break;
    case kl_gradient::straight_through:
      with_ic(e, std::integral_constant<kl_gradient, kl_gradient::straight_through>{});
      break;
    case kl_gradient::k2_importance:
      with_ic(e, std::integral_constant<kl_gradient, kl_gradient::k2_importance>{});
      break;
    }
  };
  switch (k.estimator) {
  case kl_estimator::k1:
    with_g(std::integral_constant<kl_estimator, kl_estimator::k1>{});
    break;
  case kl_estimator::abs:
    with_g(std::integral_constant<kl_estimator, kl_estimator::abs>{});
    break;
  case kl_estimator::k2:
    with_g(std::integral_constant<kl_estimator, kl_estimator::k2>{});
    break;
  case kl_estimator::k3:
    with_g(std::integral_constant<kl_estimator, kl_estimator::k3>{});
    break;
  }
}

//! KL term of one token, configuration read at run time.
template <class R> RLPT_HD_FORCEINLINE kl_token<R> kl_value(const kl_penalty& k, R x, R xo) {
  kl_token<R> out{R(0), R(0)};
  dispatch_kl(k, [&]<kl_estimator E, kl_gradient G, bool IC>()
                     RLPT_INLINE_LAMBDA { out = kl_value_t<E, G, IC>(k, x, xo); });
  return out;
}

} // namespace detail
RLPT_NAMESPACE_END
RLPT_NO_CONTRACT_END
