// SPDX-License-Identifier: Apache-2.0
//! @file
//! Fused lm-head on the device: hidden [N, D] × weight [V, D]ᵀ -> logprob/entropy with cuBLAS
//! GEMM tiles (bf16/f16 tensor cores, fp32 accumulate and fp32 output) and fused epilogue
//! kernels that fold each [token_tile, vocab_tile] fp32 logits tile into an online
//! log-sum-exp per token. The [N, V] logits never exist; the workspace is
//! token_tile·vocab_tile fp32 + token_tile·D (padded last token tile) + 16 B per token tile row,
//! independent of N and V.
//!
//! Every GEMM has the fixed shape (vocab_tile or the last slab) × token_tile × D (the last token
//! tile is copied into a zero-padded buffer), and cuBLAS is bitwise reproducible for a fixed
//! shape, so a token's result does not depend on N or its position.
//!
//! Backward, per vocabulary slab and token tile: recompute the tile, turn it into dlogits (fp32
//! math, stored in the hidden dtype for the tensor cores, as Liger and verl do), then
//! grad_hidden += dlogits · W_slab and grad_weight[slab] += dlogitsᵀ · hidden (fp32 outputs):
//! 8·N·D·V FLOPs in all.
//!
//! The caller's cuBLAS handle runs on `stream` during the call and is given back on the stream it
//! had (cublas_stream_scope: switched only when it differs, since cublasSetStream also resets a
//! workspace set with cublasSetWorkspace). With device_lm_head_options::fold_stream the forward's
//! folds overlap the next GEMM.
//!
//! The one device header that calls cuBLAS, so no umbrella includes it: include it by name and
//! link rlpt::cuda_lm_head (rlpt::cuda + CUDA::cublas).
#pragma once

#include <rlpt/config.hpp>
#include <rlpt/core/error.hpp>
#include <rlpt/core/views.hpp>
#include <rlpt/cuda/error.cuh>
#include <rlpt/cuda/logprob/detail.cuh>
#include <rlpt/cuda/logprob/from_logits.cuh>
#include <rlpt/cuda/workspace.cuh>
#include <rlpt/logprob/math.hpp>
#include <rlpt/logprob/options.hpp>
#include <rlpt/logprob/vocab_parallel.hpp>

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <type_traits>

RLPT_NAMESPACE_BEGIN

struct device_lm_head_options {
  //! logits = (hidden · weightᵀ) / T: the GEMM gives the raw logits, the folds divide them
  //! (detail::temper, as every logprob path and every peer does).
  float temperature = 1.0f;
  //! Targets equal to this are not scored (torch cross_entropy: −100).
  index_t ignore_index = -100;
  //! Tokens per GEMM (fixed, the last tile padded): 4096 keeps every GEMM large enough for
  //! the tensor cores.
  index_t token_tile = 4096;
  //! Vocabulary columns per GEMM: the fp32 tile is token_tile·vocab_tile·4 bytes (64 MiB).
  index_t vocab_tile = 4096;
  //! Forward only: a second stream of the caller's on which the tile folds run, so that the
  //! GEMM of the next vocabulary slab overlaps the fold of this one (two fp32 tiles in the
  //! workspace instead of one; per call, 4 events are created and released). Null (the
  //! default): everything runs on the call's stream, each fold waiting for its GEMM. The
  //! results are the same bits either way (the folds keep their order).
  cudaStream_t fold_stream = nullptr;
};

