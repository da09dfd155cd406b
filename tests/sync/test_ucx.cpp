// SPDX-License-Identifier: Apache-2.0
// UCX transport (component ucx) across processes on loopback: dense and delta updates over
// UCX's own choice of transport and over TCP only, bit-exact; a sender killed mid-update
// leaves the previous version and a reconnecting sender succeeds; frames that break the
// format, the limits or the sequence are refused; a non-loopback address needs an
// authenticator; with component auth, the job's secret gets through and any other is refused.
#include "process.hpp"
#include "receiver_loop.hpp"
#include "ucx_frames.hpp"

#include <rlpt/sync/ucx.hpp>

#include <atomic>
#ifdef RLPT_TEST_UCX_AUTH
#include <rlpt/sync/auth_openssl.hpp>
#endif

using namespace rlpt::sync;
using namespace rlpt::test::sync;
using namespace std::chrono_literals;

namespace {

const plan_options small_buckets{.bucket_bytes = 1024, .alignment = 256};

// ucx_peer (a fresh program: UCX's process state does not survive a fork) publishing
// versions 1..n of model `seed` to 127.0.0.1:port, with ucx_peer's options.
pid_t start_sender(std::uint16_t port, std::uint64_t seed, std::uint64_t n, std::vector<std::string> options = {}) {
  std::vector<std::string> args{RLPT_UCX_PEER, std::to_string(port), std::to_string(seed), std::to_string(n)};
  args.insert(args.end(), options.begin(), options.end());
  return spawn([args] {
    std::vector<char*> argv;
    for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execv(argv[0], argv.data());
    throw std::runtime_error("execv ucx_peer failed");
  });
}

// A hand-made UCX peer (a thread): connects to 127.0.0.1:port, says a plain sender HELLO, then sends the
// given raw frames (AM header + data) as a broken or hostile rlpt peer would.
std::thread start_raw_peer(std::uint16_t port,
                           std::vector<std::pair<std::vector<std::byte>, std::vector<std::byte>>> frames) {
  return std::thread([port, frames] {
    ucp_config_t* cfg = nullptr;
    ucp_config_read(nullptr, nullptr, &cfg);
    ucp_params_t p{};
    p.field_mask = UCP_PARAM_FIELD_FEATURES;
    p.features = UCP_FEATURE_AM;
    ucp_context_h ctx = nullptr;
    const ucs_status_t s = ucp_init(&p, cfg, &ctx);
    ucp_config_release(cfg);
    REQUIRE(s == UCS_OK);
    ucp_worker_params_t wp{};
    ucp_worker_h w = nullptr;
    REQUIRE(ucp_worker_create(ctx, &wp, &w) == UCS_OK);
    ucp_am_handler_param_t hp{}; // the listener's HELLO answer: taken, not checked (this peer is rude)
    hp.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB;
    hp.id = detail::ucx_am_hello;
    hp.cb = [](void*, const void*, size_t, void*, size_t, const ucp_am_recv_param_t*) { return UCS_OK; };
    REQUIRE(ucp_worker_set_am_recv_handler(w, &hp) == UCS_OK);
    sockaddr_in a = detail::ipv4_address("127.0.0.1", port, rlpt::errors::sync::ucx, "raw");
    ucp_ep_params_t ep{};
    ep.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
    ep.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
    ep.sockaddr.addr = reinterpret_cast<const sockaddr*>(&a);
    ep.sockaddr.addrlen = sizeof(a);
    ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    ucp_ep_h e = nullptr;
    REQUIRE(ucp_ep_create(w, &ep, &e) == UCS_OK);
    auto send = [&](unsigned id, const std::vector<std::byte>& h, const std::vector<std::byte>& d) {
      ucp_request_param_t q{};
      q.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
      q.flags = UCP_AM_SEND_FLAG_REPLY;
      ucs_status_ptr_t r = ucp_am_send_nbx(e, id, h.data(), h.size(), d.data(), d.size(), &q);
      const auto until = clock::now() + 5s;
      while (UCS_PTR_IS_PTR(r) && ucp_request_check_status(r) == UCS_INPROGRESS && clock::now() < until)
        ucp_worker_progress(w);
      if (UCS_PTR_IS_PTR(r)) ucp_request_free(r);
    };
    std::vector<std::byte> hello(8);
    std::memcpy(hello.data(), &detail::ucx_plain_hello, 4);
    hello[4] = static_cast<std::byte>(role::sender);
    send(detail::ucx_am_hello, {}, hello);
    for (int i = 0; i < 50; ++i) { // time for the listener's answer
      ucp_worker_progress(w);
      std::this_thread::sleep_for(2ms);
    }
    for (const auto& [h, d] : frames) send(detail::ucx_am_frame, h, d);
    const auto until = clock::now() + 300ms; // let the frames go out before leaving
    while (clock::now() < until) ucp_worker_progress(w);
    ucp_request_param_t q{};
    q.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    q.flags = UCP_EP_CLOSE_FLAG_FORCE;
    ucs_status_ptr_t r = ucp_ep_close_nbx(e, &q);
    while (UCS_PTR_IS_PTR(r) && ucp_request_check_status(r) == UCS_INPROGRESS) ucp_worker_progress(w);
    if (UCS_PTR_IS_PTR(r)) ucp_request_free(r);
    ucp_worker_destroy(w);
    ucp_cleanup(ctx);
  });
}

// A frame header as the transport writes it without auth; `fix` edits it before the checksum.
std::vector<std::byte> frame_header(std::uint32_t meta_bytes, std::uint64_t payload_bytes, std::uint64_t meta_check,
                                    std::uint64_t seq) {
  std::vector<std::byte> h(detail::ucx_header_bytes);
  std::memcpy(h.data(), &detail::ucx_magic, 4);
  std::memcpy(h.data() + 4, &meta_bytes, 4);
  std::memcpy(h.data() + 8, &payload_bytes, 8);
  std::memcpy(h.data() + 16, &meta_check, 8);
  std::memcpy(h.data() + 24, &seq, 8);
  const std::uint64_t hcheck = xxh3(h.data(), 32);
  std::memcpy(h.data() + 32, &hcheck, 8);
  return h;
}

} // namespace

