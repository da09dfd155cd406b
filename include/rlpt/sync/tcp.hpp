// SPDX-License-Identifier: Apache-2.0
//! @file
//! TCP transport: framed, checksummed messages over one stream socket, for hosts without GPUs
//! and cross-host CPU inference engines.
//!
//! Frame: 32-byte header (u32 magic "RLTF", u32 meta bytes, u64 payload bytes, u64 XXH3-64 of
//! the meta block, u64 XXH3-64 of the first 24 header bytes), the meta block, the payload.
//! Payload bytes are checksummed by the protocol (per bucket piece / delta chunk). Sizes are
//! bounded before anything is allocated; a bad frame drops the connection (a byte stream
//! cannot resynchronise) and raises rlpt.sync.wire.
//!
//! One end listens, the other connects (either role may do either). The listening end
//! accepts one peer at a time and takes a new connection in place of the old one, so a
//! restarted peer simply reconnects; the connecting end reconnects on its next call after a
//! failure. TCP's own flow control is the credit: send() blocks while the peer does not read.
#pragma once

#include <rlpt/config.hpp>
#include <rlpt/core/error.hpp>
#include <rlpt/sync/checksum.hpp>
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
  std::string host = "127.0.0.1"; //!< connect: peer address; listen: address to bind
  std::uint16_t port = 0;         //!< listen: 0 picks a free port (see tcp_transport::port())
  bool listen = false;            //!< accept connections instead of connecting
  std::uint64_t max_payload = std::uint64_t{1} << 32; //!< largest payload accepted (and sent)
  std::uint64_t max_meta = std::uint64_t{256} << 20;  //!< largest meta block accepted
  int socket_buffer = 8 << 20;                        //!< SO_SNDBUF / SO_RCVBUF request
};

namespace detail {
inline constexpr std::uint32_t tcp_magic = 0x46544c52u; // "RLTF"
inline constexpr std::size_t tcp_header_bytes = 32;

struct fd_guard {
  int fd = -1;
  fd_guard() = default;
  explicit fd_guard(int f) : fd(f) {}
  fd_guard(const fd_guard&) = delete;
  fd_guard& operator=(const fd_guard&) = delete;
  ~fd_guard() { reset(); }
  void reset(int f = -1) noexcept {
    if (fd >= 0) ::close(fd);
    fd = f;
  }
  [[nodiscard]] int release() noexcept {
    const int f = fd;
    fd = -1;
    return f;
  }
};

inline int ms_until(deadline until) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - clock::now()).count();
  return static_cast<int>(std::clamp<long long>(left, 0, 100));
}

//! What a stream frame's header announced, once the link has checked it.
struct frame_sizes {
  std::uint32_t meta_bytes;
  std::uint64_t payload_bytes;
  std::uint64_t meta_check; //!< XXH3 of the meta block
};

//! Receive side of the stream links' frames (a fixed header, a checksummed meta block, a
//! payload) over a non-blocking socket: takes what has arrived and never blocks. The link owns
//! the socket and its header format: `recv(dst, want)` reads like ::recv; `header(bytes)`
//! checks a complete header and returns its sizes (or drops the connection and throws);
//! `drop()` closes the connection and resets this reader.
template <std::size_t HeaderBytes>
class frame_reader {
public:
  //! Starts over at a header (after a consumed frame or a dropped connection).
  void reset() noexcept {
    stage_ = 0;
    got_ = 0;
  }

  //! The frame read_some() completed; valid until reset().
  [[nodiscard]] message frame() const noexcept {
    return {{meta_.data(), meta_.size()}, {payload_.get(), static_cast<std::size_t>(payload_bytes_)}};
  }

