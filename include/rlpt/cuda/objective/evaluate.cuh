// SPDX-License-Identifier: Apache-2.0
//! @file
//! rlpt::evaluate on device memory: a whole objective (policy term, correction, KL, entropy,
//! value, distillation, aggregation, metrics) in one fused pass over the tokens plus a
//! deterministic reduction, with the same per-token math as the host (objective/detail/*.hpp).
//!
//!     rlpt::workspace ws;                                          // size query
//!     rlpt::evaluate(obj, d_inputs, d_grads, d_result, ws, stream);
//!     cudaMallocAsync(&ws.data, ws.bytes, stream);
//!     rlpt::evaluate(obj, d_inputs, d_grads, d_result, ws, stream); // capturable in a graph
//!
//! Kernels: [row statistics, only when a sequence-level piece or a local denominator needs
//! them] -> token pass (one block per (sequence, 1024-token tile), per-block sums) -> [GSPO
//! sequence-form gradient coupling] -> one-block reduction into *d_result. Every reduction has
//! a fixed order (per-thread strided sums, warp shuffles, a fixed tree), so the result bits do
//! not depend on scheduling and no atomics are used.
//!
//! Differences from the host entry point, which can throw: a non-finite input at a valid token
//! under nonfinite_policy::raise makes result.loss NaN (result.nonfinite_tokens counts them); an
//! explicit global denominator smaller than this call's own count sets result.denominator_error
//! and a NaN loss. The configuration and input sizes are validated on the host as for the host
//! entry point (same ids and messages); device offsets of a packed layout are trusted.
#pragma once

#include <rlpt/config.hpp>
#include <rlpt/core/layout.hpp>
#include <rlpt/core/views.hpp>
#include <rlpt/cuda/error.cuh>
#include <rlpt/cuda/workspace.cuh>
#include <rlpt/objective/detail/plan.hpp>
#include <rlpt/objective/detail/token.hpp>
#include <rlpt/objective/evaluate.hpp>
#include <rlpt/objective/inputs.hpp>

#include <cuda_runtime_api.h>

#include <cstddef>
#include <limits>
#include <type_traits>

RLPT_NAMESPACE_BEGIN

template <class T>
using device_objective_inputs = basic_objective_inputs<T, memory_space::device>;
template <class T>
using device_objective_grads = basic_objective_grads<T, memory_space::device>;

