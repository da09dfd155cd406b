// SPDX-License-Identifier: Apache-2.0
//! @file
//! Per-element and per-row math of the logprob family, shared by the host and CUDA kernels.
//!
//! With z = logits / T, a row's softmax is summarised by an online log-sum-exp state
//! (m, s, a): m = max z, s = Σ exp(z − m), a = Σ exp(z − m)·(z − m). From it:
//!   lse = m + log s,   logp(y) = z_y − lse,   entropy = log s − a / s.
//! Keeping `a` relative to m avoids the cancellation of lse − Σ p·z when |m| is large.
//! States of disjoint column ranges merge exactly (vocab tiles, vocab-parallel shards).
//!
//! The device kernels keep the same state in base-2 units (lse_state2: the MUFU ex2 unit
//! computes 2^x); its fold, merge and finish live here too, as RLPT_HD functions, so host tests
//! run the device's arithmetic (with exp2f in place of ex2.approx).
#pragma once

#include <rlpt/config.hpp>
#include <rlpt/core/dtype.hpp>
#include <rlpt/core/exp.hpp>
#include <rlpt/core/float_bits.hpp>

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

//! Below this shift a softmax weight is flushed to exactly 0 (exp(−87) ≈ 1.6e−38), so −inf
//! logits (masked vocabulary) contribute nothing and never produce 0·inf.
inline constexpr float exp_floor = exp_consts::lo;

