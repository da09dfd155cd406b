// SPDX-License-Identifier: Apache-2.0
//! @file
//! Device building blocks of the logprob kernels: 16-byte row loads with a fixed column ->
//! thread assignment, the online log-sum-exp state in base-2 units, and its deterministic
//! warp/block merges.
//!
//! Determinism: column j belongs to vector q = j / VEC (VEC = 16 bytes of logits), vector q to
//! thread q % BLOCK, which folds its vectors in increasing q; threads merge in a fixed xor
//! butterfly, warps in a fixed tree. A misaligned row (or a partial last vector) is loaded
//! element by element into the same vector slots, so a row's bits never depend on its address,
//! its position in the batch or N.
#pragma once

#include <rlpt/config.hpp>
#include <rlpt/core/dtype.hpp>
#include <rlpt/core/views.hpp>
#include <rlpt/logprob/math.hpp>

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

RLPT_NAMESPACE_BEGIN
namespace detail::cuda_lp {

inline constexpr float log2e = detail::log2e_f;
inline constexpr float ln2 = detail::ln2_f;

//! Logits per 16-byte vector.
template <class T> inline constexpr int vec_width = static_cast<int>(16 / sizeof(T));

//! 16 bytes of logits as floats.
template <class T> struct fvec { float v[vec_width<T>]; };

__device__ __forceinline__ float bf16_lo(std::uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf16_hi(std::uint32_t w) { return __uint_as_float(w & 0xffff0000u); }

template <class T> __device__ __forceinline__ fvec<T> unpack(uint4 raw) {
  fvec<T> r;
  const std::uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
  if constexpr (std::is_same_v<T, float>) {
#pragma unroll
    for (int k = 0; k < 4; ++k) r.v[k] = __uint_as_float(w[k]);
  } else if constexpr (std::is_same_v<T, bf16>) {
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      r.v[2 * k] = bf16_lo(w[k]);
      r.v[2 * k + 1] = bf16_hi(w[k]);
    }
  } else if constexpr (std::is_same_v<T, f16>) {
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      r.v[2 * k] = __half2float(__ushort_as_half(static_cast<unsigned short>(w[k] & 0xffffu)));
      r.v[2 * k + 1] = __half2float(__ushort_as_half(static_cast<unsigned short>(w[k] >> 16)));
    }
  } else { // double: 2 per vector
    const double d0 = __hiloint2double(static_cast<int>(w[1]), static_cast<int>(w[0]));
    const double d1 = __hiloint2double(static_cast<int>(w[3]), static_cast<int>(w[2]));
    r.v[0] = static_cast<float>(d0);
    r.v[1] = static_cast<float>(d1);
  }
  return r;
}

//! Vector q of a row: one 16-byte load when the row is 16-byte aligned and the vector is
//! whole, element loads otherwise; columns past n read as `fill`. `stream` selects the
//! evict-first (read-once) cache policy.
template <class T, bool Stream = true>
__device__ __forceinline__ fvec<T> load_vec(const T* row, index_t q, index_t n, bool aligned, float fill) {
  constexpr int W = vec_width<T>;
  const index_t j0 = q * W;
  if (aligned && j0 + W <= n) {
    const auto* p = reinterpret_cast<const uint4*>(row + j0);
    return unpack<T>(Stream ? __ldcs(p) : __ldg(p));
  }
  fvec<T> r;
#pragma unroll
  for (int k = 0; k < W; ++k) r.v[k] = j0 + k < n ? load_logit(row[j0 + k]) : fill;
  return r;
}

