// SPDX-License-Identifier: Apache-2.0
// pick_batch (window, orders, drop/requeue/wait, target version, closed), the starvation
// monitor's classification, the staleness histograms, and their errors.
#include <rlpt/staleness/compat.hpp>
#include <rlpt/staleness/metrics.hpp>
#include <rlpt/staleness/selection.hpp>

#include "support/errors.hpp"
#include "support/random.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <limits>
#include <vector>

using namespace rlpt;

namespace {
std::vector<candidate> versions(std::initializer_list<policy_version> vs) {
  std::vector<candidate> c;
  for (const auto v : vs) c.push_back({v, -1});
  return c;
}
std::vector<index_t> evicted(const pick_result& r) {
  std::vector<index_t> e;
  for (const auto& [p, a] : r.evict) e.push_back(p);
  return e;
}
} // namespace

TEST_CASE("the window drops (or requeues) items older than eta, the rest are taken oldest first") {
  const auto ready = versions({3, 0, 5, 4, 1, 5, 2});
  pick_result r = pick_batch(ready, 3, 5, {.max_staleness = 2});
  CHECK(r.status == pick_status::ready);
  CHECK(evicted(r) == std::vector<index_t>{1, 4, 6}); // versions 0, 1, 2 are more than 2 behind 5
  for (const auto& [p, a] : r.evict) CHECK(a == stale_action::drop);
  CHECK(r.eligible == 4);
  CHECK(r.take == std::vector<index_t>{0, 3, 2}); // versions 3, 4, 5 (first 5 by arrival)
  r = pick_batch(ready, 3, 5, {.max_staleness = 2, .on_stale = stale_policy::requeue});
  for (const auto& [p, a] : r.evict) CHECK(a == stale_action::requeue);
  // verl V1 preset: threshold 3 = staleness 2.
  r = pick_batch(ready, 3, 5, compat::verl::v1_selection(3));
  CHECK(evicted(r) == std::vector<index_t>{1, 4, 6});
  // No window (AReaL): nothing is stale.
  r = pick_batch(ready, 3, 5, compat::areal::selection());
  CHECK(r.evict.empty());
  CHECK(r.take == std::vector<index_t>{1, 4, 6});
}

TEST_CASE("freshest first takes the newest versions, ties in arrival order") {
  const auto ready = versions({2, 4, 3, 4, 1});
  const pick_result r = pick_batch(ready, 3, 4, {.max_staleness = 3, .order = pick_order::freshest_first});
  CHECK(r.take == std::vector<index_t>{1, 3, 2});
  CHECK(r.evict.empty());
}

TEST_CASE("too few eligible items: wait (evictions still apply), closed: a short batch, then drained") {
  const auto ready = versions({0, 3, 3});
  pick_result r = pick_batch(ready, 3, 3, {.max_staleness = 1});
  CHECK(r.status == pick_status::waiting);
  CHECK(r.take.empty());
  CHECK(evicted(r) == std::vector<index_t>{0});
  r = pick_batch(ready, 3, 3, {.max_staleness = 1}, {}, true);
  CHECK(r.status == pick_status::ready);
  CHECK(r.take == std::vector<index_t>{1, 2});
  r = pick_batch(versions({0}), 3, 3, {.max_staleness = 1}, {}, true);
  CHECK(r.status == pick_status::drained);
  CHECK(pick_batch({}, 2, 0, {}).status == pick_status::waiting);
}

TEST_CASE("target version: only items reserved for this step, missed targets are stale") {
  const std::vector<candidate> ready{{0, 2}, {1, 1}, {1, 2}, {0, 1}, {2, 3}};
  const selection_options o{.max_staleness = 2, .order = pick_order::target_version};
  pick_result r = pick_batch(ready, 2, 2, o);
  CHECK(r.status == pick_status::ready);
  CHECK(r.take == std::vector<index_t>{0, 2});
  CHECK(evicted(r) == std::vector<index_t>{1, 3}); // reserved for step 1, which is over
  // Not enough for this step yet, but one is in flight for it.
  const std::vector<version_count> flying{{2, 2, 1}, {2, 3, 4}};
  r = pick_batch(std::vector<candidate>{{1, 2}}, 2, 2, o, flying);
  CHECK(r.status == pick_status::waiting);
  CHECK(r.pending == 1);
  RLPT_CHECK_ERROR(pick_batch(versions({1}), 1, 2, o), "rlpt.staleness.no_target", "item 0 (version 1) has target -1");
}

