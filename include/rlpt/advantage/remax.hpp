// SPDX-License-Identifier: Apache-2.0
//! @file
//! ReMax (arXiv 2310.10505, verl `remax`): the baseline is the reward of a greedy rollout of the
//! same prompt, b_i. Returns are the undiscounted reward-to-go G_t over valid tokens, and
//! A_t = G_t - b_i on valid tokens (0 elsewhere). No normalisation.
#pragma once

#include <rlpt/config.hpp>
#include <rlpt/advantage/common.hpp>
#include <rlpt/advantage/gae.hpp>
#include <rlpt/advantage/tokens.hpp>
#include <rlpt/core/error.hpp>
#include <rlpt/core/executor.hpp>
#include <rlpt/core/layout.hpp>
#include <rlpt/core/views.hpp>

#include <cmath>
#include <string>
#include <vector>

RLPT_NAMESPACE_BEGIN

struct remax_options {
  rlpt::nonfinite on_nonfinite = rlpt::nonfinite::raise; //!< mask: zero the sequence and count it
};

//! ReMax advantages and returns (returns may be empty). Returns the number of sequences zeroed
//! under nonfinite::mask (non-finite rewards at valid tokens, or a non-finite baseline).
inline index_t remax_advantages(const token_layout& layout, view<const float> token_rewards, view<const mask_t> mask,
                                view<const float> baselines, view<float> advantages, view<float> returns,
                                const remax_options& o = {}, const host_executor& ex = {}) {
  layout.expect_tokens("token_rewards", token_rewards);
  layout.expect_tokens("advantages", advantages);
  if (!returns.empty()) layout.expect_tokens("returns", returns);
  detail::expect_mask(layout, mask);
  detail::expect_size("baselines", baselines.size(), layout.num_seqs(), "one greedy-rollout reward per sequence");
  detail::check_rewards(baselines, o.on_nonfinite, "baselines");
  // gamma = 1: skipping masked tokens and zeroing them give the same sums (verl: cumsum of r * m).
  // A = G - b is formed from the fp64 G, so it does not inherit G's fp32 rounding.
  detail::prefault_for_write(advantages);
  detail::prefault_for_write(returns);
  const mask_t* m = mask.empty() ? nullptr : mask.data();
  std::vector<mask_t> zeroed(static_cast<std::size_t>(layout.num_seqs()), 0);
  ex.parallel_for(layout.num_seqs(), detail::seq_grain(layout), [&](index_t b0, index_t b1) {
    for (index_t b = b0; b < b1; ++b) {
      const index_t base = layout.begin(b), n = layout.length(b);
      const double bl = static_cast<double>(baselines[b]);
      double g = 0.0, check = bl;
      for (index_t t = n - 1; t >= 0; --t) {
        const index_t i = base + t;
        if (!detail::valid_at(m, i)) {
          advantages[i] = 0.0f;
          if (!returns.empty()) returns[i] = 0.0f;
          continue;
        }
        g += static_cast<double>(token_rewards[i]);
        check += g;
        advantages[i] = static_cast<float>(g - bl);
        if (!returns.empty()) returns[i] = static_cast<float>(g);
      }
      if (!std::isfinite(check)) {
        zeroed[static_cast<std::size_t>(b)] = 1;
        for (index_t t = 0; t < n; ++t) {
          advantages[base + t] = 0.0f;
          if (!returns.empty()) returns[base + t] = 0.0f;
        }
      }
    }
  });
  std::vector<index_t> bad;
  for (index_t b = 0; b < layout.num_seqs(); ++b)
    if (zeroed[static_cast<std::size_t>(b)]) bad.push_back(b);
  if (!bad.empty() && o.on_nonfinite == nonfinite::raise) {
    index_t c = 0;
    const std::string listed = detail::name_bad_tokens(layout, bad, token_rewards, {}, m, {}, c);
    RLPT_FAIL(errors::advantage::nonfinite,
              "ReMax: {} sequence{} with non-finite rewards at valid tokens: {}{} (set "
              "on_nonfinite = rlpt::nonfinite::mask to zero such sequences and count them)",
              bad.size(), bad.size() == 1 ? "" : "s", listed, c > detail::max_named ? ", ..." : "");
  }
  const index_t count = static_cast<index_t>(bad.size());
  return count;
}

RLPT_NAMESPACE_END
