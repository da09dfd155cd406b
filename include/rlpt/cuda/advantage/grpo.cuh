// SPDX-License-Identifier: Apache-2.0
//! @file
//! GRPO-family group normalisation (GRPO / Dr. GRPO / batch std, and RLOO) on the device: every
//! group of a batch in one launch. A group is handled by a tile of W lanes (W = the smallest
//! power of two covering the largest group, at most 32), so a warp serves 32 / W groups at once
//! and groups of 4-64 do not waste a block (or a warp) each. The reductions are the canonical
//! ones of the host (detail::canonical_sum): the advantages and statistics are bit-identical to
//! rlpt::grpo_advantages / rlpt::rloo_advantages on the host.
//!
//! Device entry points cannot throw from inside a kernel, so the raising policies
//! (nonfinite::raise, single::raise) are refused at the call; use rlpt::device_policies(options)
//! and read the counters (non-finite rewards, degenerate groups, single-sample groups) instead.
#pragma once

#include <rlpt/config.hpp>
#include <rlpt/advantage/common.hpp>
#include <rlpt/advantage/grpo.hpp>
#include <rlpt/advantage/rloo.hpp>
#include <rlpt/core/error.hpp>
#include <rlpt/core/groups.hpp>
#include <rlpt/core/views.hpp>
#include <rlpt/cuda/advantage/detail.cuh>
#include <rlpt/cuda/error.cuh>
#include <rlpt/cuda/workspace.cuh>

#include <cuda_runtime_api.h>

#include <algorithm>

RLPT_NAMESPACE_BEGIN

//! Groups in device memory: copies of groups::offsets() and groups::members(), plus the size of
//! the largest group (max_group_size), which fixes the tile width.
struct device_groups {
  device_view<const index_t> offsets; //!< G + 1 entries
  device_view<const index_t> members; //!< N entries: sequence indices, group by group
  index_t max_size = 0;               //!< >= every group's size

  [[nodiscard]] RLPT_HD index_t num_groups() const noexcept { return offsets.size() > 0 ? offsets.size() - 1 : 0; }
};

//! Size of the largest group (the max_size of a device_groups).
[[nodiscard]] inline index_t max_group_size(const groups& g) {
  index_t m = 0;
  for (index_t k = 0; k < g.num_groups(); ++k) m = std::max(m, g.size(k));
  return m;
}

//! Optional per-group outputs in device memory (empty views are not written).
struct device_group_stats {
  device_view<float> mean{};        //!< per group, as group_stats::mean
  device_view<float> std{};         //!< per group, as group_stats::std
  device_view<index_t> size{};      //!< per group: counted (finite) rewards
  device_view<mask_t> degenerate{}; //!< per group: fewer than 2 counted or zero std
  //! 3 counters, zeroed by the call: [0] non-finite rewards masked, [1] degenerate groups,
  //! [2] groups with exactly one counted reward.
  device_view<index_t> counters{};
};

//! The options with every raising policy replaced by its non-raising counterpart (device
//! kernels report through counters instead): nonfinite::raise -> mask, single::raise -> zero.
[[nodiscard]] inline grpo_options device_policies(grpo_options o) {
  if (o.on_nonfinite == nonfinite::raise) o.on_nonfinite = nonfinite::mask;
  if (o.single == single::raise) o.single = single::zero;
  return o;
}
[[nodiscard]] inline rloo_options device_policies(rloo_options o) {
  if (o.on_nonfinite == nonfinite::raise) o.on_nonfinite = nonfinite::mask;
  if (o.single == single::raise) o.single = single::zero;
  return o;
}

