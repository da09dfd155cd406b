// SPDX-License-Identifier: Apache-2.0
//! @file
//! rlpt::evaluate on device memory: a whole objective (policy term, correction, KL, entropy,
//! value, distillation, aggregation, metrics) in one fused pass over the tokens plus a
//! deterministic reduction. Each thread runs the host's token stages (objective/detail/token.hpp)
//! on a chunk of one token, so host and device combine a token's terms with the same code.
//!
//!     rlpt::workspace ws;                                          // size query
//!     rlpt::evaluate(obj, d_inputs, d_grads, d_result, ws, stream);
//!     cudaMallocAsync(&ws.data, ws.bytes, stream);
//!     rlpt::evaluate(obj, d_inputs, d_grads, d_result, ws, stream); // capturable in a graph
//!
//! Kernels: [row statistics, only when a sequence-level piece or a local denominator needs
//! them] -> token pass (one block per (sequence, 1024-token tile), per-block sums) -> [GSPO
//! sequence-form gradient coupling] -> one-block reduction into *d_result. Each kernel folds all
//! its sums in one block_fold (one barrier for every value); every reduction has a fixed order
//! (per-thread strided sums, warp shuffles, warps in order), so the result bits do not depend on
//! scheduling and no atomics are used.
//!
//! Differences from the host entry point, which can throw: a non-finite input at a valid token
//! under nonfinite::raise makes result.loss NaN (result.nonfinite_tokens counts them); an
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
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

RLPT_NAMESPACE_BEGIN

template <class T> using device_objective_inputs = basic_objective_inputs<T, memory_space::device>;
template <class T> using device_objective_grads = basic_objective_grads<T, memory_space::device>;

