// SPDX-License-Identifier: Apache-2.0
// Shared-memory transport across processes (fork): round trips, a sender killed mid-update,
// a receiver restarted mid-stream, slot credits, and no leaked segments or descriptors.
#include "process.hpp"
#include "receiver_loop.hpp"

using namespace rlpt::sync;
using namespace rlpt::test::sync;
using namespace std::chrono_literals;

namespace {

const plan_options small_buckets{.bucket_bytes = 1024, .alignment = 256};
const shm_options small_slots{.slots = 2, .slot_bytes = 1024, .meta_bytes = 64 << 10};

} // namespace

TEST_CASE("shm: dense and delta updates across processes, then nothing left behind") {
  const std::string name = unique_name("rt");
  const int fds = open_fds();
  const pid_t child = spawn([&] {
    model md = model_at(21, 1, 1000);
    const manifest m = plan(md.refs, small_buckets);
    shm_transport link(name, role::sender, small_slots);
    sender tx(link, m, md.refs, {.delta = true, .timeout = 10s});
    for (std::uint64_t v = 1; v <= 4; ++v) {
      if (v > 1) {
        rlpt::test::rng r(1000 + v);
        md.step(0.02, r);
      }
      const publish_result p = tx.publish(v);
      if (p.delta != (v > 1)) throw std::runtime_error("unexpected update kind");
    }
  });
  {
    shm_transport link(name, role::receiver);
    sink s;
    receiver rx(link, s.fn());
    const auto ups = poll_n(rx, 4);
    REQUIRE(ups.size() == 4);
    for (std::size_t k = 0; k < 4; ++k) {
      CHECK(ups[k].published());
      CHECK(ups[k].version == k + 1);
    }
    model want = model_at(21, 4, 1000);
    check_mirror(rx, want);
    CHECK(wait_child(child) == 0);
  }
  CHECK(shm_entries(name).empty()); // the sender unlinked its segment
  CHECK(open_fds() == fds);
}

TEST_CASE("shm: a sender killed mid-update leaves the previous version, the next sender succeeds") {
  const std::string name = unique_name("kill");
  const int fds = open_fds();
  auto stalling_sender = [&](bool stall) {
    return spawn([&, stall] {
      model md = model_at(22, 1, 1000);
      const manifest m = plan(md.refs, small_buckets);
      shm_transport link(name, role::sender, small_slots);
      bool stalled = false;
      sender tx(link, m,
                [&](std::size_t i) {
                  if (stalled && i == 8) ::pause(); // hang half-way through version 2 until SIGKILL
                  return std::span<const std::byte>(md.storage[i]);
                },
                {.timeout = 10s});
      if (stall) {
        tx.publish(1);
        rlpt::test::rng r(1002);
        md.step(0.02, r);
        stalled = true;
        tx.publish(2);
      } else {
        rlpt::test::rng r(1002);
        md.step(0.02, r);
        tx.publish(2);
      }
    });
  };
  {
    shm_transport link(name, role::receiver);
    sink s;
    receiver rx(link, s.fn(), {.timeout = 20s}); // the dead pid must be noticed long before this
    const pid_t first = stalling_sender(true);
    auto ups = poll_n(rx, 1);
    REQUIRE(ups.size() == 1);
    REQUIRE(ups[0].published());
    auto killed_at = clock::now() + 1h;
    std::thread killer([&] { // kill while the receiver is busy with version 2
      std::this_thread::sleep_for(300ms);
      killed_at = clock::now();
      ::kill(first, SIGKILL);
    });
    ups = poll_n(rx, 1);
    const auto seen_at = clock::now();
    killer.join();
    REQUIRE(ups.size() == 1);
    CHECK(seen_at - killed_at < 100ms); // the sender's pid is checked every 10 ms
    CHECK(ups[0].failed());
    CHECK(ups[0].version == 2);
    CHECK(ups[0].error_id == "rlpt.sync.peer_lost");
    CHECK(ups[0].reason.find(fmt::format("sender pid {} exited", first)) != std::string::npos);
    CHECK(wait_child(first) == 128 + SIGKILL);
    model v1 = model_at(22, 1, 1000);
    check_mirror(rx, v1); // still serving version 1
    const pid_t second = stalling_sender(false);
    ups = poll_n(rx, 1);
    REQUIRE(ups.size() == 1);
    CHECK(ups[0].published());
    CHECK(ups[0].version == 2);
    model v2 = model_at(22, 2, 1000);
    check_mirror(rx, v2);
    CHECK(wait_child(second) == 0);
  }
  CHECK(shm_entries(name).empty()); // the killed sender's segment was cleaned up
  CHECK(open_fds() == fds);
}

