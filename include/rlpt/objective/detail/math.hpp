// SPDX-License-Identifier: Apache-2.0
//! @file
//! Scalar helpers the objective family's per-token math shares between host and device: log
//! that vectorises on the host, clamps that report whether autograd would let a gradient through
//! (torch.clamp passes it for lo <= x <= hi), tie-splitting max/min (torch.maximum and
//! torch.minimum send half of the gradient to each side on a tie). The exp (core/exp.hpp), the
//! select and the finite test (core/float_bits.hpp) are core's.
#pragma once

#include <rlpt/config.hpp>
#include <rlpt/core/exp.hpp>
#include <rlpt/core/float_bits.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

RLPT_NO_CONTRACT_BEGIN
RLPT_NAMESPACE_BEGIN
namespace detail {

//! log(x) for float on the host, written without calls or branches so loops over it vectorise:
//! x = m 2^e with m in [sqrt(1/2), sqrt(2)), log(m) = f - f^2/2 + f^3 P(f) with f = m - 1 (P the
//! degree-8 minimax polynomial of the Cephes library's logf), e ln 2 added in two parts (e C1 is
//! exact). Within 2 ulp of the true value (tests/objective: test_properties). log(0) = -inf,
//! log(inf) = inf, negative or NaN x give NaN, subnormals are scaled into the normal range first.
RLPT_HD_FORCEINLINE float log_poly(float x) {
  const bool sub = x < 1.17549435e-38f;         // below FLT_MIN (0, negatives and NaN are fixed at the end)
  const float xs = sel(sub, x * 8388608.0f, x); // 2^23
  std::uint32_t bits;
  std::memcpy(&bits, &xs, sizeof bits);
  int e = static_cast<int>((bits >> 23) & 0xffu) - 127 - 23 * static_cast<int>(sub);
  const std::uint32_t mbits = (bits & 0x007fffffu) | 0x3f800000u; // the mantissa as a float in [1, 2)
  float m;
  std::memcpy(&m, &mbits, sizeof m);
  const bool high = m > 1.41421356f;
  m = sel(high, m * 0.5f, m);
  e += static_cast<int>(high);
  const float f = m - 1.0f;
  const float z = f * f;
  float p = 7.0376836292e-2f;
  p = std::fma(p, f, -1.1514610310e-1f);
  p = std::fma(p, f, 1.1676998740e-1f);
  p = std::fma(p, f, -1.2420140846e-1f);
  p = std::fma(p, f, 1.4249322787e-1f);
  p = std::fma(p, f, -1.6668057665e-1f);
  p = std::fma(p, f, 2.0000714765e-1f);
  p = std::fma(p, f, -2.4999993993e-1f);
  p = std::fma(p, f, 3.3333331174e-1f);
  const auto ef = static_cast<float>(e);
  float y = (f * z) * p;
  y = std::fma(ef, -2.12194440e-4f, y);
  y = std::fma(-0.5f, z, y);
  float r = f + y;
  r = std::fma(ef, 0.693359375f, r);
  constexpr float inf = std::numeric_limits<float>::infinity();
  r = sel(x == inf, inf, r);
  r = sel(x == 0.0f, -inf, r);
  return sel((x < 0.0f) | (x != x), std::numeric_limits<float>::quiet_NaN(), r); // | not ||: no branch
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

//! log in the compute type R: the vectorisable polynomial for float on the host, the CUDA math
//! library on the device, std::log for double.
template <class R> RLPT_HD_FORCEINLINE R log_r(R x) {
  if constexpr (std::is_same_v<R, float>) {
#if RLPT_DEVICE_PASS()
    return ::logf(x);
#else
    return log_poly(x);
#endif
  } else {
    return std::log(x);
  }
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
