// SPDX-License-Identifier: Apache-2.0
// Host side of the device transports: CUDA IPC envelopes and HELLO, the importer's mapping
// cache (opened once per session, nothing leaks over 100 updates), the NCCL bootstrap
// messages, and the unix-socket link that passes file descriptors (SCM_RIGHTS).
#include "sync_support.hpp"

#include <rlpt/cuda/sync/ipc_wire.hpp>
#include <rlpt/cuda/sync/nccl_wire.hpp>
#include <rlpt/cuda/sync/unix_link.hpp>

#include <fcntl.h>
#include <csignal>
#include <sys/mman.h>

using namespace rlpt::sync;
using rlpt::test::rng;
using rlpt::test::sync::mutate;

namespace {

std::span<const std::byte> bytes_of(std::string_view s) { return as_bytes(s); }

ipc_hello sample_hello() {
  ipc_hello h;
  h.session = 0x1122334455667788ull;
  h.pid = 4242;
  h.kind = ipc_handle_kind::legacy;
  for (unsigned i = 0; i < 16; ++i) h.gpu_uuid[i] = static_cast<unsigned char>(0xa0 + i);
  for (unsigned i = 0; i < 64; ++i) h.legacy[i] = static_cast<unsigned char>(i * 3);
  h.map_bytes = 4 << 20;
  h.offset = 256;
  h.slots = 2;
  h.slot_bytes = 1 << 20;
  h.slot_stride = 1 << 20;
  return h;
}

bool fd_open(int fd) { return ::fcntl(fd, F_GETFD) != -1; }

} // namespace

TEST_CASE("device sync wire: a frame's header is peeked as it was encoded, and labels its payload") {
  std::vector<std::byte> meta;
  const std::string body = "manifest";
  encode_frame(meta, frame_type::bucket, /*tag=*/7, /*version=*/42, /*base_version=*/41, /*index=*/3, /*count=*/9,
               /*payload_bytes=*/1 << 20, as_bytes(body));
  frame_peek p = peek_frame(meta);
  CHECK(p.type == static_cast<std::uint16_t>(frame_type::bucket));
  CHECK(p.version == 42);
  CHECK(p.index == 3);
  CHECK(p.payload_bytes == (1u << 20));
  const frame f = decode_frame(meta, "test");
  CHECK(f.payload_bytes == p.payload_bytes);
  CHECK(payload_label(meta) == "bucket 3 of version 42");

  encode_frame(meta, frame_type::delta, 7, 43, 42, 5, 9, 4096, {});
  CHECK(payload_label(meta) == "delta chunk 5 of version 43");
  encode_frame(meta, frame_type::begin, 7, 44, 0, 0, 1, 0, {});
  CHECK(payload_label(meta) == "a payload of version 44");
  CHECK(peek_frame(meta).payload_bytes == 0);

  // Shorter than a header: nothing is read past the block, every field is zero.
  meta.resize(frame_header_bytes - 1);
  p = peek_frame(meta);
  CHECK(p.type == 0);
  CHECK(p.version == 0);
  CHECK(p.index == 0);
  CHECK(p.payload_bytes == 0);
  CHECK(payload_label(meta) == "a payload");
  CHECK(payload_label({}) == "a payload");
}