namespace detail {

inline constexpr int obj_threads = 256;
inline constexpr int obj_tokens_per_thread = 4;
inline constexpr int obj_tile = obj_threads * obj_tokens_per_thread; // tokens per block of the token pass

//! Deterministic block sum of one double (warp shuffles, then warp 0 over the warp sums).
RLPT_DEVICE double block_sum(double v, double* shared) {
  for (int o = 16; o > 0; o /= 2) v += __shfl_down_sync(0xffffffffu, v, o);
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int warp = static_cast<int>(threadIdx.x) >> 5;
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  const int warps = static_cast<int>(blockDim.x + 31) / 32;
  v = static_cast<int>(threadIdx.x) < warps ? shared[threadIdx.x] : 0.0;
  if (warp == 0)
    for (int o = 16; o > 0; o /= 2) v += __shfl_down_sync(0xffffffffu, v, o);
  return v; // valid in thread 0
}

RLPT_DEVICE double block_min(double v, double* shared) {
  for (int o = 16; o > 0; o /= 2) v = fmin(v, __shfl_down_sync(0xffffffffu, v, o));
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int warp = static_cast<int>(threadIdx.x) >> 5;
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  const int warps = static_cast<int>(blockDim.x + 31) / 32;
  v = static_cast<int>(threadIdx.x) < warps ? shared[threadIdx.x] : std::numeric_limits<double>::infinity();
  if (warp == 0)
    for (int o = 16; o > 0; o /= 2) v = fmin(v, __shfl_down_sync(0xffffffffu, v, o));
  return v;
}

RLPT_DEVICE double block_max(double v, double* shared) { return -block_min(-v, shared); }

//! Block-reduces every field of an objective_sums into thread 0's copy (field by field, so the
//! struct stays in registers).
RLPT_DEVICE void block_reduce(objective_sums& s, double* shared) {
  s.policy = block_sum(s.policy, shared);
  s.kl = block_sum(s.kl, shared);
  s.entropy = block_sum(s.entropy, shared);
  s.value = block_sum(s.value, shared);
  s.valid = block_sum(s.valid, shared);
  s.in_loss = block_sum(s.in_loss, shared);
  s.seqs = block_sum(s.seqs, shared);
  s.loss_seqs = block_sum(s.loss_seqs, shared);
  s.rows = block_sum(s.rows, shared);
  s.clip_low = block_sum(s.clip_low, shared);
  s.clip_high = block_sum(s.clip_high, shared);
  s.clip_dual = block_sum(s.clip_dual, shared);
  s.clamped = block_sum(s.clamped, shared);
  s.approx_kl = block_sum(s.approx_kl, shared);
  s.kl_value = block_sum(s.kl_value, shared);
  s.w_sum = block_sum(s.w_sum, shared);
  s.rejected = block_sum(s.rejected, shared);
  s.entropy_value = block_sum(s.entropy_value, shared);
  s.value_clipped = block_sum(s.value_clipped, shared);
  s.nonfinite = block_sum(s.nonfinite, shared);
  s.w_min = block_min(s.w_min, shared);
  s.w_max = block_max(s.w_max, shared);
}

//! Local counts of a call, filled by the row kernel: tokens in the loss, rows with a token in
//! the loss, rows.
struct device_counts {
  double tokens;
  double loss_seqs;
  double rows;
};

template <class T>
RLPT_KERNEL void __launch_bounds__(obj_threads)
    objective_row_kernel(const objective_plan p, device_objective_inputs<T> in, row_consts* consts, double* row_len) {
  __shared__ double shared[32];
  const index_t b = blockIdx.x;
  const auto& L = in.layout;
  const index_t base = L.begin(b);
  const index_t n = L.length(b);
  const token_loader<T, memory_space::device> load{p, in};
  row_stats st;
  for (index_t t = threadIdx.x; t < n; t += blockDim.x) {
    bool bad = false;
    row_stats_add(p, load(b, base + t, bad), st);
  }
  // Fixed-order block reduction of the row statistics.
  st.len = block_sum(st.len, shared);
  st.len_keep = block_sum(st.len_keep, shared);
  st.sum_lr = block_sum(st.sum_lr, shared);
  st.rs_sum = block_sum(st.rs_sum, shared);
  st.rs_max = block_max(st.rs_max, shared);
  st.sum_x = block_sum(st.sum_x, shared);
  st.sum_xs = block_sum(st.sum_xs, shared);
  st.sum_adv = block_sum(st.sum_adv, shared);
  st.sum_logw = block_sum(st.sum_logw, shared);
  if (threadIdx.x == 0) {
    const row_consts c = p.need_row_pass ? row_finish(p, st) : row_consts{};
    consts[b] = c;
    // Tokens this row keeps in the loss (its contribution to the local denominators).
    row_len[b] = p.need_row_pass ? c.len_loss : (p.removes ? st.len_keep : st.len);
  }
}

//! Sums the per-row lengths into the local denominators (one block, fixed order).
template <int = 0> // a template: a kernel defined in a header must not clash across TUs
RLPT_KERNEL void __launch_bounds__(1024) objective_count_kernel(const double* row_len, index_t rows, device_counts* out) {
  __shared__ double shared[32];
  double tokens = 0.0, seqs = 0.0;
  for (index_t b = threadIdx.x; b < rows; b += blockDim.x) {
    tokens += row_len[b];
    seqs += row_len[b] > 0.0 ? 1.0 : 0.0;
  }
  tokens = block_sum(tokens, shared);
  seqs = block_sum(seqs, shared);
  if (threadIdx.x == 0) *out = {tokens, seqs, static_cast<double>(rows)};
}

RLPT_DEVICE agg_plan resolve_device(agg_plan a, const device_counts* c) {
  if (c == nullptr) return a;
  if (a.tokens < 0.0) a.tokens = c->tokens;
  if (a.seqs < 0.0) a.seqs = a.count_empty_rows ? c->rows : c->loss_seqs;
  return a;
}

//! The row's aggregation weights with the denominators resolved (the plan itself stays in the
//! kernel's parameter space: copying it to modify it would put it in local memory).
RLPT_DEVICE void device_alphas(const objective_plan& p, const device_counts* counts, row_consts& c) {
  c.a_policy = resolve_device(p.agg_policy, counts).row_weight(c.len_loss);
  c.a_kl = resolve_device(p.agg_kl, counts).row_weight(c.len_loss);
  c.a_entropy = resolve_device(p.agg_entropy, counts).row_weight(c.len_loss);
  c.a_value = resolve_device(p.agg_value, counts).row_weight(c.len_loss);
}

template <class T>
RLPT_KERNEL void __launch_bounds__(obj_threads)
    objective_token_kernel(const objective_plan p, device_objective_inputs<T> in, device_objective_grads<T> gr,
                           const row_consts* consts, const device_counts* counts, index_t tiles, objective_sums* partials,
                           double* dcoef_partials) {
  __shared__ double shared[32];
  const index_t b = static_cast<index_t>(blockIdx.x) / tiles;
  const index_t tile = static_cast<index_t>(blockIdx.x) % tiles;
  const auto& L = in.layout;
  const index_t n = L.length(b);
  const index_t base = L.begin(b);
  row_consts c;
  if (consts != nullptr) {
    c = consts[b];
  } else {
    c.len_loss = 1.0; // no term depends on the length
  }
  device_alphas(p, counts, c);
  const token_loader<T, memory_space::device> load{p, in};
  objective_sums s;
  double pol = 0.0, kl = 0.0, ent = 0.0, val = 0.0, dcoef = 0.0;
  const index_t t0 = tile * obj_tile;
  const index_t t1 = t0 + obj_tile < n ? t0 + obj_tile : n;
  for (index_t t = t0 + threadIdx.x; t < t1; t += blockDim.x) {
    const index_t i = base + t;
    bool bad = false;
    const token_inputs<T> ti = load(b, i, bad);
    s.nonfinite += bad ? 1.0 : 0.0;
    const token_result<T> r = token_eval(p, c, ti);
    if (gr.logp.size() != 0) gr.logp[i] = r.in_loss ? r.g_logp : T(0);
    if (gr.entropy.size() != 0) gr.entropy[i] = r.in_loss ? r.g_entropy : T(0);
    if (gr.values.size() != 0) gr.values[i] = r.in_loss ? r.g_value : T(0);
    if (!ti.valid) continue;
    s.valid += 1.0;
    const double w = static_cast<double>(r.w);
    s.w_sum += w;
    s.w_min = fmin(s.w_min, w);
    s.w_max = fmax(s.w_max, w);
    s.rejected += r.rejected ? 1.0 : 0.0;
    if (!r.in_loss) continue;
    s.in_loss += 1.0;
    pol += static_cast<double>(r.policy);
    kl += static_cast<double>(r.kl);
    ent += static_cast<double>(r.entropy);
    val += static_cast<double>(r.value);
    dcoef += static_cast<double>(r.dcoef);
    s.clip_low += (r.flags & flag_low) ? 1.0 : 0.0;
    s.clip_high += (r.flags & flag_high) ? 1.0 : 0.0;
    s.clip_dual += (r.flags & flag_dual) ? 1.0 : 0.0;
    s.clamped += (r.flags & flag_clamped) ? 1.0 : 0.0;
    s.approx_kl += static_cast<double>(ti.old - ti.lp);
    s.value_clipped += r.v_clipped ? 1.0 : 0.0;
  }
  s.policy = c.a_policy * pol;
  s.kl = c.a_kl * kl;
  s.entropy = c.a_entropy * ent;
  s.value = c.a_value * val;
  s.kl_value = kl;
  s.entropy_value = ent;
  block_reduce(s, shared);
  dcoef = block_sum(dcoef, shared);
  if (threadIdx.x == 0) {
    // Row-level pieces are added once per row, by its first tile.
    if (tile == 0) {
      s.rows = 1.0;
      if (p.policy == policy_kind::gmpo && c.len_loss > 0.0)
        s.policy += c.a_policy * (-c.gmpo_adv * c.gmpo_ratio * c.gmpo_w);
    }
    partials[blockIdx.x] = s;
    if (dcoef_partials != nullptr) dcoef_partials[blockIdx.x] = dcoef;
  }
}

//! GSPO sequence form: adds alpha * sum(w d value / d s) / L to every in-loss token's gradient.
template <class T>
RLPT_KERNEL void __launch_bounds__(obj_threads)
    objective_gspo_kernel(const objective_plan p, device_objective_inputs<T> in, device_objective_grads<T> gr,
                          const row_consts* consts, const device_counts* counts, index_t tiles,
                          const double* dcoef_partials) {
  const index_t b = static_cast<index_t>(blockIdx.x) / tiles;
  const index_t tile = static_cast<index_t>(blockIdx.x) % tiles;
  row_consts c = consts[b];
  device_alphas(p, counts, c);
  double dcoef = 0.0;
  for (index_t k = 0; k < tiles; ++k) dcoef += dcoef_partials[b * tiles + k]; // fixed order
  if (dcoef == 0.0) return;
  const double len = c.len_loss > 1.0 ? c.len_loss : 1.0;
  const T scale = static_cast<T>(c.a_policy * dcoef / len);
  const auto& L = in.layout;
  const index_t n = L.length(b);
  const index_t base = L.begin(b);
  const token_loader<T, memory_space::device> load{p, in};
  const index_t t0 = tile * obj_tile;
  const index_t t1 = t0 + obj_tile < n ? t0 + obj_tile : n;
  for (index_t t = t0 + threadIdx.x; t < t1; t += blockDim.x) {
    const index_t i = base + t;
    bool bad = false;
    const token_inputs<T> ti = load(b, i, bad);
    if (!ti.valid) continue;
    if ((c.seq_keep && token_keep(p, ti)) || !p.removes) gr.logp[i] += scale;
  }
}

//! Reduces the per-block sums in a fixed order and writes the result.
template <int = 0>
RLPT_KERNEL void __launch_bounds__(1024)
    objective_finish_kernel(const objective_plan p, const objective_sums* partials, index_t blocks, index_t tiles,
                            const device_counts* counts, objective_result* result) {
  __shared__ double shared[32];
  objective_sums s;
  double seqs = 0.0, loss_seqs = 0.0;
  // Rows: sum each row's tiles first (its valid / in-loss counts decide seqs and loss_seqs).
  const index_t rows = tiles > 0 ? blocks / tiles : 0;
  for (index_t b = threadIdx.x; b < rows; b += blockDim.x) {
    objective_sums r;
    for (index_t k = 0; k < tiles; ++k) r.merge(partials[b * tiles + k]);
    seqs += r.valid > 0.0 ? 1.0 : 0.0;
    loss_seqs += r.in_loss > 0.0 ? 1.0 : 0.0;
    s.merge(r);
  }
  s.seqs = seqs;
  s.loss_seqs = loss_seqs;
  block_reduce(s, shared);
  if (threadIdx.x != 0) return;
  const agg_plan aggs[4] = {resolve_device(p.agg_policy, counts), resolve_device(p.agg_kl, counts),
                            resolve_device(p.agg_entropy, counts), resolve_device(p.agg_value, counts)};
  objective_result r = finish_result(p, s);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  if (s.nonfinite > 0.0 && p.nonfinite == nonfinite_policy::raise) r.loss = nan;
  auto short_of = [&](const agg_plan& a, bool used) {
    if (!used) return false;
    if (a.needs_tokens() && a.tokens + 1e-6 < s.in_loss) return true;
    return a.needs_seqs() && a.seqs + 1e-6 < (a.count_empty_rows ? s.rows : s.loss_seqs);
  };
  if (short_of(aggs[0], p.use_policy) || short_of(aggs[1], p.use_kl) || short_of(aggs[2], p.use_entropy) ||
      short_of(aggs[3], p.use_value)) {
    r.denominator_error = 1.0;
    r.loss = nan;
  }
  *result = r;
}

} // namespace detail

