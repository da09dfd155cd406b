// SPDX-License-Identifier: Apache-2.0
//! @file
//! Host kernel of the reverse token recurrences (GAE, discounted returns) with the whitening
//! statistics they feed taken in the same pass (fixed order, documented on whiten_sums).
//!
//! The recurrence runs backwards over each sequence in scalar fp64, two sequences side by side
//! (recurrence_rows advances two sequence_pass objects a token at a time; their carry chains
//! overlap: 5-10 %). Eight sequences in SIMD lanes over transposed 8 x 8 tiles were tried: with
//! the fused statistics in fp64 the vector step was no faster than the scalar loop on Zen 3 and
//! the tiles of eight rows a power of two apart thrash L1/L2 sets; see docs/advantage.md, Host
//! performance notes.
#pragma once

#include <rlpt/config.hpp>
#include <rlpt/advantage/common.hpp>
#include <rlpt/core/stats.hpp>
#include <rlpt/core/views.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>

#if defined(__GNUC__) || defined(__clang__)
#define RLPT_ADVANTAGE_INLINE inline __attribute__((always_inline))
#else
#define RLPT_ADVANTAGE_INLINE inline
#endif

RLPT_NAMESPACE_BEGIN
namespace detail {

//! One sequence's whitening sums. The values of the sequence that count (valid, finite) are
//! visited from its last token to its first; `shift` is the first of them (its last valid
//! value), and s1 = sum of (x - shift), s2 = sum of (x - shift)^2 are accumulated in that order
//! in fp64, each starting at +0.0 (tokens that do not count add +0.0). The shift keeps the
//! one-pass sums free of cancellation (a constant sequence has s1 = s2 = 0 exactly). A batch's
//! moments merge the sequences' moments in sequence order (Chan), whatever the thread count.
struct whiten_sums {
  double count = 0.0;
  double shift = 0.0;
  double s1 = 0.0;
  double s2 = 0.0;
};

//! (count, mean, M2) of one sequence from its sums.
inline moments moments_of(const whiten_sums& r) {
  moments m;
  if (r.count == 0.0) return m;
  const double q = r.s1 / r.count;
  m.count = r.count;
  m.mean = r.shift + q;
  const double m2 = r.s2 - r.s1 * q;
  m.m2 = m2 > 0.0 ? m2 : 0.0;
  return m;
}

namespace lanes {

// The step and the sums are written for a lane type V with mask type M (here double and bool):
// `m ? a : b` selects and `&` / `|` combine masks, so a vectorised caller (V a vector of doubles,
// M a vector of 64-bit masks, GCC/Clang vector extensions) performs the same operations per lane.
//! State of one lane of a reverse recurrence and of its whitening sums.
template <class V, class M> struct state {
  V acc, next;            // A_{t+1} and V_{t+1} as the recurrence carries them
  V count, shift, s1, s2; // whiten_sums
  M have;                 // shift is set
};

//! One token of the recurrence (documented on detail::recurrence_rows in gae.hpp): updates
//! the carry and sets the advantage and return to store (0 at masked tokens).
template <mask_mode Mode, class V, class M>
RLPT_ADVANTAGE_INLINE void step(const V& r, const V& v, const M& valid, const V& gamma, const V& gamma_lambda,
                                state<V, M>& s, V& adv, V& ret) {
  const V delta = r + gamma * s.next - v;
  const V a = delta + gamma_lambda * s.acc;
  const V zero{};
  if constexpr (Mode == mask_mode::skip) {
    s.acc = valid ? a : s.acc;
    s.next = valid ? v : s.next;
  } else if constexpr (Mode == mask_mode::zero) {
    s.acc = valid ? a : gamma * s.next + gamma_lambda * s.acc;
    s.next = valid ? v : zero;
  } else {
    s.acc = valid ? a : zero;
    s.next = valid ? v : zero;
  }
  adv = valid ? s.acc : zero;
  ret = valid ? s.acc + v : zero;
}

//! add_value's sums of x - shift once the shift is set; the count is the caller's.
template <class V, class M> RLPT_ADVANTAGE_INLINE void add_deviation(const V& x, const M& counts, state<V, M>& s) {
  const V zero{};
  const V d = counts ? x - s.shift : zero;
  s.s1 = s.s1 + d;
  s.s2 = s.s2 + d * d;
}

//! Adds value x (already rounded to float) to the whitening sums when `counts`.
template <class V, class M> RLPT_ADVANTAGE_INLINE void add_value(const V& x, const M& counts, state<V, M>& s) {
  const V zero{};
  s.shift = (counts & (s.have == M{})) ? x : s.shift;
  s.have = s.have | counts;
  s.count = s.count + (counts ? zero + 1.0 : zero);
  add_deviation(x, counts, s);
}

RLPT_ADVANTAGE_INLINE state<double, bool> start(double boot) { return {0.0, boot, 0.0, 0.0, 0.0, 0.0, false}; }

RLPT_ADVANTAGE_INLINE whiten_sums sums_of(const state<double, bool>& s) { return {s.count, s.shift, s.s1, s.s2}; }

//! One sequence's pass, from its last token to its first, a token at a time (so that a caller
//! can advance two sequences side by side: see recurrence_rows). Masked tokens after the last
//! valid one (a padded row's padding) are written 0 without stepping when a masked step would
//! leave the starting state as it is (skip mode; the other modes when the bootstrap is zero):
//! each would output 0 and add +0.0 to sums that are still +0.0. (A bootstrap of -0.0 would
//! step to +0.0, which the first valid token cannot tell apart: delta + gamma_lambda * (+0.0).)
template <mask_mode Mode, bool HasValues, bool HasMask> struct sequence_pass {
  const float* r = nullptr;
  const float* v = nullptr;
  const mask_t* m = nullptr;
  float* adv = nullptr;
  float* ret = nullptr;
  double gamma = 0.0, gamma_lambda = 0.0;
  state<double, bool> s{};
  index_t t = 0;       //!< the next token; done when < 0
  index_t counted = 0; //!< tokens counted after the shift was set

  //! Writes the trimmed padding, then runs add_value in full up to the first token that counts,
  //! which sets the shift.
  RLPT_ADVANTAGE_INLINE void begin(index_t n) {
    if constexpr (HasMask) {
      if (Mode == mask_mode::skip || s.next == 0.0) {
        const index_t live = end_of_valid(m, n);
        std::fill(adv + live, adv + n, 0.0f);
        if (ret) std::fill(ret + live, ret + n, 0.0f);
        n = live;
      }
    }
    for (index_t k = n - ahead; k < n; k += 16) prefetch(k); // the first lines the steps read
    for (t = n - 1; t >= 0 && !s.have; --t) {
      double x = 0.0;
      const bool valid = token(x);
      add_value(x, valid, s);
    }
  }
  //! One token once the shift is set: only deviations, and the count in an integer (the same
  //! count: each 1.0 was exact). The shift's test and the count's constant were 6 of ~33
  //! instructions a token.
  RLPT_ADVANTAGE_INLINE void next() {
    if ((t & 15) == 0) prefetch(t - ahead);
    double x = 0.0;
    const bool valid = token(x);
    counted += valid ? 1 : 0;
    add_deviation(x, valid, s);
    --t;
  }
  RLPT_ADVANTAGE_INLINE void finish() {
    while (t >= 0) next();
    s.count += static_cast<double>(counted);
  }

private:
  //! Tokens ahead (below t) whose lines are asked for: a row starts a new descending stream in
  //! each array, which the hardware prefetchers take a few misses to follow (and do not follow
  //! across a 4 KiB page).
  static constexpr index_t ahead = 64;
  //! Asks for the lines holding token k of the inputs and outputs (k < 0: nothing).
  RLPT_ADVANTAGE_INLINE void prefetch(index_t k) const {
#if defined(__GNUC__) || defined(__clang__)
    if (k < 0) return;
    __builtin_prefetch(r + k);
    if (HasValues) __builtin_prefetch(v + k);
    if (HasMask && (k & 63) == 0) __builtin_prefetch(m + k);
    __builtin_prefetch(adv + k, 1);
    if (ret) __builtin_prefetch(ret + k, 1);
#else
    (void)k;
#endif
  }

  //! Token t: the step, its outputs stored; x is the advantage as written. Returns whether it counts.
  RLPT_ADVANTAGE_INLINE bool token(double& x) {
    const bool valid = !HasMask || m[t] != 0;
    const double vt = HasValues ? static_cast<double>(v[t]) : 0.0;
    double a = 0.0, g = 0.0;
    const double rt = static_cast<double>(r[t]);
    step<Mode>(rt, vt, valid, gamma, gamma_lambda, s, a, g);
    const float out = static_cast<float>(a);
    adv[t] = out;
    if (ret) ret[t] = static_cast<float>(g);
    x = static_cast<double>(out);
    return valid;
  }
};

} // namespace lanes
} // namespace detail
RLPT_NAMESPACE_END