TEST_CASE("shm: a receiver restarted mid-stream recovers cleanly") {
  const std::string name = unique_name("rrestart");
  const pid_t child = spawn([&] {
    model md = model_at(23, 1, 1000);
    const manifest m = plan(md.refs, small_buckets);
    shm_transport link(name, role::sender, small_slots);
    sender tx(link, m, md.refs, {.delta = true, .timeout = 300ms, .commit_timeout = 1s});
    int ok = 0, failed = 0;
    const auto until = clock::now() + 20s;
    for (std::uint64_t v = 1; clock::now() < until; ++v) {
      if (v > 1) {
        rlpt::test::rng r(1000 + v);
        md.step(0.02, r);
      }
      try {
        tx.publish(v);
        if (++ok >= 8) return; // at least 6 of them after the restart (none can succeed without a receiver)
      } catch (const rlpt::error&) {
        ++failed;
      }
    }
    throw std::runtime_error(fmt::format("no recovery: {} failures, {} successes", failed, ok));
  });
  {
    shm_transport link(name, role::receiver);
    sink s;
    receiver rx(link, s.fn());
    REQUIRE(poll_n(rx, 2).size() == 2);
  } // gone in the middle of the stream
  std::this_thread::sleep_for(100ms);
  shm_transport link(name, role::receiver);
  sink s;
  receiver rx(link, s.fn());
  std::vector<update> ups;
  int status = 0;
  const auto until = clock::now() + 30s;
  while (::waitpid(child, &status, WNOHANG) == 0 && clock::now() < until) { // serve until the sender is done
    update u = rx.poll(20ms);
    if (u.state != update::status::idle) ups.push_back(std::move(u));
  }
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  std::uint64_t last = 0;
  for (const auto& u : ups)
    if (u.published()) last = u.version;
  REQUIRE(last > 0);
  CHECK(rx.version() == last);
  model want = model_at(23, last, 1000);
  check_mirror(rx, want);
}

