// SPDX-License-Identifier: Apache-2.0
// Forwarding (sync/forward.hpp): a chain and a tree of hosts get every version bit-exact while
// the trainer sends one copy of each update; a downstream host that misses a version is
// reported, does not stop the others, and catches up from the version it holds.
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

} // namespace

TEST_CASE("forward: a chain of hosts gets every version bit-exact, the trainer sends one copy") {
  model md = make_model(61);
  const manifest m = plan(md.refs, small_buckets);
  // trainer -> f1 -> f2 -> leaf
  inproc_pipe p1, p2, p3;
  inproc_transport t1(p1, role::sender), r1(p1, role::receiver), t2(p2, role::sender), r2(p2, role::receiver),
      t3(p3, role::sender), r3(p3, role::receiver);
  sink s1;
  forwarder f1(r1, {&t2}, s1.fn(), {.send = {.delta = true, .timeout = 10s}});
  forwarder f2(r2, {&t3}, {}, {.send = {.delta = true, .timeout = 10s}});
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
        CHECK(l->forwarded()[k][0].sent.delta == (k > 0));
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

TEST_CASE("forward: in a tree, a host that misses a version is reported, the others complete, it catches up") {
  model md = make_model(62);
  const manifest m = plan(md.refs, small_buckets);
  // trainer -> f1 -> {a, b}; b's link drops the first payload message (a delta chunk) of version 2.
  inproc_pipe p1, pa, pb;
  inproc_transport t1(p1, role::sender), r1(p1, role::receiver), ta(pa, role::sender), ra(pa, role::receiver),
      tb_inner(pb, role::sender), rb(pb, role::receiver);
  faulty_link tb(tb_inner);
  bool dropped = false;
  tb.on_send = [&](std::size_t, std::vector<std::byte>& meta, std::span<std::byte>) {
    const frame_type t = type_of(meta);
    if (dropped || (t != frame_type::bucket && t != frame_type::delta) || frame_version(meta) != 2) return true;
    dropped = true;
    return false;
  };
  forwarder f1(r1, {&ta, &tb}, {}, {.send = {.delta = true, .timeout = 2s}});
  receiver a(ra, [](const tensor_view&) {}), b(rb, [](const tensor_view&) {}, {.timeout = 300ms});
  sender tx(t1, m, md.refs, {.delta = true, .timeout = 10s});
  forwarder_loop l1(f1);
  receiver_loop la(a), lb(b);
  for (std::uint64_t v = 1; v <= 3; ++v) {
    if (v > 1) {
      rlpt::test::rng r(4000 + v);
      md.step(0.02, r);
    }
    tx.publish(v);
    REQUIRE(la.wait(v).size() == v);
    // f1 is done with b too once it reported version v.
    const auto until = clock::now() + 20s;
    while (l1.count() < v && clock::now() < until) std::this_thread::sleep_for(2ms);
  }
  l1.stop();
  const auto ups_b = lb.wait(3);
  la.stop();
  lb.stop();
  REQUIRE(l1.forwarded().size() == 3);
  const auto& fw = l1.forwarded();
  // Version 2: a got it, b's transfer failed (reported with an id), b stayed on version 1.
  CHECK(fw[1][0].ok);
  CHECK_FALSE(fw[1][1].ok);
  CHECK(fw[1][1].error_id.rfind("rlpt.sync.", 0) == 0);
  CHECK(dropped);
  // Version 3: a gets the delta from 2; b, still on 1, the delta from 1 (its sender's base is
  // the last version b acknowledged), and ends on exactly the trainer's bytes.
  CHECK(fw[2][0].ok);
  CHECK(fw[2][0].sent.delta);
  CHECK(fw[2][1].ok);
  CHECK(fw[2][1].sent.delta);
  CHECK(a.version() == 3);
  CHECK(b.version() == 3);
  check_mirror(a, md);
  check_mirror(b, md);
  REQUIRE(ups_b.size() == 3);
  CHECK(ups_b[0].published());
  CHECK(ups_b[1].failed());
  CHECK(ups_b[2].published());
  CHECK(ups_b[2].base_version == 1);
}