TEST_CASE("device sync wire: IPC envelopes round-trip and every damaged byte is detected") {
  std::vector<std::byte> e;
  encode_envelope(e, ipc_kind::msg, 1, 12345, bytes_of("frame bytes"));
  CHECK(is_envelope(e));
  const ipc_envelope d = decode_envelope(e, "ipc");
  CHECK(d.kind == ipc_kind::msg);
  CHECK(d.slot == 1);
  CHECK(d.payload_bytes == 12345);
  CHECK(as_chars(d.body) == "frame bytes");
  for (std::size_t i = 0; i < e.size(); ++i) {
    auto bad = e;
    bad[i] ^= std::byte{0x04};
    bool threw = false;
    try {
      static_cast<void>(decode_envelope(bad, "ipc"));
    } catch (const rlpt::error& err) {
      threw = true;
      CHECK(err.id() == "rlpt.sync.wire");
    }
    CHECK_MESSAGE(threw, "byte ", i, " flipped went unnoticed");
  }
  RLPT_CHECK_ERROR(decode_envelope(std::span<const std::byte>(e).first(10), "ipc"), "rlpt.sync.wire", "10 bytes",
                   "32-byte");
  CHECK_FALSE(is_envelope(bytes_of("RLSF....")));
  rng r(11);
  for (int k = 0; k < 2000; ++k) { // fuzz: a clear error or a valid envelope, never a crash
    const auto m = mutate(e, r);
    try {
      static_cast<void>(decode_envelope(m, "ipc"));
    } catch (const rlpt::error& err) {
      CHECK(err.id() == "rlpt.sync.wire");
    }
  }
}

TEST_CASE("device sync wire: HELLO round-trips and bad geometry or descriptor counts are refused") {
  const ipc_hello h = sample_hello();
  const auto body = encode_hello(h);
  CHECK(body.size() == ipc_hello_bytes);
  const ipc_hello g = decode_hello(body, "ipc");
  CHECK(g.session == h.session);
  CHECK(g.pid == h.pid);
  CHECK(g.kind == h.kind);
  CHECK(g.gpu_uuid == h.gpu_uuid);
  CHECK(g.legacy == h.legacy);
  CHECK(g.map_bytes == h.map_bytes);
  CHECK(g.offset == h.offset);
  CHECK(g.slots == h.slots);
  CHECK(g.slot_bytes == h.slot_bytes);
  CHECK(g.slot_stride == h.slot_stride);
  CHECK(uuid_text(h.gpu_uuid) == "GPU-a0a1a2a3-a4a5-a6a7-a8a9-aaabacadaeaf");

  auto with = [](auto f) {
    ipc_hello x = sample_hello();
    f(x);
    return encode_hello(x);
  };
  RLPT_CHECK_ERROR(decode_hello(with([](ipc_hello& x) { x.slots = 4; }), "ipc"), "rlpt.sync.wire", "past the",
                   "4194304-byte mapping", "4 slots");
  RLPT_CHECK_ERROR(decode_hello(with([](ipc_hello& x) { x.slot_stride = 100; }), "ipc"), "rlpt.sync.wire", "geometry");
  RLPT_CHECK_ERROR(decode_hello(with([](ipc_hello& x) { x.slots = 0; }), "ipc"), "rlpt.sync.wire", "0 slots");
  RLPT_CHECK_ERROR(decode_hello(with([](ipc_hello& x) { x.slots = 1u << 31; }), "ipc"), "rlpt.sync.wire", "geometry");
  RLPT_CHECK_ERROR(decode_hello(with([](ipc_hello& x) {
                                  x.slot_stride = std::uint64_t{1} << 62;
                                  x.slots = 8;
                                }),
                                "ipc"),
                   "rlpt.sync.wire", "past the");
  RLPT_CHECK_ERROR(decode_hello(with([](ipc_hello& x) { x.kind = ipc_handle_kind::posix_fd; }), "ipc"),
                   "rlpt.sync.wire", "posix_fd HELLO must carry 1 descriptors", "says 0");
  RLPT_CHECK_ERROR(decode_hello(with([](ipc_hello& x) { x.fds = 1; }), "ipc"), "rlpt.sync.wire", "legacy HELLO");
  auto k = body;
  k[12] = std::byte{7};
  RLPT_CHECK_ERROR(decode_hello(k, "ipc"), "rlpt.sync.wire", "handle kind 7");
  RLPT_CHECK_ERROR(decode_hello(std::span<const std::byte>(body).first(100), "ipc"), "rlpt.sync.wire", "100 bytes");
}

