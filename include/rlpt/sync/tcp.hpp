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
};

namespace detail {
inline constexpr std::uint32_t tcp_magic = 0x46544c52u; // "RLTF"
inline constexpr std::size_t tcp_header_bytes = 32;

} // namespace detail

class tcp_transport final : public link, private detail::stream_link<tcp_transport, detail::tcp_header_bytes> {
public:
  tcp_transport(tcp_options o, role r) : o_(std::move(o)) {
    if (o_.listen) open_listener();
    where_ = fmt::format("tcp {}:{} ({}, {})", o_.host, o_.listen ? port_ : o_.port,
                         r == role::sender ? "sender" : "receiver", o_.listen ? "listening" : "connecting");
  }

  tcp_transport(const tcp_transport&) = delete;
  tcp_transport& operator=(const tcp_transport&) = delete;
  ~tcp_transport() override = default;

  //! The bound port of a listening transport.
  [[nodiscard]] std::uint16_t port() const noexcept { return port_; }

  [[nodiscard]] link_info info() const override { return {where_, true, o_.max_payload, memory_space::host}; }

  std::span<std::byte> payload_buffer(std::uint64_t bytes, deadline) override {
    RLPT_CHECK(bytes <= o_.max_payload, errors::sync::too_large, "{}: payload of {} bytes exceeds max_payload {}",
               where_, bytes, o_.max_payload);
    if (tx_payload_.size() < bytes) tx_payload_.resize(static_cast<std::size_t>(bytes));
    return {tx_payload_.data(), static_cast<std::size_t>(bytes)};
  }

  void send(std::span<const std::byte> meta, std::uint64_t payload_bytes, deadline until) override {
    RLPT_CHECK(meta.size() <= o_.max_meta && meta.size() <= 0xffffffffu, errors::sync::too_large,
               "{}: meta block of {} bytes exceeds max_meta {}", where_, meta.size(), o_.max_meta);
    RLPT_CHECK(payload_bytes <= tx_payload_.size(), errors::sync::bad_link,
               "{}: send of {} payload bytes without a payload_buffer() of that size", where_, payload_bytes);
    std::byte hdr[detail::tcp_header_bytes];
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

  std::optional<message> receive(deadline until) override {
    release();
    return receive_frame(until);
  }

  void release() override { release_frame(); }

private:
  friend class detail::stream_link<tcp_transport, detail::tcp_header_bytes>;
  static constexpr std::chrono::milliseconds reconnect_pause{5};

  void open_listener() {
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
    RLPT_CHECK(rc == 0 && res != nullptr, errors::sync::tcp, "tcp: cannot resolve host \"{}\": {}", host,
               ::gai_strerror(rc));
    a.sin_addr = reinterpret_cast<sockaddr_in*>(res->ai_addr)->sin_addr;
    ::freeaddrinfo(res);
    return a;
  }

  // --- the socket specifics stream_link asks for ------------------------------------------

  void on_connected(int fd) const {
    const int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    ::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &o_.socket_buffer, sizeof(o_.socket_buffer));
    ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &o_.socket_buffer, sizeof(o_.socket_buffer));
    ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  }

  void on_dropped() noexcept {}
  void on_reconnect() const noexcept {}

  bool try_connect(deadline until) {
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
    adopt(fd.release());
    return true;
  }

  ssize_t recv_some(std::byte* dst, std::size_t want) const { return ::recv(conn_.fd, dst, want, 0); }

  detail::frame_sizes check_header(const std::byte* h) {
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

  tcp_options o_;
  std::uint16_t port_ = 0;
  std::vector<std::byte> tx_payload_;
};

} // namespace sync
RLPT_NAMESPACE_END
