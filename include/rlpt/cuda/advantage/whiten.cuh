// SPDX-License-Identifier: Apache-2.0
//! @file
//! Masked whitening on the device, in the same three steps as the host (whiten_moments,
//! merge, whiten_apply) so that a distributed job can put an all-gather of the per-rank
//! (count, mean, M2) in between (see <rlpt/cuda/advantage/nccl.cuh>). The statistics never leave
//! the device: whiten_apply reads them from device memory, so nothing synchronises.
//!
//! Moments are computed two-pass in fp64 per chunk of sequences (the chunking depends only on the
//! layout) and merged in a fixed tree, so the same input gives the same bits on every run and
//! every GPU. They agree with the host's to fp64 rounding, not bit for bit.
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

//! Sequences per block of the moments kernel: the host's chunking (about 64K token slots).
inline index_t device_seq_grain(const device_token_layout& l) {
  return std::max<index_t>(1, index_t{1 << 16} / std::max<index_t>(1, l.max_len()));
}

template <int = 0> // a template: a kernel defined in a header must not clash across TUs
RLPT_KERNEL void __launch_bounds__(256)
    whiten_partials_kernel(device_token_layout l, const float* x, const mask_t* m, index_t rows, moments* parts) {
  __shared__ double shared[256];
  __shared__ long long shared_count[256];
  const index_t b0 = static_cast<index_t>(blockIdx.x) * rows;
  const index_t b1 = b0 + rows < l.num_seqs() ? b0 + rows : l.num_seqs();
  long long c = 0;
  double s = 0.0;
  for (index_t b = b0; b < b1; ++b) {
    const index_t base = l.begin(b), n = l.length(b);
    for (index_t t = threadIdx.x; t < n; t += 256)
      if (valid_at(m, base + t) && finite(x[base + t])) {
        ++c;
        s += static_cast<double>(x[base + t]);
      }
  }
  c = block_sum_256_int(c, shared_count);
  s = block_sum_256(s, shared);
  const double count = static_cast<double>(c);
  const double mean = c > 0 ? s / count : 0.0;
  double q = 0.0;
  for (index_t b = b0; b < b1; ++b) {
    const index_t base = l.begin(b), n = l.length(b);
    for (index_t t = threadIdx.x; t < n; t += 256)
      if (valid_at(m, base + t) && finite(x[base + t])) {
        const double d = static_cast<double>(x[base + t]) - mean;
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

template <int = 0>
RLPT_KERNEL void __launch_bounds__(256) whiten_apply_kernel(device_token_layout l, const float* x, const mask_t* m,
                                                            float* out, const moments* stats, whiten_options o,
                                                            index_t* nonfinite_count) {
  const moments st = *stats;
  const whiten_transform tr = whiten_from(st.count, st.mean, st.m2, o);
  long long bad = 0;
  for (index_t b = blockIdx.x; b < l.num_seqs(); b += gridDim.x) {
    const index_t base = l.begin(b), n = l.length(b);
    for (index_t t = threadIdx.x; t < n; t += blockDim.x) {
      const index_t i = base + t;
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
inline void whiten_moments(const device_token_layout& layout, device_view<const float> x, device_view<const mask_t> mask,
                           device_view<moments> stats, workspace& ws, cudaStream_t stream) {
  layout.expect_tokens("values", x);
  if (!mask.empty()) layout.expect_tokens("mask", mask);
  detail::expect_size("stats", stats.size(), 1, "one moments struct");
  const index_t rows = detail::device_seq_grain(layout);
  const index_t chunks = std::max<index_t>(1, (layout.num_seqs() + rows - 1) / rows);
  detail::workspace_carver carve(ws);
  moments* parts = carve.take<moments>(static_cast<std::size_t>(chunks));
  if (carve.finish_size_query()) return;
  if (layout.num_seqs() == 0) {
    RLPT_CUDA_CHECK(cudaMemsetAsync(stats.data(), 0, sizeof(moments), stream));
    return;
  }
  detail::whiten_partials_kernel<<<static_cast<unsigned>(chunks), 256, 0, stream>>>(
      layout, x.data(), mask.empty() ? nullptr : mask.data(), rows, parts);
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
  detail::whiten_apply_kernel<<<detail::grid_for(layout.num_seqs(), 1), 256, 0, stream>>>(
      layout, x.data(), mask.empty() ? nullptr : mask.data(), out.data(), stats.data(), o, nonfinite_count.data());
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
