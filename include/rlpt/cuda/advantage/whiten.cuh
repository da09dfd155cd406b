// SPDX-License-Identifier: Apache-2.0
//! @file
//! Masked whitening on the device, in the same three steps as the host (whiten_moments,
//! merge, whiten_apply) so that a distributed job can put an all-gather of the per-rank
//! (count, mean, M2) in between (see <rlpt/cuda/advantage/nccl.cuh>). The statistics never leave
//! the device: whiten_apply reads them from device memory, so nothing synchronises.
//!
//! The tokens of a layout are walked as one flat range (token k of a padded layout is slot
//! (k / T)·stride + k % T; a packed layout's tokens are its slots [offsets[0], offsets[B])), cut
//! into fixed chunks of whiten_chunk tokens whatever the sequences are: about a thousand
//! 256-thread blocks at 1024 x 8192 or 8192 x 1024, each thread reading every 256th token of its
//! chunk (coalesced). Moments are computed two-pass in fp64 per chunk (the second pass re-reads
//! the chunk from cache) and merged in a fixed tree, so the same input gives the same bits on
//! every run and every GPU. They agree with the host's to fp64 rounding, not bit for bit.
#pragma once

#include <rlpt/config.hpp>
#include <rlpt/advantage/tokens.hpp>
#include <rlpt/advantage/whiten.hpp>
#include <rlpt/core/error.hpp>
#include <rlpt/core/layout.hpp>
#include <rlpt/core/stats.hpp>
#include <rlpt/core/views.hpp>
#include <rlpt/cuda/advantage/detail.cuh>
#include <rlpt/cuda/error.cuh>
#include <rlpt/cuda/workspace.cuh>

#include <cuda_runtime_api.h>

#include <algorithm>

RLPT_NAMESPACE_BEGIN

//! Whitening options with the raising policies replaced (device kernels cannot throw):
//! non-finite values are left out, and fewer than 2 valid values mean std 1.
[[nodiscard]] inline whiten_options device_policies(whiten_options o) {
  o.on_nonfinite = nonfinite::mask;
  o.on_too_few = too_few::unit_std;
  return o;
}

namespace detail {

//! Tokens per block of the moments kernel (a function of nothing but this constant and the
//! layout's token count, so the reduction order is fixed per layout).
inline constexpr index_t whiten_chunk = 8192;

//! A layout's tokens as one flat range (see the file comment). `end` bounds the token index;
//! packed layouts additionally skip slots outside [offsets[0], offsets[B]) (read on the device).
struct flat_tokens {
  index_t end;            // padded: B·T tokens; packed: storage slots
  index_t seq_len;        // padded T
  index_t stride;         // padded row stride
  bool direct;            // token k is slot k (packed, or padded with stride == T)
  const index_t* offsets; // packed: B + 1 offsets (device memory); null for padded
  index_t num_seqs;

