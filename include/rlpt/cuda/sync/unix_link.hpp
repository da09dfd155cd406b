// SPDX-License-Identifier: Apache-2.0
//! @file
//! Unix-domain socket link that can pass file descriptors: the host channel of the CUDA IPC
//! transport, whose VMM export hands a POSIX fd of GPU memory to the other process
//! (SCM_RIGHTS: the kernel installs a duplicate in the receiver; nothing else can carry one).
//!
//! Frame: 40-byte header (u32 magic "RLUF", u32 meta bytes, u64 payload bytes, u32 fd count,
//! u32 0, u64 XXH3-64 of the meta block, u64 XXH3-64 of the first 32 header bytes), the meta
//! block, the payload. File descriptors travel as ancillary data of the header's bytes and
//! are matched to the frame by their count. Sizes are bounded before anything is allocated;
//! a bad frame drops the connection and raises rlpt.sync.wire.
//!
//! Like the TCP link: one end listens (a filesystem path, or "@name" in the abstract
//! namespace), the other connects; a new connection replaces the old one (a restarted peer),
//! and the connecting end reconnects on its next call. Or adopt one end of a socketpair (a
//! parent and its forked child). Received descriptors are owned by the link until take_fds();
//! whatever is not taken is closed at release(), so none leak.
#pragma once

#include <rlpt/config.hpp>
#include <rlpt/core/error.hpp>
#include <rlpt/sync/checksum.hpp>
#include <rlpt/sync/detail/stream_link.hpp>
#include <rlpt/sync/link.hpp>

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

RLPT_NAMESPACE_BEGIN
namespace sync {

struct unix_options {
  //! Socket address: a filesystem path, or "@name" for Linux's abstract namespace (nothing
  //! to clean up after a crash). Unused by an adopted socketpair end.
  std::string path{};
  bool listen = false;                                //!< accept connections instead of connecting
  std::uint64_t max_payload = std::uint64_t{1} << 32; //!< largest payload accepted (and sent)
  std::uint64_t max_meta = std::uint64_t{256} << 20;  //!< largest meta block accepted
  std::uint32_t max_fds = 16;                         //!< most descriptors one frame may carry
};

namespace detail {
inline constexpr std::uint32_t unix_magic = 0x46554c52u; // "RLUF"
inline constexpr std::size_t unix_header_bytes = 40;

inline sockaddr_un unix_address(const std::string& path, socklen_t& len) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  const bool abstract = !path.empty() && path[0] == '@';
  RLPT_CHECK(!path.empty() && path.size() < sizeof(a.sun_path), errors::sync::bad_link,
             "unix socket path \"{}\" must have 1 to {} characters", path, sizeof(a.sun_path) - 1);
  std::memcpy(a.sun_path, path.data(), path.size());
  if (abstract) a.sun_path[0] = '\0';
  len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + path.size() + (abstract ? 0 : 1));
  return a;
}
} // namespace detail

//! A connected pair of AF_UNIX stream sockets (close-on-exec); adopt each end with
//! unix_link(fd, role).
[[nodiscard]] inline std::array<int, 2> unix_socketpair() {
  int fds[2] = {-1, -1};
  RLPT_CHECK(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) == 0, errors::sync::bad_link,
             "socketpair(AF_UNIX) failed: {}", std::strerror(errno));
  return {fds[0], fds[1]};
}

class unix_link final : public link, private detail::stream_link<unix_link, detail::unix_header_bytes> {
public:
  unix_link(unix_options o, role r) : o_(std::move(o)) {
    where_ = rlpt::detail::format("unix {} ({}, {})", o_.path, r == role::sender ? "sender" : "receiver",
                                  o_.listen ? "listening" : "connecting");
    (void)detail::unix_address(o_.path, addr_len_); // validates the path
    if (o_.listen) open_listener();
  }

  //! Adopts a connected socket (one end of unix_socketpair()); the link owns and closes it.
  unix_link(int connected_fd, role r, unix_options o = {}) : o_(std::move(o)), adopted_(true) {
    RLPT_CHECK(connected_fd >= 0, errors::sync::bad_link, "unix_link needs a connected socket, got fd {}",
               connected_fd);
    where_ =
        rlpt::detail::format("unix socketpair fd {} ({})", connected_fd, r == role::sender ? "sender" : "receiver");
    adopt(connected_fd);
  }

  unix_link(const unix_link&) = delete;
  unix_link& operator=(const unix_link&) = delete;

  ~unix_link() override {
    drop();
    if (listen_.fd >= 0 && !o_.path.empty() && o_.path[0] != '@') ::unlink(o_.path.c_str());
  }

  [[nodiscard]] link_info info() const override { return {where_, true, o_.max_payload, memory_space::host}; }

