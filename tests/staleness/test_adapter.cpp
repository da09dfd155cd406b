// SPDX-License-Identifier: Apache-2.0
// staleness_buffer: the staleness policies driving rollout_buffer through its seam (selector
// passed to pop, eviction reasons, notify on publish, per-token versions), with the gate's,
// the buffer's and the metrics' books agreeing; checkpoints; the version-state blob.
#include <rlpt/rollout/buffer.hpp>
#include <rlpt/rollout/filters.hpp>
#include <rlpt/staleness/buffer.hpp>
#include <rlpt/staleness/checkpoint.hpp>

#include "support/errors.hpp"
#include "support/random.hpp"

#include <doctest/doctest.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <unistd.h>
#include <vector>

using namespace rlpt;
using namespace std::chrono_literals;

namespace {

trajectory record(std::int64_t gid, std::int32_t sample, policy_version v, float reward, index_t response = 4) {
  const std::vector<token_id> prompt{7, 8, 9};
  std::vector<token_id> out;
  std::vector<float> lp;
  for (index_t i = 0; i < response; ++i) {
    out.push_back(static_cast<token_id>(100 * gid + 10 * sample + i));
    lp.push_back(-0.1f * static_cast<float>(i + 1));
  }
  trajectory_builder b(gid, prompt);
  b.model(out, lp, v).reward(reward);
  trajectory t = std::move(b).finish();
  t.sample_index = sample;
  return t;
}

// Pushes both records of a 2-sample group with distinct rewards (passes a DAPO filter).
void push_group(staleness_buffer& sb, const ticket& t, std::int64_t gid, float r0 = 0.0f, float r1 = 1.0f) {
  CHECK(sb.push(t, record(gid, 0, t.version, r0)));
  CHECK(sb.push(t, record(gid, 1, t.version, r1)));
}

std::vector<std::int64_t> group_ids(const rollout_batch& b) {
  std::vector<std::int64_t> ids;
  for (const auto& g : b.group_infos()) ids.push_back(g.id);
  return ids;
}

void check_books(staleness_buffer& sb) {
  const gate_counts g = sb.gate().counts();
  const buffer_stats s = sb.buffer().stats();
  CHECK(g.balanced());
  CHECK(s.balanced());
  CHECK(g.consumed == s.consumed.groups);
  CHECK(g.dropped == s.evicted_by(evict_reason::stale).groups + s.evicted_by(evict_reason::overflow).groups +
                         s.evicted_by(evict_reason::discarded).groups);
  CHECK(g.requeued == s.evicted_by(evict_reason::requeued).groups);
  CHECK(g.buffered + g.running >= s.resident.groups);
}

std::filesystem::path temp_path(const char* name) {
  return std::filesystem::temp_directory_path() / (std::string(name) + "-" + std::to_string(::getpid()) + ".ckpt");
}

} // namespace

TEST_CASE("groups flow gate -> buffer -> trainer, every count agrees, histograms per batch") {
  staleness_metrics m;
  staleness_gate gate({.max_staleness = 1, .batch_groups = 2, .max_concurrent = 4, .metrics = &m});
  staleness_buffer sb(gate, {.capacity_groups = 16, .group_size = 2}, {.select = {.max_staleness = 1}});
  std::vector<ticket> ts;
  while (auto t = gate.try_admit()) ts.push_back(t);
  REQUIRE(ts.size() == 4);
  for (std::size_t i = 0; i < ts.size(); ++i) push_group(sb, ts[i], static_cast<std::int64_t>(10 + i));
  CHECK(gate.counts().buffered == 4);
  rollout_batch b = sb.pop(2);
  CHECK(group_ids(b) == std::vector<std::int64_t>{10, 11});
  CHECK(b.size() == 4);
  CHECK(m.snapshot().last_batch.at(0) == 2);
  sb.publish();
  CHECK(gate.capacity() == std::min<index_t>(4, (1 + 1 + 1) * 2 - 4));
  b = sb.pop();
  CHECK(group_ids(b) == std::vector<std::int64_t>{12, 13});
  const metrics_snapshot s = m.snapshot();
  CHECK(s.last_batch.at(1) == 2);
  CHECK(s.consumed == 4);
  CHECK(s.batches == 2);
  CHECK(s.admitted == 4);
  CHECK(s.accepted == 4);
  check_books(sb);
}

