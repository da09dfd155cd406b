// SPDX-License-Identifier: Apache-2.0
// rollout_buffer semantics: group completion, ordering, partial groups, filters and refill
// accounting, capacity and its policies, blocking/try/timeout variants, close, selectors,
// and the accounting invariant after every scenario.
#include <rlpt/rollout/buffer.hpp>

#include "helpers.hpp"
#include "support/errors.hpp"
#include "support/random.hpp"

#include <doctest/doctest.h>

#include <atomic>
#include <stdexcept>
#include <chrono>
#include <thread>
#include <vector>

using namespace rlpt;
using namespace std::chrono_literals;

namespace {

trajectory rec(test::rng& r, std::int64_t group, std::int32_t sample, float reward = 0.0f, policy_version v = 0) {
  return test::make_record(r, group, sample, 3, 2 + sample % 3, v, reward);
}

std::vector<std::int64_t> group_ids_of(const rollout_batch& b) {
  std::vector<std::int64_t> ids;
  for (const auto& g : b.group_infos()) ids.push_back(g.id);
  return ids;
}

void check_balanced(const rollout_buffer& buf) {
  const buffer_stats s = buf.stats();
  CHECK_MESSAGE(s.balanced(), "inserted ", s.inserted.records, " consumed ", s.consumed.records, " evicted ",
                s.evicted_total().records, " resident ", s.resident.records);
}

} // namespace

TEST_CASE("a group becomes ready only when all its records arrived, pop returns whole groups in ready order") {
  test::rng r(10);
  rollout_buffer buf({.capacity_groups = 8, .group_size = 3});
  CHECK(buf.push(rec(r, 1, 2)));
  CHECK(buf.push(rec(r, 2, 0)));
  CHECK(buf.push(rec(r, 1, 0)));
  CHECK(buf.push(rec(r, 2, 1)));
  CHECK_FALSE(buf.try_pop(1).has_value());
  CHECK(buf.stats().open_groups == 2);
  CHECK(buf.push(rec(r, 2, 2))); // group 2 completes first
  CHECK(buf.push(rec(r, 1, 1)));
  const rollout_batch b = buf.pop(2);
  REQUIRE(b.size() == 6);
  CHECK(group_ids_of(b) == std::vector<std::int64_t>{2, 1});
  CHECK(std::vector<index_t>(b.group_offsets().begin(), b.group_offsets().end()) == std::vector<index_t>{0, 3, 6});
  // Within a group, records are ordered by sample_index whatever the arrival order.
  CHECK(std::vector<std::int32_t>(b.sample_indices().begin(), b.sample_indices().end()) ==
        std::vector<std::int32_t>{0, 1, 2, 0, 1, 2});
  const auto infos = b.group_infos();
  CHECK(infos[0].ordinal == 1); // group 1 was opened first
  CHECK(infos[1].ordinal == 0);
  CHECK(infos[0].ready_seq == 0);
  CHECK(infos[1].ready_seq == 1);
  CHECK(infos[0].samples == 3);
  CHECK(infos[0].tokens == b.offsets()[3]);
  CHECK(b.groups().num_groups() == 2);
  const buffer_stats s = buf.stats();
  CHECK(s.inserted == flow_count{6, 2, b.num_tokens()});
  CHECK(s.consumed == s.inserted);
  CHECK(s.resident == flow_count{});
  check_balanced(buf);
}

TEST_CASE("groups are never extended or split: late records and duplicate samples are errors") {
  test::rng r(11);
  rollout_buffer buf({.capacity_groups = 4, .group_size = 2});
  CHECK(buf.push(rec(r, 5, 0)));
  RLPT_CHECK_ERROR(buf.push(rec(r, 5, 0)), "rlpt.rollout.bad_group", "group 5", "sample_index 0");
  CHECK(buf.push(rec(r, 5, 1)));
  RLPT_CHECK_ERROR(buf.push(rec(r, 5, 2)), "rlpt.rollout.group_complete", "group 5", "never extended or split");
  CHECK(buf.stats().inserted.records == 2); // rejected records are not counted
  (void)buf.pop(1);
  CHECK(buf.push(rec(r, 5, 0))); // the id is free again once consumed
  CHECK(buf.stats().open_groups == 1);
  check_balanced(buf);
}

