// SPDX-License-Identifier: Apache-2.0
// Seeded randomized simulations (tests/staleness/harness.hpp) asserting the invariants of
// admission + selection: the staleness bound, eta = 0 is synchronous, nothing lost or consumed
// twice, starvation is reported, and a restore mid-run keeps the bounds without a burst.
#include "harness.hpp"

#include <doctest/doctest.h>

#include <fmt/format.h>

#include <algorithm>
#include <set>
#include <string>

using namespace rlpt;
using rlpt::test::fate;
using rlpt::test::harness;
using rlpt::test::harness_config;
using rlpt::test::harness_result;

namespace {

// Every admitted group reached exactly one fate; the gate's books agree with the harness's.
void check_accounting(const harness_result& r, index_t alive_expected) {
  index_t alive = 0, consumed = 0, rejected = 0, dropped = 0, requeued = 0, lost = 0;
  for (const auto& [id, f] : r.fates) {
    switch (f) {
    case fate::alive:
      ++alive;
      break;
    case fate::consumed:
      ++consumed;
      break;
    case fate::rejected:
      ++rejected;
      break;
    case fate::dropped:
      ++dropped;
      break;
    case fate::requeued:
      ++requeued;
      break;
    case fate::lost_in_crash:
      ++lost;
      break;
    }
  }
  std::set<std::uint64_t> ids;
  for (const auto& g : r.consumed) CHECK_MESSAGE(ids.insert(g.id).second, "group ", g.id, " consumed twice");
  // Groups of the step in progress are consumed (fate) but not yet recorded as trained.
  CHECK(consumed >= static_cast<index_t>(r.consumed.size()));
  CHECK(alive == alive_expected);
  CHECK(r.dropped == dropped);
  CHECK(r.requeued == requeued);
  CHECK(r.final_counts.balanced());
  if (r.survivors_at_restore == 0 && r.burst_after_restore < 0) { // no restore: one gate saw everything
    CHECK(r.final_counts.admitted == static_cast<index_t>(r.fates.size()));
    CHECK(r.final_counts.consumed == consumed);
    CHECK(r.final_counts.rejected == rejected);
    CHECK(r.final_counts.dropped == dropped);
    CHECK(r.final_counts.requeued == requeued);
  }
}

const char* policy_name(stale_policy p) {
  return p == stale_policy::drop ? "drop" : p == stale_policy::wait ? "wait" : "requeue";
}

} // namespace

TEST_CASE("randomized: consumed staleness never exceeds eta, for every window policy and order") {
  for (const index_t eta : {0, 1, 2, 4})
    for (const stale_policy pol : {stale_policy::drop, stale_policy::wait, stale_policy::requeue})
      for (const pick_order order : {pick_order::oldest_first, pick_order::freshest_first})
        for (std::uint64_t seed = 1; seed <= 4; ++seed) {
          harness_config c;
          c.eta = eta;
          c.batch = 4;
          c.workers = 12;
          c.select = {.max_staleness = eta, .order = order, .on_stale = pol};
          c.seed = seed * 7919 + static_cast<std::uint64_t>(eta);
          harness h(c);
          harness_result r = h.run();
          CAPTURE(eta);
          const std::string policy = policy_name(pol);
          CAPTURE(policy);
          CAPTURE(seed);
          CHECK(r.steps_done == c.steps);
          index_t worst = 0;
          for (const auto& g : r.consumed) worst = std::max<index_t>(worst, g.trained_at - g.head);
          CHECK(worst <= eta);
          check_accounting(r, h.ready_count() + h.flight_count());
          // The gate never lets more than the concurrency cap run.
          CHECK(r.max_running <= std::max(c.batch, c.workers));
          // Wait + the gate's bound: the consumer waits instead of wasting work.
          if (pol == stale_policy::wait) CHECK(r.dropped == 0);
        }
}

TEST_CASE("randomized: eta = 0 is synchronous on-policy training") {
  for (const admission_mode mode : {admission_mode::capacity, admission_mode::target})
    for (std::uint64_t seed = 1; seed <= 6; ++seed) {
      harness_config c;
      c.eta = 0;
      c.batch = 5;
      c.workers = 16; // far more engine slots than a synchronous step may use
      c.mode = mode;
      c.select = {.max_staleness = 0,
                  .order = mode == admission_mode::target ? pick_order::target_version : pick_order::oldest_first,
                  .on_stale = stale_policy::drop};
      c.seed = 100 + seed;
      harness h(c);
      harness_result r = h.run();
      CAPTURE(seed);
      CHECK(r.steps_done == c.steps);
      CHECK(r.dropped == 0);
      // At most B groups (plus replacements for failures) per version, never more at once.
      CHECK(r.max_running <= c.batch);
      for (const auto& g : r.consumed) {
        // Every token of every consumed sample came from the version that trains on it.
        CHECK(g.head == g.trained_at);
        CHECK(g.tail == g.trained_at);
      }
      check_accounting(r, h.ready_count() + h.flight_count());
    }
}

