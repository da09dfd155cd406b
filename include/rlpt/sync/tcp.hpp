// SPDX-License-Identifier: Apache-2.0
//! @file
//! TCP transport: framed, checksummed messages over one stream socket, for hosts without GPUs
//! and cross-host CPU inference engines.
//!
//! Frame: 48-byte header (u32 magic "RLTF", u32 meta bytes, u64 payload bytes, u64 XXH3-64 of
//! the meta block, u64 XXH3-64 of the first 24 header bytes, 16-byte frame tag), the meta
//! block, the payload. Payload bytes are checksummed by the protocol (per bucket piece / delta
//! chunk). Sizes are bounded before anything is allocated; a bad frame drops the connection (a
//! byte stream cannot resynchronise) and raises rlpt.sync.wire.
//!
//! Authentication (auth.hpp): with `tcp_options::auth`, every connection starts with a
//! handshake proving that both ends hold the job's secret, and every frame carries a tag under
//! the connection's session key (the tag field; zero without auth). A peer that fails the
//! handshake is refused (counted, never displacing the current connection); a frame whose tag
//! fails drops the connection and raises rlpt.sync.auth. Without `auth`, only loopback
//! addresses are allowed unless `allow_unauthenticated` says otherwise: any host that reaches
//! an unauthenticated port can publish weights (XXH3 checksums are not a MAC).
//!
//! One end listens, the other connects (either role may do either). The listening end
//! accepts one peer at a time and takes a new connection in place of the old one, so a
//! restarted peer simply reconnects; the connecting end reconnects on its next call after a
//! failure. TCP's own flow control is the credit: send() blocks while the peer does not read.
#pragma once

#include <rlpt/config.hpp>
#include <rlpt/core/error.hpp>
#include <rlpt/sync/auth.hpp>
#include <rlpt/sync/checksum.hpp>
#include <rlpt/sync/detail/inet.hpp>
#include <rlpt/sync/detail/stream_link.hpp>
#include <rlpt/sync/link.hpp>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

