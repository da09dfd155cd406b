// SPDX-License-Identifier: Apache-2.0
//! @file
//! Host side of the CUDA IPC transport: the messages exporter and importer exchange over their
//! host channel, and the importer's mapping cache. No CUDA here, so all of it is tested on
//! machines without a GPU.
//!
//! Every host message of the transport is an envelope: 32-byte header (u32 magic "RLIE", u8
//! kind, 3 zero bytes, u32 slot, u32 0, u64 payload bytes, u64 XXH3-64 of the first 24 header
//! bytes and the body) plus a body:
//!
//!   kind      direction            slot   body
//!   HELLO     exporter -> importer  -      ipc_hello (the exported buffer; a VMM export also
//!                                          carries its POSIX fd as SCM_RIGHTS ancillary data)
//!   ATTACHED  importer -> exporter  -      u8 ok + error text (mapped, or why not)
//!   MSG       exporter -> importer  slot   a protocol frame; its payload lies in `slot`
//!   REPLY     importer -> exporter  -      a protocol frame (READY, ACK, NACK, ...)
//!   RELEASE   importer -> exporter  slot   - (the importer's device work on the slot finished)
//!   BYE       either way            -      reason text (explicit release: unmap now)
//!
//! The importer maps the exported buffer once per export session and keeps the mapping keyed
//! by the exporter's GPU UUID: later HELLOs of the same session cost nothing, a new session
//! (the exporter restarted) replaces it, release_all() unmaps everything.
#pragma once

#include <rlpt/config.hpp>
#include <rlpt/core/error.hpp>
#include <rlpt/sync/checksum.hpp>

#include <fmt/core.h>

#include <unistd.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

