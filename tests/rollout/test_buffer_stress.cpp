// SPDX-License-Identifier: Apache-2.0
// Concurrency stress for rollout_buffer: several producers and consumers, random record
// lengths, interleaved groups, early group closes and aborts, a DAPO filter, random buffer
// closes. Afterwards every record that went in is found exactly once among the consumed and
// the evicted ones, consumed groups are whole, and inserted = consumed + evicted + resident.
// Sized for seconds in Release (10^6 records); smaller under sanitizers. Run it under TSan
// (build/rollout-tsan) to check for data races.
#include <rlpt/rollout/buffer.hpp>

#include "support/random.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <vector>

using namespace rlpt;

namespace {

#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
constexpr index_t default_records = 60'000;
#else
constexpr index_t default_records = 1'000'000;
#endif

index_t stress_records(index_t fallback) {
  if (const char* s = std::getenv("RLPT_STRESS_RECORDS")) return std::max<index_t>(1000, std::atoll(s));
  return fallback;
}

constexpr index_t group_size = 4;

std::uint64_t key(std::int64_t group, std::int32_t sample) {
  return static_cast<std::uint64_t>(group) * 8u + static_cast<std::uint64_t>(sample);
}

// A tiny valid record built directly (no builder): prompt 1-4 tokens, response 1-8.
trajectory tiny(test::rng& r, std::int64_t group, std::int32_t sample) {
  trajectory t;
  t.group_id = group;
  t.sample_index = sample;
  const auto prompt = static_cast<std::size_t>(r.integer(1, 4));
  const auto n = prompt + static_cast<std::size_t>(r.integer(1, 8));
  t.prompt_len = static_cast<index_t>(prompt);
  t.tokens.resize(n);
  for (auto& x : t.tokens) x = static_cast<token_id>(r.integer(0, 1000));
  t.loss_mask.assign(n, 1);
  std::fill_n(t.loss_mask.begin(), prompt, mask_t{0});
  t.logprobs.assign(n, -0.5f);
  t.versions.assign(n, 1);
  std::fill_n(t.versions.begin(), prompt, no_version);
  // Every 7th group has equal rewards: the DAPO filter drops it.
  t.rewards.assign(1, group % 7 == 0 ? 1.0f : static_cast<float>(sample % 2));
  return t;
}

struct outcome {
  std::vector<std::uint64_t> pushed, consumed, evicted;
  buffer_stats stats;
  index_t batches = 0;
};

// close_after < 0: close when producers are done; else close once that many records went in.
outcome run(std::uint64_t seed, index_t records, int producers, int consumers, index_t close_after) {
  std::mutex evicted_mutex;
  outcome out;
  rollout_buffer buf({.capacity_groups = 48,
                      .group_size = group_size,
                      .min_group_size = 2,
                      .filters = {filters::dapo()},
                      .on_evict = [&](evicted_group&& g) {
                        std::lock_guard lock(evicted_mutex);
                        for (const auto& t : g.records) out.evicted.push_back(key(t.group_id, t.sample_index));
                      }});
  const index_t groups = records / group_size;
  std::vector<std::vector<std::uint64_t>> pushed(static_cast<std::size_t>(producers));
  std::vector<std::vector<std::uint64_t>> consumed(static_cast<std::size_t>(consumers));
  std::atomic<index_t> pushed_count{0};
  std::atomic<bool> bad_batch{false};
  std::atomic<index_t> batches{0};

  std::vector<std::thread> threads;
  for (int p = 0; p < producers; ++p)
    threads.emplace_back([&, p] {
      test::rng r(seed * 1000 + static_cast<std::uint64_t>(p));
      auto& mine = pushed[static_cast<std::size_t>(p)];
      // Three groups in flight at once, records interleaved across them.
      struct flight {
        std::int64_t id;
        std::int32_t next;
        std::int32_t stop; // push records [0, stop), then close (stop < size) or abort (stop < 0 marker)
        bool abort;
      };
      std::vector<flight> live;
      std::int64_t g = p;
      bool open = true;
      while (open && (g < groups || !live.empty())) {
        while (live.size() < 3 && g < groups) {
          const bool early = r.bernoulli(0.05);
          live.push_back(
              {g, 0,
               early ? static_cast<std::int32_t>(r.integer(1, group_size - 1)) : static_cast<std::int32_t>(group_size),
               early && r.bernoulli(0.3)});
          g += producers;
        }
        const auto pick = static_cast<std::size_t>(r.integer(0, static_cast<std::int64_t>(live.size()) - 1));
        flight& f = live[pick];
        trajectory t = tiny(r, f.id, f.next);
        const std::uint64_t k = key(f.id, f.next);
        const bool ok = r.bernoulli(0.5) ? buf.push(std::move(t))
                                         : buf.push_for(std::move(t), std::chrono::milliseconds(50)) == push_status::ok;
        if (!ok) {
          if (buf.closed()) open = false;
          continue; // timed out: retry later (a fresh record with the same key)
        }
        mine.push_back(k);
        pushed_count.fetch_add(1, std::memory_order_relaxed);
        if (++f.next == f.stop) {
          if (f.stop < group_size) {
            if (f.abort)
              buf.abort_group(f.id);
            else
              buf.close_group(f.id);
          }
          live.erase(live.begin() + static_cast<std::ptrdiff_t>(pick));
        }
      }
    });
  for (int c = 0; c < consumers; ++c)
    threads.emplace_back([&, c] {
      test::rng r(seed * 7777 + static_cast<std::uint64_t>(c));
      auto& mine = consumed[static_cast<std::size_t>(c)];
      for (;;) {
        const index_t want = r.integer(1, 8);
        rollout_batch b;
        const int mode = static_cast<int>(r.integer(0, 2));
        if (mode == 0) {
          b = buf.pop(want);
        } else if (mode == 1) {
          auto got = buf.pop_for(want, std::chrono::milliseconds(2));
          if (!got) continue;
          b = std::move(*got);
        } else {
          auto got = buf.try_pop(want);
          if (!got) {
            if (buf.closed() && buf.stats().ready_groups == 0) break;
            std::this_thread::yield();
            continue;
          }
          b = std::move(*got);
        }
        if (b.empty()) break; // closed and drained
        batches.fetch_add(1, std::memory_order_relaxed);
        // Whole groups only: every group's records share its id, partial ones are flagged.
        for (index_t gi = 0; gi < b.num_groups(); ++gi) {
          const group_info& info = b.group_infos()[static_cast<std::size_t>(gi)];
          const index_t lo = b.group_offsets()[gi], hi = b.group_offsets()[gi + 1];
          if (hi - lo != info.samples || (info.samples != group_size) != info.partial || info.samples < 2)
            bad_batch = true;
          for (index_t i = lo; i < hi; ++i)
            if (b.group_ids()[i] != info.id || b.sample_indices()[i] != static_cast<std::int32_t>(i - lo))
              bad_batch = true;
        }
        for (index_t i = 0; i < b.size(); ++i) mine.push_back(key(b.group_ids()[i], b.sample_indices()[i]));
      }
    });
  if (close_after >= 0) {
    while (pushed_count.load(std::memory_order_relaxed) < close_after) std::this_thread::yield();
    buf.close();
  }
  for (int p = 0; p < producers; ++p) threads[static_cast<std::size_t>(p)].join();
  if (close_after < 0) buf.close();
  for (std::size_t t = static_cast<std::size_t>(producers); t < threads.size(); ++t) threads[t].join();

  CHECK_FALSE(bad_batch.load());
  CHECK(buf.stats().balanced());
  // A producer may close a group after the consumers saw the closed buffer drained.
  while (auto b = buf.try_pop(1))
    for (index_t i = 0; i < b->size(); ++i) consumed[0].push_back(key(b->group_ids()[i], b->sample_indices()[i]));
  CHECK(buf.stats().ready_groups == 0);
  buf.evict_incomplete();
  out.stats = buf.stats();
  for (auto& v : pushed) out.pushed.insert(out.pushed.end(), v.begin(), v.end());
  for (auto& v : consumed) out.consumed.insert(out.consumed.end(), v.begin(), v.end());
  out.batches = batches.load();
  return out;
}

void check_outcome(outcome& o) {
  const buffer_stats& s = o.stats;
  CHECK(s.balanced());
  CHECK(s.resident == flow_count{});
  CHECK(s.inserted.records == static_cast<index_t>(o.pushed.size()));
  CHECK(s.consumed.records == static_cast<index_t>(o.consumed.size()));
  CHECK(s.evicted_total().records == static_cast<index_t>(o.evicted.size()));
  // Nothing lost, nothing duplicated: pushed == consumed + evicted as multisets, all distinct.
  std::vector<std::uint64_t> out = o.consumed;
  out.insert(out.end(), o.evicted.begin(), o.evicted.end());
  std::sort(out.begin(), out.end());
  std::sort(o.pushed.begin(), o.pushed.end());
  CHECK(std::adjacent_find(o.pushed.begin(), o.pushed.end()) == o.pushed.end());
  CHECK(out == o.pushed);
  CHECK(s.dropped_by_filter.size() == 1);
  CHECK(s.evicted_by(evict_reason::filtered).groups == s.dropped_by_filter[0]);
}

} // namespace