namespace detail {

inline void check_cublas(cublasStatus_t status, const char* expr, const char* file, int line) {
  if (RLPT_UNLIKELY(status != CUBLAS_STATUS_SUCCESS))
    RLPT_FAIL(errors::cuda::cublas, "{} failed with status {} at {}:{}", expr, static_cast<int>(status), file, line);
}
#define RLPT_LOGPROB_CUBLAS_CHECK(expr) ::rlpt::detail::check_cublas((expr), #expr, __FILE__, __LINE__)

//! Runs a cuBLAS handle on `stream` for a scope and gives it back as it was: the caller's handle
//! keeps its own stream after the call. The stream is only switched when it differs (cuBLAS's
//! cublasSetStream also resets a workspace set with cublasSetWorkspace to its default pool).
class cublas_stream_scope {
public:
  cublas_stream_scope(cublasHandle_t handle, cudaStream_t stream) : handle_(handle) {
    check_cublas(cublasGetStream(handle, &saved_), "cublasGetStream", __FILE__, __LINE__);
    switched_ = saved_ != stream;
    if (switched_) check_cublas(cublasSetStream(handle, stream), "cublasSetStream", __FILE__, __LINE__);
  }
  ~cublas_stream_scope() {
    if (switched_) (void)cublasSetStream(handle_, saved_); // a destructor cannot raise
  }
  cublas_stream_scope(const cublas_stream_scope&) = delete;
  cublas_stream_scope& operator=(const cublas_stream_scope&) = delete;

private:
  cublasHandle_t handle_;
  cudaStream_t saved_ = nullptr;
  bool switched_ = false;
};

//! Events created for one call and released when it returns (cudaEventDestroy defers the release
//! until pending work on them completes).
class call_events {
public:
  explicit call_events(int n) : n_(n) {
    for (int i = 0; i < n_; ++i) RLPT_CUDA_CHECK(cudaEventCreateWithFlags(&ev_[i], cudaEventDisableTiming));
  }
  ~call_events() {
    for (int i = 0; i < n_; ++i)
      if (ev_[i] != nullptr) (void)cudaEventDestroy(ev_[i]);
  }
  call_events(const call_events&) = delete;
  call_events& operator=(const call_events&) = delete;
  [[nodiscard]] cudaEvent_t operator[](int i) const noexcept { return ev_[i]; }

private:
  int n_;
  cudaEvent_t ev_[4] = {};
};

template <class T> inline constexpr cudaDataType_t cuda_type = CUDA_R_32F;
template <> inline constexpr cudaDataType_t cuda_type<bf16> = CUDA_R_16BF;
template <> inline constexpr cudaDataType_t cuda_type<f16> = CUDA_R_16F;

namespace cuda_lp {

//! Folds row i of a [rows, cols] fp32 tile of logits into the token's running state (base 2,
//! tempered as every logprob kernel: z = x / T) and picks up the target's z when it lies in
//! this slab.
template <int BLOCK>
RLPT_KERNEL void __launch_bounds__(BLOCK)
    tile_fold_kernel(const float* tile, index_t cols, index_t col_begin, tempering tp, state2* states, float* target_z,
                     const index_t* targets, index_t ignore_index) {
  __shared__ state2 smem[BLOCK / 32];
  const index_t i = blockIdx.x;
  const float* x = tile + i * cols;
  state2 st = block_merge<BLOCK>(row_state<float, BLOCK, true>(x, cols, tp), smem);
  if (threadIdx.x != 0) return;
  states[i] = merge(states[i], st);
  const index_t y = targets[i] - col_begin;
  if (targets[i] != ignore_index && y >= 0 && y < cols) target_z[i] = temper(x[y], tp);
}

struct lm_finish_args {
  index_t rows, vocab;
  const state2* states;
  const float* target_z;
  const index_t* targets;
  index_t ignore_index;
  float* logp;
  float* entropy;
  float* lse;
  mask_t* scored;
  index_t* counters;
};

template <int = 0> // a template: a kernel defined in a header must not clash across TUs
RLPT_KERNEL void lm_finish_kernel(lm_finish_args a) {
  const index_t i = static_cast<index_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= a.rows) return;
  const state2 st = a.states[i];
  const row_result res = finish(st);
  if (res.lse != res.lse && a.counters != nullptr) atomicAdd(reinterpret_cast<unsigned long long*>(a.counters), 1ull);
  const index_t y = a.targets[i];
  const bool has = y != a.ignore_index;
  const bool ok = y >= 0 && y < a.vocab;
  if (has && !ok && a.counters != nullptr) atomicAdd(reinterpret_cast<unsigned long long*>(a.counters + 1), 1ull);
  const float logp = has ? (ok ? lse2_logp(a.target_z[i], st) : NAN) : 0.0f;
  const bool dropped = has && ok && logp == -INFINITY; // logit −inf: probability 0
  if (dropped && a.counters != nullptr) atomicAdd(reinterpret_cast<unsigned long long*>(a.counters + 2), 1ull);
  a.logp[i] = logp;
  if (a.entropy != nullptr) a.entropy[i] = res.entropy;
  if (a.lse != nullptr) a.lse[i] = res.lse;
  if (a.scored != nullptr) a.scored[i] = has && ok && !dropped ? 1 : 0;
}

//! Vocab-parallel stage 1 from a shard's token-tile states: comm = [m | s | a | t] in natural
//! units, exactly as vocab_parallel_local writes it (a target outside [0, V) gives NaN).
template <int = 0>
RLPT_KERNEL void lm_local_kernel(const state2* states, const float* target_z, const index_t* targets, index_t vocab,
                                 index_t ignore_index, index_t rows, index_t n, float* comm, float* local_max) {
  const index_t i = static_cast<index_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows) return;
  const lse_state nat = lse2_natural(states[i]);
  comm[i] = nat.m;
  comm[n + i] = nat.s;
  comm[2 * n + i] = nat.a;
  comm[3 * n + i] = vocab_target_invalid(targets[i], vocab, ignore_index) ? NAN : target_z[i];
  local_max[i] = nat.m;
}