namespace {

// Stands in for the CUDA opener: counts opens and closes, checks the fd it is handed.
struct counting_opener {
  int opened = 0, closed = 0;
  std::vector<int> fds_seen;
  bool fail_next = false;
  ipc_mapping open(const ipc_hello& h, int fd) {
    RLPT_CHECK(!fail_next, rlpt::errors::sync::ipc, "mapping refused for session {}", h.session);
    if (fd >= 0) fds_seen.push_back(fd);
    ++opened;
    ipc_mapping m;
    m.session = h.session;
    m.gpu_uuid = h.gpu_uuid;
    m.kind = h.kind;
    m.map_bytes = h.map_bytes;
    m.mapped = this;  // any non-null address
    m.base = nullptr; // never dereferenced here
    return m;
  }
  void close(ipc_mapping& m) noexcept {
    ++closed;
    m.mapped = nullptr;
  }
};

} // namespace

TEST_CASE("device sync wire: the importer maps a session once and leaks nothing over 100 updates") {
  ipc_import_cache<counting_opener> cache;
  ipc_hello h = sample_hello();
  h.kind = ipc_handle_kind::posix_fd;
  h.fds = 1;
  std::vector<int> handed;
  for (int update = 0; update < 100; ++update) { // the exporter says HELLO before every update
    int p[2];
    REQUIRE(::pipe(p) == 0);
    ::close(p[1]);
    handed.push_back(p[0]);
    const ipc_mapping& m = cache.acquire(h, p[0]);
    CHECK(m.session == h.session);
    CHECK(!fd_open(p[0])); // the cache closes every descriptor it was given
  }
  CHECK(cache.opens() == 1);
  CHECK(cache.hits() == 99);
  CHECK(cache.size() == 1);
  CHECK(cache.opener().opened == 1);
  // A new export session (the exporter restarted) replaces the mapping.
  h.session += 1;
  static_cast<void>(cache.acquire(h, -1));
  CHECK(cache.opens() == 2);
  CHECK(cache.closes() == 1);
  CHECK(cache.size() == 1);
  // Another GPU gets its own mapping; a failed open leaves the others alone.
  ipc_hello other = sample_hello();
  other.gpu_uuid[0] = 0x01;
  static_cast<void>(cache.acquire(other, -1));
  CHECK(cache.size() == 2);
  cache.opener().fail_next = true;
  ipc_hello third = sample_hello();
  third.gpu_uuid[0] = 0x02;
  int p[2];
  REQUIRE(::pipe(p) == 0);
  ::close(p[1]);
  RLPT_CHECK_ERROR(static_cast<void>(cache.acquire(third, p[0])), "rlpt.sync.ipc", "mapping refused");
  CHECK(!fd_open(p[0])); // closed on the error path too
  CHECK(cache.size() == 2);
  cache.opener().fail_next = false;
  CHECK(cache.release(other.gpu_uuid));
  CHECK_FALSE(cache.release(other.gpu_uuid));
  cache.release_all();
  CHECK(cache.size() == 0);
  CHECK(cache.opens() == cache.closes());
}

TEST_CASE("device sync wire: NCCL bootstrap messages round-trip, and damage and impossible ranks are refused") {
  nccl_init_msg m;
  m.epoch = 3;
  m.ranks = 4;
  m.rank = 2;
  m.root = 0;
  for (std::size_t i = 0; i < m.id.size(); ++i) m.id[i] = static_cast<unsigned char>(i ^ 0x5a);
  const auto init = encode_nccl_init(m);
  CHECK(init.size() == nccl_init_bytes);
  CHECK(nccl_boot_kind(init) == 1);
  const nccl_init_msg d = decode_nccl_init(init, "boot");
  CHECK(d.epoch == 3);
  CHECK(d.ranks == 4);
  CHECK(d.rank == 2);
  CHECK(d.root == 0);
  CHECK(d.id == m.id);
  const auto join = encode_nccl_join({7, 2, 999});
  CHECK(nccl_boot_kind(join) == 2);
  const nccl_join_msg j = decode_nccl_join(join, "boot");
  CHECK(j.epoch == 7);
  CHECK(j.rank == 2);
  CHECK(j.pid == 999);
  std::vector<std::byte> frame;
  encode_frame(frame, frame_type::begin, 1, 1, 0, 0, 0, 0, {});
  CHECK(nccl_boot_kind(frame) == 0); // protocol frames are not mistaken for bootstrap messages
  for (std::size_t i = 0; i < init.size(); ++i) {
    auto bad = init;
    bad[i] ^= std::byte{0x20};
    bool threw = false;
    try {
      static_cast<void>(decode_nccl_init(bad, "boot"));
    } catch (const rlpt::error& e) {
      threw = e.id() == "rlpt.sync.wire";
    }
    CHECK_MESSAGE(threw, "byte ", i);
  }
  nccl_init_msg self = m;
  self.rank = 0; // the root itself
  RLPT_CHECK_ERROR(decode_nccl_init(encode_nccl_init(self), "boot"), "rlpt.sync.wire", "rank 0 and root 0 of 4");
  self.rank = 4;
  RLPT_CHECK_ERROR(decode_nccl_init(encode_nccl_init(self), "boot"), "rlpt.sync.wire", "rank 4");
  RLPT_CHECK_ERROR(decode_nccl_join(init, "boot"), "rlpt.sync.wire", "JOIN", std::to_string(nccl_init_bytes));
}

