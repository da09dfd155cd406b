// SPDX-License-Identifier: Apache-2.0
//! @file
//! Host row kernels of the logprob family: one read of a logits row gives its online
//! log-sum-exp state; one more read gives its gradient.
//!
//! Batch invariance: a row is cut into fixed 512-column chunks and column j always feeds lane
//! j % 16, whatever the row's address, its position in the batch, N or the thread count; lanes
//! are folded in a fixed tree. The inner loops are plain lane loops the compiler vectorises
//! without -ffast-math. On x86-64 an AVX2+FMA build of the same loops is chosen once per
//! process (__builtin_cpu_supports), and AVX-512 where the compiler can build it, so every row
//! of a process takes the same path. Every build gives the same bits: the exp's multiply-adds
//! are explicit FMAs (one rounding, whatever the ISA), and no other a·b + c is contracted (GCC:
//! optimize("fp-contract=off") on each entry point; clang: RLPT_NO_CONTRACT_BEGIN/END).
#pragma once

#include <rlpt/config.hpp>
#include <rlpt/core/cpu.hpp>
#include <rlpt/core/dtype.hpp>
#include <rlpt/core/views.hpp>
#include <rlpt/logprob/detail/simd.hpp>
#include <rlpt/logprob/math.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>

#if RLPT_ISA_DISPATCH()
#define RLPT_LOGPROB_X86_DISPATCH() 1
#define RLPT_LOGPROB_AVX2 __attribute__((target("avx2,fma"), RLPT_HOST_LOOP_ATTR))
#else
#define RLPT_LOGPROB_X86_DISPATCH() 0
#endif

// AVX-512 keeps one 16-lane pack in one register.
#if RLPT_LOGPROB_X86_DISPATCH()
#define RLPT_LOGPROB_AVX512_CLONE() 1
#define RLPT_LOGPROB_AVX512 __attribute__((target("avx512f,avx512vl,avx512bw,avx512dq"), RLPT_HOST_LOOP_ATTR))
#else
#define RLPT_LOGPROB_AVX512_CLONE() 0
#endif