TEST_CASE("randomized: target-version reservation trains step v only on groups reserved for v") {
  for (const index_t eta : {1, 2, 4})
    for (std::uint64_t seed = 1; seed <= 4; ++seed) {
      harness_config c;
      c.eta = eta;
      c.batch = 4;
      c.workers = 24;
      c.mode = admission_mode::target;
      c.select = {.max_staleness = eta, .order = pick_order::target_version, .on_stale = stale_policy::drop};
      c.seed = 300 + seed;
      harness h(c);
      harness_result r = h.run();
      CAPTURE(eta);
      CAPTURE(seed);
      CHECK(r.steps_done == c.steps);
      CHECK(r.dropped == 0); // the trainer waits for its reserved groups; none misses its step
      for (const auto& g : r.consumed) CHECK(g.trained_at - g.head <= eta);
      check_accounting(r, h.ready_count() + h.flight_count());
    }
}

TEST_CASE("randomized: admission alone bounds the head version only on average, the window makes it hard") {
  // AReaL relies on admission; with heavy-tailed generation times a group can finish after the
  // trainer moved past d + eta. With the window (drop) such groups never reach the trainer.
  index_t over = 0, over_windowed = 0;
  for (std::uint64_t seed = 1; seed <= 8; ++seed) {
    harness_config c;
    c.eta = 1;
    c.batch = 4;
    c.workers = 8;
    c.seed = 500 + seed;
    c.select = {.max_staleness = unbounded_staleness};
    harness_result r = harness(c).run();
    for (const auto& g : r.consumed) over += (g.trained_at - g.head > c.eta) ? 1 : 0;
    c.select = {.max_staleness = 1, .on_stale = stale_policy::drop};
    harness_result w = harness(c).run();
    for (const auto& g : w.consumed) over_windowed += (g.trained_at - g.head > c.eta) ? 1 : 0;
  }
  CHECK(over > 0);
  CHECK(over_windowed == 0);
}

TEST_CASE("randomized: starvation is reported when producers stall, with its cause") {
  SUBCASE("producers stop admitting: no_producers") {
    harness_config c;
    c.eta = 2;
    c.stall_after_step = 10;
    c.select = {.max_staleness = 2};
    harness h(c);
    harness_result r = h.run();
    CHECK(r.steps_done < c.steps);
    REQUIRE(r.starvations.size() >= 1);
    const auto& s = r.starvations.back();
    CHECK(s.cause == starvation_cause::no_producers);
    CHECK(s.pending == 0);
    CHECK(s.capacity > 0);
    CHECK(s.waited_s >= c.starvation_after);
    CHECK(s.eligible < c.batch);
  }
  SUBCASE("generations hang: slow_producers, with the oldest in-flight version") {
    harness_config c;
    c.eta = 1;
    c.hang_after_step = 5;
    c.select = {.max_staleness = unbounded_staleness};
    harness h(c);
    harness_result r = h.run();
    REQUIRE(r.starvations.size() >= 1);
    const auto& s = r.starvations.back();
    CHECK(s.cause == starvation_cause::slow_producers);
    CHECK(s.oldest_pending >= 0);
    CHECK(s.oldest_pending <= s.version);
  }
  SUBCASE("the trainer wants more than the gate ever admits: no_capacity") {
    harness_config c;
    c.eta = 0;
    c.batch = 4;
    c.trainer_batch = 6;
    c.reject_prob = 0.0;
    c.select = {.max_staleness = 0};
    harness h(c);
    harness_result r = h.run();
    CHECK(r.steps_done == 0);
    REQUIRE(r.starvations.size() == 1);
    CHECK(r.starvations[0].cause == starvation_cause::no_capacity);
    CHECK(r.starvations[0].capacity == 0);
    CHECK(r.starvations[0].eligible == 4);
  }
  SUBCASE("target mode with a batch larger than the reservations: missing_target") {
    harness_config c;
    c.eta = 1;
    c.batch = 3;
    c.trainer_batch = 4;
    c.mode = admission_mode::target;
    c.select = {.max_staleness = 1, .order = pick_order::target_version};
    harness h(c);
    harness_result r = h.run();
    REQUIRE(r.starvations.size() == 1);
    CHECK(r.starvations[0].cause == starvation_cause::missing_target);
  }
}

TEST_CASE("randomized: a restore mid-run keeps the bounds and applies the recovery rule (no burst)") {
  for (const index_t eta : {0, 1, 3})
    for (const stale_policy pol : {stale_policy::drop, stale_policy::wait})
      for (std::uint64_t seed = 1; seed <= 4; ++seed) {
        harness_config c;
        c.eta = eta;
        c.batch = 4;
        c.workers = 32;
        c.restore_at_step = 17;
        c.select = {.max_staleness = eta, .on_stale = pol};
        c.seed = 900 + seed;
        harness h(c);
        harness_result r = h.run();
        CAPTURE(eta);
        CAPTURE(seed);
        CHECK(r.steps_done == c.steps);
        // Right after recovery, at version v: accepted = v·B + survivors, nothing running, so
        // capacity = min(cap, (eta + 1)·B − survivors), not (eta + v + 1)·B.
        const index_t cap = std::max(c.batch, c.workers);
        CHECK(r.burst_after_restore == std::min(cap, (eta + 1) * c.batch - r.survivors_at_restore));
        for (const auto& g : r.consumed) CHECK(g.trained_at - g.head <= eta);
        check_accounting(r, h.ready_count() + h.flight_count());
      }
}