  //! Process id of the connected peer (SO_PEERCRED), 0 without a connection.
  [[nodiscard]] std::int32_t peer_pid() const noexcept { return peer_pid_; }
  //! Connections established so far: a new one means the peer restarted.
  [[nodiscard]] std::uint64_t connections() const noexcept { return connections_; }

  std::span<std::byte> payload_buffer(std::uint64_t bytes, deadline) override {
    RLPT_CHECK(bytes <= o_.max_payload, errors::sync::too_large, "{}: payload of {} bytes exceeds max_payload {}",
               where_, bytes, o_.max_payload);
    if (tx_payload_.size() < bytes) tx_payload_.resize(static_cast<std::size_t>(bytes));
    return {tx_payload_.data(), static_cast<std::size_t>(bytes)};
  }

  void send(std::span<const std::byte> meta, std::uint64_t payload_bytes, deadline until) override {
    send_with_fds(meta, {}, payload_bytes, until);
  }

  //! Sends a frame carrying duplicates of `fds` (the caller keeps its own).
  void send_with_fds(std::span<const std::byte> meta, std::span<const int> fds, std::uint64_t payload_bytes,
                     deadline until) {
    RLPT_CHECK(meta.size() <= o_.max_meta && meta.size() <= 0xffffffffu, errors::sync::too_large,
               "{}: meta block of {} bytes exceeds max_meta {}", where_, meta.size(), o_.max_meta);
    RLPT_CHECK(fds.size() <= o_.max_fds, errors::sync::too_large, "{}: {} descriptors in one frame, the limit is {}",
               where_, fds.size(), o_.max_fds);
    RLPT_CHECK(payload_bytes <= tx_payload_.size(), errors::sync::bad_link,
               "{}: send of {} payload bytes without a payload_buffer() of that size", where_, payload_bytes);
    std::byte hdr[detail::unix_header_bytes] = {};
    const std::uint32_t magic = detail::unix_magic, mb = static_cast<std::uint32_t>(meta.size());
    const auto nf = static_cast<std::uint32_t>(fds.size());
    const std::uint64_t mcheck = xxh3(meta.data(), meta.size());
    std::memcpy(hdr, &magic, 4);
    std::memcpy(hdr + 4, &mb, 4);
    std::memcpy(hdr + 8, &payload_bytes, 8);
    std::memcpy(hdr + 16, &nf, 4);
    std::memcpy(hdr + 24, &mcheck, 8);
    const std::uint64_t hcheck = xxh3(hdr, 32);
    std::memcpy(hdr + 32, &hcheck, 8);
    std::vector<unsigned char> control;
    if (!fds.empty()) {
      control.assign(CMSG_SPACE(sizeof(int) * fds.size()), 0);
      msghdr proto{};
      proto.msg_control = control.data();
      proto.msg_controllen = control.size();
      cmsghdr* c = CMSG_FIRSTHDR(&proto);
      c->cmsg_level = SOL_SOCKET;
      c->cmsg_type = SCM_RIGHTS;
      c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
      std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
    }
    send_frame(hdr, meta, std::span<const std::byte>(tx_payload_.data(), static_cast<std::size_t>(payload_bytes)),
               control, until);
  }

  std::optional<message> receive(deadline until) override {
    release();
    return receive_frame(until);
  }

  //! Descriptors that came with the last received message; the caller owns (and closes) them.
  [[nodiscard]] std::vector<int> take_fds() { return std::exchange(msg_fds_, {}); }

  void release() override {
    if (release_frame()) close_all(msg_fds_);
  }

private:
  friend class detail::stream_link<unix_link, detail::unix_header_bytes>;
  static constexpr std::chrono::milliseconds reconnect_pause{2};

  static void close_all(std::vector<int>& fds) noexcept {
    for (int fd : fds) ::close(fd);
    fds.clear();
  }

  void open_listener() {
    detail::fd_guard fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    RLPT_CHECK(fd.fd >= 0, errors::sync::bad_link, "{}: socket failed: {}", where_, std::strerror(errno));
    socklen_t len = 0;
    sockaddr_un a = detail::unix_address(o_.path, len);
    if (o_.path[0] != '@') { // a socket file left by a crashed listener
      struct stat st {};
      if (::lstat(o_.path.c_str(), &st) == 0 && S_ISSOCK(st.st_mode)) ::unlink(o_.path.c_str());
    }
    RLPT_CHECK(::bind(fd.fd, reinterpret_cast<sockaddr*>(&a), len) == 0, errors::sync::bad_link, "{}: bind failed: {}",
               where_, std::strerror(errno));
    RLPT_CHECK(::listen(fd.fd, 4) == 0, errors::sync::bad_link, "{}: listen failed: {}", where_, std::strerror(errno));
    ::fcntl(fd.fd, F_SETFL, ::fcntl(fd.fd, F_GETFL) | O_NONBLOCK);
    listen_.reset(fd.release());
  }

