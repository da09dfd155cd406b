// SPDX-License-Identifier: Apache-2.0
// Relays between a TCP sender and receiver, for the authenticated-TCP tests: `frame_relay`, a
// man in the middle that parses the connecting side's stream as the handshake and TCP frames
// and may alter any frame (re-computing the frame's XXH3 checks, as an adversary would), and
// `chaos_relay`, a hostile network (a delay per chunk, stalls, connections reset mid-stream).
// One implementation for both users: test_tcp_auth.cpp runs them in-process on loopback, and
// sync_node's `relay` subcommand runs them on a host of the namespaced cluster (netns_cluster.sh).
// No doctest assertions here: sync_node is built with DOCTEST_CONFIG_DISABLE.
#pragma once

#include "sync_support.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <functional>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace rlpt::test::sync {

//! An IPv4 address (a literal) and port.
struct endpoint {
  std::string host = "127.0.0.1";
  std::uint16_t port = 0;

  //! "HOST:PORT".
  static endpoint parse(const std::string& host_port) {
    const auto colon = host_port.rfind(':');
    if (colon == std::string::npos) throw std::runtime_error("expected HOST:PORT, got \"" + host_port + "\"");
    return {host_port.substr(0, colon), static_cast<std::uint16_t>(std::stoul(host_port.substr(colon + 1)))};
  }
  [[nodiscard]] sockaddr_in address() const {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    if (::inet_pton(AF_INET, host.c_str(), &a.sin_addr) != 1)
      throw std::runtime_error("not an IPv4 address: \"" + host + "\"");
    return a;
  }
};

//! A listening socket at `at`; port 0 picks a free one (written back). Throws std::runtime_error.
inline int listen_on(endpoint& at) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw std::runtime_error(std::string("socket: ") + std::strerror(errno));
  const int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in a = at.address();
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 || ::listen(fd, 8) != 0) {
    const std::string why = std::strerror(errno);
    ::close(fd);
    throw std::runtime_error("listening on " + at.host + ":" + std::to_string(at.port) + ": " + why);
  }
  socklen_t len = sizeof(a);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  at.port = ntohs(a.sin_port);
  return fd;
}

inline int listen_loopback(std::uint16_t& port) {
  endpoint at{"127.0.0.1", 0};
  const int fd = listen_on(at);
  port = at.port;
  return fd;
}

//! A blocking socket connected to `to`, or -1 when nobody accepts within `limit`.
inline int connect_to(const endpoint& to, std::chrono::milliseconds limit = std::chrono::seconds(2)) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return -1;
  const sockaddr_in a = to.address();
  bool ok = ::connect(fd, reinterpret_cast<const sockaddr*>(&a), sizeof(a)) == 0;
  if (!ok && errno == EINPROGRESS) {
    pollfd p{fd, POLLOUT, 0};
    int err = 0;
    socklen_t len = sizeof(err);
    ok = ::poll(&p, 1, static_cast<int>(limit.count())) > 0 &&
         ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0;
  }
  if (!ok) {
    ::close(fd);
    return -1;
  }
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  return fd;
}

inline int connect_loopback(std::uint16_t port) { return connect_to({"127.0.0.1", port}); }

inline bool read_exact(int fd, std::byte* p, std::size_t n) {
  while (n > 0) {
    const ssize_t k = ::recv(fd, p, n, 0);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    p += k;
    n -= static_cast<std::size_t>(k);
  }
  return true;
}

inline bool write_all(int fd, const std::byte* p, std::size_t n) {
  while (n > 0) {
    const ssize_t k = ::send(fd, p, n, MSG_NOSIGNAL);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    p += k;
    n -= static_cast<std::size_t>(k);
  }
  return true;
}

//! Rewrites a frame's body and re-seals its protocol checksum (frame.hpp), as an adversary can.
inline void reseal(std::vector<std::byte>& meta) {
  xxh3_stream h;
  h.update(meta.data(), 64);
  h.update(meta.data() + frame_header_bytes, meta.size() - frame_header_bytes);
  const std::uint64_t sum = h.digest();
  std::memcpy(meta.data() + 64, &sum, 8);
}

// The connection a relay is serving: stop() shuts it down so that blocked reads return.
class relay_base {
public:
  relay_base(endpoint target, endpoint at) : target_(std::move(target)), at_(std::move(at)) {
    listen_ = listen_on(at_);
  }
  relay_base(const relay_base&) = delete;
  relay_base& operator=(const relay_base&) = delete;
  ~relay_base() { ::close(listen_); }

