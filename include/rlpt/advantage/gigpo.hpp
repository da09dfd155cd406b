// SPDX-License-Identifier: Apache-2.0
//! @file
//! GiGPO (Feng et al., "Group-in-Group Policy Optimization for LLM Agent Training", arXiv
//! 2505.10978; verl-agent's compute_gigpo_outcome_advantage) for multi-step agents. A batch row is
//! one step of a trajectory (one turn's response), as in verl-agent. Two GRPO normalisations add:
//!
//!   A_i = A^E_i + w A^S_i
//!
//! - A^E, the episode level: each row's episode score (its trajectory's reward; verl-agent sums the
//!   row's token-level rewards) normalised over the rows of its episode group (the rollouts of one
//!   task), the mean (and std) taken over rows, so a longer trajectory weighs more (verl-agent's
//!   compute_mean_std_cross_steps, its default). A group of one keeps its score (mean 0, std 1).
//! - A^S, the step level: each row's discounted step return (rlpt::step_returns) normalised over its
//!   anchor group, the rows of the same episode group whose environment state before the step was
//!   the same (rlpt::anchor_groups from hashed states). A group of one gets 0: a state seen once has
//!   no comparison.
//!
//! Both levels are rlpt::grpo_advantages with verl's statistics (unbiased std, epsilon added):
//! gigpo_norm::mean subtracts the group mean (verl-agent mode "mean_norm", its default),
//! gigpo_norm::mean_std also divides by std + epsilon ("mean_std_norm").
#pragma once

#include <rlpt/config.hpp>
#include <rlpt/advantage/common.hpp>
#include <rlpt/advantage/grpo.hpp>
#include <rlpt/advantage/reinforce.hpp>
#include <rlpt/core/error.hpp>
#include <rlpt/core/executor.hpp>
#include <rlpt/core/groups.hpp>
#include <rlpt/core/layout.hpp>
#include <rlpt/core/views.hpp>

#include <cmath>
#include <cstdint>
#include <string_view>
#include <vector>

RLPT_NAMESPACE_BEGIN

//! How each level normalises within its groups.
enum class gigpo_norm : std::uint8_t {
  mean,     //!< A = x - mean (verl-agent mode "mean_norm", its default)
  mean_std, //!< A = (x - mean) / (std + epsilon) (verl-agent mode "mean_std_norm")
};

[[nodiscard]] constexpr std::string_view name(gigpo_norm n) noexcept {
  return n == gigpo_norm::mean ? "mean" : "mean_std";
}

struct gigpo_options {
  gigpo_norm norm = gigpo_norm::mean; //!< verl-agent algorithm.gigpo.mode "mean_norm"
  double step_weight = 1.0;           //!< w: verl-agent algorithm.gigpo.step_advantage_w
  double epsilon = 1e-6;              //!< added to the std (mean_std): verl-agent's epsilon
  rlpt::nonfinite on_nonfinite = rlpt::nonfinite::raise;
};

//! The statistics of both levels' groups (group_stats: means, stds, sizes, degenerate flags).
struct gigpo_stats {
  group_stats episode; //!< per episode group
  group_stats step;    //!< per anchor group (sizes show how often states recur: verl-agent logs them)
};

//! Discounted step returns G_t = r_t + gamma * G_{t+1} along each trajectory (verl-agent's
//! compute_step_discounted_returns): a trajectory's steps are the members of one group of
//! `trajectories`, in row order (rows need not be contiguous). Returns the number of trajectories
//! zeroed under nonfinite::mask (a non-finite reward zeroes its whole trajectory).
inline index_t step_returns(view<const float> step_rewards, const groups& trajectories, double gamma, view<float> out,
                            rlpt::nonfinite on_nonfinite = rlpt::nonfinite::raise, const host_executor& ex = {}) {
  trajectories.expect_items("step_rewards", step_rewards.size());
  detail::expect_size("returns", out.size(), step_rewards.size(), "one per step");
  detail::check_rewards(step_rewards, on_nonfinite, "step_rewards"); // raise: named by row, before any work
  // In member order the trajectories are a packed layout, and the recurrence runs on it: in place
  // when the members are rows 0, 1, ..., n - 1, on a gathered copy otherwise.
  const token_layout layout = token_layout::packed(trajectories.offsets());
  const returns_options ro{.gamma = gamma, .on_nonfinite = on_nonfinite};
  if (trajectories.contiguous()) return discounted_returns(layout, step_rewards, {}, out, ro, ex);
  const view<const index_t> members = trajectories.members();
  const auto n = static_cast<std::size_t>(members.size());
  std::vector<float> r(n), g(n);
  for (std::size_t j = 0; j < n; ++j) r[j] = step_rewards[members[static_cast<index_t>(j)]];
  const index_t zeroed = discounted_returns(layout, r, {}, g, ro, ex);
  for (std::size_t j = 0; j < n; ++j) out[members[static_cast<index_t>(j)]] = g[j];
  return zeroed;
}