  // --- the socket specifics stream_link asks for ------------------------------------------

  static bool admit(int) noexcept { return true; } // the socket's file mode is the access control
  static void on_send(std::span<std::byte>, std::span<const std::byte>, std::span<const std::byte>) noexcept {}

  void on_connected(int fd) {
    ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
    ucred cred{};
    socklen_t len = sizeof(cred);
    peer_pid_ = ::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0 ? cred.pid : 0;
    ++connections_;
  }

  void on_dropped() noexcept {
    peer_pid_ = 0;
    close_all(msg_fds_);
    for (int fd : pending_fds_) ::close(fd);
    pending_fds_.clear();
  }

  void on_reconnect() const {
    if (adopted_) RLPT_FAIL(errors::sync::peer_lost, "{}: the peer closed the socketpair", where_);
  }

  bool try_connect(deadline) {
    detail::fd_guard fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    RLPT_CHECK(fd.fd >= 0, errors::sync::bad_link, "{}: socket failed: {}", where_, std::strerror(errno));
    socklen_t len = 0;
    sockaddr_un a = detail::unix_address(o_.path, len);
    if (::connect(fd.fd, reinterpret_cast<sockaddr*>(&a), len) != 0) return false; // not listening yet
    adopt(fd.release());
    return true;
  }

  // recvmsg that keeps every descriptor it is handed, in order.
  ssize_t recv_some(std::byte* dst, std::size_t want) {
    iovec iov{dst, want};
    alignas(cmsghdr) unsigned char control[CMSG_SPACE(sizeof(int) * 64)];
    msghdr mh{};
    mh.msg_iov = &iov;
    mh.msg_iovlen = 1;
    mh.msg_control = control;
    mh.msg_controllen = sizeof(control);
    const ssize_t n = ::recvmsg(conn_.fd, &mh, MSG_CMSG_CLOEXEC);
    if (n < 0) return n;
    for (cmsghdr* c = CMSG_FIRSTHDR(&mh); c != nullptr; c = CMSG_NXTHDR(&mh, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
      const std::size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (std::size_t i = 0; i < count; ++i) {
        int fd;
        std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
        pending_fds_.push_back(fd);
      }
    }
    if ((mh.msg_flags & MSG_CTRUNC) != 0) {
      drop();
      RLPT_FAIL(errors::sync::wire, "{}: descriptors were truncated (more than 64 in one read)", where_);
    }
    return n;
  }

  // A complete header: checked, and its announced descriptors taken from those that arrived.
  detail::frame_sizes check_header(const std::byte* h) {
    std::uint32_t magic, mb, nf;
    std::uint64_t pb, mcheck, hcheck;
    std::memcpy(&magic, h, 4);
    std::memcpy(&mb, h + 4, 4);
    std::memcpy(&pb, h + 8, 8);
    std::memcpy(&nf, h + 16, 4);
    std::memcpy(&mcheck, h + 24, 8);
    std::memcpy(&hcheck, h + 32, 8);
    const char* problem = nullptr;
    if (magic != detail::unix_magic)
      problem = "bad magic";
    else if (xxh3(h, 32) != hcheck)
      problem = "header checksum mismatch";
    else if (mb > o_.max_meta)
      problem = "meta block larger than max_meta";
    else if (pb > o_.max_payload)
      problem = "payload larger than max_payload";
    else if (nf > o_.max_fds)
      problem = "more descriptors than max_fds";
    else if (nf > pending_fds_.size())
      problem = "announced descriptors did not arrive";
    if (problem != nullptr) {
      drop();
      RLPT_FAIL(errors::sync::wire,
                "{}: bad frame header ({}; magic 0x{:08x}, {} meta bytes, {} payload bytes, {} fds)", where_, problem,
                magic, mb, pb, nf);
    }
    close_all(msg_fds_);
    for (std::uint32_t i = 0; i < nf; ++i) {
      msg_fds_.push_back(pending_fds_.front());
      pending_fds_.pop_front();
    }
    return {mb, pb, mcheck};
  }

  unix_options o_;
  bool adopted_ = false;
  socklen_t addr_len_ = 0;
  std::int32_t peer_pid_ = 0;
  std::uint64_t connections_ = 0;
  std::vector<std::byte> tx_payload_;
  std::deque<int> pending_fds_; // received, not yet matched to a frame
  std::vector<int> msg_fds_;    // the current message's, until taken or released
};

} // namespace sync
RLPT_NAMESPACE_END
