// SPDX-License-Identifier: Apache-2.0
//! @file
//! Consumer-side selection over items that carry a policy version: which ready groups form
//! the next batch, which are too stale, and when the trainer must wait.
//!
//! `pick_batch` is a pure function over the ready items (in arrival order), the number
//! wanted, the current version and, for the wait policy, the items still in flight
//! (`staleness_gate::running()`). It never depends on a buffer's internals; the rollout buffer
//! adapter (staleness/buffer.hpp) and the simulator call the same code.
//!
//! Window: an item dispatched at version d is stale at version v when v − d > η
//! (TRL AsyncGRPO drops at `current − model_version > max_staleness`; verl V1 drops at
//! span = v − d + 1 > threshold). Orders: oldest first (verl V1, AReaL `create_time`, ROLL),
//! freshest first (NeMo-RL #2458), or target version (NeMo-RL: only items reserved for this
//! step). Stale items are dropped, requeued (handed back to the producers), or — policy
//! `wait` — the consumer waits for in-flight items that would otherwise age out, so that with
//! the gate's admission bound nothing is wasted (verl V1 `wait`, made exact with an
//! earliest-deadline-first feasibility check: every item has deadline d + η, each step takes
//! `wanted` items, and this step must take enough early-deadline items that all later ones
//! still fit into later steps).
//!
//! `starvation_monitor` turns "the trainer is waiting" into a reported, classified event
//! (no producers, no admission capacity, slow producers, everything stale, missing target)
//! instead of a silent stall (verl #7579).
#pragma once

#include <rlpt/config.hpp>
#include <rlpt/core/checked.hpp>
#include <rlpt/core/error.hpp>
#include <rlpt/core/format.hpp>
#include <rlpt/staleness/clock.hpp>
#include <rlpt/staleness/gate.hpp>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

RLPT_NAMESPACE_BEGIN

enum class pick_order : std::uint8_t {
  oldest_first,   //!< lowest version first, then arrival (verl V1, AReaL, ROLL)
  freshest_first, //!< highest version first, then arrival (NeMo-RL #2458 option)
  target_version  //!< only items whose reserved target is the current version (NeMo-RL)
};

enum class stale_policy : std::uint8_t {
  drop,   //!< evict stale items (TRL AsyncGRPO, verl V1 `drop`, open-instruct)
  wait,   //!< wait for in-flight items before they age out; items already stale are dropped (verl V1 `wait`)
  requeue //!< hand stale items back to the producers to regenerate (slime PR #2278)
};

struct selection_options {
  //! η, in versions; unbounded_staleness disables the window. TRL AsyncGRPO max_staleness = 4;
  //! rlpt default 0 matches the gate's default (synchronous).
  index_t max_staleness = 0;
  pick_order order = pick_order::oldest_first; //!< verl V1's order
  stale_policy on_stale = stale_policy::drop;  //!< TRL's and verl V1's default
};

//! What the selector knows about one ready item.
struct candidate {
  policy_version version = 0; //!< dispatch (head) version
  policy_version target = -1; //!< reserved step (target mode)
};

enum class stale_action : std::uint8_t { drop, requeue };

enum class pick_status : std::uint8_t {
  ready,   //!< `take` holds the batch (`wanted` items; fewer only when closed)
  waiting, //!< fewer eligible items than wanted: wait for arrivals
  urgent,  //!< policy wait: an in-flight item must be in this batch, wait for it
  drained  //!< closed and nothing eligible is left
};

[[nodiscard]] constexpr std::string_view name(pick_status s) noexcept {
  switch (s) {
  case pick_status::ready:
    return "ready";
  case pick_status::waiting:
    return "waiting";
  case pick_status::urgent:
    return "urgent";
  case pick_status::drained:
    return "drained";
  }
  return "?";
}

struct pick_result {
  std::vector<index_t> take; //!< positions into `ready`, in batch order (empty unless status ready)
  std::vector<std::pair<index_t, stale_action>> evict; //!< stale positions (apply whatever the status)
  pick_status status = pick_status::waiting;
  index_t eligible = 0;  //!< ready items usable now
  index_t must_take = 0; //!< policy wait: items this step must take to keep every deadline
  index_t pending = 0;   //!< in-flight items that can still be used (not stale, matching target)
};

//! Chooses the next batch. `pending` lists in-flight items (for stale_policy::wait and for
//! reporting); `closed` means nothing more will arrive, so a short batch is returned rather
//! than waited for.
RLPT_DEFER [[nodiscard]] pick_result pick_batch(std::span<const candidate> ready, index_t wanted,
                                                policy_version current, const selection_options& opt,
                                                std::span<const version_count> pending = {}, bool closed = false);