RLPT_NAMESPACE_BEGIN
namespace sync {

enum class ipc_kind : std::uint8_t { hello = 1, attached, msg, reply, release, bye };

[[nodiscard]] constexpr std::string_view name(ipc_kind k) noexcept {
  switch (k) {
  case ipc_kind::hello:
    return "HELLO";
  case ipc_kind::attached:
    return "ATTACHED";
  case ipc_kind::msg:
    return "MSG";
  case ipc_kind::reply:
    return "REPLY";
  case ipc_kind::release:
    return "RELEASE";
  case ipc_kind::bye:
    return "BYE";
  }
  return "?";
}

//! How the exported buffer is shared.
enum class ipc_handle_kind : std::uint32_t {
  legacy = 1,  //!< cudaIpcGetMemHandle (cudaMalloc memory)
  posix_fd = 2 //!< cuMemExportToShareableHandle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR (VMM memory)
};

inline constexpr std::uint32_t ipc_envelope_magic = 0x45494c52u; // "RLIE"
inline constexpr std::size_t ipc_envelope_header = 32;
inline constexpr std::uint32_t ipc_no_slot = 0xffffffffu;
inline constexpr std::uint32_t ipc_max_slots = 1024;

struct ipc_envelope {
  ipc_kind kind = ipc_kind::msg;
  std::uint32_t slot = ipc_no_slot;
  std::uint64_t payload_bytes = 0;
  std::span<const std::byte> body; //!< view into the decoded bytes
};

inline void encode_envelope(std::vector<std::byte>& out, ipc_kind kind, std::uint32_t slot, std::uint64_t payload_bytes,
                            std::span<const std::byte> body) {
  out.assign(ipc_envelope_header + body.size(), std::byte{0});
  std::byte* p = out.data();
  const std::uint32_t magic = ipc_envelope_magic;
  const auto k = static_cast<std::uint8_t>(kind);
  std::memcpy(p, &magic, 4);
  std::memcpy(p + 4, &k, 1);
  std::memcpy(p + 8, &slot, 4);
  std::memcpy(p + 16, &payload_bytes, 8);
  if (!body.empty()) std::memcpy(p + ipc_envelope_header, body.data(), body.size());
  xxh3_stream h;
  h.update(p, 24);
  h.update(p + ipc_envelope_header, body.size());
  const std::uint64_t c = h.digest();
  std::memcpy(p + 24, &c, 8);
}

//! True when `meta` starts like an envelope (the transport's own messages vs anything else).
[[nodiscard]] inline bool is_envelope(std::span<const std::byte> meta) noexcept {
  std::uint32_t magic = 0;
  if (meta.size() >= 4) std::memcpy(&magic, meta.data(), 4);
  return magic == ipc_envelope_magic;
}

[[nodiscard]] inline ipc_envelope decode_envelope(std::span<const std::byte> meta, std::string_view where) {
  RLPT_CHECK(meta.size() >= ipc_envelope_header, errors::sync::wire,
             "{}: IPC message of {} bytes is shorter than its {}-byte header", where, meta.size(), ipc_envelope_header);
  const std::byte* p = meta.data();
  std::uint32_t magic, slot;
  std::uint8_t kind, z[3];
  std::uint64_t payload, check;
  std::memcpy(&magic, p, 4);
  std::memcpy(&kind, p + 4, 1);
  std::memcpy(z, p + 5, 3);
  std::memcpy(&slot, p + 8, 4);
  std::memcpy(&payload, p + 16, 8);
  std::memcpy(&check, p + 24, 8);
  RLPT_CHECK(magic == ipc_envelope_magic, errors::sync::wire, "{}: bad IPC message magic 0x{:08x}", where, magic);
  xxh3_stream h;
  h.update(p, 24);
  h.update(p + ipc_envelope_header, meta.size() - ipc_envelope_header);
  RLPT_CHECK(h.digest() == check, errors::sync::wire, "{}: IPC message checksum {} does not match its contents ({})",
             where, to_hex(check), to_hex(h.digest()));
  RLPT_CHECK(kind >= 1 && kind <= 6 && z[0] == 0 && z[1] == 0 && z[2] == 0, errors::sync::wire,
             "{}: unknown IPC message kind {}", where, kind);
  ipc_envelope e;
  e.kind = static_cast<ipc_kind>(kind);
  e.slot = slot;
  e.payload_bytes = payload;
  e.body = meta.subspan(ipc_envelope_header);
  return e;
}

//! What an exporter announces: where its slots lie and how to map them.
struct ipc_hello {
  std::uint64_t session = 0; //!< random per export: a new value means a new buffer
  std::int32_t pid = 0;      //!< the exporter's process id
  ipc_handle_kind kind = ipc_handle_kind::legacy;
  std::array<unsigned char, 16> gpu_uuid{}; //!< the exporting GPU (cudaDeviceProp::uuid)
  std::array<unsigned char, 64> legacy{};   //!< cudaIpcMemHandle_t (legacy only)
  std::uint64_t map_bytes = 0;              //!< bytes to map (the whole exported allocation)
  std::uint64_t offset = 0;                 //!< where slot 0 starts in the mapping
  std::uint32_t slots = 0;
  std::uint32_t fds = 0;         //!< descriptors sent with the message (1 for posix_fd)
  std::uint64_t slot_bytes = 0;  //!< payload capacity of a slot
  std::uint64_t slot_stride = 0; //!< distance between slots
};

inline constexpr std::size_t ipc_hello_bytes = 8 + 4 + 4 + 16 + 64 + 8 + 8 + 4 + 4 + 8 + 8;

[[nodiscard]] inline std::vector<std::byte> encode_hello(const ipc_hello& h) {
  std::vector<std::byte> out(ipc_hello_bytes);
  std::byte* p = out.data();
  const auto kind = static_cast<std::uint32_t>(h.kind);
  std::memcpy(p, &h.session, 8);
  std::memcpy(p + 8, &h.pid, 4);
  std::memcpy(p + 12, &kind, 4);
  std::memcpy(p + 16, h.gpu_uuid.data(), 16);
  std::memcpy(p + 32, h.legacy.data(), 64);
  std::memcpy(p + 96, &h.map_bytes, 8);
  std::memcpy(p + 104, &h.offset, 8);
  std::memcpy(p + 112, &h.slots, 4);
  std::memcpy(p + 116, &h.fds, 4);
  std::memcpy(p + 120, &h.slot_bytes, 8);
  std::memcpy(p + 128, &h.slot_stride, 8);
  return out;
}

[[nodiscard]] inline ipc_hello decode_hello(std::span<const std::byte> body, std::string_view where) {
  RLPT_CHECK(body.size() == ipc_hello_bytes, errors::sync::wire, "{}: HELLO body has {} bytes, expected {}", where,
             body.size(), ipc_hello_bytes);
  const std::byte* p = body.data();
  ipc_hello h;
  std::uint32_t kind;
  std::memcpy(&h.session, p, 8);
  std::memcpy(&h.pid, p + 8, 4);
  std::memcpy(&kind, p + 12, 4);
  std::memcpy(h.gpu_uuid.data(), p + 16, 16);
  std::memcpy(h.legacy.data(), p + 32, 64);
  std::memcpy(&h.map_bytes, p + 96, 8);
  std::memcpy(&h.offset, p + 104, 8);
  std::memcpy(&h.slots, p + 112, 4);
  std::memcpy(&h.fds, p + 116, 4);
  std::memcpy(&h.slot_bytes, p + 120, 8);
  std::memcpy(&h.slot_stride, p + 128, 8);
  RLPT_CHECK(kind == 1 || kind == 2, errors::sync::wire,
             "{}: HELLO names handle kind {}, not legacy (1) or posix_fd (2)", where, kind);
  h.kind = static_cast<ipc_handle_kind>(kind);
  RLPT_CHECK(h.fds == (h.kind == ipc_handle_kind::posix_fd ? 1u : 0u), errors::sync::wire,
             "{}: a {} HELLO must carry {} descriptors, it says {}", where,
             h.kind == ipc_handle_kind::legacy ? "legacy" : "posix_fd", h.kind == ipc_handle_kind::legacy ? 0 : 1,
             h.fds);
  RLPT_CHECK(h.slots >= 1 && h.slots <= ipc_max_slots && h.slot_bytes >= 1 && h.slot_stride >= h.slot_bytes &&
                 h.slot_stride % 256 == 0 && h.offset % 256 == 0,
             errors::sync::wire,
             "{}: HELLO slot geometry is invalid ({} slots of {} bytes every {} bytes from offset {})", where, h.slots,
             h.slot_bytes, h.slot_stride, h.offset);
  std::uint64_t span = 0, end = 0;
  RLPT_CHECK(!__builtin_mul_overflow(std::uint64_t{h.slots}, h.slot_stride, &span) &&
                 !__builtin_add_overflow(span, h.offset, &end) && end <= h.map_bytes,
             errors::sync::wire,
             "{}: HELLO slots end past the {}-byte mapping ({} slots every {} bytes from offset {})", where,
             h.map_bytes, h.slots, h.slot_stride, h.offset);
  return h;
}

[[nodiscard]] inline std::string uuid_text(const std::array<unsigned char, 16>& u) {
  return rlpt::detail::format(
      "GPU-{:02x}{:02x}{:02x}{:02x}-{:02x}{:02x}-{:02x}{:02x}-{:02x}{:02x}-{:02x}{:02x}{:02x}{:02x}{:02x}{:02x}", u[0],
      u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14], u[15]);
}

