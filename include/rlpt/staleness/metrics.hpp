// SPDX-License-Identifier: Apache-2.0
//! @file
//! Staleness metrics: how old the consumed data was, and where the time went.
//!
//! - `staleness_histogram`: counts per age in versions (current - version), per batch or
//!   cumulative, for groups (their dispatch/head version) or tokens (per-token versions).
//! - `staleness_metrics`: a thread-safe sink shared by the admission gate, the selector and
//!   the caller: admitted / refused / accepted / rejected / consumed / dropped / requeued
//!   counts, starvation events, and the time producers waited for admission (generation
//!   wait) and consumers waited for a batch (train wait). `snapshot()` reads them at once.
//! verl's `trainer/idle_ratio` vs `rollouter/idle_ratio` tuning advice needs exactly these.
#pragma once

#include <rlpt/config.hpp>
#include <rlpt/core/error.hpp>
#include <rlpt/core/views.hpp>
#include <rlpt/staleness/clock.hpp>

#include <fmt/core.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <mutex>
#include <span>
#include <string>
#include <vector>

RLPT_NAMESPACE_BEGIN

//! counts[s] = how many items were s versions old.
struct staleness_histogram {
  std::vector<index_t> counts;

  //! Adds n items of the given staleness: 0 <= staleness <= INT32_MAX (a difference of int32
  //! policy versions), n >= 0, and the total count must stay within index_t.
  void add(index_t staleness, index_t n = 1) {
    RLPT_CHECK(staleness >= 0 && n >= 0, errors::staleness::bad_histogram,
               "histogram entry needs staleness >= 0 and count >= 0, got staleness {} count {}", staleness, n);
    RLPT_CHECK(staleness <= std::numeric_limits<policy_version>::max(), errors::staleness::bad_histogram,
               "histogram staleness {} exceeds {}, the largest difference of two policy versions", staleness,
               std::numeric_limits<policy_version>::max());
    const index_t before = total();
    RLPT_CHECK(n <= std::numeric_limits<index_t>::max() - before, errors::staleness::bad_histogram,
               "adding {} items of staleness {} to a histogram of {} overflows a 64-bit count", n, staleness, before);
    if (static_cast<std::size_t>(staleness) >= counts.size()) counts.resize(static_cast<std::size_t>(staleness) + 1, 0);
    counts[static_cast<std::size_t>(staleness)] += n;
  }
  void merge(const staleness_histogram& o) {
    for (std::size_t s = 0; s < o.counts.size(); ++s)
      if (o.counts[s] != 0) add(static_cast<index_t>(s), o.counts[s]);
  }
  [[nodiscard]] index_t at(index_t staleness) const noexcept {
    return staleness >= 0 && static_cast<std::size_t>(staleness) < counts.size()
               ? counts[static_cast<std::size_t>(staleness)]
               : 0;
  }
  [[nodiscard]] index_t total() const noexcept {
    index_t n = 0;
    for (const auto c : counts) n += c;
    return n;
  }
  //! Largest staleness seen; -1 when empty.
  [[nodiscard]] index_t max() const noexcept {
    for (std::size_t s = counts.size(); s-- > 0;)
      if (counts[s] != 0) return static_cast<index_t>(s);
    return -1;
  }
  [[nodiscard]] double mean() const noexcept {
    double n = 0.0, sum = 0.0;
    for (std::size_t s = 0; s < counts.size(); ++s) {
      n += static_cast<double>(counts[s]);
      sum += static_cast<double>(s) * static_cast<double>(counts[s]);
    }
    return n > 0.0 ? sum / n : 0.0;
  }
  //! Share of items at each staleness, e.g. "0:62.5% 1:37.5%".
  [[nodiscard]] std::string to_string() const;
  friend bool operator==(const staleness_histogram& a, const staleness_histogram& b) {
    const std::size_t n = std::max(a.counts.size(), b.counts.size());
    for (std::size_t s = 0; s < n; ++s)
      if (a.at(static_cast<index_t>(s)) != b.at(static_cast<index_t>(s))) return false;
    return true;
  }
};

namespace detail {

inline index_t age_of(policy_version v, policy_version current, index_t where) {
  RLPT_CHECK(v <= current, errors::staleness::future_version,
             "item {} has policy version {}, newer than the current version {} (versions are stamped from the "
             "trainer's clock; a newer one means the clock was restored backwards or the stamp is wrong)",
             where, v, current);
  return static_cast<index_t>(current) - static_cast<index_t>(v);
}

} // namespace detail

