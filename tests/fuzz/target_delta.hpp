// SPDX-License-Identifier: Apache-2.0
// Fuzz target: delta record streams (DELTA payloads, rlpt delta safetensors chunks).
//
// Input: one mode byte, then the stream.
//   bit 0 set: re-sign: every record header's checksum is recomputed before parsing (walking
//              the stream by the body sizes the headers claim), so mutations reach the checks
//              behind the header checksum.
//   bit 1 set: encoder round trip instead: the stream bytes are split into `now` and `base`
//              (mode bits 2-3 pick the element size, the next byte the record size); encoding
//              `now` against `base`, then parsing and applying the records to `base`, must give
//              `now`, and the encoder's checksum must be the manifest's checksum of `now`.
// Every record the parser accepts is applied (by swapping) to a target range of its size and
// applied again, which must restore both the target and the record.
#pragma once

#include "fuzz.hpp"

#include <rlpt/sync/delta.hpp>

#include <cstring>
#include <vector>

namespace rlpt::fuzz {

namespace detail {

inline void resign_delta_stream(std::span<std::byte> s) {
  std::size_t at = 0;
  while (s.size() - at >= sync::delta_header_bytes) {
    std::byte* p = s.data() + at;
    const std::uint64_t check = sync::xxh3(p, 56);
    std::memcpy(p + 56, &check, 8);
    std::uint64_t body = 0;
    std::memcpy(&body, p + 40, 8);
    if (body > s.size() - at - sync::delta_header_bytes) break;
    at += sync::delta_header_bytes + static_cast<std::size_t>(body);
  }
}

inline outcome delta_encode_round_trip(std::uint8_t mode, reader& r) {
  static constexpr std::size_t sizes[] = {1, 2, 4, 8};
  const std::size_t eb = sizes[(mode >> 2) & 3u];
  const std::uint64_t max_record = sync::delta_header_bytes + 64 + 8 * std::uint64_t{r.get<std::uint8_t>()};
  const std::uint64_t bucket = 8 + std::uint64_t{r.get<std::uint16_t>()};
  const auto bytes = r.rest();
  const std::size_t n = bytes.size() / 2 / eb * eb;
  const std::vector<std::byte> now = to_bytes(bytes.first(n));
  std::vector<std::byte> base = to_bytes(bytes.subspan(n, n));
  sync::delta_encoder enc(max_record);
  std::vector<std::byte> out;
  sync::delta_stats stats;
  const std::uint64_t sum = enc.encode(7, now, base, eb, 42, bucket, out, stats);
  RLPT_FUZZ_ASSERT(sum == sync::tensor_checksum(now.data(), now.size(), bucket), "encoder checksum");
  RLPT_FUZZ_ASSERT(stats.bytes == out.size() && stats.elements == n / eb);
  aligned_bytes stream(std::span<const std::uint8_t>(reinterpret_cast<const std::uint8_t*>(out.data()), out.size()));
  std::uint64_t records = 0;
  sync::for_each_delta_record(stream.span(), "round trip", [&](sync::delta_record& rec) {
    RLPT_FUZZ_ASSERT(rec.tensor == 7 && rec.base_checksum == 42 && rec.elem_bytes == eb);
    RLPT_FUZZ_ASSERT(rec.total_bytes <= max_record, "record of {} bytes, limit {}", rec.total_bytes, max_record);
    RLPT_FUZZ_ASSERT((rec.elem_begin + rec.elem_count) * eb <= base.size());
    sync::swap_apply(rec, std::span<std::byte>(base).subspan(static_cast<std::size_t>(rec.elem_begin * eb),
                                                             static_cast<std::size_t>(rec.elem_count * eb)));
    ++records;
  });
  RLPT_FUZZ_ASSERT(records == stats.records);
  RLPT_FUZZ_ASSERT(same(base, now), "base + delta != now");
  return outcome::accepted;
}

} // namespace detail

inline outcome delta(input in) {
  reader r(in);
  const auto mode = r.get<std::uint8_t>();
  if (mode & 2u) return detail::delta_encode_round_trip(mode, r);
  aligned_bytes stream(r.rest());
  if (mode & 1u) detail::resign_delta_stream(stream.span());
  constexpr std::uint64_t max_target = std::uint64_t{1} << 22; // bytes of a target range we allocate
  try {
    sync::for_each_delta_record(stream.span(), "fuzz", [&](sync::delta_record& rec) {
      RLPT_FUZZ_ASSERT(rec.changed <= rec.elem_count && rec.elem_count >= 1);
      RLPT_FUZZ_ASSERT(rec.total_bytes >= sync::delta_header_bytes && rec.total_bytes % 8 == 0);
      const std::uint64_t range = rec.elem_count * rec.elem_bytes;
      if (range > max_target) return;
      // A target of distinct bytes, and the record's own bytes, to compare after two swaps.
      std::vector<std::byte> target(static_cast<std::size_t>(range));
      for (std::size_t i = 0; i < target.size(); ++i) target[i] = static_cast<std::byte>(i * 131 + 7);
      const std::vector<std::byte> before = target;
      const std::byte* rec_bytes = rec.values;
      const std::size_t values_bytes = static_cast<std::size_t>(
          (rec.encoding == sync::delta_encoding::dense ? rec.elem_count : rec.changed) * rec.elem_bytes);
      const std::vector<std::byte> values(rec_bytes, rec_bytes + values_bytes);
      sync::swap_apply(rec, target);
      std::uint64_t differ = 0;
      for (std::size_t i = 0; i < target.size(); i += rec.elem_bytes)
        differ += std::memcmp(&target[i], &before[i], rec.elem_bytes) != 0;
      RLPT_FUZZ_ASSERT(differ <= (rec.encoding == sync::delta_encoding::dense ? rec.elem_count : rec.changed));
      sync::swap_apply(rec, target);
      RLPT_FUZZ_ASSERT(same(target, before), "applying a record twice did not restore the target");
      RLPT_FUZZ_ASSERT(same(values, std::span<const std::byte>(rec.values, values_bytes)),
                       "applying a record twice did not restore the record");
    });
  } catch (const rlpt::error&) {
    return outcome::rejected;
  }
  return outcome::accepted;
}

} // namespace rlpt::fuzz
