// SPDX-License-Identifier: Apache-2.0
//! @file
//! The gather/scatter kernel of the device transports: runs one launch of a copy plan
//! (copy_plan.hpp): packs parameters into a bucket, stages or scatters a received bucket into
//! parameters with a dtype cast, or only checksums. One thread block per 64 KiB chunk of wire
//! bytes; uncast chunks move 16 bytes per thread per step, and every word's wsum64 term is
//! summed on the way (atomics on integers: the same sum in any block order).
#pragma once

#include <rlpt/config.hpp>
#include <rlpt/cuda/error.cuh>
#include <rlpt/cuda/sync/copy_plan.hpp>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>

RLPT_NAMESPACE_BEGIN
namespace sync {
namespace detail {

inline constexpr unsigned copy_threads = 256;

//! Block-wide sum of one u64 per thread; the result is valid in thread 0.
template <unsigned Threads> __device__ __forceinline__ std::uint64_t block_sum(std::uint64_t v) {
  __shared__ std::uint64_t warp_sums[Threads / 32];
  for (int o = 16; o > 0; o /= 2) v += __shfl_down_sync(0xffffffffu, v, o);
  const unsigned lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) warp_sums[warp] = v;
  __syncthreads();
  std::uint64_t total = 0;
  if (threadIdx.x == 0)
    for (unsigned w = 0; w < Threads / 32; ++w) total += warp_sums[w];
  return total;
}

//! Index of the task holding `chunk`: the last task whose chunk_begin <= chunk.
__device__ __forceinline__ std::uint64_t find_task(const copy_task* tasks, std::uint64_t n, std::uint64_t chunk) {
  std::uint64_t lo = 0, hi = n; // first index with chunk_begin > chunk
  while (lo < hi) {
    const std::uint64_t mid = (lo + hi) / 2;
    if (tasks[mid].chunk_begin <= chunk)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo - 1;
}

// A template: kernels defined in a header need vague linkage, or the host-side launch wrappers of two
// translation units that include it collide at link time.
template <int = 0>
RLPT_KERNEL void __launch_bounds__(copy_threads)
    copy_kernel(const copy_task* tasks, std::uint64_t n_tasks, std::uint64_t src_base, std::uint64_t dst_base,
                std::uint64_t* sums) {
  const std::uint64_t chunk = blockIdx.x;
  const copy_task t = tasks[find_task(tasks, n_tasks, chunk)];
  const std::uint64_t c = chunk - t.chunk_begin;
  std::uint64_t first = 0, last = 0;
  chunk_words(t, c, first, last);
  const auto* src = reinterpret_cast<const unsigned char*>(t.src + ((t.flags & copy_src_relative) ? src_base : 0));
  unsigned char* dst = (t.flags & copy_has_dst)
                           ? reinterpret_cast<unsigned char*>(t.dst + ((t.flags & copy_dst_relative) ? dst_base : 0))
                           : nullptr;
  const std::uint64_t word0 = t.wire_at / 8;
  std::uint64_t sum = 0;
  std::uint64_t w = first;
  const bool vec = t.from == t.to && (reinterpret_cast<std::uintptr_t>(src) & 15u) == 0 &&
                   (dst == nullptr || (reinterpret_cast<std::uintptr_t>(dst) & 15u) == 0);
  if (vec) {
    // Whole 16-byte pairs of words: first is even (chunks start at multiples of 64 KiB).
    const std::uint64_t full_words = wire_bytes_of(t) / 8;
    const std::uint64_t pair_end = first + ((last < full_words ? last : full_words) - first) / 2 * 2;
    const auto* s4 = reinterpret_cast<const uint4*>(src);
    auto* d4 = reinterpret_cast<uint4*>(dst);
#pragma unroll 4
    for (std::uint64_t p = first / 2 + threadIdx.x; p < pair_end / 2; p += copy_threads) {
      const uint4 v = s4[p];
      if (dst != nullptr) d4[p] = v;
      const std::uint64_t lo = (std::uint64_t{v.y} << 32) | v.x;
      const std::uint64_t hi = (std::uint64_t{v.w} << 32) | v.z;
      sum += wsum_term(lo, word0 + 2 * p) + wsum_term(hi, word0 + 2 * p + 1);
    }
    w = pair_end;
  }
  for (std::uint64_t i = w + threadIdx.x; i < last; i += copy_threads) sum += copy_word(t, src, dst, i);
  if (t.sum == no_sum) return;
  const std::uint64_t total = block_sum<copy_threads>(sum);
  if (threadIdx.x == 0 && total != 0) atomicAdd(reinterpret_cast<unsigned long long*>(sums + t.sum), total);
}

template <int = 0>
RLPT_KERNEL void __launch_bounds__(copy_threads)
    checksum_kernel(const unsigned char* p, std::uint64_t bytes, std::uint64_t* sum) {
  const std::uint64_t words = (bytes + 7) / 8;
  const std::uint64_t stride = std::uint64_t{gridDim.x} * copy_threads;
  std::uint64_t s = 0;
  for (std::uint64_t w = std::uint64_t{blockIdx.x} * copy_threads + threadIdx.x; w < words; w += stride) {
    const std::uint64_t avail = bytes - w * 8 < 8 ? bytes - w * 8 : 8;
    std::uint64_t v = 0;
    if (avail == 8)
      v = load_as<std::uint64_t>(p + w * 8);
    else
      for (std::uint64_t k = 0; k < avail; ++k) v |= std::uint64_t{p[w * 8 + k]} << (8 * k);
    s += wsum_term(v, w);
  }
  const std::uint64_t total = block_sum<copy_threads>(s);
  if (threadIdx.x == 0 && total != 0) atomicAdd(reinterpret_cast<unsigned long long*>(sum), total);
}

} // namespace detail

//! Adds the raw wsum64 of `bytes` device bytes at `data` (8-byte aligned; word indices from 0)
//! to `*sum` (device), on `stream`.
inline void run_checksum(const void* data, std::uint64_t bytes, std::uint64_t* sum, cudaStream_t stream) {
  if (bytes == 0) return;
  RLPT_CHECK(reinterpret_cast<std::uintptr_t>(data) % 8 == 0, errors::sync::bad_link,
             "checksum of unaligned device bytes at {}", data);
  const std::uint64_t words = (bytes + 7) / 8;
  const std::uint64_t blocks =
      std::min<std::uint64_t>((words + detail::copy_threads * 8 - 1) / (detail::copy_threads * 8), 4096);
  detail::checksum_kernel<><<<static_cast<unsigned>(blocks), detail::copy_threads, 0, stream>>>(
      static_cast<const unsigned char*>(data), bytes, sum);
  RLPT_CUDA_CHECK_LAUNCH();
}

//! Enqueues one launch of a copy table on `stream`: `tasks` is the device copy of the
//! table, `sums` (device) the raw wsum64 accumulators its tasks add to (zero them first).
//! Allocates nothing, never synchronises.
inline void run_copy(const detail::copy_task* tasks, const detail::copy_launch& launch, std::uint64_t src_base,
                     std::uint64_t dst_base, std::uint64_t* sums, cudaStream_t stream) {
  if (launch.chunks == 0) return;
  RLPT_CHECK(launch.chunks <= 0x7fffffffu, errors::sync::too_large,
             "a copy launch of {} chunks is more than a grid holds", launch.chunks);
  detail::copy_kernel<><<<static_cast<unsigned>(launch.chunks), detail::copy_threads, 0, stream>>>(
      tasks + launch.task_begin, launch.task_end - launch.task_begin, src_base, dst_base, sums);
  RLPT_CUDA_CHECK_LAUNCH();
}

} // namespace sync
RLPT_NAMESPACE_END