//! Evaluates `obj` on device inputs (see the file comment). `result` points to device memory.
//! Called with ws.data == nullptr it only stores the workspace bytes it needs in ws.bytes.
//! Never synchronises; configuration errors throw on the host before any launch.
template <class T>
void evaluate(const objective& obj, const device_objective_inputs<T>& in, const device_objective_grads<T>& grads,
              objective_result* result, workspace& ws, cudaStream_t stream) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>, "rlpt::evaluate takes float or double inputs");
  detail::objective_plan p = detail::make_plan(obj, in, grads);
  const index_t rows = in.layout.num_seqs();
  const index_t max_len = in.layout.max_len();
  const index_t tiles = max_len > 0 ? (max_len + detail::obj_tile - 1) / detail::obj_tile : 1;
  auto local = [](const detail::agg_plan& a, bool used) {
    return used && ((a.needs_tokens() && a.tokens < 0.0) || (a.needs_seqs() && a.seqs < 0.0));
  };
  const bool local_needed = local(p.agg_policy, p.use_policy) || local(p.agg_kl, p.use_kl) ||
                            local(p.agg_entropy, p.use_entropy || p.has_entropy) || local(p.agg_value, p.use_value);
  const bool row_kernel = p.need_row_pass || local_needed;

  detail::workspace_carver carve(ws);
  auto* consts = carve.take<detail::row_consts>(row_kernel ? static_cast<std::size_t>(rows) : 0);
  auto* row_len = carve.take<double>(row_kernel ? static_cast<std::size_t>(rows) : 0);
  auto* counts = carve.take<detail::device_counts>(local_needed ? 1 : 0);
  const auto blocks = static_cast<std::size_t>(rows * tiles);
  auto* partials = carve.take<objective_sums>(blocks);
  auto* dcoef = carve.take<double>(p.gspo_sequence ? blocks : 0);
  if (carve.finish_size_query()) return;
  RLPT_CHECK(result != nullptr, errors::objective::missing_input, "the device evaluate needs a result pointer");
  RLPT_CHECK(blocks <= static_cast<std::size_t>(std::numeric_limits<int>::max()), errors::objective::bad_layout,
             "{} sequences x {} tiles of {} tokens exceed the grid limit", rows, tiles, detail::obj_tile);
  if (rows == 0) {
    detail::objective_finish_kernel<<<1, 1024, 0, stream>>>(p, partials, 0, tiles, nullptr, result);
    RLPT_CUDA_CHECK_LAUNCH();
    return;
  }
  if (row_kernel) {
    detail::objective_row_kernel<T><<<static_cast<unsigned>(rows), detail::obj_threads, 0, stream>>>(p, in, consts, row_len);
    RLPT_CUDA_CHECK_LAUNCH();
  }
  if (local_needed) {
    detail::objective_count_kernel<<<1, 1024, 0, stream>>>(row_len, rows, counts);
    RLPT_CUDA_CHECK_LAUNCH();
  }
  const detail::row_consts* cptr = p.need_row_pass ? consts : nullptr;
  const detail::device_counts* nptr = local_needed ? counts : nullptr;
  detail::objective_token_kernel<T><<<static_cast<unsigned>(blocks), detail::obj_threads, 0, stream>>>(
      p, in, grads, cptr, nptr, tiles, partials, p.gspo_sequence ? dcoef : nullptr);
  RLPT_CUDA_CHECK_LAUNCH();
  if (p.gspo_sequence && grads.logp.size() != 0) {
    detail::objective_gspo_kernel<T><<<static_cast<unsigned>(blocks), detail::obj_threads, 0, stream>>>(
        p, in, grads, consts, nptr, tiles, dcoef);
    RLPT_CUDA_CHECK_LAUNCH();
  }
  detail::objective_finish_kernel<<<1, 1024, 0, stream>>>(p, partials, static_cast<index_t>(blocks), tiles, nptr,
                                                         result);
  RLPT_CUDA_CHECK_LAUNCH();
}

RLPT_NAMESPACE_END
