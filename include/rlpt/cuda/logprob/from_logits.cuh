// SPDX-License-Identifier: Apache-2.0
//! @file
//! Logits -> chosen-token logprob/entropy (forward), -> dlogits (backward), and the fused
//! forward+backward for per-token losses, on the device.
//!
//! Forward: one block per row reads the row once with 16-byte streaming loads (bf16, f16, f32,
//! f64; any row stride), folds an online log-sum-exp in fp32 (base 2, on the MUFU ex2 unit) and
//! writes fp32 logp / entropy / lse. The column -> thread assignment and every merge are fixed
//! (see detail.cuh), so a row's bits do not depend on N or on where the row sits: a trainer and a
//! batch-invariant inference engine can agree exactly. Backward: rows × column chunks, one read
//! and one write (in place over the logits if asked). Fused: per row, statistics, then the
//! caller's per-row gradient functor, then dlogits from a second read that mostly hits L2.
//!
//! Same call shape as the host (<rlpt/logprob/from_logits.hpp>), with device views and a
//! stream; nothing allocates or synchronises. Kernels cannot throw: targets out of range and
//! unusable rows (NaN, +inf, all −inf) give NaN outputs and are counted in `counters`.
//! Top-k/top-p: the forward and backward take the same options as the host (the support is found
//! by radix selection in shared memory, see sampling.cuh); the fused kernel, vocab-parallel and the
//! lm-head score the full softmax.
#pragma once

#include <rlpt/config.hpp>
#include <rlpt/core/error.hpp>
#include <rlpt/core/layout.hpp>
#include <rlpt/core/views.hpp>
#include <rlpt/cuda/error.cuh>
#include <rlpt/cuda/logprob/detail.cuh>
#include <rlpt/cuda/logprob/rows.cuh>
#include <rlpt/cuda/logprob/sampling.cuh>
#include <rlpt/logprob/from_logits.hpp>
#include <rlpt/logprob/math.hpp>
#include <rlpt/logprob/options.hpp>

#include <cuda_runtime.h>

#include <algorithm>

RLPT_NAMESPACE_BEGIN

//! Where a device forward writes ([N] each, device memory; only logp is required).
struct device_logprob_outputs {
  device_view<float> logp{};
  device_view<float> entropy{};
  device_view<float> lse{};     //!< saved for the backward
  device_view<mask_t> scored{}; //!< 1 where a target was scored
  //! Optional, 3 counters zeroed by the call: [0] rows with no usable softmax (NaN, +inf, all
  //! −inf; their outputs are NaN), [1] targets outside [0, V) that are not ignore_index (logp
  //! NaN), [2] targets outside the top-k/top-p support (logp −inf: the device always applies
  //! dropped_target::neg_inf, it cannot raise).
  device_view<index_t> counters{};
  device_view<float> threshold{};  //!< top-k/top-p: saved support (see logprob_saved)
  device_view<index_t> tie_last{}; //!< top-k/top-p: saved support
  device_view2d<mask_t> kept{};    //!< top-k/top-p: optional [N, V] sampling mask
};

//! The forward's statistics as the device backward reads them (lse; with top-k/top-p also
//! threshold and tie_last).
using device_logprob_saved = basic_logprob_saved_view<memory_space::device>;

//! What a device backward reads besides the logits and targets (see logprob_backward_inputs).
//! `logp` (the forward's) is required whenever `dlogp` is given.
using device_logprob_backward_inputs = basic_logprob_backward_inputs<memory_space::device>;

