// SPDX-License-Identifier: Apache-2.0
//! @file
//! Vocab-parallel logprob/entropy on the device: the host protocol of
//! <rlpt/logprob/vocab_parallel.hpp> (local statistics, MAX all-reduce, rebase, SUM all-reduce,
//! finish) with device kernels and either the caller's hook `void(device_view<float>, reduce_op,
//! cudaStream_t)` or an NCCL communicator. `comm` is the caller's device buffer of
//! vocab_parallel_buffer_size(N) floats, in the same [max | sum | ent | target] layout and
//! natural-log units as the host, so host and device ranks can even be mixed. The backward is
//! the ordinary device backward with the target shifted into the shard (no communication).
#pragma once

#include <rlpt/config.hpp>
#include <rlpt/core/error.hpp>
#include <rlpt/core/views.hpp>
#include <rlpt/cuda/error.cuh>
#include <rlpt/cuda/logprob/detail.cuh>
#include <rlpt/cuda/logprob/from_logits.cuh>
#include <rlpt/logprob/math.hpp>
#include <rlpt/logprob/options.hpp>
#include <rlpt/logprob/vocab_parallel.hpp>

#if RLPT_HAS_NCCL()
#include <rlpt/cuda/nccl.cuh>
#include <nccl.h>
#endif

#include <cuda_runtime.h>

RLPT_NAMESPACE_BEGIN

namespace detail::cuda_lp {

struct local_args {
  index_t rows, cols, stride, begin, vocab;
  tempering tp;
  const index_t* targets;
  index_t ignore_index;
  float* comm;      // [m | s | a | t]
  float* local_max; // [N]
};

template <class T, int BLOCK> RLPT_KERNEL void __launch_bounds__(BLOCK) local_kernel(const T* logits, local_args a) {
  __shared__ state2 smem[BLOCK / 32];
  const index_t r = blockIdx.x;
  const T* x = logits + r * a.stride;
  const state2 st = block_merge<BLOCK>(row_state<T, BLOCK, true>(x, a.cols, a.tp), smem);
  if (threadIdx.x != 0) return;
  // natural-log units, like the host: m·ln2, Σ 2^d = Σ e^(d·ln2), a·ln2
  const lse_state nat = lse2_natural(st);
  a.comm[r] = nat.m;
  a.comm[a.rows + r] = nat.s;
  a.comm[2 * a.rows + r] = nat.a;
  const index_t t = a.targets[r], y = t - a.begin;
  a.comm[3 * a.rows + r] = vocab_target_invalid(t, a.vocab, a.ignore_index) ? NAN
                           : t != a.ignore_index && y >= 0 && y < a.cols    ? temper(load_logit(x[y]), a.tp)
                                                                            : 0.0f;
  a.local_max[r] = nat.m;
}

template <int = 0> // a template: a kernel defined in a header must not clash across TUs
RLPT_KERNEL void rebase_kernel(float* comm, const float* local_max, index_t n) {
  const index_t r = static_cast<index_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (r >= n) return;
  const lse_state st = lse_rebase({local_max[r], comm[n + r], comm[2 * n + r]}, comm[r]);
  comm[n + r] = st.s;
  comm[2 * n + r] = st.a;
}

struct finish_args {
  index_t rows;
  const float* comm;
  const index_t* targets;
  index_t ignore_index;
  float* logp;
  float* entropy;
  float* lse;
  mask_t* scored;
  index_t* counters;
};

template <int = 0> RLPT_KERNEL void finish_kernel(finish_args a) {
  const index_t r = static_cast<index_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (r >= a.rows) return;
  const index_t n = a.rows;
  const lse_state st{a.comm[r], a.comm[n + r], a.comm[2 * n + r]};
  const bool has = a.targets[r] != a.ignore_index;
  const vocab_row v = vocab_parallel_row(st, a.comm[3 * n + r], has);
  if (v.counter >= 0 && a.counters != nullptr)
    atomicAdd(reinterpret_cast<unsigned long long*>(a.counters + v.counter), 1ull);
  a.logp[r] = v.logp;
  if (a.entropy != nullptr) a.entropy[r] = v.res.entropy;
  if (a.lse != nullptr) a.lse[r] = v.res.lse;
  if (a.scored != nullptr) a.scored[r] = v.scored ? 1 : 0;
}

//! Row -> local target column of a shard (−1 when another rank owns it).
struct shard_job {
  const index_t* targets;
  index_t ignore_index;
  index_t begin, cols;
  __device__ __forceinline__ row_job operator()(index_t r) const {
    const index_t t = targets[r];
    const bool has = t != ignore_index;
    const index_t local = t - begin;
    return {true, has, has && local >= 0 && local < cols ? local : -1, r};
  }
};

} // namespace detail::cuda_lp

