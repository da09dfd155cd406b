// SPDX-License-Identifier: Apache-2.0
//! @file
//! Scalar helpers the objective family's per-token math shares between host and device:
//! exp that vectorises on the host, clamps that report whether autograd would let a gradient
//! through (torch.clamp passes it for lo <= x <= hi), tie-splitting max/min (torch.maximum and
//! torch.minimum send half of the gradient to each side on a tie). The select and finite test
//! are core's (core/float_bits.hpp).
#pragma once

#include <rlpt/config.hpp>
#include <rlpt/core/float_bits.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

RLPT_NO_CONTRACT_BEGIN
RLPT_NAMESPACE_BEGIN
namespace detail {

//! exp(x) for float on the host: Cody-Waite reduction and a degree-7 Taylor polynomial
//! (max error about 2 ulp), written without calls or branches so loops over it vectorise.
//! Defined for x <= 88; returns 0 below -87 (where expf is subnormal or 0). Every caller
//! clamps its argument to |x| <= 80 first.
RLPT_HD_FORCEINLINE float exp_poly(float x) {
  const bool under = x < -87.0f;
  x = sel(under, -87.0f, sel(x > 88.0f, 88.0f, x));
  const float t = x * 1.44269504088896341f;
  const int k = static_cast<int>(t + (t >= 0.0f ? 0.5f : -0.5f)); // round to nearest
  const float kf = static_cast<float>(k);
  // x − k·ln2 in two parts (k·C1 is exact), then Horner: each a·b + c an FMA, rounded once
  const float r = std::fma(kf, -1.428606765330187045e-6f, std::fma(kf, -0.693145751953125f, x));
  float p = 1.0f / 5040.0f;
  p = std::fma(p, r, 1.0f / 720.0f);
  p = std::fma(p, r, 1.0f / 120.0f);
  p = std::fma(p, r, 1.0f / 24.0f);
  p = std::fma(p, r, 1.0f / 6.0f);
  p = std::fma(p, r, 0.5f);
  p = std::fma(p, r, 1.0f);
  p = std::fma(p, r, 1.0f);
  const std::uint32_t bits = static_cast<std::uint32_t>(k + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  const float res = p * scale;
  return sel(under, 0.0f, res);
}

//! exp in the compute type R: the vectorisable polynomial for float on the host, the CUDA
//! math library on the device, std::exp for double.
template <class R> RLPT_HD_FORCEINLINE R exp_r(R x) {
  if constexpr (std::is_same_v<R, float>) {
#if RLPT_DEVICE_PASS()
    return ::expf(x);
#else
    return exp_poly(x);
#endif
  } else {
    return std::exp(x);
  }
}

template <class R> RLPT_HD_FORCEINLINE R log_r(R x) {
#if RLPT_DEVICE_PASS()
  if constexpr (std::is_same_v<R, float>) {
    return ::logf(x);
  } else {
    return std::log(x);
  }
#else
  return std::log(x);
#endif
}

template <class R> RLPT_HD_FORCEINLINE R clamp_r(R x, R lo, R hi) { return sel(x < lo, lo, sel(x > hi, hi, x)); }

//! 1 where torch.clamp(x, lo, hi) passes the gradient (lo <= x <= hi), else 0.
template <class R> RLPT_HD_FORCEINLINE R clamp_pass(R x, R lo, R hi) { return sel((x >= lo) & (x <= hi), R(1), R(0)); }

//! d max(a, b) given da, db, with torch's tie rule (half to each side).
template <class R> RLPT_HD_FORCEINLINE R dmax(R a, R b, R da, R db) {
  const R half = R(0.5) * (da + db);
  return sel(a > b, da, sel(b > a, db, half));
}

//! d min(a, b) given da, db, with torch's tie rule.
template <class R> RLPT_HD_FORCEINLINE R dmin(R a, R b, R da, R db) {
  const R half = R(0.5) * (da + db);
  return sel(a < b, da, sel(b < a, db, half));
}

template <class R> RLPT_HD_FORCEINLINE R max_r(R a, R b) { return sel(a > b, a, b); }

template <class R> RLPT_HD_FORCEINLINE R min_r(R a, R b) { return sel(a < b, a, b); }

//! torch.sign.
template <class R> RLPT_HD_FORCEINLINE R sign_r(R x) { return sel(x > R(0), R(1), sel(x < R(0), R(-1), R(0))); }

} // namespace detail
RLPT_NAMESPACE_END
RLPT_NO_CONTRACT_END