namespace detail {

inline constexpr int obj_threads = 256;
inline constexpr int obj_tokens_per_thread = 4;
inline constexpr int obj_tile = obj_threads * obj_tokens_per_thread; // tokens per block of the token pass

//! The device's chunk: one token per thread (the stages' arrays become registers).
template <class T> using device_chunk = token_chunk<T, 1>;

//! How block_fold combines value k.
enum class fold_op : std::uint8_t { sum, min, max };

//! Fixed-order block reduction of K doubles per thread in one pass (one barrier for all K): each
//! warp folds its values with shuffles, lane 0 stores them, then thread k folds the warps' k-th
//! values in warp order. After the call (it ends with a barrier) shared[k], k < K, holds the
//! block's value k for every thread to read. `shared` holds K doubles per warp of the block, at
//! least K of them; `op(k)` says how value k combines.
template <int K, class Op> RLPT_DEVICE void block_fold(double (&v)[K], double* shared, Op op) {
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int warp = static_cast<int>(threadIdx.x) >> 5;
  const int warps = static_cast<int>(blockDim.x + 31) >> 5;
  auto fold = [&](int k, double a, double b) {
    const fold_op o = op(k);
    return o == fold_op::sum ? a + b : o == fold_op::min ? fmin(a, b) : fmax(a, b);
  };
#pragma unroll
  for (int k = 0; k < K; ++k)
    for (int o = 16; o > 0; o /= 2) v[k] = fold(k, v[k], __shfl_down_sync(0xffffffffu, v[k], o));
  if (lane == 0)
#pragma unroll
    for (int k = 0; k < K; ++k) shared[warp * K + k] = v[k];
  __syncthreads();
  const int k = static_cast<int>(threadIdx.x);
  if (k < K) {
    double r = shared[k];
    for (int w = 1; w < warps; ++w) r = fold(k, r, shared[w * K + k]);
    shared[k] = r; // only thread k touches column k
  }
  __syncthreads();
}

//! A trivially copyable struct of doubles as an array (block_fold's operand) and back.
template <class S> inline constexpr int double_fields = static_cast<int>(sizeof(S) / sizeof(double));

template <class S> RLPT_DEVICE void to_doubles(const S& s, double (&v)[double_fields<S>]) {
  static_assert(sizeof(S) % sizeof(double) == 0 && std::is_trivially_copyable_v<S>, "a struct of doubles");
  memcpy(v, &s, sizeof(S));
}

template <class S> RLPT_DEVICE S from_doubles(const double* v) {
  S s;
  memcpy(&s, v, sizeof(S));
  return s;
}

//! Local counts of a call, filled by the row kernel: tokens in the loss, rows with a token in
//! the loss, rows (the sequences seq_in_denominator leaves out are not counted).
struct device_counts {
  double tokens;
  double loss_seqs;
  double rows;
};

template <class T>
RLPT_KERNEL void __launch_bounds__(obj_threads)
    objective_row_kernel(const objective_plan p, device_objective_inputs<T> in, row_consts* consts, double* row_len) {
  constexpr int K = double_fields<row_stats>;
  __shared__ double shared[obj_threads / 32 * K];
  const index_t b = blockIdx.x;
  const index_t base = in.layout.begin(b);
  const index_t n = in.layout.length(b);
  device_chunk<T> c;
  zero_absent(p, in, c);
  row_stats st;
  for (index_t t = threadIdx.x; t < n; t += blockDim.x)
    st = row_stats_pass<inline_stages>(p, in, b, base + t, 1, c, st);
  double v[K];
  to_doubles(st, v);
  constexpr int k_max = static_cast<int>(offsetof(row_stats, rs_max) / sizeof(double)); // rs_max[0]
  block_fold(v, shared, [](int k) { return k >= k_max && k < k_max + max_rejections ? fold_op::max : fold_op::sum; });
  if (threadIdx.x == 0) {
    st = from_doubles<row_stats>(shared);
    const row_consts rc = p.need_row_pass ? row_finish(p, st) : row_consts{};
    consts[b] = rc;
    // Tokens this row keeps in the loss (its contribution to the local denominators).
    row_len[b] = p.need_row_pass ? rc.len_loss : (p.drops_count ? st.len_keep : st.len);
  }
}

//! Sums the per-row lengths into the local denominators (one block, fixed order), leaving out
//! the rows whose `counted` byte is 0 (seq_in_denominator; nullptr: every row counts).
template <int = 0> // a template: a kernel defined in a header must not clash across TUs
RLPT_KERNEL void __launch_bounds__(1024)
    objective_count_kernel(const double* row_len, const mask_t* counted, index_t rows, device_counts* out) {
  __shared__ double shared[32 * 3];
  double v[3] = {0.0, 0.0, 0.0}; // tokens, rows with a token in the loss, rows
  for (index_t b = threadIdx.x; b < rows; b += blockDim.x) {
    if (counted != nullptr && counted[b] == 0) continue;
    v[0] += row_len[b];
    v[1] += row_len[b] > 0.0 ? 1.0 : 0.0;
    v[2] += 1.0;
  }
  block_fold(v, shared, [](int) { return fold_op::sum; });
  if (threadIdx.x == 0) *out = {shared[0], shared[1], shared[2]};
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

//! The constants of row b's token pass (row statistics from the row kernel, or none needed).
RLPT_DEVICE row_consts device_row_consts(const objective_plan& p, const row_consts* consts, const device_counts* counts,
                                         index_t b) {
  row_consts c;
  if (consts != nullptr)
    c = consts[b];
  else
    c.len_loss = 1.0; // no term depends on the length
  device_alphas(p, counts, c);
  return c;
}

//! Blocks of the token pass per SM the register allocation must allow: 4 in fp32 (64 registers,
//! no spill), 2 in fp64 (128 registers).
template <class T> inline constexpr int obj_token_min_blocks = sizeof(T) == sizeof(float) ? 4 : 2;

//! The token pass: one block per (sequence, tile), each thread running the stages on its tokens;
//! one fold of the block's sums, then its first thread writes the tile's objective_sums.
template <class T>
RLPT_KERNEL void __launch_bounds__(obj_threads, obj_token_min_blocks<T>)
    objective_token_kernel(const objective_plan p, device_objective_inputs<T> in, device_objective_grads<T> gr,
                           const row_consts* consts, const device_counts* counts, index_t tiles,
                           objective_sums* partials, double* coupling_partials) {
  using acc_t = token_acc<double, double>;
  constexpr int K = double_fields<acc_t>;
  __shared__ double shared[obj_threads / 32 * K];
  __shared__ row_consts rc; // formed once per block; read again after the loop rather than kept live
  const index_t b = static_cast<index_t>(blockIdx.x) / tiles;
  const index_t tile = static_cast<index_t>(blockIdx.x) % tiles;
  const index_t n = in.layout.length(b);
  const index_t base = in.layout.begin(b);
  if (threadIdx.x == 0) rc = device_row_consts(p, consts, counts, b);
  __syncthreads();
  const token_consts<T> k = make_token_consts<T>(p, rc);
  device_chunk<T> c;
  zero_absent(p, in, c);
  token_acc<T, std::uint32_t> a; // in the compute type: a thread adds a few tokens
  const index_t t0 = tile * obj_tile;
  const index_t t1 = t0 + obj_tile < n ? t0 + obj_tile : n;
  for (index_t t = t0 + threadIdx.x; t < t1; t += blockDim.x)
    a = token_pass<inline_stages>(p, k, in, gr, b, base + t, 1, c, a);
  const acc_t d{a.policy,
                a.kl,
                a.entropy,
                a.value,
                a.dcoef,
                a.approx_kl,
                a.w_sum,
                a.w_min,
                a.w_max,
                static_cast<double>(a.valid),
                static_cast<double>(a.in_loss),
                static_cast<double>(a.rejected),
                static_cast<double>(a.nonfinite),
                static_cast<double>(a.low),
                static_cast<double>(a.high),
                static_cast<double>(a.dual),
                static_cast<double>(a.clamped),
                static_cast<double>(a.vclip)};
  double v[K];
  to_doubles(d, v);
  constexpr int k_min = static_cast<int>(offsetof(acc_t, w_min) / sizeof(double));
  constexpr int k_max = static_cast<int>(offsetof(acc_t, w_max) / sizeof(double));
  block_fold(v, shared, [](int i) { return i == k_min ? fold_op::min : i == k_max ? fold_op::max : fold_op::sum; });
  if (threadIdx.x == 0) {
    const acc_t s = from_doubles<acc_t>(shared);
    partials[blockIdx.x] = row_sums(p, rc, s, /*head=*/tile == 0); // row-level pieces once per row
    if (coupling_partials != nullptr) {                            // the tile's sums coupling_numerator takes
      coupling_partials[2 * blockIdx.x] = s.dcoef;
      coupling_partials[2 * blockIdx.x + 1] = s.kl;
    }
  }
}

//! Sequence form (GSPO, SAPO) and the KL weighted by the sequence ratio: adds the row's coupling
//! (sequence_coupling) to every in-loss token's gradient. coupling_partials holds each tile's (dcoef, kl) sums.
template <class T>
RLPT_KERNEL void __launch_bounds__(obj_threads)
    objective_coupling_kernel(const objective_plan p, device_objective_inputs<T> in, device_objective_grads<T> gr,
                              const row_consts* consts, const device_counts* counts, index_t tiles,
                              const double* coupling_partials) {
  const index_t b = static_cast<index_t>(blockIdx.x) / tiles;
  const index_t tile = static_cast<index_t>(blockIdx.x) % tiles;
  double dcoef = 0.0, kl = 0.0;
  for (index_t j = 0; j < tiles; ++j) { // fixed order
    dcoef += coupling_partials[2 * (b * tiles + j)];
    kl += coupling_partials[2 * (b * tiles + j) + 1];
  }
  const row_consts rc = device_row_consts(p, consts, counts, b);
  const double num = coupling_numerator(p, rc, dcoef, kl);
  if (num == 0.0) return;
  const token_consts<T> k = make_token_consts<T>(p, rc);
  const T scale = static_cast<T>(sequence_coupling(rc, num));
  const index_t n = in.layout.length(b);
  const index_t base = in.layout.begin(b);
  device_chunk<T> c;
  zero_absent(p, in, c);
  const index_t t0 = tile * obj_tile;
  const index_t t1 = t0 + obj_tile < n ? t0 + obj_tile : n;
  for (index_t t = t0 + threadIdx.x; t < t1; t += blockDim.x)
    coupling_pass<inline_stages>(p, k, in, gr, scale, b, base + t, 1, c);
}

inline constexpr int obj_finish_threads = 256;

//! Reduces the per-block sums in a fixed order and writes the result.
template <int = 0>
RLPT_KERNEL void __launch_bounds__(obj_finish_threads)
    objective_finish_kernel(const objective_plan p, const objective_sums* partials, index_t blocks, index_t tiles,
                            const device_counts* counts, objective_result* result) {
  // With seq_in_denominator the rows' sums count every sequence: the explicit global denominators
  // are checked against the counts that leave the marked ones out (the count kernel's).
  constexpr int K = double_fields<objective_sums>;
  __shared__ double shared[obj_finish_threads / 32 * K];
  objective_sums s;
  double seqs = 0.0, loss_seqs = 0.0;
  // Rows: a row's tiles together decide whether it has a valid / in-loss token.
  const index_t rows = tiles > 0 ? blocks / tiles : 0;
  for (index_t b = threadIdx.x; b < rows; b += blockDim.x) {
    double valid = 0.0, in_loss = 0.0;
    for (index_t j = 0; j < tiles; ++j) {
      const objective_sums& q = partials[b * tiles + j];
      s.merge(q);
      valid += q.valid;
      in_loss += q.in_loss;
    }
    seqs += valid > 0.0 ? 1.0 : 0.0;
    loss_seqs += in_loss > 0.0 ? 1.0 : 0.0;
  }
  s.seqs = seqs;
  s.loss_seqs = loss_seqs;
  double v[K];
  to_doubles(s, v);
  constexpr int k_min = static_cast<int>(offsetof(objective_sums, w_min) / sizeof(double));
  constexpr int k_max = static_cast<int>(offsetof(objective_sums, w_max) / sizeof(double));
  block_fold(v, shared, [](int i) { return i == k_min ? fold_op::min : i == k_max ? fold_op::max : fold_op::sum; });
  if (threadIdx.x != 0) return;
  s = from_doubles<objective_sums>(shared);
  const agg_plan aggs[4] = {resolve_device(p.agg_policy, counts), resolve_device(p.agg_kl, counts),
                            resolve_device(p.agg_entropy, counts), resolve_device(p.agg_value, counts)};
  objective_result r = finish_result(p, s);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  if (s.nonfinite > 0.0 && p.nonfinite == nonfinite::raise) r.loss = nan;
  const device_counts own =
      p.has_den_mask && counts != nullptr ? *counts : device_counts{s.in_loss, s.loss_seqs, s.rows};
  auto short_of = [&](const agg_plan& a, bool used) {
    if (!used) return false;
    if (a.needs_tokens() && a.tokens + 1e-6 < own.tokens) return true;
    return a.needs_seqs() && a.seqs + 1e-6 < (a.count_empty_rows ? own.rows : own.loss_seqs);
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
  RLPT_CHECK(!p.w_norm_local, errors::objective::missing_input,
             "is_weighting.batch_normalize on the device needs is_weighting.batch_mean (the step's mean weight: "
             "rlpt::local_is_weights on the host, summed over micro-batches); the device evaluate takes no batch mean "
             "of its own");
  const index_t rows = in.layout.num_seqs();
  const index_t max_len = in.layout.max_len();
  const index_t tiles = max_len > 0 ? (max_len + detail::obj_tile - 1) / detail::obj_tile : 1;
  auto local = [](const detail::agg_plan& a, bool used) {
    return used && ((a.needs_tokens() && a.tokens < 0.0) || (a.needs_seqs() && a.seqs < 0.0));
  };
  const bool local_needed = local(p.agg_policy, p.use_policy) || local(p.agg_kl, p.use_kl) ||
                            local(p.agg_entropy, p.use_entropy || p.has_entropy) || local(p.agg_value, p.use_value);
  const bool counted = local_needed || p.has_den_mask; // the count kernel runs (its counts check the globals)
  const bool row_kernel = p.need_row_pass || counted;

  detail::workspace_carver carve(ws);
  auto* consts = carve.take<detail::row_consts>(row_kernel ? static_cast<std::size_t>(rows) : 0);
  auto* row_len = carve.take<double>(row_kernel ? static_cast<std::size_t>(rows) : 0);
  auto* counts = carve.take<detail::device_counts>(counted ? 1 : 0);
  const auto blocks = static_cast<std::size_t>(rows * tiles);
  auto* partials = carve.take<detail::objective_sums>(blocks);
  auto* coupling = carve.take<double>(p.coupled ? 2 * blocks : 0); // (dcoef, kl) per tile
  if (carve.finish_size_query()) return;
  RLPT_CHECK(result != nullptr, errors::objective::missing_input, "the device evaluate needs a result pointer");
  RLPT_CHECK(blocks <= static_cast<std::size_t>(std::numeric_limits<int>::max()), errors::objective::bad_layout,
             "{} sequences x {} tiles of {} tokens exceed the grid limit", rows, tiles, detail::obj_tile);
  if (rows == 0) {
    detail::objective_finish_kernel<<<1, detail::obj_finish_threads, 0, stream>>>(p, partials, 0, tiles, nullptr,
                                                                                  result);
    RLPT_CUDA_CHECK_LAUNCH();
    return;
  }
  if (row_kernel) {
    detail::objective_row_kernel<T>
        <<<static_cast<unsigned>(rows), detail::obj_threads, 0, stream>>>(p, in, consts, row_len);
    RLPT_CUDA_CHECK_LAUNCH();
  }
  if (counted) {
    const mask_t* in_den = p.has_den_mask ? in.seq_in_denominator.data() : nullptr;
    detail::objective_count_kernel<<<1, 1024, 0, stream>>>(row_len, in_den, rows, counts);
    RLPT_CUDA_CHECK_LAUNCH();
  }
  const detail::row_consts* cptr = p.need_row_pass ? consts : nullptr;
  const detail::device_counts* nptr = local_needed ? counts : nullptr;
  detail::objective_token_kernel<T><<<static_cast<unsigned>(blocks), detail::obj_threads, 0, stream>>>(
      p, in, grads, cptr, nptr, tiles, partials, p.coupled ? coupling : nullptr);
  RLPT_CUDA_CHECK_LAUNCH();
  if (p.coupled && grads.logp.size() != 0) {
    detail::objective_coupling_kernel<T><<<static_cast<unsigned>(blocks), detail::obj_threads, 0, stream>>>(
        p, in, grads, consts, nptr, tiles, coupling);
    RLPT_CUDA_CHECK_LAUNCH();
  }
  detail::objective_finish_kernel<<<1, detail::obj_finish_threads, 0, stream>>>(
      p, partials, static_cast<index_t>(blocks), tiles, counted ? counts : nullptr, result);
  RLPT_CUDA_CHECK_LAUNCH();
}

RLPT_NAMESPACE_END