  //! Reads what is available; true when a whole frame is in.
  template <class Recv, class Header, class Drop>
  bool read_some(const std::string& where, Recv&& recv, Header&& header, Drop&& drop) {
    for (;;) {
      std::byte* dst = nullptr;
      std::size_t want = 0;
      if (stage_ == 0) {
        dst = header_ + got_;
        want = HeaderBytes - got_;
      } else if (stage_ == 1) {
        dst = meta_.data() + got_;
        want = meta_.size() - got_;
      } else {
        dst = payload_.get() + got_;
        want = static_cast<std::size_t>(payload_bytes_ - got_);
      }
      if (want == 0) {
        if (advance(where, header, drop)) return true;
        continue;
      }
      const ssize_t n = recv(dst, want);
      if (n > 0) {
        got_ += static_cast<std::size_t>(n);
        continue;
      }
      if (n == 0) {
        drop();
        RLPT_FAIL(errors::sync::peer_lost, "{}: connection closed by the peer", where);
      }
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return false;
      const int err = errno;
      drop();
      RLPT_FAIL(errors::sync::peer_lost, "{}: receive failed: {}", where, std::strerror(err));
    }
  }

private:
  // A stage is complete: validate and move on; true when the frame is complete.
  template <class Header, class Drop>
  bool advance(const std::string& where, Header& header, Drop& drop) {
    if (stage_ == 0) {
      const frame_sizes f = header(static_cast<const std::byte*>(header_));
      meta_check_ = f.meta_check;
      meta_.resize(f.meta_bytes);
      payload_bytes_ = f.payload_bytes;
      if (payload_cap_ < f.payload_bytes) {
        payload_.reset(new std::byte[static_cast<std::size_t>(f.payload_bytes)]);
        payload_cap_ = f.payload_bytes;
      }
      stage_ = 1;
      got_ = 0;
      return false;
    }
    if (stage_ == 1) {
      if (xxh3(meta_.data(), meta_.size()) != meta_check_) {
        drop();
        RLPT_FAIL(errors::sync::wire, "{}: frame meta block of {} bytes fails its checksum", where, meta_.size());
      }
      stage_ = 2;
      got_ = 0;
      return false;
    }
    return true;
  }

  std::byte header_[HeaderBytes] = {};
  std::vector<std::byte> meta_;
  std::unique_ptr<std::byte[]> payload_;
  std::uint64_t payload_cap_ = 0;
  std::uint64_t payload_bytes_ = 0;
  std::uint64_t meta_check_ = 0;
  int stage_ = 0;
  std::size_t got_ = 0;
};
} // namespace detail

class tcp_transport final : public link {
public:
  tcp_transport(tcp_options o, role r) : o_(std::move(o)), role_(r) {
    if (o_.listen) open_listener();
    where_ = fmt::format("tcp {}:{} ({}, {})", o_.host, o_.listen ? port_ : o_.port, r == role::sender ? "sender" : "receiver",
                         o_.listen ? "listening" : "connecting");
  }

  tcp_transport(const tcp_transport&) = delete;
  tcp_transport& operator=(const tcp_transport&) = delete;
  ~tcp_transport() override = default;

  //! The bound port of a listening transport.
  [[nodiscard]] std::uint16_t port() const noexcept { return port_; }

  [[nodiscard]] link_info info() const override { return {where_, true, o_.max_payload, memory_space::host}; }

  std::span<std::byte> payload_buffer(std::uint64_t bytes, deadline) override {
    RLPT_CHECK(bytes <= o_.max_payload, errors::sync::too_large, "{}: payload of {} bytes exceeds max_payload {}", where_,
               bytes, o_.max_payload);
    if (tx_payload_.size() < bytes) tx_payload_.resize(static_cast<std::size_t>(bytes));
    return {tx_payload_.data(), static_cast<std::size_t>(bytes)};
  }

