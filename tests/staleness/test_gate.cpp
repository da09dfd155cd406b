// SPDX-License-Identifier: Apache-2.0
// The version clock and the admission gate: AReaL's capacity formula against a reference
// model under random operations, eta = 0 synchronous admission, the concurrency cap, slot
// return on reject/release, the recovery rule, data-parallel shards, NeMo-RL target
// reservation, blocking admission, metrics and every error.
#include <rlpt/staleness/clock.hpp>
#include <rlpt/staleness/compat.hpp>
#include <rlpt/staleness/gate.hpp>
#include <rlpt/staleness/metrics.hpp>

#include "support/errors.hpp"
#include "support/random.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <limits>
#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

using namespace rlpt;
using namespace std::chrono_literals;

TEST_CASE("version_clock publishes, restores, wakes waiters and notifies subscribers until unsubscribed") {
  version_clock c(3);
  CHECK(c.current() == 3);
  std::vector<policy_version> seen;
  {
    auto sub = c.subscribe([&](policy_version v) { seen.push_back(v); });
    CHECK(c.publish() == 4);
    CHECK(c.publish() == 5);
    c.restore(2);
    CHECK(c.current() == 2);
  }
  c.publish(); // unsubscribed: not seen
  CHECK(seen == std::vector<policy_version>{4, 5, 2});
  CHECK_FALSE(c.wait_for(10, 1ms));
  std::thread t([&] {
    std::this_thread::sleep_for(5ms);
    c.publish();
  });
  CHECK(c.wait_for(4, 10s));
  t.join();
  RLPT_CHECK_ERROR(version_clock(-1), "rlpt.staleness.bad_version", "-1");
  RLPT_CHECK_ERROR(c.restore(-4), "rlpt.staleness.bad_version", "-4");
  RLPT_CHECK_ERROR(static_cast<void>(c.subscribe({})), "rlpt.staleness.bad_option", "callable");
  version_clock top(std::numeric_limits<policy_version>::max());
  RLPT_CHECK_ERROR(top.publish(), "rlpt.staleness.version_overflow", "2147483647");
}

namespace {

// Reference model of AReaL's StalenessManager counters.
struct reference_gate {
  index_t eta, B, cap;
  index_t running = 0, accepted = 0;
  index_t capacity(index_t v) const { return std::min(cap - running, (eta + v + 1) * B - (accepted + running)); }
};

} // namespace

TEST_CASE("capacity mode equals AReaL's formula under random admit/accept/reject/consume/release/publish") {
  for (std::uint64_t stream = 0; stream < 6; ++stream) {
    rlpt::test::rng rng(stream);
    const index_t eta = rng.integer(0, 4), B = rng.integer(1, 6), cap = rng.integer(1, 3 * B);
    staleness_gate g({.max_staleness = eta, .batch_groups = B, .max_concurrent = cap});
    reference_gate ref{eta, B, cap};
    std::vector<ticket> running, buffered;
    for (int op = 0; op < 3000; ++op) {
      const index_t v = g.version();
      REQUIRE(g.capacity() == ref.capacity(v));
      const double u = rng.uniform();
      if (u < 0.35) {
        const ticket t = g.try_admit();
        CHECK(static_cast<bool>(t) == (ref.capacity(v) > 0));
        if (t) {
          CHECK(t.version == v);
          CHECK(t.target == -1);
          ++ref.running;
          running.push_back(t);
        }
      } else if (u < 0.6 && !running.empty()) {
        const auto k = static_cast<std::size_t>(rng.integer(0, static_cast<index_t>(running.size()) - 1));
        const ticket t = running[k];
        running.erase(running.begin() + static_cast<std::ptrdiff_t>(k));
        --ref.running;
        if (rng.bernoulli(0.15)) {
          g.reject(t);
        } else {
          g.accept(t);
          ++ref.accepted;
          buffered.push_back(t);
        }
      } else if (u < 0.85 && !buffered.empty()) {
        const ticket t = buffered.front();
        buffered.erase(buffered.begin());
        if (rng.bernoulli(0.8)) {
          g.consume(t);
        } else {
          g.release(t, rng.bernoulli(0.5) ? release_reason::dropped : release_reason::requeued);
          --ref.accepted; // the slot returns
        }
      } else if (u < 0.9) {
        g.publish();
      }
      const gate_counts c = g.counts();
      REQUIRE(c.balanced());
      REQUIRE(c.running == ref.running);
      REQUIRE(c.accepted == ref.accepted);
      REQUIRE(c.buffered == static_cast<index_t>(buffered.size()));
    }
  }
}

