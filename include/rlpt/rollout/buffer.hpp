// SPDX-License-Identifier: Apache-2.0
//! @file
//! rollout_buffer: a bounded, thread-safe, group-aware buffer between rollout workers
//! (producers) and trainer ranks (consumers).
//!
//! - Records arrive one by one, from any thread, in any order; they are collected per group
//!   id. A group becomes *ready* when it has all its records (options.group_size, or the size
//!   declared with open_group), or when a producer closes it early and it still has
//!   options.min_group_size records (then it is marked `partial`). Consumers only ever get
//!   whole groups: a group is never split, and a record arriving for a group that is already
//!   complete is an error, not a new group.
//! - Capacity counts groups (open + ready). Opening a new group blocks while the buffer is
//!   full; adding a record to an open group never blocks, so a group that started can always
//!   finish and producers cannot deadlock on a buffer full of half-finished groups
//!   (miles PR #2638).
//! - Filters (DAPO) run when a group completes; dropped groups are evicted with a reason.
//!   refill() says how many more groups the producers must start to fill a batch.
//! - Every record is accounted for: stats() returns inserted, consumed, evicted (per reason)
//!   and resident counts (records, groups, tokens) from one consistent snapshot, with
//!   inserted == consumed + evicted + resident.
//! - Selection is a policy point: pop() takes an optional group_selector that sees the ready
//!   groups (ordinals, versions, sizes) and chooses which to take and which to evict
//!   (stale, requeued). The staleness family plugs its version-window policies in here;
//!   notify() re-runs waiting selectors when something outside the buffer changed (a new
//!   policy version).
//! - snapshot()/restore() capture the whole state (see rollout/checkpoint.hpp for the file
//!   format): after a restore the same pushes and pops give the same batches.
//!
//! Filters and selectors run under the buffer's lock (keep them cheap and never call back
//! into the buffer); the eviction callback runs after the lock is released.
#pragma once

#include <rlpt/config.hpp>
#include <rlpt/core/checked.hpp>
#include <rlpt/core/error.hpp>
#include <rlpt/rollout/batch.hpp>
#include <rlpt/rollout/filters.hpp>
#include <rlpt/rollout/record.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

RLPT_NAMESPACE_BEGIN

//! What opening a group does when the buffer already holds capacity_groups groups.
enum class full_policy : std::uint8_t {
  block,       //!< wait for space (AReaL, TRL's bounded mp.Queue)
  drop_oldest, //!< evict the oldest ready group, reason overflow (verl fully_async MessageQueue); waits if none is ready
};

//! Outcome of the non-blocking and timed push variants.
enum class push_status : std::uint8_t { ok, full, timeout, closed };

//! A group leaving the buffer without being consumed, handed to options.on_evict.
struct evicted_group {
  group_info info;
  evict_reason reason = evict_reason::discarded;
  std::vector<trajectory> records;
};

struct buffer_options {
  index_t capacity_groups = 1024; //!< resident groups (open + ready); rlpt default (TRL's queue holds 1024)
  index_t group_size = 1;         //!< records per group unless open_group declares otherwise (verl rollout.n = 1)
  //! A group closed early with close_group() is released as `partial` when it has at least
  //! this many records, else evicted as incomplete. 0 = the group's full size: never release a
  //! partial group ("all or retry", tinker-cookbook #497).
  index_t min_group_size = 0;
  full_policy when_full = full_policy::block;      //!< AReaL/TRL block; verl fully_async drops the oldest
  record_schema schema{};                          //!< fields every record carries (validated on push)
  std::vector<group_filter> filters{};             //!< run in order when a group completes; none by default
  std::function<void(evicted_group&&)> on_evict{}; //!< receives evicted groups (outside the lock); optional
};

//! Record / group / token counters.
struct flow_count {
  index_t records = 0;
  index_t groups = 0;
  index_t tokens = 0;

  flow_count& operator+=(const flow_count& o) noexcept {
    records += o.records;
    groups += o.groups;
    tokens += o.tokens;
    return *this;
  }
  flow_count& operator-=(const flow_count& o) noexcept {
    records -= o.records;
    groups -= o.groups;
    tokens -= o.tokens;
    return *this;
  }
  friend flow_count operator+(flow_count a, const flow_count& b) noexcept { return a += b; }
  friend bool operator==(const flow_count&, const flow_count&) = default;
};

//! A consistent snapshot of the buffer's accounting.
struct buffer_stats {
  flow_count inserted;                                  //!< records pushed; groups opened
  flow_count consumed;                                  //!< handed to consumers by pop
  std::array<flow_count, evict_reason_count> evicted{}; //!< left unconsumed, by reason
  flow_count resident;                                  //!< still inside (open + ready)
  index_t open_groups = 0;                              //!< resident groups still collecting records
  index_t ready_groups = 0;                             //!< resident groups waiting for a consumer
  index_t completed_groups = 0;                         //!< groups that completed and went through the filters
  std::vector<index_t> dropped_by_filter;               //!< groups each options.filters[i] dropped
  bool closed = false;

  [[nodiscard]] const flow_count& evicted_by(evict_reason r) const noexcept {
    return evicted[static_cast<std::size_t>(r)];
  }
  [[nodiscard]] flow_count evicted_total() const noexcept {
    flow_count s;
    for (const auto& e : evicted) s += e;
    return s;
  }
  //! The accounting invariant: nothing lost, nothing duplicated.
  [[nodiscard]] bool balanced() const noexcept { return inserted == consumed + evicted_total() + resident; }
};

