// SPDX-License-Identifier: Apache-2.0
//! @file
//! Protocol frames: the meta block of every message the sender and receiver exchange.
//!
//! A frame is a 72-byte little-endian header plus a body; the header's last field is XXH3-64
//! of the first 64 header bytes and the body, so a damaged meta block is always detected.
//! Every frame of one update attempt carries the attempt's random `tag` and replies echo it,
//! so nothing from an earlier, failed attempt at the same version is ever taken for current.
//! Payload bytes are covered per message type: BUCKET bodies list the XXH3-64 of every tensor
//! piece in the bucket, DELTA bodies the XXH3-64 of the payload.
//!
//!   type    version  base      index        count            body                    payload
//!   (every frame also carries the attempt tag; the receiver ignores frames of other attempts)
//!   BEGIN   v        base      kind         layout hash      manifest JSON           -
//!   READY   rx ver   -         has_version  layout hash      -                       -
//!   REFUSE  v        -         reason       held digest (1)  "<id>\n<message>"       -
//!   BUCKET  v        -         bucket       pieces           u64 piece checksums     bucket bytes
//!   DELTA   v        -         chunk        records          u64 payload checksum    delta records
//!   COMMIT  v        base      -            messages sent    u64 tensor checksums    -
//!   ACK     v        -         -            -                -                       -
//!   NACK    v        -         -            -                "<id>\n<message>"       -
//!   ABORT   v        -         -            -                reason text             -
//!   (1) stale_version when the receiver holds exactly version v: model_digest() of it, so that
//!       a sender retrying after a lost ACK recognises its own commit; otherwise 0.
#pragma once

#include <rlpt/config.hpp>
#include <rlpt/core/error.hpp>
#include <rlpt/sync/checksum.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <vector>

RLPT_NAMESPACE_BEGIN
namespace sync {

enum class frame_type : std::uint16_t { begin = 1, ready, refuse, bucket, delta, commit, ack, nack, abort };

[[nodiscard]] constexpr std::string_view name(frame_type t) noexcept {
  switch (t) {
  case frame_type::begin:
    return "BEGIN";
  case frame_type::ready:
    return "READY";
  case frame_type::refuse:
    return "REFUSE";
  case frame_type::bucket:
    return "BUCKET";
  case frame_type::delta:
    return "DELTA";
  case frame_type::commit:
    return "COMMIT";
  case frame_type::ack:
    return "ACK";
  case frame_type::nack:
    return "NACK";
  case frame_type::abort:
    return "ABORT";
  }
  return "?";
}

//! Update kinds carried by BEGIN.index.
enum class update_kind : std::uint64_t { dense = 0, delta = 1 };

//! Why a receiver refused a BEGIN (REFUSE.index). base_mismatch asks for a dense update.
enum class refusal : std::uint64_t {
  base_mismatch = 1,
  layout_mismatch = 2,
  stale_version = 3,
  bad_manifest = 4,
  too_large = 5
};

inline constexpr std::uint32_t frame_magic = 0x46534c52u; // "RLSF"
//! What a preflight message starts with (preflight.hpp): named here so that the protocol can
//! say so when one arrives in its place.
inline constexpr std::uint32_t preflight_magic = 0x46504c52u; // "RLPF"
inline constexpr std::uint16_t frame_protocol = 1;
inline constexpr std::size_t frame_header_bytes = 72;

namespace detail {
// Byte offsets of the header fields peek_frame reads (encode_frame writes every field).
inline constexpr std::size_t frame_type_at = 6, frame_version_at = 8, frame_index_at = 24, frame_payload_at = 56;
} // namespace detail

struct frame {
  frame_type type = frame_type::begin;
  std::uint64_t version = 0;
  std::uint64_t base_version = 0;
  std::uint64_t index = 0;
  std::uint64_t count = 0;
  std::uint64_t tag = 0; //!< update attempt id (replies echo it)
  std::uint64_t payload_bytes = 0;
  std::span<const std::byte> body; //!< view into the decoded meta block
};

//! Encodes a frame (header + body) into `out`, replacing its contents.
RLPT_DEFER void encode_frame(std::vector<std::byte>& out, frame_type type, std::uint64_t tag, std::uint64_t version,
                             std::uint64_t base_version, std::uint64_t index, std::uint64_t count,
                             std::uint64_t payload_bytes, std::span<const std::byte> body);

inline std::span<const std::byte> as_bytes(std::string_view s) noexcept {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}
inline std::string_view as_chars(std::span<const std::byte> b) noexcept {
  return {reinterpret_cast<const char*>(b.data()), b.size()};
}

//! Decodes and verifies a meta block; `where` names the link in errors (rlpt.sync.wire).
RLPT_DEFER [[nodiscard]] frame decode_frame(std::span<const std::byte> meta, std::string_view where);

//! A meta block's header fields read without verifying it (decode_frame verifies): what a
//! device link needs to size and name the payload that follows before the protocol decodes the
//! frame. All zero when the block is shorter than a header.
struct frame_peek {
  std::uint16_t type = 0;
  std::uint64_t version = 0;
  std::uint64_t index = 0;
  std::uint64_t payload_bytes = 0;
};
RLPT_DEFER [[nodiscard]] frame_peek peek_frame(std::span<const std::byte> meta) noexcept;

//! How errors name the payload a meta block announces: "bucket I of version V", "delta chunk I
//! of version V", "a payload of version V", or "a payload" for a block shorter than a header.
RLPT_DEFER [[nodiscard]] std::string payload_label(std::span<const std::byte> meta);

} // namespace sync
RLPT_NAMESPACE_END

