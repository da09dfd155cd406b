// SPDX-License-Identifier: Apache-2.0
//! @file
//! Presets that reproduce each framework's data-path conventions (async_buffers.md §4).
//!
//! | preset                         | verl                         | AReaL                 | slime             | TRL            |
//! |--------------------------------|------------------------------|-----------------------|-------------------|----------------|
//! | rank balancing                 | KK, equal count, 24576L+L²   | LPT, equal count, tokens | KK, tokens     | LPT on L²      |
//! | micro-batches                  | KK on 24576L+L², cap loop, small at ends | FFD on tokens | FFD on tokens  | —              |
//! | packed padding                 | none (remove_padding)        | to 256 tokens         | none              | none           |
//! | DAPO filter                    | std == 0 drops               | caller predicate      | std > 1e-6 keeps  | —              |
//! | full buffer                    | drop oldest (fully_async)    | block                 | block             | block          |
#pragma once

#include <rlpt/config.hpp>
#include <rlpt/rollout/balance.hpp>
#include <rlpt/rollout/buffer.hpp>
#include <rlpt/rollout/filters.hpp>
#include <rlpt/rollout/packing.hpp>

#include <limits>

RLPT_NAMESPACE_BEGIN
namespace compat {

namespace verl {
//! trainer._balance_batch: get_seqlen_balanced_partitions(calculate_workload(L), dp, equal_size=True).
[[nodiscard]] inline balance_options balance(index_t ranks) {
  return {.ranks = ranks,
          .algorithm = partition_algorithm::karmarkar_karp,
          .equal_count = true,
          .refine = false,
          .cost = cost_model::attention(24576.0)};
}
//! rearrange_micro_batches(max_token_len): KK on the workload, k raised until the cap holds,
//! small micro-batches at both ends (use_dynamic_bsz_balance = True).
[[nodiscard]] inline microbatch_options microbatches(index_t max_token_len = 16384) {
  return {.token_budget = max_token_len,
          .algorithm = pack_algorithm::karmarkar_karp,
          .cost = cost_model::attention(24576.0),
          .min_microbatches = 1,
          .divisor = 1,
          .small_at_ends = true,
          .repair = false,
          .kk_attempts = std::numeric_limits<index_t>::max() / 4};
}
//! V1 filter_groups: drop a group when np.std of its metric == 0 (groups of one are kept).
[[nodiscard]] inline group_filter dapo_filter(index_t channel = 0) {
  return filters::dapo({.channel = channel, .eps = 0.0, .keep_singletons = true});
}
//! fully_async MessageQueue: bounded, the oldest ready group is dropped when full.
[[nodiscard]] inline buffer_options fully_async_queue(index_t capacity_groups, index_t group_size) {
  return {.capacity_groups = capacity_groups, .group_size = group_size, .when_full = full_policy::drop_oldest};
}
} // namespace verl

namespace areal {
//! balanced_greedy_partition: LPT with an equal count per rank, on tokens.
[[nodiscard]] inline balance_options balance(index_t ranks) {
  return {.ranks = ranks,
          .algorithm = partition_algorithm::lpt,
          .equal_count = true,
          .refine = false,
          .cost = cost_model::tokens()};
}
//! MicroBatchSpec defaults: packing_algorithm ffd, n_mbs 1, n_mbs_divisor 1.
[[nodiscard]] inline microbatch_options microbatches(index_t max_tokens_per_mb) {
  return {.token_budget = max_tokens_per_mb,
          .algorithm = pack_algorithm::ffd,
          .cost = cost_model::tokens(),
          .min_microbatches = 1,
          .divisor = 1,
          .small_at_ends = false};
}
//! pad_mb_list: each micro-batch padded to a multiple of 256 tokens (a trailing pad sequence).
[[nodiscard]] inline pack_options pack() { return {.pad_to_multiple = 256}; }
} // namespace areal

namespace slime {
//! --balance-data: KK across DP on tokens.
[[nodiscard]] inline balance_options balance(index_t ranks) {
  return {.ranks = ranks,
          .algorithm = partition_algorithm::karmarkar_karp,
          .equal_count = false,
          .refine = false,
          .cost = cost_model::tokens()};
}
//! --use-dynamic-batch-size --max-tokens-per-gpu: first-fit packing (FFD as miles PR #1936).
[[nodiscard]] inline microbatch_options microbatches(index_t max_tokens_per_gpu) {
  return {.token_budget = max_tokens_per_gpu,
          .algorithm = pack_algorithm::ffd,
          .cost = cost_model::tokens(),
          .min_microbatches = 1,
          .divisor = 1,
          .small_at_ends = false};
}
//! check_reward_nonzero_std: keep a group iff std(rewards) > 1e-6.
[[nodiscard]] inline group_filter dapo_filter(index_t channel = 0) {
  return filters::dapo({.channel = channel, .eps = 1e-6, .keep_singletons = false});
}
} // namespace slime

namespace trl {
//! _balance_by_squared_length: LPT on L² into num_processes rows.
[[nodiscard]] inline balance_options balance(index_t ranks) {
  return {.ranks = ranks,
          .algorithm = partition_algorithm::lpt,
          .equal_count = false,
          .refine = false,
          .cost = cost_model::squared()};
}
} // namespace trl

} // namespace compat
RLPT_NAMESPACE_END