namespace detail {
namespace cuda_lp {

template <class T, int BLOCK, class Job>
RLPT_KERNEL void __launch_bounds__(BLOCK) forward_kernel(const T* logits, Job job, forward_args a) {
  __shared__ state2 smem[BLOCK / 32];
  const index_t r = blockIdx.x;
  const row_job jb = job(r);
  if (!jb.active) return;
  const T* x = logits + r * a.stride;
  const state2 st = block_merge<BLOCK>(row_state<T, BLOCK, true>(x, a.cols, a.tp), smem);
  if (threadIdx.x == 0) write_row(a, x, r, jb, st);
}

//! dlogits for vectors [chunk·BLOCK·unroll, ...) of row blockIdx.x; inactive rows get zeros.
//! Everything about the row comes from the forward's outputs (backward_row_of): in place, the
//! blocks of a row overwrite its columns in no particular order.
template <class T, class G, int BLOCK, class Job>
RLPT_KERNEL void __launch_bounds__(BLOCK) backward_kernel(const T* logits, G* dlogits, Job job, backward_args a) {
  constexpr int W = vec_width<T>;
  static_assert(vec_width<G> == W, "in-vector gradient layout: G and T have the same width");
  const index_t r = blockIdx.x;
  const backward_row b = backward_row_of(a, r, job(r));
  const T* x = logits + r * a.stride;
  G* dx = dlogits + r * a.grad_stride;
  const bool al = row_aligned(x) && row_aligned(dx);
  const index_t nvec = (a.cols + W - 1) / W;
  const index_t per_block = static_cast<index_t>(BLOCK) * unroll;
  const index_t q_begin = static_cast<index_t>(blockIdx.y) * per_block;
#pragma unroll
  for (int u = 0; u < unroll; ++u) {
    const index_t q = q_begin + static_cast<index_t>(u) * BLOCK + threadIdx.x;
    if (q >= nvec) break;
    fvec<G> g;
    if (b.zero) {
#pragma unroll
      for (int k = 0; k < W; ++k) g.v[k] = 0.0f;
    } else {
      const fvec<T> v = load_vec<T, false>(x, q, a.cols, al, 0.0f);
#pragma unroll
      for (int k = 0; k < W; ++k) g.v[k] = backward_element(v.v[k], q * W + k, b, a.tp);
    }
    store_vec<G>(dx, q, a.cols, al, g);
  }
}

//! Fused forward + backward: per row, statistics (first read), the caller's gradient
//! (dlogp, dentropy) = grad(row_out, logp, entropy), then dlogits (second read, meant to hit L2:
//! the grid holds about as many rows as L2 keeps).
template <class T, class G, int BLOCK, class Job, class Grad>
RLPT_KERNEL void __launch_bounds__(BLOCK, 1024 / BLOCK)
    fused_kernel(const T* logits, G* dlogits, index_t grad_stride, Job job, forward_args a, Grad grad) {
  constexpr int W = vec_width<T>;
  __shared__ state2 smem[BLOCK / 32];
  __shared__ backward_row row_b;
  for (index_t r = blockIdx.x; r < a.rows; r += gridDim.x) {
    const row_job jb = job(r);
    const T* x = logits + r * a.stride;
    G* dx = dlogits + r * grad_stride;
    backward_row b{};
    b.zero = true;
    if (jb.active) {
      const state2 st = block_merge<BLOCK>(row_state<T, BLOCK, false>(x, a.cols, a.tp), smem);
      if (threadIdx.x == 0) {
        const float2 lh = write_row(a, x, r, jb, st);
        const float2 dg = grad(jb.out, lh.x, lh.y);
        // the same per-row rule as the separate backward, from the logp just written
        const float dl = jb.scored ? target_dlogp(dg.x, lh.x) : 0.0f;
        backward_row w{};
        w.zero = dl == 0.0f && dg.y == 0.0f;
        w.gl = dl / a.tp.t;
        w.gh = dg.y / a.tp.t;
        w.h = lh.y;
        w.lse = a.lse != nullptr ? a.lse[r] : finish(st).lse;
        w.thr = -INFINITY;
        w.tie = a.cols - 1;
        w.target = dl != 0.0f && jb.col >= 0 && jb.col < a.cols ? jb.col : -1;
        row_b = w;
      }
      __syncthreads();
      b = row_b;
      __syncthreads();
    }
    const bool al = row_aligned(x) && row_aligned(dx);
    const index_t nvec = (a.cols + W - 1) / W;
    for (index_t q = threadIdx.x; q < nvec; q += BLOCK) {
      fvec<G> g;
      if (b.zero) {
#pragma unroll
        for (int k = 0; k < W; ++k) g.v[k] = 0.0f;
      } else {
        const index_t j0 = q * W;
        fvec<T> v;
        if (al && j0 + W <= a.cols) {
          v = unpack<T>(__ldlu(reinterpret_cast<const uint4*>(x + j0))); // last use
        } else {
          v = load_vec<T, false>(x, q, a.cols, al, 0.0f);
        }
#pragma unroll
        for (int k = 0; k < W; ++k) g.v[k] = backward_element(v.v[k], j0 + k, b, a.tp);
      }
      store_vec<G>(dx, q, a.cols, al, g);
    }
    __syncthreads();
  }
}

template <class T> void check_device_logits(device_view2d<T> logits, const char* what = "logits") {
  check_logits_shape(logits.rows(), logits.cols(), logits.row_stride(), logits.data() != nullptr, what);
  RLPT_CHECK(logits.rows() < (index_t{1} << 31), errors::logprob::shape_mismatch,
             "{} logits rows exceed one launch (2^31 - 1 blocks)", logits.rows());
}

inline void check_device_options(const logprob_options& opt, bool truncation_ok = false, const char* what = "") {
  check_logprob_options(opt);
  RLPT_CHECK(truncation_ok || !opt.truncated(), errors::logprob::unsupported,
             "top-k/top-p/min-p (top_k {}, top_p {}, min_p {}) is not available for the device {}: it scores the "
             "full softmax (temperature only)",
             opt.top_k, opt.top_p, opt.min_p, what);
}

inline void check_device_outputs(const device_logprob_outputs& out, index_t n, index_t vocab = -1,
                                 bool truncated = false) {
  expect_size("logp", out.logp.size(), n, "one per row");
  expect_size_or_empty("entropy", out.entropy.size(), n, "one per row");
  expect_size_or_empty("lse", out.lse.size(), n, "one per logits row");
  expect_size_or_empty("scored", out.scored.size(), n, "one per row");
  expect_size_or_empty("counters", out.counters.size(), 3, "[unusable rows, targets out of range, dropped targets]");
  expect_size_or_empty("threshold", out.threshold.size(), n, "one per logits row");
  expect_size_or_empty("tie_last", out.tie_last.size(), n, "one per logits row");
  if (out.kept.data() != nullptr)
    RLPT_CHECK(out.kept.rows() == n && out.kept.cols() == vocab, errors::logprob::shape_mismatch,
               "kept mask is [{}, {}], expected [{}, {}] like the logits", out.kept.rows(), out.kept.cols(), n, vocab);
  if (truncated && !out.lse.empty())
    RLPT_CHECK(!out.threshold.empty() && !out.tie_last.empty(), errors::logprob::missing_saved,
               "top-k/top-p is on, so saving statistics for the backward needs threshold and tie_last as well as lse "
               "({} rows each)",
               n);
}

inline forward_args make_forward_args(index_t rows, index_t cols, index_t stride, const logprob_options& opt,
                                      const device_logprob_outputs& out) {
  return {rows,
          cols,
          stride,
          tempering::of(opt.temperature),
          out.logp.data(),
          out.entropy.empty() ? nullptr : out.entropy.data(),
          out.lse.empty() ? nullptr : out.lse.data(),
          out.scored.empty() ? nullptr : out.scored.data(),
          out.counters.empty() ? nullptr : out.counters.data()};
}

template <class T, class Job>
void launch_forward(device_view2d<T> logits, Job job, const device_logprob_outputs& out, const logprob_options& opt,
                    cudaStream_t stream) {
  using E = std::remove_const_t<T>;
  if (!out.counters.empty()) RLPT_CUDA_CHECK(cudaMemsetAsync(out.counters.data(), 0, 3 * sizeof(index_t), stream));
  if (logits.rows() == 0) return;
  const forward_args a = make_forward_args(logits.rows(), logits.cols(), logits.row_stride(), opt, out);
  const auto grid = static_cast<unsigned>(logits.rows());
  if (opt.truncated()) {
    const truncation_args tr{truncation_rule::of(opt), out.kept.data(), out.kept.row_stride(),
                             out.threshold.empty() ? nullptr : out.threshold.data(),
                             out.tie_last.empty() ? nullptr : out.tie_last.data()};
    switch (forward_block<E>(logits.cols())) {
    case 512:
      truncated_forward_kernel<E, 512><<<grid, 512, 0, stream>>>(logits.data(), job, a, tr);
      break;
    case 256:
      truncated_forward_kernel<E, 256><<<grid, 256, 0, stream>>>(logits.data(), job, a, tr);
      break;
    default:
      truncated_forward_kernel<E, 128><<<grid, 128, 0, stream>>>(logits.data(), job, a, tr);
      break;
    }
    RLPT_CUDA_CHECK_LAUNCH();
    return;
  }
  switch (forward_block<E>(logits.cols())) {
  case 512:
    forward_kernel<E, 512><<<grid, 512, 0, stream>>>(logits.data(), job, a);
    break;
  case 256:
    forward_kernel<E, 256><<<grid, 256, 0, stream>>>(logits.data(), job, a);
    break;
  default:
    forward_kernel<E, 128><<<grid, 128, 0, stream>>>(logits.data(), job, a);
    break;
  }
  RLPT_CUDA_CHECK_LAUNCH();
}

template <class T, class G, class Job>
void launch_backward(device_view2d<T> logits, Job job, const device_logprob_backward_inputs& in,
                     device_view2d<G> dlogits, const logprob_options& opt, cudaStream_t stream) {
  using E = std::remove_const_t<T>;
  if (logits.rows() == 0) return;
  constexpr int block = 256;
  const index_t nvec = (logits.cols() + vec_width<E> - 1) / vec_width<E>;
  const index_t chunks = (nvec + block * unroll - 1) / (block * unroll);
  RLPT_CHECK(chunks < 65536, errors::logprob::shape_mismatch, "{} columns exceed the backward grid", logits.cols());
  const backward_args a{logits.rows(),
                        logits.cols(),
                        logits.row_stride(),
                        dlogits.row_stride(),
                        tempering::of(opt.temperature),
                        in.dlogp.empty() ? nullptr : in.dlogp.data(),
                        in.dentropy.empty() ? nullptr : in.dentropy.data(),
                        in.logp.empty() ? nullptr : in.logp.data(),
                        in.entropy.empty() ? nullptr : in.entropy.data(),
                        in.saved.lse.data(),
                        opt.truncated() ? in.saved.threshold.data() : nullptr,
                        opt.truncated() ? in.saved.tie_last.data() : nullptr};
  const dim3 grid(static_cast<unsigned>(logits.rows()), static_cast<unsigned>(chunks));
  backward_kernel<E, G, block><<<grid, block, 0, stream>>>(logits.data(), dlogits.data(), job, a);
  RLPT_CUDA_CHECK_LAUNCH();
}

//! Validates a device backward's inputs: `n_out` per-target values (dlogp, dentropy, logp,
//! entropy), one saved statistic per logits row.
template <class T, class G>
void check_device_grad(device_view2d<T> logits, device_view2d<G> dlogits, const device_logprob_backward_inputs& in,
                       index_t n_out, bool truncated) {
  const index_t n = logits.rows();
  static_assert(sizeof(std::remove_const_t<T>) == sizeof(G),
                "device gradients are written in the logits' width (16-byte vectors): use the same dtype, or f32 "
                "for f32 logits");
  expect_size_or_empty("dlogp", in.dlogp.size(), n_out, "one per row");
  expect_size_or_empty("dentropy", in.dentropy.size(), n_out, "one per row");
  if (!in.dlogp.empty())
    expect_size("logp", in.logp.size(), n_out,
                "the forward's logp, one per row (a target it scored -inf gets no gradient; the device decides "
                "from it, never from logits an in-place backward overwrites)");
  if (!in.dentropy.empty()) expect_size("entropy", in.entropy.size(), n_out, "the forward's entropy: one per row");
  expect_size("saved.lse", in.saved.lse.size(), n, "the forward's lse: one per logits row");
  if (truncated) {
    expect_size("saved.threshold", in.saved.threshold.size(), n,
                "the forward's threshold (top-k/top-p): one per logits row");
    expect_size("saved.tie_last", in.saved.tie_last.size(), n,
                "the forward's tie_last (top-k/top-p): one per logits row");
  }
  RLPT_CHECK(dlogits.rows() == n && dlogits.cols() == logits.cols(), errors::logprob::shape_mismatch,
             "dlogits are [{}, {}], expected [{}, {}] like the logits", dlogits.rows(), dlogits.cols(), n,
             logits.cols());
  check_grad_alias(logits, dlogits);
}

//! The checks both sequence entry points make of their shared inputs, and the row job they
//! launch (one logits row per token slot).
template <class T>
sequence_job sequence_job_of(device_view2d<T> logits, device_view<const index_t> tokens,
                             const device_token_layout& layout, device_view<const mask_t> valid,
                             const logprob_options& opt) {
  check_device_options(opt, true);
  check_device_logits(logits);
  const index_t n = layout.storage_size();
  RLPT_CHECK(logits.rows() == n, errors::logprob::shape_mismatch,
             "logits have {} rows, the token layout has {} token slots (one logits row per token)", logits.rows(), n);
  expect_size("tokens", tokens.size(), n, "one per token slot");
  expect_size_or_empty("valid", valid.size(), n, "one per token slot");
  return {layout.is_packed() ? layout.offsets() : nullptr,
          layout.num_seqs(),
          layout.row_stride(),
          layout.max_len(),
          tokens.data(),
          valid.empty() ? nullptr : valid.data(),
          opt.ignore_index};
}

} // namespace cuda_lp
} // namespace detail

