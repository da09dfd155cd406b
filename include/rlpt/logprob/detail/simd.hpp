// SPDX-License-Identifier: Apache-2.0
//! @file
//! A 16-lane float pack for the host row kernels, built from native vectors of NB bytes
//! (GCC/Clang vector extensions: NB = 16 for SSE2, 32 for AVX2, 64 for AVX-512; compilers
//! scalarise vectors wider than the target's registers) or from plain scalars on other compilers.
//!
//! Every block of 16 columns maps to the 16 logical lanes by a fixed permutation (identity for
//! 32-bit logits; even columns then odd columns for 16-bit ones, which widen without shuffles),
//! and lanes are reduced in a fixed tree: a row's result never depends on its address, on the
//! batch or on the thread count.
#pragma once

#include <rlpt/config.hpp>
#include <rlpt/core/dtype.hpp>
#include <rlpt/core/exp.hpp>
#include <rlpt/logprob/math.hpp>

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#if (defined(__GNUC__) || defined(__clang__)) && !defined(RLPT_LOGPROB_NO_VECTOR_EXT)
#define RLPT_LOGPROB_VECTOR_EXT() 1
#else
#define RLPT_LOGPROB_VECTOR_EXT() 0
#endif

// Host only, also under nvcc (device code has no vector types).
#if defined(__GNUC__) || defined(__clang__)
#define RLPT_LOGPROB_HOST_INLINE inline __attribute__((always_inline))
#else
#define RLPT_LOGPROB_HOST_INLINE inline
#endif

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi" // vectors only travel between always-inlined helpers
#endif

