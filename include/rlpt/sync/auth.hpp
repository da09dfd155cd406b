// SPDX-License-Identifier: Apache-2.0
//! @file
//! Peer authentication for cross-machine links: what a link asks of the cryptography, the
//! handshake that proves both ends hold the job's secret, and the per-frame tags.
//!
//! This header has no dependency: the primitives come from an `authenticator`, which
//! <rlpt/sync/auth_openssl.hpp> implements over OpenSSL (CMake component `auth`). A link
//! given one runs, on every new connection and before a byte of weights:
//!
//!   connector -> acceptor   HELLO  "RLTH" u16 version, u8 integrity, u8 role, 32-byte nonce_c
//!   acceptor  -> connector  HELLO  (same, nonce_a) + proof_a = MAC_s("acceptor"  | hello_c | hello_a)
//!   connector -> acceptor   proof_c = MAC_s("connector" | hello_c | hello_a)
//!
//! MAC_s is HMAC-SHA-256 under the job secret. Each proof covers the other end's fresh nonce,
//! so a recorded handshake replayed later fails; each end checks the other's proof before it
//! trusts the connection (the connector before it sends its own). Both ends then derive the
//! session key K = MAC_s("session" | hello_c | hello_a), and every frame carries a 16-byte
//! AES-256-GMAC tag under K whose nonce is the frame's direction and sequence number: a frame
//! altered, dropped, reordered, replayed or reflected in flight fails its tag. The tag covers
//! the frame header and meta block (manifest, piece checksums, commit) always, and the payload
//! too under integrity::full.
#pragma once

#include <rlpt/config.hpp>
#include <rlpt/core/error.hpp>
#include <rlpt/sync/link.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <string_view>

RLPT_NAMESPACE_BEGIN
namespace sync {

//! What an authenticated link's frame tags cover.
enum class integrity : std::uint8_t {
  //! Frame headers and meta blocks: manifests, the per-piece checksums of every bucket and
  //! commits cannot be forged or replayed. Payload bytes are checked against those MACed
  //! XXH3-64 checksums, which catch accidents but not an adversary who can find collisions.
  control = 1,
  //! Every byte, payload included: a weight byte changed in flight is refused.
  full = 2,
};

[[nodiscard]] constexpr std::string_view name(integrity i) noexcept {
  return i == integrity::control ? "control" : i == integrity::full ? "full" : "?";
}

using byte_parts = std::initializer_list<std::span<const std::byte>>;

//! The cryptography of an authenticated link. Implementations must be thread-safe for const
//! calls (one authenticator serves all links of a process).
class authenticator {
public:
  static constexpr std::size_t mac_bytes = 32; //!< handshake MAC (HMAC-SHA-256)
  static constexpr std::size_t tag_bytes = 16; //!< frame tag (AES-256-GMAC)
  using mac = std::array<std::byte, mac_bytes>;
  using tag = std::array<std::byte, tag_bytes>;

  virtual ~authenticator() = default;
  //! Cryptographically random bytes (handshake nonces).
  virtual void random(std::span<std::byte> out) const = 0;
  //! A MAC under the job secret of the concatenation of `parts`.
  [[nodiscard]] virtual mac secret_mac(byte_parts parts) const = 0;
  //! A tag under `key` of the concatenation of `parts`; `nonce` must never repeat for a key.
  [[nodiscard]] virtual tag frame_tag(const mac& key, std::uint64_t nonce, byte_parts parts) const = 0;
  //! Names the primitives and their library, for logs and docs.
  [[nodiscard]] virtual std::string describe() const = 0;
};

//! What an authenticated link counts (read them with the link's auth_counters()).
struct auth_counters {
  std::uint64_t handshakes = 0;            //!< connections that authenticated
  std::uint64_t refused_peers = 0;         //!< connections refused: wrong secret, replay, mismatch, silence
  std::uint64_t refused_frames = 0;        //!< frames whose tag failed (the connection was dropped)
  std::string last_refusal;                //!< why the last connection or frame was refused
  std::deque<std::string> recent_refusals; //!< why, for the last (up to) 16 refusals, oldest first