template <int = 0> RLPT_KERNEL void init_states_kernel(state2* states, float* target_z, index_t n) {
  const index_t i = static_cast<index_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  states[i] = empty_state();
  target_z[i] = 0.0f;
}

//! dlogits of one tile row (fp32 math, the element rule of every device backward), written in
//! the GEMM input type D. The tile holds raw logits; the gradient is w.r.t. them.
template <class D, int BLOCK>
RLPT_KERNEL void __launch_bounds__(BLOCK)
    tile_grad_kernel(const float* tile, D* dz, index_t cols, index_t col_begin, index_t live_rows, tempering tp,
                     const index_t* targets, index_t ignore_index, const float* dlogp, const float* dentropy,
                     const float* entropy, const float* lse) {
  const index_t i = blockIdx.x;
  const float* x = tile + i * cols;
  D* g = dz + i * cols;
  const bool live = i < live_rows;
  const bool scored = live && targets[i] != ignore_index && dlogp != nullptr;
  const float glp = scored ? dlogp[i] : 0.0f;
  const float gh = live && dentropy != nullptr ? dentropy[i] : 0.0f;
  backward_row b{};
  b.zero = glp == 0.0f && gh == 0.0f;
  b.gl = glp / tp.t;
  b.gh = gh / tp.t;
  b.h = gh != 0.0f ? entropy[i] : 0.0f;
  b.lse = live ? lse[i] : 0.0f;
  b.thr = -INFINITY;
  b.tie = cols - 1;
  b.target = scored ? targets[i] - col_begin : -1;
  for (index_t j = threadIdx.x; j < cols; j += BLOCK)
    g[j] = store_grad<D>(b.zero ? 0.0f : backward_element(x[j], j, b, tp));
}

//! Copies rows [r0, r0 + rows) of hidden into a dense [tile, D] buffer, zero rows after them.
template <class H>
void pad_tile(const H* src, index_t src_stride, index_t r0, index_t rows, index_t tile, index_t d, H* dst,
              cudaStream_t stream) {
  RLPT_CUDA_CHECK(cudaMemcpy2DAsync(dst, static_cast<std::size_t>(d) * sizeof(H), src + r0 * src_stride,
                                    static_cast<std::size_t>(src_stride) * sizeof(H),
                                    static_cast<std::size_t>(d) * sizeof(H), static_cast<std::size_t>(rows),
                                    cudaMemcpyDeviceToDevice, stream));
  if (rows < tile)
    RLPT_CUDA_CHECK(
        cudaMemsetAsync(dst + rows * d, 0, static_cast<std::size_t>((tile - rows) * d) * sizeof(H), stream));
}

