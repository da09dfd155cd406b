// SPDX-License-Identifier: Apache-2.0
//! @file
//! Host side of the NCCL transport's bootstrap: the messages that carry a communicator's
//! unique id from the sender (root) to every receiver over their host links, and the
//! receivers' answers. No NCCL types here (the id is 128 opaque bytes), so the format is
//! tested and fuzzed without a GPU.
//!
//!   INIT  sender -> receiver: u32 magic "RLNB", u8 1, 3 zero bytes, u64 epoch, u32 ranks,
//!         u32 rank (the receiver's), u32 root, u32 0, 128-byte ncclUniqueId, u64 XXH3-64 of
//!         everything before it
//!   JOIN  receiver -> sender: u32 magic, u8 2, 3 zero bytes, u64 epoch, u32 rank, i32 pid,
//!         u64 XXH3-64
//!
//! `epoch` counts communicators: after an abort the sender bootstraps a new one with the next
//! epoch, and a receiver drops whatever communicator it had.
#pragma once

#include <rlpt/config.hpp>
#include <rlpt/core/error.hpp>
#include <rlpt/sync/checksum.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string_view>
#include <vector>

RLPT_NAMESPACE_BEGIN
namespace sync {

inline constexpr std::uint32_t nccl_boot_magic = 0x424e4c52u; // "RLNB"
inline constexpr std::size_t nccl_unique_id_bytes = 128;      // sizeof(ncclUniqueId)
inline constexpr std::size_t nccl_init_bytes = 8 + 8 + 16 + nccl_unique_id_bytes + 8;
inline constexpr std::size_t nccl_join_bytes = 8 + 8 + 8 + 8;

struct nccl_init_msg {
  std::uint64_t epoch = 0;
  std::uint32_t ranks = 0;
  std::uint32_t rank = 0;
  std::uint32_t root = 0;
  std::array<unsigned char, nccl_unique_id_bytes> id{};
};

struct nccl_join_msg {
  std::uint64_t epoch = 0;
  std::uint32_t rank = 0;
  std::int32_t pid = 0;
};

//! 1 for INIT, 2 for JOIN, 0 for anything else (a protocol frame).
[[nodiscard]] inline int nccl_boot_kind(std::span<const std::byte> meta) noexcept {
  if (meta.size() < 8) return 0;
  std::uint32_t magic;
  std::uint8_t kind;
  std::memcpy(&magic, meta.data(), 4);
  std::memcpy(&kind, meta.data() + 4, 1);
  return magic == nccl_boot_magic && (kind == 1 || kind == 2) ? kind : 0;
}

[[nodiscard]] inline std::vector<std::byte> encode_nccl_init(const nccl_init_msg& m) {
  std::vector<std::byte> out(nccl_init_bytes, std::byte{0});
  std::byte* p = out.data();
  const std::uint32_t magic = nccl_boot_magic;
  const std::uint8_t kind = 1;
  std::memcpy(p, &magic, 4);
  std::memcpy(p + 4, &kind, 1);
  std::memcpy(p + 8, &m.epoch, 8);
  std::memcpy(p + 16, &m.ranks, 4);
  std::memcpy(p + 20, &m.rank, 4);
  std::memcpy(p + 24, &m.root, 4);
  std::memcpy(p + 32, m.id.data(), nccl_unique_id_bytes);
  const std::uint64_t c = xxh3(p, nccl_init_bytes - 8);
  std::memcpy(p + nccl_init_bytes - 8, &c, 8);
  return out;
}

[[nodiscard]] inline std::vector<std::byte> encode_nccl_join(const nccl_join_msg& m) {
  std::vector<std::byte> out(nccl_join_bytes, std::byte{0});
  std::byte* p = out.data();
  const std::uint32_t magic = nccl_boot_magic;
  const std::uint8_t kind = 2;
  std::memcpy(p, &magic, 4);
  std::memcpy(p + 4, &kind, 1);
  std::memcpy(p + 8, &m.epoch, 8);
  std::memcpy(p + 16, &m.rank, 4);
  std::memcpy(p + 20, &m.pid, 4);
  const std::uint64_t c = xxh3(p, nccl_join_bytes - 8);
  std::memcpy(p + nccl_join_bytes - 8, &c, 8);
  return out;
}

namespace detail {
inline void check_boot(std::span<const std::byte> meta, std::size_t want, std::uint8_t kind, std::string_view what,
                       std::string_view where) {
  RLPT_CHECK(meta.size() == want, errors::sync::wire, "{}: NCCL {} message has {} bytes, expected {}", where, what,
             meta.size(), want);
  std::uint32_t magic;
  std::uint8_t k, z[3];
  std::uint64_t c;
  std::memcpy(&magic, meta.data(), 4);
  std::memcpy(&k, meta.data() + 4, 1);
  std::memcpy(z, meta.data() + 5, 3);
  std::memcpy(&c, meta.data() + want - 8, 8);
  RLPT_CHECK(magic == nccl_boot_magic && k == kind && z[0] == 0 && z[1] == 0 && z[2] == 0, errors::sync::wire,
             "{}: not an NCCL {} message", where, what);
  RLPT_CHECK(xxh3(meta.data(), want - 8) == c, errors::sync::wire, "{}: NCCL {} message fails its checksum", where,
             what);
}
} // namespace detail

[[nodiscard]] inline nccl_init_msg decode_nccl_init(std::span<const std::byte> meta, std::string_view where) {
  detail::check_boot(meta, nccl_init_bytes, 1, "INIT", where);
  nccl_init_msg m;
  std::uint32_t zero;
  std::memcpy(&m.epoch, meta.data() + 8, 8);
  std::memcpy(&m.ranks, meta.data() + 16, 4);
  std::memcpy(&m.rank, meta.data() + 20, 4);
  std::memcpy(&m.root, meta.data() + 24, 4);
  std::memcpy(&zero, meta.data() + 28, 4);
  std::memcpy(m.id.data(), meta.data() + 32, nccl_unique_id_bytes);
  RLPT_CHECK(zero == 0 && m.ranks >= 2 && m.rank < m.ranks && m.root < m.ranks && m.rank != m.root, errors::sync::wire,
             "{}: NCCL INIT names rank {} and root {} of {} ranks", where, m.rank, m.root, m.ranks);
  return m;
}

[[nodiscard]] inline nccl_join_msg decode_nccl_join(std::span<const std::byte> meta, std::string_view where) {
  detail::check_boot(meta, nccl_join_bytes, 2, "JOIN", where);
  nccl_join_msg m;
  std::memcpy(&m.epoch, meta.data() + 8, 8);
  std::memcpy(&m.rank, meta.data() + 16, 4);
  std::memcpy(&m.pid, meta.data() + 20, 4);
  return m;
}

} // namespace sync
RLPT_NAMESPACE_END
