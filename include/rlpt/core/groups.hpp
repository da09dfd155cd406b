// SPDX-License-Identifier: Apache-2.0
//! @file
//! Explicit group descriptions: which sequences answer the same prompt.
//!
//! Groups are never "n consecutive rows". They come from a group id per sequence (any order,
//! ragged sizes) or from offsets over contiguous groups, and are stored as CSR: group g owns
//! members()[offsets()[g], offsets()[g+1]), in ascending sequence order. The fixed member
//! order fixes every per-group reduction order, so results do not depend on thread count.
//!
//! A groups object owns its arrays; the views it returns (members, offsets, group_of) borrow
//! them, so they cannot be taken from a temporary groups object (that does not compile).
//!
//! Contiguous groups (from_offsets, uniform, and from_ids whose ids come in runs, each run a new
//! group) write `members` (0, 1, ..., n - 1) and `group_of` only when first asked for them: the
//! estimators walk contiguous groups by their offsets, and at 65,536 sequences those two arrays
//! were a megabyte of stores in every step's call. The first call of members() or group_of()
//! fills them once (any number of threads may ask at once: one fills, the others wait for it);
//! the views stay valid, as before, while the groups object lives.
#pragma once

#include <rlpt/config.hpp>
#include <rlpt/core/checked.hpp>
#include <rlpt/core/error.hpp>
#include <rlpt/core/views.hpp>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <new>
#include <span>
#include <utility>
#include <vector>

RLPT_NAMESPACE_BEGIN

namespace detail {

//! Runs of equal adjacent ids in id[0..n), n >= 1: n minus the equal adjacent pairs. GCC leaves
//! the plain loop scalar on the x86-64 baseline (SSE2 has no 64-bit compare); two ids at a time
//! compared as 32-bit halves (equal where both halves are) take 4 % off a cold GRPO call at
//! 65,536 sequences. The int32 lane sums are flushed before they could overflow.
inline index_t count_runs(const std::int64_t* id, index_t n) noexcept {
  index_t equal = 0, i = 1;
#if (defined(__GNUC__) || defined(__clang__)) && !defined(__CUDACC__)
  typedef std::int32_t halves __attribute__((vector_size(16))); // NOLINT(modernize-use-using)
  while (n - i >= 2) {
    const index_t stop = i + std::min<index_t>((n - i) & ~index_t{1}, index_t{1} << 24);
    halves same = {}; // -1 in both lanes of each equal pair
    for (; i < stop; i += 2) {
      halves a, b;
      std::memcpy(&a, id + i, sizeof a);
      std::memcpy(&b, id + i - 1, sizeof b);
      const halves eq = a == b;
      same += eq & __builtin_shufflevector(eq, eq, 1, 0, 3, 2);
    }
    equal -= (index_t{same[0]} + same[1] + same[2] + same[3]) / 2;
  }
#endif
  for (; i < n; ++i) equal += id[i] == id[i - 1] ? 1 : 0;
  return n - equal;
}

} // namespace detail

class groups {
public:
  //! Most sequences groups built from offsets or a uniform size describe (they allocate one
  //! entry per sequence; from_ids is bounded by its input).
  static constexpr index_t max_items = (index_t{1} << 31) - 1;

  groups() = default;
  //! A copy holds every array: the source fills its lazy ones first.
  groups(const groups& o) { copy_from(o); }
  groups& operator=(const groups& o) {
    if (this != &o) copy_from(o);
    return *this;
  }
  groups(groups&& o) noexcept { move_from(o); }
  groups& operator=(groups&& o) noexcept {
    if (this != &o) move_from(o);
    return *this;
  }
  ~groups() = default;

  //! One group id per sequence (any int64); groups are numbered in order of first appearance.
  //!
  //! One pass over the runs of equal adjacent ids (the members of a group usually sit together):
  //! each run looks its id up once in a flat open-addressing table sized to a power of two at
  //! least twice the number of runs (so at most half full), counts its members and writes their
  //! group numbers. When every run starts a new group the groups are contiguous and in order,
  //! and the members are 0, 1, ..., n - 1; otherwise one scatter places them, ascending.
  [[nodiscard]] static groups from_ids(view<const std::int64_t> ids) {
    groups g;
    const std::int64_t* id = ids.data();
    const index_t n = ids.size();
    if (n == 0) return g;
    const index_t runs = detail::count_runs(id, n);
    if (static_cast<std::uint64_t>(runs) < std::numeric_limits<std::uint32_t>::max())
      g.number_runs<std::uint32_t>(id, n, runs);
    else
      g.number_runs<std::uint64_t>(id, n, runs);
    return g;
  }