//! One entry per item: `current - versions[i]` (items with version < 0 are untagged, skipped).
[[nodiscard]] inline staleness_histogram item_staleness(std::span<const policy_version> versions,
                                                        policy_version current) {
  staleness_histogram h;
  for (std::size_t i = 0; i < versions.size(); ++i)
    if (versions[i] >= 0) h.add(detail::age_of(versions[i], current, static_cast<index_t>(i)));
  return h;
}

//! One entry per trained token (mask != 0; empty mask = all) with a version >= 0.
[[nodiscard]] inline staleness_histogram token_staleness(view<const policy_version> versions, view<const mask_t> mask,
                                                         policy_version current) {
  detail::expect_size_or_empty("token_staleness mask", mask.size(), versions.size(), "one per token");
  staleness_histogram h;
  for (index_t i = 0; i < versions.size(); ++i)
    if ((mask.empty() || mask[i] != 0) && versions[i] >= 0) h.add(detail::age_of(versions[i], current, i));
  return h;
}

//! Everything `staleness_metrics` counted, read at one instant.
struct metrics_snapshot {
  index_t admitted = 0;           //!< groups admitted by the gate (tickets issued)
  index_t refused = 0;            //!< try_admit calls that found no capacity, and admissions a closed gate ended
  index_t timeouts = 0;           //!< admit_for waits that ended at their deadline without capacity
  index_t accepted = 0;           //!< groups that finished generating and entered the buffer
  index_t rejected = 0;           //!< groups that failed or a filter rejected (their slot returned)
  index_t consumed = 0;           //!< groups handed to the trainer
  index_t dropped = 0;            //!< groups dropped as too stale (or evicted before use: overflow)
  index_t requeued = 0;           //!< groups handed back to the producers (regenerate / resume)
  index_t batches = 0;            //!< batches handed to the trainer
  index_t starvations = 0;        //!< times a consumer waited past its starvation threshold
  double generation_wait_s = 0.0; //!< total time producers waited for admission
  double train_wait_s = 0.0;      //!< total time consumers waited for a batch
  staleness_histogram consumed_staleness; //!< cumulative, one entry per consumed group
  staleness_histogram last_batch;         //!< the most recent batch alone
};

//! Thread-safe counters (one mutex: events are per group, not per token).
class staleness_metrics {
public:
  void admitted(index_t n = 1) { add(&metrics_snapshot::admitted, n); }
  void refused(index_t n = 1) { add(&metrics_snapshot::refused, n); }
  void timed_out(index_t n = 1) { add(&metrics_snapshot::timeouts, n); }
  void accepted(index_t n = 1) { add(&metrics_snapshot::accepted, n); }
  void rejected(index_t n = 1) { add(&metrics_snapshot::rejected, n); }
  void dropped(index_t n = 1) { add(&metrics_snapshot::dropped, n); }
  void requeued(index_t n = 1) { add(&metrics_snapshot::requeued, n); }
  void starved(index_t n = 1) { add(&metrics_snapshot::starvations, n); }

  //! A batch went to the trainer: its per-group staleness histogram.
  void consumed(const staleness_histogram& batch) {
    std::lock_guard lock(mutex_);
    s_.consumed += batch.total();
    s_.batches += 1;
    s_.consumed_staleness.merge(batch);
    s_.last_batch = batch;
  }
  void generation_wait(double seconds) {
    std::lock_guard lock(mutex_);
    s_.generation_wait_s += seconds;
  }
  void train_wait(double seconds) {
    std::lock_guard lock(mutex_);
    s_.train_wait_s += seconds;
  }

  [[nodiscard]] metrics_snapshot snapshot() const {
    std::lock_guard lock(mutex_);
    return s_;
  }
  void reset() {
    std::lock_guard lock(mutex_);
    s_ = {};
  }

private:
  void add(index_t metrics_snapshot::*field, index_t n) {
    std::lock_guard lock(mutex_);
    s_.*field += n;
  }

  mutable std::mutex mutex_;
  metrics_snapshot s_;
};

RLPT_NAMESPACE_END

#if RLPT_HEADER_IMPL()
RLPT_NAMESPACE_BEGIN

RLPT_INLINE std::string staleness_histogram::to_string() const {
  const double n = static_cast<double>(total());
  std::string s;
  for (std::size_t k = 0; k < counts.size(); ++k) {
    if (counts[k] == 0) continue;
    if (!s.empty()) s += ' ';
    s += rlpt::detail::format("{}:{:.1f}%", k, 100.0 * static_cast<double>(counts[k]) / n);
  }
  return s.empty() ? std::string("-") : s;
}

RLPT_NAMESPACE_END
#endif // RLPT_HEADER_IMPL()