TEST_CASE("ucx: dense and delta updates across processes, bit-exact, over UCX's choice and over TCP only") {
  for (const std::string tls : {"", "tcp"}) {
    CAPTURE(tls);
    ucx_transport link({.listen = true, .transports = tls}, role::receiver);
    REQUIRE(link.port() != 0);
    // Buckets of 256 KiB: frames large enough for UCX's rendezvous protocol.
    std::vector<std::string> options{"--bucket-kib", "256"};
    if (!tls.empty()) options.insert(options.end(), {"--tls", tls});
    const pid_t child = start_sender(link.port(), 33, 4, options);
    sink s;
    receiver rx(link, s.fn());
    const auto ups = poll_n(rx, 4);
    REQUIRE(ups.size() == 4);
    for (std::size_t k = 0; k < 4; ++k) {
      CHECK(ups[k].published());
      CHECK(ups[k].delta == (k > 0));
    }
    model want = model_at(33, 4);
    check_mirror(rx, want);
    CHECK(wait_child(child) == 0);
    CHECK(link.auth_stats().handshakes == 1);
  }
}

TEST_CASE("ucx: frames of every shape arrive intact: meta only, payload only, both, meta beyond the headroom") {
  ucx_transport rx({.listen = true}, role::receiver);
  exchange_frames(
      rx, [&] { return std::make_unique<ucx_transport>(ucx_options{.port = rx.port()}, role::sender); },
      every_frame_shape);
}

TEST_CASE("ucx: a sender killed mid-update leaves the previous version, a reconnecting sender succeeds") {
  ucx_transport link({.listen = true, .transports = "tcp"}, role::receiver);
  const std::uint16_t port = link.port();
  sink s;
  receiver rx(link, s.fn(), {.timeout = 20s});
  const pid_t first = start_sender(port, 34, 2, {"--tls", "tcp", "--stall-at-version", "2"});
  auto ups = poll_n(rx, 1);
  REQUIRE(ups.size() == 1);
  REQUIRE(ups[0].published());
  auto killed_at = clock::now() + 1h;
  std::thread killer([&] {
    std::this_thread::sleep_for(300ms);
    killed_at = clock::now();
    ::kill(first, SIGKILL);
  });
  ups = poll_n(rx, 1);
  const auto seen_at = clock::now();
  killer.join();
  REQUIRE(ups.size() == 1);
  // UCX reports the closed connection through the endpoint's error handler.
  CHECK(seen_at - killed_at < 1s);
  CHECK(ups[0].failed());
  CHECK(ups[0].error_id == "rlpt.sync.peer_lost");
  CHECK(wait_child(first) == 128 + SIGKILL);
  model v1 = model_at(34, 1);
  check_mirror(rx, v1);
  const pid_t second = start_sender(port, 34, 2, {"--tls", "tcp", "--first", "2"});
  ups = poll_n(rx, 1);
  REQUIRE(ups.size() == 1);
  CHECK(ups[0].published());
  model v2 = model_at(34, 2);
  check_mirror(rx, v2);
  CHECK(wait_child(second) == 0);
}

