// SPDX-License-Identifier: Apache-2.0
//! @file
//! GAE, discounted returns and REINFORCE++ on the device, as a deterministic parallel scan.
//!
//! Going backwards, every token is an affine map of the carried state (V_next, A):
//!   valid:   (V_next, A) -> (V_t, r_t - V_t + gamma V_next + gamma lambda A)
//!   masked:  identity (skip), (0, gamma V_next + gamma lambda A) (zero), or (0, 0) (reset)
//! and affine maps compose associatively (5 numbers in fp64). One block (256 threads) owns a
//! sequence: it walks the sequence from the end in tiles of 256·ITEMS tokens; each thread composes
//! the maps of its ITEMS consecutive tokens, a block-wide exclusive scan (cub::BlockScan, fixed
//! association) gives each thread the state entering its tokens, and each thread then runs the
//! plain recurrence over them. ITEMS is 8 (tiles of 2048) for sequences longer than 1024 slots
//! and 4 (tiles of 1024) otherwise, so a batch of 1024-token rows keeps every thread busy; the
//! choice is a function of the sequence's own length. Loads and stores go through shared memory so global accesses are
//! coalesced. A sequence's bits therefore depend on that sequence alone: never on the batch size,
//! the grid, or other sequences. They match the host's sequential fp64 loop to fp32 rounding
//! (not bit for bit: the association differs).
#pragma once

#include <rlpt/config.hpp>
#include <rlpt/advantage/gae.hpp>
#include <rlpt/advantage/reinforce.hpp>
#include <rlpt/core/error.hpp>
#include <rlpt/core/layout.hpp>
#include <rlpt/core/stats.hpp>
#include <rlpt/core/views.hpp>
#include <rlpt/cuda/advantage/detail.cuh>
#include <rlpt/cuda/advantage/whiten.cuh>
#include <rlpt/cuda/error.cuh>
#include <rlpt/cuda/workspace.cuh>

#include <cub/block/block_scan.cuh>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <limits>
#include <optional>

RLPT_NAMESPACE_BEGIN

//! Per-token device inputs of GAE (as rlpt::gae_inputs, in device memory).
struct device_gae_inputs {
  device_token_layout layout;
  device_view<const float> rewards;
  device_view<const float> values;         //!< empty: V = 0 (discounted returns)
  device_view<const mask_t> mask = {};     //!< empty: every slot valid
  device_view<const float> bootstrap = {}; //!< per sequence V after its last token; empty = 0
};

//! What a device GAE / returns call reports, written to device memory by the call.
struct device_token_report {
  index_t num_nonfinite_seqs = 0; //!< sequences zeroed because a valid input was NaN or inf
  moments whitening;              //!< statistics the whitening used (count 0 when not whitened)
};

[[nodiscard]] inline gae_options device_policies(gae_options o) {
  o.on_nonfinite = nonfinite::mask;
  if (o.whiten) o.whiten = device_policies(*o.whiten);
  return o;
}
[[nodiscard]] inline reinforce_pp_options device_policies(reinforce_pp_options o) {
  o.on_nonfinite = nonfinite::mask;
  if (o.whiten) o.whiten = device_policies(*o.whiten);
  return o;
}
[[nodiscard]] inline returns_options device_policies(returns_options o) {
  o.on_nonfinite = nonfinite::mask;
  return o;
}