TEST_CASE("a DAPO-filtered group gives its admission slot back") {
  staleness_gate gate({.max_staleness = 0, .batch_groups = 2});
  buffer_options bo{.capacity_groups = 8, .group_size = 2};
  bo.filters.push_back(filters::dapo());
  staleness_buffer sb(gate, bo);
  const ticket a = gate.try_admit(), b = gate.try_admit();
  CHECK_FALSE(gate.try_admit());
  push_group(sb, a, 1, 1.0f, 1.0f); // all-equal rewards: filtered
  CHECK(gate.counts().rejected == 1);
  CHECK(sb.buffer().stats().evicted_by(evict_reason::filtered).groups == 1);
  const ticket c = gate.try_admit(); // the slot came back
  CHECK(c);
  push_group(sb, b, 2);
  push_group(sb, c, 3);
  CHECK(group_ids(sb.pop()) == std::vector<std::int64_t>{2, 3});
  check_books(sb);
}

TEST_CASE("too-stale groups are evicted as `stale` (drop) or handed back as `requeued`") {
  for (const stale_policy pol : {stale_policy::drop, stale_policy::requeue}) {
    staleness_metrics m;
    staleness_gate gate({.max_staleness = 0, .batch_groups = 2, .max_concurrent = 8, .metrics = &m});
    std::vector<std::pair<std::int64_t, evict_reason>> seen;
    buffer_options bo{.capacity_groups = 8, .group_size = 2};
    bo.on_evict = [&](evicted_group&& g) {
      CHECK(g.records.size() == 2); // the records come back, e.g. to re-dispatch their prompt
      seen.emplace_back(g.info.id, g.reason);
    };
    staleness_buffer sb(gate, bo, {.select = {.max_staleness = 0, .on_stale = pol}});
    push_group(sb, gate.try_admit(), 1);
    push_group(sb, gate.try_admit(), 2);
    sb.publish(); // the trainer moved on without them (e.g. trained on other data)
    push_group(sb, gate.try_admit(), 3);
    push_group(sb, gate.try_admit(), 4);
    CHECK(group_ids(sb.pop()) == std::vector<std::int64_t>{3, 4});
    const evict_reason want = pol == stale_policy::drop ? evict_reason::stale : evict_reason::requeued;
    CHECK(seen == std::vector<std::pair<std::int64_t, evict_reason>>{{1, want}, {2, want}});
    CHECK((pol == stale_policy::drop ? m.snapshot().dropped : m.snapshot().requeued) == 2);
    check_books(sb);
  }
}

TEST_CASE("wait: the consumer holds the batch for an in-flight group that would age out") {
  staleness_gate gate({.max_staleness = 1, .batch_groups = 1, .max_concurrent = 4});
  staleness_buffer sb(
      gate, {.capacity_groups = 8, .group_size = 2},
      {.select = {.max_staleness = 1, .order = pick_order::freshest_first, .on_stale = stale_policy::wait}});
  const ticket a = gate.try_admit(), late = gate.try_admit();
  push_group(sb, a, 1);
  CHECK(group_ids(sb.pop(1)) == std::vector<std::int64_t>{1});
  sb.publish();
  const ticket c = gate.try_admit();
  REQUIRE(c);
  CHECK(c.version == 1);
  push_group(sb, c, 3);
  CHECK_FALSE(sb.try_pop(1)); // group 2 (version 0) must be trained now or never
  CHECK_FALSE(sb.pop_for(1, 5ms));
  CHECK(sb.push(late, record(2, 0, 0, 0.0f)));
  CHECK_FALSE(sb.try_pop(1)); // half a group is not a group
  CHECK(sb.push(late, record(2, 1, 0, 1.0f)));
  CHECK(group_ids(*sb.try_pop(1)) == std::vector<std::int64_t>{2});
  sb.publish();
  CHECK(group_ids(*sb.try_pop(1)) == std::vector<std::int64_t>{3});
  CHECK(gate.counts().dropped == 0);
  check_books(sb);
}

