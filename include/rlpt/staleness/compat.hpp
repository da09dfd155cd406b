// SPDX-License-Identifier: Apache-2.0
//! @file
//! Presets that reproduce each framework's staleness conventions (async_buffers.md §2–3).
//!
//! | framework | admission (gate)                                 | consumer window (selection)                 | proximal / partial              |
//! |-----------|--------------------------------------------------|---------------------------------------------|---------------------------------|
//! | AReaL     | (η+v+1)·B − accepted − running, cap = B; η = 0   | none; oldest first (create_time)            | loglinear, v_prox = v_θ − 1     |
//! | TRL       | in-flight slots = max_staleness·B, no formula    | drop at current − version > 4; FIFO         | —                               |
//! | verl V1   | —                                                | span = v − d + 1 > threshold: drop or wait; oldest first | —                  |
//! | slime     | — (PR #2278 proposal)                            | lag > N: requeue the prompt; FIFO           | --mask-offpolicy-in-partial-rollout off |
//! NeMo-RL's target-version reservation is `gate_options{.mode = admission_mode::target}`
//! with `selection_options{.order = pick_order::target_version}`.
#pragma once

#include <rlpt/config.hpp>
#include <rlpt/core/error.hpp>
#include <rlpt/staleness/gate.hpp>
#include <rlpt/staleness/partial.hpp>
#include <rlpt/staleness/proximal.hpp>
#include <rlpt/staleness/selection.hpp>

RLPT_NAMESPACE_BEGIN
namespace compat {

namespace areal {
//! `rollout.max_head_offpolicyness` η (default 0), `consumer_batch_size` B in groups,
//! `max_concurrent_rollouts` (0 = B, AReaL's default when unset).
[[nodiscard]] inline gate_options gate(index_t batch_groups, index_t max_head_offpolicyness = 0,
                                       index_t max_concurrent_rollouts = 0) {
  return {
      .max_staleness = max_head_offpolicyness, .batch_groups = batch_groups, .max_concurrent = max_concurrent_rollouts};
}
//! `wait_results`: the oldest finished results by create_time; no consumer-side window.
[[nodiscard]] inline selection_options selection() {
  return {.max_staleness = unbounded_staleness, .order = pick_order::oldest_first, .on_stale = stale_policy::drop};
}
//! `prox_logp_method = loglinear`: v_prox = v_θ − 1.
[[nodiscard]] inline proximal_options proximal() { return {.method = prox_method::loglinear, .lag = 1}; }
} // namespace areal

namespace trl {
//! AsyncGRPOTrainer: `max_inflight_tasks = -1` (auto) = max_staleness × the per-step batch;
//! TRL has no capacity formula, only the slots, so the version window is left to selection().
[[nodiscard]] inline gate_options gate(index_t batch_groups, index_t max_staleness = 4) {
  RLPT_CHECK(max_staleness >= 1, errors::staleness::bad_option,
             "TRL's automatic in-flight cap is max_staleness × batch; max_staleness must be >= 1, got {}",
             max_staleness);
  return {.max_staleness = unbounded_staleness,
          .batch_groups = batch_groups,
          .max_concurrent = ::rlpt::detail::checked_mul(errors::staleness::bad_option, "max_staleness * batch_groups",
                                                        max_staleness, batch_groups)};
}
//! RolloutQueueDataset: drop a group when current − model_version > max_staleness (4).
[[nodiscard]] inline selection_options selection(index_t max_staleness = 4) {
  return {.max_staleness = max_staleness, .order = pick_order::oldest_first, .on_stale = stale_policy::drop};
}
} // namespace trl

namespace verl {
//! V1 ReplayBuffer: span = global_steps − prompt_global_steps + 1 must stay <=
//! `max_off_policy_threshold`, i.e. staleness <= threshold − 1; strategy drop or wait; the
//! sampleable groups are taken oldest first.
[[nodiscard]] inline selection_options v1_selection(index_t max_off_policy_threshold,
                                                    stale_policy strategy = stale_policy::drop) {
  RLPT_CHECK(max_off_policy_threshold >= 1, errors::staleness::bad_option,
             "verl's max_off_policy_threshold counts the span v - d + 1 and must be >= 1, got {}",
             max_off_policy_threshold);
  RLPT_CHECK(strategy != stale_policy::requeue, errors::staleness::bad_option,
             "verl V1 strategies are drop and wait; requeue is slime's");
  return {.max_staleness = max_off_policy_threshold - 1, .order = pick_order::oldest_first, .on_stale = strategy};
}
} // namespace verl

namespace slime {
//! PR #2278 `--max-policy-version-lag N`: accept a group iff current − group_version <= N,
//! otherwise re-queue its pristine prompt; the buffer is served first-in first-out.
[[nodiscard]] inline selection_options selection(index_t max_policy_version_lag) {
  return {
      .max_staleness = max_policy_version_lag, .order = pick_order::oldest_first, .on_stale = stale_policy::requeue};
}
//! `--partial-rollout` with `--mask-offpolicy-in-partial-rollout` (default off).
[[nodiscard]] inline partial_options partial(index_t max_new_tokens, bool mask_offpolicy_in_partial_rollout = false) {
  return {.max_new_tokens = max_new_tokens,
          .mask_prefix_on_resume = mask_offpolicy_in_partial_rollout,
          .max_interruptions = -1};
}
} // namespace slime

} // namespace compat
RLPT_NAMESPACE_END
