// SPDX-License-Identifier: Apache-2.0
//! @file
//! Multi-reward decoupled normalisation (GDPO, arXiv 2601.05242; TRL
//! multi_objective_aggregation="normalize_then_sum"; verl `gdpo`): every reward channel is
//! group-normalised on its own, the normalised channels are summed with weights, and the sum is
//! normalised once more over the batch. A dominant channel therefore cannot drown the others, as
//! it does when channels are summed first (TRL's default "sum_then_normalize": use
//! rlpt::combine_reward_channels, then rlpt::grpo_advantages).
//!
//! TRL normalises the sum per sequence (batch_normalize = true). verl whitens it over the tokens
//! instead (token-weighted): set batch_normalize = false, then broadcast_to_tokens and whiten
//! with rlpt::compat::verl::whiten().
#pragma once

#include <rlpt/config.hpp>
#include <rlpt/advantage/common.hpp>
#include <rlpt/advantage/grpo.hpp>
#include <rlpt/core/error.hpp>
#include <rlpt/core/executor.hpp>
#include <rlpt/core/groups.hpp>
#include <rlpt/core/views.hpp>

#include <limits>
#include <vector>

RLPT_NAMESPACE_BEGIN

struct gdpo_options {
  //! Per-channel group normalisation; the default is TRL's: std + 1e-4, NaN values left out.
  grpo_options channel = {.epsilon = 1e-4, .single = rlpt::single::zero, .on_nonfinite = rlpt::nonfinite::mask};
  bool batch_normalize = true; //!< TRL: (R - mean) / (std + eps) over the batch's scorable samples
  double batch_epsilon = 1e-4; //!< TRL
  bool batch_unbiased = true;  //!< TRL nanstd is Bessel-corrected
};

struct gdpo_result {
  std::vector<group_stats> channels; //!< per-channel group statistics
  index_t num_unscorable = 0;        //!< samples whose channels were all non-finite (advantage 0)
  double batch_mean = 0.0;           //!< batch_normalize: subtracted mean
  double batch_std = 0.0;            //!< batch_normalize: std before epsilon
};

//! GDPO advantages, one per sequence: channels is [B, K] (row b = sequence b), weights has K.
inline gdpo_result gdpo_advantages(view2d<const float> channels, view<const float> weights, const groups& g,
                                   view<float> out, const gdpo_options& o = {}, const host_executor& ex = {}) {
  const index_t B = channels.rows(), K = channels.cols();
  RLPT_CHECK(K >= 1, errors::advantage::bad_shape, "GDPO needs at least one reward channel, got {}", K);
  g.expect_items("channels rows", B);
  detail::expect_size("weights", weights.size(), K, "one weight per reward channel");
  detail::expect_size("advantages", out.size(), B, "one advantage per sequence");
  detail::check_grpo_options(o.channel);
  RLPT_CHECK(o.batch_epsilon > 0.0 || !o.batch_normalize, errors::advantage::bad_option,
             "gdpo_options: batch_epsilon must be > 0 when batch_normalize is set, got {}", o.batch_epsilon);
  for (index_t k = 0; k < K; ++k)
    RLPT_CHECK(detail::finite(weights[k]), errors::advantage::bad_option, "weights[{}] = {} is not finite", k,
               weights[k]);

  gdpo_result r;
  r.channels.resize(static_cast<std::size_t>(K));
  std::vector<float> column(static_cast<std::size_t>(B)), z(static_cast<std::size_t>(B));
  std::vector<double> sum(static_cast<std::size_t>(B), 0.0);
  std::vector<mask_t> scorable(static_cast<std::size_t>(B), 0);
  for (index_t k = 0; k < K; ++k) {
    for (index_t b = 0; b < B; ++b) {
      column[static_cast<std::size_t>(b)] = channels(b, k);
      if (detail::finite(channels(b, k))) scorable[static_cast<std::size_t>(b)] = 1;
    }
    grpo_advantages(column, g, z, o.channel, r.channels[static_cast<std::size_t>(k)], ex);
    for (index_t b = 0; b < B; ++b)
      sum[static_cast<std::size_t>(b)] +=
          static_cast<double>(weights[k]) * static_cast<double>(z[static_cast<std::size_t>(b)]);
  }
  for (index_t b = 0; b < B; ++b) {
    const auto i = static_cast<std::size_t>(b);
    if (!scorable[i]) ++r.num_unscorable;
    column[i] = scorable[i] ? static_cast<float>(sum[i]) : std::numeric_limits<float>::quiet_NaN();
  }
  if (!o.batch_normalize) {
    for (index_t b = 0; b < B; ++b)
      out[b] = detail::finite(column[static_cast<std::size_t>(b)]) ? column[static_cast<std::size_t>(b)] : 0.0f;
    return r;
  }
  const view<const float> summed(column);
  const detail::canonical_moments m =
      detail::moments_canonical<detail::batch_lanes>(B, [&](index_t b) { return summed[b]; });
  r.batch_mean = m.mean;
  const double need = o.batch_unbiased ? 2.0 : 1.0;
  if (m.count < need) { // TRL: nanstd of fewer than 2 is NaN, and NaN advantages become 0
    for (index_t b = 0; b < B; ++b) out[b] = 0.0f;
    return r;
  }
  r.batch_std = detail::std_of(m.count, m.m2, o.batch_unbiased);
  const double div = r.batch_std + o.batch_epsilon;
  for (index_t b = 0; b < B; ++b) {
    const float x = summed[b];
    out[b] = detail::finite(x) ? static_cast<float>((static_cast<double>(x) - m.mean) / div) : 0.0f;
  }
  return r;
}

RLPT_NAMESPACE_END