TEST_CASE("eta = 0 admits exactly B groups per version: synchronous training") {
  staleness_gate g({.max_staleness = 0, .batch_groups = 3, .max_concurrent = 10});
  std::vector<ticket> ts;
  for (int i = 0; i < 3; ++i) ts.push_back(g.try_admit());
  for (const auto& t : ts) CHECK((t && t.version == 0));
  CHECK_FALSE(g.try_admit());
  for (const auto& t : ts) g.accept(t);
  CHECK_FALSE(g.try_admit()); // finished groups still count until the next version
  for (const auto& t : ts) g.consume(t);
  CHECK_FALSE(g.try_admit()); // the trainer has not published yet
  g.publish();
  for (int i = 0; i < 3; ++i) CHECK(g.try_admit().version == 1);
  CHECK_FALSE(g.try_admit());
  CHECK(g.pending_limit() == 3);
}

TEST_CASE("the concurrency cap, rejects and releases give slots back") {
  staleness_gate g({.max_staleness = 4, .batch_groups = 2, .max_concurrent = 3});
  const ticket a = g.try_admit(), b = g.try_admit(), c = g.try_admit();
  CHECK((a && b && c));
  CHECK_FALSE(g.try_admit()); // 3 running = the cap
  g.reject(a);
  const ticket d = g.try_admit();
  CHECK(d);
  g.accept(b);
  g.accept(c);
  g.accept(d);
  CHECK(g.capacity() == std::min<index_t>(3 - 0, (4 + 0 + 1) * 2 - 3));
  g.release(b, release_reason::dropped);
  CHECK(g.capacity() == std::min<index_t>(3, 10 - 2));
  const gate_counts n = g.counts();
  CHECK(n.admitted == 4);
  CHECK(n.rejected == 1);
  CHECK(n.dropped == 1);
  CHECK(n.buffered == 2);
  CHECK(n.balanced());
}

TEST_CASE("recover applies AReaL's recovery rule: no burst of (eta + v + 1)·B after a restart") {
  const gate_options o{.max_staleness = 1, .batch_groups = 4, .max_concurrent = 64};
  // Without the rule: a fresh gate whose clock is simply set to 10 admits a burst.
  {
    version_clock clk;
    gate_options naive = o;
    naive.clock = &clk;
    staleness_gate g(naive);
    clk.restore(10);
    CHECK(g.capacity() == std::min<index_t>(64, (1 + 10 + 1) * 4)); // 48 groups at once
  }
  staleness_gate g(o);
  const std::vector<recovered_group> survivors{{9, -1}, {10, -1}, {10, -1}};
  const std::vector<ticket> ts = g.recover(10, survivors);
  CHECK(g.version() == 10);
  REQUIRE(ts.size() == 3);
  CHECK(ts[0].version == 9);
  CHECK(g.capacity() == (1 + 1) * 4 - 3); // steady state: (eta + 1)·B minus what is already buffered
  const gate_counts c = g.counts();
  CHECK(c.accepted == 10 * 4 + 3);
  CHECK(c.buffered == 3);
  CHECK(c.balanced());
  for (const auto& t : ts) g.consume(t);
  const ticket t = g.try_admit();
  CHECK(t.version == 10);
  RLPT_CHECK_ERROR(g.recover(11), "rlpt.staleness.restore_busy", "1 running", "0 buffered");
  g.reject(t);
  RLPT_CHECK_ERROR(g.recover(5, std::vector<recovered_group>{{6, -1}}), "rlpt.staleness.bad_version",
                   "survivor 0 has version 6", "[0, 5]");
  version_clock shared(7);
  gate_options so = o;
  so.clock = &shared;
  staleness_gate sg(so);
  RLPT_CHECK_ERROR(sg.recover(8), "rlpt.staleness.restore_mismatch", "shows version 7", "asked for 8");
  CHECK(sg.recover(7).empty());
}