RLPT_NO_CONTRACT_BEGIN
RLPT_NAMESPACE_BEGIN
namespace detail::simd {

inline constexpr int lanes = 16;

template <int NB> struct native;
#if RLPT_LOGPROB_VECTOR_EXT()
template <> struct native<16> {
  using f = float __attribute__((vector_size(16)));
  using i = std::int32_t __attribute__((vector_size(16)));
  using u = std::uint32_t __attribute__((vector_size(16)));
};
template <> struct native<32> {
  using f = float __attribute__((vector_size(32)));
  using i = std::int32_t __attribute__((vector_size(32)));
  using u = std::uint32_t __attribute__((vector_size(32)));
};
template <> struct native<64> {
  using f = float __attribute__((vector_size(64)));
  using i = std::int32_t __attribute__((vector_size(64)));
  using u = std::uint32_t __attribute__((vector_size(64)));
};
#endif
template <> struct native<4> { // scalar fallback
  using f = float;
  using i = std::int32_t;
  using u = std::uint32_t;
};

//! 16 logical lanes of element type E as 64 / NB native vectors.
template <class N, int NB> struct pack {
  static constexpr int parts = 64 / NB;
  N p[parts];
};

template <int NB> using vf = pack<typename native<NB>::f, NB>;
template <int NB> using vi = pack<typename native<NB>::i, NB>;
template <int NB> using vu = pack<typename native<NB>::u, NB>;

#define RLPT_LOGPROB_PACK_OP(op)                                                                                       \
  template <class N, int NB>                                                                                           \
  RLPT_LOGPROB_HOST_INLINE pack<N, NB> operator op(const pack<N, NB>& a, const pack<N, NB>& b) {                       \
    pack<N, NB> r;                                                                                                     \
    for (int k = 0; k < pack<N, NB>::parts; ++k) r.p[k] = a.p[k] op b.p[k];                                            \
    return r;                                                                                                          \
  }                                                                                                                    \
  template <class N, int NB, class S>                                                                                  \
    requires std::is_arithmetic_v<S> RLPT_LOGPROB_HOST_INLINE pack<N, NB>                                              \
  operator op(const pack<N, NB>& a, S s) {                                                                             \
    pack<N, NB> r;                                                                                                     \
    for (int k = 0; k < pack<N, NB>::parts; ++k) r.p[k] = a.p[k] op s;                                                 \
    return r;                                                                                                          \
  }
RLPT_LOGPROB_PACK_OP(+)
RLPT_LOGPROB_PACK_OP(-)
RLPT_LOGPROB_PACK_OP(*)
RLPT_LOGPROB_PACK_OP(/)
RLPT_LOGPROB_PACK_OP(&)
RLPT_LOGPROB_PACK_OP(|)
#undef RLPT_LOGPROB_PACK_OP

template <class N, int NB> RLPT_LOGPROB_HOST_INLINE pack<N, NB>& operator+=(pack<N, NB>& a, const pack<N, NB>& b) {
  return a = a + b;
}
template <class N, int NB> RLPT_LOGPROB_HOST_INLINE pack<N, NB> operator<<(const pack<N, NB>& a, int s) {
  pack<N, NB> r;
  for (int k = 0; k < pack<N, NB>::parts; ++k) r.p[k] = a.p[k] << s;
  return r;
}
template <class N, int NB> RLPT_LOGPROB_HOST_INLINE pack<N, NB> operator>>(const pack<N, NB>& a, int s) {
  pack<N, NB> r;
  for (int k = 0; k < pack<N, NB>::parts; ++k) r.p[k] = a.p[k] >> s;
  return r;
}

template <int NB> RLPT_LOGPROB_HOST_INLINE vf<NB> splat(float x) {
  vf<NB> r;
  for (auto& e : r.p) e = typename native<NB>::f{} + x;
  return r;
}
template <int NB> RLPT_LOGPROB_HOST_INLINE vi<NB> splat_i(std::int32_t x) {
  vi<NB> r;
  for (auto& e : r.p) e = typename native<NB>::i{} + x;
  return r;
}

//! Lane masks: all ones or zero per lane (scalar fallback: 1 or 0, used the same way).
#define RLPT_LOGPROB_PACK_CMP(name, op, In)                                                                            \
  template <int NB> RLPT_LOGPROB_HOST_INLINE vi<NB> name(const In<NB>& a, const In<NB>& b) {                           \
    vi<NB> r;                                                                                                          \
    for (int k = 0; k < vi<NB>::parts; ++k) r.p[k] = static_cast<typename native<NB>::i>(a.p[k] op b.p[k]);            \
    return r;                                                                                                          \
  }
RLPT_LOGPROB_PACK_CMP(lt, <, vf)
RLPT_LOGPROB_PACK_CMP(gt, >, vf)
RLPT_LOGPROB_PACK_CMP(eq, ==, vf)
RLPT_LOGPROB_PACK_CMP(le_i, <=, vi)
RLPT_LOGPROB_PACK_CMP(eq_i, ==, vi)
RLPT_LOGPROB_PACK_CMP(gt_u, >, vu)
RLPT_LOGPROB_PACK_CMP(ge_u, >=, vu)
#undef RLPT_LOGPROB_PACK_CMP

template <int NB, class N>
RLPT_LOGPROB_HOST_INLINE pack<N, NB> sel(const vi<NB>& m, const pack<N, NB>& a, const pack<N, NB>& b) {
  pack<N, NB> r;
  for (int k = 0; k < pack<N, NB>::parts; ++k) r.p[k] = m.p[k] ? a.p[k] : b.p[k];
  return r;
}

template <class To, class From> RLPT_LOGPROB_HOST_INLINE To bitcast(const From& x) {
  static_assert(sizeof(To) == sizeof(From));
  To r;
  std::memcpy(&r, &x, sizeof r);
  return r;
}
template <int NB> RLPT_LOGPROB_HOST_INLINE vf<NB> as_f(const vi<NB>& x) { return bitcast<vf<NB>>(x); }
template <int NB> RLPT_LOGPROB_HOST_INLINE vf<NB> as_f(const vu<NB>& x) { return bitcast<vf<NB>>(x); }
template <int NB> RLPT_LOGPROB_HOST_INLINE vu<NB> as_u(const vf<NB>& x) { return bitcast<vu<NB>>(x); }
template <int NB> RLPT_LOGPROB_HOST_INLINE vi<NB> as_i(const vu<NB>& x) { return bitcast<vi<NB>>(x); }
template <int NB> RLPT_LOGPROB_HOST_INLINE vu<NB> as_u(const vi<NB>& x) { return bitcast<vu<NB>>(x); }

//! Logical lanes in memory order (part 0 first).
template <int NB> RLPT_LOGPROB_HOST_INLINE void to_array(const vf<NB>& x, float (&out)[lanes]) {
  std::memcpy(out, &x, sizeof out);
}
template <int NB> RLPT_LOGPROB_HOST_INLINE vf<NB> from_array(const float (&in)[lanes]) {
  vf<NB> r;
  std::memcpy(&r, in, sizeof r);
  return r;
}
template <int NB> RLPT_LOGPROB_HOST_INLINE vi<NB> from_array_i(const std::int32_t (&in)[lanes]) {
  vi<NB> r;
  std::memcpy(&r, in, sizeof r);
  return r;
}

// --- column layout of a 16-column block ------------------------------------------------------

//! Logical lane -> column offset within its 16-column block, for logits of type T.
template <class T> RLPT_LOGPROB_HOST_INLINE constexpr int lane_column(int l) {
  if constexpr (sizeof(T) == 2)
    return l < 8 ? 2 * l : 2 * (l - 8) + 1;
  else
    return l;
}
template <int NB, class T> RLPT_LOGPROB_HOST_INLINE vi<NB> column_offsets() {
  std::int32_t c[lanes];
  for (int l = 0; l < lanes; ++l) c[l] = lane_column<T>(l);
  return from_array_i<NB>(c);
}

// --- loads ----------------------------------------------------------------------------------

//! 16 consecutive 16-bit values as 32-bit lanes: low halves (even columns) in lanes 0..7, high
//! halves (odd columns) in lanes 8..15, value in the low 16 bits.
template <int NB> RLPT_LOGPROB_HOST_INLINE vu<NB> load_halves(const void* p) {
  using U = typename native<NB>::u;
  constexpr int per = NB / 4;   // 32-bit words per native vector
  if constexpr (per == lanes) { // one vector holds all 16 lanes: widen 8 words, then join the halves
    using H = typename native<32>::u;
    H w;
    std::memcpy(&w, p, sizeof w);
    const H lo = w & 0xffffu, hi = w >> 16;
    return {__builtin_shufflevector(lo, hi, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15)};
  } else {
    U words[8 / per];
    for (int k = 0; k < 8 / per; ++k) std::memcpy(&words[k], static_cast<const char*>(p) + std::ptrdiff_t{k} * NB, NB);
    vu<NB> r;
    constexpr int half = vu<NB>::parts / 2;
    for (int k = 0; k < half; ++k) {
      r.p[k] = words[k] & 0xffffu;
      r.p[half + k] = words[k] >> 16;
    }
    return r;
  }
}

template <int NB> RLPT_LOGPROB_HOST_INLINE vf<NB> load(const float* p) {
  vf<NB> r;
  for (int k = 0; k < vf<NB>::parts; ++k) std::memcpy(&r.p[k], p + std::ptrdiff_t{k} * (NB / 4), NB);
  return r;
}
template <int NB> RLPT_LOGPROB_HOST_INLINE vf<NB> load(const double* p) {
  float t[lanes];
  for (int l = 0; l < lanes; ++l) t[l] = static_cast<float>(p[l]);
  return from_array<NB>(t);
}
template <int NB> RLPT_LOGPROB_HOST_INLINE vf<NB> load(const bf16* p) { return as_f(load_halves<NB>(p) << 16); }
template <int NB> RLPT_LOGPROB_HOST_INLINE vf<NB> load(const f16* p) {
  const vu<NB> w = load_halves<NB>(p);
  const vu<NB> em = w & 0x7fffu;
  const vu<NB> sign = (w & 0x8000u) << 16;
  const vf<NB> scaled = as_f(em << 13) * 5.192296858534828e33f; // × 2^112 rebiases 15 -> 127
  const vu<NB> special = (em << 13) | 0x7f800000u;
  vu<NB> lim;
  for (auto& e : lim.p) e = typename native<NB>::u{} + 0x7c00u;
  const vf<NB> mag = sel(ge_u(em, lim), as_f(special), scaled);
  return as_f(as_u(mag) | sign);
}

//! Loads the first `len` (< 16) columns; lanes of the other columns get `fill`.
template <int NB, class T> RLPT_LOGPROB_HOST_INLINE vf<NB> load_partial(const T* p, int len, float fill) {
  alignas(64) T buf[lanes]{};
  std::memcpy(buf, p, sizeof(T) * static_cast<std::size_t>(len));
  const vf<NB> r = load<NB>(static_cast<const T*>(buf));
  return sel(le_i(splat_i<NB>(len), column_offsets<NB, T>()), splat<NB>(fill), r);
}

// --- stores ---------------------------------------------------------------------------------

//! Stores 16 lanes laid out as logits of type L (see lane_column) into 16 consecutive G's.
//! Fast paths: f32 -> f32 and 16-bit -> bf16 (the in-place cases); the rest goes lane by lane.
template <int NB, class L, class G> RLPT_LOGPROB_HOST_INLINE void store(G* p, const vf<NB>& x) {
  if constexpr (sizeof(L) == 4 && std::is_same_v<G, float>) {
    for (int k = 0; k < vf<NB>::parts; ++k) std::memcpy(p + k * (NB / 4), &x.p[k], NB);
  } else if constexpr (sizeof(L) == 2 && std::is_same_v<G, bf16>) {
    // round to nearest even, NaN kept quiet: the bits rlpt::bf16(float) gives
    const vu<NB> u = as_u(x);
    const vu<NB> rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    const vu<NB> quiet = (u >> 16) | 0x40u;
    vu<NB> inf;
    for (auto& e : inf.p) e = typename native<NB>::u{} + 0x7f800000u;
    const vu<NB> r = sel(gt_u(u & 0x7fffffffu, inf), quiet, rounded);
    using U = typename native<NB>::u;
    constexpr int half = vu<NB>::parts / 2;
    if constexpr (half == 0) { // one vector holds all 16 lanes: pack its halves into 8 words
      const auto lo = __builtin_shufflevector(r.p[0], r.p[0], 0, 1, 2, 3, 4, 5, 6, 7);
      const auto hi = __builtin_shufflevector(r.p[0], r.p[0], 8, 9, 10, 11, 12, 13, 14, 15);
      const auto w = lo | (hi << 16);
      std::memcpy(p, &w, sizeof w);
    } else {
      for (int k = 0; k < half; ++k) {
        const U w = r.p[k] | (r.p[half + k] << 16);
        std::memcpy(reinterpret_cast<char*>(p) + std::ptrdiff_t{k} * NB, &w, NB);
      }
    }
  } else {
    float t[lanes];
    to_array(x, t);
    for (int l = 0; l < lanes; ++l) p[lane_column<L>(l)] = store_grad<G>(t[l]);
  }
}

template <int NB, class L, class G> RLPT_LOGPROB_HOST_INLINE void store_partial(G* p, const vf<NB>& x, int len) {
  alignas(64) G buf[lanes];
  store<NB, L>(buf, x);
  std::memcpy(p, buf, sizeof(G) * static_cast<std::size_t>(len));
}

// --- math -----------------------------------------------------------------------------------

//! a·b + c rounded once, lane by lane. The lane loop becomes one FMA instruction per native
//! vector where the target has FMA (the AVX2 and AVX-512 builds of the row kernels); elsewhere
//! each lane calls fmaf, slower but the same bits, so every build of a row gives one result.
template <int NB> RLPT_LOGPROB_HOST_INLINE vf<NB> fma(const vf<NB>& a, const vf<NB>& b, const vf<NB>& c) {
  float x[lanes], y[lanes], z[lanes];
  to_array(a, x);
  to_array(b, y);
  to_array(c, z);
  for (int l = 0; l < lanes; ++l) x[l] = std::fma(x[l], y[l], z[l]);
  return from_array<NB>(x);
}
template <int NB> RLPT_LOGPROB_HOST_INLINE vf<NB> fma(const vf<NB>& a, const vf<NB>& b, float c) {
  return fma(a, b, splat<NB>(c));
}

//! exp(x) for x already in [exp_consts::lo, exp_consts::hi]: core's exp_reduced
//! (core/exp.hpp) step by step on each lane, the same bits (tests/core/test_exp.cpp).
template <int NB> RLPT_LOGPROB_HOST_INLINE vf<NB> exp_reduced(const vf<NB>& x) {
  namespace k = exp_consts;
  const vf<NB> t = fma(x, splat<NB>(k::log2e), k::shift);
  const vf<NB> nf = t - k::shift;
  const vf<NB> r = fma(nf, splat<NB>(-k::ln2_lo), fma(nf, splat<NB>(-k::ln2_hi), x));
  vf<NB> p = fma(splat<NB>(k::c6), r, k::c5);
  p = fma(p, r, k::c4);
  p = fma(p, r, k::c3);
  p = fma(p, r, k::c2);
  p = fma(p, r, 1.0f);
  const vf<NB> e = fma(p, r, 1.0f);
  return e * as_f(as_u(t) << 23);
}

//! exp(x) as core's exp_poly: 0 below exp_consts::lo, clamped above exp_consts::hi, NaN kept.
template <int NB> RLPT_LOGPROB_HOST_INLINE vf<NB> exp(const vf<NB>& x0) {
  const vi<NB> under = lt(x0, splat<NB>(exp_consts::lo));
  vf<NB> x = sel(under, splat<NB>(exp_consts::lo), x0);
  x = sel(gt(x, splat<NB>(exp_consts::hi)), splat<NB>(exp_consts::hi), x);
  return sel(under, splat<NB>(0.0f), exp_reduced(x));
}

//! exp(d) for a shift d ≤ 0 (the vector form of detail::shifted_exp): d < −87 gives exactly 0;
//! dc = d clamped at −87.
template <int NB> RLPT_LOGPROB_HOST_INLINE vf<NB> shifted_exp(const vf<NB>& d, vf<NB>& dc) {
  const vi<NB> low = lt(d, splat<NB>(exp_consts::lo));
  dc = sel(low, splat<NB>(exp_consts::lo), d);
  return sel(low, splat<NB>(0.0f), exp_reduced(dc));
}

template <int NB> RLPT_LOGPROB_HOST_INLINE vf<NB> max(const vf<NB>& a, const vf<NB>& b) { return sel(gt(b, a), b, a); }

template <int NB> RLPT_LOGPROB_HOST_INLINE float hmax(const vf<NB>& x) {
  float t[lanes];
  to_array(x, t);
  float m = t[0];
  for (int i = 1; i < lanes; ++i) m = t[i] > m ? t[i] : m;
  return m;
}

//! Σ lanes in a fixed pairwise tree.
template <int NB> RLPT_LOGPROB_HOST_INLINE float hsum(const vf<NB>& x) {
  float t[lanes];
  to_array(x, t);
  for (int w = lanes / 2; w > 0; w /= 2)
    for (int l = 0; l < w; ++l) t[l] += t[l + w];
  return t[0];
}

template <int NB> RLPT_LOGPROB_HOST_INLINE bool any_nan(const vf<NB>& x) {
  float t[lanes];
  to_array(x, t);
  bool r = false;
  for (float e : t) r |= e != e;
  return r;
}

//! The native width the generic (baseline ISA) build uses.
#if RLPT_LOGPROB_VECTOR_EXT()
inline constexpr int baseline_bytes = 16;
#else
inline constexpr int baseline_bytes = 4;
#endif

} // namespace detail::simd
RLPT_NAMESPACE_END
RLPT_NO_CONTRACT_END

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