TEST_CASE("fail() evicts a half-pushed group and returns its slot, errors name groups and tickets") {
  staleness_gate gate({.max_staleness = 0, .batch_groups = 1});
  staleness_buffer sb(gate, {.capacity_groups = 4, .group_size = 2});
  const ticket a = gate.try_admit();
  CHECK(sb.push(a, record(5, 0, 0, 0.0f)));
  sb.fail(a);
  CHECK(sb.buffer().stats().evicted_by(evict_reason::incomplete).groups == 1);
  CHECK(gate.counts().rejected == 1);
  const ticket b = gate.try_admit();
  REQUIRE(b);
  sb.fail(b); // nothing pushed yet
  CHECK(gate.counts().rejected == 2);
  const ticket c = gate.try_admit();
  REQUIRE(c);
  RLPT_CHECK_ERROR(sb.push(ticket{}, record(6, 0, 0, 0.0f)), "rlpt.staleness.unknown_ticket", "group 6",
                   "empty ticket");
  CHECK(sb.push(c, record(6, 0, 0, 0.0f)));
  RLPT_CHECK_ERROR(sb.push(c, record(7, 0, 0, 0.0f)), "rlpt.staleness.ticket_mismatch",
                   "ticket 3 already carries group 6");
  CHECK(sb.push(c, record(6, 1, 0, 1.0f)));
  RLPT_CHECK_ERROR(sb.push(c, record(6, 2, 0, 1.0f)), "rlpt.staleness.bad_group", "already received its 2 records");
  RLPT_CHECK_ERROR(sb.fail(c), "rlpt.staleness.bad_transition", "group 6 already completed");
  trajectory bad = record(8, 0, 0, 0.0f);
  bad.logprobs.pop_back();
  RLPT_CHECK_ERROR(sb.push(c, std::move(bad)), "rlpt.rollout.record_size", "logprobs");
  CHECK(gate.counts().buffered == 1); // the bad record took no slot
  RLPT_CHECK_ERROR(staleness_buffer(gate, {}, {.select = {.order = pick_order::target_version}}),
                   "rlpt.staleness.bad_option", "admission_mode::target");
  check_books(sb);
}

TEST_CASE("target-version reservation end to end: step v trains exactly the groups reserved for v") {
  staleness_gate gate({.max_staleness = 1, .batch_groups = 2, .max_concurrent = 8, .mode = admission_mode::target});
  staleness_buffer sb(gate, {.capacity_groups = 8, .group_size = 2},
                      {.select = {.max_staleness = 1, .order = pick_order::target_version}});
  std::vector<ticket> ts;
  while (auto t = gate.try_admit()) ts.push_back(t);
  REQUIRE(ts.size() == 4);
  // Finish in reverse order: the step-1 groups are ready first but must wait for step 1.
  for (std::size_t i = ts.size(); i-- > 0;) push_group(sb, ts[i], static_cast<std::int64_t>(20 + i));
  CHECK(group_ids(sb.pop()) == std::vector<std::int64_t>{21, 20});
  CHECK_FALSE(sb.try_pop());
  sb.publish();
  CHECK(group_ids(sb.pop()) == std::vector<std::int64_t>{23, 22});
  check_books(sb);
}

TEST_CASE("a partial rollout resumed across a weight update becomes a record with per-token versions") {
  staleness_gate gate({.max_staleness = 2, .batch_groups = 1});
  staleness_buffer sb(gate, {.capacity_groups = 4, .group_size = 1}, {.select = {.max_staleness = 2}});
  const ticket t = gate.try_admit();
  const std::vector<token_id> prompt{1, 2, 3};
  partial_rollout p(77, prompt, t.version, {.max_new_tokens = 6});
  const std::vector<token_id> c1{10, 11};
  const std::vector<float> l1{-0.5f, -0.25f};
  p.append(c1, l1, t.version);
  p.interrupt(pause_mode::retract);
  sb.publish();
  p.resume(gate.version());
  const std::vector<token_id> c2{12, 13, 14};
  const std::vector<float> l2{-1.0f, -2.0f, -3.0f};
  p.append(c2, l2, gate.version());
  p.finish();
  CHECK(sb.push(t, to_trajectory(p, {1.0f})));
  const rollout_batch b = sb.pop(1);
  CHECK(std::vector<policy_version>(b.versions().begin(), b.versions().end()) ==
        std::vector<policy_version>{-1, -1, -1, 0, 0, 1, 1, 1});
  CHECK(b.group_infos()[0].head_version == 0);
  CHECK(b.group_infos()[0].tail_version == 1);
}