RLPT_NAMESPACE_BEGIN
namespace sync {

struct tcp_options {
  std::string host = "127.0.0.1";                     //!< connect: peer address; listen: address to bind
  std::uint16_t port = 0;                             //!< listen: 0 picks a free port (see tcp_transport::port())
  bool listen = false;                                //!< accept connections instead of connecting
  std::uint64_t max_payload = std::uint64_t{1} << 32; //!< largest payload accepted (and sent)
  std::uint64_t max_meta = std::uint64_t{256} << 20;  //!< largest meta block accepted
  int socket_buffer = 8 << 20;                        //!< SO_SNDBUF / SO_RCVBUF request
  //! Authenticates both ends with the job's secret (auth_openssl.hpp); required for a
  //! non-loopback address unless allow_unauthenticated.
  std::shared_ptr<const authenticator> auth{};
  integrity tags = integrity::full; //!< what frame tags cover (with auth; both ends alike)
  //! Plain TCP on or to a non-loopback address: only on a network where every host is trusted.
  bool allow_unauthenticated = false;
  //! Longest a connecting peer may take to complete the handshake before it is refused.
  std::chrono::milliseconds handshake_timeout{2000};
  //! A peer whose host acknowledges nothing for this long is gone: the kernel aborts the
  //! connection (TCP_USER_TIMEOUT for unacknowledged data; keepalive probes on an idle one) and
  //! the link reconnects on its next call (rlpt.sync.peer_lost). A fresh connection gets through
  //! as soon as the path is back, where the old one waits for TCP's doubling retransmission
  //! timer. The kernel also aborts a connection whose peer advertises no room (stopped reading)
  //! that long, so keep it at least the sender's own limit for that (sender_options::timeout).
  //! 0: the kernel's defaults (no keepalive; retransmissions for about 15 minutes).
  std::chrono::milliseconds dead_peer_timeout{30'000};
};

namespace detail {
inline constexpr std::uint32_t tcp_magic = 0x46544c52u; // "RLTF"
inline constexpr std::size_t tcp_header_bytes = 48;
inline constexpr std::size_t tcp_tag_at = 32; // the frame tag: header bytes [32, 48)

} // namespace detail

template <class Tag = void>
class basic_tcp_transport final : public link,
                                  private detail::stream_link<basic_tcp_transport<Tag>, detail::tcp_header_bytes> {
  // The stream plumbing is a dependent base of the class template: its members named here.
  using stream = detail::stream_link<basic_tcp_transport<Tag>, detail::tcp_header_bytes>;
  using stream::adopt;
  using stream::conn_;
  using stream::drop;
  using stream::listen_;
  using stream::receive_frame;
  using stream::received_header;
  using stream::release_frame;
  using stream::send_frame;
  using stream::where_;

public:
  basic_tcp_transport(tcp_options o, role r);

  basic_tcp_transport(const basic_tcp_transport&) = delete;
  basic_tcp_transport& operator=(const basic_tcp_transport&) = delete;
  ~basic_tcp_transport() override = default;

  //! The bound port of a listening transport.
  [[nodiscard]] std::uint16_t port() const noexcept { return port_; }

  //! Handshakes and refusals of an authenticated transport.
  [[nodiscard]] const auth_counters& auth_stats() const noexcept { return counters_; }

  [[nodiscard]] link_info info() const override { return {where_, true, o_.max_payload, memory_space::host}; }

  std::span<std::byte> payload_buffer(std::uint64_t bytes, deadline) override {
    RLPT_CHECK(bytes <= o_.max_payload, errors::sync::too_large, "{}: payload of {} bytes exceeds max_payload {}",
               where_, bytes, o_.max_payload);
    if (tx_payload_.size() < bytes) tx_payload_.resize(static_cast<std::size_t>(bytes));
    return {tx_payload_.data(), static_cast<std::size_t>(bytes)};
  }

  RLPT_INLINE void send(std::span<const std::byte> meta, std::uint64_t payload_bytes, deadline until) override;

  RLPT_INLINE std::optional<message> receive(deadline until) override;

  void release() override { release_frame(); }

private:
  friend class detail::stream_link<basic_tcp_transport, detail::tcp_header_bytes>;
  static constexpr std::chrono::milliseconds reconnect_pause{5};

  void open_listener();

  static sockaddr_in address(const std::string& host, std::uint16_t port) {
    return detail::ipv4_address(host, port, errors::sync::tcp, "tcp");
  }

  // --- the socket specifics stream_link asks for ------------------------------------------

  void on_connected(int fd) const {
    const int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    ::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &o_.socket_buffer, sizeof(o_.socket_buffer));
    ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &o_.socket_buffer, sizeof(o_.socket_buffer));
    ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
    if (o_.dead_peer_timeout.count() > 0) detect_dead_peer(fd);
  }

  // Without this a peer host that vanished (link down, powered off) is noticed only when a send
  // fills the socket buffer or after TCP's ~15 minutes of retransmissions, and an idle end never
  // notices: it keeps a connection the other end has long replaced. TCP_USER_TIMEOUT bounds how
  // long sent data may go unacknowledged and, with keepalive, how long an idle connection may
  // go unanswered (tcp(7)); probes start at half the bound and repeat at a quarter of it.
  void detect_dead_peer(int fd) const {
    const auto ms = static_cast<unsigned>(o_.dead_peer_timeout.count());
    const auto seconds = [](unsigned s) { return static_cast<int>(std::clamp(s, 1u, 32767u)); }; // the kernel's range
    const int one = 1, idle = seconds(ms / 2000), interval = seconds(ms / 4000), probes = 9;
    ::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
    ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
    ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof(interval));
    ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &probes, sizeof(probes));
    ::setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &ms, sizeof(ms));
  }

  void on_dropped() noexcept {}
  void on_reconnect() const noexcept {}

  void on_send(std::span<std::byte> header, std::span<const std::byte> meta, std::span<const std::byte> payload) {
    if (!auth_.enabled()) return;
    const authenticator::tag t = auth_.seal(header.first(detail::tcp_tag_at), meta, payload);
    std::memcpy(header.data() + detail::tcp_tag_at, t.data(), t.size());
  }

  // An accepted connection: kept only once it has authenticated.
  bool admit(int fd) {
    if (!auth_.enabled()) return true;
    const std::string why = accept_handshake(fd);
    if (why.empty()) return true;
    refused(why);
    return false;
  }

  void refused(const std::string& why) {
    ++counters_.refused_peers;
    counters_.refused(why);
  }

  // Reads or writes exactly `n` bytes on a non-blocking socket by `until`; empty, or what failed.
  static std::string io_exact(int fd, std::byte* p, std::size_t n, bool write, deadline until);

  // The listener's side of the handshake (auth.hpp) on an accepted connection: empty, or why
  // the peer is refused. Bounded by handshake_timeout: a silent peer costs at most that.
  std::string accept_handshake(int fd);

  // Connects and, with auth, runs the connector's side of the handshake. The wait for the
  // listener's HELLO ends at `until` and resumes on the next call (a listener that is not
  // accepting yet must not block a short poll); a wrong proof throws rlpt.sync.auth.
  bool try_connect(deadline until);

  ssize_t recv_some(std::byte* dst, std::size_t want) const { return ::recv(conn_.fd, dst, want, 0); }

  detail::frame_sizes check_header(const std::byte* h);

  tcp_options o_;
  detail::peer_auth auth_;
  auth_counters counters_;
  detail::fd_guard pending_; // a connection whose handshake waits for the listener
  std::array<std::byte, detail::hello_bytes> hello_c_{};
  std::array<std::byte, detail::hello_bytes + authenticator::mac_bytes> pending_in_{};
  std::size_t pending_got_ = 0;
  std::uint16_t port_ = 0;
  std::vector<std::byte> tx_payload_;
};
using tcp_transport = basic_tcp_transport<>;
RLPT_EXTERN_TEMPLATE(class basic_tcp_transport<>)

} // namespace sync
RLPT_NAMESPACE_END