//! How many more groups the producers should start to fill a consumer batch.
struct refill_info {
  index_t ready = 0;      //!< groups ready now
  index_t open = 0;       //!< groups still collecting records
  index_t needed = 0;     //!< max(0, batch - ready - open): missing even if every open group passes
  index_t suggested = 0;  //!< max(0, ceil((batch - ready) / pass_rate) - open): over-sampling for the filters
  double pass_rate = 1.0; //!< share of completed groups the filters kept so far (1 before any completed)
};

//! A selector's answer: positions (into the ready list it was shown) to take, in batch order,
//! and positions to evict with a reason.
struct selection {
  std::vector<index_t> take;
  std::vector<std::pair<index_t, evict_reason>> evict;
};

//! Chooses among the ready groups (ready order). Called under the buffer lock with the number
//! of groups wanted and whether the buffer is closed. Taking fewer than `wanted` makes a
//! blocking pop wait (and re-run the selector when groups arrive or notify() is called);
//! evictions apply immediately either way.
using group_selector =
    std::function<void(std::span<const group_info> ready, index_t wanted, bool closed, selection& out)>;

//! A group as stored in a snapshot.
struct group_snapshot {
  group_info info;
  std::vector<trajectory> records;
};

//! Everything a buffer holds, for checkpointing (rollout/checkpoint.hpp) or inspection.
struct buffer_state {
  index_t group_size = 1;
  index_t min_group_size = 0;
  record_schema schema;
  std::uint64_t next_ordinal = 0;
  std::uint64_t next_ready_seq = 0;
  buffer_stats stats;
  std::vector<group_snapshot> open;  //!< in ordinal order
  std::vector<group_snapshot> ready; //!< in ready order
};