TEST_CASE("dp_shard splits B and the cap, shards share one clock and its publishes") {
  const gate_options global{.max_staleness = 2, .batch_groups = 8, .max_concurrent = 16};
  const gate_options shard = dp_shard(global, 4);
  CHECK(shard.batch_groups == 2);
  CHECK(shard.max_concurrent == 4);
  CHECK(dp_shard({.batch_groups = 6}, 3).max_concurrent == 2); // 0 = B before splitting
  RLPT_CHECK_ERROR(dp_shard(global, 3), "rlpt.staleness.dp_indivisible", "batch_groups 8", "dp_size 3");
  RLPT_CHECK_ERROR(dp_shard(global, 0), "rlpt.staleness.bad_option", "dp_size must be >= 1, got 0");

  version_clock clk;
  gate_options so = shard;
  so.clock = &clk;
  std::vector<std::unique_ptr<staleness_gate>> shards;
  for (int r = 0; r < 4; ++r) shards.push_back(std::make_unique<staleness_gate>(so));
  staleness_gate whole({.max_staleness = 2, .batch_groups = 8, .max_concurrent = 16});
  // Same admissions in total as the unsharded gate, split evenly.
  index_t total = 0;
  for (auto& s : shards) total += s->capacity();
  CHECK(total == whole.capacity());
  // A publish on the shared clock wakes a producer blocked on any shard.
  for (auto& s : shards)
    while (auto t = s->try_admit()) s->accept(t);
  std::atomic<bool> got{false};
  std::thread p([&] { got = static_cast<bool>(shards[2]->admit_for(10s)); });
  std::this_thread::sleep_for(5ms);
  clk.publish();
  p.join();
  CHECK(got.load());
  CHECK(shards[0]->version() == 1);
}

TEST_CASE("target mode reserves each group for one step in [v, v + eta], B per step") {
  staleness_gate g({.max_staleness = 2, .batch_groups = 2, .max_concurrent = 100, .mode = admission_mode::target});
  std::vector<ticket> ts;
  while (auto t = g.try_admit()) ts.push_back(t);
  REQUIRE(ts.size() == 6);
  std::vector<policy_version> targets;
  for (const auto& t : ts) targets.push_back(t.target);
  CHECK(targets == std::vector<policy_version>{0, 0, 1, 1, 2, 2});
  g.reject(ts[2]); // a reservation for step 1 frees up and is taken again first
  const ticket again = g.try_admit();
  CHECK(again.target == 1);
  for (const auto& t : {ts[0], ts[1]}) {
    g.accept(t);
    g.consume(t);
  }
  CHECK(g.capacity() == 0); // step 0's reservations stay used until the version moves on
  g.publish();
  CHECK(g.capacity() == 2); // window [1, 3]: step 3 is new
  CHECK(g.try_admit().target == 3);
  RLPT_CHECK_ERROR(staleness_gate({.max_staleness = unbounded_staleness, .mode = admission_mode::target}),
                   "rlpt.staleness.bad_option", "finite max_staleness");
}

TEST_CASE("blocking admission waits for capacity, times out, and returns empty once closed") {
  staleness_metrics m;
  staleness_gate g({.max_staleness = 0, .batch_groups = 1, .metrics = &m});
  const ticket a = g.admit();
  CHECK(a);
  CHECK_FALSE(g.admit_for(2ms));
  ticket b;
  std::thread p([&] { b = g.admit(); });
  std::this_thread::sleep_for(10ms);
  g.accept(a);
  g.consume(a);
  g.publish();
  p.join();
  CHECK((b && b.version == 1));
  std::thread q([&] { b = g.admit(); });
  std::this_thread::sleep_for(5ms);
  g.close();
  q.join();
  CHECK_FALSE(b);
  CHECK(g.closed());
  CHECK_FALSE(g.try_admit());
  const metrics_snapshot s = m.snapshot();
  CHECK(s.admitted == 2);
  CHECK(s.accepted == 1);
  CHECK(s.refused == 2);  // the wait ended by close, and the try after close
  CHECK(s.timeouts == 1); // admit_for(2ms)
  CHECK(s.generation_wait_s > 0.0);
}