//! Device forward: as the host logprob_entropy (temperature only). Targets are not validated on
//! the host (they live on the device): out-of-range ones give NaN and are counted.
template <logit_type T>
void logprob_entropy(device_view2d<T> logits, device_view<const index_t> targets, const device_logprob_outputs& out,
                     const logprob_options& opt, cudaStream_t stream) {
  detail::cuda_lp::check_device_options(opt, true);
  detail::cuda_lp::check_device_logits(logits);
  detail::expect_size("targets", targets.size(), logits.rows(), "one per logits row");
  detail::cuda_lp::check_device_outputs(out, logits.rows(), logits.cols(), opt.truncated());
  detail::cuda_lp::launch_forward(logits, detail::cuda_lp::plain_job{targets.data(), opt.ignore_index}, out, opt,
                                  stream);
}

//! Device backward: dlogits (same dtype width as the logits; may be the logits themselves) from
//! the forward's outputs: `in.logp` (required with dlogp: a target scored −inf gets no gradient,
//! one scored NaN a NaN row), `in.entropy` (with dentropy) and `in.saved` (lse; with
//! top-k/top-p also threshold and tie_last). Every element is written.
template <logit_type T, grad_type G>
void logprob_entropy_backward(device_view2d<T> logits, device_view<const index_t> targets,
                              const device_logprob_backward_inputs& in, device_view2d<G> dlogits,
                              const logprob_options& opt, cudaStream_t stream) {
  detail::cuda_lp::check_device_options(opt, true);
  detail::cuda_lp::check_device_logits(logits);
  detail::expect_size("targets", targets.size(), logits.rows(), "one per logits row");
  detail::cuda_lp::check_device_grad(logits, dlogits, in, logits.rows(), opt.truncated());
  detail::cuda_lp::launch_backward(logits, detail::cuda_lp::plain_job{targets.data(), opt.ignore_index}, in, dlogits,
                                   opt, stream);
}