template <class = void> class basic_rollout_buffer {
public:
  explicit basic_rollout_buffer(buffer_options options = {});

  basic_rollout_buffer(const basic_rollout_buffer&) = delete;
  basic_rollout_buffer& operator=(const basic_rollout_buffer&) = delete;

  [[nodiscard]] const buffer_options& options() const noexcept { return opt_; }

  // --- producers ---------------------------------------------------------------------------

  //! Adds a record, blocking while its group would be a new group in a full buffer. Returns
  //! false (and leaves `t` untouched) if the buffer is closed. Invalid records throw.
  bool push(trajectory&& t) { return push_impl(t, wait_mode::forever, {}) == push_status::ok; }

  //! As push, without waiting: `full` if a new group does not fit now.
  [[nodiscard]] push_status try_push(trajectory&& t) { return push_impl(t, wait_mode::none, {}); }

  //! As push, waiting at most `timeout`.
  template <class Rep, class Period>
  [[nodiscard]] push_status push_for(trajectory&& t, std::chrono::duration<Rep, Period> timeout) {
    return push_impl(t, wait_mode::until, clock::now() + std::chrono::duration_cast<clock::duration>(timeout));
  }

  //! Pushes records in order (one lock round per record); returns how many went in (fewer
  //! than records.size() only if the buffer closed; the rest are untouched).
  index_t push(std::span<trajectory> records) {
    for (std::size_t i = 0; i < records.size(); ++i)
      if (!push(std::move(records[i]))) return detail::isize(i);
    return detail::isize(records.size());
  }

  //! Declares a group of `expected` records (ragged groups, or reserving its slot before the
  //! first record exists). Blocks while full. A group opened implicitly by push has
  //! options.group_size records.
  push_status open_group(std::int64_t id, index_t expected) { return open_impl(id, expected, wait_mode::forever, {}); }
  [[nodiscard]] push_status try_open_group(std::int64_t id, index_t expected) {
    return open_impl(id, expected, wait_mode::none, {});
  }

  //! No more records will come for group `id` (some samples failed): it is released as a
  //! partial group if it has at least min_group_size records, else evicted as incomplete.
  //! Returns false if no such group is open.
  bool close_group(std::int64_t id) { return end_group(id, false); }

  //! Evicts open group `id` (reason incomplete). Returns false if no such group is open.
  bool abort_group(std::int64_t id) { return end_group(id, true); }

  // --- consumers ---------------------------------------------------------------------------

  //! Takes `groups` whole groups, waiting until they are ready. After close() it returns what
  //! is left (possibly fewer groups; an empty batch once drained). `select` (optional)
  //! chooses which ready groups to take; default: oldest ready first.
  [[nodiscard]] rollout_batch pop(index_t groups, const group_selector& select = {}) {
    return *pop_impl(groups, select, wait_mode::forever, {});
  }

  //! As pop, without waiting: nullopt unless the request can be served now.
  [[nodiscard]] std::optional<rollout_batch> try_pop(index_t groups, const group_selector& select = {}) {
    return pop_impl(groups, select, wait_mode::none, {});
  }

  //! As pop, waiting at most `timeout` (nullopt on timeout).
  template <class Rep, class Period>
  [[nodiscard]] std::optional<rollout_batch> pop_for(index_t groups, std::chrono::duration<Rep, Period> timeout,
                                                     const group_selector& select = {}) {
    return pop_impl(groups, select, wait_mode::until,
                    clock::now() + std::chrono::duration_cast<clock::duration>(timeout));
  }

  //! As pop, into a caller batch whose arrays are reused (no allocation in the steady state).
  //! Returns false, with `out` empty, once the buffer is closed and drained.
  bool pop_into(rollout_batch& out, index_t groups, const group_selector& select = {}) {
    auto taken = take(groups, select, wait_mode::forever, {});
    gather_into(out, *taken);
    return !out.empty();
  }

  // --- control -----------------------------------------------------------------------------

  //! No more pushes: blocked producers return `closed`, blocked consumers take what is ready.
  //! Open groups stay resident (close_group/abort_group still work; evict_incomplete drops them).
  void close() {
    {
      std::lock_guard lock(mutex_);
      // release: a thread that reads closed() == true also sees every push made before close.
      closed_.store(true, std::memory_order_release);
      stats_.closed = true;
      ++generation_;
    }
    space_.notify_all();
    ready_cv_.notify_all();
  }
  [[nodiscard]] bool closed() const noexcept { return closed_.load(std::memory_order_acquire); }

  //! Wakes waiting consumers so their selectors run again (e.g. after a policy version bump).
  void notify() {
    {
      std::lock_guard lock(mutex_);
      ++generation_;
    }
    ready_cv_.notify_all();
  }

  //! Evicts every open group (reason incomplete); returns how many.
  index_t evict_incomplete();

  //! Evicts every ready group (reason discarded); returns how many.
  index_t discard_ready();

  [[nodiscard]] buffer_stats stats() const {
    std::lock_guard lock(mutex_);
    return stats_;
  }

  [[nodiscard]] refill_info refill(index_t batch_groups) const;

  //! A deep copy of the state (records included), taken atomically under the lock.
  [[nodiscard]] buffer_state snapshot() const;

  //! Loads a state into this buffer, which must be fresh (nothing pushed yet). The state's
  //! group size, minimum group size and schema must equal this buffer's options, and the state
  //! must be self-consistent (counts match the records it holds); records are validated.
  void restore(buffer_state s);

private:
  using clock = std::chrono::steady_clock;

  void check_fresh() const {
    std::lock_guard lock(mutex_);
    check_fresh_locked();
  }
  void check_fresh_locked() const {
    RLPT_CHECK(stats_.inserted.records == 0 && stats_.inserted.groups == 0 && !stats_.closed,
               errors::rollout::restore_nonempty, "restore needs a fresh buffer; this one has seen {} records",
               stats_.inserted.records);
  }
  enum class wait_mode : std::uint8_t { none, forever, until };

  struct group_slot {
    group_info info;
    std::vector<trajectory> records;
  };

  // Folds one record into a group's metadata (kept current while the group fills, so
  // snapshots and selectors always see consistent numbers).
  static void accumulate(group_info& g, const trajectory& t) noexcept {
    g.samples += 1;
    g.tokens += t.size();
    for (const mask_t m : t.loss_mask) g.loss_tokens += m != 0;
    for (const policy_version v : t.versions)
      if (v >= 0) {
        g.head_version = g.head_version < 0 ? v : std::min(g.head_version, v);
        g.tail_version = std::max(g.tail_version, v);
      }
  }

  [[nodiscard]] static group_info info_of(group_info base, std::span<const trajectory> records) {
    base.samples = 0;
    base.tokens = 0;
    base.loss_tokens = 0;
    base.head_version = no_version;
    base.tail_version = no_version;
    for (const auto& t : records) accumulate(base, t);
    return base;
  }

  template <class Pred>
  bool wait(std::unique_lock<std::mutex>& lock, std::condition_variable& cv, wait_mode mode, clock::time_point deadline,
            Pred pred) {
    if (pred()) return true;
    switch (mode) {
    case wait_mode::none:
      return false;
    case wait_mode::forever:
      cv.wait(lock, pred);
      return true;
    case wait_mode::until:
      return cv.wait_until(lock, deadline, pred);
    }
    return false;
  }

  // Waits for room for one more group (lock held). Returns ok, or full/timeout/closed.
  push_status make_room(std::unique_lock<std::mutex>& lock, wait_mode mode, clock::time_point deadline,
                        std::vector<evicted_group>& out);

  push_status push_impl(trajectory& t, wait_mode mode, clock::time_point deadline);

  push_status push_locked(std::unique_lock<std::mutex>& lock, trajectory& t, wait_mode mode, clock::time_point deadline,
                          std::vector<evicted_group>& out, bool& wake_consumers);

  push_status open_impl(std::int64_t id, index_t expected, wait_mode mode, clock::time_point deadline);

  bool end_group(std::int64_t id, bool abort);

  std::optional<rollout_batch> pop_impl(index_t want, const group_selector& select, wait_mode mode,
                                        clock::time_point deadline) {
    auto taken = take(want, select, mode, deadline);
    if (!taken) return std::nullopt;
    rollout_batch b;
    gather_into(b, *taken);
    return b;
  }

  // Takes groups out under the lock; nullopt when the request is not served (try / timeout).
  std::optional<std::vector<group_slot>> take(index_t want, const group_selector& select, wait_mode mode,
                                              clock::time_point deadline);

  bool select_locked(index_t want, const group_selector& select, bool is_closed, std::vector<group_slot>& taken,
                     std::vector<evicted_group>& out);

  void gather_into(rollout_batch& out, const std::vector<group_slot>& taken) const {
    std::vector<const trajectory*> recs;
    std::vector<group_info> infos;
    infos.reserve(taken.size());
    for (const auto& g : taken) {
      infos.push_back(g.info);
      for (const auto& t : g.records) recs.push_back(&t);
    }
    out.assign(recs, opt_.schema, infos);
  }

  void check_not_complete(std::int64_t id) const {
    const auto it = ready_ids_.find(id);
    RLPT_CHECK(it == ready_ids_.end(), errors::rollout::group_complete,
               "a record for group {} arrived after the group completed and is still waiting in the buffer: groups are "
               "never extended or split (use a new group id, or open_group with the right size)",
               id);
  }

  // Whether a waiting consumer could now be served: selectors decide for themselves, a plain
  // pop needs its number of ready groups.
  [[nodiscard]] bool consumer_can_proceed() const noexcept {
    return selector_waiters_ > 0 ||
           (!waiting_wants_.empty() && detail::isize(ready_.size()) >= *waiting_wants_.begin());
  }

  [[nodiscard]] index_t resident_groups() const noexcept { return stats_.open_groups + stats_.ready_groups; }

  typename std::unordered_map<std::int64_t, group_slot>::iterator open_locked(std::int64_t id, index_t expected) {
    group_slot g;
    g.info.id = id;
    g.info.ordinal = next_ordinal_++;
    g.info.expected = expected;
    g.records.reserve(detail::usize(expected));
    stats_.inserted.groups += 1;
    stats_.resident.groups += 1;
    ++stats_.open_groups;
    return open_.emplace(id, std::move(g)).first;
  }

  // Adds a record to an open group; completes the group when it is full. Returns true if a
  // group became ready.
  bool add_locked(typename std::unordered_map<std::int64_t, group_slot>::iterator it, trajectory&& t,
                  std::vector<evicted_group>& out);

  // A group leaves the open set (records all in, or closed early): order, filter, publish.
  bool complete_locked(group_slot g, std::vector<evicted_group>& out);

  // Accounts a group leaving unconsumed. `g` is already out of open_/ready_ (and ready_ids_)
  // but still counted in open_groups or ready_groups, as `from_ready` says.
  void evict_locked(group_slot g, bool from_ready, evict_reason reason, std::vector<evicted_group>& out) {
    if (from_ready)
      --stats_.ready_groups;
    else
      --stats_.open_groups;
    const flow_count f{g.info.samples, 1, g.info.tokens};
    stats_.evicted[static_cast<std::size_t>(reason)] += f;
    stats_.resident -= f;
    ++space_generation_;
    out.push_back({g.info, reason, std::move(g.records)});
  }

  void drop_ready_id(std::int64_t id) {
    auto it = ready_ids_.find(id);
    if (it != ready_ids_.end() && --it->second == 0) ready_ids_.erase(it);
  }

  index_t deliver(std::vector<evicted_group>&& out) const {
    const index_t n = detail::isize(out.size());
    if (opt_.on_evict)
      for (auto& g : out) opt_.on_evict(std::move(g));
    return n;
  }

  buffer_options opt_;
  alignas(cacheline_bytes) mutable std::mutex mutex_;
  std::condition_variable space_;    // producers waiting for room
  std::condition_variable ready_cv_; // consumers waiting for groups
  std::unordered_map<std::int64_t, group_slot> open_;
  std::deque<group_slot> ready_;
  std::unordered_map<std::int64_t, index_t> ready_ids_;
  buffer_stats stats_;
  std::uint64_t next_ordinal_ = 0;
  std::uint64_t next_ready_seq_ = 0;
  std::uint64_t generation_ = 0;         // bumped whenever a consumer's selection could change
  std::uint64_t space_generation_ = 0;   // bumped whenever a group leaves
  std::multiset<index_t> waiting_wants_; // groups wanted by each consumer waiting without a selector
  index_t selector_waiters_ = 0;
  index_t waiting_producers_ = 0;
  alignas(cacheline_bytes) std::atomic<bool> closed_{false};
};
using rollout_buffer = basic_rollout_buffer<>;
RLPT_EXTERN_TEMPLATE(class basic_rollout_buffer<>)

