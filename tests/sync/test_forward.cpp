// SPDX-License-Identifier: Apache-2.0
// Forwarding (sync/forward.hpp): a chain and a tree of hosts get every version bit-exact while
// the trainer sends one copy of each update; a downstream host that misses a version is
// reported, does not stop the others, and catches up from the version it holds. Both modes:
// store-and-forward, and cut-through (frames passed on as they arrive, with store-and-forward
// as the fallback for a host the cut-through did not reach).
#include "receiver_loop.hpp"

#include <rlpt/sync/forward.hpp>

#include <atomic>
#include <thread>

using namespace rlpt::sync;
using namespace rlpt::test::sync;
using namespace std::chrono_literals;

namespace {

const plan_options small_buckets{.bucket_bytes = 1024, .alignment = 256};

// Polls a forwarder on a thread until stopped; keeps what it reported.
class forwarder_loop {
public:
  explicit forwarder_loop(forwarder& f) : f_(f), thread_([this] { run(); }) {}
  ~forwarder_loop() { stop(); }
  void stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  // The per-link results of each version forwarded, in order (call after stop()).
  [[nodiscard]] const std::vector<std::vector<forward_result>>& forwarded() const { return forwarded_; }
  [[nodiscard]] const std::vector<update>& seen() const { return seen_; }
  //! Updates reported so far (safe while running).
  [[nodiscard]] std::size_t count() const { return count_.load(); }
  //! Waits (up to 20 s) until `n` updates were reported: the forwarder is done with version n
  //! downstream too.
  void wait(std::size_t n) const {
    const auto until = clock::now() + 20s;
    while (count() < n && clock::now() < until) std::this_thread::sleep_for(2ms);
  }

private:
  void run() {
    while (!stop_) {
      update u = f_.poll(20ms);
      if (u.state == update::status::idle) continue;
      if (u.published()) forwarded_.push_back(f_.last_forwarded());
      seen_.push_back(std::move(u));
      ++count_;
    }
  }
  forwarder& f_;
  std::atomic<bool> stop_{false};
  std::atomic<std::size_t> count_{0};
  std::vector<std::vector<forward_result>> forwarded_;
  std::vector<update> seen_;
  std::thread thread_;
};

std::uint64_t frame_version(std::span<const std::byte> meta) {
  std::uint64_t v;
  std::memcpy(&v, meta.data() + 8, 8);
  return v;
}

// trainer -> f1 -> f2 -> leaf, four versions (dense, then deltas).
void chain_case(bool cut) {
  model md = make_model(61);
  const manifest m = plan(md.refs, small_buckets);
  // trainer -> f1 -> f2 -> leaf
  inproc_pipe p1, p2, p3;
  inproc_transport t1(p1, role::sender), r1(p1, role::receiver), t2(p2, role::sender), r2(p2, role::receiver),
      t3(p3, role::sender), r3(p3, role::receiver);
  sink s1;
  forwarder f1(r1, {&t2}, s1.fn(), {.send = {.delta = true, .timeout = 10s}, .cut_through = cut});
  forwarder f2(r2, {&t3}, {}, {.send = {.delta = true, .timeout = 10s}, .cut_through = cut});
  receiver leaf(r3, [](const tensor_view&) {});
  sender tx(t1, m, md.refs, {.delta = true, .timeout = 10s});
  std::vector<publish_result> sent;
  {
    forwarder_loop l1(f1), l2(f2);
    receiver_loop l3(leaf);
    for (std::uint64_t v = 1; v <= 4; ++v) {
      if (v > 1) {
        rlpt::test::rng r(3000 + v);
        md.step(0.02, r);
      }
      sent.push_back(tx.publish(v));
      REQUIRE(l3.wait(v).size() == v); // through both hops
    }
    const auto ups = l3.wait(4);
    l1.stop();
    l2.stop();
    REQUIRE(ups.size() == 4);
    for (const update& u : ups) CHECK(u.published());
    // Every hop forwarded every version, the first dense and the others as deltas.
    for (const forwarder_loop* l : {&l1, &l2}) {
      REQUIRE(l->forwarded().size() == 4);
      for (std::size_t k = 0; k < 4; ++k) {
        REQUIRE(l->forwarded()[k].size() == 1);
        CHECK(l->forwarded()[k][0].ok);
        CHECK(l->forwarded()[k][0].cut_through == cut);
        CHECK(l->forwarded()[k][0].cut_through_failure.empty());
        CHECK(l->forwarded()[k][0].sent.delta == (k > 0));
        CHECK(l->forwarded()[k][0].sent.digest == sent[k].digest);
        // Each hop moves what the trainer moved: one copy of the update.
        CHECK(l->forwarded()[k][0].sent.wire_bytes == sent[k].wire_bytes);
      }
    }
  }
  check_mirror(f1.upstream(), md);
  check_mirror(f2.upstream(), md);
  check_mirror(leaf, md);
  CHECK(leaf.digest() == sent.back().digest);
  CHECK(s1.got.size() == md.refs.size()); // the forwarding host loads its own engine too
  // One copy per update leaves the trainer (a direct fan-out to the 3 hosts would send 3).
  CHECK(sent[0].wire_bytes == m.packed_bytes());
}

// trainer -> f1 -> leaf over two in-process pipes: t1/r1 the trainer's, t2/r2 f1's downstream.
struct two_hops {
  inproc_pipe p1, p2;
  inproc_transport t1{p1, role::sender}, r1{p1, role::receiver}, t2{p2, role::sender}, r2{p2, role::receiver};
};

// trainer -> f1 -> {a, b}, three versions (dense, then deltas); b's link drops the first
// payload message (a delta chunk) of version 2. What f1 reported per version, and what b saw.
struct tree_run {
  std::vector<std::vector<forward_result>> forwarded;
  std::vector<update> seen_b;
  std::uint64_t version_a = 0, version_b = 0;
  bool dropped = false;
};

tree_run tree_case(std::uint64_t seed, bool cut, std::size_t b_updates) {
  model md = make_model(seed);
  const manifest m = plan(md.refs, small_buckets);
  inproc_pipe p1, pa, pb;
  inproc_transport t1(p1, role::sender), r1(p1, role::receiver), ta(pa, role::sender), ra(pa, role::receiver),
      tb_inner(pb, role::sender), rb(pb, role::receiver);
  faulty_link tb(tb_inner);
  tree_run run;
  tb.on_send = [&](std::size_t, std::vector<std::byte>& meta, std::span<std::byte>) {
    const frame_type t = type_of(meta);
    if (run.dropped || (t != frame_type::bucket && t != frame_type::delta) || frame_version(meta) != 2) return true;
    run.dropped = true;
    return false;
  };
  forwarder f1(r1, {&ta, &tb}, {}, {.send = {.delta = true, .timeout = 2s, .commit_timeout = 2s}, .cut_through = cut});
  receiver a(ra, [](const tensor_view&) {}), b(rb, [](const tensor_view&) {}, {.timeout = 300ms});
  sender tx(t1, m, md.refs, {.delta = true, .timeout = 10s});
  {
    forwarder_loop l1(f1);
    receiver_loop la(a), lb(b);
    for (std::uint64_t v = 1; v <= 3; ++v) {
      if (v > 1) {
        rlpt::test::rng r(seed * 1000 + v);
        md.step(0.02, r);
      }
      tx.publish(v);
      REQUIRE(la.wait(v).size() == v);
      // f1 is done with b too once it reported version v.
      l1.wait(v);
    }
    l1.stop();
    run.seen_b = lb.wait(b_updates);
    la.stop();
    lb.stop();
    run.forwarded = l1.forwarded();
  }
  run.version_a = a.version();
  run.version_b = b.version();
  check_mirror(a, md);
  check_mirror(b, md);
  return run;
}

} // namespace