  [[nodiscard]] static flat_tokens of(const device_token_layout& l) {
    if (l.is_packed()) return {l.storage_size(), 0, 0, true, l.offsets(), l.num_seqs()};
    return {l.num_seqs() * l.max_len(), l.max_len(), l.row_stride(), l.row_stride() == l.max_len(), nullptr, 0};
  }
  //! Token range [lo, hi) of the whole layout (packed: read from the offsets).
  __device__ __forceinline__ void bounds(index_t& lo, index_t& hi) const {
    lo = 0;
    hi = end;
    if (offsets != nullptr) {
      lo = offsets[0];
      hi = offsets[num_seqs] < end ? offsets[num_seqs] : end;
    }
  }
  __device__ __forceinline__ index_t slot(index_t k) const { return direct ? k : k / seq_len * stride + k % seq_len; }
};

//! Blocks of the moments kernel for a layout (one moments partial each).
inline index_t whiten_blocks(const device_token_layout& l) {
  return std::max<index_t>(1, (flat_tokens::of(l).end + whiten_chunk - 1) / whiten_chunk);
}

template <int = 0> // a template: a kernel defined in a header must not clash across TUs
RLPT_KERNEL void __launch_bounds__(256)
    whiten_partials_kernel(flat_tokens f, const float* x, const mask_t* m, moments* parts) {
  __shared__ double shared[256];
  __shared__ long long shared_count[256];
  index_t lo = 0, hi = 0;
  f.bounds(lo, hi);
  const index_t k0 = static_cast<index_t>(blockIdx.x) * whiten_chunk;
  const index_t k1 = k0 + whiten_chunk < hi ? k0 + whiten_chunk : hi;
  const index_t start = (k0 > lo ? k0 : lo) + static_cast<index_t>(threadIdx.x);
  long long c = 0;
  double s = 0.0;
#pragma unroll 4
  for (index_t k = start; k < k1; k += 256) {
    const index_t i = f.slot(k);
    const float v = x[i];
    if (valid_at(m, i) && finite(v)) {
      ++c;
      s += static_cast<double>(v);
    }
  }
  c = block_sum_256_int(c, shared_count);
  s = block_sum_256(s, shared);
  const double count = static_cast<double>(c);
  const double mean = c > 0 ? s / count : 0.0;
  double q = 0.0;
#pragma unroll 4
  for (index_t k = start; k < k1; k += 256) { // the same tokens again, from cache
    const index_t i = f.slot(k);
    const float v = x[i];
    if (valid_at(m, i) && finite(v)) {
      const double d = static_cast<double>(v) - mean;
      q += d * d;
    }
  }
  q = block_sum_256(q, shared);
  if (threadIdx.x == 0) parts[blockIdx.x] = moments{count, mean, q};
}

//! Merges n moments in a fixed order: thread t folds parts t, t + 256, ...; then a 256-lane tree.
template <int = 0>
RLPT_KERNEL void __launch_bounds__(256) merge_moments_kernel(const moments* parts, index_t n, moments* out) {
  // moments has default member initialisers, which __shared__ variables may not have: plain arrays.
  __shared__ double count[256], mean[256], m2[256];
  moments acc;
  for (index_t k = threadIdx.x; k < n; k += 256) acc.merge(parts[k]);
  count[threadIdx.x] = acc.count;
  mean[threadIdx.x] = acc.mean;
  m2[threadIdx.x] = acc.m2;
  __syncthreads();
  for (unsigned s = 128; s >= 1; s >>= 1) {
    if (threadIdx.x < s) {
      moments a{count[threadIdx.x], mean[threadIdx.x], m2[threadIdx.x]};
      a.merge(moments{count[threadIdx.x + s], mean[threadIdx.x + s], m2[threadIdx.x + s]});
      count[threadIdx.x] = a.count;
      mean[threadIdx.x] = a.mean;
      m2[threadIdx.x] = a.m2;
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) *out = moments{count[0], mean[0], m2[0]};
}

//! Tokens per thread of the apply kernel's grid (grid-stride beyond it).
inline constexpr index_t whiten_apply_per_thread = 8;

template <int = 0>
RLPT_KERNEL void __launch_bounds__(256)
    whiten_apply_kernel(flat_tokens f, const float* x, const mask_t* m, float* out, const moments* stats,
                        whiten_options o, index_t* nonfinite_count) {
  const moments st = *stats;
  const whiten_transform tr = whiten_from(st.count, st.mean, st.m2, o);
  index_t lo = 0, hi = 0;
  f.bounds(lo, hi);
  long long bad = 0;
  const index_t step = static_cast<index_t>(gridDim.x) * blockDim.x;
#pragma unroll 4
  for (index_t k = lo + static_cast<index_t>(blockIdx.x) * blockDim.x + threadIdx.x; k < hi; k += step) {
    const index_t i = f.slot(k);
    float y = 0.0f;
    if (valid_at(m, i)) {
      const float v = x[i];
      if (finite(v))
        y = whiten_value(v, tr);
      else
        ++bad;
    }
    out[i] = y;
  }
  count_into(nonfinite_count, bad);
}

inline void check_device_whiten(const whiten_options& o) {
  check_whiten_options(o);
  RLPT_CHECK(o.on_nonfinite == nonfinite::mask && o.on_too_few == too_few::unit_std, errors::advantage::device_policy,
             "device whitening cannot raise from a kernel: pass rlpt::device_policies(options) (non-finite values are "
             "left out, fewer than 2 valid values use std 1) and check the moments' count");
}

} // namespace detail

//! (count, mean, M2) of the valid, finite values, written to stats[0] in device memory.
//! Workspace: one moments per chunk of sequences (size query when ws.data is null).
inline void whiten_moments(const device_token_layout& layout, device_view<const float> x,
                           device_view<const mask_t> mask, device_view<moments> stats, workspace& ws,
                           cudaStream_t stream) {
  layout.expect_tokens("values", x);
  if (!mask.empty()) layout.expect_tokens("mask", mask);
  detail::expect_size("stats", stats.size(), 1, "one moments struct");
  const index_t chunks = detail::whiten_blocks(layout);
  detail::workspace_carver carve(ws);
  moments* parts = carve.take<moments>(static_cast<std::size_t>(chunks));
  if (carve.finish_size_query()) return;
  if (layout.num_seqs() == 0) {
    RLPT_CUDA_CHECK(cudaMemsetAsync(stats.data(), 0, sizeof(moments), stream));
    return;
  }
  RLPT_CHECK(chunks < (index_t{1} << 31), errors::advantage::bad_shape,
             "{} tokens exceed the whitening grid (2^31 - 1 blocks of {})", detail::flat_tokens::of(layout).end,
             detail::whiten_chunk);
  detail::whiten_partials_kernel<<<static_cast<unsigned>(chunks), 256, 0, stream>>>(
      detail::flat_tokens::of(layout), x.data(), mask.empty() ? nullptr : mask.data(), parts);
  RLPT_CUDA_CHECK_LAUNCH();
  detail::merge_moments_kernel<<<1, 256, 0, stream>>>(parts, chunks, stats.data());
  RLPT_CUDA_CHECK_LAUNCH();
}

//! Merges `parts` (e.g. all-gathered from every rank, in rank order) into merged[0].
inline void merge_moments(device_view<const moments> parts, device_view<moments> merged, cudaStream_t stream) {
  detail::expect_size("merged", merged.size(), 1, "one moments struct");
  detail::merge_moments_kernel<<<1, 256, 0, stream>>>(parts.data(), parts.size(), merged.data());
  RLPT_CUDA_CHECK_LAUNCH();
}

//! Applies whitening with the (merged) statistics in device memory. Masked and non-finite
//! values give 0; the number of non-finite valid values is added to *nonfinite_count when given.
inline void whiten_apply(device_view<const moments> stats, const device_token_layout& layout,
                         device_view<const float> x, device_view<const mask_t> mask, device_view<float> out,
                         const whiten_options& o, device_view<index_t> nonfinite_count, cudaStream_t stream) {
  detail::check_device_whiten(o);
  detail::expect_size("stats", stats.size(), 1, "one moments struct");
  layout.expect_tokens("values", x);
  layout.expect_tokens("out", out);
  if (!mask.empty()) layout.expect_tokens("mask", mask);
  detail::expect_size_or_empty("nonfinite_count", nonfinite_count.size(), 1, "one counter");
  if (layout.num_seqs() == 0) return;
  const detail::flat_tokens f = detail::flat_tokens::of(layout);
  detail::whiten_apply_kernel<<<detail::grid_for(f.end, 256 * detail::whiten_apply_per_thread), 256, 0, stream>>>(
      f, x.data(), mask.empty() ? nullptr : mask.data(), out.data(), stats.data(), o, nonfinite_count.data());
  RLPT_CUDA_CHECK_LAUNCH();
}

//! Single-device whitening: moments, then apply. `stats` (one moments, device memory) receives
//! the statistics used. Workspace as whiten_moments.
inline void whiten(const device_token_layout& layout, device_view<const float> x, device_view<const mask_t> mask,
                   device_view<float> out, const whiten_options& o, device_view<moments> stats, workspace& ws,
                   cudaStream_t stream) {
  detail::check_device_whiten(o);
  whiten_moments(layout, x, mask, stats, ws, stream);
  if (ws.is_size_query()) return;
  whiten_apply(stats, layout, x, mask, out, o, {}, stream);
}

RLPT_NAMESPACE_END