TEST_CASE("ucx: frames that break the format, the limits or the sequence are refused") {
  ucx_transport link({.listen = true, .max_payload = 1 << 20, .transports = "tcp"}, role::receiver);
  const std::vector<std::byte> meta(16, std::byte{7});
  const std::uint64_t mcheck = xxh3(meta.data(), meta.size());
  struct bad {
    std::vector<std::byte> header;
    std::vector<std::byte> data;
    std::string why;
  };
  std::vector<bad> cases;
  auto h = frame_header(16, 0, mcheck, 0);
  h[0] = std::byte{0}; // magic
  cases.push_back({h, meta, "bad magic"});
  h = frame_header(16, 0, mcheck, 0);
  h[20] ^= std::byte{1}; // any byte under the header checksum
  cases.push_back({h, meta, "header checksum mismatch"});
  cases.push_back({frame_header(16, std::uint64_t{1} << 30, mcheck, 0), meta, "larger than max_payload"});
  cases.push_back({frame_header(16, 8, mcheck, 0), meta, "announces 16 meta + 8 payload bytes"});
  cases.push_back({frame_header(16, 0, mcheck, 5), meta, "frame 5 arrived where frame 0 was due"});
  cases.push_back({frame_header(16, 0, mcheck + 1, 0), meta, "fails its checksum"});
  h = frame_header(16, 0, mcheck, 0);
  h.resize(20);
  cases.push_back({h, meta, "a frame header of 20 bytes"});
  for (const bad& c : cases) {
    CAPTURE(c.why);
    std::thread peer = start_raw_peer(link.port(), {{c.header, c.data}});
    std::string error;
    const auto until = clock::now() + 5s;
    while (error.empty() && clock::now() < until) try {
        static_cast<void>(link.receive(after(50ms)));
      } catch (const rlpt::error& e) {
        if (std::string(e.id()) == "rlpt.sync.peer_lost") continue; // the previous raw peer leaving
        error = fmt::format("{}: {}", e.id(), e.what());
      }
    CAPTURE(error);
    CHECK(error.find("rlpt.sync.wire") == 0);
    CHECK(error.find(c.why) != std::string::npos);
    peer.join();
  }
  // A real sender still gets through afterwards.
  const pid_t child = start_sender(link.port(), 35, 1, {"--tls", "tcp"});
  sink s;
  receiver rx(link, s.fn());
  const auto ups = poll_n(rx, 1);
  REQUIRE(ups.size() == 1);
  CHECK(ups[0].published());
  model want = model_at(35, 1);
  check_mirror(rx, want);
  CHECK(wait_child(child) == 0);
}

TEST_CASE("ucx: two senders (or two receivers) are refused, and a connecting end with nobody listening times out") {
  ucx_transport link({.listen = true, .transports = "tcp"}, role::sender);
  const pid_t child = start_sender(link.port(), 36, 1, {"--tls", "tcp"});
  const auto until = clock::now() + 5s;
  while (link.auth_stats().refused_peers == 0 && clock::now() < until) try {
      static_cast<void>(link.receive(after(50ms)));
    } catch (const rlpt::error&) {}
  CHECK(link.auth_stats().refused_peers >= 1);
  CHECK(link.auth_stats().last_refusal.find("both ends are senders") != std::string::npos);
  CHECK(wait_child(child) != 0);

  std::uint16_t unused = 0;
  {
    ucx_transport probe({.listen = true, .transports = "tcp"}, role::receiver);
    unused = probe.port();
  }
  ucx_transport lonely({.port = unused, .transports = "tcp"}, role::sender);
  const auto t0 = clock::now();
  CHECK_THROWS_WITH_AS(lonely.send({}, 0, after(300ms)), doctest::Contains("connecting to the peer"), rlpt::error);
  CHECK(clock::now() - t0 < 3s);
}