//! exp(d) for a shift d = z − m ≤ 0 (d ≤ 88 stays finite) with −inf (or anything below
//! exp_floor) giving exactly 0; `dc` receives d clamped at exp_floor, safe to multiply by the
//! weight. NaN propagates. On the host core's exp (core/exp.hpp), whose steps the row kernels'
//! simd::shifted_exp runs lane by lane; on the device the hardware ex2 unit.
RLPT_HD_FORCEINLINE float shifted_exp(float d, float& dc) {
  const bool low = d < exp_floor;
  dc = sel(low, exp_floor, d);
#if RLPT_DEVICE_PASS()
  return low ? 0.0f : __expf(dc);
#else
  return sel(low, 0.0f, exp_reduced(dc));
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
template <class T> RLPT_HD_FORCEINLINE T store_grad(float g) {
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
//! not every logit −inf). The sum is not required to reach 1: a state built with a rounded
//! shift (the device's m = RN(max z·log2e), or a rank's max rounded into natural units) gives
//! the maximum a weight just below 1, so a one-token support sums to 0.99999994.
RLPT_HD bool lse_ok(lse_state x) { return x.m - x.m == 0.0f && x.s > 0.0f && x.s - x.s == 0.0f && x.a - x.a == 0.0f; }

//! log p(target) = (z_t − m) − log s, never z_t − lse: lse is rounded to float (an ulp of 1e-3
//! at |z| ~ 1e4) while z_t − m is exact when the two are close, so a log-probability keeps its
//! relative precision whatever the logits' magnitude.
RLPT_HD float lse_logp(float z_target, lse_state x) { return (z_target - x.m) - std::log(x.s); }

//! d(loss)/dz_j for one kept column: dlogp·(δ_jy − p_j) − dentropy·p_j·(log p_j + H), where
//! log p_j = z_j − lse. The δ term is added by the caller at the target column only.
RLPT_HD_FORCEINLINE float softmax_grad(float z, float lse, float entropy, float dlogp, float dentropy, float& p) {
  const float lp = z - lse;
  float lpc = 0.0f;
  p = detail::shifted_exp(lp, lpc);
  return -p * (dlogp + dentropy * (lpc + entropy));
}

// ---------------------------------------------------------------------------------------------
// Temperature: z = logits / T, divided, as every peer does (torch's logits.div(T)); multiplying
// by RN(1/T) differs in the last bit for about a quarter of the logits.

//! The temperature of a call with its reciprocal (RN(1/T), for the device's division).
struct tempering {
  float t = 1.0f; //!< T > 0
  float r = 1.0f; //!< RN(1 / T)

  [[nodiscard]] RLPT_HD static tempering of(float temperature) { return {temperature, 1.0f / temperature}; }
  //! T = 1: logits are used as they are (x / 1 = x, so skipping the division changes no bit).
  [[nodiscard]] RLPT_HD bool identity() const { return t == 1.0f; }
};

namespace detail {

//! RN(x / t) from r = RN(1 / t) without a divide instruction (on the device, the IEEE division
//! spends a MUFU reciprocal per element, and MUFU is the unit ex2 needs): q = x·r is within an
//! ulp of x / t, the residual x − q·t is exact in an FMA, and one correction step rounds
//! correctly (Markstein). Tiny |x| (the residual underflows) and results beyond ±3e38 take the
//! IEEE division. Exact for every x whose quotient is a normal float (tests compare it against
//! x / t over every bf16 and f16 value and millions of floats).
RLPT_HD_FORCEINLINE float div_rn(float x, float t, float r) {
#if RLPT_DEVICE_PASS()
  const float q = x * r;
  const float q1 = fmaf(fmaf(-q, t, x), r, q);
  if (RLPT_UNLIKELY(!(fabsf(x) >= 0x1p-60f && fabsf(q1) <= 3.0e38f))) return __fdiv_rn(x, t);
  return q1;
#else
  const float q = x * r;
  const float q1 = std::fma(std::fma(-q, t, x), r, q);
  if (RLPT_UNLIKELY(!(std::fabs(x) >= 0x1p-60f && std::fabs(q1) <= 3.0e38f))) return x / t;
  return q1;
#endif
}

//! The tempered logit z = x / T, rounded once: the division every host and device path uses
//! (the host's vector loops divide lane by lane, the same IEEE operation).
RLPT_HD_FORCEINLINE float temper(float x, tempering tp) {
#if RLPT_DEVICE_PASS()
  return tp.t == 1.0f ? x : div_rn(x, tp.t, tp.r);
#else
  return x / tp.t;
#endif
}

//! 2^x: the MUFU ex2.approx.ftz on the device (2 ulp, −inf -> +0, NaN -> NaN); exp2f on the host,
//! which runs the device arithmetic in tests.
RLPT_HD_FORCEINLINE float ex2(float x) {
#if RLPT_DEVICE_PASS()
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
#else
  return std::exp2(x);
#endif
}

inline constexpr float log2e_f = 1.4426950408889634f;
inline constexpr float ln2_f = 0.6931471805599453f;

} // namespace detail

// ---------------------------------------------------------------------------------------------
// The device's online state, base 2: m = max z·log2e (rounded), s = Σ 2^d, a = Σ 2^d·d with
// d = fma(z, log2e, −m). The row maximum's d is the rounding error of m (|d| ≤ half an ulp of m),
// so its weight is within an ulp of 1, above or below.

//! Online log-sum-exp state of (part of) a row in base-2 units. Trivial (no member
//! initialisers: kernels keep arrays of it in __shared__ memory); start from lse2_empty().
struct lse_state2 {
  float m; //!< running max of z·log2e
  float s; //!< Σ 2^d
  float a; //!< Σ 2^d·d
};

//! The state of an empty range.
RLPT_HD_FORCEINLINE lse_state2 lse2_empty() { return {-std::numeric_limits<float>::infinity(), 0.0f, 0.0f}; }

//! Adds one weight 2^d (d ≤ 0 relative to the state's shift) to a state. 2^−inf = 0 and the
//! clamp keeps 0·(−inf) out of `a`; NaN is carried by the weight.
RLPT_HD_FORCEINLINE void lse2_add(lse_state2& st, float d) {
  const float e = detail::ex2(d);
  st.s += e;
  st.a = fmaf(e, fmaxf(d, -126.0f), st.a);
}

//! Folds W tempered logits into a state (the per-thread fold of the device kernels). A NaN
//! poisons the state (s = NaN) even while the running max is still −inf, as the host's
//! `poisoned` flag does: a NaN logit in a lane whose neighbours are −inf is never dropped.
template <int W> RLPT_HD_FORCEINLINE void lse2_fold(lse_state2& st, const float (&z)[W]) {
  float mx = z[0];
  for (int k = 1; k < W; ++k) mx = fmaxf(mx, z[k]); // fmaxf skips NaN: NaN is caught below
  const float mv = mx * detail::log2e_f;
  if (mv > st.m) {
    if (st.m != -std::numeric_limits<float>::infinity()) {
      const float dm = st.m - mv;
      const float c = detail::ex2(dm);
      st.a = c * (st.a + dm * st.s);
      st.s *= c;
    }
    st.m = mv;
  }
  if (st.m == -std::numeric_limits<float>::infinity()) { // nothing finite yet: keep NaN visible
    bool nan = false;
    for (int k = 0; k < W; ++k) nan = nan || z[k] != z[k]; // NOLINT(misc-redundant-expression): NaN test
    if (nan) st.s = std::numeric_limits<float>::quiet_NaN();
    return;
  }
  for (int k = 0; k < W; ++k) lse2_add(st, fmaf(z[k], detail::log2e_f, -st.m)); // NaN -> s NaN
}

//! Merge of two states (symmetric in its arithmetic, so xor partners agree bitwise when the
//! caller fixes the operand order). NaN in either propagates.
RLPT_HD_FORCEINLINE lse_state2 lse2_merge(lse_state2 x, lse_state2 y) {
  const float m = fmaxf(x.m, y.m);
  lse_state2 r{m, 0.0f, 0.0f};
  if (x.s != 0.0f) {
    const float d = x.m - m, c = detail::ex2(d);
    r.s += c * x.s;
    r.a += c * (x.a + d * x.s);
  }
  if (y.s != 0.0f) {
    const float d = y.m - m, c = detail::ex2(d);
    r.s += c * y.s;
    r.a += c * (y.a + d * y.s);
  }
  if (x.s != x.s || y.s != y.s) r.s = std::numeric_limits<float>::quiet_NaN(); // NaN rows stay NaN
  return r;
}

//! True when a finished base-2 state is usable: finite max, positive finite sum, finite `a`.
//! s > 0, not s >= 1: the maximum's own weight 2^d may be just below 1 (see above), so a row
//! whose support is one token (top_k = 1, tiny top_p, a top-1 margin beyond ~27 nats) sums to
//! less than 1 about half the time.
RLPT_HD_FORCEINLINE bool lse2_ok(lse_state2 st) {
  return st.s > 0.0f && st.s - st.s == 0.0f && st.m - st.m == 0.0f && st.a - st.a == 0.0f;
}

//! lse (natural log) and entropy of a finished base-2 state; NaN for an unusable row.
RLPT_HD_FORCEINLINE row_result lse2_finish(lse_state2 st) {
  if (!lse2_ok(st)) return {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::quiet_NaN()};
  const float l2s = std::log2(st.s);
  return {(st.m + l2s) * detail::ln2_f, (l2s - st.a / st.s) * detail::ln2_f};
}

//! log p(target) from a base-2 state: (fma(z_t, log2e, −m) − log2 s)·ln2, the target's own shift
//! as the fold computed it, so no rounded lse enters (see lse_logp). NaN for an unusable row.
RLPT_HD_FORCEINLINE float lse2_logp(float z_target, lse_state2 st) {
  if (!lse2_ok(st)) return std::numeric_limits<float>::quiet_NaN();
  return (fmaf(z_target, detail::log2e_f, -st.m) - std::log2(st.s)) * detail::ln2_f;
}

//! The same state in natural-log units (the vocab-parallel wire format); an empty state stays
//! empty (m −inf, s 0) and a NaN one keeps s NaN. The fold's shift is m/log2e in natural units;
//! the wire's m is that rounded to float, and what the rounding lost (r, at most half an ulp of
//! m: ~3e-5 at |z| ~ 700) moves into s and a (a factor e^r = 1 + r to float precision), so
//! m + ln s is the base-2 state's lse and a one-token row scores z_t − m − ln s = 0 to an ulp.
RLPT_HD_FORCEINLINE lse_state lse2_natural(lse_state2 st) {
  if (st.s == 0.0f) return {-std::numeric_limits<float>::infinity(), 0.0f, 0.0f};
  const float m = st.m * detail::ln2_f;
  const float r = fmaf(-m, detail::log2e_f, st.m) * detail::ln2_f; // m/log2e − m, exact but for its own rounding
  const float c = 1.0f + r;
  return {m, c * st.s, c * fmaf(st.a, detail::ln2_f, r * st.s)};
}

namespace detail {

//! The dlogp a row's gradient uses, decided from the logp the forward wrote: none for a target
//! scored −inf (outside the top-k/top-p support, or logit −inf), NaN for one scored NaN (target
//! out of range or unusable row: its gradient is NaN like its logp), dlogp otherwise. Backward
//! kernels decide from this, never from the logits, which an in-place backward overwrites.
RLPT_HD_FORCEINLINE float target_dlogp(float dlogp, float logp) {
  if (dlogp == 0.0f || logp == -std::numeric_limits<float>::infinity()) return 0.0f;
  return logp != logp ? std::numeric_limits<float>::quiet_NaN() : dlogp;
}

} // namespace detail

RLPT_NAMESPACE_END
