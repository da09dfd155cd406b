// SPDX-License-Identifier: Apache-2.0
// Authenticated TCP (auth.hpp over auth_openssl.hpp), across processes on loopback: updates
// with the job's secret in both integrity modes; peers without it, with another integrity
// mode, or replaying a recorded handshake are refused every time; frames altered in flight by
// a frame-aware relay (checksums recomputed, as an adversary would) are refused; the receiver
// stays on its version throughout and a real sender still gets through.
#include "process.hpp"
#include "receiver_loop.hpp"
#include "relay.hpp"

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
  frame_relay mitm({"127.0.0.1", link.port()},
                   [](std::size_t, std::size_t, std::vector<std::byte>&, std::vector<std::byte>&) {});
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
    REQUIRE(fd >= 0);
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
    frame_relay mitm({"127.0.0.1", link.port()},
                     [&](std::size_t, std::size_t, std::vector<std::byte>& meta, std::vector<std::byte>& payload) {
                       const bool want = t.what == "manifest" ? type_of(meta) == frame_type::begin : !payload.empty();
                       if (want && edited++ == 0) t.edit(meta, payload);
                     });
    const pid_t child = start_sender(mitm.port(), key(), t.tags, 45);
    mitm.start();
    sink s;
    receiver rx(link, s.fn(), {.timeout = 2s});
    const auto until = clock::now() + 10s;
    update u;
    // Until the update fails, or the link refuses a frame between updates (the BEGIN itself).
    while (!u.failed() && link.auth_stats().refused_frames == 0 && clock::now() < until) u = rx.poll(20ms);
    CHECK(edited.load() >= 1);
    CHECK_FALSE(rx.has_version());
    if (u.failed()) {
      CHECK(u.error_id == t.error_id);
    } else { // refused between updates (the BEGIN itself): only the link saw it
      CHECK(link.auth_stats().last_refusal.find("failed its") != std::string::npos);
    }
    if (t.error_id == "rlpt.sync.auth") CHECK(link.auth_stats().refused_frames == 1);
    CHECK(wait_child(child) != 0);
  }
}

TEST_CASE("tcp auth: through 5 ms of delay, stalls and reset connections every version arrives bit-exact") {
  tcp_transport link({.listen = true, .auth = key()}, role::receiver);
  chaos_relay net({"127.0.0.1", link.port()}, {}, 7);
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