TEST_CASE("invalid records are rejected on push, naming the field") {
  test::rng r(12);
  rollout_buffer buf({.group_size = 1});
  trajectory t = rec(r, 0, 0);
  t.versions.pop_back();
  RLPT_CHECK_ERROR(buf.push(std::move(t)), "rlpt.rollout.record_size", "versions");
  CHECK(buf.stats().inserted.records == 0);
}

TEST_CASE("close_group releases a partial group per min_group_size, abort_group evicts") {
  test::rng r(13);
  std::vector<evicted_group> evicted;
  rollout_buffer buf({.capacity_groups = 8, .group_size = 4, .min_group_size = 2, .on_evict = [&](evicted_group&& g) {
                        evicted.push_back(std::move(g));
                      }});
  for (int s = 0; s < 3; ++s) CHECK(buf.push(rec(r, 1, s)));
  CHECK(buf.push(rec(r, 2, 0)));
  for (int s = 0; s < 2; ++s) CHECK(buf.push(rec(r, 3, s)));
  CHECK(buf.close_group(1));
  CHECK(buf.close_group(2)); // 1 record < 2: incomplete
  CHECK_FALSE(buf.close_group(99));
  CHECK(buf.abort_group(3));
  CHECK_FALSE(buf.abort_group(3));
  const rollout_batch b = buf.pop(1);
  REQUIRE(b.num_groups() == 1);
  CHECK(b.group_infos()[0].partial);
  CHECK(b.group_infos()[0].samples == 3);
  CHECK(b.group_infos()[0].expected == 4);
  REQUIRE(evicted.size() == 2);
  CHECK(evicted[0].info.id == 2);
  CHECK(evicted[0].reason == evict_reason::incomplete);
  CHECK(evicted[0].records.size() == 1);
  CHECK(evicted[1].info.id == 3);
  CHECK(evicted[1].records.size() == 2);
  const buffer_stats s = buf.stats();
  CHECK(s.evicted_by(evict_reason::incomplete) == flow_count{3, 2, evicted[0].info.tokens + evicted[1].info.tokens});
  check_balanced(buf);
}

TEST_CASE("by default a partial group is never released (all or retry)") {
  test::rng r(14);
  rollout_buffer buf({.group_size = 4});
  for (int s = 0; s < 3; ++s) CHECK(buf.push(rec(r, 1, s)));
  CHECK(buf.close_group(1));
  CHECK(buf.stats().evicted_by(evict_reason::incomplete).records == 3);
  CHECK_FALSE(buf.try_pop(1).has_value());
}

TEST_CASE("open_group declares ragged group sizes") {
  test::rng r(15);
  rollout_buffer buf({.capacity_groups = 4, .group_size = 8});
  CHECK(buf.open_group(1, 2) == push_status::ok);
  RLPT_CHECK_ERROR(buf.open_group(1, 2), "rlpt.rollout.bad_group", "already open");
  RLPT_CHECK_ERROR(buf.open_group(2, 0), "rlpt.rollout.bad_group", "0 records");
  CHECK(buf.push(rec(r, 1, 0)));
  CHECK(buf.push(rec(r, 1, 1)));
  const rollout_batch b = buf.pop(1);
  CHECK(b.size() == 2);
  CHECK_FALSE(b.group_infos()[0].partial);
  // A declared group that is aborted before any record arrives is accounted as a group.
  CHECK(buf.open_group(3, 2) == push_status::ok);
  CHECK(buf.abort_group(3));
  CHECK(buf.stats().evicted_by(evict_reason::incomplete) == flow_count{0, 1, 0});
  check_balanced(buf);
}

