// SPDX-License-Identifier: Apache-2.0
// Fuzz target: rollout buffer checkpoint files, read and restored.
//
// Input: one mode byte, then the file. Mode bit 0 set: re-sign: the header's payload size,
// payload checksum and header checksum are recomputed, so mutations reach the payload parser
// and the restore checks behind the checksums. Mode bits 1-7 pick the restoring buffer's
// capacity (0: 1024 groups). A decoded checkpoint must re-encode to the same bytes (the format
// is canonical); it is then restored into a fresh buffer built with the checkpoint's own group
// sizes, schema and filter count. A restored buffer must balance its books, snapshot to the
// state it was given, and drain to empty.
#pragma once

#include "fuzz.hpp"

#include <rlpt/rollout/buffer.hpp>
#include <rlpt/rollout/checkpoint.hpp>

#include <algorithm>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

namespace rlpt::fuzz {

namespace detail {

inline void resign_checkpoint(std::vector<std::byte>& b) {
  if (b.size() < rlpt::detail::checkpoint_header_bytes) return;
  const std::uint64_t payload = b.size() - rlpt::detail::checkpoint_header_bytes;
  std::memcpy(b.data() + 16, &payload, 8);
  const std::uint64_t ph =
      rlpt::detail::xxh3(std::span<const std::byte>(b).subspan(rlpt::detail::checkpoint_header_bytes));
  std::memcpy(b.data() + 24, &ph, 8);
  const std::uint64_t hh = rlpt::detail::xxh3(std::span<const std::byte>(b).first(32));
  std::memcpy(b.data() + 32, &hh, 8);
}

inline buffer_options options_for(const buffer_state& s, index_t capacity) {
  buffer_options o;
  o.capacity_groups = capacity;
  o.group_size = s.group_size;
  o.min_group_size = s.min_group_size;
  o.schema = s.schema;
  for (std::size_t i = 0; i < s.stats.dropped_by_filter.size(); ++i)
    o.filters.push_back({fmt::format("keep-{}", i), evict_reason::rejected, [](const group_view&) { return true; }});
  return o;
}

//! Checks a restored buffer against the state it was given, then drains it.
inline void check_restored(rollout_buffer& b, const buffer_state& s) {
  const buffer_stats st = b.stats();
  RLPT_FUZZ_ASSERT(st.balanced(), "a restored buffer does not balance");
  const buffer_state snap = b.snapshot();
  RLPT_FUZZ_ASSERT(snap.next_ordinal == s.next_ordinal && snap.next_ready_seq == s.next_ready_seq);
  RLPT_FUZZ_ASSERT(snap.stats.inserted == s.stats.inserted && snap.stats.consumed == s.stats.consumed &&
                   snap.stats.resident == s.stats.resident && snap.stats.evicted == s.stats.evicted);
  RLPT_FUZZ_ASSERT(snap.ready.size() == s.ready.size() && snap.open.size() == s.open.size());
  for (std::size_t i = 0; i < s.ready.size(); ++i) RLPT_FUZZ_ASSERT(snap.ready[i].info == s.ready[i].info);
  std::vector<std::int64_t> a, c;
  for (const auto& g : s.open) a.push_back(g.info.id);
  for (const auto& g : snap.open) c.push_back(g.info.id);
  std::sort(a.begin(), a.end());
  std::sort(c.begin(), c.end());
  RLPT_FUZZ_ASSERT(a == c, "open groups differ after restore");

  b.close();
  for (;;) {
    const rollout_batch batch = b.pop(std::min<index_t>(4, b.options().capacity_groups));
    if (batch.empty()) break;
  }
  b.evict_incomplete();
  const buffer_stats end = b.stats();
  RLPT_FUZZ_ASSERT(end.resident == flow_count{} && end.balanced(), "a drained buffer still holds records");
}

} // namespace detail

inline outcome checkpoint(input in) {
  reader r(in);
  const auto mode = r.get<std::uint8_t>();
  std::vector<std::byte> bytes = to_bytes(r.rest());
  if (mode & 1u) detail::resign_checkpoint(bytes);
  rlpt::checkpoint c;
  try {
    c = decode_checkpoint(bytes);
  } catch (const rlpt::error&) {
    return outcome::rejected;
  }
  RLPT_FUZZ_ASSERT(same(encode_checkpoint(c.state, c.user), bytes), "decode -> encode changed the checkpoint");

  const index_t capacity = (mode >> 1) == 0 ? 1024 : index_t{mode >> 1};
  const buffer_state copy = c.state;
  std::optional<rollout_buffer> holder;
  try {
    holder.emplace(detail::options_for(c.state, capacity));
  } catch (const rlpt::error&) {
    return outcome::rejected; // the checkpoint's options are not valid buffer options
  }
  rollout_buffer& b = *holder;
  try {
    b.restore(std::move(c.state));
  } catch (const rlpt::error&) {
    // A refused restore leaves the buffer fresh: a second, valid restore must still work.
    RLPT_FUZZ_ASSERT(b.stats().inserted == flow_count{} && b.snapshot().ready.empty() && b.snapshot().open.empty());
    return outcome::rejected;
  }
  detail::check_restored(b, copy);
  return outcome::accepted;
}

} // namespace rlpt::fuzz
