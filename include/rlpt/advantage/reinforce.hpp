// SPDX-License-Identifier: Apache-2.0
//! @file
//! REINFORCE++ (arXiv 2501.03262) and REINFORCE++-baseline, plus the discounted token returns
//! they are built from.
//!
//! - REINFORCE++: G_t = r_t + gamma * G_next per token (the reward usually on the last valid
//!   token, KL penalties on every token), then global masked whitening of G.
//! - REINFORCE++-baseline: the group mean of the outcome reward is subtracted first, the result is
//!   broadcast onto the valid tokens, then whitened globally (token-weighted: long answers weigh
//!   more, as in verl and OpenRLHF).
//!
//! Distributed whitening: compute the pre-whitening values with the `whiten` option unset
//! (std::nullopt), then whiten_moments / merge_moments / whiten_apply across ranks.
#pragma once

#include <rlpt/config.hpp>
#include <rlpt/advantage/common.hpp>
#include <rlpt/advantage/gae.hpp>
#include <rlpt/advantage/tokens.hpp>
#include <rlpt/advantage/whiten.hpp>
#include <rlpt/core/error.hpp>
#include <rlpt/core/executor.hpp>
#include <rlpt/core/groups.hpp>
#include <rlpt/core/layout.hpp>
#include <rlpt/core/views.hpp>

#include <limits>
#include <optional>
#include <vector>

RLPT_NAMESPACE_BEGIN

struct returns_options {
  double gamma = 1.0;                             //!< verl algorithm.gamma default; OpenRLHF 1 except `reinforce`
  rlpt::mask_mode masked = rlpt::mask_mode::skip; //!< verl 0.9 carries the return over masked tokens
  rlpt::nonfinite on_nonfinite = rlpt::nonfinite::raise; //!< mask: zero the whole sequence and count it
};

//! Discounted reward-to-go G_t = r_t + gamma * G_next over valid tokens (masked outputs 0).
//! Returns the number of sequences zeroed under nonfinite::mask.
inline index_t discounted_returns(const token_layout& layout, view<const float> token_rewards, view<const mask_t> mask,
                                  view<float> returns, const returns_options& o = {}, const host_executor& ex = {}) {
  detail::check_discount("returns_options::gamma", o.gamma);
  layout.expect_tokens("token_rewards", token_rewards);
  layout.expect_tokens("returns", returns);
  detail::expect_mask(layout, mask);
  return static_cast<index_t>(detail::run_recurrence(layout, token_rewards, {}, mask, {}, o.gamma, o.gamma, o.masked,
                                                     returns, {}, o.on_nonfinite, 0.0f, "discounted returns", ex)
                                  .size());
}

struct reinforce_pp_options {
  double gamma = 1.0;                                      //!< verl algorithm.gamma
  rlpt::mask_mode masked = rlpt::mask_mode::skip;          //!< verl 0.9 (OpenRLHF: zero)
  std::optional<whiten_options> whiten = whiten_options{}; //!< verl masked_whiten; nullopt = raw returns
  rlpt::nonfinite on_nonfinite = rlpt::nonfinite::raise;
};

struct reinforce_pp_result {
  index_t num_nonfinite_seqs = 0;
  std::optional<whiten_result> whitening;
};

