// SPDX-License-Identifier: Apache-2.0
//! @file
//! Per-element and per-row math of the logprob family, shared by the host and CUDA kernels.
//!
//! With z = logits / T, a row's softmax is summarised by an online log-sum-exp state
//! (m, s, a): m = max z, s = Σ exp(z − m), a = Σ exp(z − m)·(z − m). From it:
//!   lse = m + log s,   logp(y) = z_y − lse,   entropy = log s − a / s.
//! Keeping `a` relative to m avoids the cancellation of lse − Σ p·z when |m| is large.
//! States of disjoint column ranges merge exactly (vocab tiles, vocab-parallel shards).
#pragma once

#include <rlpt/config.hpp>
#include <rlpt/core/dtype.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

RLPT_NAMESPACE_BEGIN

//! Online log-sum-exp state of (part of) a row, in tempered-logit units z = logits / T.
struct lse_state {
  float m = -std::numeric_limits<float>::infinity(); //!< running max of z
  float s = 0.0f;                                    //!< Σ exp(z − m)
  float a = 0.0f;                                    //!< Σ exp(z − m)·(z − m)
};

//! The finished statistics of a row.
struct row_result {
  float lse = 0.0f;     //!< log Σ exp(z) over the (kept) support
  float entropy = 0.0f; //!< −Σ p log p
};

namespace detail {

//! c ? a : b as a bit blend: compilers if-convert and vectorise it without -fno-trapping-math
//! (a float ?: whose arms do arithmetic stays a branch under the default trapping-math rules).
RLPT_HD_FORCEINLINE float select(bool c, float a, float b) {
  const std::uint32_t m = 0u - static_cast<std::uint32_t>(c);
  return bits_float((float_bits(a) & m) | (float_bits(b) & ~m));
}

//! exp(x) as a branch-free polynomial (Cody–Waite reduction, degree-6 minimax, ≤ 2 ulp on
//! [−87, 88]), written so compilers vectorise loops that call it; the device pass uses the
//! hardware ex2 unit instead. NaN propagates; callers clamp −inf (see shifted_exp).
RLPT_HD_FORCEINLINE float exp_fast(float x) {
#if RLPT_DEVICE_PASS()
  return __expf(x);
#else
  x = select(x < -87.0f, -87.0f, x); // NaN fails both comparisons and stays NaN
  x = select(x > 88.0f, 88.0f, x);
  const float t = x * 1.44269504088896341f;
  const int n = static_cast<int>(t + select(t < 0.0f, -0.5f, 0.5f)); // round half away from 0
  const auto nf = static_cast<float>(n);
  const float r = (x - nf * 0.693359375f) - nf * -2.12194440e-4f; // x − n·ln2 in two parts
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float e = p * (r * r) + r + 1.0f;
  return e * bits_float(static_cast<std::uint32_t>(n + 127) << 23);
#endif
}

//! Below this shift a softmax weight is flushed to exactly 0 (exp(−87) ≈ 1.6e−38), so −inf
//! logits (masked vocabulary) contribute nothing and never produce 0·inf.
inline constexpr float exp_floor = -87.0f;

//! exp(d) for a shift d = z − m ≤ 0 (d ≤ 88 stays finite) with −inf (or anything below
//! exp_floor) giving exactly 0; `dc` receives d clamped at exp_floor, safe to multiply by the
//! weight. NaN propagates. The host vector kernels use the same operations lane by lane.
RLPT_HD_FORCEINLINE float shifted_exp(float d, float& dc) {
  const bool low = d < exp_floor;
  dc = select(low, exp_floor, d);
#if RLPT_DEVICE_PASS()
  return low ? 0.0f : __expf(dc);
#else
  const float t = dc * 1.44269504088896341f;
  const int n = static_cast<int>(t - 0.5f); // nearest for t ≤ 0.5
  const auto nf = static_cast<float>(n);
  const float r = (dc - nf * 0.693359375f) - nf * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float e = p * (r * r) + r + 1.0f;
  return select(low, 0.0f, e * bits_float(static_cast<std::uint32_t>(n + 127) << 23));
#endif
}

//! Branch-free half -> float, vectorisable (subnormals exact, inf/NaN kept).
RLPT_HD_FORCEINLINE float half_bits_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t em = h & 0x7fffu;
  const float scaled = bits_float(em << 13) * 5.192296858534828e33f; // × 2^112 rebiases 15 -> 127
  const std::uint32_t special = 0x7f800000u | ((em & 0x3ffu) << 13);
  const std::uint32_t keep = 0u - static_cast<std::uint32_t>(em >= 0x7c00u);
  const std::uint32_t mag = (special & keep) | (float_bits(scaled) & ~keep);
  return bits_float(mag | sign);
}

