// SPDX-License-Identifier: Apache-2.0
//! @file
//! Weight-sync presets that reproduce what each framework does by default, so an rlpt link
//! can stand in for it without changing bucket sizes or the memory it plans for.
#pragma once

#include <rlpt/config.hpp>
#include <rlpt/sync/planner.hpp>
#include <rlpt/sync/protocol.hpp>

#include <chrono>
#include <cstdint>

RLPT_NAMESPACE_BEGIN
namespace compat {

namespace slime {
//! slime: --update-weight-buffer-size 512 MiB buckets; disk-delta sync sends changed elements.
[[nodiscard]] inline sync::plan_options sync_plan() {
  return {.bucket_bytes = std::uint64_t{512} << 20, .alignment = 256};
}
[[nodiscard]] inline sync::sender_options sync_delta() { return {.delta = true}; }
} // namespace slime

namespace trl {
//! TRL: 256 MB buckets (trl #6386); vLLM requests time out after 300 s; delta sync with
//! periodic full anchors.
[[nodiscard]] inline sync::plan_options sync_plan() {
  return {.bucket_bytes = std::uint64_t{256} << 20, .alignment = 256};
}
[[nodiscard]] inline sync::sender_options sync_sender() {
  return {.delta = false,
          .anchor_every = 0,
          .timeout = std::chrono::seconds(300),
          .commit_timeout = std::chrono::seconds(300)};
}
} // namespace trl

namespace verl {
//! verl's delta_sharded engine: changed elements against a host snapshot.
[[nodiscard]] inline sync::sender_options sync_delta() { return {.delta = true}; }
} // namespace verl

} // namespace compat
RLPT_NAMESPACE_END