TEST_CASE("forward: store-and-forward, a chain of hosts gets every version bit-exact, the trainer sends one copy") {
  chain_case(false);
}

TEST_CASE("forward: cut-through, a chain of hosts gets every version bit-exact, the trainer sends one copy") {
  chain_case(true);
}

TEST_CASE("forward: store-and-forward in a tree, a host that misses a version is reported, the others complete, "
          "it catches up") {
  const tree_run run = tree_case(62, false, 3);
  const auto& fw = run.forwarded;
  REQUIRE(fw.size() == 3);
  CHECK(run.dropped);
  // Version 2: a got it, b's transfer failed (reported with an id), b stayed on version 1.
  CHECK(fw[1][0].ok);
  CHECK_FALSE(fw[1][1].ok);
  CHECK(fw[1][1].error_id.rfind("rlpt.sync.", 0) == 0);
  // Version 3: a gets the delta from 2; b, still on 1, the delta from 1 (its sender's base is
  // the last version b acknowledged), and ends on exactly the trainer's bytes (tree_case checks).
  CHECK(fw[2][0].ok);
  CHECK(fw[2][0].sent.delta);
  CHECK(fw[2][1].ok);
  CHECK(fw[2][1].sent.delta);
  CHECK(run.version_a == 3);
  CHECK(run.version_b == 3);
  REQUIRE(run.seen_b.size() == 3);
  CHECK(run.seen_b[0].published());
  CHECK(run.seen_b[1].failed());
  CHECK(run.seen_b[2].published());
  CHECK(run.seen_b[2].base_version == 1);
}