namespace detail {

enum class group_estimator : std::uint8_t { grpo, rloo };

struct group_kernel_args {
  const float* rewards;
  const index_t* offsets;
  const index_t* members;
  index_t num_groups;
  float* out;
  grpo_options grpo;
  single rloo_single;
  const double* batch_std; // scale::batch_std only
  float* mean;
  float* std;
  index_t* size;
  mask_t* degenerate;
  index_t* counters;
};

template <group_estimator E, int W> RLPT_KERNEL void __launch_bounds__(256) group_kernel(group_kernel_args a) {
  const int lane = static_cast<int>(threadIdx.x) % W;
  const unsigned mask = tile_lane_mask<W>();
  const index_t tiles_per_block = static_cast<index_t>(blockDim.x) / W;
  const index_t stride = static_cast<index_t>(gridDim.x) * tiles_per_block;
  const bool unbiased = E == group_estimator::grpo ? a.grpo.unbiased : true;
  for (index_t g = static_cast<index_t>(blockIdx.x) * tiles_per_block + static_cast<index_t>(threadIdx.x) / W;
       g < a.num_groups; g += stride) {
    const index_t begin = a.offsets[g];
    const index_t n = a.offsets[g + 1] - begin;
    long long c = 0;
    double s = 0.0;
    for (index_t k = lane; k < n; k += W) {
      const float x = a.rewards[a.members[begin + k]];
      const bool ok = finite(x);
      c += ok ? 1 : 0;
      s = add_rn(s, ok ? static_cast<double>(x) : 0.0);
    }
    c = tile_sum_int<W>(c, mask);
    s = tile_sum<W>(s, mask);
    const double count = static_cast<double>(c);
    const double mean = c > 0 ? s / count : 0.0;
    double q = 0.0;
    for (index_t k = lane; k < n; k += W) {
      const float x = a.rewards[a.members[begin + k]];
      const double d = static_cast<double>(x) - mean;
      q = add_rn(q, finite(x) ? mul_rn(d, d) : 0.0);
    }
    const double m2 = c > 0 ? tile_sum<W>(q, mask) : 0.0;
    if constexpr (E == group_estimator::grpo) {
      const group_norm norm =
          grpo_norm(count, mean, std_of(count, m2, a.grpo.unbiased), a.batch_std ? *a.batch_std : 0.0, a.grpo);
      for (index_t k = lane; k < n; k += W) {
        const index_t i = a.members[begin + k];
        a.out[i] = apply_norm(a.rewards[i], norm);
      }
    } else {
      for (index_t k = lane; k < n; k += W) {
        const index_t i = a.members[begin + k];
        a.out[i] = rloo_value(a.rewards[i], count, s, a.rloo_single);
      }
    }
    if (lane == 0) {
      const bool degenerate = count < 2.0 || m2 == 0.0;
      if (a.mean) a.mean[g] = static_cast<float>(mean);
      if (a.std) a.std[g] = static_cast<float>(std_of(count, m2, unbiased));
      if (a.size) a.size[g] = static_cast<index_t>(c);
      if (a.degenerate) a.degenerate[g] = degenerate ? 1 : 0;
      if (a.counters) {
        count_into(a.counters + 0, static_cast<long long>(n) - c);
        count_into(a.counters + 1, degenerate ? 1 : 0);
        count_into(a.counters + 2, c == 1 ? 1 : 0);
      }
    }
  }
}

//! Batch std over every counted reward, canonical 256-lane order (one block).
template <int = 0> // a template: a kernel defined in a header must not clash across TUs
RLPT_KERNEL void __launch_bounds__(256) batch_std_kernel(const float* rewards, index_t n, bool unbiased, double* out) {
  __shared__ double shared[256];
  __shared__ long long shared_count[256];
  long long c = 0;
  double s = 0.0;
  for (index_t k = threadIdx.x; k < n; k += 256) {
    const float x = rewards[k];
    c += finite(x) ? 1 : 0;
    s = add_rn(s, finite(x) ? static_cast<double>(x) : 0.0);
  }
  c = block_sum_256_int(c, shared_count);
  s = block_sum_256(s, shared);
  const double count = static_cast<double>(c);
  const double mean = c > 0 ? s / count : 0.0;
  double q = 0.0;
  for (index_t k = threadIdx.x; k < n; k += 256) {
    const float x = rewards[k];
    const double d = static_cast<double>(x) - mean;
    q = add_rn(q, finite(x) ? mul_rn(d, d) : 0.0);
  }
  q = block_sum_256(q, shared);
  if (threadIdx.x == 0) *out = count < 2.0 ? 1.0 : std_of(count, q, unbiased);
}

template <group_estimator E>
void launch_group_kernel(const group_kernel_args& a, index_t max_size, cudaStream_t stream) {
  const int w = canonical_width<reduce_lanes>(max_size);
  const index_t per_block = 256 / w;
  const unsigned grid = grid_for(a.num_groups, per_block);
  switch (w) {
  case 1:
    group_kernel<E, 1><<<grid, 256, 0, stream>>>(a);
    break;
  case 2:
    group_kernel<E, 2><<<grid, 256, 0, stream>>>(a);
    break;
  case 4:
    group_kernel<E, 4><<<grid, 256, 0, stream>>>(a);
    break;
  case 8:
    group_kernel<E, 8><<<grid, 256, 0, stream>>>(a);
    break;
  case 16:
    group_kernel<E, 16><<<grid, 256, 0, stream>>>(a);
    break;
  default:
    group_kernel<E, 32><<<grid, 256, 0, stream>>>(a);
    break;
  }
  RLPT_CUDA_CHECK_LAUNCH();
}

inline group_kernel_args check_group_call(const char* what, device_view<const float> rewards, const device_groups& g,
                                          device_view<float> out, const device_group_stats& st, nonfinite nf,
                                          single sg) {
  RLPT_CHECK(
      nf == nonfinite::mask && sg != single::raise, errors::advantage::device_policy,
      "{} on the device cannot raise from a kernel: pass rlpt::device_policies(options) (non-finite rewards are "
      "masked and counted, single-sample groups get 0 or their raw reward) and read device_group_stats::counters",
      what);
  RLPT_CHECK(g.offsets.size() >= 1 && g.max_size >= 0, errors::advantage::bad_groups,
             "device_groups needs G + 1 offsets (got {}) and max_size >= 0 (got {})", g.offsets.size(), g.max_size);
  expect_size("rewards", rewards.size(), g.members.size(), "one per group member");
  expect_size("advantages", out.size(), rewards.size(), "one advantage per sequence");
  const index_t G = g.num_groups();
  expect_size_or_empty("stats.mean", st.mean.size(), G, "one per group");
  expect_size_or_empty("stats.std", st.std.size(), G, "one per group");
  expect_size_or_empty("stats.size", st.size.size(), G, "one per group");
  expect_size_or_empty("stats.degenerate", st.degenerate.size(), G, "one per group");
  expect_size_or_empty("stats.counters", st.counters.size(), 3, "non-finite, degenerate, single-sample");
  return {rewards.data(),    g.offsets.data(),
          g.members.data(),  G,
          out.data(),        {},
          single::raw,       nullptr,
          st.mean.data(),    st.std.data(),
          st.size.data(),    st.degenerate.data(),
          st.counters.data()};
}

} // namespace detail

