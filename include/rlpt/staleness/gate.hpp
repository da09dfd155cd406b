// SPDX-License-Identifier: Apache-2.0
//! @file
//! staleness_gate: producer-side admission control that bounds off-policyness without wasted
//! work, counted in groups (a prompt and its n samples).
//!
//! Every group a producer starts holds a `ticket` from the gate. A ticket carries the policy
//! version at dispatch (stamp it on the request) and moves through
//!
//!     try_admit/admit ─► running ─accept─► buffered ─consume─► (trained)
//!                           │                 └──release(dropped | requeued | rejected)
//!                           └─reject (failed, filtered before it was accepted)
//!
//! Capacity mode (AReaL `staleness_manager`, default): with η = max_staleness, B =
//! batch_groups, v = current version,
//!
//!     capacity = min(max_concurrent − running, (η + v + 1)·B − (accepted + running))
//!
//! where `accepted` counts groups that finished and were not released. Rejected and released
//! groups return their slot. η = 0 is exactly synchronous training: B groups per version, and
//! none can start before the trainer publishes the version that consumes them.
//!
//! Target mode (NeMo-RL target-version reservation): each admitted group is reserved for one
//! future training step t ∈ [v, v + η] (the smallest with fewer than B reservations); the
//! consumer trains step t on exactly the groups reserved for it (selection.hpp,
//! pick_order::target_version).
//!
//! After a restart, `recover` applies AReaL's recovery rule (accepted := v·B, plus the groups
//! that survived in a restored buffer); without it the formula would admit a burst of
//! (η + v + 1)·B groups (AReaL #1388). `dp_shard` splits B and the concurrency cap across
//! data-parallel consumers (AReaL divides both by the DP size); shards share one version_clock.
#pragma once

#include <rlpt/config.hpp>
#include <rlpt/core/checked.hpp>
#include <rlpt/core/error.hpp>
#include <rlpt/staleness/clock.hpp>
#include <rlpt/staleness/metrics.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

RLPT_NAMESPACE_BEGIN

enum class admission_mode : std::uint8_t {
  capacity, //!< AReaL's capacity formula (bounds the head version of everything admitted)
  target    //!< NeMo-RL: reserve each group for one training step in [v, v + η]
};

struct gate_options {
  //! η, in versions: a group dispatched at version d is meant for a step at version ≤ d + η.
  //! AReaL `max_head_offpolicyness` default 0 (= synchronous; AReaL docs suggest 2-8).
  //! unbounded_staleness (-1) leaves only the concurrency cap (capacity mode only).
  index_t max_staleness = 0;
  //! B: groups one optimizer step consumes (AReaL `consumer_batch_size`, counted in groups).
  index_t batch_groups = 1;
  //! Groups in flight at most; 0 = batch_groups (AReaL's default when max_concurrent_rollouts
  //! is unset).
  index_t max_concurrent = 0;
  admission_mode mode = admission_mode::capacity;
  //! A clock shared with other gates (data-parallel shards); it must outlive the gate.
  //! nullptr = the gate owns one, starting at version 0.
  version_clock* clock = nullptr;
  //! Optional sink for admitted/refused/accepted/rejected/dropped/requeued and wait time.
  staleness_metrics* metrics = nullptr;
};

//! The right to run one group. `version` is the policy version at dispatch: stamp it on the
//! request. `target` is the training step reserved for it (target mode; -1 otherwise).
struct ticket {
  std::uint64_t id = 0; //!< 0: not admitted
  policy_version version = -1;
  policy_version target = -1;
  std::uint64_t issuer = 0; //!< which gate issued it

  [[nodiscard]] explicit operator bool() const noexcept { return id != 0; }
  friend bool operator==(const ticket&, const ticket&) = default;
};

//! Why a buffered (accepted) group leaves without being trained.
enum class release_reason : std::uint8_t {
  rejected, //!< a filter or the caller rejected it after it finished (slot returns, AReaL)
  dropped,  //!< too stale, or evicted before use (slot returns)
  requeued  //!< handed back to the producers to regenerate (slot returns; they re-admit)
};

[[nodiscard]] constexpr std::string_view name(release_reason r) noexcept {
  switch (r) {
  case release_reason::rejected:
    return "rejected";
  case release_reason::dropped:
    return "dropped";
  case release_reason::requeued:
    return "requeued";
  }
  return "?";
}