//! Stage 1 on the device: this rank's [max | Σexp | Σexp·shift | target logit] into comm.
template <logit_type T>
void vocab_parallel_local(device_view2d<T> logits_local, device_view<const index_t> targets, vocab_shard shard,
                          device_view<float> comm, device_view<float> local_max, const logprob_options& opt,
                          cudaStream_t stream) {
  using E = std::remove_const_t<T>;
  detail::cuda_lp::check_device_options(opt, false, "vocab-parallel scoring");
  detail::cuda_lp::check_device_logits(logits_local);
  detail::check_shard(shard, logits_local.cols());
  const index_t n = logits_local.rows();
  detail::expect_size("targets", targets.size(), n, "one per logits row");
  detail::expect_size("comm", comm.size(), vocab_parallel_buffer_size(n), "4 floats per row");
  detail::expect_size("local_max", local_max.size(), n, "one per row");
  if (n == 0) return;
  const detail::cuda_lp::local_args a{n,
                                      logits_local.cols(),
                                      logits_local.row_stride(),
                                      shard.begin,
                                      shard.vocab,
                                      tempering::of(opt.temperature),
                                      targets.data(),
                                      opt.ignore_index,
                                      comm.data(),
                                      local_max.data()};
  const auto grid = static_cast<unsigned>(n);
  switch (detail::cuda_lp::forward_block<E>(logits_local.cols())) {
  case 512:
    detail::cuda_lp::local_kernel<E, 512><<<grid, 512, 0, stream>>>(logits_local.data(), a);
    break;
  case 256:
    detail::cuda_lp::local_kernel<E, 256><<<grid, 256, 0, stream>>>(logits_local.data(), a);
    break;
  default:
    detail::cuda_lp::local_kernel<E, 128><<<grid, 128, 0, stream>>>(logits_local.data(), a);
    break;
  }
  RLPT_CUDA_CHECK_LAUNCH();
}

//! Stage 2 on the device, after the MAX all-reduce of comm[0, N).
inline void vocab_parallel_rebase(device_view<float> comm, device_view<const float> local_max, cudaStream_t stream) {
  const index_t n = local_max.size();
  detail::expect_size("comm", comm.size(), vocab_parallel_buffer_size(n), "4 floats per row");
  if (n == 0) return;
  detail::cuda_lp::rebase_kernel<<<static_cast<unsigned>((n + 255) / 256), 256, 0, stream>>>(comm.data(),
                                                                                             local_max.data(), n);
  RLPT_CUDA_CHECK_LAUNCH();
}

//! Stage 3 on the device, after the SUM all-reduce of comm[N, 4N). Unusable rows give NaN and
//! are counted (out.counters[0]) on every rank alike.
inline void vocab_parallel_finish(device_view<const float> comm, device_view<const index_t> targets,
                                  const device_logprob_outputs& out, const logprob_options& opt, cudaStream_t stream) {
  const index_t n = targets.size();
  detail::expect_size("comm", comm.size(), vocab_parallel_buffer_size(n), "4 floats per row");
  detail::cuda_lp::check_device_outputs(out, n);
  if (!out.counters.empty()) RLPT_CUDA_CHECK(cudaMemsetAsync(out.counters.data(), 0, 3 * sizeof(index_t), stream));
  if (n == 0) return;
  const detail::cuda_lp::finish_args a{n,
                                       comm.data(),
                                       targets.data(),
                                       opt.ignore_index,
                                       out.logp.data(),
                                       out.entropy.empty() ? nullptr : out.entropy.data(),
                                       out.lse.empty() ? nullptr : out.lse.data(),
                                       out.scored.empty() ? nullptr : out.scored.data(),
                                       out.counters.empty() ? nullptr : out.counters.data()};
  detail::cuda_lp::finish_kernel<<<static_cast<unsigned>((n + 255) / 256), 256, 0, stream>>>(a);
  RLPT_CUDA_CHECK_LAUNCH();
}