RLPT_NAMESPACE_END

#if RLPT_HEADER_IMPL()
RLPT_NAMESPACE_BEGIN

template <class Tag>
RLPT_INLINE basic_rollout_buffer<Tag>::basic_rollout_buffer(buffer_options options) : opt_(std::move(options)) {
  RLPT_CHECK(opt_.capacity_groups >= 1, errors::rollout::bad_option, "capacity_groups must be >= 1, got {}",
             opt_.capacity_groups);
  RLPT_CHECK(opt_.group_size >= 1, errors::rollout::bad_option, "group_size must be >= 1, got {}", opt_.group_size);
  RLPT_CHECK(opt_.min_group_size >= 0 && opt_.min_group_size <= opt_.group_size, errors::rollout::bad_option,
             "min_group_size {} must be in [0, group_size = {}]", opt_.min_group_size, opt_.group_size);
  check_schema(opt_.schema);
  RLPT_CHECK(opt_.when_full == full_policy::block || opt_.when_full == full_policy::drop_oldest,
             errors::rollout::bad_option, "when_full has code {}, not a full_policy", static_cast<int>(opt_.when_full));
  for (std::size_t k = 0; k < opt_.filters.size(); ++k) {
    const group_filter& f = opt_.filters[k];
    RLPT_CHECK(static_cast<bool>(f.keep), errors::rollout::bad_option, "filter '{}' has no keep function", f.name);
    // The reason indexes the eviction counters: an out-of-range code would write past them.
    RLPT_CHECK(static_cast<std::size_t>(f.reason) < evict_reason_count, errors::rollout::bad_option,
               "filters[{}] '{}' has evict reason code {}, not an evict_reason (0 to {})", k, f.name,
               static_cast<int>(f.reason), evict_reason_count - 1);
  }
  stats_.dropped_by_filter.assign(opt_.filters.size(), 0);
}

