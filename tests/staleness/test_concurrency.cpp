// SPDX-License-Identifier: Apache-2.0
// Concurrency stress (run under -fsanitize=thread too): many producers admitting through the
// gate, consumers selecting and publishing, readers polling; every ticket and every group is
// accounted for and the staleness bound holds at every selection.
#include <rlpt/rollout/buffer.hpp>
#include <rlpt/rollout/filters.hpp>
#include <rlpt/staleness/buffer.hpp>
#include <rlpt/staleness/gate.hpp>
#include <rlpt/staleness/selection.hpp>

#include "support/random.hpp"

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

using namespace rlpt;
using namespace std::chrono_literals;

TEST_CASE("gate + pick_batch under concurrent producers, one trainer and readers") {
  for (const stale_policy pol : {stale_policy::drop, stale_policy::wait}) {
    constexpr index_t eta = 1, B = 3, steps = 150;
    staleness_metrics m;
    staleness_gate gate({.max_staleness = eta, .batch_groups = B, .max_concurrent = 8, .metrics = &m});
    std::mutex ready_mutex;
    std::vector<ticket> ready;
    std::atomic<index_t> rejected{0}, admitted{0};
    std::atomic<bool> stop{false}, over_cap{false};

    std::vector<std::thread> producers;
    for (int p = 0; p < 4; ++p)
      producers.emplace_back([&, p] {
        rlpt::test::rng rng(static_cast<std::uint64_t>(p) + 40);
        for (;;) {
          const ticket t = gate.admit_for(20ms);
          if (!t) {
            if (gate.closed()) return;
            continue;
          }
          ++admitted;
          if (rng.bernoulli(0.3)) std::this_thread::yield();
          if (rng.bernoulli(0.1)) {
            gate.reject(t);
            ++rejected;
            continue;
          }
          gate.accept(t);
          std::lock_guard lock(ready_mutex);
          ready.push_back(t);
        }
      });
    std::thread reader([&] {
      while (!stop.load()) {
        const gate_counts c = gate.counts();
        if (c.running > 8) over_cap = true;
        static_cast<void>(gate.running());
        static_cast<void>(gate.capacity());
        std::this_thread::yield();
      }
    });

    index_t consumed = 0, dropped = 0, worst = 0;
    const selection_options opt{.max_staleness = eta, .on_stale = pol};
    for (index_t step = 0; step < steps;) {
      std::vector<ticket> batch;
      {
        std::lock_guard lock(ready_mutex);
        std::vector<candidate> cands;
        for (const auto& t : ready) cands.push_back({t.version, t.target});
        const staleness_gate::alive_tickets alive = gate.alive();
        const policy_version v = alive.version;
        const pick_result r = pick_batch(cands, B, v, opt, in_flight(alive, cands));
        std::vector<std::uint8_t> gone(ready.size(), 0);
        for (const auto& [pos, a] : r.evict) {
          gate.release(ready[static_cast<std::size_t>(pos)], release_reason::dropped);
          gone[static_cast<std::size_t>(pos)] = 1;
          ++dropped;
        }
        if (r.status == pick_status::ready)
          for (const index_t pos : r.take) {
            batch.push_back(ready[static_cast<std::size_t>(pos)]);
            gone[static_cast<std::size_t>(pos)] = 1;
          }
        std::vector<ticket> rest;
        for (std::size_t i = 0; i < ready.size(); ++i)
          if (!gone[i]) rest.push_back(ready[i]);
        ready = std::move(rest);
        for (const auto& t : batch) worst = std::max<index_t>(worst, v - t.version);
      }
      if (batch.empty()) {
        std::this_thread::sleep_for(50us);
        continue;
      }
      for (const auto& t : batch) gate.consume(t);
      consumed += static_cast<index_t>(batch.size());
      gate.publish();
      ++step;
    }
    gate.close();
    for (auto& t : producers) t.join();
    stop = true;
    reader.join();
    const gate_counts c = gate.counts();
    CHECK_FALSE(over_cap.load());
    CHECK(worst <= eta);
    CHECK(c.balanced());
    CHECK(c.running == 0);
    CHECK(c.consumed == consumed);
    CHECK(c.dropped == dropped);
    CHECK(c.rejected == rejected.load());
    CHECK(c.admitted == admitted.load());
    CHECK(c.buffered == static_cast<index_t>(ready.size()));
    if (pol == stale_policy::wait) CHECK(dropped == 0);
    CHECK(m.snapshot().admitted == admitted.load());
  }
}