namespace detail {

//! The affine map (V_next, A) -> (alpha V_next + n0, c + p V_next + q A); alpha is 0 or 1.
struct gae_map {
  double alpha, n0, c, p, q;
};

RLPT_HD gae_map gae_identity() { return {1.0, 0.0, 0.0, 0.0, 1.0}; }

//! `second` applied after `first` (first is nearer the end of the sequence).
RLPT_HD gae_map gae_then(const gae_map& first, const gae_map& second) {
  return {second.alpha * first.alpha, second.alpha * first.n0 + second.n0,
          second.c + second.p * first.n0 + second.q * first.c, second.p * first.alpha + second.q * first.p,
          second.q * first.q};
}

RLPT_HD gae_map gae_token(bool valid, float r, float v, double gamma, double gamma_lambda, mask_mode mode) {
  if (valid) return {0.0, static_cast<double>(v), static_cast<double>(r) - static_cast<double>(v), gamma, gamma_lambda};
  switch (mode) {
  case mask_mode::zero:
    return {0.0, 0.0, 0.0, gamma, gamma_lambda};
  case mask_mode::reset:
    return {0.0, 0.0, 0.0, 0.0, 0.0};
  case mask_mode::skip:
    break;
  }
  return gae_identity();
}

struct gae_scan_op {
  __device__ __forceinline__ gae_map operator()(const gae_map& a, const gae_map& b) const { return gae_then(a, b); }
};

struct gae_kernel_args {
  device_token_layout layout;
  const float* rewards;
  const float* values; // null: V = 0
  const mask_t* mask;  // null: all valid
  const float* bootstrap;
  double gamma;
  double gamma_lambda;
  float* adv;
  float* ret; // null: not written
  float poison;
  index_t* bad_count;
};

inline constexpr int gae_threads = 256;
inline constexpr int gae_max_items = 8;

//! Tokens per thread for one sequence: 4 up to 1024 slots (one full tile), 8 above. A function
//! of the sequence's own length, so its bits never depend on the batch around it.
RLPT_HD int gae_items_for(index_t len) { return len <= gae_threads * 4 ? 4 : gae_max_items; }

template <int Items> struct gae_smem {
  using scan_t = cub::BlockScan<gae_map, gae_threads, cub::BLOCK_SCAN_WARP_SCANS>;
  static constexpr int tile = gae_threads * Items;
  static constexpr int padded = tile + tile / 32; // one pad per 32: conflict-free transposed reads
  typename scan_t::TempStorage scan_storage;
  float r[padded];
  float v[padded];
  mask_t m[padded];
};

//! One tile of cnt tokens ending at `end` of the sequence at `base`, Items per thread; carries
//! (next_value, acc) across tiles.
template <mask_mode Mode, int Items>
__device__ __forceinline__ void gae_tile_step(const gae_kernel_args& a, gae_smem<Items>& sm, index_t base,
                                              index_t begin, int cnt, double& next_value, double& acc, bool& bad) {
  const int tid = static_cast<int>(threadIdx.x);
  // Coalesced load; u counts tokens from the tile's end, so thread i owns u in [Items·i, Items·i + Items).
  for (int e = tid; e < cnt; e += gae_threads) {
    const int u = cnt - 1 - e, k = u + u / 32;
    const index_t i = base + begin + e;
    sm.r[k] = a.rewards[i];
    sm.v[k] = a.values ? a.values[i] : 0.0f;
    sm.m[k] = a.mask ? a.mask[i] : mask_t{1};
  }
  __syncthreads();
  gae_map agg = gae_identity();
#pragma unroll
  for (int j = 0; j < Items; ++j) {
    const int u = tid * Items + j, k = u + u / 32;
    if (u < cnt) agg = gae_then(agg, gae_token(sm.m[k] != 0, sm.r[k], sm.v[k], a.gamma, a.gamma_lambda, Mode));
  }
  gae_map prefix, total;
  typename gae_smem<Items>::scan_t(sm.scan_storage).ExclusiveScan(agg, prefix, gae_identity(), gae_scan_op{}, total);
  double nv = prefix.alpha * next_value + prefix.n0;
  double ac = prefix.c + prefix.p * next_value + prefix.q * acc;
  // Each thread reads its own slots once more and overwrites them with its outputs; no other
  // thread touches them until the barrier below.
#pragma unroll
  for (int j = 0; j < Items; ++j) {
    const int u = tid * Items + j, k = u + u / 32;
    if (u >= cnt) continue;
    if (sm.m[k] != 0) {
      const double vt = static_cast<double>(sm.v[k]);
      const double delta = static_cast<double>(sm.r[k]) + a.gamma * nv - vt;
      ac = delta + a.gamma_lambda * ac;
      nv = vt;
      const float out = static_cast<float>(ac);
      bad = bad || !finite(out);
      sm.r[k] = out;
      sm.v[k] = static_cast<float>(ac + vt);
    } else {
      if constexpr (Mode == mask_mode::zero) {
        ac = a.gamma * nv + a.gamma_lambda * ac;
        nv = 0.0;
      } else if constexpr (Mode == mask_mode::reset) {
        ac = 0.0;
        nv = 0.0;
      }
      sm.r[k] = 0.0f;
      sm.v[k] = 0.0f;
    }
  }
  const double carry_nv = total.alpha * next_value + total.n0;
  acc = total.c + total.p * next_value + total.q * acc;
  next_value = carry_nv;
  __syncthreads();
  for (int e = tid; e < cnt; e += gae_threads) {
    const int u = cnt - 1 - e, k = u + u / 32;
    const index_t i = base + begin + e;
    a.adv[i] = sm.r[k];
    if (a.ret) a.ret[i] = sm.v[k];
  }
  __syncthreads();
}

//! All tiles of one sequence, from its end.
template <mask_mode Mode, int Items>
__device__ __forceinline__ void gae_sequence(const gae_kernel_args& a, gae_smem<Items>& sm, index_t base, index_t len,
                                             double& next_value, double& acc, bool& bad) {
  constexpr index_t tile = gae_threads * Items;
  for (index_t end = len; end > 0; end -= tile) {
    const index_t begin = end > tile ? end - tile : 0;
    gae_tile_step<Mode, Items>(a, sm, base, begin, static_cast<int>(end - begin), next_value, acc, bad);
  }
}

//! The sequences whose gae_items_for(length) is Items (other blocks' sequences are skipped: a
//! packed batch mixing both classes takes one launch per class).
template <mask_mode Mode, int Items> RLPT_KERNEL void __launch_bounds__(gae_threads, 4) gae_kernel(gae_kernel_args a) {
  __shared__ gae_smem<Items> sm;
  const int tid = static_cast<int>(threadIdx.x);
  for (index_t b = blockIdx.x; b < a.layout.num_seqs(); b += gridDim.x) {
    const index_t base = a.layout.begin(b), len = a.layout.length(b);
    if (gae_items_for(len) != Items) continue; // uniform per block
    const float boot = a.bootstrap ? a.bootstrap[b] : 0.0f;
    double next_value = static_cast<double>(boot), acc = 0.0;
    bool bad = !finite(boot);
    gae_sequence<Mode, Items>(a, sm, base, len, next_value, acc, bad);
    if (__syncthreads_or(bad ? 1 : 0)) {
      for (index_t t = tid; t < len; t += gae_threads) {
        const index_t i = base + t;
        a.adv[i] = valid_at(a.mask, i) ? a.poison : 0.0f;
        if (a.ret) a.ret[i] = 0.0f;
      }
      if (tid == 0) count_into(a.bad_count, 1);
    }
  }
}

template <int Items>
void launch_gae_items(const gae_kernel_args& a, mask_mode mode, unsigned grid, cudaStream_t stream) {
  switch (mode) {
  case mask_mode::zero:
    gae_kernel<mask_mode::zero, Items><<<grid, gae_threads, 0, stream>>>(a);
    break;
  case mask_mode::reset:
    gae_kernel<mask_mode::reset, Items><<<grid, gae_threads, 0, stream>>>(a);
    break;
  case mask_mode::skip:
    gae_kernel<mask_mode::skip, Items><<<grid, gae_threads, 0, stream>>>(a);
    break;
  }
  RLPT_CUDA_CHECK_LAUNCH();
}

//! One launch per class of sequence length that the layout can hold: padded layouts (every
//! sequence max_len slots) and packed ones whose longest fits a 1024-token tile take one.
inline void launch_gae(const gae_kernel_args& a, mask_mode mode, cudaStream_t stream) {
  if (a.layout.num_seqs() == 0) return;
  const unsigned grid = grid_for(a.layout.num_seqs(), 1);
  const bool has_long = gae_items_for(a.layout.max_len()) == gae_max_items;
  const bool has_short = !has_long || a.layout.is_packed();
  if (has_short) launch_gae_items<4>(a, mode, grid, stream);
  if (has_long) launch_gae_items<gae_max_items>(a, mode, grid, stream);
}

//! Scratch of a recurrence call: the report (when the caller gives none) and whitening's.
struct token_scratch {
  device_token_report* report = nullptr;
  void* whiten_ws = nullptr;
  std::size_t whiten_bytes = 0;
};

inline bool carve_token_scratch(workspace& ws, const device_token_layout& layout, device_view<const float> adv_view,
                                device_view<const mask_t> mask, bool whitening, device_view<device_token_report> report,
                                token_scratch& s) {
  workspace inner;
  if (whitening) whiten_moments(layout, adv_view, mask, device_view<moments>(nullptr, 1), inner, nullptr);
  workspace_carver carve(ws);
  s.report = report.empty() ? carve.take<device_token_report>(1) : report.data();
  s.whiten_bytes = inner.bytes;
  s.whiten_ws = whitening ? carve.take<char>(inner.bytes) : nullptr;
  return carve.finish_size_query();
}

inline void finish_token_call(const device_token_layout& layout, device_view<float> adv, device_view<const mask_t> mask,
                              const std::optional<whiten_options>& w, const token_scratch& s, cudaStream_t stream) {
  if (!w) return;
  auto* stats =
      reinterpret_cast<moments*>(reinterpret_cast<char*>(s.report) + offsetof(device_token_report, whitening));
  workspace inner{s.whiten_ws, s.whiten_bytes};
  whiten_moments(layout, adv, mask, device_view<moments>(stats, 1), inner, stream);
  whiten_apply(device_view<const moments>(stats, 1), layout, adv, mask, adv, *w, {}, stream);
}

inline void check_token_policies(const char* what, nonfinite nf, const std::optional<whiten_options>& w) {
  RLPT_CHECK(nf == nonfinite::mask, errors::advantage::device_policy,
             "{} on the device cannot raise from a kernel: pass rlpt::device_policies(options) (sequences with "
             "non-finite inputs are zeroed and counted in device_token_report::num_nonfinite_seqs)",
             what);
  if (w) check_device_whiten(*w);
}

} // namespace detail