//! The anchor groups of GiGPO's step level: rows of the same episode group with the same anchor
//! id (a hash of the environment state the step started from; verl-agent groups exact copies of
//! the observation), numbered in order of first appearance. Two rows of different episode groups
//! never share an anchor group, whatever their ids.
[[nodiscard]] inline groups anchor_groups(const groups& episodes, view<const std::int64_t> anchor_ids) {
  episodes.expect_items("anchor_ids", anchor_ids.size());
  const groups states = groups::from_ids(anchor_ids); // anchor ids numbered 0 .. S - 1
  const view<const index_t> state_of = states.group_of();
  const view<const index_t> episode_of = episodes.group_of();
  // (episode, state) as one id: episode * S + state is unique, and below 2^62 (both counts < 2^31).
  std::vector<std::int64_t> pair(static_cast<std::size_t>(anchor_ids.size()));
  const auto S = static_cast<std::int64_t>(states.num_groups());
  for (index_t i = 0; i < anchor_ids.size(); ++i)
    pair[static_cast<std::size_t>(i)] = static_cast<std::int64_t>(episode_of[i]) * S + state_of[i];
  return groups::from_ids(pair);
}

//! GiGPO advantages, one per row (file comment). `episode_scores` and `returns` (the discounted
//! step returns) have one value per row; `anchors` must refine `episodes` (each anchor group inside one episode group, as
//! anchor_groups makes them). `stats` receives both levels' group statistics.
inline void gigpo_advantages(view<const float> episode_scores, const groups& episodes, view<const float> returns,
                             const groups& anchors, view<float> out, const gigpo_options& o, gigpo_stats& stats,
                             const host_executor& ex = {}) {
  RLPT_CHECK(std::isfinite(o.step_weight), errors::advantage::bad_option,
             "gigpo_options::step_weight = {} is not finite", o.step_weight);
  RLPT_CHECK(o.epsilon >= 0.0 && std::isfinite(o.epsilon), errors::advantage::bad_option,
             "gigpo_options::epsilon = {} must be finite and >= 0", o.epsilon);
  episodes.expect_items("episode_scores", episode_scores.size());
  anchors.expect_items("step returns", returns.size());
  detail::expect_size("advantages", out.size(), episode_scores.size(), "one advantage per row");
  const view<const index_t> episode_of = episodes.group_of();
  for (index_t k = 0; k < anchors.num_groups(); ++k) {
    const view<const index_t> mem = anchors.members(k);
    for (index_t i : mem)
      RLPT_CHECK(episode_of[i] == episode_of[mem[0]], errors::advantage::bad_groups,
                 "anchor group {} holds rows {} (episode group {}) and {} (episode group {}); anchor groups must lie "
                 "within one episode group (rlpt::anchor_groups makes them so)",
                 k, mem[0], episode_of[mem[0]], i, episode_of[i]);
  }
  const rlpt::scale sc = o.norm == gigpo_norm::mean_std ? scale::group_std : scale::none;
  // verl-agent: an episode group of one has mean 0 and std 1 (its score passes); an anchor group of
  // one has its own value as mean (advantage 0).
  const grpo_options episode{.scale = sc, .epsilon = o.epsilon, .single = single::raw, .on_nonfinite = o.on_nonfinite};
  const grpo_options step{.scale = sc, .epsilon = o.epsilon, .single = single::zero, .on_nonfinite = o.on_nonfinite};
  std::vector<float> step_adv(static_cast<std::size_t>(out.size()));
  grpo_advantages(episode_scores, episodes, out, episode, stats.episode, ex);
  grpo_advantages(returns, anchors, step_adv, step, stats.step, ex);
  const double w = o.step_weight;
  for (index_t i = 0; i < out.size(); ++i)
    out[i] = static_cast<float>(detail::add_rn(
        static_cast<double>(out[i]), detail::mul_rn(w, static_cast<double>(step_adv[static_cast<std::size_t>(i)]))));
}

//! GiGPO advantages; returns both levels' group statistics.
[[nodiscard]] inline gigpo_stats gigpo_advantages(view<const float> episode_scores, const groups& episodes,
                                                  view<const float> returns, const groups& anchors, view<float> out,
                                                  const gigpo_options& o = {}, const host_executor& ex = {}) {
  gigpo_stats s;
  gigpo_advantages(episode_scores, episodes, returns, anchors, out, o, s, ex);
  return s;
}

RLPT_NAMESPACE_END
