// SPDX-License-Identifier: Apache-2.0
//! @file
//! Per-row pieces of the device logprob kernels: row -> target mappings (plain rows, sequences),
//! the kernels' argument block, the block size rule and the one-read row fold.
#pragma once

#include <rlpt/config.hpp>
#include <rlpt/core/views.hpp>
#include <rlpt/cuda/logprob/detail.cuh>
#include <rlpt/logprob/detail/device_rows.hpp>
#include <rlpt/logprob/from_logits.hpp>
#include <rlpt/logprob/math.hpp>

#include <cuda_runtime.h>

RLPT_NAMESPACE_BEGIN
namespace detail::cuda_lp {

//! Row -> target mapping of plain [N, V] logits.
struct plain_job {
  const index_t* targets;
  index_t ignore_index;
  __device__ __forceinline__ row_job operator()(index_t r) const {
    const index_t t = targets[r];
    const bool has = t != ignore_index;
    return {true, has, has ? t : -1, r};
  }
};

//! Row -> next token of the same sequence (see <rlpt/logprob/sequence.hpp> for the convention).
struct sequence_job {
  const index_t* offsets; // packed: B + 1 entries; null for padded
  index_t num_seqs;
  index_t row_stride; // padded
  index_t seq_len;    // padded
  const index_t* tokens;
  const mask_t* valid; // optional
  index_t ignore_index;
  __device__ __forceinline__ row_job operator()(index_t r) const {
    bool has_next;
    if (offsets != nullptr) {
      index_t lo = 0, hi = num_seqs; // first b with offsets[b + 1] > r
      while (lo < hi) {
        const index_t mid = (lo + hi) / 2;
        if (offsets[mid + 1] > r)
          hi = mid;
        else
          lo = mid + 1;
      }
      has_next = lo < num_seqs && r + 1 < offsets[lo + 1];
    } else {
      has_next = r % row_stride + 1 < seq_len && r / row_stride < num_seqs;
    }
    if (has_next && valid != nullptr) has_next = valid[r] != 0 && valid[r + 1] != 0;
    if (!has_next) return {};
    const index_t y = tokens[r + 1];
    const bool has = y != ignore_index;
    return {true, has, has ? y : -1, r + 1};
  }
};

struct forward_args {
  index_t rows, cols, stride;
  tempering tp; // z = x / T
  float* logp;
  float* entropy;
  float* lse;
  mask_t* scored;
  index_t* counters;
};

//! Block size from the vocabulary only (never from N): fixes the reduction tree per V, the same
//! in every kernel that folds whole rows (see detail::device_row_block).
template <class T> inline int forward_block(index_t cols) { return device_row_block<T>(cols); }

inline constexpr int unroll = 4; // vectors in flight per thread

//! One row's state: thread t folds vectors t, t + B, t + 2B, ... in increasing order.
template <class T, int BLOCK, bool Stream>
__device__ __forceinline__ state2 row_state(const T* x, index_t cols, tempering tp) {
  constexpr int W = vec_width<T>;
  const index_t nvec = (cols + W - 1) / W;
  const bool al = row_aligned(x);
  state2 st = empty_state();
  for (index_t q0 = threadIdx.x; q0 < nvec; q0 += static_cast<index_t>(BLOCK) * unroll) {
    fvec<T> v[unroll];
#pragma unroll
    for (int u = 0; u < unroll; ++u) {
      const index_t q = q0 + static_cast<index_t>(u) * BLOCK;
      if (q < nvec) v[u] = load_vec<T, Stream>(x, q, cols, al, -INFINITY);
    }
#pragma unroll
    for (int u = 0; u < unroll; ++u)
      if (q0 + static_cast<index_t>(u) * BLOCK < nvec) {
        temper_vec(v[u].v, tp);
        fold(st, v[u].v);
      }
  }
  return st;
}

//! Thread 0's epilogue of a forward row; returns (logp, entropy) for the fused kernel.
template <class T>
__device__ __forceinline__ float2 write_row(const forward_args& a, const T* x, index_t r, const row_job& jb,
                                            state2 st) {
  const row_result res = finish(st);
  if (res.lse != res.lse && a.counters != nullptr) atomicAdd(reinterpret_cast<unsigned long long*>(a.counters), 1ull);
  float logp = 0.0f;
  bool scored = false;
  if (jb.scored) {
    if (jb.col >= 0 && jb.col < a.cols) {
      logp = lse2_logp(temper(load_logit(x[jb.col]), a.tp), st);
      scored = logp != -INFINITY;
      if (!scored && a.counters != nullptr) // logit −inf: probability 0, counted as dropped
        atomicAdd(reinterpret_cast<unsigned long long*>(a.counters + 2), 1ull);
    } else {
      logp = NAN;
      if (a.counters != nullptr) atomicAdd(reinterpret_cast<unsigned long long*>(a.counters + 1), 1ull);
    }
  }
  if (jb.out >= 0) {
    a.logp[jb.out] = logp;
    if (a.entropy != nullptr) a.entropy[jb.out] = res.entropy;
    if (a.scored != nullptr) a.scored[jb.out] = scored ? 1 : 0;
  }
  if (a.lse != nullptr) a.lse[r] = res.lse;
  return {logp, res.entropy};
}

} // namespace detail::cuda_lp
RLPT_NAMESPACE_END
