// SPDX-License-Identifier: Apache-2.0
// One logprob forward / backward prepared from torch tensors (shared by the CPU and CUDA kernels).
#pragma once

#include "tensors.hpp"

#include <rlpt/logprob/options.hpp>

namespace rlpt_py {

//! How logits rows map to targets: plain rows ([N, V] or [B, T, V] with targets of the same
//! leading shape, no shift) or sequences (padded [B, T, V] with tokens [B, T], or packed [N, V]
//! with tokens [N] and cu_seqlens; logp[t] comes from logits row t - 1 of the same sequence).
struct logprob_call {
  rlpt::logprob_options opt;
  bool sequence = false;
  at::Tensor logits2d; // [rows, V], last dimension contiguous, rows evenly spaced
  index_t rows = 0, vocab = 0, row_stride = 0;
  at::Tensor tokens; // int64, contiguous, one per row
  at::Tensor valid;  // bytes or undefined
  token_batch b;     // the sequence layout (sequence = true)
  std::vector<int64_t> out_shape;
};

logprob_call prepare_logprob(const at::Tensor& logits, const at::Tensor& tokens, const opt_tensor& valid,
                             const opt_tensor& cu_seqlens, bool sequence, double temperature, int64_t top_k,
                             double top_p, int64_t ignore_index, double min_p, bool min_p_first);

} // namespace rlpt_py