TEST_CASE("forward: cut-through passes a version on before this host has loaded it") {
  // f1's own engine holds its load of version 1 until the host behind it has published version
  // 1: only frames passed on as they arrive can get there (store-and-forward would wait for f1).
  model md = make_model(63);
  const manifest m = plan(md.refs, small_buckets);
  two_hops h;
  auto &t1 = h.t1, &r1 = h.r1, &t2 = h.t2, &r2 = h.r2;
  receiver leaf(r2, [](const tensor_view&) {});
  std::atomic<bool> leaf_first{false};
  receiver_loop* leaf_loop = nullptr;
  const auto load = [&](const tensor_view&) {
    if (leaf_first || leaf_loop == nullptr) return;
    const auto seen = leaf_loop->wait(1, 10s);
    leaf_first = seen.size() == 1 && seen[0].published();
  };
  forwarder f1(r1, {&t2}, load, {.send = {.timeout = 10s}});
  sender tx(t1, m, md.refs, {.timeout = 20s});
  receiver_loop ll(leaf);
  leaf_loop = &ll;
  forwarder_loop l1(f1);
  const publish_result sent = tx.publish(1);
  l1.wait(1);
  l1.stop();
  CHECK(leaf_first);
  REQUIRE(l1.forwarded().size() == 1);
  CHECK(l1.forwarded()[0][0].ok);
  CHECK(l1.forwarded()[0][0].cut_through);
  CHECK(leaf.digest() == sent.digest);
  check_mirror(leaf, md);
}

TEST_CASE("forward: cut-through in a tree, a host that misses a frame gets the version from the mirror and is back "
          "on cut-through next") {
  const tree_run run = tree_case(64, true, 4);
  const auto& fw = run.forwarded;
  REQUIRE(fw.size() == 3);
  CHECK(run.dropped);
  for (std::size_t v = 0; v < 3; ++v) {
    CAPTURE(v);
    CHECK(fw[v][0].ok);
    CHECK(fw[v][0].cut_through);
    CHECK(fw[v][1].ok);
  }
  // Version 2 did not get through to b as it passed (b failed it and said why); b got it from
  // f1's mirror, dense (b's sender had never sent to b), and version 3 passed through again.
  CHECK_FALSE(fw[1][1].cut_through);
  CHECK(fw[1][1].cut_through_failure.rfind("rlpt.sync.", 0) == 0);
  CHECK_FALSE(fw[1][1].sent.delta);
  CHECK(fw[2][1].cut_through);
  CHECK(fw[2][1].sent.delta);
  CHECK(run.version_a == 3);
  CHECK(run.version_b == 3);
  const auto& ups_b = run.seen_b;
  REQUIRE(ups_b.size() == 4);
  CHECK(ups_b[0].published());
  CHECK(ups_b[1].failed());
  CHECK(ups_b[2].published());
  CHECK(ups_b[2].version == 2);
  CHECK_FALSE(ups_b[2].delta);
  CHECK(ups_b[3].published());
  CHECK(ups_b[3].base_version == 2);
}

TEST_CASE("forward: cut-through, a host that does not hold the delta's base gets the version dense from the mirror") {
  model md = make_model(65);
  const manifest m = plan(md.refs, small_buckets);
  two_hops h;
  auto &t1 = h.t1, &r1 = h.r1, &t2 = h.t2, &r2 = h.r2;
  forwarder f1(r1, {&t2}, {}, {.send = {.delta = true, .timeout = 10s}});
  sender tx(t1, m, md.refs, {.delta = true, .timeout = 10s});
  forwarder_loop l1(f1);
  const auto step = [&](std::uint64_t v) {
    if (v > 1) {
      rlpt::test::rng r(6000 + v);
      md.step(0.02, r);
    }
    tx.publish(v);
    l1.wait(v);
  };
  {
    receiver first(r2, [](const tensor_view&) {});
    receiver_loop lf(first);
    step(1);
    step(2);
    REQUIRE(lf.wait(2).size() == 2);
    CHECK(first.version() == 2);
  }
  // A restarted host (no version) behind f1: version 3 is a delta it cannot take.
  receiver restarted(r2, [](const tensor_view&) {});
  receiver_loop lr(restarted);
  step(3);
  step(4);
  l1.stop();
  const auto ups = lr.wait(2);
  lr.stop();
  const auto& fw = l1.forwarded();
  REQUIRE(fw.size() == 4);
  CHECK(fw[1][0].cut_through);
  CHECK(fw[1][0].sent.delta);
  CHECK(fw[2][0].ok);
  CHECK_FALSE(fw[2][0].cut_through);
  CHECK(fw[2][0].cut_through_failure.find("rlpt.sync.base_mismatch") != std::string::npos);
  CHECK_FALSE(fw[2][0].sent.delta);
  CHECK(fw[3][0].ok);
  CHECK(fw[3][0].cut_through);
  CHECK(fw[3][0].sent.delta);
  REQUIRE(ups.size() == 2);
  CHECK(ups[0].published());
  CHECK_FALSE(ups[0].delta);
  CHECK(ups[1].published());
  CHECK(ups[1].base_version == 3);
  CHECK(restarted.version() == 4);
  check_mirror(restarted, md);
}