TEST_CASE("gate errors name the ticket, the state and the values") {
  staleness_gate g({.max_staleness = 1, .batch_groups = 2});
  staleness_gate other({.max_staleness = 1, .batch_groups = 2});
  const ticket t = g.try_admit();
  const ticket foreign = other.try_admit();
  RLPT_CHECK_ERROR(g.accept(foreign), "rlpt.staleness.unknown_ticket", "accept got ticket 1", "not by this gate");
  RLPT_CHECK_ERROR(g.accept(ticket{}), "rlpt.staleness.unknown_ticket", "ticket 0");
  RLPT_CHECK_ERROR(g.consume(t), "rlpt.staleness.bad_transition", "still running");
  RLPT_CHECK_ERROR(g.release(t, release_reason::dropped), "rlpt.staleness.bad_transition", "reject() it");
  g.accept(t);
  RLPT_CHECK_ERROR(g.accept(t), "rlpt.staleness.bad_transition", "already accepted");
  RLPT_CHECK_ERROR(g.reject(t), "rlpt.staleness.bad_transition", "release(ticket");
  g.consume(t);
  RLPT_CHECK_ERROR(g.consume(t), "rlpt.staleness.unknown_ticket", "not outstanding");
  RLPT_CHECK_ERROR(staleness_gate({.batch_groups = 0}), "rlpt.staleness.bad_option",
                   "batch_groups must be >= 1, got 0");
  RLPT_CHECK_ERROR(staleness_gate({.max_staleness = -2}), "rlpt.staleness.bad_option", "got -2");
  RLPT_CHECK_ERROR(staleness_gate({.max_concurrent = -1}), "rlpt.staleness.bad_option", "max_concurrent");
}

TEST_CASE("unbounded staleness leaves only the concurrency cap (TRL's slots)") {
  staleness_gate g(compat::trl::gate(2, 4));
  CHECK(g.options().max_concurrent == 8);
  index_t n = 0;
  while (g.try_admit()) ++n;
  CHECK(n == 8);
  CHECK(g.pending_limit() == std::numeric_limits<index_t>::max());
  RLPT_CHECK_ERROR(compat::trl::gate(2, 0), "rlpt.staleness.bad_option", "got 0");
  const gate_options a = compat::areal::gate(16, 2);
  CHECK(a.max_staleness == 2);
  CHECK(a.batch_groups == 16);
  CHECK(staleness_gate(a).options().max_concurrent == 16); // AReaL: unset cap = consumer batch
}

TEST_CASE("gate options whose capacity overflows are errors, and a large eta in target mode costs nothing") {
  constexpr index_t big = std::numeric_limits<index_t>::max();
  // (eta + v + 1)·B used to overflow for a huge eta or B.
  RLPT_CHECK_ERROR(staleness_gate({.max_staleness = big}), "rlpt.staleness.bad_option",
                   "max_staleness = 9223372036854775807", "batch_groups = 1");
  RLPT_CHECK_ERROR(staleness_gate({.max_staleness = 2, .batch_groups = index_t{1} << 40}), "rlpt.staleness.bad_option",
                   "batch_groups = 1099511627776", "2147483647");
  RLPT_CHECK_ERROR(compat::trl::gate(index_t{1} << 40, index_t{1} << 40), "rlpt.staleness.bad_option",
                   "max_staleness * batch_groups");
  staleness_gate capacity({.max_staleness = index_t{1} << 40, .batch_groups = 4});
  CHECK(capacity.capacity() == 4); // the concurrency cap (max_concurrent = B) binds
  // Target mode: capacity counted over reserved steps only, not every step of a 2^40 window.
  staleness_gate target(
      {.max_staleness = index_t{1} << 40, .batch_groups = 2, .max_concurrent = 5, .mode = admission_mode::target});
  std::vector<policy_version> targets;
  while (auto t = target.try_admit()) targets.push_back(t.target);
  CHECK(targets == std::vector<policy_version>{0, 0, 1, 1, 2});
  CHECK(target.capacity() == 0);
}