//! REINFORCE++: advantages = whiten(G) on valid tokens (0 elsewhere); `returns` (may be empty)
//! receives G itself, as verl returns it.
inline reinforce_pp_result reinforce_pp_advantages(const token_layout& layout, view<const float> token_rewards,
                                                   view<const mask_t> mask, view<float> advantages, view<float> returns,
                                                   const reinforce_pp_options& o = {}, const host_executor& ex = {}) {
  detail::check_discount("reinforce_pp_options::gamma", o.gamma);
  layout.expect_tokens("token_rewards", token_rewards);
  layout.expect_tokens("advantages", advantages);
  if (!returns.empty()) layout.expect_tokens("returns", returns);
  detail::expect_mask(layout, mask);
  if (o.whiten) detail::check_whiten_options(*o.whiten);
  // returns = G itself (A + V with V = 0): written by the same pass, before any whitening.
  reinforce_pp_result r;
  if (o.whiten) {
    whiten_result w;
    r.num_nonfinite_seqs = static_cast<index_t>(
        detail::run_recurrence_whitened(layout, token_rewards, {}, mask, {}, o.gamma, o.gamma, o.masked, advantages,
                                        returns, o.on_nonfinite, *o.whiten, "REINFORCE++", ex, w)
            .size());
    r.whitening = w;
  } else {
    r.num_nonfinite_seqs =
        static_cast<index_t>(detail::run_recurrence(layout, token_rewards, {}, mask, {}, o.gamma, o.gamma, o.masked,
                                                    advantages, returns, o.on_nonfinite, 0.0f, "REINFORCE++", ex)
                                 .size());
  }
  return r;
}

struct reinforce_baseline_options {
  rlpt::single single = rlpt::single::raw;                 //!< verl: a lone sample has mean 0 (OpenRLHF: zero)
  std::optional<whiten_options> whiten = whiten_options{}; //!< verl masked_whiten over the tokens
  rlpt::nonfinite on_nonfinite = rlpt::nonfinite::raise;   //!< mask: the sample's tokens get 0
};

struct reinforce_baseline_result {
  group_stats groups;
  std::optional<whiten_result> whitening;
};

//! REINFORCE++-baseline: A_i = R_i - mean_g(R) per sequence (outcome rewards, one per sequence),
//! broadcast onto the valid tokens of `layout`, then whitened over all valid tokens.
inline reinforce_baseline_result reinforce_pp_baseline_advantages(view<const float> rewards, const groups& g,
                                                                  const token_layout& layout, view<const mask_t> mask,
                                                                  view<float> advantages,
                                                                  const reinforce_baseline_options& o = {},
                                                                  const host_executor& ex = {}) {
  detail::expect_size("rewards", rewards.size(), layout.num_seqs(), "one outcome reward per sequence of the layout");
  g.expect_items("rewards", rewards.size());
  layout.expect_tokens("advantages", advantages);
  detail::expect_mask(layout, mask);
  if (o.whiten) detail::check_whiten_options(*o.whiten);
  const index_t bad = detail::check_rewards(rewards, o.on_nonfinite);
  detail::check_singles(rewards, g, o.single, "REINFORCE++-baseline with single = raise", "reinforce_baseline_options");
  reinforce_baseline_result r;
  group_stats& st = r.groups;
  detail::reset_stats(st, g.num_groups());
  st.num_nonfinite = bad;
  std::vector<float> centred(static_cast<std::size_t>(rewards.size()));
  // Non-finite samples become NaN here so that whitening leaves their tokens out (output 0).
  const float poison = o.whiten ? std::numeric_limits<float>::quiet_NaN() : 0.0f;
  detail::for_each_group_moments(
      g, rewards, ex,
      [&](index_t k, const auto& mem, const detail::canonical_moments& m) {
        detail::record_group(st, k, m);
        const bool zero = m.count < 2.0 && o.single != single::raw;
        const double mean = m.count < 2.0 ? 0.0 : m.mean;
        for (index_t i : mem) {
          const float x = rewards[i];
          centred[static_cast<std::size_t>(i)] = !detail::finite(x) ? poison
                                                 : zero             ? 0.0f
                                                                    : static_cast<float>(static_cast<double>(x) - mean);
        }
      },
      bad == 0);
  detail::finish_stats(st);
  broadcast_to_tokens(layout, centred, mask, advantages, 0.0f, ex);
  if (o.whiten) {
    whiten_options w = *o.whiten;
    if (bad != 0) w.on_nonfinite = nonfinite::mask;
    r.whitening = whiten(layout, view<const float>(advantages), mask, advantages, w, ex);
  }
  return r;
}

RLPT_NAMESPACE_END