TEST_CASE("forward: cut-through, bytes this host rejects are never published downstream") {
  model md = make_model(66);
  const manifest m = plan(md.refs, small_buckets);
  // The trainer's link flips a byte in version 2's first bucket: f1 NACKs, the leaf must not
  // publish version 2 (it checks the bytes itself, and f1 aborts the attempt downstream).
  two_hops h;
  auto &r1 = h.r1, &t2 = h.t2, &r2 = h.r2;
  faulty_link t1(h.t1);
  bool flipped = false;
  t1.on_send = [&](std::size_t, std::vector<std::byte>& meta, std::span<std::byte> payload) {
    if (!flipped && type_of(meta) == frame_type::bucket && frame_version(meta) == 2 && !payload.empty()) {
      payload[payload.size() / 2] ^= std::byte{0x40};
      flipped = true;
    }
    return true;
  };
  forwarder f1(r1, {&t2}, {}, {.send = {.timeout = 10s}});
  receiver leaf(r2, [](const tensor_view&) {});
  sender tx(t1, m, md.refs, {.timeout = 10s});
  forwarder_loop l1(f1);
  receiver_loop ll(leaf);
  tx.publish(1);
  REQUIRE(ll.wait(1).size() == 1);
  rlpt::test::rng r(7002);
  md.step(0.02, r);
  CHECK_THROWS_AS(tx.publish(2), rlpt::error);
  REQUIRE(ll.wait(2).size() == 2);
  md.step(0.02, r);
  tx.publish(3);
  const auto ups = ll.wait(3);
  l1.stop();
  ll.stop();
  CHECK(flipped);
  REQUIRE(ups.size() == 3);
  CHECK(ups[0].published());
  CHECK(ups[1].failed());
  CHECK(ups[1].version == 2);
  CHECK(ups[2].published());
  CHECK(ups[2].version == 3);
  for (const update& u : ups) CHECK_FALSE((u.published() && u.version == 2));
  CHECK(leaf.version() == 3);
  check_mirror(leaf, md);
}

TEST_CASE("forward: cut-through, a downstream host that stops taking frames does not hold up this host") {
  model md = make_model(67);
  const manifest m = plan(md.refs, small_buckets);
  two_hops h;
  auto &t1 = h.t1, &r1 = h.r1, &r2 = h.r2;
  faulty_link t2(h.t2);
  bool stalled = false;
  // Version 2's first bucket to the leaf takes 1.5 s to go out.
  t2.on_send = [&](std::size_t, std::vector<std::byte>& meta, std::span<std::byte>) {
    if (!stalled && type_of(meta) == frame_type::bucket && frame_version(meta) == 2) {
      stalled = true;
      std::this_thread::sleep_for(1500ms);
    }
    return true;
  };
  forwarder f1(r1, {&t2}, {},
               {.send = {.timeout = 10s}, .cut_through = true, .cut_through_frames = 1, .cut_through_lag = 200ms});
  receiver leaf(r2, [](const tensor_view&) {});
  sender tx(t1, m, md.refs, {.timeout = 1s}); // would time out if f1 waited for the leaf
  forwarder_loop l1(f1);
  receiver_loop ll(leaf);
  for (std::uint64_t v = 1; v <= 3; ++v) {
    if (v > 1) {
      rlpt::test::rng r(8000 + v);
      md.step(0.02, r);
    }
    tx.publish(v);
    l1.wait(v);
  }
  l1.stop();
  const auto ups = ll.wait(4);
  ll.stop();
  CHECK(stalled);
  const auto& fw = l1.forwarded();
  REQUIRE(fw.size() == 3);
  CHECK(fw[0][0].cut_through);
  CHECK(fw[1][0].ok);
  CHECK_FALSE(fw[1][0].cut_through);
  CHECK(fw[1][0].cut_through_failure.find("took no frame") != std::string::npos);
  CHECK(fw[2][0].cut_through);
  CHECK(leaf.version() == 3);
  check_mirror(leaf, md);
}