  //! Contiguous groups: group g is sequences [offsets[g], offsets[g+1]). Empty groups are errors.
  [[nodiscard]] static groups from_offsets(view<const index_t> offsets) {
    RLPT_CHECK(!offsets.empty() && offsets[0] == 0, errors::groups::bad_offsets,
               "group offsets must have G + 1 entries starting at 0 (got {} entries, first {})", offsets.size(),
               offsets.empty() ? index_t{-1} : offsets[0]);
    detail::check_offsets(errors::groups::bad_offsets, "offsets", "group", offsets, true);
    RLPT_CHECK(offsets[offsets.size() - 1] <= max_items, errors::groups::bad_offsets,
               "group offsets end at {} sequences (offsets[{}]), more than groups describe (at most {})",
               offsets[offsets.size() - 1], offsets.size() - 1, max_items);
    groups g;
    const index_t num = offsets.size() - 1, n = offsets[num];
    g.allocate(n, num);
    index_t* const offs = g.store_.data() + g.offsets_at_;
    index_t* const known = g.store_.data() + g.ids_at_;
    for (index_t k = 0; k <= num; ++k) offs[k] = offsets[k];
    for (index_t k = 0; k < num; ++k) known[k] = k;
    g.num_groups_ = num;
    g.state_.store(lazy, std::memory_order_relaxed); // members and group_of: on first use
    return g;
  }

  //! n sequences in consecutive groups of `size` (the common fixed-n rollout shape).
  [[nodiscard]] static groups uniform(index_t n, index_t size) {
    RLPT_CHECK(size >= 1 && n >= 0 && n % size == 0, errors::groups::bad_size,
               "{} sequences cannot be split into groups of {}", n, size);
    RLPT_CHECK(n <= max_items, errors::groups::bad_size, "{} sequences are more than groups describe (at most {})", n,
               max_items);
    std::vector<index_t> offsets(static_cast<std::size_t>(n / size + 1));
    for (std::size_t k = 0; k < offsets.size(); ++k) offsets[k] = static_cast<index_t>(k) * size;
    return from_offsets(offsets);
  }

  [[nodiscard]] index_t num_groups() const noexcept { return num_groups_; }
  [[nodiscard]] index_t num_items() const noexcept { return num_items_; }
  //! Every group is a run of consecutive sequences, in order: members() is 0, 1, ..., n - 1 and
  //! group g is sequences [offsets()[g], offsets()[g + 1]).
  [[nodiscard]] bool contiguous() const noexcept { return contiguous_; }
  [[nodiscard]] index_t size(index_t g) const noexcept { return offsets_ptr()[g + 1] - offsets_ptr()[g]; }
  //! Sequence indices of group g, ascending.
  [[nodiscard]] view<const index_t> members(index_t g) const& noexcept {
    fill_lazy();
    return stored(store_.data() + offsets_ptr()[g], size(g));
  }
  [[nodiscard]] index_t group_of(index_t item) const noexcept {
    fill_lazy();
    return store_.data()[num_items_ + item];
  }
  //! The caller's id of group g (its position for from_offsets/uniform).
  [[nodiscard]] std::int64_t id(index_t g) const noexcept { return store_.data()[ids_at_ + g]; }

  //! CSR arrays, e.g. to copy to a device: offsets (G + 1), members (N), group_of (N).
  [[nodiscard]] view<const index_t> offsets() const& noexcept { return stored(offsets_ptr(), num_groups_ + 1); }
  [[nodiscard]] view<const index_t> members() const& noexcept {
    fill_lazy();
    return stored(store_.data(), num_items_);
  }
  [[nodiscard]] view<const index_t> group_of() const& noexcept {
    fill_lazy();
    return stored(store_.data() + num_items_, num_items_);
  }