//! Device GAE: advantages (whitened when o.whiten is set) and returns (A + V before whitening;
//! may be empty). `report` (one device_token_report in device memory, or empty) receives the
//! count of zeroed sequences and the whitening statistics. Workspace: size query when ws.data is
//! null. Asynchronous on `stream`; allocates nothing.
inline void gae(const device_gae_inputs& in, device_view<float> advantages, device_view<float> returns,
                const gae_options& o, device_view<device_token_report> report, workspace& ws, cudaStream_t stream) {
  detail::check_discount("gae_options::gamma", o.gamma);
  detail::check_discount("gae_options::lambda", o.lambda);
  detail::check_token_policies("gae", o.on_nonfinite, o.whiten);
  const device_token_layout& layout = in.layout;
  layout.expect_tokens("rewards", in.rewards);
  if (!in.values.empty()) layout.expect_tokens("values", in.values);
  layout.expect_tokens("advantages", advantages);
  if (!returns.empty()) layout.expect_tokens("returns", returns);
  if (!in.mask.empty()) layout.expect_tokens("mask", in.mask);
  detail::expect_size_or_empty("bootstrap", in.bootstrap.size(), layout.num_seqs(), "one value per sequence");
  detail::expect_size_or_empty("report", report.size(), 1, "one device_token_report");
  detail::token_scratch s;
  if (detail::carve_token_scratch(ws, layout, advantages, in.mask, o.whiten.has_value(), report, s)) return;
  RLPT_CUDA_CHECK(cudaMemsetAsync(s.report, 0, sizeof(device_token_report), stream));
  const detail::gae_kernel_args a{layout,
                                  in.rewards.data(),
                                  in.values.empty() ? nullptr : in.values.data(),
                                  in.mask.empty() ? nullptr : in.mask.data(),
                                  in.bootstrap.empty() ? nullptr : in.bootstrap.data(),
                                  o.gamma,
                                  o.gamma * o.lambda,
                                  advantages.data(),
                                  returns.empty() ? nullptr : returns.data(),
                                  o.whiten ? std::numeric_limits<float>::quiet_NaN() : 0.0f,
                                  &s.report->num_nonfinite_seqs};
  detail::launch_gae(a, o.masked, stream);
  detail::finish_token_call(layout, advantages, in.mask, o.whiten, s, stream);
}

