// SPDX-License-Identifier: Apache-2.0
//! @file
//! RLOO: REINFORCE with a leave-one-out baseline (arXiv 2402.14740). Each sample is compared with
//! the mean of the *other* samples of its group: A_i = R_i - (S_g - R_i) / (n_g - 1), which is the
//! same number as the k/(k-1) form n/(n-1) (R_i - mean_g). A separate estimator (not a GRPO flag)
//! with its own check: a group needs at least 2 counted samples unless `single` says otherwise.
#pragma once

#include <rlpt/config.hpp>
#include <rlpt/advantage/common.hpp>
#include <rlpt/core/error.hpp>
#include <rlpt/core/executor.hpp>
#include <rlpt/core/groups.hpp>
#include <rlpt/core/views.hpp>

#include <cmath>
#include <limits>
#include <vector>

RLPT_NAMESPACE_BEGIN

struct rloo_options {
  //! rlpt default: a group of 1 is an error (OpenRLHF would divide 0 by 0). verl `rloo` keeps R
  //! (single::raw); verl `rloo_vectorized` gives 0 (single::zero).
  rlpt::single single = rlpt::single::raise;
  rlpt::nonfinite on_nonfinite = rlpt::nonfinite::raise;
  //! TRL RLOOTrainer normalize_advantages: afterwards (A - mean) / (std_unbiased + batch_epsilon)
  //! over the samples that got a leave-one-out advantage (counted, in a group of >= 2 counted).
  bool batch_normalize = false;
  double batch_epsilon = 1e-4; //!< TRL
};

namespace detail {

//! Leave-one-out advantage of x in a group with `count` counted rewards summing to `sum`.
RLPT_HD float rloo_value(float x, double count, double sum, single policy) {
  if (!finite(x) || count < 1.0) return 0.0f;
  if (count < 2.0) return policy == single::raw ? x : 0.0f;
  const double xd = static_cast<double>(x);
  return static_cast<float>(xd - (sum - xd) / (count - 1.0));
}

} // namespace detail

//! RLOO advantages, one per sequence, and per-group statistics (mean = plain group mean).
inline void rloo_advantages(view<const float> rewards, const groups& g, view<float> out, const rloo_options& o,
                            group_stats& stats, const host_executor& ex = {}) {
  RLPT_CHECK(!o.batch_normalize || (o.batch_epsilon > 0.0 && std::isfinite(o.batch_epsilon)),
             errors::advantage::bad_option, "rloo_options: batch_epsilon must be finite and > 0, got {}",
             o.batch_epsilon);
  const index_t bad = detail::start_group_estimator(rewards, g, out, o.on_nonfinite);
  detail::check_singles(rewards, g, o.single, "RLOO", "rloo_options");
  detail::reset_stats(stats, g.num_groups());
  stats.num_nonfinite = bad;
  detail::for_each_group_moments(
      g, rewards, ex,
      [&](index_t k, const auto& mem, const detail::canonical_moments& m) {
        detail::record_group(stats, k, m);
        for (index_t i : mem) out[i] = detail::rloo_value(rewards[i], m.count, m.sum, o.single);
      },
      bad == 0);
  detail::finish_stats(stats);
  if (!o.batch_normalize) return;
  // Samples with a real leave-one-out advantage take part; the others stay 0 (TRL: NaN -> 0).
  std::vector<float> part(static_cast<std::size_t>(out.size()), std::numeric_limits<float>::quiet_NaN());
  for (index_t i = 0; i < out.size(); ++i)
    if (detail::finite(rewards[i]) && stats.size[static_cast<std::size_t>(g.group_of(i))] >= 2)
      part[static_cast<std::size_t>(i)] = out[i];
  const detail::canonical_moments m = detail::moments_canonical<detail::batch_lanes>(
      out.size(), [&](index_t i) { return part[static_cast<std::size_t>(i)]; });
  if (m.count < 2.0) { // TRL: nanstd of fewer than 2 values is NaN, and NaN advantages become 0
    for (index_t i = 0; i < out.size(); ++i) out[i] = 0.0f;
    return;
  }
  const double div = detail::std_of(m.count, m.m2, true) + o.batch_epsilon;
  for (index_t i = 0; i < out.size(); ++i) {
    const float x = part[static_cast<std::size_t>(i)];
    out[i] = detail::finite(x) ? static_cast<float>((static_cast<double>(x) - m.mean) / div) : 0.0f;
  }
}

[[nodiscard]] inline group_stats rloo_advantages(view<const float> rewards, const groups& g, view<float> out,
                                                 const rloo_options& o = {}, const host_executor& ex = {}) {
  group_stats s;
  rloo_advantages(rewards, g, out, o, s, ex);
  return s;
}

RLPT_NAMESPACE_END