  void send(std::span<const std::byte> meta, std::uint64_t payload_bytes, deadline until) override {
    RLPT_CHECK(meta.size() <= o_.max_meta && meta.size() <= 0xffffffffu, errors::sync::too_large,
               "{}: meta block of {} bytes exceeds max_meta {}", where_, meta.size(), o_.max_meta);
    RLPT_CHECK(payload_bytes <= tx_payload_.size(), errors::sync::bad_link,
               "{}: send of {} payload bytes without a payload_buffer() of that size", where_, payload_bytes);
    connect_or_accept(until);
    std::byte hdr[detail::tcp_header_bytes];
    const std::uint32_t magic = detail::tcp_magic, mb = static_cast<std::uint32_t>(meta.size());
    const std::uint64_t mcheck = xxh3(meta.data(), meta.size());
    std::memcpy(hdr, &magic, 4);
    std::memcpy(hdr + 4, &mb, 4);
    std::memcpy(hdr + 8, &payload_bytes, 8);
    std::memcpy(hdr + 16, &mcheck, 8);
    const std::uint64_t hcheck = xxh3(hdr, 24);
    std::memcpy(hdr + 24, &hcheck, 8);
    iovec iov[3] = {{hdr, sizeof(hdr)},
                    {const_cast<std::byte*>(meta.data()), meta.size()},
                    {tx_payload_.data(), static_cast<std::size_t>(payload_bytes)}};
    int first = 0;
    while (first < 3) {
      while (first < 3 && iov[first].iov_len == 0) ++first;
      if (first == 3) break;
      msghdr mh{};
      mh.msg_iov = iov + first;
      mh.msg_iovlen = static_cast<std::size_t>(3 - first);
      const ssize_t n = ::sendmsg(conn_.fd, &mh, MSG_NOSIGNAL);
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
          if (clock::now() >= until) {
            drop(); // a half-sent frame cannot be resumed
            detail::timeout(where_, "sending a frame (the peer stopped reading)");
          }
          pollfd p{conn_.fd, POLLOUT, 0};
          ::poll(&p, 1, detail::ms_until(until));
          continue;
        }
        const int err = errno;
        drop();
        RLPT_FAIL(errors::sync::peer_lost, "{}: send failed: {}", where_, std::strerror(err));
      }
      auto left = static_cast<std::size_t>(n);
      while (left > 0 && first < 3) {
        const std::size_t take = std::min(left, iov[first].iov_len);
        iov[first].iov_base = static_cast<char*>(iov[first].iov_base) + take;
        iov[first].iov_len -= take;
        left -= take;
        if (iov[first].iov_len == 0) ++first;
      }
    }
  }

  std::optional<message> receive(deadline until) override {
    release();
    for (;;) {
      if (o_.listen) accept_new(); // a restarted peer replaces the old connection
      if (conn_.fd < 0) {
        if (!try_connect_or_accept(until)) return std::nullopt;
        continue;
      }
      if (read_some()) {
        held_ = true;
        return rx_.frame();
      }
      const auto now = clock::now();
      if (now >= until) return std::nullopt;
      pollfd p[2] = {{conn_.fd, POLLIN, 0}, {listen_.fd, POLLIN, 0}};
      ::poll(p, o_.listen ? 2 : 1, detail::ms_until(until));
    }
  }

  void release() override {
    if (!held_) return;
    held_ = false;
    rx_.reset();
  }

