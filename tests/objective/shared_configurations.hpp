// SPDX-License-Identifier: Apache-2.0
// Objective configurations that both the host property tests (every_kind) and the device tests
// (configurations) run, so that each is written once.
#pragma once

#include <rlpt/objective.hpp>

#include <vector>

namespace rlpt::test {

//! Many rejection criteria at once, AReaL's sequence clamp (bound_weight), the KL weighted by the
//! sequence ratio (with GSPO's coupling, with CISPO's detached sequence weight, next to VESPO's).
inline std::vector<objective> shared_configurations() {
  return {
      {.policy = ppo_clip{}, // seven criteria at once (verl takes up to its eleven options)
       .correction = {.reject = {.stat = rs_stat::k1, .level = rs_level::token, .lo = 0.6, .hi = 1.7},
                      .reject_also = {{{.stat = rs_stat::k2, .level = rs_level::token, .hi = 0.3},
                                       {.stat = rs_stat::k3, .level = rs_level::token, .hi = 0.3},
                                       {.stat = rs_stat::k1, .level = rs_level::seq_sum, .lo = 0.01, .hi = 100.0},
                                       {.stat = rs_stat::k2, .level = rs_level::seq_mean, .hi = 0.2},
                                       {.stat = rs_stat::k3, .level = rs_level::seq_max, .hi = 0.5},
                                       {.stat = rs_stat::k2, .level = rs_level::seq_max, .hi = 0.5}}}},
       .kl = {.coef = 0.1}},
      {.policy = ppo_clip{}, // AReaL clamp on the sequence max; a band on the summed k2
       .correction = {.weight = {.level = is_level::seq_geomean, .bound = is_bound::truncate, .lo = 0.95, .hi = 1.15},
                      .reject = {.stat = rs_stat::ratio, .level = rs_level::seq_max, .lo = 0.95, .hi = 1.15},
                      .reject_also = {{{.stat = rs_stat::k2, .level = rs_level::seq_sum, .lo = 0.01, .hi = 4.0}}},
                      .action = rejection_action::bound_weight},
       .kl = {.coef = 0.1}},
      {.policy = gspo{.token_level = false}, // TRL's bias-corrected KL at sequence level, with entropy
       .kl =
           {.coef = 0.2, .estimator = kl_estimator::k3, .importance_corrected = true, .importance_per_sequence = true},
       .entropy = {.coef = 0.01},
       .agg = {.mode = agg_mode::seq_mean_token_mean}},
      {.policy = gspo{.token_level = false, .length_normalized = false}, // TRL RLOO's ratio, a KL through it
       .kl =
           {.coef = 0.2, .estimator = kl_estimator::k3, .importance_corrected = true, .importance_per_sequence = true},
       .agg = {.mode = agg_mode::seq_mean_token_mean, .count_empty_rows = true}},
      {.policy = cispo{.bounds = cispo_bounds::absolute, .cap = 1.1, .token_level = false}, // TRL cispo per sequence
       .kl =
           {.coef = 0.2, .estimator = kl_estimator::k3, .importance_corrected = true, .importance_per_sequence = true}},
      {.policy = vespo{}, // TRL vespo at sequence level: its own clamped sum, the KL's plain mean
       .kl =
           {.coef = 0.2, .estimator = kl_estimator::k3, .importance_corrected = true, .importance_per_sequence = true},
       .agg = {.mode = agg_mode::token_sum}},
  };
}

} // namespace rlpt::test