//! All stages with the caller's collective: `allreduce(device_view<float> data, reduce_op op,
//! cudaStream_t stream)` reduces `data` in place over the group, ordered on `stream`.
//! out.logp doubles as the local-max scratch.
template <logit_type T, class Reduce>
void vocab_parallel_logprob_entropy(device_view2d<T> logits_local, device_view<const index_t> targets,
                                    vocab_shard shard, device_view<float> comm, const device_logprob_outputs& out,
                                    Reduce&& allreduce, const logprob_options& opt, cudaStream_t stream) {
  const index_t n = logits_local.rows();
  detail::expect_size("logp", out.logp.size(), n, "one per row");
  vocab_parallel_local(logits_local, targets, shard, comm, out.logp, opt, stream);
  allreduce(device_view<float>(comm.data(), n), reduce_op::max, stream);
  vocab_parallel_rebase(comm, device_view<const float>(out.logp.data(), n), stream);
  allreduce(device_view<float>(comm.data() + n, 3 * n), reduce_op::sum, stream);
  vocab_parallel_finish(comm, targets, out, opt, stream);
}

#if RLPT_HAS_NCCL()
//! The same with an NCCL communicator (ncclMax, then ncclSum on the stream).
template <logit_type T>
void vocab_parallel_logprob_entropy(device_view2d<T> logits_local, device_view<const index_t> targets,
                                    vocab_shard shard, device_view<float> comm, const device_logprob_outputs& out,
                                    ncclComm_t nccl, const logprob_options& opt, cudaStream_t stream) {
  vocab_parallel_logprob_entropy(
      logits_local, targets, shard, comm, out,
      [nccl](device_view<float> d, reduce_op op, cudaStream_t s) {
        RLPT_NCCL_CHECK(ncclAllReduce(d.data(), d.data(), static_cast<std::size_t>(d.size()), ncclFloat,
                                      op == reduce_op::max ? ncclMax : ncclSum, nccl, s));
      },
      opt, stream);
}
#endif

//! Device backward on one rank (no communication), from what the forward wrote on every rank
//! alike: `in.saved.lse` (the global lse), `in.entropy` (with dentropy) and `in.logp` (required
//! with dlogp: every rank decides from it whether the target gets a gradient).
template <logit_type T, grad_type G>
void vocab_parallel_backward(device_view2d<T> logits_local, device_view<const index_t> targets, vocab_shard shard,
                             const device_logprob_backward_inputs& in, device_view2d<G> dlogits_local,
                             const logprob_options& opt, cudaStream_t stream) {
  detail::cuda_lp::check_device_options(opt, false, "vocab-parallel scoring");
  detail::cuda_lp::check_device_logits(logits_local, "local logits");
  detail::check_shard(shard, logits_local.cols());
  detail::expect_size("targets", targets.size(), logits_local.rows(), "one per logits row");
  const device_logprob_backward_inputs global{in.dlogp, in.dentropy, in.logp, in.entropy, {.lse = in.saved.lse}};
  detail::cuda_lp::check_device_grad(logits_local, dlogits_local, global, logits_local.rows(), false);
  detail::cuda_lp::launch_backward(
      logits_local, detail::cuda_lp::shard_job{targets.data(), opt.ignore_index, shard.begin, logits_local.cols()},
      global, dlogits_local, opt, stream);
}

RLPT_NAMESPACE_END
