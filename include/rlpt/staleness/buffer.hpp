// SPDX-License-Identifier: Apache-2.0
//! @file
//! staleness_buffer: a rollout_buffer whose groups carry admission tickets, selected by the
//! staleness policies. The seam is the buffer's own: a `group_selector` passed to pop, the
//! eviction callback with its reasons, `notify()` on a version publish, and per-token
//! versions in the records.
//!
//! Producers take a ticket from the gate, generate the group and push its records with the
//! ticket; the group is accepted by the gate when its last record arrives. Consumers pop
//! batches chosen by `pick_batch` (window, order, stale policy; the wait policy also sees the
//! gate's in-flight tickets); taken groups are consumed in the gate, stale ones released
//! (dropped or requeued: the buffer evicts them with reason `stale` / `requeued`), and groups
//! the buffer evicts on its own (DAPO filter, rejected, incomplete, overflow, discarded) give
//! their slot back. The gate's accounting, the buffer's accounting (inserted = consumed +
//! evicted + resident) and the metrics agree at every instant between calls.
//!
//! Lock order: buffer → adapter → gate → metrics. Selection runs under the buffer lock.
#pragma once

#include <rlpt/config.hpp>
#include <rlpt/core/error.hpp>
#include <rlpt/rollout/buffer.hpp>
#include <rlpt/rollout/record.hpp>
#include <rlpt/staleness/clock.hpp>
#include <rlpt/staleness/gate.hpp>
#include <rlpt/staleness/metrics.hpp>
#include <rlpt/staleness/partial.hpp>
#include <rlpt/staleness/selection.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <mutex>
#include <optional>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

RLPT_NAMESPACE_BEGIN

struct staleness_buffer_options {
  selection_options select{};      //!< window, order, stale policy
  starvation_options starvation{}; //!< when a waiting consumer is reported
  //! Called (on the consumer's thread) when a pop waited past the starvation threshold.
  std::function<void(const starvation_report&)> on_starvation{};
};

//! Version state to keep with a buffer checkpoint (rollout checkpoint's caller blob).
struct staleness_state {
  policy_version version = 0;
  struct group {
    std::int64_t id = 0;
    policy_version version = 0;
    policy_version target = -1;
    friend bool operator==(const group&, const group&) = default;
  };
  std::vector<group> groups; //!< dispatch version (and target) of each resident ready group
  friend bool operator==(const staleness_state&, const staleness_state&) = default;
};

//! Encodes staleness_state as bytes: "RLPTSTL1", i32 version, u64 count, count × (i64 id,
//! i32 version, i32 target), little-endian. Each group id appears at most once.
RLPT_DEFER [[nodiscard]] std::vector<std::byte> encode(const staleness_state& s);

//! Decodes encode()'s bytes; truncated or inconsistent input raises rlpt.staleness.state_corrupt.
RLPT_DEFER [[nodiscard]] staleness_state decode_staleness_state(std::span<const std::byte> in);

//! A finished partial rollout as a rollout record (tokens, logprobs, per-token versions and
//! loss mask carried over; `rewards` as the record's reward channels).
RLPT_DEFER [[nodiscard]] trajectory to_trajectory(const partial_rollout& p, std::vector<float> rewards,
                                                  std::int32_t sample_index = -1);