//! Fused forward + backward for a loss whose per-row gradient is known once the row's logp and
//! entropy are: `grad` is a device functor `float2 operator()(index_t row, float logp,
//! float entropy) const` returning (dloss/dlogp, dloss/dentropy) (a PPO/GRPO token loss is
//! such a function of logp, old logp, advantage and mask). Writes `out` and dlogits (may be the
//! logits: in place) with about one read and one write of the logits. The functor type needs
//! external linkage (not in an anonymous namespace): kernels are declared visibility("hidden").
template <logit_type T, grad_type G, class Grad>
void logprob_entropy_fused(device_view2d<T> logits, device_view<const index_t> targets,
                           const device_logprob_outputs& out, device_view2d<G> dlogits, Grad grad,
                           const logprob_options& opt, cudaStream_t stream) {
  using E = std::remove_const_t<T>;
  detail::cuda_lp::check_device_options(opt, false, "fused forward+backward");
  detail::cuda_lp::check_device_logits(logits);
  const index_t n = logits.rows();
  detail::expect_size("targets", targets.size(), n, "one per logits row");
  detail::cuda_lp::check_device_outputs(out, n, logits.cols());
  RLPT_CHECK(dlogits.rows() == n && dlogits.cols() == logits.cols(), errors::logprob::shape_mismatch,
             "dlogits are [{}, {}], expected [{}, {}] like the logits", dlogits.rows(), dlogits.cols(), n,
             logits.cols());
  static_assert(sizeof(E) == sizeof(G), "dlogits are written in the logits' width");
  if (!out.counters.empty()) RLPT_CUDA_CHECK(cudaMemsetAsync(out.counters.data(), 0, 3 * sizeof(index_t), stream));
  if (n == 0) return;
  int device = 0, sms = 0, l2 = 0;
  RLPT_CUDA_CHECK(cudaGetDevice(&device));
  RLPT_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  RLPT_CUDA_CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, device));
  // the plain forward's block size: both fold a row in the same tree, so give the same bits
  const detail::fused_launch launch = detail::fused_launch_for<E>(n, logits.cols(), sms, l2);
  const auto grid = static_cast<unsigned>(launch.grid);
  const auto a = detail::cuda_lp::make_forward_args(n, logits.cols(), logits.row_stride(), opt, out);
  const detail::cuda_lp::plain_job job{targets.data(), opt.ignore_index};
  switch (launch.block) {
  case 512:
    detail::cuda_lp::fused_kernel<E, G, 512>
        <<<grid, 512, 0, stream>>>(logits.data(), dlogits.data(), dlogits.row_stride(), job, a, grad);
    break;
  case 256:
    detail::cuda_lp::fused_kernel<E, G, 256>
        <<<grid, 256, 0, stream>>>(logits.data(), dlogits.data(), dlogits.row_stride(), job, a, grad);
    break;
  default:
    detail::cuda_lp::fused_kernel<E, G, 128>
        <<<grid, 128, 0, stream>>>(logits.data(), dlogits.data(), dlogits.row_stride(), job, a, grad);
    break;
  }
  RLPT_CUDA_CHECK_LAUNCH();
}