  // Views into a temporary groups object would dangle: keep the groups in a variable.
  view<const index_t> members(index_t g) const&& = delete;
  view<const index_t> offsets() const&& = delete;
  view<const index_t> members() const&& = delete;
  view<const index_t> group_of() const&& = delete;

  //! Validates that a per-sequence array covers exactly these groups' items.
  void expect_items(std::string_view what, index_t n) const {
    detail::expect_size(what, n, num_items(), "one per sequence in the groups");
  }

private:
  //! std::allocator whose value-initialisation does nothing: every slot is written before it is
  //! read, so the storage is not zeroed first.
  template <class T> struct uninitialized_allocator : std::allocator<T> {
    template <class U> struct rebind { using other = uninitialized_allocator<U>; };
    template <class U> void construct(U* p) noexcept { ::new (static_cast<void*>(p)) U; }
    template <class U, class... A> void construct(U* p, A&&... a) {
      ::new (static_cast<void*>(p)) U(std::forward<A>(a)...);
    }
  };

  //! One allocation for every array: members (n), group_of (n), offsets (G + 1), ids (G), where
  //! G is at most `max_groups` (from_ids knows only a bound before it is done).
  void allocate(index_t n, index_t max_groups) {
    num_items_ = n;
    offsets_at_ = 2 * n;
    ids_at_ = offsets_at_ + max_groups + 1;
    store_.resize(static_cast<std::size_t>(ids_at_ + max_groups));
  }

  [[nodiscard]] const index_t* offsets_ptr() const noexcept { return store_.data() + offsets_at_; }

  // state_: whether members and group_of are written yet (contiguous groups write them on first use).
  static constexpr std::uint8_t ready = 0, lazy = 1, filling = 2;

  //! Writes members (0, 1, ..., n - 1) and group_of of contiguous groups once; a thread that
  //! finds another one writing waits until it is done.
  void fill_lazy() const noexcept {
    std::uint8_t s = state_.load(std::memory_order_acquire);
    if (s == ready) [[likely]]
      return;
    if (s == lazy && state_.compare_exchange_strong(s, filling, std::memory_order_acquire)) {
      index_t* const members = store_.data();
      index_t* const group_of = members + num_items_;
      const index_t* const offs = offsets_ptr();
      for (index_t i = 0; i < num_items_; ++i) members[i] = i;
      for (index_t k = 0; k < num_groups_; ++k)
        for (index_t i = offs[k]; i < offs[k + 1]; ++i) group_of[i] = k;
      state_.store(ready, std::memory_order_release);
      state_.notify_all();
      return;
    }
    while (s != ready) {
      state_.wait(s, std::memory_order_acquire);
      s = state_.load(std::memory_order_acquire);
    }
  }

  void copy_from(const groups& o) {
    o.fill_lazy();
    store_ = o.store_;
    copy_shape(o);
    state_.store(ready, std::memory_order_relaxed);
  }
  // A moved-from object is never used concurrently: its state moves with its arrays.
  void move_from(groups& o) noexcept {
    store_ = std::move(o.store_);
    copy_shape(o);
    state_.store(o.state_.load(std::memory_order_acquire), std::memory_order_relaxed);
    o.store_ = {0};
    o.num_items_ = o.num_groups_ = o.offsets_at_ = 0;
    o.ids_at_ = 1;
    o.contiguous_ = true;
    o.state_.store(ready, std::memory_order_relaxed);
  }
  void copy_shape(const groups& o) noexcept {
    num_items_ = o.num_items_;
    num_groups_ = o.num_groups_;
    contiguous_ = o.contiguous_;
    offsets_at_ = o.offsets_at_;
    ids_at_ = o.ids_at_;
  }

  //! A view of `n` stored entries. Every size here comes from the validated store and is never
  //! negative, so the view is built through std::span, without view's (throwing) size check:
  //! the accessors above are noexcept in fact, not only in name.
  [[nodiscard]] static view<const index_t> stored(const index_t* p, index_t n) noexcept {
    return std::span<const index_t>(p, static_cast<std::size_t>(n));
  }

