// SPDX-License-Identifier: Apache-2.0
// Fuzz target: manifest JSON (what BEGIN frames and rlpt safetensors files carry). The bytes go
// through the strict JSON reader and manifest::from_json. An accepted manifest must have a
// consistent bucket table (every piece inside its bucket, pieces tiling each tensor) and
// survive to_json -> from_json unchanged. Any JSON the reader accepts must also re-parse from
// its compact rewrite to the same document.
#pragma once

#include "fuzz.hpp"

#include <rlpt/sync/manifest.hpp>

#include <string>
#include <string_view>
#include <vector>

namespace rlpt::fuzz {

inline outcome manifest(input in) {
  const std::string_view text(reinterpret_cast<const char*>(in.data()), in.size());

  // The JSON reader on its own: what it accepts re-parses from its rewrite to the same bytes.
  try {
    const sync::detail::json j = sync::detail::parse_json(text, "fuzz");
    const std::string once = sync::detail::to_json_string(j);
    const std::string twice = sync::detail::to_json_string(sync::detail::parse_json(once, "fuzz rewrite"));
    RLPT_FUZZ_ASSERT(once == twice, "{} vs {}", once, twice);
  } catch (const rlpt::error&) {}

  sync::manifest m;
  try {
    m = sync::manifest::from_json(text);
  } catch (const rlpt::error&) {
    return outcome::rejected;
  }

  // The bucket table: pieces inside their buckets, in offset order, tiling each tensor.
  std::vector<std::uint64_t> covered(m.size(), 0);
  std::uint64_t payload = 0;
  for (std::uint64_t b = 0; b < m.bucket_count(); ++b) {
    const auto pieces = m.pieces(b);
    RLPT_FUZZ_ASSERT(!pieces.empty(), "bucket {} is empty", b);
    std::uint64_t end = 0;
    for (const sync::piece& p : pieces) {
      RLPT_FUZZ_ASSERT(p.tensor < m.size());
      RLPT_FUZZ_ASSERT(p.bucket_offset >= end, "bucket {}: pieces overlap", b);
      end = p.bucket_offset + p.nbytes;
      RLPT_FUZZ_ASSERT(end <= m.bucket_size(b) && m.bucket_size(b) <= m.bucket_bytes(), "bucket {}", b);
      RLPT_FUZZ_ASSERT(p.tensor_offset + p.nbytes <= m[p.tensor].nbytes);
      covered[p.tensor] += p.nbytes;
    }
    RLPT_FUZZ_ASSERT(m.bucket_packed_offset(b) + m.bucket_size(b) <= m.packed_bytes());
  }
  for (std::size_t i = 0; i < m.size(); ++i) {
    RLPT_FUZZ_ASSERT(covered[i] == m[i].nbytes, "tensor {}: pieces cover {} of {} bytes", i, covered[i], m[i].nbytes);
    RLPT_FUZZ_ASSERT(m.find(m[i].name) == i);
    RLPT_FUZZ_ASSERT(m.packed_offset(i) + m[i].nbytes <= m.packed_bytes());
    payload += m[i].nbytes;
  }
  RLPT_FUZZ_ASSERT(payload == m.payload_bytes());

  // Round trip.
  const std::string json = m.to_json();
  const sync::manifest m2 = sync::manifest::from_json(json);
  RLPT_FUZZ_ASSERT(m2.to_json() == json);
  RLPT_FUZZ_ASSERT(m2.same_layout(m) && m2.version() == m.version() && m2.base_version() == m.base_version());
  for (std::size_t i = 0; i < m.size(); ++i) RLPT_FUZZ_ASSERT(m2[i].checksum == m[i].checksum);
  return outcome::accepted;
}

} // namespace rlpt::fuzz