//! What a consumer that sees `visible` (the gate's tickets among its ready items) may still
//! receive: running tickets plus accepted ones not visible yet (finished, on their way into
//! the buffer). Pass it as `pending` to pick_batch; leaving the in-transit ones out would let
//! the wait policy miss an item that must be trained now.
RLPT_DEFER [[nodiscard]] std::vector<version_count> in_flight(const staleness_gate::alive_tickets& alive,
                                                              std::span<const candidate> visible);

// --- starvation -----------------------------------------------------------------------------

enum class starvation_cause : std::uint8_t {
  no_producers,   //!< nothing in flight although the gate has capacity: producers stopped admitting
  no_capacity,    //!< nothing in flight and the gate admits nothing (leaked tickets, batch > gate budget)
  slow_producers, //!< work is in flight but does not arrive in time
  all_stale,      //!< groups arrive but the window drops them (η too small for the generation time)
  missing_target  //!< target mode: too few groups were reserved for the current step
};

[[nodiscard]] constexpr std::string_view name(starvation_cause c) noexcept {
  switch (c) {
  case starvation_cause::no_producers:
    return "no_producers";
  case starvation_cause::no_capacity:
    return "no_capacity";
  case starvation_cause::slow_producers:
    return "slow_producers";
  case starvation_cause::all_stale:
    return "all_stale";
  case starvation_cause::missing_target:
    return "missing_target";
  }
  return "?";
}

struct starvation_report {
  starvation_cause cause = starvation_cause::slow_producers;
  double waited_s = 0.0;      //!< how long the consumer has been waiting
  policy_version version = 0; //!< current version
  index_t wanted = 0;
  index_t eligible = 0;               //!< usable ready groups
  index_t pending = 0;                //!< usable in-flight groups
  index_t dropped = 0;                //!< groups dropped as stale during this wait
  index_t capacity = 0;               //!< gate capacity at the time
  policy_version oldest_pending = -1; //!< oldest in-flight version (-1: none)
};

struct starvation_options {
  //! Report after the consumer waited this long (seconds of whatever clock the caller uses:
  //! wall time in a trainer, simulated time in the simulator). rlpt default 300 s equals TRL's
  //! producer heartbeat `heartbeat_stale_after_s`.
  double after_s = 300.0;
};

//! Tracks one consumer's waiting episodes. Call `observe` after every unsuccessful attempt and
//! `served` after every successful one; a report is produced once per episode, when the wait
//! first exceeds the threshold.
template <class = void> class basic_starvation_monitor {
public:
  explicit basic_starvation_monitor(starvation_options o = {}) : opt_(o) {
    RLPT_CHECK(opt_.after_s >= 0.0, errors::staleness::bad_option, "starvation threshold must be >= 0 s, got {}",
               opt_.after_s);
  }

  [[nodiscard]] std::optional<starvation_report> observe(double now_s, const pick_result& r, index_t wanted,
                                                         policy_version current, index_t gate_capacity,
                                                         std::span<const version_count> in_flight,
                                                         bool targeted = false);

  void served() noexcept { waiting_ = false; }
  [[nodiscard]] bool waiting() const noexcept { return waiting_; }
  [[nodiscard]] double waiting_since() const noexcept { return since_; }
  [[nodiscard]] index_t reports() const noexcept { return reports_; }

private:
  starvation_options opt_;
  bool waiting_ = false;
  bool reported_ = false;
  double since_ = 0.0;
  index_t dropped_ = 0;
  index_t reports_ = 0;
};
using starvation_monitor = basic_starvation_monitor<>;
RLPT_EXTERN_TEMPLATE(class basic_starvation_monitor<>)

RLPT_NAMESPACE_END

template <> struct fmt::formatter<rlpt::starvation_cause> : rlpt::detail::name_formatter {
  template <class Ctx> auto format(rlpt::starvation_cause c, Ctx& ctx) const { return format_name(rlpt::name(c), ctx); }
};

#if RLPT_HEADER_IMPL()
RLPT_NAMESPACE_BEGIN

namespace detail {

RLPT_DEFER RLPT_INLINE void check_candidate(const candidate& c, index_t i, policy_version current, pick_order order) {
  RLPT_CHECK(c.version >= 0 && c.version <= current, errors::staleness::future_version,
             "ready item {} has version {}, outside [0, current version {}]", i, c.version, current);
  RLPT_CHECK(order != pick_order::target_version || c.target >= c.version, errors::staleness::no_target,
             "ready item {} (version {}) has target {}; target_version selection needs every item reserved for a "
             "step >= its version (admit with admission_mode::target)",
             i, c.version, c.target);
}

} // namespace detail