TEST_CASE("shm: credits: a slot is not reused until the receiver releases it") {
  const std::string name = unique_name("credit");
  shm_transport tx(name, role::sender, {.slots = 2, .slot_bytes = 4096, .meta_bytes = 1024});
  shm_transport rx(name, role::receiver);
  CHECK_FALSE(rx.receive(clock::now()).has_value()); // attaches
  const std::byte meta[3] = {std::byte{1}, std::byte{2}, std::byte{3}};
  for (int k = 0; k < 2; ++k) {
    auto buf = tx.payload_buffer(100, after(1s));
    std::fill(buf.begin(), buf.end(), static_cast<std::byte>(k + 1));
    tx.send(meta, 100, after(1s));
  }
  RLPT_CHECK_ERROR(static_cast<void>(tx.payload_buffer(100, after(50ms))), "rlpt.sync.timeout",
                   fmt::format("waiting for receiver pid {} to release a slot", ::getpid()));
  auto m1 = rx.receive(after(1s));
  REQUIRE(m1.has_value());
  CHECK(m1->payload[0] == std::byte{1});
  CHECK(m1->meta.size() == 3);
  // Still held: the sender must wait.
  RLPT_CHECK_ERROR(static_cast<void>(tx.payload_buffer(100, after(50ms))), "rlpt.sync.timeout", "release a slot");
  CHECK(m1->payload[99] == std::byte{1});
  rx.release();
  auto buf = tx.payload_buffer(100, after(1s)); // slot 0 is free again
  std::fill(buf.begin(), buf.end(), std::byte{3});
  tx.send(meta, 100, after(1s));
  auto m2 = rx.receive(after(1s));
  REQUIRE(m2.has_value());
  CHECK(m2->payload[0] == std::byte{2});
  auto m3 = rx.receive(after(1s)); // receive() releases m2
  REQUIRE(m3.has_value());
  CHECK(m3->payload[0] == std::byte{3});
  // A meta block larger than the meta area travels in the payload area.
  std::vector<std::byte> big(3000, std::byte{7});
  RLPT_CHECK_ERROR(tx.send(big, 100, after(1s)), "rlpt.sync.too_large", "meta block of 3000 bytes");
  tx.send(big, 0, after(1s));
  auto m4 = rx.receive(after(1s));
  REQUIRE(m4.has_value());
  CHECK(m4->meta.size() == 3000);
  CHECK(m4->payload.empty());
}

TEST_CASE("shm: configuration errors") {
  RLPT_CHECK_ERROR(shm_transport("bad/name", role::sender), "rlpt.sync.bad_link",
                   "must be 1-200 characters of [A-Za-z0-9._-]");
  RLPT_CHECK_ERROR(shm_transport("", role::receiver), "rlpt.sync.bad_link", "shm name \"\"");
  const std::string name = unique_name("owned");
  int ready[2];
  REQUIRE(::pipe(ready) == 0);
  const pid_t child = spawn([&] {
    shm_transport link(name, role::sender, {.slot_bytes = 4096});
    const char c = 1;
    if (::write(ready[1], &c, 1) != 1) throw std::runtime_error("pipe");
    ::pause();
  });
  char c = 0;
  REQUIRE(::read(ready[0], &c, 1) == 1);
  RLPT_CHECK_ERROR(shm_transport(name, role::sender, {.slot_bytes = 4096}), "rlpt.sync.shm",
                   fmt::format("belongs to a running sender (pid {})", child));
  ::kill(child, SIGKILL);
  CHECK(wait_child(child) == 128 + SIGKILL);
  { shm_transport again(name, role::sender, {.slot_bytes = 4096}); } // a dead owner's segment is taken over
  CHECK(shm_entries(name).empty());
  ::close(ready[0]);
  ::close(ready[1]);
}

