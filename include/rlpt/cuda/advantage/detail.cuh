// SPDX-License-Identifier: Apache-2.0
//! @file
//! Device halves of the canonical reductions in <rlpt/advantage/common.hpp>: the same additions
//! in the same order as detail::canonical_sum, so group and batch statistics are bit-identical
//! to the host's. Also the launch helpers the advantage kernels share.
#pragma once

#include <rlpt/config.hpp>
#include <rlpt/advantage/common.hpp>
#include <rlpt/core/error.hpp>
#include <rlpt/core/views.hpp>
#include <rlpt/cuda/error.cuh>

#include <cuda_runtime_api.h>

#include <cstdint>

RLPT_NAMESPACE_BEGIN
namespace detail {

//! Lane mask of the W-lane tile (W = 1, 2, ..., 32) that the calling thread belongs to.
template <int W> __device__ __forceinline__ unsigned tile_lane_mask() {
  if constexpr (W == 32) {
    return 0xffffffffu;
  } else {
    const unsigned first = (threadIdx.x & 31u) / W * W;
    return ((1u << W) - 1u) << first;
  }
}

//! Butterfly over a W-lane tile with offsets W/2, ..., 1: lane l ends with the canonical tree
//! sum of the tile's partials (partial l combined with l + s for s = W/2, ..., 1). Lanes beyond
//! a group's canonical width hold +0.0, so the extra offsets add exact zeros.
template <int W> __device__ __forceinline__ double tile_sum(double v, unsigned mask) {
#pragma unroll
  for (int s = W / 2; s >= 1; s >>= 1) v = add_rn(v, __shfl_xor_sync(mask, v, s, W));
  return v;
}

template <int W> __device__ __forceinline__ long long tile_sum_int(long long v, unsigned mask) {
#pragma unroll
  for (int s = W / 2; s >= 1; s >>= 1) v += __shfl_xor_sync(mask, v, s, W);
  return v;
}

//! Canonical 256-lane tree in shared memory (detail::canonical_sum<batch_lanes>): every thread
//! of a 256-thread block passes its partial; all receive the total.
__device__ __forceinline__ double block_sum_256(double v, double* shared) {
  const unsigned t = threadIdx.x;
  shared[t] = v;
  __syncthreads();
#pragma unroll
  for (unsigned s = 128; s >= 1; s >>= 1) {
    if (t < s) shared[t] = add_rn(shared[t], shared[t + s]);
    __syncthreads();
  }
  const double total = shared[0];
  __syncthreads();
  return total;
}

__device__ __forceinline__ long long block_sum_256_int(long long v, long long* shared) {
  const unsigned t = threadIdx.x;
  shared[t] = v;
  __syncthreads();
#pragma unroll
  for (unsigned s = 128; s >= 1; s >>= 1) {
    if (t < s) shared[t] += shared[t + s];
    __syncthreads();
  }
  const long long total = shared[0];
  __syncthreads();
  return total;
}

__device__ __forceinline__ void count_into(index_t* counter, long long n) {
  if (counter != nullptr && n != 0)
    atomicAdd(reinterpret_cast<unsigned long long*>(counter), static_cast<unsigned long long>(n));
}

//! Blocks for a grid-stride loop over `items` with `per_block` items per block (capped).
inline unsigned grid_for(index_t items, index_t per_block) {
  const index_t blocks = (items + per_block - 1) / per_block;
  return static_cast<unsigned>(blocks < 1 ? 1 : blocks > (index_t{1} << 20) ? (index_t{1} << 20) : blocks);
}

} // namespace detail
RLPT_NAMESPACE_END
