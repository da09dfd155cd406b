// SPDX-License-Identifier: Apache-2.0
// Fuzz target: protocol frames (the meta block of every sync message) and their bodies.
//
// Input: one mode byte, then the meta block. Mode bit 0 set: re-sign: the body-length field
// and the header checksum are recomputed before decoding, so mutations reach the field checks
// and the body decoders behind the checksum. A decoded frame must re-encode to the same bytes;
// its body is then decoded as the receiver and sender do for its type (BEGIN: manifest JSON;
// REFUSE / NACK: "<id>\n<message>"; BUCKET / DELTA / COMMIT: u64 checksums).
#pragma once

#include "fuzz.hpp"
#include "target_manifest.hpp"

#include <rlpt/sync/frame.hpp>
#include <rlpt/sync/manifest.hpp>
#include <rlpt/sync/protocol.hpp>

#include <cstring>
#include <vector>

namespace rlpt::fuzz {

inline outcome frame(input in) {
  reader r(in);
  const auto mode = r.get<std::uint8_t>();
  std::vector<std::byte> meta = to_bytes(r.rest());
  if ((mode & 1u) && meta.size() >= sync::frame_header_bytes) {
    const std::uint64_t body = meta.size() - sync::frame_header_bytes;
    std::memcpy(meta.data() + 48, &body, 8);
    sync::xxh3_stream h;
    h.update(meta.data(), 64);
    h.update(meta.data() + sync::frame_header_bytes, static_cast<std::size_t>(body));
    const std::uint64_t d = h.digest();
    std::memcpy(meta.data() + 64, &d, 8);
  }
  sync::frame f;
  try {
    f = sync::decode_frame(meta, "fuzz");
  } catch (const rlpt::error&) {
    return outcome::rejected;
  }
  RLPT_FUZZ_ASSERT(f.body.data() == meta.data() + sync::frame_header_bytes &&
                   f.body.size() == meta.size() - sync::frame_header_bytes);
  RLPT_FUZZ_ASSERT(!sync::name(f.type).empty() && sync::name(f.type) != "?", "type {}", static_cast<int>(f.type));
  std::vector<std::byte> again;
  sync::encode_frame(again, f.type, f.tag, f.version, f.base_version, f.index, f.count, f.payload_bytes, f.body);
  RLPT_FUZZ_ASSERT(same(again, meta), "decode -> encode changed the frame");

  // Bodies, as the two ends read them.
  switch (f.type) {
  case sync::frame_type::begin: // the receiver's manifest parse, with the manifest target's checks
    static_cast<void>(manifest(input(reinterpret_cast<const std::uint8_t*>(f.body.data()), f.body.size())));
    break;
  case sync::frame_type::refuse:
  case sync::frame_type::nack: {
    const auto [id, msg] = sync::detail::split_error_body(f.body);
    const std::string_view body = sync::as_chars(f.body);
    if (body.find('\n') == std::string_view::npos)
      RLPT_FUZZ_ASSERT(id == errors::sync::remote.str() && msg == body);
    else
      RLPT_FUZZ_ASSERT(id + "\n" + msg == body && id.find('\n') == std::string::npos);
    break;
  }
  case sync::frame_type::bucket:
  case sync::frame_type::delta:
  case sync::frame_type::commit:
    if (f.body.size() % 8 == 0)
      for (std::size_t i = 0; i < f.body.size() / 8; ++i) static_cast<void>(sync::detail::body_u64(f.body, i));
    break;
  default:
    break;
  }
  return outcome::accepted;
}

} // namespace rlpt::fuzz