TEST_CASE("stress: producers and consumers move 10^6 records with every record accounted for" * doctest::timeout(240)) {
  const index_t n = stress_records(default_records);
  outcome o = run(test::base_seed(), n, 3, 3, -1);
  check_outcome(o);
  CHECK(o.stats.inserted.records >= n * 9 / 10); // early closes push fewer than 4 per group
  CHECK(o.stats.consumed.records > 0);
  CHECK(o.stats.evicted_by(evict_reason::filtered).groups > 0);
  CHECK(o.stats.evicted_by(evict_reason::incomplete).groups > 0);
  MESSAGE("records in ", o.stats.inserted.records, ", consumed ", o.stats.consumed.records, " in ", o.batches,
          " batches, evicted ", o.stats.evicted_total().records);
}

TEST_CASE("stress: random closes while producers and consumers are busy" * doctest::timeout(240)) {
  const index_t n = stress_records(default_records) / 10;
  test::rng r(99);
  for (int round = 0; round < 6; ++round) {
    const index_t close_after = r.integer(0, n);
    const int producers = static_cast<int>(r.integer(1, 4));
    const int consumers = static_cast<int>(r.integer(1, 4));
    outcome o = run(test::base_seed() + static_cast<std::uint64_t>(round) + 1, n, producers, consumers, close_after);
    CAPTURE(round);
    CAPTURE(close_after);
    check_outcome(o);
    CHECK(o.stats.closed);
  }
}