  //! Records a refusal's reason.
  void refused(std::string why) {
    if (recent_refusals.size() == 16) recent_refusals.pop_front();
    recent_refusals.push_back(why);
    last_refusal = std::move(why);
  }
};

namespace detail {

inline constexpr std::uint32_t hello_magic = 0x48544c52u; // "RLTH"
inline constexpr std::uint16_t hello_version = 1;
inline constexpr std::size_t hello_bytes = 40;

//! The handshake and frame tags of one connection (one per link; reset on each connection).
template <class = void> class basic_peer_auth {
public:
  basic_peer_auth(std::shared_ptr<const authenticator> a, integrity i, role r)
      : a_(std::move(a)), integrity_(i), role_(r) {}

  [[nodiscard]] bool enabled() const noexcept { return a_ != nullptr; }
  [[nodiscard]] integrity mode() const noexcept { return integrity_; }

  //! Our HELLO, with a fresh nonce.
  std::array<std::byte, hello_bytes> hello() {
    std::array<std::byte, hello_bytes> h{};
    const std::uint32_t magic = hello_magic;
    const std::uint16_t version = hello_version;
    std::memcpy(h.data(), &magic, 4);
    std::memcpy(h.data() + 4, &version, 2);
    h[6] = static_cast<std::byte>(integrity_);
    h[7] = static_cast<std::byte>(role_);
    a_->random(std::span<std::byte>(h).subspan(8));
    return h; // the current connection's state is untouched until establish()
  }

  //! Checks the peer's HELLO; a description of what is wrong, or empty.
  [[nodiscard]] std::string check_hello(std::span<const std::byte, hello_bytes> h) const;

  //! The proof that an end (`acceptor` or not) knows the secret, over both HELLOs.
  [[nodiscard]] authenticator::mac proof(bool acceptor, std::span<const std::byte> hello_c,
                                         std::span<const std::byte> hello_a) const {
    return a_->secret_mac({label(acceptor ? "rlpt tcp v1 acceptor" : "rlpt tcp v1 connector"), hello_c, hello_a});
  }

  //! After both proofs checked: derives the session key; `acceptor` is this end's side.
  void establish(bool acceptor, std::span<const std::byte> hello_c, std::span<const std::byte> hello_a) {
    key_ = a_->secret_mac({label("rlpt tcp v1 session"), hello_c, hello_a});
    acceptor_ = acceptor;
    tx_seq_ = rx_seq_ = 0;
  }

  //! The tag of the next frame this end sends.
  [[nodiscard]] authenticator::tag seal(std::span<const std::byte> header, std::span<const std::byte> meta,
                                        std::span<const std::byte> payload) {
    return tag_of(nonce(acceptor_, tx_seq_++), header, meta, payload);
  }

  //! Whether the next received frame carries the right tag (consumes its sequence number).
  [[nodiscard]] bool open(std::span<const std::byte> header, std::span<const std::byte> meta,
                          std::span<const std::byte> payload, std::span<const std::byte, authenticator::tag_bytes> t) {
    const authenticator::tag want = tag_of(nonce(!acceptor_, rx_seq_++), header, meta, payload);
    return constant_time_equal(want, t);
  }

  [[nodiscard]] static bool constant_time_equal(std::span<const std::byte> a, std::span<const std::byte> b) noexcept {
    if (a.size() != b.size()) return false;
    unsigned char d = 0;
    for (std::size_t i = 0; i < a.size(); ++i) d |= static_cast<unsigned char>(a[i] ^ b[i]);
    return d == 0;
  }

private:
  static std::span<const std::byte> label(std::string_view s) noexcept {
    return {reinterpret_cast<const std::byte*>(s.data()), s.size() + 1}; // with its NUL: labels stay prefix-free
  }
  // The direction is the top bit: the two ends' frames never share a nonce.
  static std::uint64_t nonce(bool from_acceptor, std::uint64_t seq) noexcept {
    return (from_acceptor ? std::uint64_t{1} << 63 : 0) | seq;
  }
  authenticator::tag tag_of(std::uint64_t n, std::span<const std::byte> header, std::span<const std::byte> meta,
                            std::span<const std::byte> payload) const {
    if (integrity_ == integrity::full) return a_->frame_tag(key_, n, {header, meta, payload});
    return a_->frame_tag(key_, n, {header, meta});
  }

  std::shared_ptr<const authenticator> a_;
  integrity integrity_;
  role role_;
  authenticator::mac key_{};
  bool acceptor_ = false;
  std::uint64_t tx_seq_ = 0, rx_seq_ = 0;
};
using peer_auth = basic_peer_auth<>;
RLPT_EXTERN_TEMPLATE(class basic_peer_auth<>)

} // namespace detail
} // namespace sync
RLPT_NAMESPACE_END

#if RLPT_HEADER_IMPL()
RLPT_NAMESPACE_BEGIN
namespace sync::detail {

template <class Tag>
RLPT_INLINE std::string basic_peer_auth<Tag>::check_hello(std::span<const std::byte, hello_bytes> h) const {
  std::uint32_t magic;
  std::uint16_t version;
  std::memcpy(&magic, h.data(), 4);
  std::memcpy(&version, h.data() + 4, 2);
  if (magic != hello_magic)
    return rlpt::detail::format("the peer did not start an authenticated handshake (magic 0x{:08x}; is it configured "
                                "without an authenticator?)",
                                magic);
  if (version != hello_version)
    return rlpt::detail::format("handshake version {} is not the supported {}", version, hello_version);
  const auto theirs = static_cast<std::uint8_t>(h[6]);
  if (theirs != static_cast<std::uint8_t>(integrity_))
    return rlpt::detail::format(
        "the peer asks for integrity::{} and this end for integrity::{}: configure both ends alike",
        name(static_cast<integrity>(theirs)), name(integrity_));
  if (static_cast<std::uint8_t>(h[7]) == static_cast<std::uint8_t>(role_))
    return rlpt::detail::format("both ends are {}s", role_ == role::sender ? "sender" : "receiver");
  return {};
}

} // namespace sync::detail
RLPT_NAMESPACE_END
#endif // RLPT_HEADER_IMPL()