//! C[rows × cols] (row-major fp32, ld = cols) = alpha · H_tile[rows × D] · W_slab[cols × D]ᵀ.
template <class H>
void tile_gemm(cublasHandle_t handle, const H* h, index_t hld, const H* w, index_t wld, index_t rows, index_t cols,
               index_t d, float alpha, float* c) {
  const float beta = 0.0f;
  RLPT_LOGPROB_CUBLAS_CHECK(cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(cols),
                                         static_cast<int>(rows), static_cast<int>(d), &alpha, w, cuda_type<H>,
                                         static_cast<int>(wld), h, cuda_type<H>, static_cast<int>(hld), &beta, c,
                                         CUDA_R_32F, static_cast<int>(cols), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

template <class H, class W>
void check_device_lm_head(device_view2d<H> hidden, device_view2d<W> weight, device_view<const index_t> targets,
                          const device_lm_head_options& o) {
  RLPT_CHECK(o.temperature > 0.0f && std::isfinite(o.temperature), errors::logprob::temperature,
             "temperature must be finite and > 0, got {}", o.temperature);
  RLPT_CHECK(o.token_tile > 0 && o.vocab_tile > 0, errors::logprob::bad_tile,
             "token_tile ({}) and vocab_tile ({}) must be positive", o.token_tile, o.vocab_tile);
  RLPT_CHECK(hidden.cols() > 0 && hidden.cols() == weight.cols(), errors::logprob::shape_mismatch,
             "hidden is [{}, {}] and weight is [{}, {}]: both need the same positive hidden size D", hidden.rows(),
             hidden.cols(), weight.rows(), weight.cols());
  RLPT_CHECK(weight.rows() > 0, errors::logprob::shape_mismatch, "weight has 0 rows: the vocabulary is empty");
  RLPT_CHECK(hidden.cols() < (index_t{1} << 31) && weight.rows() < (index_t{1} << 31) &&
                 hidden.row_stride() < (index_t{1} << 31) && weight.row_stride() < (index_t{1} << 31),
             errors::logprob::shape_mismatch, "dimensions above 2^31 do not fit cuBLAS's int arguments");
  expect_size("targets", targets.size(), hidden.rows(), "one per hidden row");
}

} // namespace cuda_lp
} // namespace detail

namespace detail::cuda_lp {

//! Forward loop shared by the full head and a vocab-parallel shard: `emit(r0, rows, states,
//! target_z)` consumes each finished token tile (on `stream`). With opt.fold_stream, slab k's
//! fold runs there while slab k + 1's GEMM runs on `stream` (tiles alternate between two
//! buffers; events order GEMM k -> fold k and fold k -> GEMM k + 2).
template <class E, class Emit>
void lm_head_forward(workspace& ws, device_view2d<const E> hidden, device_view2d<const E> weight,
                     device_view<const index_t> targets, index_t col_begin, cublasHandle_t cublas,
                     const device_lm_head_options& opt, cudaStream_t stream, Emit&& emit, bool& size_query) {
  const index_t n = hidden.rows(), d = hidden.cols(), v = weight.rows();
  const index_t tt = opt.token_tile, vt = std::min(opt.vocab_tile, v);
  const bool overlap = opt.fold_stream != nullptr && opt.fold_stream != stream;
  workspace_carver carve(ws);
  float* tiles[2] = {carve.take<float>(static_cast<std::size_t>(tt * vt)), nullptr};
  if (overlap) tiles[1] = carve.take<float>(static_cast<std::size_t>(tt * vt));
  E* padded = carve.take<E>(static_cast<std::size_t>(tt * d));
  auto* states = carve.take<state2>(static_cast<std::size_t>(tt));
  float* target_z = carve.take<float>(static_cast<std::size_t>(tt));
  size_query = carve.finish_size_query();
  if (size_query) return;
  const cublas_stream_scope on_stream(cublas, stream);
  const tempering tp = tempering::of(opt.temperature); // the GEMM gives raw logits; folds divide
  const call_events ev(overlap ? 4 : 0);               // [0, 1]: GEMM done; [2, 3]: fold done
  const cudaStream_t fs = overlap ? opt.fold_stream : stream;
  index_t k = 0; // slab counter over the whole call: buffer k % 2
  for (index_t r0 = 0; r0 < n; r0 += tt) {
    const index_t rows = std::min(tt, n - r0);
    const E* hp = hidden.data() + r0 * hidden.row_stride();
    index_t hld = hidden.row_stride();
    if (rows < tt) { // fixed GEMM shape: pad the last tile
      pad_tile(hidden.data(), hidden.row_stride(), r0, rows, tt, d, padded, stream);
      hp = padded;
      hld = d;
    }
    init_states_kernel<<<static_cast<unsigned>((tt + 255) / 256), 256, 0, stream>>>(states, target_z, tt);
    RLPT_CUDA_CHECK_LAUNCH();
    for (index_t c0 = 0; c0 < v; c0 += vt, ++k) {
      const index_t cols = std::min(vt, v - c0);
      const int buf = overlap ? static_cast<int>(k % 2) : 0;
      if (overlap && k >= 2) RLPT_CUDA_CHECK(cudaStreamWaitEvent(stream, ev[2 + buf], 0)); // fold k − 2 read it
      tile_gemm<E>(cublas, hp, hld, weight.data() + c0 * weight.row_stride(), weight.row_stride(), tt, cols, d, 1.0f,
                   tiles[buf]);
      if (overlap) {
        RLPT_CUDA_CHECK(cudaEventRecord(ev[buf], stream));
        RLPT_CUDA_CHECK(cudaStreamWaitEvent(fs, ev[buf], 0)); // also orders init_states and pad before it
      }
      tile_fold_kernel<256><<<static_cast<unsigned>(rows), 256, 0, fs>>>(
          tiles[buf], cols, col_begin + c0, tp, states, target_z, targets.data() + r0, opt.ignore_index);
      RLPT_CUDA_CHECK_LAUNCH();
      if (overlap) RLPT_CUDA_CHECK(cudaEventRecord(ev[2 + buf], fs));
    }
    if (overlap) RLPT_CUDA_CHECK(cudaStreamWaitEvent(stream, ev[2 + static_cast<int>((k - 1) % 2)], 0));
    emit(r0, rows, states, target_z);
  }
}

} // namespace detail::cuda_lp