#if RLPT_HEADER_IMPL()
RLPT_NAMESPACE_BEGIN
namespace sync {

template <class Tag>
RLPT_INLINE basic_tcp_transport<Tag>::basic_tcp_transport(tcp_options o, role r)
    : o_(std::move(o)), auth_(o_.auth, o_.tags, r) {
  const auto dead = o_.dead_peer_timeout;
  RLPT_CHECK(dead.count() == 0 || (dead >= std::chrono::seconds(1) && dead <= std::chrono::hours(24)),
             errors::sync::tcp,
             "tcp: dead_peer_timeout of {} ms: 0 (the kernel's defaults) or 1 s to 24 h (keepalive counts whole "
             "seconds)",
             dead.count());
  detail::check_link_security("tcp", o_.host, o_.port, o_.listen, o_.auth.get(), o_.tags, o_.allow_unauthenticated, r);
  if (o_.listen) open_listener();
  where_ = rlpt::detail::format("tcp {}:{} ({}, {})", o_.host, o_.listen ? port_ : o_.port,
                                r == role::sender ? "sender" : "receiver", o_.listen ? "listening" : "connecting");
}

template <class Tag>
RLPT_INLINE void basic_tcp_transport<Tag>::send(std::span<const std::byte> meta, std::uint64_t payload_bytes,
                                                deadline until) {
  RLPT_CHECK(meta.size() <= o_.max_meta && meta.size() <= 0xffffffffu, errors::sync::too_large,
             "{}: meta block of {} bytes exceeds max_meta {}", where_, meta.size(), o_.max_meta);
  RLPT_CHECK(payload_bytes <= tx_payload_.size(), errors::sync::bad_link,
             "{}: send of {} payload bytes without a payload_buffer() of that size", where_, payload_bytes);
  std::byte hdr[detail::tcp_header_bytes] = {};
  const std::uint32_t magic = detail::tcp_magic, mb = static_cast<std::uint32_t>(meta.size());
  const std::uint64_t mcheck = xxh3(meta.data(), meta.size());
  std::memcpy(hdr, &magic, 4);
  std::memcpy(hdr + 4, &mb, 4);
  std::memcpy(hdr + 8, &payload_bytes, 8);
  std::memcpy(hdr + 16, &mcheck, 8);
  const std::uint64_t hcheck = xxh3(hdr, 24);
  std::memcpy(hdr + 24, &hcheck, 8);
  send_frame(hdr, meta, std::span<const std::byte>(tx_payload_.data(), static_cast<std::size_t>(payload_bytes)), {},
             until);
}

template <class Tag> RLPT_INLINE std::optional<message> basic_tcp_transport<Tag>::receive(deadline until) {
  release();
  std::optional<message> m = receive_frame(until);
  if (m && auth_.enabled()) {
    const auto h = received_header();
    if (!auth_.open(h.first(detail::tcp_tag_at), m->meta, m->payload,
                    h.template subspan<detail::tcp_tag_at, authenticator::tag_bytes>())) {
      drop();
      ++counters_.refused_frames;
      counters_.refused(rlpt::detail::format(
          "a frame ({} meta bytes, {} payload bytes) failed its {} tag: altered, replayed or reordered "
          "in flight, or not from the authenticated peer",
          m->meta.size(), m->payload.size(), name(o_.tags)));
      RLPT_FAIL(errors::sync::auth, "{}: {}; connection dropped", where_, counters_.last_refusal);
    }
  }
  return m;
}

template <class Tag> RLPT_INLINE void basic_tcp_transport<Tag>::open_listener() {
  detail::fd_guard fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  RLPT_CHECK(fd.fd >= 0, errors::sync::tcp, "tcp: socket failed: {}", std::strerror(errno));
  const int one = 1;
  ::setsockopt(fd.fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in a = address(o_.host, o_.port);
  RLPT_CHECK(::bind(fd.fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0, errors::sync::tcp,
             "tcp: bind {}:{} failed: {}", o_.host, o_.port, std::strerror(errno));
  RLPT_CHECK(::listen(fd.fd, 4) == 0, errors::sync::tcp, "tcp: listen failed: {}", std::strerror(errno));
  socklen_t len = sizeof(a);
  ::getsockname(fd.fd, reinterpret_cast<sockaddr*>(&a), &len);
  port_ = ntohs(a.sin_port);
  ::fcntl(fd.fd, F_SETFL, ::fcntl(fd.fd, F_GETFL) | O_NONBLOCK);
  listen_.reset(fd.release());
}

template <class Tag>
RLPT_INLINE std::string basic_tcp_transport<Tag>::io_exact(int fd, std::byte* p, std::size_t n, bool write,
                                                           deadline until) {
  while (n > 0) {
    const ssize_t k = write ? ::send(fd, p, n, MSG_NOSIGNAL) : ::recv(fd, p, n, 0);
    if (k > 0) {
      p += k;
      n -= static_cast<std::size_t>(k);
      continue;
    }
    if (k == 0) return "the peer closed the connection during the handshake";
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK)
      return rlpt::detail::format("the handshake failed: {}", std::strerror(errno));
    if (clock::now() >= until) return "the handshake timed out";
    pollfd q{fd, static_cast<short>(write ? POLLOUT : POLLIN), 0};
    ::poll(&q, 1, detail::ms_until(until));
  }
  return {};
}

template <class Tag> RLPT_INLINE std::string basic_tcp_transport<Tag>::accept_handshake(int fd) {
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  const deadline until = clock::now() + o_.handshake_timeout;
  constexpr std::size_t hb = detail::hello_bytes, mb = authenticator::mac_bytes;
  std::array<std::byte, hb> hello_c{};
  std::string why = io_exact(fd, hello_c.data(), hb, false, until);
  if (!why.empty()) return why;
  std::string mismatch = auth_.check_hello(hello_c);
  const std::array<std::byte, hb> hello_a = auth_.hello();
  const authenticator::mac mine = auth_.proof(true, hello_c, hello_a);
  std::array<std::byte, hb + mb> out{};
  std::memcpy(out.data(), hello_a.data(), hb);
  std::memcpy(out.data() + hb, mine.data(), mb);
  authenticator::mac proof{};
  // An rlpt peer configured differently gets our HELLO anyway, so that it can say why too.
  const bool rlpt_peer = mismatch.find("did not start an authenticated handshake") == std::string::npos;
  if (!mismatch.empty()) {
    if (rlpt_peer) static_cast<void>(io_exact(fd, out.data(), out.size(), true, until));
    return mismatch;
  }
  if (why = io_exact(fd, out.data(), out.size(), true, until); !why.empty()) return why;
  if (why = io_exact(fd, proof.data(), mb, false, until); !why.empty()) return why;
  if (!detail::peer_auth::constant_time_equal(proof, auth_.proof(false, hello_c, hello_a)))
    return "the connecting peer's proof is wrong: it does not hold the job's secret, or it replayed a recorded "
           "handshake";
  auth_.establish(true, hello_c, hello_a);
  ++counters_.handshakes;
  return {};
}

template <class Tag> RLPT_INLINE bool basic_tcp_transport<Tag>::try_connect(deadline until) {
  if (pending_.fd < 0) {
    detail::fd_guard fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    RLPT_CHECK(fd.fd >= 0, errors::sync::tcp, "{}: socket failed: {}", where_, std::strerror(errno));
    sockaddr_in a = address(o_.host, o_.port);
    if (::connect(fd.fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
      if (errno != EINPROGRESS) return false; // not listening yet
      for (;;) {                              // bounded by the deadline: an unreachable host must not hang the caller
        pollfd p{fd.fd, POLLOUT, 0};
        if (::poll(&p, 1, detail::ms_until(until)) > 0) break;
        if (clock::now() >= until) return false;
      }
      int err = 0;
      socklen_t len = sizeof(err);
      if (::getsockopt(fd.fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err != 0) return false;
    }
    if (!auth_.enabled()) {
      adopt(fd.release());
      return true;
    }
    hello_c_ = auth_.hello();
    if (!io_exact(fd.fd, hello_c_.data(), hello_c_.size(), true, clock::now() + o_.handshake_timeout).empty())
      return false;
    pending_.reset(fd.release());
    pending_got_ = 0;
  }
  // The listener's HELLO and proof, as far as they have arrived.
  while (pending_got_ < pending_in_.size()) {
    const ssize_t k = ::recv(pending_.fd, pending_in_.data() + pending_got_, pending_in_.size() - pending_got_, 0);
    if (k > 0) {
      pending_got_ += static_cast<std::size_t>(k);
      continue;
    }
    const bool again = k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
    if (k < 0 && errno == EINTR) continue;
    if (again && clock::now() < until) {
      pollfd q{pending_.fd, POLLIN, 0};
      ::poll(&q, 1, detail::ms_until(until));
      continue;
    }
    if (again) return false; // resumes on the next call
    pending_.reset();
    // The listener answers every rlpt HELLO, so closing first means it refused to talk.
    const std::string why = k == 0 ? "the listener closed the connection without answering the handshake (is it "
                                     "configured without tcp_options::auth?)"
                                   : rlpt::detail::format("the handshake failed: {}", std::strerror(errno));
    refused(why);
    RLPT_FAIL(errors::sync::auth, "{}: peer refused: {}", where_, why);
  }
  detail::fd_guard fd(pending_.release());
  const auto in = std::span<const std::byte>(pending_in_);
  const auto hello_a = in.first<detail::hello_bytes>();
  std::string why = auth_.check_hello(hello_a);
  if (why.empty() &&
      !detail::peer_auth::constant_time_equal(in.subspan(detail::hello_bytes), auth_.proof(true, hello_c_, hello_a)))
    why = "the listening peer's proof is wrong: it does not hold the job's secret (or this end has the wrong one)";
  authenticator::mac proof = auth_.proof(false, hello_c_, hello_a);
  // Sent even when refusing (it proves nothing beyond this transcript): the listener then
  // reports a wrong secret as such instead of a silent peer.
  const bool sent = io_exact(fd.fd, proof.data(), proof.size(), true, clock::now() + o_.handshake_timeout).empty();
  if (!why.empty()) {
    refused(why);
    RLPT_FAIL(errors::sync::auth, "{}: peer refused: {}", where_, why);
  }
  if (!sent) return false;
  auth_.establish(false, hello_c_, hello_a);
  ++counters_.handshakes;
  adopt(fd.release());
  return true;
}

template <class Tag> RLPT_INLINE detail::frame_sizes basic_tcp_transport<Tag>::check_header(const std::byte* h) {
  std::uint32_t magic, mb;
  std::uint64_t pb, mcheck, hcheck;
  std::memcpy(&magic, h, 4);
  std::memcpy(&mb, h + 4, 4);
  std::memcpy(&pb, h + 8, 8);
  std::memcpy(&mcheck, h + 16, 8);
  std::memcpy(&hcheck, h + 24, 8);
  const char* problem = nullptr;
  if (magic != detail::tcp_magic)
    problem = "bad magic";
  else if (xxh3(h, 24) != hcheck)
    problem = "header checksum mismatch";
  else if (mb > o_.max_meta)
    problem = "meta block larger than max_meta";
  else if (pb > o_.max_payload)
    problem = "payload larger than max_payload";
  if (problem == nullptr) return {mb, pb, mcheck};
  drop();
  RLPT_FAIL(errors::sync::wire, "{}: bad frame header ({}; magic 0x{:08x}, {} meta bytes, {} payload bytes)", where_,
            problem, magic, mb, pb);
}

} // namespace sync
RLPT_NAMESPACE_END
#endif // RLPT_HEADER_IMPL()