//! Alive tickets (running or buffered) sharing a dispatch version and a target.
struct version_count {
  policy_version version = 0;
  policy_version target = -1;
  index_t count = 0;
  friend bool operator==(const version_count&, const version_count&) = default;
};

//! A consistent view of the gate's accounting.
struct gate_counts {
  policy_version version = 0;
  index_t running = 0;  //!< admitted, still generating
  index_t buffered = 0; //!< accepted, not yet consumed or released
  index_t accepted = 0; //!< AReaL's `accepted`: finished and not released (buffered + consumed since recovery)
  index_t admitted = 0; //!< tickets issued (including recovered ones)
  index_t consumed = 0;
  index_t rejected = 0; //!< running -> rejected, plus buffered -> released(rejected)
  index_t dropped = 0;
  index_t requeued = 0;
  index_t capacity = 0; //!< groups admissible now (may be negative after a recovery)
  bool closed = false;

  //! Every ticket is accounted for exactly once.
  [[nodiscard]] bool balanced() const noexcept {
    return admitted == running + buffered + consumed + rejected + dropped + requeued;
  }
};

//! A group that survived a restart inside a restored buffer (re-registered by `recover`).
struct recovered_group {
  policy_version version = 0;
  policy_version target = -1;
};

//! Per-shard options for `dp_size` data-parallel consumers: B and the concurrency cap are
//! divided (AReaL: `max_concurrent_rollouts // dp`, `consumer_batch_size // dp`); uneven
//! splits are an error rather than a silent floor that shrinks the global batch.
RLPT_DEFER [[nodiscard]] gate_options dp_shard(gate_options o, index_t dp_size);