TEST_CASE("shm: a process writing into the slots during updates never gets a wrong version published") {
  // Issue 18: a process writes bytes of the segment's payload slots while versions stream
  // through. Every version the receiver publishes must be the sender's, bit for bit; the
  // others must be refused (checksum). Pieces of 8 MiB take copy_hash's paged path (the one
  // that once hashed a page and then read it again to copy it), the small tensor its one-page
  // path; the delta subcase puts the written bytes into delta records. The writer works in
  // bursts (each leaves the bytes as it found them), so some updates run undisturbed.
  const std::string name = unique_name("scribble");
  const shm_options so{.slots = 2, .slot_bytes = std::uint64_t{8} << 20, .meta_bytes = 64 << 10};
  const auto geo =
      rlpt::sync::detail::shm_geometry::of(so.slots, so.meta_bytes, so.slot_bytes, so.reply_slots, so.reply_bytes);
  std::vector<std::uint64_t>
      hot; // segment offsets the writer flips: every 16th page of every slot's payload, and byte 200
  for (std::uint64_t k = 0; k < so.slots; ++k) {
    const std::uint64_t payload = rlpt::sync::detail::shm_page + k * geo.fwd_stride + geo.fwd_payload_at;
    hot.push_back(payload + 200);
    for (std::uint64_t at = 4096 * 3 + 77; at < so.slot_bytes; at += 4096 * 16) hot.push_back(payload + at);
  }
  bool delta = false;
  SUBCASE("dense") { delta = false; }
  SUBCASE("delta") { delta = true; }
  const pid_t writer = spawn([&] {
    const std::string path = "/" + name;
    for (;;) {
      const int fd = ::shm_open(path.c_str(), O_RDWR, 0);
      struct stat st {};
      if (fd < 0 || ::fstat(fd, &st) != 0 || static_cast<std::uint64_t>(st.st_size) < geo.total) {
        if (fd >= 0) ::close(fd);
        std::this_thread::sleep_for(1ms);
        continue;
      }
      void* p = ::mmap(nullptr, static_cast<std::size_t>(geo.total), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      ::close(fd);
      if (p == MAP_FAILED) throw std::runtime_error("mmap");
      auto* b = static_cast<volatile unsigned char*>(p);
      for (;;) {
        const auto until = clock::now() + 2ms;
        for (int pass = 0; pass % 2 == 1 || clock::now() < until; ++pass) // an even number of passes
          for (const std::uint64_t at : hot) b[at] = static_cast<unsigned char>(b[at] ^ 0x10u);
        std::this_thread::sleep_for(3ms);
      }
    }
  });
  rlpt::test::rng r(7);
  model md;
  md.add("big", wire_dtype::bf16, {2048, 2048}, r); // 8 MiB: one piece filling bucket 0
  md.add("small", wire_dtype::f32, {1000}, r);
  const manifest m = plan(md.refs, {.bucket_bytes = so.slot_bytes, .alignment = 256});
  REQUIRE(m.bucket_count() == 2);
  std::mutex mu;
  std::map<std::uint64_t, std::pair<std::uint64_t, std::uint64_t>> sent; // version -> digests of big, small
  constexpr std::uint64_t versions = 24;
  std::atomic<bool> done{false};
  int sender_failures = 0;
  {
    shm_transport out(name, role::sender, so);
    shm_transport in(name, role::receiver);
    sink s;
    receiver rx(in, s.fn(), {.timeout = 10s});
    std::thread tx_thread([&] {
      sender tx(out, m, md.refs, {.delta = delta, .timeout = 10s, .commit_timeout = 10s});
      for (std::uint64_t v = 1; v <= versions; ++v) {
        if (v > 1) md.step(0.01, r);
        {
          std::lock_guard lock(mu);
          sent[v] = {xxh3(md.storage[0].data(), md.storage[0].size()),
                     xxh3(md.storage[1].data(), md.storage[1].size())};
        }
        try {
          tx.publish(v);
        } catch (const rlpt::error& e) {
          ++sender_failures;
          if (e.id() != rlpt::errors::sync::checksum) FAIL_CHECK("unexpected sender error: ", e.what());
        }
      }
      done = true;
    });
    int published = 0, refused = 0, wrong = 0;
    while (!done) {
      const update u = rx.poll(20ms);
      if (u.published()) {
        ++published;
        std::lock_guard lock(mu);
        const auto want = sent.at(u.version);
        const auto big = rx.tensor("big").bytes, small = rx.tensor("small").bytes;
        if (xxh3(big.data(), big.size()) != want.first || xxh3(small.data(), small.size()) != want.second) ++wrong;
      } else if (u.failed()) {
        ++refused;
        CHECK(u.error_id == "rlpt.sync.checksum");
      }
    }
    tx_thread.join();
    ::kill(writer, SIGKILL);
    wait_child(writer);
    MESSAGE(
        fmt::format("{}: {} published, {} refused, {} wrong", delta ? "delta" : "dense", published, refused, wrong));
    CHECK(wrong == 0);
    CHECK(published + refused == static_cast<int>(versions));
    CHECK(refused == sender_failures);
  }
  CHECK(shm_entries(name).empty());
}
