// SPDX-License-Identifier: Apache-2.0
//! @file
//! The host's exp for float, one formula for every block: the objective's per-token terms call
//! it on scalars (loops over it vectorise), the logprob row kernels run the same steps on SIMD
//! packs (logprob/detail/simd.hpp, `exp_reduced`), and tests/core/test_exp.cpp checks that both
//! give the same bits. Device code uses the CUDA math library instead.
//!
//! x = n ln2 + r with n = nearest(x log2e), |r| <= ln2 / 2 (Cody-Waite, ln2 in two parts), then
//! exp(r) by a degree-6 polynomial in Horner form, every a b + c an FMA, rounded once, so each
//! ISA's build gives the same bits. Within 2 ulp of the true value on [-87, 88].
#pragma once

#include <rlpt/config.hpp>
#include <rlpt/core/float_bits.hpp>

#include <cmath>
#include <cstdint>

RLPT_NO_CONTRACT_BEGIN
RLPT_NAMESPACE_BEGIN
namespace detail::exp_consts {
inline constexpr float lo = -87.0f; //!< below: the result is 0 (exp(-87) ~ 1.6e-38, near FLT_MIN)
inline constexpr float hi = 88.0f;  //!< above: clamped (exp(88) ~ 1.65e38 < FLT_MAX)
inline constexpr float log2e = 1.44269504088896341f;
//! 1.5 * 2^23 + 127: x log2e + shift lands in [2^23, 2^24), where a float's unit is 1, so the
//! addition rounds x log2e to the nearest integer n (ties to even), and the low bits of the sum
//! are n + 127, the exponent field of 2^n (one shift, no float-to-int conversion).
inline constexpr float shift = 12582912.0f + 127.0f;
inline constexpr float ln2_hi = 0.693359375f;    //!< 355 / 512: n ln2_hi is exact
inline constexpr float ln2_lo = -2.12194440e-4f; //!< ln2 - ln2_hi
// exp(r) ~ 1 + r (1 + r (c2 + r (c3 + r (c4 + r (c5 + r c6))))) on |r| <= ln2 / 2: c2..c6 fitted to
// exp's relative error (iteratively reweighted least squares towards minimax, 3.1e-9 before
// rounding the coefficients to float; tools/fit_exp.py)
inline constexpr float c2 = 4.9999994040e-01f;
inline constexpr float c3 = 1.6666521132e-01f;
inline constexpr float c4 = 4.1668388993e-02f;
inline constexpr float c5 = 8.3687454462e-03f;
inline constexpr float c6 = 1.3814539416e-03f;
} // namespace detail::exp_consts

namespace detail {

//! exp(x) for x already in [exp_consts::lo, exp_consts::hi] (NaN propagates).
RLPT_HD_FORCEINLINE float exp_reduced(float x) {
  namespace k = exp_consts;
  const float t = std::fma(x, k::log2e, k::shift);
  const float nf = t - k::shift; // n, exact
  const float r = std::fma(nf, -k::ln2_lo, std::fma(nf, -k::ln2_hi, x));
  float p = std::fma(k::c6, r, k::c5);
  p = std::fma(p, r, k::c4);
  p = std::fma(p, r, k::c3);
  p = std::fma(p, r, k::c2);
  p = std::fma(p, r, 1.0f);
  const float e = std::fma(p, r, 1.0f);
  return e * bits_float(float_bits(t) << 23); // 2^n: the sum's low bits moved into the exponent
}

//! exp(x) for float: 0 below exp_consts::lo, clamped above exp_consts::hi, NaN propagates.
//! Written without calls or branches (a select is a bit blend), so loops over it vectorise.
RLPT_HD_FORCEINLINE float exp_poly(float x) {
  const bool under = x < exp_consts::lo;
  x = sel(under, exp_consts::lo, sel(x > exp_consts::hi, exp_consts::hi, x));
  return sel(under, 0.0f, exp_reduced(x));
}

} // namespace detail
RLPT_NAMESPACE_END
RLPT_NO_CONTRACT_END