template <class Tag> RLPT_INLINE index_t basic_rollout_buffer<Tag>::evict_incomplete() {
  std::vector<evicted_group> out;
  {
    std::lock_guard lock(mutex_);
    std::vector<std::int64_t> ids;
    ids.reserve(open_.size());
    for (const auto& [id, g] : open_) ids.push_back(id);
    for (const auto id : ids) {
      auto it = open_.find(id);
      group_slot g = std::move(it->second);
      open_.erase(it);
      evict_locked(std::move(g), false, evict_reason::incomplete, out);
    }
  }
  space_.notify_all();
  return deliver(std::move(out));
}

template <class Tag> RLPT_INLINE index_t basic_rollout_buffer<Tag>::discard_ready() {
  std::vector<evicted_group> out;
  {
    std::lock_guard lock(mutex_);
    while (!ready_.empty()) {
      group_slot g = std::move(ready_.front());
      ready_.pop_front();
      drop_ready_id(g.info.id);
      evict_locked(std::move(g), true, evict_reason::discarded, out);
    }
  }
  space_.notify_all();
  return deliver(std::move(out));
}

template <class Tag> RLPT_INLINE refill_info basic_rollout_buffer<Tag>::refill(index_t batch_groups) const {
  std::lock_guard lock(mutex_);
  refill_info r;
  r.ready = stats_.ready_groups;
  r.open = stats_.open_groups;
  r.needed = std::max<index_t>(0, batch_groups - r.ready - r.open);
  index_t dropped = 0;
  for (const auto d : stats_.dropped_by_filter) dropped += d;
  if (stats_.completed_groups > 0)
    r.pass_rate = static_cast<double>(stats_.completed_groups - dropped) / static_cast<double>(stats_.completed_groups);
  const index_t missing = std::max<index_t>(0, batch_groups - r.ready);
  if (missing > 0) {
    const double want = r.pass_rate > 0.0 ? std::ceil(static_cast<double>(missing) / r.pass_rate)
                                          : static_cast<double>(std::max<index_t>(missing, opt_.capacity_groups));
    r.suggested = std::max<index_t>(0, static_cast<index_t>(want) - r.open);
  }
  return r;
}

template <class Tag> RLPT_INLINE buffer_state basic_rollout_buffer<Tag>::snapshot() const {
  std::lock_guard lock(mutex_);
  buffer_state s;
  s.group_size = opt_.group_size;
  s.min_group_size = opt_.min_group_size;
  s.schema = opt_.schema;
  s.next_ordinal = next_ordinal_;
  s.next_ready_seq = next_ready_seq_;
  s.stats = stats_;
  s.stats.closed = false;
  for (const auto& [id, g] : open_) s.open.push_back({g.info, g.records});
  std::sort(s.open.begin(), s.open.end(),
            [](const group_snapshot& a, const group_snapshot& b) { return a.info.ordinal < b.info.ordinal; });
  for (const auto& g : ready_) s.ready.push_back({g.info, g.records});
  return s;
}