TEST_CASE("ucx: a non-loopback address needs an authenticator or an explicit opt-out") {
  try {
    ucx_transport bad({.host = "10.1.2.3", .port = 5555}, role::sender);
    FAIL("no error");
  } catch (const rlpt::error& e) {
    CHECK(std::string(e.id()) == "rlpt.sync.insecure");
  }
  CHECK_NOTHROW(ucx_transport({.host = "10.1.2.3", .port = 5555, .allow_unauthenticated = true}, role::sender));
}

#ifdef RLPT_TEST_UCX_AUTH
TEST_CASE("ucx auth: the job's secret gets through in both integrity modes, any other peer is refused") {
  const std::string job_secret = "0123456789abcdef0123456789abcdef";
  const auto job = openssl_authenticator::from_string(job_secret);
  for (const integrity tags : {integrity::full, integrity::control}) {
    CAPTURE(name(tags));
    ucx_transport link({.listen = true, .auth = job, .tags = tags}, role::receiver);
    sink s;
    receiver rx(link, s.fn(), {.timeout = 2s});
    struct attempt {
      std::string secret; // empty: none
      integrity tags;
      std::string why;
    };
    const attempt attempts[] = {
        {"another job's secret, long enough", tags, "proof is wrong"},
        {"", tags, "did not start an authenticated handshake"},
        {job_secret, tags == integrity::full ? integrity::control : integrity::full, "asks for integrity::"},
    };
    for (const attempt& a : attempts) {
      CAPTURE(a.why);
      const std::uint64_t before = link.auth_stats().refused_peers;
      std::vector<std::string> options{"--tags", a.tags == integrity::full ? "full" : "control"};
      if (!a.secret.empty()) options.insert(options.end(), {"--secret", a.secret});
      const pid_t child = start_sender(link.port(), 37, 1, options);
      CHECK(serve_until_exit(rx, child) != 0);
      const auth_counters& c = link.auth_stats();
      REQUIRE(c.refused_peers > before);
      const std::size_t fresh = std::min<std::size_t>(c.refused_peers - before, c.recent_refusals.size());
      const std::string& first = c.recent_refusals[c.recent_refusals.size() - fresh];
      CAPTURE(first);
      CHECK(first.find(a.why) != std::string::npos);
      CHECK_FALSE(rx.has_version());
    }
    CHECK(link.auth_stats().handshakes == 0);
    const pid_t child = start_sender(link.port(), 37, 3,
                                     {"--tags", tags == integrity::full ? "full" : "control", "--secret", job_secret});
    const auto ups = poll_n(rx, 3);
    REQUIRE(ups.size() == 3);
    for (const update& u : ups) CHECK(u.published());
    model want = model_at(37, 3);
    check_mirror(rx, want);
    CHECK(wait_child(child) == 0);
    CHECK(link.auth_stats().handshakes == 1);
    CHECK(link.auth_stats().refused_frames == 0);
  }
}

TEST_CASE("ucx auth: a connecting end refuses a listener without the secret") {
  ucx_transport link({.listen = true, .auth = openssl_authenticator::from_string("another job's secret, long enough")},
                     role::sender);
  std::atomic<bool> done{false};
  std::thread serve([&] {
    while (!done) try {
        static_cast<void>(link.receive(after(20ms)));
      } catch (const rlpt::error&) {}
  });
  ucx_transport rx_link(
      {.port = link.port(), .auth = openssl_authenticator::from_string("0123456789abcdef0123456789abcdef")},
      role::receiver);
  std::string id;
  try {
    static_cast<void>(rx_link.receive(after(3s)));
  } catch (const rlpt::error& e) {
    id = e.id();
  }
  done = true;
  serve.join();
  CHECK(id == "rlpt.sync.auth");
  CHECK(rx_link.auth_stats().last_refusal.find("listening peer's proof is wrong") != std::string::npos);
}
#endif