//! Loads one logit as float; the 16-bit formats avoid the scalar branches of core's convert.
RLPT_HD_FORCEINLINE float load_logit(float v) { return v; }
RLPT_HD_FORCEINLINE float load_logit(double v) { return static_cast<float>(v); }
RLPT_HD_FORCEINLINE float load_logit(bf16 v) { return bits_float(static_cast<std::uint32_t>(v.bits) << 16); }
RLPT_HD_FORCEINLINE float load_logit(f16 v) { return half_bits_to_float(v.bits); }

//! float -> bf16 bits, round to nearest even, NaN kept quiet: the same bits as rlpt::bf16(float)
//! but with integer selects only, so store loops vectorise.
RLPT_HD_FORCEINLINE std::uint16_t bf16_bits_rne(float f) {
  const std::uint32_t u = float_bits(f);
  const std::uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const std::uint32_t quiet = (u >> 16) | 0x40u;
  return static_cast<std::uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? quiet : rounded);
}

//! Stores a gradient element in the output's type.
template <class T>
RLPT_HD_FORCEINLINE T store_grad(float g) {
  if constexpr (std::is_same_v<T, float>) {
    return g;
  } else if constexpr (std::is_same_v<T, double>) {
    return static_cast<double>(g);
  } else if constexpr (std::is_same_v<T, bf16>) {
    return bf16::from_bits(bf16_bits_rne(g));
  } else {
    return T(g);
  }
}

} // namespace detail

//! True for the state of an empty range (nothing accumulated yet).
RLPT_HD bool lse_empty(lse_state x) { return x.s == 0.0f && x.m < -3.0e38f; }

//! Merges the states of two disjoint column ranges (exact up to rounding; order fixed by caller).
//! NaN in either state propagates into the result.
RLPT_HD lse_state lse_merge(lse_state x, lse_state y) {
  if (lse_empty(x)) return y;
  if (lse_empty(y)) return x;
  const float m = x.m > y.m ? x.m : y.m;
  const float dx = x.m - m, dy = y.m - m;
  float dxc = 0.0f, dyc = 0.0f;
  const float cx = detail::shifted_exp(dx, dxc), cy = detail::shifted_exp(dy, dyc);
  lse_state r;
  r.m = m;
  r.s = cx * x.s + cy * y.s;
  r.a = cx * (x.a + dxc * x.s) + cy * (y.a + dyc * y.s);
  return r;
}

//! Re-expresses a state relative to a new (larger or equal) shift m_new, e.g. the all-reduced
//! max of a vocab-parallel group.
RLPT_HD lse_state lse_rebase(lse_state x, float m_new) {
  if (lse_empty(x)) return {m_new, 0.0f, 0.0f};
  float dc = 0.0f;
  const float c = detail::shifted_exp(x.m - m_new, dc);
  return {m_new, c * x.s, c * (x.a + dc * x.s)};
}

//! lse and entropy of a finished state.
RLPT_HD row_result lse_finish(lse_state x) {
  const float log_s = std::log(x.s);
  return {x.m + log_s, log_s - x.a / x.s};
}

//! True when a finished row is usable: finite max and a positive finite sum (no NaN, no +inf,
//! not every logit −inf).
RLPT_HD bool lse_ok(lse_state x) {
  return x.m - x.m == 0.0f && x.s >= 1.0f && x.s - x.s == 0.0f && x.a - x.a == 0.0f;
}

//! d(loss)/dz_j for one kept column: dlogp·(δ_jy − p_j) − dentropy·p_j·(log p_j + H), where
//! log p_j = z_j − lse. The δ term is added by the caller at the target column only.
RLPT_HD_FORCEINLINE float softmax_grad(float z, float lse, float entropy, float dlogp, float dentropy, float& p) {
  const float lp = z - lse;
  float lpc = 0.0f;
  p = detail::shifted_exp(lp, lpc);
  return -p * (dlogp + dentropy * (lpc + entropy));
}

RLPT_NAMESPACE_END