template <class = void> class basic_staleness_gate {
public:
  explicit basic_staleness_gate(gate_options options = {});
  ~basic_staleness_gate() { sub_.reset(); }
  basic_staleness_gate(const basic_staleness_gate&) = delete;
  basic_staleness_gate& operator=(const basic_staleness_gate&) = delete;

  [[nodiscard]] const gate_options& options() const noexcept { return opt_; }
  [[nodiscard]] version_clock& clock() noexcept { return *clock_; }
  [[nodiscard]] policy_version version() const noexcept { return clock_->current(); }
  //! Publishes the next policy version (after a completed weight sync); wakes producers.
  policy_version publish() { return clock_->publish(); }
  //! AReaL `get_pending_limit`: how many groups a producer may pre-enqueue, (η + 1)·B.
  [[nodiscard]] index_t pending_limit() const noexcept {
    return opt_.max_staleness < 0 ? std::numeric_limits<index_t>::max() : (opt_.max_staleness + 1) * opt_.batch_groups;
  }

  // --- producers -----------------------------------------------------------------------------

  //! A ticket if a group may start now, else an empty (false) ticket.
  [[nodiscard]] ticket try_admit() {
    std::lock_guard lock(mutex_);
    ticket t = admit_locked();
    if (!t && opt_.metrics != nullptr) opt_.metrics->refused();
    return t;
  }

  //! Waits until a group may start; an empty ticket once the gate is closed.
  [[nodiscard]] ticket admit() { return admit_until(std::chrono::steady_clock::time_point::max()); }

  //! As admit, waiting at most `timeout` (empty ticket on timeout or close). A timeout counts
  //! in `staleness_metrics` as one of `timeouts`, a close as `refused`.
  template <class Rep, class Period> [[nodiscard]] ticket admit_for(std::chrono::duration<Rep, Period> timeout) {
    return admit_until(std::chrono::steady_clock::now() +
                       std::chrono::duration_cast<std::chrono::nanoseconds>(timeout));
  }

  //! The group finished generating and is handed to the buffer.
  void accept(const ticket& t);

  //! The group failed (or a filter rejected it before acceptance): its slot returns.
  void reject(const ticket& t);

  // --- consumers -----------------------------------------------------------------------------

  //! The trainer took the group.
  void consume(const ticket& t);

  //! A buffered group leaves without being trained (too stale, requeued, rejected late).
  void release(const ticket& t, release_reason why);

  // --- inspection ----------------------------------------------------------------------------

  //! Groups admissible now (may be negative: over-admitted after a recovery or a shrink).
  [[nodiscard]] index_t capacity() const {
    std::lock_guard lock(mutex_);
    return capacity_locked(clock_->current());
  }

  [[nodiscard]] gate_counts counts() const;

  //! Running tickets by (version, target), oldest first: what a consumer may still receive.
  [[nodiscard]] std::vector<version_count> running() const {
    std::lock_guard lock(mutex_);
    return listing(running_);
  }
  //! Buffered tickets by (version, target), oldest first.
  [[nodiscard]] std::vector<version_count> buffered() const {
    std::lock_guard lock(mutex_);
    return listing(buffered_);
  }

  //! Running and buffered tickets from one instant (a ticket moving between them is seen
  //! exactly once), and the version read after them (no listed ticket is newer).
  struct alive_tickets {
    std::vector<version_count> running;
    std::vector<version_count> buffered;
    policy_version version = 0;
  };
  [[nodiscard]] alive_tickets alive() const {
    std::lock_guard lock(mutex_);
    return {listing(running_), listing(buffered_), clock_->current()};
  }

  // --- lifecycle -----------------------------------------------------------------------------

  //! No more admissions: blocked producers get empty tickets. Outstanding tickets still work.
  void close() {
    {
      std::lock_guard lock(mutex_);
      closed_ = true;
    }
    cv_.notify_all();
  }
  [[nodiscard]] bool closed() const {
    std::lock_guard lock(mutex_);
    return closed_;
  }

  //! Resume after a restart at policy `version`. In-flight work died with the old process;
  //! `survivors` are the groups a restored buffer still holds (each becomes a buffered ticket,
  //! returned in the same order). AReaL's recovery rule: accepted := version·B + survivors,
  //! so admission continues at the steady-state rate instead of a burst. The gate must hold
  //! no ticket. An owned clock is set to `version`; a shared clock must already show it.
  std::vector<ticket> recover(policy_version version, std::span<const recovered_group> survivors = {});

private:
  enum class phase : std::uint8_t { running, buffered };
  struct entry {
    policy_version version = 0;
    policy_version target = -1;
    phase at = phase::running;
  };

  using key = std::pair<policy_version, policy_version>; // (version, target)

  ticket admit_until(std::chrono::steady_clock::time_point deadline);

  ticket admit_locked();

  ticket issue_locked(const entry& e) {
    const std::uint64_t id = ++next_id_;
    tickets_.emplace(id, e);
    ++admitted_;
    return {id, e.version, e.target, serial_};
  }

  [[nodiscard]] index_t capacity_locked(policy_version v) const;

  // The last step a group dispatched at v may be reserved for: v + η, capped at the last
  // version an int32 clock shows.
  [[nodiscard]] index_t window_end(policy_version v) const noexcept {
    return std::min<index_t>(static_cast<index_t>(v) + opt_.max_staleness, std::numeric_limits<policy_version>::max());
  }

  // Reservations for steps already trained can never be used again.
  void gc_targets(policy_version v) {
    while (!reserved_.empty() && reserved_.begin()->first < v) reserved_.erase(reserved_.begin());
  }

  void unreserve(const entry& e) {
    if (e.target < 0) return;
    auto it = reserved_.find(e.target);
    if (it != reserved_.end() && --it->second <= 0) reserved_.erase(it);
  }

  entry& find_locked(const ticket& t, std::string_view what);

  static void bump(std::map<key, index_t>& m, const entry& e, index_t d) {
    const key k{e.version, e.target};
    auto& c = m[k];
    c += d;
    if (c == 0) m.erase(k);
  }
  static index_t total(const std::map<key, index_t>& m) {
    index_t n = 0;
    for (const auto& [k, c] : m) n += c;
    return n;
  }
  static std::vector<version_count> listing(const std::map<key, index_t>& m) {
    std::vector<version_count> out;
    out.reserve(m.size());
    for (const auto& [k, c] : m) out.push_back({k.first, k.second, c});
    return out;
  }

  gate_options opt_;
  std::uint64_t serial_;
  std::unique_ptr<version_clock> own_clock_;
  version_clock* clock_ = nullptr;
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::unordered_map<std::uint64_t, entry> tickets_;
  std::map<key, index_t> running_;
  std::map<key, index_t> buffered_;
  std::map<policy_version, index_t> reserved_; // target mode: alive + consumed reservations per step
  index_t accepted_ = 0;
  index_t admitted_ = 0;
  index_t consumed_ = 0;
  index_t rejected_ = 0;
  index_t dropped_ = 0;
  index_t requeued_ = 0;
  std::uint64_t next_id_ = 0;
  bool closed_ = false;
  version_clock::subscription sub_; // last: unsubscribed before the rest is destroyed
};
using staleness_gate = basic_staleness_gate<>;
RLPT_EXTERN_TEMPLATE(class basic_staleness_gate<>)