  [[nodiscard]] std::uint16_t port() const { return at_.port; }
  //! Connections accepted and relayed so far.
  [[nodiscard]] int connections() const { return connections_.load(); }

protected:
  // Waits up to 20 ms for a connection; then connects to the target (a target that does not
  // accept closes the accepted connection). False: nothing to relay yet.
  bool next(int& in, int& out) {
    pollfd p{listen_, POLLIN, 0};
    if (::poll(&p, 1, 20) <= 0) return false;
    in = ::accept4(listen_, nullptr, nullptr, SOCK_CLOEXEC);
    if (in < 0) return false;
    out = connect_to(target_);
    if (out < 0) {
      ::close(in);
      return false;
    }
    ++connections_;
    std::lock_guard lock(mu_);
    live_ = {in, out};
    return true;
  }
  void finish(int in, int out) {
    {
      std::lock_guard lock(mu_);
      live_ = {-1, -1};
    }
    ::close(in);
    ::close(out);
  }
  void stop_serving() {
    stop_ = true;
    std::lock_guard lock(mu_);
    for (const int fd : live_)
      if (fd >= 0) ::shutdown(fd, SHUT_RDWR);
  }

  endpoint target_, at_;
  int listen_ = -1;
  std::atomic<bool> stop_{false};
  std::atomic<int> connections_{0};

private:
  std::mutex mu_;
  std::array<int, 2> live_{-1, -1};
};

// A man in the middle: accepts connections one after the other, connects each to `target`,
// and relays both ways. From the connecting side it records every byte and parses the stream
// as the authenticated handshake (its 40-byte HELLO, then its 32-byte proof once the listener
// answered) followed by TCP frames, passing each frame to `edit` (which may change it) and
// then recomputing the frame's XXH3 checks in the TCP header, as an adversary would.
class frame_relay : public relay_base {
public:
  //! (connection, frame index within it, meta block, payload), both changeable.
  using editor = std::function<void(std::size_t connection, std::size_t index, std::vector<std::byte>& meta,
                                    std::vector<std::byte>& payload)>;

  frame_relay(endpoint target, editor edit, endpoint at = {})
      : relay_base(std::move(target), std::move(at)), edit_(std::move(edit)) {}
  ~frame_relay() { stop(); }
  void start() {
    thread_ = std::thread([this] { run(); });
  }
  void stop() {
    stop_serving();
    if (thread_.joinable()) thread_.join();
  }
  std::vector<std::byte> recorded() {
    std::lock_guard lock(record_mu_);
    return recorded_;
  }

private:
  void run() {
    for (std::size_t connection = 0; !stop_;) {
      int in = -1, out = -1;
      if (!next(in, out)) continue;
      serve(connection++, in, out);
      finish(in, out);
    }
  }
  void serve(std::size_t connection, int in, int out) {
    std::thread back([&] { // listener -> connector, untouched
      std::byte buf[4096];
      for (;;) {
        const ssize_t k = ::recv(out, buf, sizeof(buf), 0);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0 || !write_all(in, buf, static_cast<std::size_t>(k))) break;
      }
      ::shutdown(in, SHUT_RDWR);
    });
    std::vector<std::byte> hello(40), proof(32); // the connector waits for the answer to its HELLO
    if (read_exact(in, hello.data(), hello.size()) && write_all(out, hello.data(), hello.size()) &&
        read_exact(in, proof.data(), proof.size()) && write_all(out, proof.data(), proof.size())) {
      keep(hello);
      keep(proof);
      for (std::size_t index = 0; !stop_; ++index) {
        std::byte h[48];
        if (!read_exact(in, h, 48)) break;
        std::uint32_t mb;
        std::uint64_t pb;
        std::memcpy(&mb, h + 4, 4);
        std::memcpy(&pb, h + 8, 8);
        if (mb > (std::uint32_t{64} << 20) || pb > (std::uint64_t{1} << 32)) break; // not a frame we can hold
        std::vector<std::byte> meta(mb), payload(static_cast<std::size_t>(pb));
        if (!read_exact(in, meta.data(), mb) || !read_exact(in, payload.data(), payload.size())) break;
        keep({h, 48});
        keep(meta);
        keep(payload);
        edit_(connection, index, meta, payload);
        mb = static_cast<std::uint32_t>(meta.size());
        pb = payload.size();
        const std::uint64_t mcheck = xxh3(meta.data(), meta.size());
        std::memcpy(h + 4, &mb, 4);
        std::memcpy(h + 8, &pb, 8);
        std::memcpy(h + 16, &mcheck, 8);
        const std::uint64_t hcheck = xxh3(h, 24);
        std::memcpy(h + 24, &hcheck, 8);
        if (!write_all(out, h, 48) || !write_all(out, meta.data(), meta.size()) ||
            !write_all(out, payload.data(), payload.size()))
          break;
      }
    }
    ::shutdown(out, SHUT_RDWR);
    ::shutdown(in, SHUT_RDWR);
    back.join();
  }
  void keep(std::span<const std::byte> b) {
    std::lock_guard lock(record_mu_);
    recorded_.insert(recorded_.end(), b.begin(), b.end());
  }

  editor edit_;
  std::thread thread_;
  std::mutex record_mu_;
  std::vector<std::byte> recorded_;
};