//! A mapping the importer holds: `base` is where slot 0 starts in this process.
struct ipc_mapping {
  std::uint64_t session = 0;
  std::array<unsigned char, 16> gpu_uuid{};
  ipc_handle_kind kind = ipc_handle_kind::legacy;
  int device = -1;        //!< the local device ordinal of the exporting GPU
  void* mapped = nullptr; //!< start of the whole mapping
  std::uint64_t map_bytes = 0;
  std::byte* base = nullptr; //!< slot 0
};

//! The importer's mappings, one per exporting GPU, opened once per export session.
//! `Opener` provides `ipc_mapping open(const ipc_hello&, int fd)` (which must not close the
//! fd) and `void close(ipc_mapping&) noexcept`; the CUDA opener lives in the IPC transport,
//! tests pass a counting fake.
template <class Opener> class ipc_import_cache {
public:
  explicit ipc_import_cache(Opener opener = {}) : opener_(std::move(opener)) {}
  ipc_import_cache(const ipc_import_cache&) = delete;
  ipc_import_cache& operator=(const ipc_import_cache&) = delete;
  ~ipc_import_cache() { release_all(); }

  //! The mapping for `h`: cached when its GPU's current session is h.session, else opened
  //! (replacing an older session's mapping). `fd` (-1 if none) is closed in every case.
  const ipc_mapping& acquire(const ipc_hello& h, int fd) {
    struct closer {
      int fd;
      ~closer() {
        if (fd >= 0) ::close(fd);
      }
    } c{fd};
    auto it = maps_.find(h.gpu_uuid);
    if (it != maps_.end()) {
      if (it->second.session == h.session && it->second.map_bytes == h.map_bytes && it->second.kind == h.kind) {
        ++hits_;
        return it->second;
      }
      close_one(it->second);
      maps_.erase(it);
    }
    ipc_mapping m = opener_.open(h, fd);
    ++opens_;
    return maps_.emplace(h.gpu_uuid, m).first->second;
  }

  //! Drops the mapping of one GPU (its exporter went away); false if none.
  bool release(const std::array<unsigned char, 16>& uuid) noexcept {
    auto it = maps_.find(uuid);
    if (it == maps_.end()) return false;
    close_one(it->second);
    maps_.erase(it);
    return true;
  }

  //! Explicit release: unmaps everything.
  void release_all() noexcept {
    for (auto& [k, m] : maps_) close_one(m);
    maps_.clear();
  }

  [[nodiscard]] std::size_t size() const noexcept { return maps_.size(); }
  [[nodiscard]] std::uint64_t opens() const noexcept { return opens_; }
  [[nodiscard]] std::uint64_t closes() const noexcept { return closes_; }
  [[nodiscard]] std::uint64_t hits() const noexcept { return hits_; }
  [[nodiscard]] Opener& opener() noexcept { return opener_; }

private:
  void close_one(ipc_mapping& m) noexcept {
    opener_.close(m);
    ++closes_;
  }

  Opener opener_;
  std::map<std::array<unsigned char, 16>, ipc_mapping> maps_;
  std::uint64_t opens_ = 0, closes_ = 0, hits_ = 0;
};

} // namespace sync
RLPT_NAMESPACE_END