RLPT_DEFER RLPT_INLINE pick_result pick_batch(std::span<const candidate> ready, index_t wanted, policy_version current,
                                              const selection_options& opt, std::span<const version_count> pending,
                                              bool closed) {
  RLPT_CHECK(wanted >= 1, errors::staleness::bad_option, "a batch needs at least 1 group, {} wanted", wanted);
  RLPT_CHECK(current >= 0, errors::staleness::bad_version, "current version must be >= 0, got {}", current);
  RLPT_CHECK(opt.max_staleness >= 0 || opt.max_staleness == unbounded_staleness, errors::staleness::bad_option,
             "max_staleness must be >= 0 or unbounded_staleness (-1), got {}", opt.max_staleness);
  const bool bounded = opt.max_staleness >= 0;
  const bool targeted = opt.order == pick_order::target_version;
  // Versions are int32, so no item is older than INT32_MAX: a larger η means the same, and the
  // deadlines version + η below then fit index_t whatever η the caller gave.
  const index_t eta = std::min<index_t>(opt.max_staleness, std::numeric_limits<policy_version>::max());
  auto stale = [&](policy_version version, policy_version target) {
    if (targeted && target < current) return true; // its step is gone
    return bounded && static_cast<index_t>(current) - static_cast<index_t>(version) > eta;
  };
  const stale_action action = opt.on_stale == stale_policy::requeue ? stale_action::requeue : stale_action::drop;

  pick_result r;
  std::vector<index_t> usable;
  usable.reserve(ready.size());
  for (std::size_t u = 0; u < ready.size(); ++u) {
    const auto i = static_cast<index_t>(u);
    const candidate& c = ready[u];
    detail::check_candidate(c, i, current, opt.order);
    if (stale(c.version, c.target))
      r.evict.emplace_back(i, action);
    else if (!targeted || c.target == current)
      usable.push_back(i);
  }
  index_t in_flight = static_cast<index_t>(ready.size()); // every deadline count below sums to at most this
  for (std::size_t k = 0; k < pending.size(); ++k) {
    const version_count& p = pending[k];
    RLPT_CHECK(p.count >= 0 && p.version <= current, errors::staleness::future_version,
               "in-flight entry {} has version {} (count {}); it needs a count >= 0 and a version <= the current {}", k,
               p.version, p.count, current);
    RLPT_CHECK(!detail::add_overflows(in_flight, p.count, in_flight), errors::staleness::bad_option,
               "in-flight counts overflow a 64-bit count at entry {} (count {})", k, p.count);
    if (!stale(p.version, p.target) && (!targeted || p.target == current)) r.pending += p.count;
  }
  r.eligible = static_cast<index_t>(usable.size());

  // Batch order: the policy's order, arrival order among equal versions.
  auto before = [&](index_t a, index_t b) {
    const policy_version va = ready[static_cast<std::size_t>(a)].version;
    const policy_version vb = ready[static_cast<std::size_t>(b)].version;
    if (va != vb) return opt.order == pick_order::freshest_first ? va > vb : va < vb;
    return a < b;
  };
  std::stable_sort(usable.begin(), usable.end(), before);

  std::vector<index_t> forced;
  if (opt.on_stale == stale_policy::wait && bounded && !targeted && !closed) {
    // Earliest deadline first: deadline = version + η. For every k >= current, the items
    // alive with deadline <= k must fit in steps current..k, so this step takes at least
    // min(wanted, alive(<= k) - (k - current)·wanted) of them.
    std::vector<std::pair<index_t, index_t>> by_deadline; // (deadline, +count)
    by_deadline.reserve(usable.size() + pending.size());
    for (const index_t i : usable)
      by_deadline.emplace_back(static_cast<index_t>(ready[static_cast<std::size_t>(i)].version) + eta, 1);
    for (const auto& p : pending)
      if (!stale(p.version, p.target) && p.count > 0)
        by_deadline.emplace_back(static_cast<index_t>(p.version) + eta, p.count);
    std::sort(by_deadline.begin(), by_deadline.end());
    std::vector<index_t> oldest = usable; // deadline order = version order
    std::stable_sort(oldest.begin(), oldest.end(), [&](index_t a, index_t b) {
      return ready[static_cast<std::size_t>(a)].version < ready[static_cast<std::size_t>(b)].version;
    });
    index_t alive = 0, need = 0;
    std::size_t have = 0; // ready items with deadline <= k (oldest is in deadline order)
    for (std::size_t j = 0; j < by_deadline.size(); ++j) {
      alive += by_deadline[j].second;
      if (j + 1 < by_deadline.size() && by_deadline[j + 1].first == by_deadline[j].first) continue;
      const index_t k = by_deadline[j].first;
      // alive <= ready + in-flight counts (checked above); (k - current)·wanted may not fit,
      // but then it exceeds alive and the bound is void.
      const index_t steps = k - static_cast<index_t>(current);
      if (steps == 0 || wanted <= alive / steps) need = std::max(need, std::min(wanted, alive - steps * wanted));
      while (have < oldest.size() &&
             static_cast<index_t>(ready[static_cast<std::size_t>(oldest[have])].version) + eta <= k)
        ++have;
      if (static_cast<index_t>(have) < need) {
        r.must_take = need;
        r.status = pick_status::urgent;
        return r;
      }
    }
    r.must_take = need;
    forced.assign(oldest.begin(), oldest.begin() + need);
  }

  if (r.eligible < wanted && !(closed && r.eligible > 0)) {
    r.status = closed ? pick_status::drained : pick_status::waiting;
    return r;
  }
  const index_t n = std::min(wanted, r.eligible);
  std::vector<std::uint8_t> chosen(ready.size(), 0);
  for (const index_t i : forced) chosen[static_cast<std::size_t>(i)] = 1;
  index_t count = static_cast<index_t>(forced.size());
  for (const index_t i : usable) {
    if (count == n) break;
    if (!chosen[static_cast<std::size_t>(i)]) {
      chosen[static_cast<std::size_t>(i)] = 1;
      ++count;
    }
  }
  for (const index_t i : usable)
    if (chosen[static_cast<std::size_t>(i)]) r.take.push_back(i);
  r.status = pick_status::ready;
  return r;
}