RLPT_NAMESPACE_END

#if RLPT_HEADER_IMPL()
RLPT_NAMESPACE_BEGIN

RLPT_DEFER RLPT_INLINE gate_options dp_shard(gate_options o, index_t dp_size) {
  RLPT_CHECK(dp_size >= 1, errors::staleness::bad_option, "dp_size must be >= 1, got {}", dp_size);
  const index_t conc = o.max_concurrent > 0 ? o.max_concurrent : o.batch_groups;
  RLPT_CHECK(o.batch_groups % dp_size == 0 && conc % dp_size == 0, errors::staleness::dp_indivisible,
             "batch_groups {} and max_concurrent {} must both divide by dp_size {} (each shard gets an equal "
             "share of the global batch)",
             o.batch_groups, conc, dp_size);
  o.batch_groups /= dp_size;
  o.max_concurrent = conc / dp_size;
  return o;
}

namespace detail {
RLPT_DEFER RLPT_INLINE std::uint64_t next_gate_serial() {
  static std::atomic<std::uint64_t> serial{0};
  return serial.fetch_add(1, std::memory_order_relaxed) + 1;
}
} // namespace detail

template <class Tag>
RLPT_INLINE basic_staleness_gate<Tag>::basic_staleness_gate(gate_options options)
    : opt_(options), serial_(detail::next_gate_serial()) {
  RLPT_CHECK(opt_.batch_groups >= 1, errors::staleness::bad_option, "batch_groups must be >= 1, got {}",
             opt_.batch_groups);
  RLPT_CHECK(opt_.max_staleness >= 0 || opt_.max_staleness == unbounded_staleness, errors::staleness::bad_option,
             "max_staleness must be >= 0 or unbounded_staleness (-1), got {}", opt_.max_staleness);
  RLPT_CHECK(opt_.max_concurrent >= 0, errors::staleness::bad_option,
             "max_concurrent must be >= 0 (0 = batch_groups), got {}", opt_.max_concurrent);
  RLPT_CHECK(opt_.mode == admission_mode::capacity || opt_.max_staleness >= 0, errors::staleness::bad_option,
             "target-version reservation needs a finite max_staleness (the reservation window), got {}",
             opt_.max_staleness);
  // The capacity (η + v + 1)·B must be computable at every version v an int32 clock reaches.
  constexpr index_t v_max = std::numeric_limits<policy_version>::max();
  index_t cap = 0;
  RLPT_CHECK(opt_.max_staleness < 0 || !(detail::add_overflows(opt_.max_staleness, v_max + 1, cap) ||
                                         detail::mul_overflows(cap, opt_.batch_groups, cap)),
             errors::staleness::bad_option,
             "max_staleness = {} with batch_groups = {} overflows the capacity (max_staleness + version + 1) * "
             "batch_groups at version {}",
             opt_.max_staleness, opt_.batch_groups, v_max);
  if (opt_.max_concurrent == 0) opt_.max_concurrent = opt_.batch_groups;
  if (opt_.clock == nullptr) {
    own_clock_ = std::make_unique<version_clock>();
    clock_ = own_clock_.get();
  } else {
    clock_ = opt_.clock;
  }
  sub_ = clock_->subscribe([this](policy_version) {
    { std::lock_guard lock(mutex_); } // orders the wake-up after a waiter's predicate check
    cv_.notify_all();
  });
}

template <class Tag> RLPT_INLINE void basic_staleness_gate<Tag>::accept(const ticket& t) {
  {
    std::lock_guard lock(mutex_);
    entry& e = find_locked(t, "accept");
    RLPT_CHECK(e.at == phase::running, errors::staleness::bad_transition,
               "ticket {} (version {}) was already accepted; accept it once, when its group finished", t.id, t.version);
    e.at = phase::buffered;
    bump(running_, e, -1);
    bump(buffered_, e, +1);
    ++accepted_;
  }
  if (opt_.metrics != nullptr) opt_.metrics->accepted();
  cv_.notify_all();
}