template <class Tag> RLPT_INLINE void basic_rollout_buffer<Tag>::restore(buffer_state s) {
  check_fresh();
  RLPT_CHECK(s.group_size == opt_.group_size && s.min_group_size == opt_.min_group_size,
             errors::rollout::restore_mismatch, "state has group_size {} / min_group_size {}, this buffer {} / {}",
             s.group_size, s.min_group_size, opt_.group_size, opt_.min_group_size);
  RLPT_CHECK(s.schema == opt_.schema, errors::rollout::restore_mismatch,
             "state was saved with a different record schema than this buffer's: {}",
             detail::schema_difference(s.schema, opt_.schema, "the state", "this buffer"));
  RLPT_CHECK(s.stats.dropped_by_filter.size() == opt_.filters.size(), errors::rollout::restore_mismatch,
             "state counts {} filters, this buffer has {}", s.stats.dropped_by_filter.size(), opt_.filters.size());
  flow_count held;
  std::unordered_map<std::int64_t, group_slot> open;
  std::deque<group_slot> ready;
  std::unordered_map<std::int64_t, index_t> ready_ids;
  auto check_group = [&](const group_snapshot& g, bool is_ready) {
    const char* list = is_ready ? "ready" : "open";
    RLPT_CHECK(detail::isize(g.records.size()) == g.info.samples, errors::rollout::restore_inconsistent,
               "{} group {} holds {} records but its samples counter says {}", list, g.info.id, g.records.size(),
               g.info.samples);
    RLPT_CHECK(g.info.expected >= 1 && g.info.samples <= g.info.expected, errors::rollout::restore_inconsistent,
               "{} group {} has samples = {} and expected = {}; expected must be >= 1 and >= samples", list, g.info.id,
               g.info.samples, g.info.expected);
    RLPT_CHECK(g.info.ordinal < s.next_ordinal, errors::rollout::restore_inconsistent,
               "{} group {} has ordinal {}, not below the state's next_ordinal {}", list, g.info.id, g.info.ordinal,
               s.next_ordinal);
    RLPT_CHECK(!is_ready || g.info.ready_seq < s.next_ready_seq, errors::rollout::restore_inconsistent,
               "ready group {} has ready_seq {}, not below the state's next_ready_seq {}", g.info.id, g.info.ready_seq,
               s.next_ready_seq);
    RLPT_CHECK(is_ready || g.info.samples < g.info.expected, errors::rollout::restore_inconsistent,
               "open group {} already has all {} records", g.info.id, g.info.expected);
    for (const auto& t : g.records) {
      validate(t, opt_.schema);
      RLPT_CHECK(t.group_id == g.info.id, errors::rollout::restore_inconsistent, "a record of group {} has group_id {}",
                 g.info.id, t.group_id);
    }
    const group_info want = info_of(g.info, g.records);
    RLPT_CHECK(want.tokens == g.info.tokens && want.loss_tokens == g.info.loss_tokens &&
                   want.head_version == g.info.head_version && want.tail_version == g.info.tail_version,
               errors::rollout::restore_inconsistent,
               "group {} metadata ({} tokens, {} trained, versions {}..{}) does not match its records ({}, {}, {}..{})",
               g.info.id, g.info.tokens, g.info.loss_tokens, g.info.head_version, g.info.tail_version, want.tokens,
               want.loss_tokens, want.head_version, want.tail_version);
    held += {g.info.samples, 1, g.info.tokens};
  };
  for (auto& g : s.open) {
    check_group(g, false);
    RLPT_CHECK(open.find(g.info.id) == open.end(), errors::rollout::restore_inconsistent, "group {} is open twice",
               g.info.id);
    open.emplace(g.info.id, group_slot{g.info, std::move(g.records)});
  }
  for (auto& g : s.ready) {
    check_group(g, true);
    RLPT_CHECK(ready.empty() || ready.back().info.ready_seq < g.info.ready_seq, errors::rollout::restore_inconsistent,
               "ready groups are out of order at group {}", g.info.id);
    RLPT_CHECK(open.find(g.info.id) == open.end() && ready_ids.find(g.info.id) == ready_ids.end(),
               errors::rollout::restore_inconsistent, "group {} is resident twice", g.info.id);
    ++ready_ids[g.info.id];
    ready.push_back({g.info, std::move(g.records)});
  }
  // Name the first counter that disagrees, with both values.
  auto held_check = [&](const char* counter, index_t stated, index_t actual, const char* unit) {
    RLPT_CHECK(stated == actual, errors::rollout::restore_inconsistent,
               "state counters do not match the groups it holds: {} = {}, but the state holds {} {}", counter, stated,
               actual, unit);
  };
  held_check("stats.resident.records", s.stats.resident.records, held.records, "records");
  held_check("stats.resident.groups", s.stats.resident.groups, held.groups, "groups");
  held_check("stats.resident.tokens", s.stats.resident.tokens, held.tokens, "tokens");
  held_check("stats.open_groups", s.stats.open_groups, detail::isize(open.size()), "open groups");
  held_check("stats.ready_groups", s.stats.ready_groups, detail::isize(ready.size()), "ready groups");
  // inserted == consumed + evicted + resident, per field; the counters come from the caller (or a
  // file), so the sums are checked: a sum beyond index_t cannot balance.
  auto balance_check = [&](const char* field, index_t flow_count::*m) {
    const index_t inserted = s.stats.inserted.*m, consumed = s.stats.consumed.*m, resident = s.stats.resident.*m;
    index_t evicted = 0, sum = 0;
    bool overflow = false;
    for (const auto& e : s.stats.evicted) overflow = overflow || detail::add_overflows(evicted, e.*m, evicted);
    overflow = overflow || detail::add_overflows(consumed, evicted, sum) || detail::add_overflows(sum, resident, sum);
    RLPT_CHECK(!overflow, errors::rollout::restore_inconsistent,
               "state counters do not balance: stats.inserted.{} = {}, but consumed.{} = {} + evicted.{} + "
               "resident.{} = {} overflow a 64-bit count",
               field, inserted, field, consumed, field, field, resident);
    RLPT_CHECK(inserted == sum, errors::rollout::restore_inconsistent,
               "state counters do not balance: stats.inserted.{} = {}, but consumed + evicted + resident = {} + {} + "
               "{} = {}",
               field, inserted, consumed, evicted, resident, sum);
  };
  balance_check("records", &flow_count::records);
  balance_check("groups", &flow_count::groups);
  balance_check("tokens", &flow_count::tokens);

  std::lock_guard lock(mutex_);
  check_fresh_locked();
  open_ = std::move(open);
  ready_ = std::move(ready);
  ready_ids_ = std::move(ready_ids);
  next_ordinal_ = s.next_ordinal;
  next_ready_seq_ = s.next_ready_seq;
  stats_ = std::move(s.stats);
  stats_.closed = false;
  ++generation_;
}

template <class Tag>
RLPT_INLINE push_status basic_rollout_buffer<Tag>::make_room(std::unique_lock<std::mutex>& lock, wait_mode mode,
                                                             clock::time_point deadline,
                                                             std::vector<evicted_group>& out) {
  for (;;) {
    if (closed_.load(std::memory_order_relaxed)) return push_status::closed;
    if (resident_groups() < opt_.capacity_groups) return push_status::ok;
    if (opt_.when_full == full_policy::drop_oldest && !ready_.empty()) {
      group_slot g = std::move(ready_.front());
      ready_.pop_front();
      drop_ready_id(g.info.id);
      evict_locked(std::move(g), true, evict_reason::overflow, out);
      continue;
    }
    const std::uint64_t seen = space_generation_;
    ++waiting_producers_;
    const bool woke = wait(lock, space_, mode, deadline,
                           [&] { return closed_.load(std::memory_order_relaxed) || space_generation_ != seen; });
    --waiting_producers_;
    if (!woke) return mode == wait_mode::none ? push_status::full : push_status::timeout;
  }
}

