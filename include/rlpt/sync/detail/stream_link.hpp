// SPDX-License-Identifier: Apache-2.0
//! @file
//! The stream plumbing of the socket links (tcp_transport, unix_link), written once: one
//! connection at a time (accepted on a listening socket, a new one replacing the old, or
//! connected, reconnecting on the next call after a failure), frames sent whole under a
//! deadline with optional ancillary data, and frames received without blocking by
//! frame_reader. Each link keeps only its socket specifics and its header format.
#pragma once

#include <rlpt/config.hpp>
#include <rlpt/core/error.hpp>
#include <rlpt/sync/checksum.hpp>
#include <rlpt/sync/link.hpp>

#include <poll.h>
#include <sys/socket.h>
#include <sys/types.h>
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
namespace sync::detail {

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
template <std::size_t HeaderBytes> class frame_reader {
public:
  //! Starts over at a header (after a consumed frame or a dropped connection).
  void reset() noexcept {
    stage_ = 0;
    got_ = 0;
  }

  //! The header of the frame read_some() completed; valid until reset().
  [[nodiscard]] std::span<const std::byte, HeaderBytes> header() const noexcept { return std::span(header_); }

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
  template <class Header, class Drop> bool advance(const std::string& where, Header& header, Drop& drop) {
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
//! A link over one stream socket (CRTP: `Link` derives from it and befriends it). `Link`
//! supplies the socket specifics:
//!
//!     bool try_connect(deadline until);              // connect once; false: nobody listens (yet)
//!     bool admit(int fd);                            // an accepted connection: keep it (false: closed, the old one stays)
//!     void on_connected(int fd);                     // tune a new connection (it is non-blocking after)
//!     void on_send(header, meta, payload);           // a frame about to go out on the current connection
//!     void on_dropped() noexcept;                    // forget the connection's state
//!     void on_reconnect();                           // before reconnecting: may throw (an adopted socket)
//!     ssize_t recv_some(std::byte* dst, std::size_t want);  // like ::recv
//!     frame_sizes check_header(const std::byte* h);  // a complete header: checked, or drop() and throw
//!     static constexpr std::chrono::milliseconds reconnect_pause;
template <class Link, std::size_t HeaderBytes> class stream_link {
protected:
  //! Sends a frame (its header, meta block and payload) whole; `control` (ancillary data,
  //! SCM_RIGHTS) goes with its first byte. A frame that cannot go out by `until` drops the
  //! connection (half a frame cannot be resumed): rlpt.sync.timeout; a broken connection:
  //! rlpt.sync.peer_lost.
  void send_frame(std::span<std::byte> header, std::span<const std::byte> meta, std::span<const std::byte> payload,
                  std::span<unsigned char> control, deadline until) {
    connect_or_accept(until);
    self().on_send(header, meta, payload); // the connection is settled: it may tag the frame for it
    iovec iov[3] = {{const_cast<std::byte*>(header.data()), header.size()},
                    {const_cast<std::byte*>(meta.data()), meta.size()},
                    {const_cast<std::byte*>(payload.data()), payload.size()}};
    int first = 0;
    bool control_sent = control.empty();
    while (first < 3) {
      while (first < 3 && iov[first].iov_len == 0) ++first;
      if (first == 3) break;
      msghdr mh{};
      mh.msg_iov = iov + first;
      mh.msg_iovlen = static_cast<std::size_t>(3 - first);
      if (!control_sent) {
        mh.msg_control = control.data();
        mh.msg_controllen = control.size();
      }
      const ssize_t n = ::sendmsg(conn_.fd, &mh, MSG_NOSIGNAL);
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
          if (clock::now() >= until) {
            drop(); // a half-sent frame cannot be resumed
            timeout(where_, "sending a frame (the peer stopped reading)");
          }
          pollfd p{conn_.fd, POLLOUT, 0};
          ::poll(&p, 1, ms_until(until));
          continue;
        }
        const int err = errno;
        drop();
        RLPT_FAIL(errors::sync::peer_lost, "{}: send failed: {}", where_, std::strerror(err));
      }
      control_sent = true; // attached to the first byte that went out
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

  //! The next whole frame, or nullopt at `until`; connects (or takes a new connection) as
  //! needed. The frame stays valid until release_frame().
  std::optional<message> receive_frame(deadline until) {
    for (;;) {
      if (listening()) accept_new(); // a restarted peer replaces the old connection
      if (conn_.fd < 0) {
        if (!try_connect_or_accept(until)) return std::nullopt;
        continue;
      }
      if (read_some()) {
        held_ = true;
        return rx_.frame();
      }
      if (clock::now() >= until) return std::nullopt;
      pollfd p[2] = {{conn_.fd, POLLIN, 0}, {listen_.fd, POLLIN, 0}};
      ::poll(p, listening() ? 2 : 1, ms_until(until));
    }
  }

  //! Done with the received frame; false if none was held.
  bool release_frame() noexcept {
    if (!held_) return false;
    held_ = false;
    rx_.reset();
    return true;
  }

  //! Makes sure a connection exists: takes a waiting one (listening) or connects, by `until`.
  void connect_or_accept(deadline until) {
    if (listening()) accept_new();
    if (conn_.fd >= 0) return;
    if (!try_connect_or_accept(until))
      timeout(where_, listening() ? "waiting for the peer to connect" : "connecting to the peer");
  }

  //! Uses `fd` (connected) as the connection, dropping the previous one.
  void adopt(int fd) {
    drop();
    self().on_connected(fd);
    conn_.reset(fd);
  }

  //! Closes the connection and forgets any partly received frame.
  void drop() noexcept {
    conn_.reset();
    rx_.reset();
    held_ = false;
    self().on_dropped();
  }

  [[nodiscard]] bool listening() const noexcept { return listen_.fd >= 0; }

  //! The header of the frame receive_frame() returned; valid until release_frame().
  [[nodiscard]] std::span<const std::byte, HeaderBytes> received_header() const noexcept { return rx_.header(); }

  std::string where_;
  fd_guard listen_;
  fd_guard conn_;

private:
  Link& self() noexcept { return static_cast<Link&>(*this); }

  bool accept_new() {
    fd_guard fd(::accept4(listen_.fd, nullptr, nullptr, SOCK_CLOEXEC));
    if (fd.fd < 0) return false;
    // A connection that fails admission (authentication) never displaces the current one.
    if (!self().admit(fd.fd)) return false;
    adopt(fd.release());
    return true;
  }

  bool try_connect_or_accept(deadline until) {
    self().on_reconnect();
    for (;;) {
      if (listening() ? accept_new() : self().try_connect(until)) return true;
      if (clock::now() >= until) return false;
      if (listening()) {
        pollfd p{listen_.fd, POLLIN, 0};
        ::poll(&p, 1, ms_until(until));
      } else {
        std::this_thread::sleep_for(Link::reconnect_pause);
      }
    }
  }

  bool read_some() {
    return rx_.read_some(
        where_, [&](std::byte* dst, std::size_t want) { return self().recv_some(dst, want); },
        [&](const std::byte* h) { return self().check_header(h); }, [&] { drop(); });
  }

  frame_reader<HeaderBytes> rx_;
  bool held_ = false;
};

} // namespace sync::detail
RLPT_NAMESPACE_END