//! Device forward of the fused lm-head. hidden and weight share one dtype (bf16, f16 or f32).
//! `ws.data == nullptr`: size query (nothing else happens).
template <class H, class W>
void fused_lm_head_logprob(workspace& ws, device_view2d<H> hidden, device_view2d<W> weight,
                           device_view<const index_t> targets, const device_logprob_outputs& out, cublasHandle_t cublas,
                           const device_lm_head_options& opt, cudaStream_t stream) {
  using E = std::remove_const_t<H>;
  static_assert(std::is_same_v<E, std::remove_const_t<W>>, "hidden and weight must have the same dtype");
  static_assert(std::is_same_v<E, bf16> || std::is_same_v<E, f16> || std::is_same_v<E, float>,
                "the device lm-head takes bf16, f16 or f32 hidden/weight");
  namespace lp = detail::cuda_lp;
  lp::check_device_lm_head(hidden, weight, targets, opt);
  const index_t n = hidden.rows(), v = weight.rows();
  if (!ws.is_size_query()) {
    lp::check_device_outputs(out, n);
    RLPT_CHECK(out.kept.data() == nullptr && out.threshold.empty() && out.tie_last.empty(),
               errors::logprob::unsupported,
               "the fused lm-head scores the full softmax: no kept mask or truncation statistics");
    if (!out.counters.empty()) RLPT_CUDA_CHECK(cudaMemsetAsync(out.counters.data(), 0, 3 * sizeof(index_t), stream));
  }
  bool size_query = false;
  lp::lm_head_forward<E>(
      ws, device_view2d<const E>(hidden), device_view2d<const E>(weight), targets, 0, cublas, opt, stream,
      [&](index_t r0, index_t rows, const lp::state2* states, const float* target_z) {
        const lp::lm_finish_args a{rows,
                                   v,
                                   states,
                                   target_z,
                                   targets.data() + r0,
                                   opt.ignore_index,
                                   out.logp.data() + r0,
                                   out.entropy.empty() ? nullptr : out.entropy.data() + r0,
                                   out.lse.empty() ? nullptr : out.lse.data() + r0,
                                   out.scored.empty() ? nullptr : out.scored.data() + r0,
                                   out.counters.empty() ? nullptr : out.counters.data()};
        lp::lm_finish_kernel<<<static_cast<unsigned>((rows + 255) / 256), 256, 0, stream>>>(a);
        RLPT_CUDA_CHECK_LAUNCH();
      },
      size_query);
}