template <class = void> class basic_staleness_buffer {
public:
  explicit basic_staleness_buffer(staleness_gate& gate, buffer_options buffer = {}, staleness_buffer_options opt = {});
  ~basic_staleness_buffer() { sub_.reset(); }
  basic_staleness_buffer(const basic_staleness_buffer&) = delete;
  basic_staleness_buffer& operator=(const basic_staleness_buffer&) = delete;

  [[nodiscard]] rollout_buffer& buffer() noexcept { return buf_; }
  [[nodiscard]] staleness_gate& gate() noexcept { return gate_; }
  [[nodiscard]] const staleness_buffer_options& options() const noexcept { return opt_; }

  // --- producers -----------------------------------------------------------------------------

  //! Declares the group `group_id` of `expected` records for ticket `t` (ragged groups;
  //! otherwise the buffer's group_size applies). Blocks while the buffer is full.
  push_status open(const ticket& t, std::int64_t group_id, index_t expected) {
    {
      std::lock_guard lock(mutex_);
      bind_locked(t, group_id, expected);
    }
    return buf_.open_group(group_id, expected);
  }

  //! Pushes one record of the ticket's group (the record's group_id names the group; the
  //! first record binds it to the ticket). The group is accepted by the gate when its last
  //! record arrives. Returns false if the buffer is closed (the ticket is then given back).
  bool push(const ticket& t, trajectory&& record);

  //! Pushes a whole group; returns how many records went in.
  index_t push_group(const ticket& t, std::span<trajectory> records) {
    index_t n = 0;
    for (auto& r : records) {
      if (!push(t, std::move(r))) break;
      ++n;
    }
    return n;
  }

  //! The generation for ticket `t` failed: its group (if any record arrived) is evicted as
  //! incomplete and the ticket's slot returns. An error if the group already completed.
  void fail(const ticket& t);

  // --- consumers -----------------------------------------------------------------------------

  //! Takes a batch of `groups` (0 = the gate's batch_groups), waiting as long as it takes.
  //! Starvation is reported (callback, metrics) while it waits. After close, what is left.
  [[nodiscard]] rollout_batch pop(index_t groups = 0) {
    return *pop_until(groups, std::chrono::steady_clock::time_point::max());
  }

  //! As pop, waiting at most `timeout`; nullopt if no batch formed in time.
  template <class Rep, class Period>
  [[nodiscard]] std::optional<rollout_batch> pop_for(index_t groups, std::chrono::duration<Rep, Period> timeout) {
    return pop_until(groups, std::chrono::steady_clock::now() +
                                 std::chrono::duration_cast<std::chrono::steady_clock::duration>(timeout));
  }

  //! As pop, without waiting.
  [[nodiscard]] std::optional<rollout_batch> try_pop(index_t groups = 0) {
    const index_t want = groups > 0 ? groups : gate_.options().batch_groups;
    pick_result last;
    staleness_histogram ages;
    auto b = buf_.try_pop(want, selector(last, ages));
    if (b && !b->empty()) finish_batch(ages);
    return b;
  }

  //! Publishes the next policy version (after the weight sync) and wakes waiting consumers.
  policy_version publish() { return gate_.publish(); }

  //! Closes admission and the buffer: producers stop, consumers drain what is left.
  void close() {
    gate_.close();
    buf_.close();
  }

  //! Starvation reports so far.
  [[nodiscard]] index_t starvations() const {
    std::lock_guard lock(mutex_);
    return monitor_.reports();
  }

  // --- checkpoint ----------------------------------------------------------------------------

  //! Version and the dispatch version of every ready group. Take it together with
  //! buffer().snapshot() between steps (no concurrent pops) for an exact pair.
  [[nodiscard]] staleness_state state() const;

  //! Restores a fresh adapter (nothing pushed, gate without tickets): loads the buffer state,
  //! evicts groups that were still open (their producers are gone), and recovers the gate at
  //! `vs.version` with the ready groups as survivors (AReaL's recovery rule). Ready groups
  //! missing from `vs` fall back to their oldest token version. Everything is checked before
  //! anything changes: a refused restore leaves the buffer and the gate as they were.
  void restore(buffer_state bs, const staleness_state& vs);

private:
  struct slot {
    ticket t;
    index_t expected = 0;
    index_t arrived = 0;
    bool accepted = false;
  };

  buffer_options with_hook(buffer_options b) {
    b.on_evict = [this](evicted_group&& g) { on_evict(std::move(g)); };
    return b;
  }

  slot& bind_locked(const ticket& t, std::int64_t gid, index_t expected);

  // A record did not make it into the buffer: the group cannot complete.
  void give_back(const ticket& t, std::int64_t gid) {
    if (buf_.abort_group(gid)) return; // the eviction hook settles the ticket
    std::lock_guard lock(mutex_);
    const auto it = groups_.find(gid);
    if (it == groups_.end() || !(it->second.t == t)) return;
    settle_locked(it, release_reason::rejected);
  }

  // Returns the slot of a group leaving unconsumed (lock held).
  void settle_locked(typename std::unordered_map<std::int64_t, slot>::iterator it, release_reason why) {
    if (it->second.accepted)
      gate_.release(it->second.t, why);
    else
      gate_.reject(it->second.t);
    by_ticket_.erase(it->second.t.id);
    groups_.erase(it);
  }

  void on_evict(evicted_group&& g);

  // The selector runs on the consumer's thread under the buffer lock; `last` and `ages` are
  // that consumer's locals.
  group_selector selector(pick_result& last, staleness_histogram& ages);

  std::optional<rollout_batch> pop_until(index_t groups, std::chrono::steady_clock::time_point deadline);

  void finish_batch(const staleness_histogram& ages) {
    if (gate_.options().metrics != nullptr) gate_.options().metrics->consumed(ages);
  }

  staleness_gate& gate_;
  staleness_buffer_options opt_;
  std::function<void(evicted_group&&)> user_evict_;
  mutable std::mutex mutex_;
  std::unordered_map<std::int64_t, slot> groups_;             // group id -> its ticket and arrival count
  std::unordered_map<std::uint64_t, std::int64_t> by_ticket_; // ticket id -> group id
  rollout_buffer buf_;
  starvation_monitor monitor_;
  version_clock::subscription sub_;
};
using staleness_buffer = basic_staleness_buffer<>;
RLPT_EXTERN_TEMPLATE(class basic_staleness_buffer<>)