//! Device discounted returns G_t = r_t + gamma G_next (masked outputs 0).
inline void discounted_returns(const device_token_layout& layout, device_view<const float> token_rewards,
                               device_view<const mask_t> mask, device_view<float> returns, const returns_options& o,
                               device_view<device_token_report> report, workspace& ws, cudaStream_t stream) {
  gae({.layout = layout, .rewards = token_rewards, .values = {}, .mask = mask}, returns, {},
      {.gamma = o.gamma, .lambda = 1.0, .masked = o.masked, .on_nonfinite = o.on_nonfinite}, report, ws, stream);
}

//! Device REINFORCE++: advantages = whiten(G) (when o.whiten is set), returns = G (may be empty).
inline void reinforce_pp_advantages(const device_token_layout& layout, device_view<const float> token_rewards,
                                    device_view<const mask_t> mask, device_view<float> advantages,
                                    device_view<float> returns, const reinforce_pp_options& o,
                                    device_view<device_token_report> report, workspace& ws, cudaStream_t stream) {
  detail::check_discount("reinforce_pp_options::gamma", o.gamma);
  detail::check_token_policies("reinforce_pp_advantages", o.on_nonfinite, o.whiten);
  layout.expect_tokens("token_rewards", token_rewards);
  layout.expect_tokens("advantages", advantages);
  if (!returns.empty()) layout.expect_tokens("returns", returns);
  if (!mask.empty()) layout.expect_tokens("mask", mask);
  detail::expect_size_or_empty("report", report.size(), 1, "one device_token_report");
  detail::token_scratch s;
  if (detail::carve_token_scratch(ws, layout, advantages, mask, o.whiten.has_value(), report, s)) return;
  RLPT_CUDA_CHECK(cudaMemsetAsync(s.report, 0, sizeof(device_token_report), stream));
  // With V = 0 the recurrence's "returns" output is G itself: the advantages receive G (NaN for
  // bad sequences when whitening follows, so that whitening leaves them out), `returns` receives
  // G with 0 for bad sequences.
  const detail::gae_kernel_args a{layout,
                                  token_rewards.data(),
                                  nullptr,
                                  mask.empty() ? nullptr : mask.data(),
                                  nullptr,
                                  o.gamma,
                                  o.gamma,
                                  advantages.data(),
                                  returns.empty() ? nullptr : returns.data(),
                                  o.whiten ? std::numeric_limits<float>::quiet_NaN() : 0.0f,
                                  &s.report->num_nonfinite_seqs};
  detail::launch_gae(a, o.masked, stream);
  detail::finish_token_call(layout, advantages, mask, o.whiten, s, stream);
}

RLPT_NAMESPACE_END
