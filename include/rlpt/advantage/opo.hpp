// SPDX-License-Identifier: Apache-2.0
//! @file
//! OPO (arXiv 2505.23585, verl `opo`): the optimal baseline for on-policy sequences is the
//! length-weighted group mean, b_g = sum_j L_j R_j / sum_j L_j, and A_i = R_i - b_g.
#pragma once

#include <rlpt/config.hpp>
#include <rlpt/advantage/common.hpp>
#include <rlpt/core/error.hpp>
#include <rlpt/core/executor.hpp>
#include <rlpt/core/groups.hpp>
#include <rlpt/core/views.hpp>

RLPT_NAMESPACE_BEGIN

struct opo_options {
  rlpt::single single = rlpt::single::raw; //!< verl: a lone sample has baseline 0 (A = R)
  rlpt::nonfinite on_nonfinite = rlpt::nonfinite::raise;
};

//! OPO advantages. `lengths` are the valid-token counts per sequence (rlpt::valid_lengths gives
//! them from a token layout and mask, as verl's response_mask.sum(-1) does).
inline void opo_advantages(view<const float> rewards, view<const index_t> lengths, const groups& g, view<float> out,
                           const opo_options& o, group_stats& stats, const host_executor& ex = {}) {
  const index_t bad = detail::start_group_estimator(rewards, g, out, o.on_nonfinite);
  detail::expect_size("lengths", lengths.size(), rewards.size(), "one length per sequence");
  for (index_t i = 0; i < lengths.size(); ++i)
    RLPT_CHECK(lengths[i] >= 0, errors::advantage::bad_length, "lengths[{}] = {} is negative", i, lengths[i]);
  detail::check_singles(rewards, g, o.single, "OPO with single = raise", "opo_options");
  for (index_t k = 0; k < g.num_groups(); ++k) {
    index_t counted = 0, total = 0;
    for (index_t i : g.members(k))
      if (detail::finite(rewards[i])) {
        ++counted;
        total += lengths[i];
      }
    RLPT_CHECK(counted < 2 || total > 0, errors::advantage::bad_length,
               "group {} (id {}) has {} samples whose lengths sum to 0: the length-weighted OPO baseline is 0/0", k,
               g.id(k), counted);
  }
  detail::reset_stats(stats, g.num_groups());
  stats.num_nonfinite = bad;
  detail::for_each_group_moments(
      g, rewards, ex,
      [&](index_t k, const auto& mem, const detail::canonical_moments& m) {
        detail::record_group(stats, k, m);
        double baseline = 0.0;
        const bool zero = m.count < 1.0 || (m.count < 2.0 && o.single != single::raw);
        if (m.count >= 2.0) {
          const auto valid = [&](index_t j) { return detail::finite(rewards[mem[j]]); };
          const double wsum = detail::canonical_sum(mem.size(), [&](index_t j) {
            return valid(j) ? detail::mul_rn(static_cast<double>(lengths[mem[j]]), static_cast<double>(rewards[mem[j]]))
                            : 0.0;
          });
          const double lsum = detail::canonical_sum(
              mem.size(), [&](index_t j) { return valid(j) ? static_cast<double>(lengths[mem[j]]) : 0.0; });
          baseline = wsum / lsum;
        }
        for (index_t i : mem)
          out[i] = (zero || !detail::finite(rewards[i]))
                       ? 0.0f
                       : static_cast<float>(static_cast<double>(rewards[i]) - baseline);
      },
      bad == 0);
  detail::finish_stats(stats);
}

[[nodiscard]] inline group_stats opo_advantages(view<const float> rewards, view<const index_t> lengths, const groups& g,
                                                view<float> out, const opo_options& o = {},
                                                const host_executor& ex = {}) {
  group_stats s;
  opo_advantages(rewards, lengths, g, out, o, s, ex);
  return s;
}

RLPT_NAMESPACE_END