//! Vocab-parallel stage 1 of a fused lm-head shard on the device: weight_local holds rows
//! [shard.begin, shard.begin + V_local) of the head; fills `comm` and `local_max` like
//! vocab_parallel_local (then vocab_parallel_rebase / vocab_parallel_finish, with the caller's
//! all-reduces in between). Same workspace as fused_lm_head_logprob.
template <class H, class W>
void fused_lm_head_local(workspace& ws, device_view2d<H> hidden, device_view2d<W> weight_local,
                         device_view<const index_t> targets, vocab_shard shard, device_view<float> comm,
                         device_view<float> local_max, cublasHandle_t cublas, const device_lm_head_options& opt,
                         cudaStream_t stream) {
  using E = std::remove_const_t<H>;
  static_assert(std::is_same_v<E, std::remove_const_t<W>>, "hidden and weight must have the same dtype");
  namespace lp = detail::cuda_lp;
  lp::check_device_lm_head(hidden, weight_local, targets, opt);
  detail::check_shard(shard, weight_local.rows());
  const index_t n = hidden.rows();
  detail::expect_size("comm", comm.size(), vocab_parallel_buffer_size(n), "4 floats per row");
  detail::expect_size("local_max", local_max.size(), n, "one per row");
  bool size_query = false;
  lp::lm_head_forward<E>(
      ws, device_view2d<const E>(hidden), device_view2d<const E>(weight_local), targets, shard.begin, cublas, opt,
      stream,
      [&](index_t r0, index_t rows, const lp::state2* states, const float* target_z) {
        lp::lm_local_kernel<<<static_cast<unsigned>((rows + 255) / 256), 256, 0, stream>>>(
            states, target_z, targets.data() + r0, shard.vocab, opt.ignore_index, rows, n, comm.data() + r0,
            local_max.data() + r0);
        RLPT_CUDA_CHECK_LAUNCH();
      },
      size_query);
}