RLPT_NAMESPACE_END

#if RLPT_HEADER_IMPL()
RLPT_NAMESPACE_BEGIN

RLPT_DEFER RLPT_INLINE std::vector<std::byte> encode(const staleness_state& s) {
  std::vector<std::byte> out;
  auto put = [&](const auto& v) {
    const auto* p = reinterpret_cast<const std::byte*>(&v);
    out.insert(out.end(), p, p + sizeof(v));
  };
  const char magic[8] = {'R', 'L', 'P', 'T', 'S', 'T', 'L', '1'};
  for (const char c : magic) put(c);
  put(s.version);
  put(static_cast<std::uint64_t>(s.groups.size()));
  for (const auto& g : s.groups) {
    put(g.id);
    put(g.version);
    put(g.target);
  }
  return out;
}

RLPT_DEFER RLPT_INLINE staleness_state decode_staleness_state(std::span<const std::byte> in) {
  std::size_t at = 0;
  auto get = [&](auto& v, const char* what) {
    RLPT_CHECK(in.size() - at >= sizeof(v), errors::staleness::state_corrupt,
               "staleness state is truncated: {} needs {} bytes at offset {}, {} remain", what, sizeof(v), at,
               in.size() - at);
    std::memcpy(&v, in.data() + at, sizeof(v));
    at += sizeof(v);
  };
  char magic[8];
  for (char& c : magic) get(c, "magic");
  RLPT_CHECK(std::memcmp(magic, "RLPTSTL1", 8) == 0, errors::staleness::state_corrupt,
             "staleness state has a bad magic (expected RLPTSTL1)");
  staleness_state s;
  get(s.version, "version");
  RLPT_CHECK(s.version >= 0, errors::staleness::state_corrupt, "staleness state has version {}", s.version);
  std::uint64_t n = 0;
  get(n, "group count");
  RLPT_CHECK(n <= (in.size() - at) / 16, errors::staleness::state_corrupt,
             "staleness state claims {} groups but only {} bytes remain", n, in.size() - at);
  s.groups.resize(static_cast<std::size_t>(n));
  for (auto& g : s.groups) {
    get(g.id, "group id");
    get(g.version, "group version");
    get(g.target, "group target");
    RLPT_CHECK(g.version >= 0 && g.version <= s.version && g.target >= -1, errors::staleness::state_corrupt,
               "staleness state group {} has version {} / target {} (current version {})", g.id, g.version, g.target,
               s.version);
  }
  // A group listed twice would be ambiguous (which dispatch version does it keep?).
  std::vector<std::int64_t> ids(s.groups.size());
  for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = s.groups[i].id;
  std::sort(ids.begin(), ids.end());
  const auto twice = std::adjacent_find(ids.begin(), ids.end());
  RLPT_CHECK(twice == ids.end(), errors::staleness::state_corrupt, "staleness state lists group {} more than once",
             twice == ids.end() ? std::int64_t{0} : *twice);
  RLPT_CHECK(at == in.size(), errors::staleness::state_corrupt, "staleness state has {} trailing bytes",
             in.size() - at);
  return s;
}