RLPT_NO_CONTRACT_BEGIN
RLPT_NAMESPACE_BEGIN
namespace detail {

inline constexpr int row_chunk = 512;
inline constexpr float neg_inf_f = -std::numeric_limits<float>::infinity();

//! The build of the row kernels this process runs (chosen once, from the CPU's features).
enum class row_isa { generic, avx2, avx512 };

[[nodiscard]] inline row_isa row_kernels_isa() noexcept {
#if RLPT_LOGPROB_X86_DISPATCH()
  static const row_isa isa = !cpu_has_avx2_fma()                               ? row_isa::generic
                             : RLPT_LOGPROB_AVX512_CLONE() && cpu_has_avx512() ? row_isa::avx512
                                                                               : row_isa::avx2;
  return isa;
#else
  return row_isa::generic;
#endif
}

//! Kept-column rule of the truncated modes (also used with threshold −inf: keeps everything).
//! Bitwise operators, not && / ||, so the lane loops stay branch-free.
RLPT_HD_FORCEINLINE bool kept_column(float z, index_t j, float threshold, index_t tie_last) {
  return (z > threshold) | ((z == threshold) & (j <= tie_last));
}

// ---------------------------------------------------------------------------------------------
// Bodies, on 16-lane packs of NB-byte native vectors (always inlined into the per-ISA entry
// points below). The last partial block is padded with −inf, which contributes exactly 0.

//! Tempered logits of one 16-column block: x / T lane by lane (IEEE division, the same bits as
//! detail::temper on the host and the device); T = 1 skips it (x / 1 = x).
template <int NB> RLPT_LOGPROB_HOST_INLINE simd::vf<NB> tempered(const simd::vf<NB>& x, float t) {
  return t == 1.0f ? x : x / t;
}

//! Online LSE state of x[0, n) / t. Rescaling happens at most once per 512-column chunk.
template <int NB, class T> RLPT_LOGPROB_HOST_INLINE lse_state row_accumulate_body(const T* x, index_t n, float t) {
  namespace v = simd;
  using vf = v::vf<NB>;
  constexpr int W = v::lanes;
  vf z[row_chunk / W];
  vf s = v::splat<NB>(0.0f), a = v::splat<NB>(0.0f);
  float m = neg_inf_f;
  bool poisoned = false; // NaN seen while every value so far was -inf
  for (index_t c0 = 0; c0 < n; c0 += row_chunk) {
    const int len = static_cast<int>(std::min<index_t>(row_chunk, n - c0));
    const int blocks = (len + W - 1) / W, full = len / W;
    const T* xc = x + c0;
    vf mx = v::splat<NB>(neg_inf_f);
    for (int b = 0; b < full; ++b) {
      z[b] = tempered<NB>(v::load<NB>(xc + b * W), t);
      mx = v::max(mx, z[b]);
    }
    if (full < blocks) {
      z[full] = tempered<NB>(v::load_partial<NB>(xc + full * W, len - full * W, neg_inf_f), t);
      mx = v::max(mx, z[full]);
    }
    const float cm = v::hmax(mx);
    if (cm > m) {
      if (m != neg_inf_f) {
        vf dc; // the vector exp on a splat: the same operations as every other exp of the row
        const vf c = v::shifted_exp(v::splat<NB>(m - cm), dc);
        a = (a + s * dc) * c;
        s = s * c;
      }
      m = cm;
    }
    if (m == neg_inf_f) { // only -inf (or NaN) so far: nothing to add, but remember NaN
      for (int b = 0; b < blocks; ++b) poisoned |= v::any_nan(z[b]);
      continue;
    }
    vf cs = v::splat<NB>(0.0f), ca = v::splat<NB>(0.0f);
    for (int b = 0; b < blocks; ++b) {
      vf dc;
      const vf e = v::shifted_exp(z[b] - m, dc);
      cs += e;
      ca = v::fma(e, dc, ca);
    }
    s += cs;
    a += ca;
  }
  if (poisoned) return {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::quiet_NaN(), 0.0f};
  return {m, v::hsum(s), v::hsum(a)};
}

//! Kept-column mask of one 16-column block starting at column j0.
template <int NB, class T>
RLPT_LOGPROB_HOST_INLINE simd::vi<NB> kept_lanes(const simd::vf<NB>& z, index_t j0, float threshold, index_t tie_last) {
  namespace v = simd;
  // columns relative to j0 fit int32: vocabularies are < 2^31 (checked at the API)
  const auto rel = static_cast<std::int32_t>(std::clamp<index_t>(tie_last - j0, -1, index_t{1} << 30));
  const v::vi<NB> tie_ok = v::le_i(v::column_offsets<NB, T>(), v::splat_i<NB>(rel));
  return v::gt(z, v::splat<NB>(threshold)) | (v::eq(z, v::splat<NB>(threshold)) & tie_ok);
}

//! Σ over kept columns of exp(z − m) and exp(z − m)·(z − m), for a known row max m; writes the
//! kept mask when `kept` is not null.
template <int NB, class T>
RLPT_LOGPROB_HOST_INLINE lse_state row_accumulate_kept_body(const T* x, index_t n, float t, float m, float threshold,
                                                            index_t tie_last, mask_t* kept) {
  namespace v = simd;
  using vf = v::vf<NB>;
  constexpr int W = v::lanes;
  vf s = v::splat<NB>(0.0f), a = v::splat<NB>(0.0f);
  for (index_t c0 = 0; c0 < n; c0 += row_chunk) {
    const int len = static_cast<int>(std::min<index_t>(row_chunk, n - c0));
    vf cs = v::splat<NB>(0.0f), ca = v::splat<NB>(0.0f);
    for (int b0 = 0; b0 < len; b0 += W) {
      const int cnt = std::min(W, len - b0);
      const index_t j0 = c0 + b0;
      const vf z = tempered<NB>(cnt == W ? v::load<NB>(x + j0) : v::load_partial<NB>(x + j0, cnt, neg_inf_f), t);
      const v::vi<NB> k = kept_lanes<NB, T>(z, j0, threshold, tie_last);
      vf dc;
      const vf e = v::sel(k, v::shifted_exp(z - m, dc), v::splat<NB>(0.0f));
      cs += e;
      ca = v::fma(e, dc, ca);
      if (kept != nullptr) {
        std::int32_t kl[W];
        std::memcpy(kl, &k, sizeof kl);
        for (int l = 0; l < W; ++l) {
          const int c = v::lane_column<T>(l);
          if (c < cnt) kept[j0 + c] = kl[l] != 0 ? 1 : 0;
        }
      }
    }
    s += cs;
    a += ca;
  }
  return {m, v::hsum(s), v::hsum(a)};
}

//! dx[j] = (dlogp·(δ_{j,target} − p_j) − dentropy·p_j·(log p_j + H)) / T over kept columns,
//! 0 elsewhere (target < 0: no one-hot term). x and dx may be the same memory (in-place
//! backward): each block is read before it is written.
template <int NB, class T, class G, bool Truncated>
RLPT_LOGPROB_HOST_INLINE void row_backward_body(const T* x, G* dx, index_t n, float t, float lse, float entropy,
                                                float dlogp, float dentropy, float threshold, index_t tie_last,
                                                index_t target) {
  namespace v = simd;
  using vf = v::vf<NB>;
  constexpr int W = v::lanes;
  const float gl = dlogp / t, gh = dentropy / t;
  const v::vi<NB> cols = v::column_offsets<NB, T>();
  for (index_t j0 = 0; j0 < n; j0 += W) {
    const int cnt = static_cast<int>(std::min<index_t>(W, n - j0));
    const vf z = tempered<NB>(cnt == W ? v::load<NB>(x + j0) : v::load_partial<NB>(x + j0, cnt, 0.0f), t);
    vf lpc;
    const vf p = v::shifted_exp(z - lse, lpc);
    vf g = v::splat<NB>(0.0f) - p * v::fma(lpc + entropy, v::splat<NB>(gh), gl);
    if (target >= j0 && target < j0 + W)
      g = v::sel(v::eq_i(cols, v::splat_i<NB>(static_cast<std::int32_t>(target - j0))), g + gl, g);
    if constexpr (Truncated) g = v::sel(kept_lanes<NB, T>(z, j0, threshold, tie_last), g, v::splat<NB>(0.0f));
    if (cnt == W) {
      v::store<NB, T>(dx + j0, g);
    } else {
      v::store_partial<NB, T>(dx + j0, g, cnt);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Per-ISA entry points: the bodies above, instantiated for one native width under one target.

#define RLPT_LOGPROB_ROW_ENTRIES(isa, NB, ...)                                                                         \
  template <class T> __VA_ARGS__ lse_state row_accumulate_##isa(const T* x, index_t n, float t) {                      \
    return row_accumulate_body<NB>(x, n, t);                                                                           \
  }                                                                                                                    \
  template <class T>                                                                                                   \
  __VA_ARGS__ lse_state row_accumulate_kept_##isa(const T* x, index_t n, float t, float m, float thr, index_t tie,     \
                                                  mask_t* kept) {                                                      \
    return row_accumulate_kept_body<NB>(x, n, t, m, thr, tie, kept);                                                   \
  }                                                                                                                    \
  template <class T, class G, bool Tr>                                                                                 \
  __VA_ARGS__ void row_backward_##isa(const T* x, G* dx, index_t n, float t, float lse, float h, float glp, float gh,  \
                                      float thr, index_t tie, index_t target) {                                        \
    row_backward_body<NB, T, G, Tr>(x, dx, n, t, lse, h, glp, gh, thr, tie, target);                                   \
  }

RLPT_LOGPROB_ROW_ENTRIES(generic, simd::baseline_bytes, __attribute__((RLPT_HOST_LOOP_ATTR)))
#if RLPT_LOGPROB_X86_DISPATCH()
RLPT_LOGPROB_ROW_ENTRIES(avx2, 32, RLPT_LOGPROB_AVX2)
#endif
#if RLPT_LOGPROB_AVX512_CLONE()
RLPT_LOGPROB_ROW_ENTRIES(avx512, 64, RLPT_LOGPROB_AVX512)
#endif
#undef RLPT_LOGPROB_ROW_ENTRIES

// The build is chosen once per process: the branch per row is always predicted.
#if RLPT_LOGPROB_AVX512_CLONE()
#define RLPT_LOGPROB_ROW_DISPATCH(fn, ...)                                                                             \
  if (row_kernels_isa() == row_isa::avx512) return fn##_avx512 __VA_ARGS__;                                            \
  if (row_kernels_isa() == row_isa::avx2) return fn##_avx2 __VA_ARGS__;                                                \
  return fn##_generic __VA_ARGS__
#elif RLPT_LOGPROB_X86_DISPATCH()
#define RLPT_LOGPROB_ROW_DISPATCH(fn, ...)                                                                             \
  if (row_kernels_isa() == row_isa::avx2) return fn##_avx2 __VA_ARGS__;                                                \
  return fn##_generic __VA_ARGS__
#else
#define RLPT_LOGPROB_ROW_DISPATCH(fn, ...) return fn##_generic __VA_ARGS__
#endif

//! Online LSE state of one row of logits / t (t: the temperature).
template <class T> lse_state row_accumulate(const T* x, index_t n, float t) {
  RLPT_LOGPROB_ROW_DISPATCH(row_accumulate, (x, n, t));
}

//! LSE state over the kept columns of a row whose max is m (truncated modes).
template <class T>
lse_state row_accumulate_kept(const T* x, index_t n, float t, float m, float thr, index_t tie, mask_t* kept) {
  RLPT_LOGPROB_ROW_DISPATCH(row_accumulate_kept, (x, n, t, m, thr, tie, kept));
}

//! Gradient of one row (target < 0: no one-hot term, e.g. the target lives on another shard).
//! Until the backward mapped a fresh gradient's pages ahead of its rows (from_logits.hpp), 32-bit
//! gradients took the AVX2 build on AVX-512 CPUs: with a page fault among the stores every 4 KiB
//! the AVX-512 rows ran 20 % slower on a 2-vCPU Xeon. With the pages mapped first the AVX-512
//! build is the faster one (4096 x 32768 f32 forward + backward on an AMD EPYC: 241-286 against
//! 256-384 ms, docs/performance.md).
template <class T, class G, bool Truncated>
void row_backward(const T* x, G* dx, index_t n, float t, float lse, float h, float glp, float gh, float thr,
                  index_t tie, index_t target) {
  RLPT_LOGPROB_ROW_DISPATCH(row_backward, <T, G, Truncated>(x, dx, n, t, lse, h, glp, gh, thr, tie, target));
}
#undef RLPT_LOGPROB_ROW_DISPATCH

} // namespace detail
RLPT_NAMESPACE_END
RLPT_NO_CONTRACT_END