//! Device GRPO: the same advantages and statistics as the host rlpt::grpo_advantages, bit for
//! bit. Workspace: 8 bytes for scale::batch_std, else none (size query when ws.data is null).
//! Asynchronous on `stream`; allocates nothing.
inline void grpo_advantages(device_view<const float> rewards, const device_groups& g, device_view<float> out,
                            const grpo_options& o, const device_group_stats& stats, workspace& ws,
                            cudaStream_t stream) {
  detail::check_grpo_options(o);
  detail::group_kernel_args a =
      detail::check_group_call("grpo_advantages", rewards, g, out, stats, o.on_nonfinite, o.single);
  detail::workspace_carver carve(ws);
  double* batch_std = o.scale == scale::batch_std ? carve.take<double>(1) : nullptr;
  if (carve.finish_size_query()) return;
  a.grpo = o;
  a.batch_std = batch_std;
  if (stats.counters.data()) RLPT_CUDA_CHECK(cudaMemsetAsync(stats.counters.data(), 0, 3 * sizeof(index_t), stream));
  if (batch_std) {
    detail::batch_std_kernel<<<1, 256, 0, stream>>>(rewards.data(), rewards.size(), o.unbiased, batch_std);
    RLPT_CUDA_CHECK_LAUNCH();
  }
  if (a.num_groups > 0) detail::launch_group_kernel<detail::group_estimator::grpo>(a, g.max_size, stream);
}

//! Device RLOO: the same advantages and statistics as the host rlpt::rloo_advantages (without
//! batch_normalize, which is refused here). Needs no workspace.
inline void rloo_advantages(device_view<const float> rewards, const device_groups& g, device_view<float> out,
                            const rloo_options& o, const device_group_stats& stats, workspace& ws,
                            cudaStream_t stream) {
  RLPT_CHECK(
      !o.batch_normalize, errors::advantage::bad_option,
      "rloo_options::batch_normalize is host-only; whiten the per-sequence advantages with rlpt::whiten instead");
  detail::group_kernel_args a =
      detail::check_group_call("rloo_advantages", rewards, g, out, stats, o.on_nonfinite, o.single);
  detail::workspace_carver carve(ws);
  if (carve.finish_size_query()) return;
  a.rloo_single = o.single;
  if (stats.counters.data()) RLPT_CUDA_CHECK(cudaMemsetAsync(stats.counters.data(), 0, 3 * sizeof(index_t), stream));
  if (a.num_groups > 0) detail::launch_group_kernel<detail::group_estimator::rloo>(a, g.max_size, stream);
}

RLPT_NAMESPACE_END