TEST_CASE("wait: the consumer waits for an in-flight item that would age out, then takes it first") {
  // B = 1, eta = 2, at version 1: two items of version 0 are alive; they must be trained at
  // steps 1 and 2, so step 1 must take one of them even if a fresher item is ready.
  const selection_options o{.max_staleness = 2, .order = pick_order::freshest_first, .on_stale = stale_policy::wait};
  const std::vector<version_count> both_flying{{0, -1, 2}};
  pick_result r = pick_batch(versions({1}), 1, 1, o, both_flying);
  CHECK(r.status == pick_status::urgent);
  CHECK(r.must_take == 1);
  CHECK(r.take.empty());
  const std::vector<version_count> one_flying{{0, -1, 1}};
  r = pick_batch(versions({1, 0}), 1, 1, o, one_flying);
  CHECK(r.status == pick_status::ready);
  CHECK(r.take == std::vector<index_t>{1}); // the old one, although freshest_first
  // Without the pressure, freshest first applies.
  r = pick_batch(versions({1, 0}), 1, 1, o);
  CHECK(r.take == std::vector<index_t>{0});
  // Drop would not wait.
  r = pick_batch(versions({1}), 1, 1, {.max_staleness = 2}, both_flying);
  CHECK(r.status == pick_status::ready);
  // Already-stale items are dropped under wait as well (nothing to wait for).
  r = pick_batch(versions({0, 3}), 1, 3, o);
  CHECK(evicted(r) == std::vector<index_t>{0});
  CHECK(r.take == std::vector<index_t>{1});
}

TEST_CASE("wait agrees with a brute-force deadline check on random inputs") {
  // Property: when pick_batch takes a batch under `wait`, every remaining alive item can still
  // be scheduled before its deadline (EDF with `wanted` per step); when it waits, no batch of
  // ready items could achieve that.
  rlpt::test::rng rng(7);
  for (int trial = 0; trial < 3000; ++trial) {
    const index_t eta = rng.integer(0, 3), B = rng.integer(1, 3);
    const auto v = static_cast<policy_version>(rng.integer(eta, eta + 5));
    std::vector<candidate> ready;
    for (index_t i = rng.integer(0, 6); i > 0; --i)
      ready.push_back({static_cast<policy_version>(rng.integer(v - eta, v)), -1});
    std::vector<version_count> flying;
    for (index_t i = rng.integer(0, 3); i > 0; --i)
      flying.push_back({static_cast<policy_version>(rng.integer(v - eta, v)), -1, rng.integer(1, 2)});
    const selection_options o{.max_staleness = eta, .on_stale = stale_policy::wait};
    const pick_result r = pick_batch(ready, B, v, o, flying);
    // Deadlines of everything alive after this step's choice.
    auto feasible = [&](const std::vector<index_t>& taken) {
      std::vector<index_t> deadlines;
      std::vector<std::uint8_t> used(ready.size(), 0);
      for (const index_t p : taken) used[static_cast<std::size_t>(p)] = 1;
      for (std::size_t i = 0; i < ready.size(); ++i)
        if (!used[i]) deadlines.push_back(ready[i].version + eta);
      for (const auto& f : flying)
        for (index_t k = 0; k < f.count; ++k) deadlines.push_back(f.version + eta);
      std::sort(deadlines.begin(), deadlines.end());
      // Later steps v+1, v+2, ... take B each, earliest deadline first.
      for (std::size_t i = 0; i < deadlines.size(); ++i)
        if (deadlines[i] < v + 1 + static_cast<index_t>(i) / B) return false;
      return true;
    };
    auto any_feasible = [&] {
      const auto n = ready.size();
      for (std::uint32_t mask = 0; mask < (1u << n); ++mask) {
        if (static_cast<index_t>(__builtin_popcount(mask)) != B) continue;
        std::vector<index_t> take;
        for (std::size_t i = 0; i < n; ++i)
          if (mask & (1u << i)) take.push_back(static_cast<index_t>(i));
        if (feasible(take)) return true;
      }
      return false;
    };
    CAPTURE(trial);
    if (r.status == pick_status::ready) {
      CHECK(static_cast<index_t>(r.take.size()) == B);
      // Feasible whenever any choice is (an over-full window cannot be saved by any batch).
      if (!feasible(r.take)) CHECK_FALSE(any_feasible());
    } else if (r.status == pick_status::urgent) {
      CHECK_FALSE(any_feasible()); // waiting was necessary
    }
  }
}

