// SPDX-License-Identifier: Apache-2.0
//! @file
//! Clipped value loss for a critic head: l = max((v - R)^2, (v_c - R)^2) with
//! v_c = clamp(v, v_old - clip, v_old + clip), optionally with the 1/2 factor and a Huber
//! variant, and its gradient with respect to the predicted values v.
//!
//! verl compute_value_loss and OpenRLHF ValueLoss: 0.5 * agg(max(...)); slime: no 1/2;
//! AReaL ppo_critic_loss_fn: mse (1/2 x^2) or Huber (delta 10) on both branches.
#pragma once

#include <rlpt/config.hpp>
#include <rlpt/objective/detail/math.hpp>

#include <cstdint>

RLPT_NO_CONTRACT_BEGIN
RLPT_NAMESPACE_BEGIN

struct value_loss {
  //! Weight of the value term in the total loss (OpenRLHF/TRL vf_coef style). 0 (default) = off.
  double coef = 0.0;
  //! Clip range around the old values: verl cliprange_value 0.5, OpenRLHF value_clip 0.5, AReaL
  //! eps_clip 0.5. 0 = no clipping (OpenRLHF clip_eps=None).
  double clip = 0.5;
  //! Multiply by 1/2: verl, OpenRLHF and AReaL (mse) do; slime does not. Default true.
  bool half = true;
  //! Huber loss with this delta instead of the square (AReaL loss_fn="huber", delta 10); 0 = square.
  double huber_delta = 0.0;
};

namespace detail {

template <class R> struct value_token {
  R value;
  R grad;
  std::uint32_t
      clipped; //!< 1 when the clipped branch is the larger one (verl vf_clipfrac); a word keeps loops vectorised
};

//! Square (delta = 0) or Huber loss of e and its derivative, without branches.
template <class R> RLPT_HD_FORCEINLINE R value_pointwise(R e, R delta, R& de) {
  const R ae = sel(e < R(0), -e, e);
  const bool huber = delta > R(0);
  const bool inner = ae <= delta;
  const R quad_h = R(0.5) * e * e;
  const R lin_h = delta * (ae - R(0.5) * delta);
  const R dlin = delta * sign_r(e);
  const R sq = e * e;
  const R dsq = R(2) * e;
  de = sel(huber, sel(inner, e, dlin), dsq);
  return sel(huber, sel(inner, quad_h, lin_h), sq);
}

template <class R> RLPT_HD_FORCEINLINE value_token<R> value_term(const value_loss& p, R v, R v_old, R ret) {
  const bool clip = p.clip > 0.0;
  const R lo = v_old - R(p.clip);
  const R hi = v_old + R(p.clip);
  const R vcl = clamp_r(v, lo, hi);
  const R vc = sel(clip, vcl, v);
  const R dv_c = sel((!clip) | ((v > lo) & (v < hi)), R(1), R(0));
  R d1, d2;
  const R l1 = value_pointwise(v - ret, R(p.huber_delta), d1);
  const R l2 = value_pointwise(vc - ret, R(p.huber_delta), d2);
  value_token<R> o;
  o.value = max_r(l1, l2);
  o.grad = dmax(l1, l2, d1, d2 * dv_c);
  o.clipped = static_cast<std::uint32_t>(l2 > l1);
  const R f = p.half ? R(0.5) : R(1);
  o.value = f * o.value;
  o.grad = f * o.grad;
  return o;
}

} // namespace detail
RLPT_NAMESPACE_END
RLPT_NO_CONTRACT_END
