// SPDX-License-Identifier: Apache-2.0
// Authenticated TCP (auth.hpp over auth_openssl.hpp), across processes on loopback: updates
// with the job's secret in both integrity modes; peers without it, with another integrity
// mode, or replaying a recorded handshake are refused every time; frames altered in flight by
// a frame-aware relay (checksums recomputed, as an adversary would) are refused; the receiver
// stays on its version throughout and a real sender still gets through.
#include "process.hpp"
#include "receiver_loop.hpp"

#include <rlpt/sync/auth_openssl.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <functional>
#include <mutex>

using namespace rlpt::sync;
using namespace rlpt::test::sync;
using namespace std::chrono_literals;

namespace {

const plan_options small_buckets{.bucket_bytes = 1024, .alignment = 256};
constexpr std::string_view job_secret = "0123456789abcdef0123456789abcdef";

std::shared_ptr<const authenticator> key(std::string_view s = job_secret) {
  return openssl_authenticator::from_string(s);
}

// A child that publishes versions 1..n of model `seed` to 127.0.0.1:port.
pid_t start_sender(std::uint16_t port, std::shared_ptr<const authenticator> auth, integrity tags, std::uint64_t seed,
                   std::uint64_t n = 1) {
  return spawn([=] {
    model md = model_at(seed, 1);
    tcp_transport out({.port = port, .auth = auth, .tags = tags}, role::sender);
    sender tx(out, plan(md.refs, small_buckets), md.refs, {.delta = true, .timeout = 5s});
    for (std::uint64_t v = 1; v <= n; ++v) {
      if (v > 1) {
        rlpt::test::rng r(2000 + v);
        md.step(0.02, r);
      }
      tx.publish(v);
    }
  });
}

int listen_loopback(std::uint16_t& port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
  REQUIRE(::listen(fd, 4) == 0);
  socklen_t len = sizeof(a);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  port = ntohs(a.sin_port);
  return fd;
}

int connect_loopback(std::uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
  return fd;
}

bool read_exact(int fd, std::byte* p, std::size_t n) {
  while (n > 0) {
    const ssize_t k = ::recv(fd, p, n, 0);
    if (k <= 0) return false;
    p += k;
    n -= static_cast<std::size_t>(k);
  }
  return true;
}

bool write_all(int fd, const std::byte* p, std::size_t n) {
  while (n > 0) {
    const ssize_t k = ::send(fd, p, n, MSG_NOSIGNAL);
    if (k <= 0) return false;
    p += k;
    n -= static_cast<std::size_t>(k);
  }
  return true;
}

// A man in the middle on loopback: accepts one connection, connects to `target`, and relays
// both ways. From the connecting side it records every byte and parses the stream as the
// handshake (72 bytes) followed by TCP frames, passing each frame to `edit` (which may change
// it) and then recomputing the frame's XXH3 checks, as an adversary would.
class relay {
public:
  using editor = std::function<void(std::size_t index, std::vector<std::byte>& meta, std::vector<std::byte>& payload)>;