RLPT_DEFER RLPT_INLINE trajectory to_trajectory(const partial_rollout& p, std::vector<float> rewards,
                                                std::int32_t sample_index) {
  trajectory t;
  t.group_id = p.group_id();
  t.sample_index = sample_index;
  t.prompt_len = p.prompt_len();
  t.tokens.assign(p.tokens().begin(), p.tokens().end());
  t.loss_mask.assign(p.loss_mask().begin(), p.loss_mask().end());
  t.logprobs.assign(p.logprobs().begin(), p.logprobs().end());
  t.versions.assign(p.versions().begin(), p.versions().end());
  t.rewards = std::move(rewards);
  if (p.prompt_len() > 0) t.segments.push_back({0, p.prompt_len(), token_source::prompt, 0});
  if (p.generated() > 0) t.segments.push_back({p.prompt_len(), p.size(), token_source::model, 0});
  return t;
}

template <class Tag>
RLPT_INLINE basic_staleness_buffer<Tag>::basic_staleness_buffer(staleness_gate& gate, buffer_options buffer,
                                                                staleness_buffer_options opt)
    : gate_(gate), opt_(std::move(opt)), user_evict_(std::move(buffer.on_evict)), buf_(with_hook(std::move(buffer))),
      monitor_(opt_.starvation) {
  RLPT_CHECK(opt_.select.order != pick_order::target_version || gate_.options().mode == admission_mode::target,
             errors::staleness::bad_option,
             "target_version selection needs a gate in admission_mode::target (tickets carry the reserved step)");
  sub_ = gate_.clock().subscribe([this](policy_version) { buf_.notify(); });
}

template <class Tag> RLPT_INLINE bool basic_staleness_buffer<Tag>::push(const ticket& t, trajectory&& record) {
  validate(record, buf_.options().schema); // before accepting: a bad record never takes a slot
  {
    std::lock_guard lock(mutex_);
    slot& s = bind_locked(t, record.group_id, -1);
    RLPT_CHECK(s.arrived < s.expected, errors::staleness::bad_group,
               "group {} (ticket {}) already received its {} records", record.group_id, t.id, s.expected);
    ++s.arrived;
    if (s.arrived == s.expected) {
      gate_.accept(t);
      s.accepted = true;
    }
  }
  const std::int64_t gid = record.group_id;
  bool in = false;
  try {
    in = buf_.push(std::move(record));
  } catch (...) {
    give_back(t, gid);
    throw;
  }
  if (!in) give_back(t, gid);
  return in;
}

template <class Tag> RLPT_INLINE void basic_staleness_buffer<Tag>::fail(const ticket& t) {
  std::optional<std::int64_t> gid;
  {
    std::lock_guard lock(mutex_);
    const auto it = by_ticket_.find(t.id);
    if (it != by_ticket_.end()) gid = it->second;
  }
  if (!gid) {
    gate_.reject(t); // nothing pushed yet
    buf_.notify();
    return;
  }
  if (!buf_.abort_group(*gid)) {
    // Not open: either already evicted (hook handled it) or complete and ready.
    std::lock_guard lock(mutex_);
    RLPT_CHECK(groups_.find(*gid) == groups_.end(), errors::staleness::bad_transition,
               "fail(ticket {}): group {} already completed; a finished group is released by the consumer side", t.id,
               *gid);
  }
  buf_.notify();
}

template <class Tag> RLPT_INLINE staleness_state basic_staleness_buffer<Tag>::state() const {
  staleness_state s;
  s.version = gate_.version();
  std::lock_guard lock(mutex_);
  for (const auto& [id, g] : groups_)
    if (g.accepted) s.groups.push_back({id, g.t.version, g.t.target});
  std::sort(s.groups.begin(), s.groups.end(),
            [](const staleness_state::group& a, const staleness_state::group& b) { return a.id < b.id; });
  return s;
}