TEST_CASE("checkpoint: version state rides in the buffer checkpoint, restore recovers the gate") {
  const gate_options go{.max_staleness = 2, .batch_groups = 2, .max_concurrent = 16};
  const buffer_options bo{.capacity_groups = 16, .group_size = 2};
  const staleness_buffer_options so{.select = {.max_staleness = 2}};
  const auto path = temp_path("rlpt-staleness");
  std::vector<rollout_batch> expected;
  {
    staleness_gate gate(go);
    staleness_buffer sb(gate, bo, so);
    push_group(sb, gate.try_admit(), 1);
    push_group(sb, gate.try_admit(), 2);
    CHECK(group_ids(sb.pop()) == std::vector<std::int64_t>{1, 2});
    sb.publish();
    push_group(sb, gate.try_admit(), 3);
    sb.publish();
    push_group(sb, gate.try_admit(), 4);
    push_group(sb, gate.try_admit(), 5);
    const ticket open = gate.try_admit();
    CHECK(sb.push(open, record(6, 0, open.version, 0.0f))); // half a group: its producer dies with the process
    save_checkpoint(sb, path);
    const staleness_state st = sb.state();
    CHECK(st.version == 2);
    CHECK(st.groups == std::vector<staleness_state::group>{{3, 1, -1}, {4, 2, -1}, {5, 2, -1}});
    sb.fail(open);
    expected.push_back(sb.pop());
  }
  staleness_gate gate(go);
  staleness_buffer sb(gate, bo, so);
  restore_checkpoint(sb, path);
  std::filesystem::remove(path);
  CHECK(gate.version() == 2);
  const gate_counts c = gate.counts();
  CHECK(c.buffered == 3);
  CHECK(c.running == 0);
  CHECK(c.accepted == 2 * 2 + 3);
  CHECK(gate.capacity() == std::min<index_t>(16, (2 + 1) * 2 - 3)); // no burst
  CHECK(sb.buffer().stats().evicted_by(evict_reason::incomplete).groups == 1);
  const rollout_batch b = sb.pop();
  CHECK(b == expected[0]);
  CHECK(group_ids(b) == std::vector<std::int64_t>{3, 4});
  // The gate's counters restart at the recovery; the buffer's are restored.
  CHECK(gate.counts().balanced());
  CHECK(gate.counts().consumed == 2);
  CHECK(sb.buffer().stats().balanced());
}

TEST_CASE("the version-state blob round-trips and rejects every truncation and corruption") {
  staleness_state s{7, {{1, 5, -1}, {9, 7, 8}, {-3, 6, 6}}};
  const std::vector<std::byte> bytes = encode(s);
  CHECK(decode_staleness_state(bytes) == s);
  for (std::size_t n = 0; n < bytes.size(); ++n)
    RLPT_CHECK_ERROR(decode_staleness_state(std::span(bytes).first(n)), "rlpt.staleness.state_corrupt", "");
  std::vector<std::byte> longer = bytes;
  longer.push_back(std::byte{0});
  RLPT_CHECK_ERROR(decode_staleness_state(longer), "rlpt.staleness.state_corrupt", "1 trailing bytes");
  rlpt::test::rng rng(5);
  index_t ok = 0, rejected = 0;
  for (int trial = 0; trial < 4000; ++trial) {
    std::vector<std::byte> m = bytes;
    for (index_t k = rng.integer(1, 3); k > 0; --k)
      m[static_cast<std::size_t>(rng.integer(0, static_cast<index_t>(m.size()) - 1))] ^=
          static_cast<std::byte>(1u << rng.integer(0, 7));
    try {
      const staleness_state d = decode_staleness_state(m);
      for (const auto& g : d.groups) CHECK((g.version >= 0 && g.version <= d.version));
      ++ok;
    } catch (const rlpt::error& e) {
      CHECK(e.id() == "rlpt.staleness.state_corrupt");
      ++rejected;
    }
  }
  CHECK(rejected > 0);
  CHECK(ok + rejected == 4000);
}

TEST_CASE("a consumer that waits past the threshold is reported, counted and timed") {
  staleness_metrics m;
  staleness_gate gate({.max_staleness = 1, .batch_groups = 2, .metrics = &m});
  std::vector<starvation_report> reports;
  staleness_buffer sb(gate, {.capacity_groups = 4, .group_size = 2},
                      {.select = {.max_staleness = 1},
                       .starvation = {.after_s = 0.005},
                       .on_starvation = [&](const starvation_report& r) { reports.push_back(r); }});
  push_group(sb, gate.try_admit(), 1);
  CHECK_FALSE(sb.pop_for(2, 60ms));
  REQUIRE(reports.size() == 1);
  CHECK(reports[0].cause == starvation_cause::no_producers);
  CHECK(reports[0].eligible == 1);
  CHECK(reports[0].wanted == 2);
  CHECK(sb.starvations() == 1);
  CHECK(m.snapshot().starvations == 1);
  CHECK(m.snapshot().train_wait_s >= 0.05);
  // Closing drains what is left as a short batch.
  sb.close();
  CHECK(group_ids(sb.pop(2)) == std::vector<std::int64_t>{1});
  CHECK(sb.pop(2).empty());
}