TEST_CASE("staleness_buffer with concurrent producers and consumers loses and duplicates nothing") {
  for (const stale_policy pol : {stale_policy::drop, stale_policy::wait}) {
    constexpr index_t eta = 1, B = 2, target_groups = 240;
    staleness_metrics m;
    staleness_gate gate({.max_staleness = eta, .batch_groups = B, .max_concurrent = 6, .metrics = &m});
    buffer_options bo{.capacity_groups = 8, .group_size = 2};
    bo.filters.push_back(filters::dapo());
    staleness_buffer sb(gate, bo, {.select = {.max_staleness = eta, .on_stale = pol}, .starvation = {.after_s = 1.0}});
    std::atomic<std::int64_t> next_gid{0};
    std::atomic<index_t> failed_early{0}, first_closed{0};

    std::vector<std::thread> producers;
    for (int p = 0; p < 3; ++p)
      producers.emplace_back([&, p] {
        rlpt::test::rng rng(static_cast<std::uint64_t>(p) + 90);
        for (;;) {
          const ticket t = gate.admit_for(20ms);
          if (!t) {
            if (gate.closed()) return;
            continue;
          }
          const std::int64_t gid = next_gid++;
          auto rec = [&](std::int32_t s) {
            std::vector<token_id> prompt{1, 2};
            std::vector<token_id> out(static_cast<std::size_t>(rng.integer(1, 6)), 5);
            std::vector<float> lp(out.size(), -0.5f);
            trajectory_builder b(gid, prompt);
            b.model(out, lp, t.version).reward(rng.bernoulli(0.5) ? 1.0f : 0.0f);
            trajectory r = std::move(b).finish();
            r.sample_index = s;
            return r;
          };
          const double u = rng.uniform();
          if (u < 0.05) {
            sb.fail(t); // died before producing anything
            ++failed_early;
          } else if (!sb.push(t, rec(0))) {
            ++first_closed; // the buffer closed: the ticket was given back
          } else if (u < 0.1) {
            sb.fail(t); // died half-way: evicted as incomplete
          } else {
            static_cast<void>(sb.push(t, rec(1))); // false only after close: evicted as incomplete
          }
        }
      });

    std::mutex seen_mutex;
    std::set<std::int64_t> seen;
    std::atomic<index_t> consumed{0};
    std::atomic<bool> duplicate{false};
    auto consume = [&](const rollout_batch& b) {
      std::lock_guard lock(seen_mutex);
      for (const auto& g : b.group_infos())
        if (!seen.insert(g.id).second) duplicate = true;
      consumed += b.num_groups();
    };
    std::vector<std::thread> consumers;
    for (int c = 0; c < 2; ++c)
      consumers.emplace_back([&] {
        while (consumed.load() < target_groups) {
          auto b = sb.pop_for(B, 20ms);
          if (!b) continue;
          consume(*b);
          sb.publish();
        }
      });
    for (auto& t : consumers) t.join();
    sb.close();
    for (auto& t : producers) t.join();
    // Drain what is left (a short batch at the end).
    for (;;) {
      rollout_batch b = sb.pop(B);
      if (b.empty()) break;
      consume(b);
    }
    CHECK_FALSE(duplicate.load());
    const metrics_snapshot ms = m.snapshot();
    CHECK(ms.consumed_staleness.max() <= eta); // measured at each selection, under the buffer lock
    const gate_counts g = gate.counts();
    const buffer_stats s = sb.buffer().stats();
    CHECK(g.balanced());
    CHECK(s.balanced());
    CHECK(g.running == 0);
    CHECK(g.buffered == 0);
    CHECK(s.resident.groups == 0);
    CHECK(g.consumed == consumed.load());
    CHECK(s.consumed.groups == consumed.load());
    CHECK(g.admitted == next_gid.load());
    CHECK(g.dropped == s.evicted_by(evict_reason::stale).groups);
    CHECK(g.rejected == s.evicted_by(evict_reason::filtered).groups + s.evicted_by(evict_reason::incomplete).groups +
                            failed_early.load() + first_closed.load());
    if (pol == stale_policy::wait) CHECK(g.dropped == 0);
  }
}