template <class Tag>
RLPT_INLINE push_status basic_rollout_buffer<Tag>::push_impl(trajectory& t, wait_mode mode,
                                                             clock::time_point deadline) {
  validate(t, opt_.schema); // outside the lock: O(tokens)
  std::vector<evicted_group> out;
  push_status status = push_status::ok;
  bool wake_consumers = false, wake_producers = false;
  std::exception_ptr error; // a throwing filter: deliver what was evicted, then rethrow
  {
    std::unique_lock lock(mutex_);
    try {
      status = push_locked(lock, t, mode, deadline, out, wake_consumers);
    } catch (...) {
      error = std::current_exception();
    }
    wake_producers = !out.empty() && waiting_producers_ > 0;
  }
  if (wake_producers) space_.notify_all();
  if (wake_consumers) ready_cv_.notify_all();
  deliver(std::move(out));
  if (error) std::rethrow_exception(error);
  return status;
}

template <class Tag>
RLPT_INLINE push_status basic_rollout_buffer<Tag>::push_locked(std::unique_lock<std::mutex>& lock, trajectory& t,
                                                               wait_mode mode, clock::time_point deadline,
                                                               std::vector<evicted_group>& out, bool& wake_consumers) {
  auto it = open_.find(t.group_id);
  if (it == open_.end()) {
    check_not_complete(t.group_id);
    const push_status status = make_room(lock, mode, deadline, out);
    if (status != push_status::ok) return status;
    // Another producer may have opened this group while we waited.
    it = open_.find(t.group_id);
    if (it == open_.end()) {
      check_not_complete(t.group_id);
      it = open_locked(t.group_id, opt_.group_size);
    }
  } else if (closed_.load(std::memory_order_relaxed)) {
    return push_status::closed;
  }
  if (add_locked(it, std::move(t), out)) wake_consumers = consumer_can_proceed();
  return push_status::ok;
}

template <class Tag>
RLPT_INLINE push_status basic_rollout_buffer<Tag>::open_impl(std::int64_t id, index_t expected, wait_mode mode,
                                                             clock::time_point deadline) {
  RLPT_CHECK(expected >= 1, errors::rollout::bad_group, "group {} declared with {} records; it needs at least 1", id,
             expected);
  std::vector<evicted_group> out;
  push_status status;
  {
    std::unique_lock lock(mutex_);
    RLPT_CHECK(open_.find(id) == open_.end(), errors::rollout::bad_group, "group {} is already open", id);
    check_not_complete(id);
    status = make_room(lock, mode, deadline, out);
    if (status == push_status::ok) {
      RLPT_CHECK(open_.find(id) == open_.end(), errors::rollout::bad_group, "group {} is already open", id);
      check_not_complete(id);
      open_locked(id, expected);
    }
  }
  if (!out.empty()) space_.notify_all();
  deliver(std::move(out));
  return status;
}

template <class Tag> RLPT_INLINE bool basic_rollout_buffer<Tag>::end_group(std::int64_t id, bool abort) {
  std::vector<evicted_group> out;
  bool became_ready = false;
  std::exception_ptr error;
  {
    std::lock_guard lock(mutex_);
    auto it = open_.find(id);
    if (it == open_.end()) return false;
    group_slot g = std::move(it->second);
    open_.erase(it);
    const index_t need = opt_.min_group_size > 0 ? std::min(opt_.min_group_size, g.info.expected) : g.info.expected;
    if (abort || g.info.samples == 0 || g.info.samples < need) {
      evict_locked(std::move(g), false, evict_reason::incomplete, out);
    } else {
      g.info.partial = g.info.samples < g.info.expected;
      try {
        became_ready = complete_locked(std::move(g), out) && consumer_can_proceed();
      } catch (...) {
        error = std::current_exception();
      }
    }
  }
  space_.notify_all();
  if (became_ready) ready_cv_.notify_all();
  deliver(std::move(out));
  if (error) std::rethrow_exception(error);
  return true;
}

template <class Tag>
RLPT_INLINE std::optional<std::vector<typename basic_rollout_buffer<Tag>::group_slot>>
basic_rollout_buffer<Tag>::take(index_t want, const group_selector& select, wait_mode mode,
                                clock::time_point deadline) {
  RLPT_CHECK(want >= 1 && want <= opt_.capacity_groups, errors::rollout::bad_pop,
             "pop asks for {} groups; it must be in [1, capacity_groups = {}]", want, opt_.capacity_groups);
  std::vector<evicted_group> out;
  std::vector<group_slot> taken;
  bool have = false, was_closed = false;
  {
    std::unique_lock lock(mutex_);
    for (;;) {
      const bool is_closed = closed_.load(std::memory_order_relaxed);
      was_closed = is_closed;
      if (select) {
        have = select_locked(want, select, is_closed, taken, out);
      } else if (detail::isize(ready_.size()) >= want || (is_closed && !ready_.empty())) {
        const index_t n = std::min(want, detail::isize(ready_.size()));
        for (index_t i = 0; i < n; ++i) {
          taken.push_back(std::move(ready_.front()));
          ready_.pop_front();
          drop_ready_id(taken.back().info.id);
        }
        have = true;
      }
      if (have || is_closed) break;
      const std::uint64_t seen = generation_;
      // Producers wake a plain waiter only once enough groups are ready for it.
      const auto slot = select ? waiting_wants_.end() : waiting_wants_.insert(want);
      selector_waiters_ += select ? 1 : 0;
      const bool woke = wait(lock, ready_cv_, mode, deadline, [&] { return generation_ != seen; });
      if (select)
        --selector_waiters_;
      else
        waiting_wants_.erase(slot);
      if (!woke) break;
    }
    for (const auto& g : taken) {
      const flow_count f{g.info.samples, 1, g.info.tokens};
      stats_.consumed += f;
      stats_.resident -= f;
      --stats_.ready_groups;
    }
    if (!taken.empty() || !out.empty()) ++space_generation_;
  }
  if (!taken.empty() || !out.empty()) space_.notify_all();
  deliver(std::move(out));
  // Not served: try_pop and timeouts say so; a closed, drained buffer gives an empty batch.
  if (!have && (mode == wait_mode::none || !was_closed)) return std::nullopt;
  return taken;
}

