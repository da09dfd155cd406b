// SPDX-License-Identifier: Apache-2.0
//! @file
//! Logprob/entropy of every token of padded, left-padded or packed sequences, with the label
//! shift done inside each sequence.
//!
//! Convention (the same for every layout): logits row i is the model's output at token i and
//! predicts token i + 1 of the same sequence, so logp[i] belongs to token i and is computed
//! from logits row i − 1. The first token of every sequence has no logprob (logp 0, scored 0),
//! and no label ever crosses a packed boundary (the last row of a sequence predicts nothing and
//! gets a zero gradient). With a `valid` mask (padded layouts), token i is scored only when it
//! and its predecessor are valid, so right padding, left padding and packing give the same
//! numbers for the same tokens, bit for bit.
#pragma once

#include <rlpt/config.hpp>
#include <rlpt/core/error.hpp>
#include <rlpt/core/executor.hpp>
#include <rlpt/core/layout.hpp>
#include <rlpt/core/views.hpp>
#include <rlpt/logprob/from_logits.hpp>
#include <rlpt/logprob/options.hpp>

#include <algorithm>
#include <cstring>

RLPT_NAMESPACE_BEGIN

namespace detail {

//! Maps logits row r of a layout to the token it predicts (row r + 1 in the same sequence).
struct sequence_jobs {
  const token_layout* layout = nullptr;
  view<const index_t> tokens;
  view<const mask_t> valid;
  index_t ignore_index = 0;

  [[nodiscard]] row_job operator()(index_t r) const {
    bool has_next = false;
    if (layout->is_packed()) {
      const index_t* off = layout->offsets();
      const index_t* end = off + layout->num_seqs() + 1;
      const index_t* hi = std::upper_bound(off, end, r); // first offset > r: end of r's sequence
      has_next = hi != end && r + 1 < *hi;
    } else {
      const index_t t = r % layout->row_stride();
      has_next = layout->row_stride() > 0 && t + 1 < layout->max_len() && r / layout->row_stride() < layout->num_seqs();
    }
    if (has_next && !valid.empty()) has_next = valid[r] != 0 && valid[r + 1] != 0;
    if (!has_next) return {};
    const index_t y = tokens[r + 1];
    const bool scored = y != ignore_index;
    return {true, scored, scored ? y : -1, r + 1};
  }
};

template <class T>
void check_sequence_inputs(view2d<T> logits, view<const index_t> tokens, const token_layout& layout,
                           view<const mask_t> valid, const logprob_options& opt) {
  check_logprob_options(opt);
  check_logits(logits);
  const index_t n = layout.storage_size();
  RLPT_CHECK(logits.rows() == n, errors::logprob::shape_mismatch,
             "logits have {} rows, the token layout has {} token slots (one logits row per token)", logits.rows(), n);
  layout.expect_tokens("tokens", tokens);
  expect_size_or_empty("valid", valid.size(), n, "one per token slot");
  const sequence_jobs jobs{&layout, tokens, valid, opt.ignore_index};
  for (index_t r = 0; r < n; ++r) {
    const row_job j = jobs(r);
    if (j.active) check_target(r + 1, tokens[r + 1], logits.cols(), opt.ignore_index);
  }
}

} // namespace detail

//! Forward over sequences. `logits` has one row per token slot of `layout` (packed: offsets[B]
//! rows; padded: B·row_stride rows); `tokens` and every per-token output have the same
//! indexing; saved statistics and the kept mask are per logits row. `valid` (optional, one per
//! slot, nonzero = real token) marks padding. Unscored slots get logp = entropy = 0.
template <logit_type T>
logprob_stats sequence_logprob_entropy(view2d<T> logits, view<const index_t> tokens, const token_layout& layout,
                                       view<const mask_t> valid, const logprob_outputs& out,
                                       const logprob_options& opt = {}, const host_executor& ex = {}) {
  detail::check_sequence_inputs(logits, tokens, layout, valid, opt);
  detail::check_outputs(out, layout.storage_size(), logits.cols(), opt.truncated());
  std::fill(out.logp.begin(), out.logp.end(), 0.0f);
  if (!out.entropy.empty()) std::fill(out.entropy.begin(), out.entropy.end(), 0.0f);
  if (!out.scored.empty()) std::fill(out.scored.begin(), out.scored.end(), mask_t{0});
  return detail::forward_rows(logits, detail::sequence_jobs{&layout, tokens, valid, opt.ignore_index}, out, opt, ex);
}

//! Backward over sequences: `in`'s per-target views (dlogp, dentropy, logp, entropy) are per
//! token (as the forward wrote them), `in.saved` per logits row. Rows that predict nothing
//! (last token of a sequence, padding) get zeros; dlogits may be the logits themselves (in place).
template <logit_type T, grad_type G>
void sequence_logprob_entropy_backward(view2d<T> logits, view<const index_t> tokens, const token_layout& layout,
                                       view<const mask_t> valid, const logprob_backward_inputs& in, view2d<G> dlogits,
                                       const logprob_options& opt = {}, const host_executor& ex = {}) {
  detail::check_sequence_inputs(logits, tokens, layout, valid, opt);
  const index_t n = layout.storage_size();
  detail::check_backward_inputs(in, n, n);
  RLPT_CHECK(dlogits.rows() == n && dlogits.cols() == logits.cols(), errors::logprob::shape_mismatch,
             "dlogits are [{}, {}], expected [{}, {}] like the logits", dlogits.rows(), dlogits.cols(), n,
             logits.cols());
  detail::check_grad_alias(logits, dlogits);
  detail::backward_rows(logits, detail::sequence_jobs{&layout, tokens, valid, opt.ignore_index}, in, dlogits, opt, ex);
}

RLPT_NAMESPACE_END