TEST_CASE("DAPO filter drops all-equal groups and refill says how many more to start") {
  test::rng r(16);
  std::vector<evicted_group> evicted;
  rollout_buffer buf(
      {.capacity_groups = 16, .group_size = 4, .filters = {filters::dapo()}, .on_evict = [&](evicted_group&& g) {
         evicted.push_back(std::move(g));
       }});
  for (int s = 0; s < 4; ++s) CHECK(buf.push(rec(r, 1, s, 1.0f)));                      // all equal: dropped
  for (int s = 0; s < 4; ++s) CHECK(buf.push(rec(r, 2, s, static_cast<float>(s % 2)))); // kept
  for (int s = 0; s < 2; ++s) CHECK(buf.push(rec(r, 3, s, 0.0f)));                      // open
  const buffer_stats s = buf.stats();
  CHECK(s.completed_groups == 2);
  CHECK(s.dropped_by_filter == std::vector<index_t>{1});
  CHECK(s.evicted_by(evict_reason::filtered).groups == 1);
  CHECK(s.evicted_by(evict_reason::filtered).records == 4);
  REQUIRE(evicted.size() == 1);
  CHECK(evicted[0].info.id == 1);
  const refill_info f = buf.refill(4);
  CHECK(f.ready == 1);
  CHECK(f.open == 1);
  CHECK(f.needed == 2);
  CHECK(f.pass_rate == doctest::Approx(0.5));
  CHECK(f.suggested == 5); // ceil((4 - 1) / 0.5) - 1 open
  CHECK(buf.refill(1).needed == 0);
  CHECK(buf.refill(1).suggested == 0);
  check_balanced(buf);
}

TEST_CASE("filter details: eps, singletons, channels, predicates") {
  test::rng r(17);
  std::vector<trajectory> g;
  for (int s = 0; s < 3; ++s) g.push_back(rec(r, 0, s, 1.0f + 1e-8f * static_cast<float>(s)));
  const group_view v{0, g};
  CHECK(filters::nonzero_std{}(v) == (g[0].rewards[0] != g[2].rewards[0]));
  CHECK_FALSE(filters::nonzero_std{.eps = 1e-6}(v));
  std::vector<trajectory> one{rec(r, 0, 0)};
  CHECK(filters::nonzero_std{}(group_view{0, one}));
  CHECK_FALSE(filters::nonzero_std{.keep_singletons = false}(group_view{0, one}));
  RLPT_CHECK_ERROR(filters::nonzero_std{.channel = 2}(v), "rlpt.rollout.bad_option", "channel 2");

  rollout_buffer buf({.group_size = 1, .filters = {filters::predicate("short", [](const group_view& x) {
                                         return x.records[0].size() > 5;
                                       })}});
  CHECK(buf.push(test::make_record(r, 1, 0, 2, 2)));
  CHECK(buf.push(test::make_record(r, 2, 0, 2, 6)));
  CHECK(buf.stats().evicted_by(evict_reason::rejected).groups == 1);
  CHECK(group_ids_of(buf.pop(1)) == std::vector<std::int64_t>{2});
  RLPT_CHECK_ERROR(rollout_buffer({.filters = {group_filter{"empty", evict_reason::rejected, {}}}}),
                   "rlpt.rollout.bad_option", "filter 'empty'");
}

TEST_CASE("capacity counts groups: new groups wait, records of open groups never do") {
  test::rng r(18);
  rollout_buffer buf({.capacity_groups = 2, .group_size = 2});
  CHECK(buf.push(rec(r, 1, 0)));
  CHECK(buf.push(rec(r, 2, 0)));
  trajectory t = rec(r, 3, 0);
  const auto tokens = t.tokens;
  CHECK(buf.try_push(std::move(t)) == push_status::full);
  CHECK(t.tokens == tokens); // untouched when not accepted
  CHECK(buf.push_for(std::move(t), 5ms) == push_status::timeout);
  CHECK(buf.try_open_group(3, 2) == push_status::full);
  CHECK(buf.try_push(rec(r, 1, 1)) == push_status::ok); // open group: always room
  CHECK(buf.push(rec(r, 2, 1)));

  // A producer blocked on a full buffer proceeds once a consumer takes a group.
  std::atomic<bool> pushed{false};
  std::thread producer([&] {
    CHECK(buf.push(std::move(t)));
    pushed = true;
  });
  std::this_thread::sleep_for(20ms);
  CHECK_FALSE(pushed.load());
  CHECK(buf.pop(1).num_groups() == 1);
  producer.join();
  CHECK(pushed.load());
  CHECK(buf.stats().open_groups == 1);
  CHECK(buf.stats().ready_groups == 1);
  check_balanced(buf);
}