TEST_CASE("selection errors name the item and the versions") {
  RLPT_CHECK_ERROR(pick_batch(versions({4}), 1, 3, {}), "rlpt.staleness.future_version", "item 0 has version 4",
                   "current version 3");
  RLPT_CHECK_ERROR(pick_batch(versions({1}), 0, 3, {}), "rlpt.staleness.bad_option", "0 wanted");
  RLPT_CHECK_ERROR(pick_batch(versions({1}), 1, 3, {.max_staleness = -3}), "rlpt.staleness.bad_option", "got -3");
  RLPT_CHECK_ERROR(pick_batch(versions({1}), 1, -1, {}), "rlpt.staleness.bad_version", "got -1");
  const std::vector<version_count> bad{{9, -1, 1}};
  RLPT_CHECK_ERROR(pick_batch(versions({1}), 1, 3, {}, bad), "rlpt.staleness.future_version", "version 9");
  RLPT_CHECK_ERROR(compat::verl::v1_selection(0), "rlpt.staleness.bad_option", "got 0");
  RLPT_CHECK_ERROR(compat::verl::v1_selection(2, stale_policy::requeue), "rlpt.staleness.bad_option", "slime");
  CHECK(compat::slime::selection(3).on_stale == stale_policy::requeue);
  CHECK(compat::trl::selection().max_staleness == 4);
}

TEST_CASE("starvation_monitor reports once per waiting episode, after the threshold, with a cause") {
  starvation_monitor m({.after_s = 10.0});
  pick_result waiting;
  waiting.eligible = 1;
  const std::vector<version_count> none;
  CHECK_FALSE(m.observe(0.0, waiting, 4, 3, 5, none));
  CHECK_FALSE(m.observe(9.0, waiting, 4, 3, 5, none));
  auto rep = m.observe(10.5, waiting, 4, 3, 5, none);
  REQUIRE(rep);
  CHECK(rep->cause == starvation_cause::no_producers);
  CHECK(rep->waited_s == doctest::Approx(10.5));
  CHECK(rep->eligible == 1);
  CHECK(rep->oldest_pending == -1);
  CHECK_FALSE(m.observe(30.0, waiting, 4, 3, 5, none)); // once per episode
  m.served();
  CHECK_FALSE(m.waiting());
  CHECK(m.observe(100.0, waiting, 4, 3, 0, none) == std::nullopt);
  rep = m.observe(111.0, waiting, 4, 3, 0, none);
  REQUIRE(rep);
  CHECK(rep->cause == starvation_cause::no_capacity);
  m.served();
  const std::vector<version_count> flying{{2, -1, 3}, {1, -1, 1}};
  pick_result dropped;
  dropped.evict = {{0, stale_action::drop}};
  CHECK_FALSE(m.observe(200.0, dropped, 4, 3, 0, flying));
  rep = m.observe(215.0, waiting, 4, 3, 0, flying);
  REQUIRE(rep);
  CHECK(rep->cause == starvation_cause::all_stale);
  CHECK(rep->dropped == 1);
  CHECK(rep->oldest_pending == 1);
  m.served();
  CHECK_FALSE(m.observe(300.0, waiting, 4, 3, 0, flying));
  rep = m.observe(320.0, waiting, 4, 3, 0, flying);
  REQUIRE(rep);
  CHECK(rep->cause == starvation_cause::slow_producers);
  CHECK(m.reports() == 4);
  RLPT_CHECK_ERROR(starvation_monitor({.after_s = -1.0}), "rlpt.staleness.bad_option", "-1");
  CHECK(fmt::format("{}", starvation_cause::missing_target) == "missing_target");
}