template <class Tag> RLPT_INLINE void basic_staleness_gate<Tag>::reject(const ticket& t) {
  {
    std::lock_guard lock(mutex_);
    entry& e = find_locked(t, "reject");
    RLPT_CHECK(e.at == phase::running, errors::staleness::bad_transition,
               "ticket {} (version {}) was already accepted; use release(ticket, release_reason::rejected)", t.id,
               t.version);
    bump(running_, e, -1);
    unreserve(e);
    ++rejected_;
    tickets_.erase(t.id);
  }
  if (opt_.metrics != nullptr) opt_.metrics->rejected();
  cv_.notify_all();
}

template <class Tag> RLPT_INLINE void basic_staleness_gate<Tag>::consume(const ticket& t) {
  std::lock_guard lock(mutex_);
  entry& e = find_locked(t, "consume");
  RLPT_CHECK(e.at == phase::buffered, errors::staleness::bad_transition,
             "ticket {} (version {}) is still running; accept it before the trainer consumes it", t.id, t.version);
  bump(buffered_, e, -1);
  ++consumed_;
  tickets_.erase(t.id);
}

template <class Tag> RLPT_INLINE void basic_staleness_gate<Tag>::release(const ticket& t, release_reason why) {
  {
    std::lock_guard lock(mutex_);
    entry& e = find_locked(t, "release");
    RLPT_CHECK(e.at == phase::buffered, errors::staleness::bad_transition,
               "ticket {} (version {}) is still running; reject() it instead of release()", t.id, t.version);
    bump(buffered_, e, -1);
    unreserve(e);
    --accepted_;
    switch (why) {
    case release_reason::rejected:
      ++rejected_;
      break;
    case release_reason::dropped:
      ++dropped_;
      break;
    case release_reason::requeued:
      ++requeued_;
      break;
    }
    tickets_.erase(t.id);
  }
  if (opt_.metrics != nullptr) {
    if (why == release_reason::rejected) opt_.metrics->rejected();
    if (why == release_reason::dropped) opt_.metrics->dropped();
    if (why == release_reason::requeued) opt_.metrics->requeued();
  }
  cv_.notify_all();
}

template <class Tag> RLPT_INLINE gate_counts basic_staleness_gate<Tag>::counts() const {
  std::lock_guard lock(mutex_);
  gate_counts c;
  c.version = clock_->current();
  c.running = total(running_);
  c.buffered = total(buffered_);
  c.accepted = accepted_;
  c.admitted = admitted_;
  c.consumed = consumed_;
  c.rejected = rejected_;
  c.dropped = dropped_;
  c.requeued = requeued_;
  c.capacity = capacity_locked(c.version);
  c.closed = closed_;
  return c;
}

template <class Tag>
RLPT_INLINE std::vector<ticket> basic_staleness_gate<Tag>::recover(policy_version version,
                                                                   std::span<const recovered_group> survivors) {
  std::vector<ticket> out;
  out.reserve(survivors.size());
  {
    std::lock_guard lock(mutex_);
    RLPT_CHECK(tickets_.empty(), errors::staleness::restore_busy,
               "recover needs a gate without outstanding tickets; this one has {} running and {} buffered",
               total(running_), total(buffered_));
    RLPT_CHECK(version >= 0, errors::staleness::bad_version, "recovered version must be >= 0, got {}", version);
    RLPT_CHECK(own_clock_ != nullptr || clock_->current() == version, errors::staleness::restore_mismatch,
               "the shared clock shows version {}, recover was asked for {} (restore the clock first)",
               clock_->current(), version);
    for (std::size_t i = 0; i < survivors.size(); ++i) {
      const recovered_group& g = survivors[i];
      RLPT_CHECK(g.version >= 0 && g.version <= version, errors::staleness::bad_version,
                 "survivor {} has version {}, outside [0, {}]", i, g.version, version);
      RLPT_CHECK(opt_.mode == admission_mode::capacity || g.target >= g.version, errors::staleness::bad_version,
                 "survivor {} has target {} below its version {} (target mode needs the reserved step)", i, g.target,
                 g.version);
    }
    running_.clear();
    buffered_.clear();
    reserved_.clear();
    accepted_ = static_cast<index_t>(version) * opt_.batch_groups + static_cast<index_t>(survivors.size());
    for (const recovered_group& g : survivors) {
      entry e{g.version, opt_.mode == admission_mode::target ? g.target : policy_version{-1}, phase::buffered};
      const ticket t = issue_locked(e);
      bump(buffered_, e, +1);
      out.push_back(t);
    }
  }
  if (own_clock_ != nullptr) own_clock_->restore(version); // wakes waiters
  cv_.notify_all();
  return out;
}