TEST_CASE("drop_oldest evicts the oldest ready group when full (verl fully_async)") {
  test::rng r(19);
  std::vector<std::int64_t> dropped;
  rollout_buffer buf({.capacity_groups = 2,
                      .group_size = 1,
                      .when_full = full_policy::drop_oldest,
                      .on_evict = [&](evicted_group&& g) { dropped.push_back(g.info.id); }});
  for (int g = 0; g < 5; ++g) CHECK(buf.push(rec(r, g, 0)));
  CHECK(dropped == std::vector<std::int64_t>{0, 1, 2});
  CHECK(buf.stats().evicted_by(evict_reason::overflow).groups == 3);
  CHECK(group_ids_of(buf.pop(2)) == std::vector<std::int64_t>{3, 4});
  check_balanced(buf);
}

TEST_CASE("blocking pop waits for a group, close wakes producers and consumers") {
  test::rng r(20);
  rollout_buffer buf({.capacity_groups = 1, .group_size = 2});
  std::thread consumer([&] {
    const rollout_batch b = buf.pop(1);
    CHECK(b.num_groups() == 1);
    CHECK(b.size() == 2);
  });
  std::this_thread::sleep_for(10ms);
  CHECK(buf.push(rec(r, 1, 0)));
  CHECK(buf.push(rec(r, 1, 1)));
  consumer.join();

  CHECK(buf.push(rec(r, 2, 0)));
  trajectory t = rec(r, 3, 0);
  std::thread producer([&] { CHECK_FALSE(buf.push(std::move(t))); }); // blocks: full
  std::thread waiting([&] { CHECK(buf.pop(1).empty()); });            // blocks: nothing ready
  std::this_thread::sleep_for(20ms);
  buf.close();
  producer.join();
  waiting.join();
  CHECK(buf.closed());
  CHECK(t.size() > 0); // returned to the caller untouched
  CHECK_FALSE(buf.push(rec(r, 2, 1)));
  CHECK(buf.pop_for(1, 1ms).has_value()); // closed: an (empty) batch, not a timeout
  CHECK(buf.stats().open_groups == 1);    // still resident
  CHECK(buf.evict_incomplete() == 1);
  const buffer_stats s = buf.stats();
  CHECK(s.resident == flow_count{});
  CHECK(s.closed);
  check_balanced(buf);
}

TEST_CASE("after close pop drains what is ready, possibly fewer groups, then returns empty") {
  test::rng r(21);
  rollout_buffer buf({.capacity_groups = 8, .group_size = 1});
  for (int g = 0; g < 3; ++g) CHECK(buf.push(rec(r, g, 0)));
  buf.close();
  CHECK(buf.pop(2).num_groups() == 2);
  CHECK(buf.try_pop(2)->num_groups() == 1);
  CHECK(buf.pop(2).empty());
  CHECK_FALSE(buf.try_pop(2).has_value());
  check_balanced(buf);
}

TEST_CASE("pop_for times out without taking anything") {
  test::rng r(22);
  rollout_buffer buf({.capacity_groups = 8, .group_size = 1});
  CHECK(buf.push(rec(r, 1, 0)));
  const auto t0 = std::chrono::steady_clock::now();
  CHECK_FALSE(buf.pop_for(2, 20ms).has_value());
  CHECK(std::chrono::steady_clock::now() - t0 >= 20ms);
  CHECK(buf.stats().ready_groups == 1);
  CHECK(buf.pop_for(1, 20ms)->num_groups() == 1);
}