//! Device backward of the fused lm-head: grad_hidden (+)= ∂/∂hidden, grad_weight (+)=
//! ∂/∂weight (fp32; either may be empty), from the forward's entropy and lse. With `shard`,
//! the weight is a vocab-parallel shard (targets are global ids; all-reduce grad_hidden).
template <class H, class W>
void fused_lm_head_backward(workspace& ws, device_view2d<H> hidden, device_view2d<W> weight,
                            device_view<const index_t> targets, device_view<const float> dlogp,
                            device_view<const float> dentropy, device_view<const float> entropy,
                            device_view<const float> lse, device_view2d<float> grad_hidden,
                            device_view2d<float> grad_weight, cublasHandle_t cublas, const device_lm_head_options& opt,
                            cudaStream_t stream, vocab_shard shard = {}, bool accumulate = false) {
  using E = std::remove_const_t<H>;
  static_assert(std::is_same_v<E, std::remove_const_t<W>>, "hidden and weight must have the same dtype");
  namespace lp = detail::cuda_lp;
  lp::check_device_lm_head(hidden, weight, targets, opt);
  const index_t n = hidden.rows(), d = hidden.cols(), v = weight.rows();
  if (shard.vocab == 0) shard.vocab = v;
  detail::check_shard(shard, v);
  const index_t tt = opt.token_tile, vt = std::min(opt.vocab_tile, v);
  detail::workspace_carver carve(ws);
  float* tile = carve.take<float>(static_cast<std::size_t>(tt * vt));
  E* padded = carve.take<E>(static_cast<std::size_t>(tt * d));
  E* dz = carve.take<E>(static_cast<std::size_t>(tt * vt));
  if (carve.finish_size_query()) return;
  detail::expect_size_or_empty("dlogp", dlogp.size(), n, "one per row");
  detail::expect_size_or_empty("dentropy", dentropy.size(), n, "one per row");
  detail::expect_size("lse", lse.size(), n, "the forward's lse: one per row");
  if (!dentropy.empty()) detail::expect_size("entropy", entropy.size(), n, "the forward's entropy: one per row");
  const bool want_gh = grad_hidden.data() != nullptr, want_gw = grad_weight.data() != nullptr;
  if (want_gh)
    RLPT_CHECK(grad_hidden.rows() == n && grad_hidden.cols() == d, errors::logprob::shape_mismatch,
               "grad_hidden is [{}, {}], expected [{}, {}] like hidden", grad_hidden.rows(), grad_hidden.cols(), n, d);
  if (want_gw)
    RLPT_CHECK(grad_weight.rows() == v && grad_weight.cols() == d, errors::logprob::shape_mismatch,
               "grad_weight is [{}, {}], expected [{}, {}] like weight", grad_weight.rows(), grad_weight.cols(), v, d);
  if (!want_gh && !want_gw) return;
  const detail::cublas_stream_scope on_stream(cublas, stream);
  if (!accumulate) {
    if (want_gh)
      RLPT_CUDA_CHECK(cudaMemset2DAsync(grad_hidden.data(), static_cast<std::size_t>(grad_hidden.row_stride()) * 4, 0,
                                        static_cast<std::size_t>(d) * 4, static_cast<std::size_t>(n), stream));
    if (want_gw)
      RLPT_CUDA_CHECK(cudaMemset2DAsync(grad_weight.data(), static_cast<std::size_t>(grad_weight.row_stride()) * 4, 0,
                                        static_cast<std::size_t>(d) * 4, static_cast<std::size_t>(v), stream));
  }
  const tempering tp = tempering::of(opt.temperature);
  const float one = 1.0f;
  for (index_t c0 = 0; c0 < v; c0 += vt) {
    const index_t cols = std::min(vt, v - c0);
    const E* wp = weight.data() + c0 * weight.row_stride();
    for (index_t r0 = 0; r0 < n; r0 += tt) {
      const index_t rows = std::min(tt, n - r0);
      const E* hp = hidden.data() + r0 * hidden.row_stride();
      index_t hld = hidden.row_stride();
      if (rows < tt) {
        lp::pad_tile(hidden.data(), hidden.row_stride(), r0, rows, tt, d, padded, stream);
        hp = padded;
        hld = d;
      }
      lp::tile_gemm<E>(cublas, hp, hld, wp, weight.row_stride(), tt, cols, d, 1.0f, tile);
      lp::tile_grad_kernel<E, 256><<<static_cast<unsigned>(rows), 256, 0, stream>>>(
          tile, dz, cols, shard.begin + c0, rows, tp, targets.data() + r0, opt.ignore_index,
          dlogp.empty() ? nullptr : dlogp.data() + r0, dentropy.empty() ? nullptr : dentropy.data() + r0,
          entropy.empty() ? nullptr : entropy.data() + r0, lse.data() + r0);
      RLPT_CUDA_CHECK_LAUNCH();
      if (want_gh) // grad_hidden[rows × D] += dz[rows × cols] · W_slab[cols × D]
        RLPT_LOGPROB_CUBLAS_CHECK(cublasGemmEx(
            cublas, CUBLAS_OP_N, CUBLAS_OP_N, static_cast<int>(d), static_cast<int>(rows), static_cast<int>(cols), &one,
            wp, detail::cuda_type<E>, static_cast<int>(weight.row_stride()), dz, detail::cuda_type<E>,
            static_cast<int>(cols), &one, grad_hidden.data() + r0 * grad_hidden.row_stride(), CUDA_R_32F,
            static_cast<int>(grad_hidden.row_stride()), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
      if (want_gw) // grad_weight[cols × D] += dz[rows × cols]ᵀ · H_tile[rows × D]
        RLPT_LOGPROB_CUBLAS_CHECK(cublasGemmEx(
            cublas, CUBLAS_OP_N, CUBLAS_OP_T, static_cast<int>(d), static_cast<int>(cols), static_cast<int>(rows), &one,
            hp, detail::cuda_type<E>, static_cast<int>(hld), dz, detail::cuda_type<E>, static_cast<int>(cols), &one,
            grad_weight.data() + c0 * grad_weight.row_stride(), CUDA_R_32F, static_cast<int>(grad_weight.row_stride()),
            CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    }
  }
}

RLPT_NAMESPACE_END