template <class Tag> RLPT_INLINE void basic_staleness_buffer<Tag>::restore(buffer_state bs, const staleness_state& vs) {
  const gate_counts gc = gate_.counts();
  RLPT_CHECK(gc.running == 0 && gc.buffered == 0, errors::staleness::restore_busy,
             "restore needs a gate without outstanding tickets; this one has {} running and {} buffered", gc.running,
             gc.buffered);
  RLPT_CHECK(vs.version >= 0, errors::staleness::bad_version, "recovered version must be >= 0, got {}", vs.version);
  RLPT_CHECK(gate_.options().clock == nullptr || gate_.clock().current() == vs.version,
             errors::staleness::restore_mismatch,
             "the shared clock shows version {}, the checkpoint was taken at {} (restore the clock first)",
             gate_.clock().current(), vs.version);
  // Survivors: the ready groups (open ones are evicted below), with the version each was
  // dispatched at. Checked here with the gate's rules, so that recover() cannot refuse them
  // after the buffer was loaded.
  std::unordered_map<std::int64_t, const staleness_state::group*> known;
  for (const auto& g : vs.groups) known.emplace(g.id, &g);
  std::vector<recovered_group> survivors;
  std::vector<std::pair<std::int64_t, index_t>> ids;
  const bool target_mode = gate_.options().mode == admission_mode::target;
  for (const auto& g : bs.ready) {
    recovered_group r;
    const auto it = known.find(g.info.id);
    if (it != known.end()) {
      r.version = it->second->version;
      r.target = it->second->target;
    } else {
      r.version = g.info.head_version >= 0 ? g.info.head_version : vs.version;
      r.target = target_mode ? vs.version : -1;
    }
    RLPT_CHECK(r.version >= 0 && r.version <= vs.version, errors::staleness::bad_version,
               "ready group {} was dispatched at version {}, outside [0, {}] (the checkpoint's version)", g.info.id,
               r.version, vs.version);
    RLPT_CHECK(!target_mode || r.target >= r.version, errors::staleness::bad_version,
               "ready group {} has target {} below its version {} (target mode needs the reserved step)", g.info.id,
               r.target, r.version);
    survivors.push_back(r);
    ids.emplace_back(g.info.id, g.info.samples);
  }
  buf_.restore(std::move(bs)); // validates the buffer state; throws before changing anything
  buf_.evict_incomplete();
  const std::vector<ticket> tickets = gate_.recover(vs.version, survivors);
  std::lock_guard lock(mutex_);
  groups_.clear();
  by_ticket_.clear();
  for (std::size_t i = 0; i < tickets.size(); ++i) {
    groups_[ids[i].first] = slot{tickets[i], ids[i].second, ids[i].second, true};
    by_ticket_[tickets[i].id] = ids[i].first;
  }
}

template <class Tag>
RLPT_INLINE typename basic_staleness_buffer<Tag>::slot&
basic_staleness_buffer<Tag>::bind_locked(const ticket& t, std::int64_t gid, index_t expected) {
  RLPT_CHECK(static_cast<bool>(t), errors::staleness::unknown_ticket,
             "group {} was pushed with an empty ticket (admission was refused)", gid);
  auto it = groups_.find(gid);
  if (it == groups_.end()) {
    RLPT_CHECK(by_ticket_.find(t.id) == by_ticket_.end(), errors::staleness::ticket_mismatch,
               "ticket {} already carries group {}; group {} needs its own ticket", t.id, by_ticket_[t.id], gid);
    const index_t n = expected > 0 ? expected : buf_.options().group_size;
    it = groups_.emplace(gid, slot{t, n, 0, false}).first;
    by_ticket_.emplace(t.id, gid);
    return it->second;
  }
  RLPT_CHECK(it->second.t == t, errors::staleness::ticket_mismatch,
             "group {} belongs to ticket {} (version {}), got ticket {} (version {})", gid, it->second.t.id,
             it->second.t.version, t.id, t.version);
  RLPT_CHECK(expected < 0 || expected == it->second.expected || it->second.arrived == 0, errors::staleness::bad_group,
             "group {} was declared with {} records, now {}", gid, it->second.expected, expected);
  if (expected > 0) it->second.expected = expected;
  return it->second;
}

template <class Tag> RLPT_INLINE void basic_staleness_buffer<Tag>::on_evict(evicted_group&& g) {
  {
    std::lock_guard lock(mutex_);
    const auto it = groups_.find(g.info.id);
    if (it != groups_.end()) {
      release_reason why = release_reason::rejected;
      if (g.reason == evict_reason::overflow || g.reason == evict_reason::discarded || g.reason == evict_reason::stale)
        why = release_reason::dropped;
      if (g.reason == evict_reason::requeued) why = release_reason::requeued;
      settle_locked(it, why);
    }
  }
  if (user_evict_) user_evict_(std::move(g));
}