TEST_CASE("selectors choose and evict among ready groups (the staleness seam)") {
  test::rng r(23);
  std::vector<evicted_group> evicted;
  rollout_buffer buf({.capacity_groups = 16, .group_size = 1, .on_evict = [&](evicted_group&& g) {
                        evicted.push_back(std::move(g));
                      }});
  for (int g = 0; g < 6; ++g) CHECK(buf.push(rec(r, g, 0, 0.0f, g))); // group g generated by version g

  // A version window: drop what is older than `now - 2`, take the freshest first.
  std::atomic<int> now{5};
  const group_selector window = [&](std::span<const group_info> ready, index_t want, bool, selection& out) {
    for (std::size_t i = ready.size(); i-- > 0;) {
      if (ready[i].head_version < now - 2)
        out.evict.push_back({static_cast<index_t>(i), evict_reason::stale});
      else if (static_cast<index_t>(out.take.size()) < want)
        out.take.push_back(static_cast<index_t>(i));
    }
  };
  const rollout_batch b = buf.pop(2, window);
  CHECK(group_ids_of(b) == std::vector<std::int64_t>{5, 4});
  REQUIRE(evicted.size() == 3);
  CHECK(evicted[0].reason == evict_reason::stale);
  CHECK(buf.stats().evicted_by(evict_reason::stale).groups == 3);
  CHECK(buf.stats().ready_groups == 1); // group 3 stays

  // Wanting more than the window allows: the consumer waits; evictions already applied.
  CHECK_FALSE(buf.pop_for(2, 5ms, window).has_value());
  std::thread consumer([&] { CHECK(group_ids_of(buf.pop(2, window)) == std::vector<std::int64_t>{6, 3}); });
  std::this_thread::sleep_for(10ms);
  CHECK(buf.push(rec(r, 6, 0, 0.0f, 6)));
  consumer.join();

  // notify() re-runs a waiting selector after an outside change (a version bump).
  CHECK(buf.push(rec(r, 7, 0, 0.0f, 7)));
  std::atomic<int> min_version{8};
  const group_selector fresh = [&](std::span<const group_info> ready, index_t want, bool, selection& out) {
    for (std::size_t i = 0; i < ready.size() && static_cast<index_t>(out.take.size()) < want; ++i)
      if (ready[i].head_version >= min_version) out.take.push_back(static_cast<index_t>(i));
  };
  std::thread waiter([&] { CHECK(group_ids_of(buf.pop(1, fresh)) == std::vector<std::int64_t>{7}); });
  std::this_thread::sleep_for(10ms);
  min_version = 7;
  buf.notify();
  waiter.join();
  check_balanced(buf);
}

TEST_CASE("invalid selections and options are errors naming the values") {
  test::rng r(24);
  rollout_buffer buf({.capacity_groups = 4, .group_size = 1});
  for (int g = 0; g < 3; ++g) CHECK(buf.push(rec(r, g, 0)));
  auto sel = [](std::vector<index_t> take, std::vector<std::pair<index_t, evict_reason>> ev) {
    return [take, ev](std::span<const group_info>, index_t, bool, selection& out) {
      out.take = take;
      out.evict = ev;
    };
  };
  RLPT_CHECK_ERROR(buf.pop(1, sel({5}, {})), "rlpt.rollout.bad_selection", "position 5", "3 groups");
  RLPT_CHECK_ERROR(buf.pop(2, sel({1, 1}, {})), "rlpt.rollout.bad_selection", "position 1 twice");
  RLPT_CHECK_ERROR(buf.pop(2, sel({0}, {{0, evict_reason::stale}})), "rlpt.rollout.bad_selection", "twice");
  RLPT_CHECK_ERROR(buf.pop(1, sel({0, 1}, {})), "rlpt.rollout.bad_selection", "takes 2", "1 wanted");
  CHECK(buf.stats().ready_groups == 3); // nothing moved by a rejected selection
  RLPT_CHECK_ERROR(buf.pop(0), "rlpt.rollout.bad_pop", "0 groups");
  RLPT_CHECK_ERROR(buf.pop(5), "rlpt.rollout.bad_pop", "5 groups", "capacity_groups = 4");
  RLPT_CHECK_ERROR(rollout_buffer({.capacity_groups = 0}), "rlpt.rollout.bad_option", "capacity_groups");
  RLPT_CHECK_ERROR(rollout_buffer({.group_size = 0}), "rlpt.rollout.bad_option", "group_size");
  RLPT_CHECK_ERROR(rollout_buffer({.group_size = 2, .min_group_size = 3}), "rlpt.rollout.bad_option",
                   "min_group_size 3");
  check_balanced(buf);
}

TEST_CASE("discard_ready and evict_incomplete empty the buffer with reasons") {
  test::rng r(25);
  rollout_buffer buf({.capacity_groups = 8, .group_size = 2});
  for (int g = 0; g < 3; ++g) {
    CHECK(buf.push(rec(r, g, 0)));
    CHECK(buf.push(rec(r, g, 1)));
  }
  CHECK(buf.push(rec(r, 9, 0)));
  CHECK(buf.discard_ready() == 3);
  CHECK(buf.evict_incomplete() == 1);
  const buffer_stats s = buf.stats();
  CHECK(s.evicted_by(evict_reason::discarded).records == 6);
  CHECK(s.evicted_by(evict_reason::incomplete).records == 1);
  CHECK(s.resident == flow_count{});
  CHECK(s.open_groups == 0);
  CHECK(s.ready_groups == 0);
  check_balanced(buf);
}