#if RLPT_HEADER_IMPL()
RLPT_NAMESPACE_BEGIN
namespace sync {

RLPT_DEFER RLPT_INLINE void encode_frame(std::vector<std::byte>& out, frame_type type, std::uint64_t tag,
                                         std::uint64_t version, std::uint64_t base_version, std::uint64_t index,
                                         std::uint64_t count, std::uint64_t payload_bytes,
                                         std::span<const std::byte> body) {
  out.resize(frame_header_bytes + body.size());
  std::byte* p = out.data();
  const auto put32 = [&](std::size_t at, std::uint32_t v) { std::memcpy(p + at, &v, 4); };
  const auto put16 = [&](std::size_t at, std::uint16_t v) { std::memcpy(p + at, &v, 2); };
  const auto put64 = [&](std::size_t at, std::uint64_t v) { std::memcpy(p + at, &v, 8); };
  put32(0, frame_magic);
  put16(4, frame_protocol);
  put16(detail::frame_type_at, static_cast<std::uint16_t>(type));
  put64(detail::frame_version_at, version);
  put64(16, base_version);
  put64(detail::frame_index_at, index);
  put64(32, count);
  put64(40, tag);
  put64(48, body.size());
  put64(detail::frame_payload_at, payload_bytes);
  if (!body.empty()) std::memcpy(p + frame_header_bytes, body.data(), body.size());
  xxh3_stream h;
  h.update(p, 64);
  h.update(p + frame_header_bytes, body.size());
  put64(64, h.digest());
}

RLPT_DEFER RLPT_INLINE frame decode_frame(std::span<const std::byte> meta, std::string_view where) {
  RLPT_CHECK(meta.size() >= frame_header_bytes, errors::sync::wire,
             "{}: frame of {} bytes is shorter than the {}-byte header", where, meta.size(), frame_header_bytes);
  const std::byte* p = meta.data();
  std::uint32_t magic;
  std::uint16_t proto, type;
  std::uint64_t v[8];
  std::memcpy(&magic, p, 4);
  std::memcpy(&proto, p + 4, 2);
  std::memcpy(&type, p + 6, 2);
  std::memcpy(v, p + 8, 64);
  RLPT_CHECK(magic != preflight_magic, errors::sync::wire,
             "{}: the peer sent its preflight, but this end started the update protocol: both ends call "
             "sync::preflight before the sender and receiver start, or neither does",
             where);
  RLPT_CHECK(magic == frame_magic, errors::sync::wire, "{}: bad frame magic 0x{:08x} (expected 0x{:08x})", where, magic,
             frame_magic);
  RLPT_CHECK(proto == frame_protocol, errors::sync::wire, "{}: frame protocol {} is not the supported {}", where, proto,
             frame_protocol);
  RLPT_CHECK(type >= 1 && type <= 9, errors::sync::wire, "{}: unknown frame type {}", where, type);
  RLPT_CHECK(v[5] == meta.size() - frame_header_bytes, errors::sync::wire,
             "{}: frame header says {} body bytes but the message has {}", where, v[5],
             meta.size() - frame_header_bytes);
  xxh3_stream h;
  h.update(p, 64);
  h.update(p + frame_header_bytes, meta.size() - frame_header_bytes);
  RLPT_CHECK(h.digest() == v[7], errors::sync::wire, "{}: {} frame checksum {} does not match its contents ({})", where,
             name(static_cast<frame_type>(type)), to_hex(v[7]), to_hex(h.digest()));
  frame f;
  f.type = static_cast<frame_type>(type);
  f.version = v[0];
  f.base_version = v[1];
  f.index = v[2];
  f.count = v[3];
  f.tag = v[4];
  f.payload_bytes = v[6];
  f.body = meta.subspan(frame_header_bytes);
  return f;
}

RLPT_DEFER RLPT_INLINE frame_peek peek_frame(std::span<const std::byte> meta) noexcept {
  frame_peek f;
  if (meta.size() < frame_header_bytes) return f;
  std::memcpy(&f.type, meta.data() + detail::frame_type_at, 2);
  std::memcpy(&f.version, meta.data() + detail::frame_version_at, 8);
  std::memcpy(&f.index, meta.data() + detail::frame_index_at, 8);
  std::memcpy(&f.payload_bytes, meta.data() + detail::frame_payload_at, 8);
  return f;
}

RLPT_DEFER RLPT_INLINE std::string payload_label(std::span<const std::byte> meta) {
  if (meta.size() < frame_header_bytes) return "a payload";
  const frame_peek f = peek_frame(meta);
  if (f.type == static_cast<std::uint16_t>(frame_type::bucket))
    return rlpt::detail::format("bucket {} of version {}", f.index, f.version);
  if (f.type == static_cast<std::uint16_t>(frame_type::delta))
    return rlpt::detail::format("delta chunk {} of version {}", f.index, f.version);
  return rlpt::detail::format("a payload of version {}", f.version);
}

} // namespace sync
RLPT_NAMESPACE_END
#endif // RLPT_HEADER_IMPL()