template <class Tag>
RLPT_INLINE group_selector basic_staleness_buffer<Tag>::selector(pick_result& last, staleness_histogram& ages) {
  return [this, &last, &ages](std::span<const group_info> ready, index_t wanted, bool closed, selection& out) {
    std::lock_guard lock(mutex_);
    // Tickets first, then the version: nothing listed is newer than `now`.
    const staleness_gate::alive_tickets alive = gate_.alive();
    const policy_version now = alive.version;
    std::vector<candidate> cands, tracked;
    cands.reserve(ready.size());
    for (const auto& info : ready) {
      const auto it = groups_.find(info.id);
      candidate c;
      if (it != groups_.end()) {
        c = {it->second.t.version, it->second.t.target};
        tracked.push_back(c);
      } else {
        // Untracked (pushed around the adapter): its oldest token; never stale without one.
        c.version = info.head_version >= 0 ? std::min(info.head_version, now) : now;
        c.target = now;
      }
      cands.push_back(c);
    }
    const std::vector<version_count> pending = in_flight(alive, tracked);
    last = pick_batch(cands, wanted, now, opt_.select, pending, closed);
    for (const auto& [pos, act] : last.evict) {
      out.evict.emplace_back(pos, act == stale_action::requeue ? evict_reason::requeued : evict_reason::stale);
      const auto it = groups_.find(ready[static_cast<std::size_t>(pos)].id);
      if (it != groups_.end())
        settle_locked(it, act == stale_action::requeue ? release_reason::requeued : release_reason::dropped);
    }
    if (last.status == pick_status::ready) {
      // The buffer takes exactly this selection (it is complete), so the tickets are consumed now.
      out.take = last.take;
      for (const index_t pos : last.take) {
        const auto it = groups_.find(ready[static_cast<std::size_t>(pos)].id);
        if (it == groups_.end()) continue;
        gate_.consume(it->second.t);
        by_ticket_.erase(it->second.t.id);
        groups_.erase(it);
      }
    }
    ages = {};
    if (last.status == pick_status::ready)
      for (const index_t pos : last.take)
        ages.add(static_cast<index_t>(now) - static_cast<index_t>(cands[static_cast<std::size_t>(pos)].version));
  };
}

template <class Tag>
RLPT_INLINE std::optional<rollout_batch>
basic_staleness_buffer<Tag>::pop_until(index_t groups, std::chrono::steady_clock::time_point deadline) {
  const index_t want = groups > 0 ? groups : gate_.options().batch_groups;
  const auto start = std::chrono::steady_clock::now();
  const auto poll = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(std::max(opt_.starvation.after_s, 1e-3)));
  pick_result last;
  staleness_histogram ages;
  std::optional<rollout_batch> b;
  for (;;) {
    const auto now = std::chrono::steady_clock::now();
    auto until = deadline;
    if (deadline - now > poll) until = now + poll;
    b = buf_.pop_for(want, until - now, selector(last, ages));
    if (b) break;
    const auto after = std::chrono::steady_clock::now();
    if (after >= deadline) break;
    std::optional<starvation_report> rep;
    {
      const policy_version v = gate_.version();
      const index_t cap = gate_.capacity();
      const std::vector<version_count> running = gate_.running();
      std::lock_guard lock(mutex_);
      rep = monitor_.observe(std::chrono::duration<double>(after - start).count(), last, want, v, cap, running,
                             opt_.select.order == pick_order::target_version);
    }
    if (rep) {
      if (gate_.options().metrics != nullptr) gate_.options().metrics->starved();
      if (opt_.on_starvation) opt_.on_starvation(*rep);
    }
  }
  {
    std::lock_guard lock(mutex_);
    monitor_.served();
  }
  if (gate_.options().metrics != nullptr)
    gate_.options().metrics->train_wait(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  if (b && !b->empty()) finish_batch(ages);
  return b;
}

RLPT_NAMESPACE_END
#endif // RLPT_HEADER_IMPL()