  relay(std::uint16_t target, editor edit) : target_(target), edit_(std::move(edit)) {
    listen_ = listen_loopback(port_);
  }
  ~relay() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
    ::close(listen_);
  }
  [[nodiscard]] std::uint16_t port() const { return port_; }
  void start() {
    thread_ = std::thread([this] { run(); });
  }
  std::vector<std::byte> recorded() {
    std::lock_guard lock(mu_);
    return recorded_;
  }

private:
  void run() {
    pollfd p{listen_, POLLIN, 0};
    while (!stop_ && ::poll(&p, 1, 50) <= 0) {}
    if (stop_) return;
    const int in = ::accept(listen_, nullptr, nullptr), out = connect_loopback(target_);
    std::thread back([&] { // listener -> connector, untouched
      std::byte buf[4096];
      for (;;) {
        const ssize_t k = ::recv(out, buf, sizeof(buf), 0);
        if (k <= 0 || !write_all(in, buf, static_cast<std::size_t>(k))) break;
      }
      ::shutdown(in, SHUT_RDWR);
    });
    std::vector<std::byte> hello(40), proof(32); // the connector waits for the answer to its HELLO
    if (read_exact(in, hello.data(), hello.size()) && write_all(out, hello.data(), hello.size()) &&
        read_exact(in, proof.data(), proof.size()) && write_all(out, proof.data(), proof.size())) {
      keep(hello);
      keep(proof);
      for (std::size_t index = 0;; ++index) {
        std::byte h[48];
        if (!read_exact(in, h, 48)) break;
        std::uint32_t mb;
        std::uint64_t pb;
        std::memcpy(&mb, h + 4, 4);
        std::memcpy(&pb, h + 8, 8);
        std::vector<std::byte> meta(mb), payload(static_cast<std::size_t>(pb));
        if (!read_exact(in, meta.data(), mb) || !read_exact(in, payload.data(), payload.size())) break;
        keep({h, 48});
        keep(meta);
        keep(payload);
        edit_(index, meta, payload);
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
    ::close(in);
    ::close(out);
  }
  void keep(std::span<const std::byte> b) {
    std::lock_guard lock(mu_);
    recorded_.insert(recorded_.end(), b.begin(), b.end());
  }

  std::uint16_t target_, port_ = 0;
  editor edit_;
  int listen_ = -1;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  std::mutex mu_;
  std::vector<std::byte> recorded_;
};

// Polls the receiver until the child exits; its exit code (-1: killed after 20 s).
int serve_until_exit(receiver& rx, pid_t child) {
  const auto until = clock::now() + 20s;
  while (clock::now() < until) {
    int status = 0;
    if (::waitpid(child, &status, WNOHANG) == child)
      return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    static_cast<void>(rx.poll(20ms));
  }
  return wait_child(child, 0ms);
}

// A hostile network between two hosts: relays every connection to `target` with `delay` per
// chunk, now and then a stall, and now and then a reset (RST) of both sides mid-stream.
class chaos_relay {
public:
  struct plan {
    std::chrono::milliseconds delay{5};
    std::chrono::milliseconds stall{150};
    double stall_chance = 0.01;             //!< per chunk, besides:
    std::vector<int> stall_at{10, 50};      //!< the n-th chunks relayed (both directions)
    double reset_chance = 0.004;            //!< per chunk, besides:
    std::vector<int> reset_at{25, 70, 140}; //!< the n-th chunks relayed
  };
  chaos_relay(std::uint16_t target, plan p, std::uint64_t seed) : target_(target), p_(p), rng_(seed) {
    listen_ = listen_loopback(port_);
  }
  ~chaos_relay() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
    ::close(listen_);
  }
  //! Starts relaying (after any fork: the relay runs threads).
  void start() {
    thread_ = std::thread([this] { run(); });
  }
  [[nodiscard]] std::uint16_t port() const { return port_; }
  [[nodiscard]] int resets() const { return resets_.load(); }
  [[nodiscard]] int stalls() const { return stalls_.load(); }

private:
  void run() {
    while (!stop_) {
      pollfd p{listen_, POLLIN, 0};
      if (::poll(&p, 1, 20) <= 0) continue;
      const int in = ::accept(listen_, nullptr, nullptr), out = connect_loopback(target_);
      std::atomic<bool> cut{false};
      std::thread a([&] { pump(in, out, cut); }), b([&] { pump(out, in, cut); });
      a.join();
      b.join();
      ::close(in);
      ::close(out);
    }
  }
  // One direction; ends when either side closes, when the relay stops, or at a reset.
  void pump(int from, int to, std::atomic<bool>& cut) {
    std::byte buf[2048]; // small chunks: many chances for a fault
    while (!stop_ && !cut) {
      pollfd p{from, POLLIN, 0};
      if (::poll(&p, 1, 20) <= 0) continue;
      const ssize_t k = ::recv(from, buf, sizeof(buf), 0);
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

  std::uint16_t target_, port_ = 0;
  plan p_;
  std::mutex mu_;
  rlpt::test::rng rng_;
  int listen_ = -1;
  std::atomic<bool> stop_{false};
  std::atomic<int> resets_{0}, stalls_{0}, chunks_{0};
  std::thread thread_;
};

// Rewrites a frame's body and re-seals its protocol checksum (frame.hpp), as an adversary can.
void reseal(std::vector<std::byte>& meta) {
  xxh3_stream h;
  h.update(meta.data(), 64);
  h.update(meta.data() + frame_header_bytes, meta.size() - frame_header_bytes);
  const std::uint64_t sum = h.digest();
  std::memcpy(meta.data() + 64, &sum, 8);
}

} // namespace

TEST_CASE("tcp auth: updates with the job's secret in both integrity modes") {
  for (const integrity tags : {integrity::full, integrity::control}) {
    CAPTURE(name(tags));
    const int fds = open_fds();
    {
      tcp_transport link({.listen = true, .auth = key(), .tags = tags}, role::receiver);
      const pid_t child = start_sender(link.port(), key(), tags, 41, 3);
      sink s;
      receiver rx(link, s.fn());
      const auto ups = poll_n(rx, 3);
      REQUIRE(ups.size() == 3);
      for (const update& u : ups) CHECK(u.published());
      model want = model_at(41, 3);
      check_mirror(rx, want);
      CHECK(wait_child(child) == 0);
      CHECK(link.auth_stats().handshakes == 1);
      CHECK(link.auth_stats().refused_peers == 0);
      CHECK(link.auth_stats().refused_frames == 0);
    }
    CHECK(open_fds() == fds);
  }
}

TEST_CASE("tcp auth: peers without the secret, without auth, or in another integrity mode are refused every time") {
  tcp_transport link({.listen = true, .auth = key()}, role::receiver);
  sink s;
  receiver rx(link, s.fn(), {.timeout = 2s});
  struct attempt {
    std::shared_ptr<const authenticator> auth;
    integrity tags;
    std::string why;
  };
  const attempt attempts[] = {
      {key("another job's secret, long enough"), integrity::full, "proof is wrong"},
      {key("another job's secret, long enough"), integrity::full, "proof is wrong"},
      {nullptr, integrity::full, "did not start an authenticated handshake"},
      {key(), integrity::control, "asks for integrity::control and this end for integrity::full"},
  };
  for (const attempt& a : attempts) {
    const std::uint64_t before = link.auth_stats().refused_peers;
    const pid_t child = start_sender(link.port(), a.auth, a.tags, 42);
    CHECK(serve_until_exit(rx, child) != 0); // its publish failed
    const auth_counters& c = link.auth_stats();
    REQUIRE(c.refused_peers > before);
    // Its first refusal (a refused sender may try again, or close without a word).
    const std::size_t fresh = std::min<std::size_t>(c.refused_peers - before, c.recent_refusals.size());
    const std::string& first = c.recent_refusals[c.recent_refusals.size() - fresh];
    CAPTURE(first);
    CHECK(first.find(a.why) != std::string::npos);
    CHECK_FALSE(rx.has_version());
  }
  CHECK(link.auth_stats().handshakes == 0);
  // The job's own sender gets through.
  const pid_t child = start_sender(link.port(), key(), integrity::full, 42);
  const auto ups = poll_n(rx, 1);
  REQUIRE(ups.size() == 1);
  CHECK(ups[0].published());
  model want = model_at(42, 1);
  check_mirror(rx, want);
  CHECK(wait_child(child) == 0);
}

TEST_CASE("tcp auth: a connecting end refuses a listener without the secret") {
  tcp_transport link({.listen = true, .auth = key("another job's secret, long enough")}, role::sender);
  const std::uint16_t port = link.port();
  const pid_t child = spawn([port] {
    tcp_transport in({.port = port, .auth = key()}, role::receiver);
    sink s;
    receiver rx(in, s.fn());
    const auto until = clock::now() + 10s;
    while (in.auth_stats().refused_peers == 0 && clock::now() < until) static_cast<void>(rx.poll(20ms));
    if (in.auth_stats().refused_peers == 0 || rx.has_version()) std::_Exit(2);
    if (rx.last_link_error().find("rlpt.sync.auth") == std::string::npos &&
        rx.last_link_error().find("the listening peer's proof is wrong") == std::string::npos)
      std::_Exit(3);
  });
  // The listener answers handshakes while it tries to publish; the child checks the refusal.
  model md = model_at(43, 1);
  sender tx(link, plan(md.refs, small_buckets), md.refs, {.timeout = 1s});
  for (int k = 0; k < 3; ++k) CHECK_THROWS(tx.publish(1));
  CHECK(wait_child(child) == 0);
  CHECK(link.auth_stats().handshakes == 0);
}

TEST_CASE("tcp auth: a recorded handshake replayed is refused") {
  tcp_transport link({.listen = true, .auth = key()}, role::receiver);
  relay mitm(link.port(), [](std::size_t, std::vector<std::byte>&, std::vector<std::byte>&) {});
  const pid_t child = start_sender(mitm.port(), key(), integrity::full, 44);
  mitm.start();
  sink s;
  receiver rx(link, s.fn());
  auto ups = poll_n(rx, 1);
  REQUIRE(ups.size() == 1);
  CHECK(ups[0].published());
  CHECK(wait_child(child) == 0);
  const std::uint64_t version = rx.version();
  // Replay everything the sender sent (its HELLO, proof and frames) on fresh connections.
  const std::vector<std::byte> recorded = mitm.recorded();
  REQUIRE(recorded.size() > 72);
  for (int k = 0; k < 3; ++k) {
    const int fd = connect_loopback(link.port());
    std::thread replay([&] { write_all(fd, recorded.data(), recorded.size()); });
    const auto until = clock::now() + 10s;
    while (link.auth_stats().refused_peers == static_cast<std::uint64_t>(k) && clock::now() < until)
      static_cast<void>(rx.poll(20ms));
    ::shutdown(fd, SHUT_RDWR);
    replay.join();
    ::close(fd);
    CHECK(link.auth_stats().refused_peers == static_cast<std::uint64_t>(k + 1));
    CHECK(link.auth_stats().last_refusal.find("replayed a recorded handshake") != std::string::npos);
  }
  CHECK(rx.version() == version);
  CHECK(link.auth_stats().handshakes == 1);
}

TEST_CASE("tcp auth: frames altered in flight are refused and the receiver stays on its version") {
  struct tamper {
    std::string what;
    integrity tags;
    std::function<void(std::vector<std::byte>&, std::vector<std::byte>&)> edit;
    std::string error_id;
  };
  // The first frame of an update is BEGIN (its body the manifest JSON); then BUCKETs, COMMIT.
  const tamper cases[] = {
      {"manifest", integrity::control,
       [](std::vector<std::byte>& meta, std::vector<std::byte>&) {
         REQUIRE(type_of(meta) == frame_type::begin);
         meta.back() = std::byte{' '}; // the JSON's closing brace
         reseal(meta);
       },
       "rlpt.sync.auth"},
      {"payload byte (full)", integrity::full,
       [](std::vector<std::byte>&, std::vector<std::byte>& payload) {
         if (!payload.empty()) payload[payload.size() / 2] ^= std::byte{1};
       },
       "rlpt.sync.auth"},
      // With control-only tags the MACed piece checksums still catch a changed byte (an
      // accident, or an adversary who cannot find an XXH3 collision for the piece).
      {"payload byte (control)", integrity::control,
       [](std::vector<std::byte>&, std::vector<std::byte>& payload) {
         if (!payload.empty()) payload[payload.size() / 2] ^= std::byte{1};
       },
       "rlpt.sync.checksum"},
  };
  for (const tamper& t : cases) {
    CAPTURE(t.what);
    tcp_transport link({.listen = true, .auth = key(), .tags = t.tags}, role::receiver);
    std::atomic<int> edited{0};
    relay mitm(link.port(), [&](std::size_t, std::vector<std::byte>& meta, std::vector<std::byte>& payload) {
      const bool want = t.what == "manifest" ? type_of(meta) == frame_type::begin : !payload.empty();
      if (want && edited++ == 0) t.edit(meta, payload);
    });
    const pid_t child = start_sender(mitm.port(), key(), t.tags, 45);
    mitm.start();
    sink s;
    receiver rx(link, s.fn(), {.timeout = 2s});
    const auto until = clock::now() + 10s;
    update u;
    while (!u.failed() && clock::now() < until) u = rx.poll(20ms);
    CHECK(edited.load() >= 1);
    CHECK_FALSE(rx.has_version());
    if (u.failed()) {
      CHECK(u.error_id == t.error_id);
    } else { // refused between updates (the BEGIN itself): only the link saw it
      CHECK(rx.last_link_error().find("failed its") != std::string::npos);
    }
    if (t.error_id == "rlpt.sync.auth") CHECK(link.auth_stats().refused_frames == 1);
    CHECK(wait_child(child) != 0);
  }
}

TEST_CASE("tcp auth: through 5 ms of delay, stalls and reset connections every version arrives bit-exact") {
  tcp_transport link({.listen = true, .auth = key()}, role::receiver);
  chaos_relay net(link.port(), {}, 7);
  const std::uint16_t port = net.port();
  constexpr std::uint64_t versions = 6;
  // The trainer publishes each version until it goes through (a reset fails the attempt).
  const pid_t child = spawn([port] {
    model md = model_at(46, 1, 2000, 12);
    tcp_transport out({.port = port, .auth = key()}, role::sender);
    sender tx(out, plan(md.refs, small_buckets), md.refs, {.delta = true, .timeout = 5s});
    int failures = 0;
    for (std::uint64_t v = 1; v <= versions; ++v) {
      if (v > 1) {
        rlpt::test::rng r(2000 + v);
        md.step(0.02, r);
      }
      for (int attempt = 0;; ++attempt) {
        try {
          tx.publish(v);
          break;
        } catch (const rlpt::error& e) {
          std::fprintf(stderr, "sender: version %llu attempt %d: %s\n", static_cast<unsigned long long>(v), attempt,
                       e.what());
          if (attempt == 30) throw;
          ++failures;
        }
      }
    }
    std::printf("sender: %d failed attempts\n", failures);
  });
  net.start();
  sink s;
  receiver rx(link, s.fn(), {.timeout = 3s});
  std::uint64_t published = 0, failed = 0;
  const auto until = clock::now() + 120s;
  while ((!rx.has_version() || rx.version() < versions) && clock::now() < until) {
    const update u = rx.poll(20ms);
    if (u.failed()) {
      if (failed < 12) MESSAGE("failed: ", u.version, " ", u.error_id, " ", u.reason);
      ++failed;
      CHECK(rx.has_version() == (rx.version() > 0)); // failures leave the last version as it was
    }
    if (!u.published()) continue;
    ++published;
    model want = model_at(46, u.version, 2000, 12); // every published version is exactly the trainer's
    check_mirror(rx, want);
  }
  CHECK(rx.version() == versions);
  CHECK(wait_child(child) == 0);
  MESSAGE("relay: ", net.resets(), " resets, ", net.stalls(), " stalls; receiver: ", published, " published, ", failed,
          " failed; handshakes ", link.auth_stats().handshakes);
  CHECK(link.auth_stats().refused_frames == 0);
  CHECK(net.resets() >= 3); // the faults did happen
  CHECK(net.stalls() >= 2);
  CHECK(failed >= 1);
}

TEST_CASE("tcp auth: secrets shorter than 128 bits are refused") {
  RLPT_CHECK_ERROR(static_cast<void>(openssl_authenticator::from_string("short")), "rlpt.sync.bad_link",
                   "the secret has 5 bytes; at least 16 are required");
  RLPT_CHECK_ERROR(static_cast<void>(openssl_authenticator::from_env("RLPT_TEST_NO_SUCH_VARIABLE")),
                   "rlpt.sync.bad_link", "environment variable RLPT_TEST_NO_SUCH_VARIABLE");
  CHECK(key()->describe().find("OpenSSL") != std::string::npos);
}