RLPT_DEFER RLPT_INLINE std::vector<version_count> in_flight(const staleness_gate::alive_tickets& alive,
                                                            std::span<const candidate> visible) {
  std::vector<version_count> out = alive.running;
  std::vector<candidate> seen(visible.begin(), visible.end());
  auto key = [](const candidate& c) { return std::pair{c.version, c.target}; };
  std::sort(seen.begin(), seen.end(), [&](const candidate& a, const candidate& b) { return key(a) < key(b); });
  std::size_t at = 0;
  for (version_count b : alive.buffered) { // sorted by (version, target) like `seen`
    while (at < seen.size() && key(seen[at]) < std::pair{b.version, b.target}) ++at;
    while (at < seen.size() && key(seen[at]) == std::pair{b.version, b.target} && b.count > 0) {
      --b.count;
      ++at;
    }
    if (b.count > 0) out.push_back(b);
  }
  return out;
}

template <class Tag>
RLPT_INLINE std::optional<starvation_report>
basic_starvation_monitor<Tag>::observe(double now_s, const pick_result& r, index_t wanted, policy_version current,
                                       index_t gate_capacity, std::span<const version_count> in_flight, bool targeted) {
  if (!waiting_) {
    waiting_ = true;
    since_ = now_s;
    dropped_ = 0;
    reported_ = false;
  }
  dropped_ += static_cast<index_t>(r.evict.size());
  if (reported_ || now_s - since_ < opt_.after_s) return std::nullopt;
  reported_ = true;
  starvation_report rep;
  rep.waited_s = now_s - since_;
  rep.version = current;
  rep.wanted = wanted;
  rep.eligible = r.eligible;
  rep.pending = r.pending;
  rep.dropped = dropped_;
  rep.capacity = gate_capacity;
  index_t in_flight_total = 0;
  for (const auto& p : in_flight) {
    in_flight_total += p.count;
    if (p.count > 0 && (rep.oldest_pending < 0 || p.version < rep.oldest_pending)) rep.oldest_pending = p.version;
  }
  if (targeted && r.eligible + r.pending < wanted)
    rep.cause = starvation_cause::missing_target;
  else if (in_flight_total == 0)
    rep.cause = gate_capacity > 0 ? starvation_cause::no_producers : starvation_cause::no_capacity;
  else if (dropped_ > 0)
    rep.cause = starvation_cause::all_stale;
  else
    rep.cause = starvation_cause::slow_producers;
  ++reports_;
  return rep;
}

RLPT_NAMESPACE_END
#endif // RLPT_HEADER_IMPL()
