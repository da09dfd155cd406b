// SPDX-License-Identifier: Apache-2.0
//! @file
//! Moving between per-sequence and per-token quantities on a token layout (padded [B, T] or
//! packed offsets): summing token-level rewards into one outcome reward per sequence, counting
//! valid tokens, placing a scalar on the last valid token, and broadcasting a per-sequence
//! advantage onto the tokens (the `advantages` input of the objectives).
//!
//! Masks are optional everywhere here: an empty mask means every token slot is valid.
//!
//! Token outputs are often just allocated: every writer of a token output in this block maps its
//! pages in one call before it stores (`detail::prefault_for_write`, core/copy.hpp), instead of a
//! page fault per 4 KiB among the stores; an output already mapped costs two mincore calls.
#pragma once

#include <rlpt/config.hpp>
#include <rlpt/core/copy.hpp>
#include <rlpt/core/error.hpp>
#include <rlpt/core/executor.hpp>
#include <rlpt/core/layout.hpp>
#include <rlpt/core/views.hpp>

#include <algorithm>

RLPT_NAMESPACE_BEGIN

namespace detail {

//! Sequences per worker chunk: about 64K token slots, fixed by the layout, never by threads.
inline index_t seq_grain(const token_layout& layout) {
  return std::max<index_t>(1, index_t{1 << 16} / std::max<index_t>(1, layout.max_len()));
}

inline void expect_mask(const token_layout& layout, view<const mask_t> mask) {
  if (!mask.empty()) layout.expect_tokens("mask", mask);
}

RLPT_HD_FORCEINLINE bool valid_at(const mask_t* mask, index_t i) { return mask == nullptr || mask[i] != 0; }

} // namespace detail

//! out[b] = sum of token_rewards over the valid tokens of sequence b, in fp64 then rounded.
//! verl's outcome estimators sum every slot of the row (token_level_rewards.sum(-1)); pass an
//! empty mask for that. Non-finite token rewards make a non-finite sum, which the estimator's
//! nonfinite policy then handles.
inline void sum_token_rewards(const token_layout& layout, view<const float> token_rewards, view<const mask_t> mask,
                              view<float> out, const host_executor& ex = {}) {
  layout.expect_tokens("token_rewards", token_rewards);
  detail::expect_mask(layout, mask);
  detail::expect_size("out", out.size(), layout.num_seqs(), "one sum per sequence");
  const mask_t* m = mask.empty() ? nullptr : mask.data();
  ex.parallel_for(layout.num_seqs(), detail::seq_grain(layout), [&](index_t b0, index_t b1) {
    for (index_t b = b0; b < b1; ++b) {
      double s = 0.0;
      const index_t base = layout.begin(b), n = layout.length(b);
      for (index_t t = 0; t < n; ++t)
        if (detail::valid_at(m, base + t)) s += static_cast<double>(token_rewards[base + t]);
      out[b] = static_cast<float>(s);
    }
  });
}

//! out[b] = number of valid tokens of sequence b (verl's response_mask.sum(-1)).
inline void valid_lengths(const token_layout& layout, view<const mask_t> mask, view<index_t> out,
                          const host_executor& ex = {}) {
  detail::expect_mask(layout, mask);
  detail::expect_size("out", out.size(), layout.num_seqs(), "one length per sequence");
  const mask_t* m = mask.empty() ? nullptr : mask.data();
  ex.parallel_for(layout.num_seqs(), detail::seq_grain(layout), [&](index_t b0, index_t b1) {
    for (index_t b = b0; b < b1; ++b) out[b] = detail::count_valid(m ? m + layout.begin(b) : nullptr, layout.length(b));
  });
}

//! out[b, t] = per_seq[b] on valid tokens and `masked_value` (default 0) elsewhere: verl's
//! A_i * response_mask. Padding slots beyond a padded row's length (row_stride > T) are untouched.
inline void broadcast_to_tokens(const token_layout& layout, view<const float> per_seq, view<const mask_t> mask,
                                view<float> out, float masked_value = 0.0f, const host_executor& ex = {}) {
  detail::expect_size("per_seq", per_seq.size(), layout.num_seqs(), "one value per sequence");
  detail::expect_mask(layout, mask);
  layout.expect_tokens("out", out);
  detail::prefault_for_write(out);
  const mask_t* m = mask.empty() ? nullptr : mask.data();
  ex.parallel_for(layout.num_seqs(), detail::seq_grain(layout), [&](index_t b0, index_t b1) {
    for (index_t b = b0; b < b1; ++b) {
      const index_t base = layout.begin(b), n = layout.length(b);
      const float v = per_seq[b];
      for (index_t t = 0; t < n; ++t) out[base + t] = detail::valid_at(m, base + t) ? v : masked_value;
    }
  });
}

//! Token rewards with per_seq[b] on the last valid token of sequence b and 0 everywhere else (how
//! verl, OpenRLHF and slime place an outcome reward before GAE or discounted returns). A
//! sequence without valid tokens gets nothing.
inline void place_at_last_token(const token_layout& layout, view<const float> per_seq, view<const mask_t> mask,
                                view<float> out, const host_executor& ex = {}) {
  detail::expect_size("per_seq", per_seq.size(), layout.num_seqs(), "one value per sequence");
  detail::expect_mask(layout, mask);
  layout.expect_tokens("out", out);
  detail::prefault_for_write(out);
  const mask_t* m = mask.empty() ? nullptr : mask.data();
  ex.parallel_for(layout.num_seqs(), detail::seq_grain(layout), [&](index_t b0, index_t b1) {
    for (index_t b = b0; b < b1; ++b) {
      const index_t base = layout.begin(b), n = layout.length(b);
      index_t last = -1;
      for (index_t t = 0; t < n; ++t) {
        out[base + t] = 0.0f;
        if (detail::valid_at(m, base + t)) last = t;
      }
      if (last >= 0) out[base + last] = per_seq[b];
    }
  });
}

RLPT_NAMESPACE_END