TEST_CASE("staleness histograms per item and per trained token") {
  const std::vector<policy_version> heads{5, 3, -1, 5, 4};
  const staleness_histogram h = item_staleness(heads, 5);
  CHECK(h.total() == 4);
  CHECK(h.at(0) == 2);
  CHECK(h.at(1) == 1);
  CHECK(h.at(2) == 1);
  CHECK(h.max() == 2);
  CHECK(h.mean() == doctest::Approx(0.75));
  CHECK(h.to_string() == "0:50.0% 1:25.0% 2:25.0%");
  const std::vector<policy_version> toks{-1, -1, 2, 2, 3, 1};
  const std::vector<mask_t> mask{0, 0, 1, 1, 1, 0};
  const staleness_histogram t = token_staleness(toks, mask, 3);
  CHECK(t.total() == 3);
  CHECK(t.at(1) == 2);
  CHECK(t.at(0) == 1);
  staleness_histogram m = h;
  m.merge(t);
  CHECK(m.total() == 7);
  CHECK(staleness_histogram{}.max() == -1);
  CHECK(staleness_histogram{}.to_string() == "-");
  RLPT_CHECK_ERROR(item_staleness(heads, 4), "rlpt.staleness.future_version", "item 0 has policy version 5",
                   "current version 4");
  RLPT_CHECK_ERROR(m.add(-1), "rlpt.staleness.bad_histogram", "staleness -1");
  const std::vector<mask_t> short_mask{1};
  RLPT_CHECK_ERROR(token_staleness(toks, short_mask, 3), "rlpt.view.size_mismatch", "token_staleness mask");
}

TEST_CASE("selection and histograms with huge windows, stalenesses and counts do not overflow") {
  constexpr index_t big = std::numeric_limits<index_t>::max();
  // eta = INT64_MAX under wait: deadlines version + eta used to overflow; nothing is ever stale.
  const selection_options o{.max_staleness = big, .on_stale = stale_policy::wait};
  const std::vector<version_count> flying{{0, -1, 3}};
  pick_result r = pick_batch(versions({0, 1}), 2, 5, o, flying);
  CHECK(r.status == pick_status::ready);
  CHECK(r.take == std::vector<index_t>{0, 1});
  CHECK(r.evict.empty());
  // (k - current)·wanted with a huge wanted.
  r = pick_batch(versions({0, 1}), big, 1, {.max_staleness = 3, .on_stale = stale_policy::wait}, flying);
  CHECK(r.status == pick_status::waiting);
  CHECK(r.must_take == 0);
  const std::vector<version_count> huge{{0, -1, big - 1}, {1, -1, big}};
  RLPT_CHECK_ERROR(pick_batch(versions({0}), 1, 5, o, huge), "rlpt.staleness.bad_option", "overflow", "entry 1");
  staleness_histogram h;
  RLPT_CHECK_ERROR(h.add(index_t{1} << 40), "rlpt.staleness.bad_histogram", "1099511627776", "2147483647");
  h.add(3, big - 1);
  RLPT_CHECK_ERROR(h.add(2, 2), "rlpt.staleness.bad_histogram", "adding 2 items", "9223372036854775806");
  CHECK(h.total() == big - 1);
}