//! Writes vector q of a gradient row (16-byte store when aligned and whole).
template <class G>
__device__ __forceinline__ void store_vec(G* row, index_t q, index_t n, bool aligned, const fvec<G>& g) {
  constexpr int W = vec_width<G>;
  const index_t j0 = q * W;
  if (aligned && j0 + W <= n) {
    uint4 raw;
    std::uint32_t w[4];
    if constexpr (std::is_same_v<G, float>) {
#pragma unroll
      for (int k = 0; k < 4; ++k) w[k] = __float_as_uint(g.v[k]);
    } else if constexpr (std::is_same_v<G, bf16>) {
#pragma unroll
      for (int k = 0; k < 4; ++k)
        w[k] = static_cast<std::uint32_t>(bf16_bits_rne(g.v[2 * k])) |
               (static_cast<std::uint32_t>(bf16_bits_rne(g.v[2 * k + 1])) << 16);
    } else if constexpr (std::is_same_v<G, f16>) {
#pragma unroll
      for (int k = 0; k < 4; ++k)
        w[k] = static_cast<std::uint32_t>(__half_as_ushort(__float2half_rn(g.v[2 * k]))) |
               (static_cast<std::uint32_t>(__half_as_ushort(__float2half_rn(g.v[2 * k + 1]))) << 16);
    } else {
      const double d0 = g.v[0], d1 = g.v[1];
      w[0] = static_cast<std::uint32_t>(__double2loint(d0));
      w[1] = static_cast<std::uint32_t>(__double2hiint(d0));
      w[2] = static_cast<std::uint32_t>(__double2loint(d1));
      w[3] = static_cast<std::uint32_t>(__double2hiint(d1));
    }
    raw = make_uint4(w[0], w[1], w[2], w[3]);
    __stcs(reinterpret_cast<uint4*>(row + j0), raw);
    return;
  }
#pragma unroll
  for (int k = 0; k < W; ++k)
    if (j0 + k < n) row[j0 + k] = store_grad<G>(g.v[k]);
}

template <class T> __device__ __forceinline__ bool row_aligned(const T* row) {
  return (reinterpret_cast<std::uintptr_t>(row) & 15u) == 0;
}

//! Online LSE state in base-2 units (<rlpt/logprob/math.hpp>: lse_state2 and its fold, merge
//! and finish are shared with the host, which tests them).
using state2 = lse_state2;

__device__ __forceinline__ state2 empty_state() { return lse2_empty(); }

//! Tempers one vector of raw logits in place (z = x / T; nothing at T = 1).
template <int W> __device__ __forceinline__ void temper_vec(float (&x)[W], tempering tp) {
  if (tp.identity()) return;
#pragma unroll
  for (int k = 0; k < W; ++k) x[k] = temper(x[k], tp);
}

//! Folds one vector of tempered logits into a thread's state.
template <int W> __device__ __forceinline__ void fold(state2& st, const float (&z)[W]) { lse2_fold(st, z); }

__device__ __forceinline__ state2 merge(state2 x, state2 y) { return lse2_merge(x, y); }

__device__ __forceinline__ state2 warp_merge(state2 st) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    state2 other;
    other.m = __shfl_xor_sync(0xffffffffu, st.m, o);
    other.s = __shfl_xor_sync(0xffffffffu, st.s, o);
    other.a = __shfl_xor_sync(0xffffffffu, st.a, o);
    // fixed operand order (lower lane first) so both partners compute identical bits
    const bool low = (threadIdx.x & static_cast<unsigned>(o)) == 0;
    st = low ? merge(st, other) : merge(other, st);
  }
  return st;
}

//! Block-wide merge; every thread returns the row's state. `smem` holds BLOCK / 32 states.
template <int BLOCK> __device__ __forceinline__ state2 block_merge(state2 st, state2* smem) {
  constexpr int warps = BLOCK / 32;
  st = warp_merge(st);
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  if (lane == 0) smem[warp] = st;
  __syncthreads();
  if (warp == 0) {
    state2 w = lane < warps ? smem[lane] : empty_state();
    w = warp_merge(w);
    if (lane == 0) smem[0] = w;
  }
  __syncthreads();
  const state2 r = smem[0];
  __syncthreads(); // smem is reused by the caller's next row
  return r;
}

//! lse (natural log) and entropy of a finished state; NaN for an unusable row.
__device__ __forceinline__ row_result finish(state2 st) { return lse2_finish(st); }

} // namespace detail::cuda_lp
RLPT_NAMESPACE_END
