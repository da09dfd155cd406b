// SPDX-License-Identifier: Apache-2.0
// Fuzz target: staleness state restore (the version state a staleness_buffer keeps in its
// checkpoint's caller blob, and the restore that recovers the gate from it).
//
// Input: one mode byte, then the bytes.
//   bit 0: re-sign the checkpoint header (as in the checkpoint target)
//   bit 1: 0 = the bytes are a staleness state blob alone (restored over an empty buffer);
//          1 = the bytes are a staleness_buffer checkpoint file (buffer state + blob)
//   bits 2-3: the gate's max_staleness (0-3); bit 4: admission_mode::target;
//   bits 5-6: the gate's batch_groups - 1
// A decoded blob must re-encode to the same bytes. A refused restore must leave the buffer and
// the gate as fresh as they were (a second restore must be possible); an accepted one must
// leave the gate's and the buffer's books balanced, with one buffered ticket per ready group.
#pragma once

#include "fuzz.hpp"
#include "target_checkpoint.hpp"

#include <rlpt/staleness/buffer.hpp>

#include <optional>
#include <vector>

namespace rlpt::fuzz {

inline outcome staleness(input in) {
  reader r(in);
  const auto mode = r.get<std::uint8_t>();
  std::vector<std::byte> bytes = to_bytes(r.rest());

  buffer_state bs;
  std::span<const std::byte> blob = bytes;
  rlpt::checkpoint c;
  if (mode & 2u) {
    if (mode & 1u) detail::resign_checkpoint(bytes);
    try {
      c = decode_checkpoint(bytes);
    } catch (const rlpt::error&) {
      return outcome::rejected;
    }
    bs = std::move(c.state);
    blob = c.user;
  } else {
    bs = rollout_buffer(buffer_options{}).snapshot();
  }

  staleness_state vs;
  try {
    vs = decode_staleness_state(blob);
  } catch (const rlpt::error&) {
    return outcome::rejected;
  }
  RLPT_FUZZ_ASSERT(same(encode(vs), blob), "decode -> encode changed the staleness state");

  const gate_options go{.max_staleness = (mode >> 2) & 3,
                        .batch_groups = 1 + ((mode >> 5) & 3),
                        .max_concurrent = 64,
                        .mode = (mode & 16u) ? admission_mode::target : admission_mode::capacity};
  staleness_gate gate(go);
  std::optional<staleness_buffer> holder;
  try {
    holder.emplace(gate, detail::options_for(bs, 1024));
  } catch (const rlpt::error&) {
    return outcome::rejected;
  }
  staleness_buffer& sb = *holder;
  const std::size_t ready = bs.ready.size();
  try {
    sb.restore(std::move(bs), vs);
  } catch (const rlpt::error&) {
    const gate_counts gc = gate.counts();
    RLPT_FUZZ_ASSERT(sb.buffer().stats().inserted == flow_count{} && sb.buffer().snapshot().ready.empty() &&
                         sb.buffer().snapshot().open.empty(),
                     "a refused restore left state in the buffer");
    RLPT_FUZZ_ASSERT(gc.admitted == 0 && gc.buffered == 0 && gate.version() == 0, "a refused restore changed the gate");
    return outcome::rejected;
  }
  const gate_counts gc = gate.counts();
  RLPT_FUZZ_ASSERT(gc.balanced() && sb.buffer().stats().balanced());
  RLPT_FUZZ_ASSERT(gc.version == vs.version && gc.buffered == static_cast<index_t>(ready) && gc.running == 0,
                   "gate at version {} with {} buffered for {} ready groups", gc.version, gc.buffered, ready);
  RLPT_FUZZ_ASSERT(sb.buffer().stats().open_groups == 0, "open groups survived a staleness restore");
  RLPT_FUZZ_ASSERT(sb.state().groups.size() == ready);
  return outcome::accepted;
}

} // namespace rlpt::fuzz