// A hostile network between two hosts: relays every connection to `target` (one at a time)
// with `delay` per chunk, now and then a stall, and now and then a reset (RST) of both sides
// mid-stream.
class chaos_relay : public relay_base {
public:
  struct plan {
    std::chrono::milliseconds delay{5};
    std::chrono::milliseconds stall{150};
    double stall_chance = 0.01;             //!< per chunk, besides:
    std::vector<int> stall_at{10, 50};      //!< the n-th chunks relayed (both directions)
    double reset_chance = 0.004;            //!< per chunk, besides:
    std::vector<int> reset_at{25, 70, 140}; //!< the n-th chunks relayed
  };
  chaos_relay(endpoint target, plan p, std::uint64_t seed, endpoint at = {})
      : relay_base(std::move(target), std::move(at)), p_(std::move(p)), rng_(seed) {}
  ~chaos_relay() { stop(); }
  //! Starts relaying (after any fork: the relay runs threads).
  void start() {
    thread_ = std::thread([this] { run(); });
  }
  void stop() {
    stop_serving();
    if (thread_.joinable()) thread_.join();
  }
  [[nodiscard]] int resets() const { return resets_.load(); }
  [[nodiscard]] int stalls() const { return stalls_.load(); }
  [[nodiscard]] int chunks() const { return chunks_.load(); }

private:
  void run() {
    while (!stop_) {
      int in = -1, out = -1;
      if (!next(in, out)) continue;
      std::atomic<bool> cut{false};
      std::thread a([&] { pump(in, out, cut); }), b([&] { pump(out, in, cut); });
      a.join();
      b.join();
      finish(in, out);
    }
  }
  // One direction; ends when either side closes, when the relay stops, or at a reset.
  void pump(int from, int to, std::atomic<bool>& cut) {
    std::byte buf[2048]; // small chunks: many chances for a fault
    while (!stop_ && !cut) {
      pollfd p{from, POLLIN, 0};
      if (::poll(&p, 1, 20) <= 0) continue;
      const ssize_t k = ::recv(from, buf, sizeof(buf), 0);
      if (k < 0 && errno == EINTR) continue;
      if (k <= 0) break;
      std::this_thread::sleep_for(p_.delay);
      double stall_draw, reset_draw;
      const int n = ++chunks_;
      {
        std::lock_guard lock(mu_);
        stall_draw = rng_.uniform();
        reset_draw = rng_.uniform();
      }
      const auto at = [n](const std::vector<int>& v) { return std::find(v.begin(), v.end(), n) != v.end(); };
      if (stall_draw < p_.stall_chance || at(p_.stall_at)) {
        ++stalls_;
        std::this_thread::sleep_for(p_.stall);
      }
      if ((reset_draw < p_.reset_chance || at(p_.reset_at)) && !cut.exchange(true)) {
        ++resets_;
        const linger hard{1, 0}; // close with RST: both hosts see the connection reset
        ::setsockopt(from, SOL_SOCKET, SO_LINGER, &hard, sizeof(hard));
        ::setsockopt(to, SOL_SOCKET, SO_LINGER, &hard, sizeof(hard));
        ::shutdown(from, SHUT_RDWR);
        ::shutdown(to, SHUT_RDWR);
        break;
      }
      if (!write_all(to, buf, static_cast<std::size_t>(k))) break;
    }
    cut = true;
    ::shutdown(to, SHUT_WR);
  }

  plan p_;
  std::mutex mu_;
  rlpt::test::rng rng_;
  std::atomic<int> resets_{0}, stalls_{0}, chunks_{0};
  std::thread thread_;
};

} // namespace rlpt::test::sync
