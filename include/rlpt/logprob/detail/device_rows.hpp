// SPDX-License-Identifier: Apache-2.0
//! @file
//! The per-row decisions of the device logprob kernels, written for host and device alike so
//! that host tests exercise them: how many threads fold a row (its reduction tree, hence its
//! bits), and what a backward block takes from the forward's outputs about its row.
#pragma once

#include <rlpt/config.hpp>
#include <rlpt/core/views.hpp>
#include <rlpt/logprob/from_logits.hpp>
#include <rlpt/logprob/math.hpp>

#include <limits>

RLPT_NAMESPACE_BEGIN
namespace detail {

//! Logits per 16-byte vector of a device row.
template <class T> inline constexpr int device_vec_width = static_cast<int>(16 / sizeof(T));

//! Threads per block of every device kernel that folds a whole row (forward, truncated
//! forward, fused forward+backward, vocab-parallel local): a function of V only, and the same
//! for all of them, so a row's reduction tree and its bits are the same in each and never
//! depend on N (the batch-invariance promise).
template <class T> [[nodiscard]] RLPT_HD int device_row_block(index_t cols) {
  const index_t nvec = (cols + device_vec_width<T> - 1) / device_vec_width<T>;
  return nvec >= 4096 ? 512 : nvec >= 1024 ? 256 : 128;
}

//! Launch shape of the device fused forward+backward: the plain forward's block size (same
//! reduction tree, so the same logp/entropy/lse bits as logprob_entropy), and a grid holding
//! about as many rows as half the L2 keeps (the second read of a row should hit it), at least
//! one block per SM and at most 2048 threads per SM, never more blocks than rows.
struct fused_launch {
  int block;
  index_t grid;
};

template <class T>
[[nodiscard]] inline fused_launch fused_launch_for(index_t rows, index_t cols, int sms, index_t l2_bytes) {
  const int block = device_row_block<T>(cols);
  const index_t row_bytes = cols * static_cast<index_t>(sizeof(T));
  const index_t fit = l2_bytes / 2 / row_bytes;
  const index_t least = sms, most = static_cast<index_t>(sms) * (2048 / block);
  const index_t grid = fit < least ? least : fit > most ? most : fit;
  return {block, grid < rows ? grid : rows};
}

//! Arguments of the device backward kernels (pointers into device memory; null = absent).
struct backward_args {
  index_t rows = 0, cols = 0, stride = 0, grad_stride = 0;
  tempering tp;
  const float* dlogp = nullptr;
  const float* dentropy = nullptr;
  const float* logp = nullptr; // the forward's logp: required with dlogp
  const float* entropy = nullptr;
  const float* lse = nullptr;
  const float* threshold = nullptr; // null: nothing truncated
  const index_t* tie_last = nullptr;
};

//! What every block of a backward row needs, taken from the forward's outputs only. Never from
//! the logits: in place, another block of the same row may already have overwritten any column
//! (the target's included) with its gradient.
struct backward_row {
  bool zero;      //!< nothing to do: the row's gradient is 0
  float gl;       //!< target_dlogp / T
  float gh;       //!< dentropy / T
  float h;        //!< the row's entropy (with dentropy)
  float lse;      //!< the row's lse
  float thr;      //!< kept threshold (−inf: nothing truncated)
  index_t tie;    //!< kept ties up to this column
  index_t target; //!< column of the one-hot term (−1: none in these logits)
};

RLPT_HD_FORCEINLINE backward_row backward_row_of(const backward_args& a, index_t r, const row_job& jb) {
  const float dl = jb.active && jb.scored && a.dlogp != nullptr ? target_dlogp(a.dlogp[jb.out], a.logp[jb.out]) : 0.0f;
  const float dh = jb.active && a.dentropy != nullptr ? a.dentropy[jb.out] : 0.0f;
  backward_row b{};
  b.zero = dl == 0.0f && dh == 0.0f;
  b.gl = dl / a.tp.t;
  b.gh = dh / a.tp.t;
  b.h = dh != 0.0f ? a.entropy[jb.out] : 0.0f;
  b.lse = b.zero ? 0.0f : a.lse[r];
  const bool truncated = a.threshold != nullptr && !b.zero;
  b.thr = truncated ? a.threshold[r] : -std::numeric_limits<float>::infinity();
  b.tie = truncated ? a.tie_last[r] : a.cols - 1;
  b.target = dl != 0.0f && jb.col >= 0 && jb.col < a.cols ? jb.col : -1;
  return b;
}

//! d(loss)/dx for one column of a backward row (x raw, j its column): the device kernels'
//! element math. p = 2^((z − lse)·log2e); −p·((log p + H)·gh + gl), plus gl at the target,
//! 0 outside the kept support.
RLPT_HD_FORCEINLINE float backward_element(float x, index_t j, const backward_row& b, tempering tp) {
  const float z = tp.identity() ? x : temper(x, tp);
  const float d = z - b.lse; // log p
  const float p = ex2(d * log2e_f);
  float g = -p * fmaf(fmaxf(d, -87.0f) + b.h, b.gh, b.gl);
  if (j == b.target) g += b.gl;
  const bool dropped = (z < b.thr) || (z == b.thr && j > b.tie); // NaN z: not dropped, stays NaN
  return dropped ? 0.0f : g;
}

} // namespace detail
RLPT_NAMESPACE_END