  //! Fibonacci hashing of an id into a table of 2^bits slots (the top bits of a multiplicative hash).
  static std::size_t slot_of(std::int64_t id, int bits) noexcept {
    return static_cast<std::size_t>((static_cast<std::uint64_t>(id) * 0x9e3779b97f4a7c15ull) >> (64 - bits));
  }

  //! from_ids after the runs are counted. Slot holds group number + 1 (0 = empty); it is wide
  //! enough for `runs` groups, the most there can be.
  template <class Slot> void number_runs(const std::int64_t* id, index_t n, index_t runs) {
    int bits = 4;
    while ((std::uint64_t{1} << bits) < 2 * static_cast<std::uint64_t>(runs)) ++bits;
    const std::size_t wrap = (std::size_t{1} << bits) - 1;
    std::vector<Slot> table(wrap + 1, Slot{0});
    allocate(n, runs);
    index_t* const members = store_.data();
    index_t* const group_of = members + n;
    index_t* const offsets = store_.data() + offsets_at_;
    std::int64_t* const known = store_.data() + ids_at_;
    index_t num = 0;
    offsets[0] = 0;
    const auto run_end = [&](index_t i) {
      index_t end = i + 1;
      while (end < n && id[end] == id[i]) ++end;
      return end;
    };
    // The slot of x, and its group number + 1 there (0: x is new, and the slot is free for it).
    const auto find = [&](std::int64_t x, std::size_t& h) {
      h = slot_of(x, bits);
      Slot t = table[h];
      while (t != 0 && known[t - 1] != x) {
        h = (h + 1) & wrap;
        t = table[h];
      }
      return t;
    };
    // Numbers x as the next group in its free slot h; returns the group count, its number + 1.
    const auto insert = [&](std::int64_t x, std::size_t h) {
      known[num] = x;
      table[h] = static_cast<Slot>(++num);
      return num;
    };
    // While every run starts a new group (the common case: contiguous groups), offsets[k + 1] is
    // group k's end, and nothing else is written.
    index_t i = 0;
    for (; i < n;) {
      const std::int64_t x = id[i];
      const index_t end = run_end(i);
      std::size_t h = 0;
      if (find(x, h) != 0) break;
      offsets[insert(x, h)] = end;
      i = end;
    }
    const bool in_order = i == n;
    if (!in_order) { // a group seen again at run i: member counts, and group_of of the runs before it
      for (index_t k = 0, j = 0; k < num; ++k)
        for (const index_t stop = offsets[k + 1]; j < stop; ++j) group_of[j] = k;
      for (index_t k = num; k >= 1; --k) offsets[k] -= offsets[k - 1];
      for (; i < n;) {
        const std::int64_t x = id[i];
        const index_t end = run_end(i);
        std::size_t h = 0;
        const Slot t = find(x, h);
        index_t k = static_cast<index_t>(t) - 1;
        if (t == 0) {
          k = num;
          offsets[insert(x, h)] = 0;
        }
        offsets[k + 1] += end - i;
        for (index_t j = i; j < end; ++j) group_of[j] = k;
        i = end;
      }
      for (index_t k = 0; k < num; ++k) offsets[k + 1] += offsets[k];
    }
    num_groups_ = num;
    contiguous_ = in_order;
    if (in_order) { // contiguous groups in order: members and group_of on first use
      state_.store(lazy, std::memory_order_relaxed);
      return;
    }
    std::vector<index_t> cursor(offsets, offsets + num);
    for (index_t j = 0; j < n; ++j) members[cursor[static_cast<std::size_t>(group_of[j])]++] = j;
  }

  // store_ = members | group_of | offsets | ids (the empty object: offsets = {0}). Mutable: the
  // lazy arrays are written by fill_lazy, under state_.
  mutable std::vector<index_t, uninitialized_allocator<index_t>> store_ = {0};
  index_t num_items_ = 0;
  index_t num_groups_ = 0;
  bool contiguous_ = true; // members are 0, 1, ..., n - 1
  index_t offsets_at_ = 0;
  index_t ids_at_ = 1;
  mutable std::atomic<std::uint8_t> state_{ready};
};

RLPT_NAMESPACE_END