TEST_CASE("device sync wire: unix_link carries frames and passes file descriptors") {
  auto fds = unix_socketpair();
  unix_link a(fds[0], role::sender);
  unix_link b(fds[1], role::receiver);
  CHECK(a.peer_pid() == ::getpid());
  // A memfd stands in for a VMM export: the receiver reads the sender's bytes through its copy.
  const int mem = ::memfd_create("rlpt-test", MFD_CLOEXEC);
  REQUIRE(mem >= 0);
  REQUIRE(::write(mem, "exported", 8) == 8);
  auto buf = a.payload_buffer(5, after(std::chrono::seconds(5)));
  std::memcpy(buf.data(), "12345", 5);
  a.send_with_fds(bytes_of("hello"), std::span<const int>(&mem, 1), 5, after(std::chrono::seconds(5)));
  a.send(bytes_of("no fd"), 0, after(std::chrono::seconds(5)));
  ::close(mem); // the link sent a duplicate; the receiver's copy is independent

  auto m1 = b.receive(after(std::chrono::seconds(5)));
  REQUIRE(m1.has_value());
  CHECK(as_chars(m1->meta) == "hello");
  CHECK(as_chars(m1->payload) == "12345");
  std::vector<int> got = b.take_fds();
  REQUIRE(got.size() == 1);
  char text[9] = {};
  CHECK(::pread(got[0], text, 8, 0) == 8);
  CHECK(std::string(text) == "exported");
  ::close(got[0]);
  auto m2 = b.receive(after(std::chrono::seconds(5)));
  REQUIRE(m2.has_value());
  CHECK(as_chars(m2->meta) == "no fd");
  CHECK(b.take_fds().empty());
  CHECK_FALSE(b.receive(after(std::chrono::milliseconds(20))).has_value());

  // Descriptors nobody takes are closed at release() (and at the next receive()): none leak.
  const int before = rlpt::test::sync::open_fds();
  for (int k = 0; k < 20; ++k) {
    int p[2];
    REQUIRE(::pipe(p) == 0);
    a.send_with_fds(bytes_of("x"), std::span<const int>(p, 2), 0, after(std::chrono::seconds(5)));
    ::close(p[0]);
    ::close(p[1]);
    auto m3 = b.receive(after(std::chrono::seconds(5)));
    REQUIRE(m3.has_value());
    if (k % 2 == 0) b.release();
  }
  b.release();
  CHECK(rlpt::test::sync::open_fds() == before);
}