TEST_CASE("pop_into reuses the caller's batch and reports the end of the stream") {
  test::rng r(26);
  rollout_buffer buf({.capacity_groups = 8, .group_size = 2});
  for (int g = 0; g < 3; ++g) {
    CHECK(buf.push(rec(r, g, 0)));
    CHECK(buf.push(rec(r, g, 1)));
  }
  rollout_batch b;
  REQUIRE(buf.pop_into(b, 2));
  CHECK(group_ids_of(b) == std::vector<std::int64_t>{0, 1});
  const token_id* storage = b.tokens().data();
  REQUIRE(buf.pop_into(b, 1));
  CHECK(group_ids_of(b) == std::vector<std::int64_t>{2});
  CHECK(b.size() == 2);
  CHECK(b.tokens().data() == storage); // same storage, no reallocation for a smaller batch
  buf.close();
  CHECK_FALSE(buf.pop_into(b, 1));
  CHECK(b.empty());
  check_balanced(buf);
}

TEST_CASE("a throwing filter rejects its group, keeps the accounting and reaches the caller") {
  test::rng r(27);
  std::vector<std::int64_t> evicted;
  rollout_buffer buf({.group_size = 2,
                      .filters = {filters::predicate("boom",
                                                     [](const group_view& g) -> bool {
                                                       if (g.id == 3) throw std::runtime_error("reward model down");
                                                       return true;
                                                     })},
                      .on_evict = [&](evicted_group&& g) { evicted.push_back(g.info.id); }});
  CHECK(buf.push(rec(r, 3, 0)));
  CHECK_THROWS_WITH_AS(buf.push(rec(r, 3, 1)), "reward model down", std::runtime_error);
  CHECK(evicted == std::vector<std::int64_t>{3});
  const buffer_stats s = buf.stats();
  CHECK(s.evicted_by(evict_reason::rejected).records == 2);
  CHECK(s.dropped_by_filter == std::vector<index_t>{1});
  check_balanced(buf);
  // An unknown eviction reason from a selector is an error, not an out-of-range counter.
  CHECK(buf.push(rec(r, 4, 0)));
  CHECK(buf.push(rec(r, 4, 1)));
  RLPT_CHECK_ERROR(buf.pop(1,
                           [](std::span<const group_info>, index_t, bool, selection& out) {
                             out.evict.push_back({0, static_cast<evict_reason>(42)});
                           }),
                   "rlpt.rollout.bad_selection", "reason code 42");
  check_balanced(buf);
}

TEST_CASE("buffer options that would index past the counters or describe no schema are errors") {
  // A filter's evict reason indexes the per-reason counters: code 200 used to write past them.
  RLPT_CHECK_ERROR(rollout_buffer({.filters = {group_filter{"odd", static_cast<evict_reason>(200),
                                                            [](const group_view&) { return false; }}}}),
                   "rlpt.rollout.bad_option", "filters[0] 'odd'", "code 200");
  RLPT_CHECK_ERROR(rollout_buffer({.when_full = static_cast<full_policy>(5)}), "rlpt.rollout.bad_option", "code 5");
  RLPT_CHECK_ERROR(rollout_buffer({.schema = {.extras = {{"experts", dtype::i32, 0}}}}), "rlpt.rollout.bad_extra",
                   "extras[0] 'experts' has width 0");
  RLPT_CHECK_ERROR(rollout_buffer({.schema = {.extras = {{"x", static_cast<dtype>(42), 1}}}}), "rlpt.rollout.bad_extra",
                   "dtype code 42");
  RLPT_CHECK_ERROR(rollout_buffer({.schema = {.extras = {{"x", dtype::f32, 1}, {"x", dtype::i32, 2}}}}),
                   "rlpt.rollout.bad_extra", "extras[0] and extras[1] are both named 'x'");
  RLPT_CHECK_ERROR(rollout_buffer({.schema = {.reward_channels = -1}}), "rlpt.rollout.bad_option",
                   "reward_channels = -1");
}