template <class Tag>
RLPT_INLINE ticket basic_staleness_gate<Tag>::admit_until(std::chrono::steady_clock::time_point deadline) {
  std::unique_lock lock(mutex_);
  ticket t = admit_locked();
  if (t || closed_) {
    if (!t && opt_.metrics != nullptr) opt_.metrics->refused();
    return t;
  }
  const auto start = std::chrono::steady_clock::now();
  for (;;) {
    if (deadline == std::chrono::steady_clock::time_point::max()) {
      cv_.wait(lock);
    } else if (cv_.wait_until(lock, deadline) == std::cv_status::timeout) {
      t = admit_locked();
      break;
    }
    t = admit_locked();
    if (t || closed_) break;
  }
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const bool closed_for_metrics = closed_; // a polling loop's timeouts are not refusals
  lock.unlock();
  if (opt_.metrics != nullptr) {
    opt_.metrics->generation_wait(waited);
    if (!t) closed_for_metrics ? opt_.metrics->refused() : opt_.metrics->timed_out();
  }
  return t;
}

template <class Tag> RLPT_INLINE ticket basic_staleness_gate<Tag>::admit_locked() {
  if (closed_) return {};
  const policy_version v = clock_->current();
  if (capacity_locked(v) <= 0) return {};
  entry e{v, -1, phase::running};
  if (opt_.mode == admission_mode::target) {
    gc_targets(v);
    for (index_t t = v; t <= window_end(v); ++t) { // stops at the first free step: O(full steps)
      const auto tv = static_cast<policy_version>(t);
      if (reserved_[tv] < opt_.batch_groups) {
        e.target = tv;
        break;
      }
    }
    if (e.target < 0) return {}; // unreachable: capacity > 0 implies a free target
    ++reserved_[e.target];
  }
  bump(running_, e, +1);
  const ticket t = issue_locked(e);
  if (opt_.metrics != nullptr) opt_.metrics->admitted();
  return t;
}

template <class Tag> RLPT_INLINE index_t basic_staleness_gate<Tag>::capacity_locked(policy_version v) const {
  const index_t running = total(running_);
  const index_t conc = opt_.max_concurrent - running;
  if (opt_.mode == admission_mode::capacity) {
    if (opt_.max_staleness < 0) return conc;
    const index_t stale =
        (opt_.max_staleness + static_cast<index_t>(v) + 1) * opt_.batch_groups - (accepted_ + running);
    return std::min(conc, stale);
  }
  // Free slots of the steps [v, v + η]: B each, less their reservations. Only reserved steps
  // are visited, so a large η costs nothing.
  const index_t end = window_end(v);
  index_t free = (end - static_cast<index_t>(v) + 1) * opt_.batch_groups; // <= (η + 1)·B: checked on construction
  for (auto it = reserved_.lower_bound(v); it != reserved_.end() && it->first <= end; ++it)
    free -= std::min(it->second, opt_.batch_groups);
  return std::min(conc, free);
}

template <class Tag>
RLPT_INLINE typename basic_staleness_gate<Tag>::entry& basic_staleness_gate<Tag>::find_locked(const ticket& t,
                                                                                              std::string_view what) {
  RLPT_CHECK(t.issuer == serial_ && t.id != 0, errors::staleness::unknown_ticket,
             "{} got ticket {} issued by gate #{}, not by this gate (#{})", what, t.id, t.issuer, serial_);
  const auto it = tickets_.find(t.id);
  RLPT_CHECK(it != tickets_.end(), errors::staleness::unknown_ticket,
             "{} got ticket {} (version {}), which is not outstanding: it was already consumed, rejected or "
             "released, or the gate recovered since",
             what, t.id, t.version);
  return it->second;
}

RLPT_NAMESPACE_END
#endif // RLPT_HEADER_IMPL()