//! Device forward over sequences (the host sequence_logprob_entropy convention). Every output
//! slot is written: unscored ones get 0 (memset on the stream first).
template <logit_type T>
void sequence_logprob_entropy(device_view2d<T> logits, device_view<const index_t> tokens,
                              const device_token_layout& layout, device_view<const mask_t> valid,
                              const device_logprob_outputs& out, const logprob_options& opt, cudaStream_t stream) {
  const detail::cuda_lp::sequence_job job = detail::cuda_lp::sequence_job_of(logits, tokens, layout, valid, opt);
  const index_t n = layout.storage_size();
  detail::cuda_lp::check_device_outputs(out, n, logits.cols(), opt.truncated());
  RLPT_CUDA_CHECK(cudaMemsetAsync(out.logp.data(), 0, static_cast<std::size_t>(n) * sizeof(float), stream));
  if (!out.entropy.empty())
    RLPT_CUDA_CHECK(cudaMemsetAsync(out.entropy.data(), 0, static_cast<std::size_t>(n) * sizeof(float), stream));
  if (!out.scored.empty()) RLPT_CUDA_CHECK(cudaMemsetAsync(out.scored.data(), 0, static_cast<std::size_t>(n), stream));
  detail::cuda_lp::launch_forward(logits, job, out, opt, stream);
}

//! Device backward over sequences: rows that predict nothing get zeros. `in`'s per-target views
//! are per token slot (as the forward wrote them), `in.saved` per logits row.
template <logit_type T, grad_type G>
void sequence_logprob_entropy_backward(device_view2d<T> logits, device_view<const index_t> tokens,
                                       const device_token_layout& layout, device_view<const mask_t> valid,
                                       const device_logprob_backward_inputs& in, device_view2d<G> dlogits,
                                       const logprob_options& opt, cudaStream_t stream) {
  const detail::cuda_lp::sequence_job job = detail::cuda_lp::sequence_job_of(logits, tokens, layout, valid, opt);
  detail::cuda_lp::check_device_grad(logits, dlogits, in, layout.storage_size(), opt.truncated());
  detail::cuda_lp::launch_backward(logits, job, in, dlogits, opt, stream);
}

RLPT_NAMESPACE_END