template <class Tag>
RLPT_INLINE bool basic_rollout_buffer<Tag>::select_locked(index_t want, const group_selector& select, bool is_closed,
                                                          std::vector<group_slot>& taken,
                                                          std::vector<evicted_group>& out) {
  std::vector<group_info> infos;
  infos.reserve(ready_.size());
  for (const auto& g : ready_) infos.push_back(g.info);
  selection sel;
  select(infos, want, is_closed, sel);
  const auto n = detail::isize(infos.size());
  std::vector<std::uint8_t> used(infos.size(), 0);
  auto mark = [&](index_t p, std::string_view what) {
    RLPT_CHECK(p >= 0 && p < n, errors::rollout::bad_selection, "selector {} position {}, but {} groups are ready",
               what, p, n);
    RLPT_CHECK(used[detail::usize(p)] == 0, errors::rollout::bad_selection,
               "selector names ready position {} twice (take or evict)", p);
    used[detail::usize(p)] = 1;
  };
  RLPT_CHECK(detail::isize(sel.take.size()) <= want, errors::rollout::bad_selection,
             "selector takes {} groups, more than the {} wanted", sel.take.size(), want);
  for (const auto p : sel.take) mark(p, "takes");
  for (const auto& [p, r] : sel.evict) {
    mark(p, "evicts");
    RLPT_CHECK(static_cast<std::size_t>(r) < evict_reason_count, errors::rollout::bad_selection,
               "selector evicts position {} with unknown reason code {}", p, static_cast<int>(r));
  }
  const bool complete = detail::isize(sel.take.size()) == want || (is_closed && !sel.take.empty());
  if (sel.evict.empty() && !complete) return false;
  // Move out what is taken (in the selector's order) and evicted; keep the rest in order.
  std::vector<std::uint8_t> leaves(infos.size(), 0);
  if (complete)
    for (const auto p : sel.take) {
      leaves[detail::usize(p)] = 1;
      drop_ready_id(ready_[detail::usize(p)].info.id);
      taken.push_back(std::move(ready_[detail::usize(p)]));
    }
  for (const auto& [p, r] : sel.evict) {
    leaves[detail::usize(p)] = 1;
    drop_ready_id(ready_[detail::usize(p)].info.id);
    evict_locked(std::move(ready_[detail::usize(p)]), true, r, out);
  }
  std::deque<group_slot> rest;
  for (std::size_t i = 0; i < ready_.size(); ++i)
    if (!leaves[i]) rest.push_back(std::move(ready_[i]));
  ready_ = std::move(rest);
  if (!sel.evict.empty()) ++generation_;
  return complete;
}

template <class Tag>
RLPT_INLINE bool
basic_rollout_buffer<Tag>::add_locked(typename std::unordered_map<std::int64_t, group_slot>::iterator it,
                                      trajectory&& t, std::vector<evicted_group>& out) {
  group_slot& g = it->second;
  if (t.sample_index >= 0)
    for (const auto& r : g.records)
      RLPT_CHECK(r.sample_index != t.sample_index, errors::rollout::bad_group,
                 "group {} already has a record with sample_index {}", g.info.id, t.sample_index);
  const flow_count f{1, 0, t.size()};
  stats_.inserted += f;
  stats_.resident += f;
  accumulate(g.info, t);
  g.records.push_back(std::move(t));
  if (g.info.samples < g.info.expected) return false;
  group_slot done = std::move(g);
  open_.erase(it);
  return complete_locked(std::move(done), out);
}

template <class Tag>
RLPT_INLINE bool basic_rollout_buffer<Tag>::complete_locked(group_slot g, std::vector<evicted_group>& out) {
  ++stats_.completed_groups;
  const bool indexed =
      std::all_of(g.records.begin(), g.records.end(), [](const trajectory& r) { return r.sample_index >= 0; });
  if (indexed)
    std::sort(g.records.begin(), g.records.end(),
              [](const trajectory& a, const trajectory& b) { return a.sample_index < b.sample_index; });
  const group_view view{g.info.id, g.records};
  for (std::size_t k = 0; k < opt_.filters.size(); ++k) {
    bool keep = false;
    try {
      keep = opt_.filters[k].keep(view);
    } catch (...) {
      // A throwing filter rejects the group: it stays accounted for, then the error propagates.
      ++stats_.dropped_by_filter[k];
      evict_locked(std::move(g), false, evict_reason::rejected, out);
      throw;
    }
    if (!keep) {
      ++stats_.dropped_by_filter[k];
      evict_locked(std::move(g), false, opt_.filters[k].reason, out);
      return false;
    }
  }
  g.info.ready_seq = next_ready_seq_++;
  ++ready_ids_[g.info.id];
  ready_.push_back(std::move(g));
  --stats_.open_groups;
  ++stats_.ready_groups;
  ++generation_;
  return true;
}

RLPT_NAMESPACE_END
#endif // RLPT_HEADER_IMPL()
