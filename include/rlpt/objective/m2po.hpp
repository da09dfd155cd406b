// SPDX-License-Identifier: Apache-2.0
//! @file
//! M2PO (second-moment trust policy optimisation; AReaL's `m2_threshold`): before the loss, drop
//! the tokens whose behaviour log-ratio has the largest second moment until the mean of the rest
//! is below a threshold. A selection over the whole call's tokens (a sort), so it is a pass of its
//! own that makes a mask for `evaluate`, not a term of the objective.
#pragma once

#include <rlpt/config.hpp>
#include <rlpt/core/error.hpp>
#include <rlpt/core/layout.hpp>
#include <rlpt/core/views.hpp>
#include <rlpt/objective/inputs.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

RLPT_NO_CONTRACT_BEGIN
RLPT_NAMESPACE_BEGIN

//! Writes to `out` (one byte per token slot, as `in.mask`) the loss mask M2PO keeps and returns
//! how many valid tokens it dropped. M2_t = (old_logp_t - behav_logp_t)^2 (proximal against
//! behaviour log-probs) over the valid tokens, sorted from the largest; the k largest are dropped,
//! k the least number for which the mean of the remaining M2 is below `m2_threshold` (all but one
//! when no k is: AReaL keeps one token). Equal M2 drop the earlier slot first. Slots outside the
//! mask (or outside every sequence) are 0 in `out`. AReaL applies it to each micro-batch's
//! loss_mask inside its loss (`grpo_loss_fn`): call it with the same micro-batch and pass `out` as
//! the mask of `evaluate` (the dropped tokens then leave every term and denominator, as AReaL's).
//! M2 is formed in T, as AReaL's tensors; the means are taken in double.
template <class T> index_t m2po_mask(const basic_objective_inputs<T>& in, double m2_threshold, view<mask_t> out) {
  const auto& L = in.layout;
  const index_t n = L.storage_size();
  RLPT_CHECK(std::isfinite(m2_threshold) && m2_threshold > 0.0, errors::objective::bad_option,
             "m2po_mask: m2_threshold = {} must be finite and > 0", m2_threshold);
  RLPT_CHECK(n == 0 || (in.old_logp.size() != 0 && in.behav_logp.size() != 0), errors::objective::missing_input,
             "m2po_mask needs old_logp (proximal) and behav_logp (behaviour), got {} and {} values", in.old_logp.size(),
             in.behav_logp.size());
  if (in.mask.size() != 0) L.expect_tokens("mask", in.mask);
  if (n != 0) {
    L.expect_tokens("old_logp", in.old_logp);
    L.expect_tokens("behav_logp", in.behav_logp);
  }
  detail::expect_size("m2po_mask out", out.size(), n, "one per token slot, as the mask");

  struct token {
    double m2;
    index_t slot;
  };
  std::vector<token> tokens;
  for (index_t b = 0; b < L.num_seqs(); ++b)
    for (index_t i = L.begin(b), e = i + L.length(b); i < e; ++i) {
      if (in.mask.size() != 0 && in.mask[i] == 0) continue;
      const T d = in.old_logp[i] - in.behav_logp[i];
      RLPT_CHECK(std::isfinite(static_cast<double>(d)), errors::objective::nonfinite,
                 "m2po_mask: old_logp[{}] = {} and behav_logp[{}] = {} give a non-finite log-ratio", i,
                 static_cast<double>(in.old_logp[i]), i, static_cast<double>(in.behav_logp[i]));
      tokens.push_back({static_cast<double>(d * d), i});
    }
  // `out` is written only once every input has been read: a refused call leaves it as it was.
  std::fill(out.begin(), out.end(), mask_t{0});
  for (const token& t : tokens) out[t.slot] = 1;
  const std::size_t count = tokens.size();
  if (count == 0) return 0;
  std::stable_sort(tokens.begin(), tokens.end(), [](const token& a, const token& b) { return a.m2 > b.m2; });
  // suffix[k] = sum of the M2 left after dropping the k largest; drop the least k whose mean is
  // below the threshold.
  std::vector<double> suffix(count + 1, 0.0);
  for (std::size_t k = count; k-- > 0;) suffix[k] = suffix[k + 1] + tokens[k].m2;
  std::size_t drop = count - 1;
  for (std::size_t k = 0; k < count; ++k)
    if (suffix[k] / static_cast<double>(count - k) < m2_threshold) {
      drop = k;
      break;
    }
  for (std::size_t k = 0; k < drop; ++k) out[tokens[k].slot] = 0;
  return static_cast<index_t>(drop);
}

RLPT_NAMESPACE_END
RLPT_NO_CONTRACT_END