TEST_CASE("device sync wire: unix_link rejects damaged frames, reports a lost peer and enforces limits") {
  SUBCASE("garbage on the socket") {
    auto fds = unix_socketpair();
    unix_link b(fds[1], role::receiver);
    std::vector<char> junk(64, 'z');
    REQUIRE(::write(fds[0], junk.data(), junk.size()) == 64);
    RLPT_CHECK_ERROR(b.receive(after(std::chrono::seconds(5))), "rlpt.sync.wire", "bad frame header", "bad magic");
    ::close(fds[0]);
  }
  SUBCASE("peer closed") {
    auto fds = unix_socketpair();
    unix_link b(fds[1], role::receiver);
    { unix_link a(fds[0], role::sender); }
    RLPT_CHECK_ERROR(b.receive(after(std::chrono::seconds(5))), "rlpt.sync.peer_lost", "closed by the peer");
  }
  SUBCASE("limits") {
    auto fds = unix_socketpair();
    unix_link a(fds[0], role::sender, {.max_payload = 16, .max_fds = 1});
    unix_link b(fds[1], role::receiver, {.max_payload = 8});
    RLPT_CHECK_ERROR(a.payload_buffer(17, after(std::chrono::seconds(1))), "rlpt.sync.too_large", "17", "16");
    const int two[2] = {0, 1};
    RLPT_CHECK_ERROR(a.send_with_fds(bytes_of("m"), std::span<const int>(two, 2), 0, after(std::chrono::seconds(1))),
                     "rlpt.sync.too_large", "2 descriptors", "limit is 1");
    static_cast<void>(a.payload_buffer(12, after(std::chrono::seconds(1))));
    a.send(bytes_of("big"), 12, after(std::chrono::seconds(1)));
    RLPT_CHECK_ERROR(b.receive(after(std::chrono::seconds(5))), "rlpt.sync.wire", "payload larger than max_payload",
                     "12");
  }
}

TEST_CASE(
    "device sync wire: a listening unix_link takes a connection from another process, and a new one after it died") {
  const std::string path = fmt::format("@rlpt-test-unix-{}", ::getpid());
  unix_link rx({.path = path, .listen = true}, role::receiver);
  for (int round = 0; round < 2; ++round) {
    const pid_t child = ::fork();
    REQUIRE(child >= 0);
    if (child == 0) {
      int rc = 0;
      try {
        unix_link tx({.path = path}, role::sender);
        auto buf = tx.payload_buffer(4, after(std::chrono::seconds(5)));
        std::memcpy(buf.data(), "data", 4);
        const int fd = ::memfd_create("rlpt-child", MFD_CLOEXEC);
        const std::string msg = fmt::format("round {}", round);
        if (fd < 0 || ::write(fd, msg.data(), msg.size()) != static_cast<ssize_t>(msg.size())) rc = 2;
        tx.send_with_fds(bytes_of(msg), std::span<const int>(&fd, 1), 4, after(std::chrono::seconds(5)));
        auto reply = tx.receive(after(std::chrono::seconds(5)));
        if (!reply || as_chars(reply->meta) != "ok") rc = 3;
        if (round == 0) ::raise(SIGKILL); // the next round's sender replaces a dead one
      } catch (...) {
        rc = 1;
      }
      std::_Exit(rc);
    }
    auto m = rx.receive(after(std::chrono::seconds(10)));
    REQUIRE(m.has_value());
    CHECK(as_chars(m->meta) == fmt::format("round {}", round));
    CHECK(as_chars(m->payload) == "data");
    CHECK(rx.peer_pid() == child);
    auto got = rx.take_fds();
    REQUIRE(got.size() == 1);
    char text[16] = {};
    CHECK(::pread(got[0], text, 7, 0) == 7);
    CHECK(std::string(text) == fmt::format("round {}", round));
    ::close(got[0]);
    static_cast<void>(rx.payload_buffer(0, after(std::chrono::seconds(1))));
    rx.send(bytes_of("ok"), 0, after(std::chrono::seconds(5)));
    int status = 0;
    REQUIRE(::waitpid(child, &status, 0) == child);
    if (round == 0) {
      CHECK(WIFSIGNALED(status));
      RLPT_CHECK_ERROR(rx.receive(after(std::chrono::seconds(5))), "rlpt.sync.peer_lost", "closed by the peer");
    } else {
      CHECK(WIFEXITED(status));
      CHECK(WEXITSTATUS(status) == 0);
    }
  }
  CHECK(rx.connections() == 2);
}
