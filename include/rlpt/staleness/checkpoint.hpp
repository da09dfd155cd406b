// SPDX-License-Identifier: Apache-2.0
//! @file
//! Checkpoints of a staleness_buffer: the rollout checkpoint file (rollout/checkpoint.hpp) with
//! the version state (`encode(staleness_state)`) as its caller blob. A header of its own so that
//! the buffer does not pull the checkpoint's file I/O into every user's build.
#pragma once

#include <rlpt/config.hpp>
#include <rlpt/rollout/checkpoint.hpp>
#include <rlpt/staleness/buffer.hpp>

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

RLPT_NAMESPACE_BEGIN

//! Writes the buffer and its version state to `path` (rollout checkpoint format, the version
//! state in the caller blob), crash-consistently. Call it between steps.
RLPT_DEFER inline void save_checkpoint(staleness_buffer& sb, const std::string& path) {
  const buffer_state bs = sb.buffer().snapshot();
  const std::vector<std::byte> blob = encode(sb.state());
  detail::write_file_durable(path, encode_checkpoint(bs, blob));
}

//! Restores a fresh staleness_buffer (and its gate) from save_checkpoint's file.
RLPT_DEFER inline void restore_checkpoint(staleness_buffer& sb, const std::string& path) {
  checkpoint c = load_checkpoint(path);
  sb.restore(std::move(c.state), decode_staleness_state(c.user));
}

RLPT_NAMESPACE_END