private:
  void open_listener() {
    detail::fd_guard fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    RLPT_CHECK(fd.fd >= 0, errors::sync::tcp, "tcp: socket failed: {}", std::strerror(errno));
    const int one = 1;
    ::setsockopt(fd.fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_in a = address(o_.host, o_.port);
    RLPT_CHECK(::bind(fd.fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0, errors::sync::tcp, "tcp: bind {}:{} failed: {}",
               o_.host, o_.port, std::strerror(errno));
    RLPT_CHECK(::listen(fd.fd, 4) == 0, errors::sync::tcp, "tcp: listen failed: {}", std::strerror(errno));
    socklen_t len = sizeof(a);
    ::getsockname(fd.fd, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    ::fcntl(fd.fd, F_SETFL, ::fcntl(fd.fd, F_GETFL) | O_NONBLOCK);
    listen_.reset(fd.release());
  }

  static sockaddr_in address(const std::string& host, std::uint16_t port) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    if (::inet_pton(AF_INET, host.c_str(), &a.sin_addr) == 1) return a;
    addrinfo hints{};
    hints.ai_family = AF_INET;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* res = nullptr;
    const int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &res);
    RLPT_CHECK(rc == 0 && res != nullptr, errors::sync::tcp, "tcp: cannot resolve host \"{}\": {}", host, ::gai_strerror(rc));
    a.sin_addr = reinterpret_cast<sockaddr_in*>(res->ai_addr)->sin_addr;
    ::freeaddrinfo(res);
    return a;
  }

  void tune(int fd) const {
    const int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    ::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &o_.socket_buffer, sizeof(o_.socket_buffer));
    ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &o_.socket_buffer, sizeof(o_.socket_buffer));
    ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  }

  bool accept_new() {
    const int fd = ::accept4(listen_.fd, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) return false;
    tune(fd);
    drop();
    conn_.reset(fd);
    return true;
  }

  bool try_connect(deadline until) {
    detail::fd_guard fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    RLPT_CHECK(fd.fd >= 0, errors::sync::tcp, "{}: socket failed: {}", where_, std::strerror(errno));
    sockaddr_in a = address(o_.host, o_.port);
    if (::connect(fd.fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
      if (errno != EINPROGRESS) return false; // not listening yet
      for (;;) { // bounded by the deadline: an unreachable host must not hang the caller
        pollfd p{fd.fd, POLLOUT, 0};
        if (::poll(&p, 1, detail::ms_until(until)) > 0) break;
        if (clock::now() >= until) return false;
      }
      int err = 0;
      socklen_t len = sizeof(err);
      if (::getsockopt(fd.fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err != 0) return false;
    }
    tune(fd.fd);
    drop();
    conn_.reset(fd.release());
    return true;
  }

  bool try_connect_or_accept(deadline until) {
    for (;;) {
      if (o_.listen ? accept_new() : try_connect(until)) return true;
      if (clock::now() >= until) return false;
      if (o_.listen) {
        pollfd p{listen_.fd, POLLIN, 0};
        ::poll(&p, 1, detail::ms_until(until));
      } else {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
    }
  }

  void connect_or_accept(deadline until) {
    if (o_.listen) accept_new();
    if (conn_.fd >= 0) return;
    if (!try_connect_or_accept(until))
      detail::timeout(where_, o_.listen ? "waiting for the peer to connect" : "connecting to the peer");
  }

  void drop() noexcept {
    conn_.reset();
    rx_.reset();
    held_ = false;
  }

  // Reads what is available; true when a whole frame is in.
  bool read_some() {
    return rx_.read_some(
        where_, [&](std::byte* dst, std::size_t want) { return ::recv(conn_.fd, dst, want, 0); },
        [&](const std::byte* h) { return check_header(h); }, [&] { drop(); });
  }

  detail::frame_sizes check_header(const std::byte* h) {
    std::uint32_t magic, mb;
    std::uint64_t pb, mcheck, hcheck;
    std::memcpy(&magic, h, 4);
    std::memcpy(&mb, h + 4, 4);
    std::memcpy(&pb, h + 8, 8);
    std::memcpy(&mcheck, h + 16, 8);
    std::memcpy(&hcheck, h + 24, 8);
    const char* problem = nullptr;
    if (magic != detail::tcp_magic) problem = "bad magic";
    else if (xxh3(h, 24) != hcheck) problem = "header checksum mismatch";
    else if (mb > o_.max_meta) problem = "meta block larger than max_meta";
    else if (pb > o_.max_payload) problem = "payload larger than max_payload";
    if (problem == nullptr) return {mb, pb, mcheck};
    drop();
    RLPT_FAIL(errors::sync::wire, "{}: bad frame header ({}; magic 0x{:08x}, {} meta bytes, {} payload bytes)", where_,
              problem, magic, mb, pb);
  }

  tcp_options o_;
  role role_;
  std::string where_;
  std::uint16_t port_ = 0;
  detail::fd_guard listen_;
  detail::fd_guard conn_;
  std::vector<std::byte> tx_payload_;
  detail::frame_reader<detail::tcp_header_bytes> rx_;
  bool held_ = false;
};

} // namespace sync
RLPT_NAMESPACE_END
