// SPDX-License-Identifier: Apache-2.0
//! @file
//! Balanced partitioning: which data-parallel rank gets which sequences (or whole groups).
//!
//! Ranks run in lockstep, so a step takes as long as its most loaded rank: the goal is a small
//! max load. Algorithms (facts from async_buffers.md §4.3, written from their descriptions):
//! - Karmarkar–Karp (largest differencing): states of k sets, a max-heap on spread, merge the
//!   two largest-spread states pairing largest with smallest set. verl, AReaL and slime use it.
//!   With equal counts, the items are chunked k at a time in ascending order (verl equal_size).
//! - LPT with a count cap: heaviest item first onto the lightest rank that still has room
//!   (AReaL balanced_greedy_partition).
//! - best (rlpt default): both, keeping the smaller max load, then pairwise refinement (move or
//!   swap items between the most loaded rank and the others whenever that lowers the larger
//!   of the two loads). Refinement never raises the max load, so `best` is never worse than
//!   either algorithm alone.
//! Equal counts do not need N % k == 0: parts get floor(N/k) or ceil(N/k) items.
//! Costs: tokens, a·L + L² (verl calculate_workload: 24576·L + L², a 7B-model FLOP model),
//! or any caller function of the length.
#pragma once

#include <rlpt/config.hpp>
#include <rlpt/core/checked.hpp>
#include <rlpt/core/error.hpp>
#include <rlpt/core/groups.hpp>
#include <rlpt/core/views.hpp>
#include <rlpt/core/workspace.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <numeric>
#include <queue>
#include <span>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

RLPT_NAMESPACE_BEGIN

//! Cost of one sequence of L tokens: linear·L + quadratic·L², or `custom(L)` when set.
struct cost_model {
  double linear = 1.0;
  double quadratic = 0.0;
  std::function<double(index_t)> custom{};

  [[nodiscard]] double operator()(index_t len) const {
    const auto l = static_cast<double>(len);
    return custom ? custom(len) : linear * l + quadratic * l * l;
  }
  //! Tokens (AReaL, slime default).
  [[nodiscard]] static cost_model tokens() { return {1.0, 0.0, {}}; }
  //! a·L + L²: dense-transformer FLOPs up to a factor; verl's calculate_workload is a = 24576
  //! (12h²L + 2hL² for hidden 4096, divided by 2h).
  [[nodiscard]] static cost_model attention(double a = 24576.0) { return {a, 1.0, {}}; }
  //! Σ L² (TRL balances ranks by squared length).
  [[nodiscard]] static cost_model squared() { return {0.0, 1.0, {}}; }
  [[nodiscard]] static cost_model of(std::function<double(index_t)> f) { return {0.0, 0.0, std::move(f)}; }
};

enum class partition_algorithm : std::uint8_t {
  karmarkar_karp, //!< verl get_seqlen_balanced_partitions
  lpt,            //!< AReaL balanced_greedy_partition (count-capped when equal_count)
  best,           //!< rlpt: the better of both, then refined
};

//! Items assigned to parts: part p owns items[offsets[p], offsets[p+1]), ascending.
struct partition {
  std::vector<index_t> offsets{0};
  std::vector<index_t> items{};
  std::vector<double> loads{}; //!< cost per part

  [[nodiscard]] index_t num_parts() const noexcept { return static_cast<index_t>(offsets.size()) - 1; }
  [[nodiscard]] view<const index_t> part(index_t p) const& {
    return {items.data() + offsets[static_cast<std::size_t>(p)],
            offsets[static_cast<std::size_t>(p) + 1] - offsets[static_cast<std::size_t>(p)]};
  }
  view<const index_t> part(index_t p) const&& = delete; // would view a temporary partition
  [[nodiscard]] index_t part_size(index_t p) const noexcept {
    return offsets[static_cast<std::size_t>(p) + 1] - offsets[static_cast<std::size_t>(p)];
  }
  [[nodiscard]] double max_load() const noexcept {
    return loads.empty() ? 0.0 : *std::max_element(loads.begin(), loads.end());
  }
  [[nodiscard]] double min_load() const noexcept {
    return loads.empty() ? 0.0 : *std::min_element(loads.begin(), loads.end());
  }
  [[nodiscard]] double mean_load() const noexcept {
    return loads.empty() ? 0.0 : std::accumulate(loads.begin(), loads.end(), 0.0) / static_cast<double>(loads.size());
  }
  //! max / mean (1 = perfect); 1 for an all-zero load.
  [[nodiscard]] double imbalance() const noexcept {
    const double m = mean_load();
    return m > 0.0 ? max_load() / m : 1.0;
  }
};

//! Parts beyond one per item stay empty. A count (ranks, micro-batches, divisor) may exceed the
//! items it splits up to this many parts in all: a count is at most max(items, max_empty_parts),
//! so what a call allocates is bounded by its input, not by a caller's typo (ranks = 2^40).
inline constexpr index_t max_empty_parts = index_t{1} << 20;

struct balance_options {
  index_t ranks = 1; //!< data-parallel ranks (parts); at most max(items, max_empty_parts)
  partition_algorithm algorithm = partition_algorithm::best; //!< rlpt default; verl: karmarkar_karp
  bool equal_count = true;                   //!< same item (or group) count per rank (verl equal_size=True)
  bool refine = true;                        //!< pairwise refinement after the algorithm (rlpt)
  cost_model cost = cost_model::attention(); //!< verl's calculate_workload
};

namespace detail {

// A KK set: its cost, its item count and its root item (the first item it held). A union
// points the absorbed root at the absorbing one (kk_unions), so it is O(1), a set is 16 bytes,
// and owners are resolved once at the end.
struct kk_set {
  double sum;
  std::uint32_t count;
  std::uint32_t head;
};

// verl's Set order, descending: heaviest sets first; among equal sums the one with more items,
// then the one whose first item has the higher index (verl compares the item lists, which, for
// the disjoint sets of a state, differ at their first items). A strict total order, so plain
// (unstable) sorts are deterministic and the partitions are verl's item for item.
struct kk_set_order {
  bool operator()(const kk_set& a, const kk_set& b) const noexcept {
    if (a.sum != b.sum) return a.sum > b.sum;
    if (a.count != b.count) return a.count > b.count;
    return a.head > b.head;
  }
};
inline constexpr kk_set_order kk_set_before{}; // a function object, so sorts inline it

//! Order-preserving key of a non-negative double (the sign bit dropped so -0.0 ties with 0.0,
//! as a comparison of the doubles says).
[[nodiscard]] inline std::uint64_t weight_key(double d) noexcept {
  return std::bit_cast<std::uint64_t>(d) & ~(std::uint64_t{1} << 63);
}

//! Item ids heaviest first: descending weight, ascending id among equal weights (LPT's order;
//! KK reverses each run of equal weights), for non-negative finite weights (-0.0 ties with 0.0).
RLPT_DEFER void order_heaviest_first(view<const double> w, std::vector<std::uint32_t>& order);

//! The lengths behind the costs, when costs come from lengths (balance): lo and hi are the
//! smallest and largest; `strict`: the costs are known to rise strictly with the length.
//! Empty lengths: no hint.
struct length_hint {
  view<const index_t> lengths{};
  index_t lo = 0, hi = 0;
  bool strict = false;
};

//! Item ids by descending length, ascending id among equal ones: an LSD radix sort of words
//! (hi - length) << id_bits | id, stable, in passes of at most 8 bits over the `bits` of the
//! key (at most 32, and a Word holds them all).
template <class Word> void radix_by_length(const length_hint& h, int bits, std::uint32_t* order) {
  const auto n = static_cast<std::size_t>(h.lengths.size());
  const int id_bits = static_cast<int>(std::bit_width(n - 1));
  const int passes = (bits + 7) / 8;
  const int digit = (bits + passes - 1) / passes;
  const std::size_t buckets = std::size_t{1} << digit;
  const Word mask = static_cast<Word>(buckets - 1);
  const auto buf = std::make_unique_for_overwrite<Word[]>(2 * n);
  Word* a = buf.get();
  Word* b = a + n;
  std::uint32_t count[4][256];
  for (int p = 0; p < std::max(passes, 2); ++p) std::fill_n(count[p], buckets, 0u);
  if (passes <= 2) { // lengths within 2^16: both digits' counts in one pass (one pass: the second digit is 0)
    for (std::size_t i = 0; i < n; ++i) {
      const auto key = static_cast<Word>(h.hi - h.lengths[static_cast<index_t>(i)]);
      a[i] = static_cast<Word>(key << id_bits | i);
      ++count[0][key & mask];
      ++count[1][(key >> digit) & mask];
    }
  } else {
    for (std::size_t i = 0; i < n; ++i) {
      const auto key = static_cast<Word>(h.hi - h.lengths[static_cast<index_t>(i)]);
      a[i] = static_cast<Word>(key << id_bits | i);
      for (int p = 0; p < passes; ++p) ++count[p][(key >> (p * digit)) & mask];
    }
  }
  for (int p = 0; p < passes; ++p) {
    const int at = id_bits + p * digit;
    std::uint32_t* next = count[p];
    if (next[(a[0] >> at) & mask] == n) continue; // one digit value: nothing moves
    for (std::uint32_t d = 0, sum = 0; d < buckets; ++d) sum += std::exchange(next[d], sum);
    for (std::size_t i = 0; i < n; ++i) {
      const Word v = a[i];
      b[next[(v >> at) & mask]++] = v;
    }
    std::swap(a, b);
  }
  const Word id_mask = static_cast<Word>((Word{1} << id_bits) - 1);
  for (std::size_t i = 0; i < n; ++i) order[i] = static_cast<std::uint32_t>(a[i] & id_mask);
}

//! order_heaviest_first by the lengths, with radix_by_length: no comparison to mispredict (a
//! comparison sort mispredicts about once per item; the radix sort makes a cold `balance` 1.5-2.3x
//! faster from 1024 sequences on). Kept when the costs come out heaviest first: always for
//! strictly rising costs, else as one pass checks (any non-decreasing cost of the length passes
//! it unless it rounds distinct lengths to one cost); otherwise returns false.
RLPT_DEFER inline bool order_by_length(view<const double> w, const length_hint& h, std::vector<std::uint32_t>& order) {
  const auto n = static_cast<std::size_t>(h.lengths.size());
  if (n < 2 || n != static_cast<std::size_t>(w.size()) || n > std::numeric_limits<std::uint32_t>::max()) return false;
  const auto range = static_cast<std::uint64_t>(h.hi) - static_cast<std::uint64_t>(h.lo);
  const int bits = static_cast<int>(std::bit_width(range));
  if (h.lo < 0 || bits > 32) return false;
  order.resize(n);
  if (bits == 0) { // one length: id order
    std::iota(order.begin(), order.end(), 0u);
    return true;
  }
  const int id_bits = static_cast<int>(std::bit_width(n - 1));
  if (bits + id_bits <= 32)
    radix_by_length<std::uint32_t>(h, bits, order.data());
  else
    radix_by_length<std::uint64_t>(h, bits, order.data());
  if (h.strict) return true;
  bool ok = true;
  for (std::size_t i = 1; i < n; ++i) {
    const double x = w[order[i - 1]], y = w[order[i]];
    ok &= (x > y) | ((x == y) & (order[i - 1] < order[i]));
  }
  return ok;
}

//! Heaviest first, by the lengths when the hint's order is the costs' order.
RLPT_DEFER inline void order_items(view<const double> w, const length_hint& h, std::vector<std::uint32_t>& order) {
  if (!order_by_length(w, h, order)) order_heaviest_first(w, order);
}

//! The temporary arrays of one call, carved from one block by a workspace_carver
//! (core/workspace.hpp). `balance` runs once per step, its caches long since evicted: a cold call
//! pays for every malloc/free pair and every page it touches, so the KK arrays share one
//! allocation. Arrays start at multiples of 64 bytes into the block (whose own alignment is
//! new's, 16 bytes); the types are trivial (std::byte storage creates them implicitly).
class scratch {
public:
  template <class T> [[nodiscard]] static constexpr std::size_t bytes(std::size_t n) noexcept {
    return (n * sizeof(T) + line - 1) / line * line;
  }
  explicit scratch(std::size_t bytes)
      : block_(std::make_unique_for_overwrite<std::byte[]>(bytes)), ws_{block_.get(), bytes}, carver_(ws_) {}
  template <class T> [[nodiscard]] T* take(std::size_t n) {
    static_assert(std::is_trivially_copyable_v<T> && alignof(T) <= __STDCPP_DEFAULT_NEW_ALIGNMENT__);
    return carver_.take<T>(n, line);
  }

private:
  static constexpr std::size_t line = 64;
  std::unique_ptr<std::byte[]> block_;
  workspace ws_;
  workspace_carver carver_;
};

// Max-heap key of a KK state, verl's State order: the larger spread, then the larger largest
// set in kk_set_order (its sum, then its item count and first item, packed in `tie`). States
// are disjoint, so no two keys are equal. Computed once per push: a state does not change while
// it waits in the heap.
struct kk_key {
  double spread;
  double top;
  std::uint64_t tie; // the largest set's count << 32 | its first item
  std::uint32_t state;
};
[[nodiscard]] inline kk_key key_of_state(double spread, const kk_set& top, std::uint32_t state) noexcept {
  return {spread, top.sum, std::uint64_t{top.count} << 32 | top.head, state};
}
[[nodiscard]] inline bool kk_key_after(const kk_key& x, const kk_key& y) noexcept {
  if (x.spread != y.spread) return x.spread < y.spread;
  if (x.top != y.top) return x.top < y.top;
  return x.tie < y.tie;
}
//! Max-heap of KK states over a flat array with room for every state. KK pops two states and
//! pushes their merge, so `replace_top` (one sift-down) stands for the second pop and the push.
//! Keys are unique, so the heap's order and the merges do not depend on its layout.
class kk_heap {
public:
  explicit kk_heap(kk_key* storage) noexcept : v_(storage) {}
  [[nodiscard]] std::size_t size() const noexcept { return n_; }
  [[nodiscard]] const kk_key& top() const noexcept { return v_[0]; }
  void push(const kk_key& k) noexcept {
    std::size_t i = n_++;
    while (i > 0) {
      const std::size_t up = (i - 1) / 2;
      if (!kk_key_after(v_[up], k)) break;
      v_[i] = v_[up];
      i = up;
    }
    v_[i] = k;
  }
  void pop() noexcept {
    if (--n_ > 0) sift_down(v_[n_]);
  }
  void replace_top(const kk_key& k) noexcept { sift_down(k); }

private:
  void sift_down(const kk_key& k) noexcept {
    const std::size_t n = n_;
    std::size_t i = 0;
    for (;;) {
      std::size_t c = 2 * i + 1;
      if (c >= n) break;
      if (c + 1 < n && kk_key_after(v_[c], v_[c + 1])) ++c;
      if (!kk_key_after(k, v_[c])) break;
      v_[i] = v_[c];
      i = c;
    }
    v_[i] = k;
  }
  kk_key* v_;
  std::size_t n_ = 0;
};

//! Sorts n = 2^m >= 8 distinct 64-bit keys ascending, with no branch on the keys: sorted runs
//! of 8 (a 19-exchange network), then merge passes that fill each output from both ends at once
//! (two independent chains; with equal runs neither end can read past its inputs). A
//! comparison sort mispredicts about one branch per key: this makes a cold `balance` of 16384
//! sequences over 64 ranks 1.6x faster than std::sort of the sets.
inline void sort_keys_branchless(std::uint64_t* v, std::uint64_t* tmp, std::size_t n) noexcept {
  for (std::size_t i = 0; i < n; i += 8) {
    std::uint64_t x[8];
    std::copy(v + i, v + i + 8, x);
    auto exchange = [&x](int a, int b) {
      const std::uint64_t lo = x[a] < x[b] ? x[a] : x[b], hi = x[a] < x[b] ? x[b] : x[a];
      x[a] = lo;
      x[b] = hi;
    };
    exchange(0, 2), exchange(1, 3), exchange(4, 6), exchange(5, 7);
    exchange(0, 4), exchange(1, 5), exchange(2, 6), exchange(3, 7);
    exchange(0, 1), exchange(2, 3), exchange(4, 5), exchange(6, 7);
    exchange(2, 4), exchange(3, 5);
    exchange(1, 4), exchange(3, 6);
    exchange(1, 2), exchange(3, 4), exchange(5, 6);
    std::copy(x, x + 8, v + i);
  }
  std::uint64_t* src = v;
  std::uint64_t* dst = tmp;
  for (std::size_t run = 8; run < n; run *= 2) {
    for (std::size_t s = 0; s < n; s += 2 * run) {
      const std::uint64_t* x = src + s;
      const std::uint64_t* y = x + run;
      std::uint64_t* out = dst + s;
      std::size_t i = 0, j = 0, i_back = run - 1, j_back = run - 1;
      for (std::size_t t = 0; t < run; ++t) {
        const std::uint64_t a = x[i], b = y[j];
        const bool take_y = b < a;
        out[t] = take_y ? b : a;
        j += take_y;
        i += !take_y;
        const std::uint64_t c = x[i_back], d = y[j_back];
        const bool take_x = c > d;
        out[2 * run - 1 - t] = take_x ? c : d;
        i_back -= take_x;
        j_back -= !take_x;
      }
    }
    std::swap(src, dst);
  }
  if (src != v) std::copy(src, src + n, v);
}

//! Sorts the k sets of a merged state with kk_set_before. Past 16 sets (k ranks) it sorts one
//! 64-bit integer per set instead, with sort_keys_branchless: the sum's order key below the
//! largest (shared zero bits dropped) with the position in the low bits; runs of equal sums,
//! which that orders by position, are then put in kk_set_before order.
class kk_set_sorter {
public:
  [[nodiscard]] static std::size_t bytes(index_t k) noexcept {
    const auto m = static_cast<std::size_t>(k);
    return k <= 16 ? 0 : scratch::bytes<std::uint64_t>(2 * std::bit_ceil(m)) + scratch::bytes<kk_set>(m);
  }
  kk_set_sorter(scratch& mem, index_t k) : n_(std::bit_ceil(static_cast<std::size_t>(k))) {
    if (k <= 16) return;
    keys_ = mem.take<std::uint64_t>(2 * n_);
    sets_ = mem.take<kk_set>(static_cast<std::size_t>(k));
  }
  void operator()(kk_set* x, index_t k) {
    if (k <= 16) return std::sort(x, x + k, kk_set_before);
    std::uint64_t hi = 0, any = 0;
    for (index_t i = 0; i < k; ++i) {
      const std::uint64_t u = weight_key(x[i].sum);
      hi = std::max(hi, u);
      any |= u;
    }
    const int shift = any == 0 ? 0 : std::countr_zero(any);
    const int id_bits = static_cast<int>(std::bit_width(static_cast<std::uint64_t>(k - 1)));
    if (static_cast<int>(std::bit_width(hi >> shift)) + id_bits > 62) return std::sort(x, x + k, kk_set_before);
    const auto m = static_cast<std::size_t>(k);
    for (std::size_t i = 0; i < m; ++i) keys_[i] = (((hi - weight_key(x[i].sum)) >> shift) << id_bits) | i;
    std::fill(keys_ + m, keys_ + n_, std::uint64_t{std::numeric_limits<std::int64_t>::max()});
    sort_keys_branchless(keys_, keys_ + n_, n_);
    const std::uint64_t id_mask = (std::uint64_t{1} << id_bits) - 1;
    bool ties = false; // equal sums have equal keys above the position bits
    for (std::size_t i = 0; i < m; ++i) {
      sets_[i] = x[keys_[i] & id_mask];
      ties |= i > 0 && (keys_[i] ^ keys_[i - 1]) >> id_bits == 0;
    }
    std::copy(sets_, sets_ + m, x);
    if (!ties) [[likely]]
      return;
    for (index_t i = 1; i < k; ++i) {
      if (x[i].sum != x[i - 1].sum) continue;
      index_t end = i + 1;
      while (end < k && x[end].sum == x[i].sum) ++end;
      std::sort(x + i - 1, x + end, kk_set_before);
      i = end;
    }
  }

private:
  std::size_t n_; // k rounded up to a power of two: the keys are padded with INT64_MAX
  std::uint64_t* keys_ = nullptr;
  kk_set* sets_ = nullptr;
};

//! Roots absorbed into other sets, in order: a later root never points at an earlier one, so
//! owners resolve in one backward pass.
class kk_unions {
public:
  [[nodiscard]] static std::size_t bytes(std::size_t items) noexcept {
    return 2 * scratch::bytes<std::uint32_t>(items);
  }
  kk_unions(scratch& mem, std::size_t items)
      : parent_(mem.take<std::uint32_t>(items)), absorbed_(mem.take<std::uint32_t>(items)) {}
  void join(kk_set& into, const kk_set& from) noexcept {
    parent_[from.head] = into.head;
    absorbed_[joins_++] = from.head;
    into.sum += from.sum;
    into.count += from.count;
  }
  //! Part of each of the first n items; the final sets' positions are the parts. Resolves in
  //! place (a root's own entry is free; a parent's entry holds its part by the time a child
  //! reads it), so it is the last call.
  [[nodiscard]] std::vector<index_t> owners(const kk_set* sets, index_t nsets, index_t n) {
    for (index_t p = 0; p < nsets; ++p) parent_[sets[p].head] = static_cast<std::uint32_t>(p);
    for (std::size_t j = joins_; j-- > 0;) parent_[absorbed_[j]] = parent_[parent_[absorbed_[j]]];
    return std::vector<index_t>(parent_, parent_ + n);
  }

private:
  std::uint32_t* parent_; // written before it is read: no zeroing
  std::uint32_t* absorbed_;
  std::size_t joins_ = 0;
};

//! Index-ordered item lists per part from an owner array.
RLPT_DEFER std::vector<std::vector<index_t>> parts_of(const std::vector<index_t>& owner, index_t k);

//! kk_assign with equal counts: every state holds exactly k non-empty sets, so the states are
//! slices of one flat arena. `order` holds the `total` items and padding heaviest first.
RLPT_DEFER std::vector<index_t> kk_equal_counts(view<const double> w, std::vector<std::uint32_t>& order, index_t k,
                                                index_t total);

//! kk_assign with free counts: states start as one item and grow up to k non-empty sets (the
//! rest empty). `order` holds the `total` items heaviest first.
RLPT_DEFER std::vector<index_t> kk_free_counts(view<const double> w, const std::vector<std::uint32_t>& order, index_t k,
                                               index_t total);

//! Karmarkar–Karp over non-negative weights, given the items heaviest first (order_items).
//! Equal counts with n % k != 0 add zero-weight padding items that sort last, so the lightest
//! chunk gives them one per set and they are dropped at the end: parts get floor(n/k) or
//! ceil(n/k) items. Parts come back ascending.
RLPT_DEFER std::vector<index_t> kk_assign(view<const double> w, std::vector<std::uint32_t> order, index_t k,
                                          bool equal_count);

//! kk_assign ordering the items itself.
RLPT_DEFER inline std::vector<index_t> kk_assign(view<const double> w, index_t k, bool equal_count) {
  std::vector<std::uint32_t> order;
  order_heaviest_first(w, order);
  return kk_assign(w, std::move(order), k, equal_count);
}

//! Karmarkar–Karp as index-ordered item lists per part.
RLPT_DEFER inline std::vector<std::vector<index_t>> karmarkar_karp(view<const double> w, index_t k, bool equal_count) {
  return parts_of(kk_assign(w, k, equal_count), k);
}

//! LPT: heaviest first onto the lightest part with room. With equal counts, r = n % k parts
//! take ceil(n/k) items and the others floor(n/k).
RLPT_DEFER std::vector<index_t> lpt_assign(view<const double> w, const std::vector<std::uint32_t>& order, index_t k,
                                           bool equal_count);

[[nodiscard]] inline double sum_of(const std::vector<index_t>& part, view<const double> w) {
  double s = 0.0;
  for (const index_t i : part) s += w[i];
  return s;
}

RLPT_DEFER void refine_parts(std::vector<std::vector<index_t>>& parts, view<const double> w, bool equal_count);

//! Lowers the max load by moves (when counts are free) and swaps between the heaviest part
//! and each other part; a change is kept only if the larger of the two new loads is strictly
//! below the old max. Bounded number of rounds.
RLPT_DEFER inline void refine(std::vector<index_t>& owner, index_t k_parts, view<const double> w, bool equal_count) {
  std::vector<std::vector<index_t>> parts = parts_of(owner, k_parts);
  refine_parts(parts, w, equal_count);
  for (std::size_t p = 0; p < parts.size(); ++p)
    for (const index_t i : parts[p]) owner[static_cast<std::size_t>(i)] = static_cast<index_t>(p);
}

RLPT_DEFER partition to_partition(const std::vector<index_t>& owner, index_t k, view<const double> w);

//! A count of parts (`what`) for `items` things (each a `unit`): at most max(items, max_empty_parts).
inline void check_count(error_id id, std::string_view what, index_t count, index_t items, std::string_view unit) {
  RLPT_CHECK(
      count <= std::max(items, max_empty_parts), id,
      "{} = {} exceeds both the number of {}s ({}) and max_empty_parts ({}): parts beyond one per {} stay empty, "
      "at most max({}, {}) are made",
      what, count, unit, items, max_empty_parts, unit, items, max_empty_parts);
}

inline void check_algorithm(partition_algorithm a) {
  RLPT_CHECK(
      a == partition_algorithm::karmarkar_karp || a == partition_algorithm::lpt || a == partition_algorithm::best,
      errors::rollout::bad_option, "partition algorithm code {} is not a partition_algorithm", static_cast<int>(a));
}

inline void check_parts(index_t parts, index_t items) {
  RLPT_CHECK(parts >= 1, errors::rollout::bad_partition, "cannot partition into {} parts; need at least 1", parts);
  check_count(errors::rollout::bad_partition, "parts", parts, items, "item");
}

inline void check_weights(view<const double> w, index_t parts) {
  check_parts(parts, w.size());
  for (index_t i = 0; i < w.size(); ++i)
    RLPT_CHECK(std::isfinite(w[i]) && w[i] >= 0.0, errors::rollout::bad_cost,
               "cost of item {} is {}; costs must be finite and >= 0", i, w[i]);
}

[[nodiscard]] inline double max_of(const std::vector<index_t>& owner, index_t k, view<const double> w) {
  std::vector<double> load(static_cast<std::size_t>(k), 0.0);
  for (std::size_t i = 0; i < owner.size(); ++i) load[static_cast<std::size_t>(owner[i])] += w[static_cast<index_t>(i)];
  return load.empty() ? 0.0 : *std::max_element(load.begin(), load.end());
}

//! partition_weights on checked costs, with the lengths behind them when there are.
RLPT_DEFER [[nodiscard]] partition partition_checked(view<const double> weights, const length_hint& hint, index_t parts,
                                                     partition_algorithm algorithm, bool equal_count, bool refine);

//! Costs of sequences of the given lengths; rejects negative lengths and costs that are not
//! finite and >= 0, naming the first. hint: the lengths and their range.
RLPT_DEFER [[nodiscard]] std::vector<double> costs_of(view<const index_t> lengths, const cost_model& cost,
                                                      length_hint* hint);

} // namespace detail

//! Partitions items with non-negative costs `weights` into `parts` parts. With equal_count,
//! part sizes differ by at most one. Parts may be empty only when there are fewer items
//! than parts.
RLPT_DEFER [[nodiscard]] inline partition partition_weights(view<const double> weights, index_t parts,
                                                            partition_algorithm algorithm = partition_algorithm::best,
                                                            bool equal_count = true, bool refine = true) {
  detail::check_algorithm(algorithm);
  detail::check_weights(weights, parts);
  return detail::partition_checked(weights, {}, parts, algorithm, equal_count, refine);
}

//! Balances sequences of the given lengths across options.ranks ranks. Loads are costs.
RLPT_DEFER [[nodiscard]] inline partition balance(view<const index_t> lengths, const balance_options& o = {}) {
  detail::check_algorithm(o.algorithm);
  detail::check_parts(o.ranks, lengths.size());
  detail::length_hint hint;
  const std::vector<double> w = detail::costs_of(lengths, o.cost, &hint);
  return detail::partition_checked(w, hint, o.ranks, o.algorithm, o.equal_count, o.refine);
}

//! Balances whole groups: every group's sequences land on one rank (prefix sharing, group
//! baselines computed locally). equal_count counts groups. Items of the result are sequence
//! indices (ascending per rank); loads are the costs of their sequences.
RLPT_DEFER [[nodiscard]] partition balance_groups(view<const index_t> lengths, const groups& g,
                                                  const balance_options& o = {});

//! verl's two orders that put the cheap items at both ends (pipeline warm-up and drain).
enum class ends_order : std::uint8_t {
  //! _balance_batch's order of the sequences within a rank: ascending by (cost, item), the even
  //! positions, then the odd positions reversed.
  rank,
  //! rearrange_micro_batches' order of a rank's micro-batches (use_dynamic_bsz_balance):
  //! descending by (cost, tie key), equal keys in their given order, the even positions reversed,
  //! then the odd positions. For an odd count the two orders agree; for an even one they are
  //! each other's reverse.
  microbatches,
};

//! Orders items so the cheap ones sit at both ends, in one of verl's orders. `ties` (microbatches
//! only) holds one tie key per cost (verl: a micro-batch's first sequence, 0 when it is empty);
//! without it the item itself.
RLPT_DEFER void order_small_at_ends(std::span<index_t> items, view<const double> costs,
                                    ends_order how = ends_order::rank, view<const index_t> ties = {});

RLPT_NAMESPACE_END

#if RLPT_HEADER_IMPL()
RLPT_NAMESPACE_BEGIN

namespace detail {

RLPT_DEFER RLPT_INLINE void order_heaviest_first(view<const double> w, std::vector<std::uint32_t>& order) {
  const auto n = static_cast<std::size_t>(w.size());
  RLPT_CHECK(n <= std::numeric_limits<std::uint32_t>::max(), errors::rollout::too_many_items,
             "cannot order {} items; at most 2^32 - 1", n);
  std::vector<std::pair<std::uint64_t, std::uint32_t>> pairs(n); // (descending weight key, id)
  for (std::size_t i = 0; i < n; ++i)
    pairs[i] = {~weight_key(w[static_cast<index_t>(i)]), static_cast<std::uint32_t>(i)};
  std::sort(pairs.begin(), pairs.end());
  order.resize(n);
  for (std::size_t i = 0; i < n; ++i) order[i] = pairs[i].second;
}

RLPT_DEFER RLPT_INLINE std::vector<std::vector<index_t>> parts_of(const std::vector<index_t>& owner, index_t k) {
  std::vector<index_t> count(static_cast<std::size_t>(k), 0);
  for (const index_t p : owner) ++count[static_cast<std::size_t>(p)];
  std::vector<std::vector<index_t>> parts(static_cast<std::size_t>(k));
  for (index_t p = 0; p < k; ++p)
    parts[static_cast<std::size_t>(p)].reserve(static_cast<std::size_t>(count[static_cast<std::size_t>(p)]));
  for (std::size_t i = 0; i < owner.size(); ++i)
    parts[static_cast<std::size_t>(owner[i])].push_back(static_cast<index_t>(i));
  return parts;
}

RLPT_DEFER RLPT_INLINE std::vector<index_t> kk_equal_counts(view<const double> w, std::vector<std::uint32_t>& order,
                                                            index_t k, index_t total) {
  const index_t n = w.size();
  const index_t states = total / k;
  const auto t = static_cast<std::size_t>(total);
  scratch mem(scratch::bytes<kk_set>(t) + kk_unions::bytes(t) +
              scratch::bytes<kk_key>(static_cast<std::size_t>(states)) + kk_set_sorter::bytes(k));
  // State st, the st-th lightest chunk, is the arena's (states - 1 - st)-th slice.
  kk_set* const arena = mem.take<kk_set>(t);
  kk_unions unions(mem, t);
  kk_heap heap(mem.take<kk_key>(static_cast<std::size_t>(states)));
  kk_set_sorter sort_sets(mem, k);
  auto slice = [&](index_t st) { return arena + (states - 1 - st) * k; };
  auto key_of = [&](index_t st) {
    const kk_set* x = slice(st);
    return key_of_state(x[0].sum - x[k - 1].sum, x[0], static_cast<std::uint32_t>(st));
  };
  // verl chunks the ascending (weight, id) order k at a time, the lightest chunk first, and
  // sorts each chunk's one-item sets descending: the arena is that ascending order reversed,
  // `order` with each run of equal weights reversed (ids descending). The padding (last,
  // fewer than k) is a run of its own below real zero weights.
  for (std::size_t p = 0; p < t; ++p) {
    const std::uint32_t item = order[p];
    arena[p] = {item < static_cast<std::uint64_t>(n) ? w[item] : 0.0, 1, item};
  }
  auto same_run = [&](const kk_set& a, const kk_set& b) {
    return a.sum == b.sum && (a.head < static_cast<std::uint64_t>(n)) == (b.head < static_cast<std::uint64_t>(n));
  };
  for (std::size_t lo = 0; lo < t;) {
    std::size_t hi = lo + 1;
    while (hi < t && same_run(arena[hi], arena[lo])) ++hi;
    if (hi - lo > 1) std::reverse(arena + lo, arena + hi);
    lo = hi;
  }
  for (index_t st = 0; st < states; ++st) heap.push(key_of(st)); // the lightest chunk first, as verl
  while (heap.size() > 1) {
    const index_t a = heap.top().state;
    heap.pop();
    kk_set* x = slice(a);
    const kk_set* y = slice(heap.top().state);
    for (index_t i = 0; i < k; ++i) unions.join(x[i], y[k - 1 - i]); // heaviest of x with lightest of y
    sort_sets(x, k);
    heap.replace_top(key_of(a));
  }
  return unions.owners(slice(heap.top().state), k, n);
}

RLPT_DEFER RLPT_INLINE std::vector<index_t>
kk_free_counts(view<const double> w, const std::vector<std::uint32_t>& order, index_t k, index_t total) {
  const index_t n = w.size();
  const auto slots = static_cast<std::size_t>(total);
  auto weight = [&](std::uint32_t item) { return item < static_cast<std::uint64_t>(n) ? w[item] : 0.0; };
  scratch mem(kk_unions::bytes(slots) + scratch::bytes<kk_key>(slots));
  kk_unions unions(mem, slots);
  kk_heap heap(mem.take<kk_key>(slots));
  // A state's non-empty sets, in kk_set_order; the remaining k - size() are empty.
  std::vector<std::vector<kk_set>> pool(slots);
  auto key_of = [&](index_t i) {
    const std::vector<kk_set>& x = pool[static_cast<std::size_t>(i)];
    const double lo = static_cast<index_t>(x.size()) < k ? 0.0 : x.back().sum;
    return key_of_state(x.front().sum - lo, x.front(), static_cast<std::uint32_t>(i));
  };
  // One state per item; the keys order them (verl pushes them in ascending (weight, id) order).
  for (index_t i = 0; i < total; ++i) {
    const std::uint32_t item = order[static_cast<std::size_t>(i)];
    pool[static_cast<std::size_t>(i)].push_back({weight(item), 1, item});
    heap.push(key_of(i));
  }
  std::vector<kk_set> changed;
  while (heap.size() > 1) {
    const index_t a = heap.top().state;
    heap.pop();
    const index_t b = heap.top().state;
    std::vector<kk_set>& x = pool[static_cast<std::size_t>(a)];
    std::vector<kk_set>& y = pool[static_cast<std::size_t>(b)];
    const index_t mx = static_cast<index_t>(x.size()), my = static_cast<index_t>(y.size());
    // Set i of x joins set k-1-i of y: heaviest with lightest. Only positions [k - my, k) meet
    // a set of y; x's sets before that stay as they are (still sorted), so the result is a
    // merge of that prefix with the few changed sets: O(changed + moved), not O(k log k).
    const index_t keep = std::min(mx, k - my);
    changed.clear();
    for (index_t i = k - my; i < k; ++i) {
      const kk_set& t = y[static_cast<std::size_t>(k - 1 - i)];
      if (i >= mx) {
        changed.push_back(t);
        continue;
      }
      kk_set s = x[static_cast<std::size_t>(i)];
      unions.join(s, t);
      changed.push_back(s);
    }
    std::sort(changed.begin(), changed.end(), kk_set_before);
    // Merge from the back, in place: the prefix keeps its slots unless a changed set outranks it.
    const auto nc = static_cast<index_t>(changed.size());
    x.resize(static_cast<std::size_t>(keep + nc));
    for (index_t i = keep - 1, j = nc - 1, out = keep + nc - 1; j >= 0; --out) {
      if (i >= 0 && kk_set_before(changed[static_cast<std::size_t>(j)], x[static_cast<std::size_t>(i)]))
        x[static_cast<std::size_t>(out)] = x[static_cast<std::size_t>(i--)];
      else
        x[static_cast<std::size_t>(out)] = changed[static_cast<std::size_t>(j--)];
    }
    std::vector<kk_set>().swap(y);
    heap.replace_top(key_of(a));
  }
  const std::vector<kk_set>& fin = pool[static_cast<std::size_t>(heap.top().state)];
  return unions.owners(fin.data(), static_cast<index_t>(fin.size()), n);
}

RLPT_DEFER RLPT_INLINE std::vector<index_t> kk_assign(view<const double> w, std::vector<std::uint32_t> order, index_t k,
                                                      bool equal_count) {
  const index_t n = w.size();
  const index_t pad = equal_count ? (k - n % k) % k : 0;
  const index_t total = n + pad; // padding items have ids n .. n + pad - 1, weight 0
  RLPT_CHECK(total < index_t{1} << 31, errors::rollout::too_many_items,
             "cannot partition {} items ({} with padding); at most 2^31 - 1", n, total);
  if (total == 0) return {};
  for (index_t p = n; p < total; ++p) order.push_back(static_cast<std::uint32_t>(p));
  return equal_count ? kk_equal_counts(w, order, k, total) : kk_free_counts(w, order, k, total);
}

RLPT_DEFER RLPT_INLINE std::vector<index_t> lpt_assign(view<const double> w, const std::vector<std::uint32_t>& order,
                                                       index_t k, bool equal_count) {
  const index_t n = w.size();
  const index_t q = n / k, r = n % k;
  index_t big_used = 0;
  std::vector<double> load(static_cast<std::size_t>(k), 0.0);
  std::vector<index_t> count(static_cast<std::size_t>(k), 0);
  using entry = std::pair<double, index_t>; // (load, part): min-heap, ties to the lower part
  std::priority_queue<entry, std::vector<entry>, std::greater<>> heap;
  for (index_t p = 0; p < k; ++p) heap.push({0.0, p});
  std::vector<index_t> owner(static_cast<std::size_t>(n), -1);
  for (const std::uint32_t item : order) {
    for (;;) {
      const auto [l, p] = heap.top();
      heap.pop();
      const auto up = static_cast<std::size_t>(p);
      if (l != load[up]) continue; // stale entry
      const index_t cap = !equal_count ? n : (big_used < r ? q + 1 : q);
      if (count[up] >= cap) continue; // full for good: caps only shrink
      owner[static_cast<std::size_t>(item)] = p;
      load[up] += w[item];
      if (++count[up] == q + 1 && equal_count) ++big_used;
      heap.push({load[up], p});
      break;
    }
  }
  return owner;
}

RLPT_DEFER RLPT_INLINE void refine_parts(std::vector<std::vector<index_t>>& parts, view<const double> w,
                                         bool equal_count) {
  const auto k = parts.size();
  if (k < 2) return;
  std::vector<double> load(k);
  for (std::size_t p = 0; p < k; ++p) load[p] = sum_of(parts[p], w);
  auto by_weight = [&](index_t a, index_t b) { return w[a] != w[b] ? w[a] < w[b] : a < b; };
  for (auto& p : parts) std::sort(p.begin(), p.end(), by_weight);
  const std::size_t rounds = 4 * k + 32;
  std::vector<std::size_t> others;
  for (std::size_t round = 0; round < rounds; ++round) {
    const auto top = static_cast<std::size_t>(std::max_element(load.begin(), load.end()) - load.begin());
    const double hi = load[top];
    others.clear();
    for (std::size_t p = 0; p < k; ++p)
      if (p != top) others.push_back(p);
    std::sort(others.begin(), others.end(), [&](std::size_t a, std::size_t b) { return load[a] < load[b]; });
    bool improved = false;
    for (const std::size_t o : others) {
      const double gap = hi - load[o];
      if (gap <= 0.0) break;
      const double target = gap / 2.0;
      auto& P = parts[top];
      auto& Q = parts[o];
      // Best single move P -> Q: weight in (0, gap), closest to gap / 2.
      double best_err = std::numeric_limits<double>::infinity();
      index_t best_x = -1, best_y = -1; // positions; best_y == -1 means a move
      if (!equal_count)
        for (std::size_t i = 0; i < P.size(); ++i) {
          const double d = w[P[i]];
          if (d > 0.0 && d < gap && std::abs(d - target) < best_err) {
            best_err = std::abs(d - target);
            best_x = static_cast<index_t>(i);
          }
        }
      // Best swap x in P, y in Q: w[x] - w[y] in (0, gap), closest to gap / 2. Two pointers
      // over both lists sorted by weight.
      std::size_t j = 0;
      for (std::size_t i = 0; i < P.size(); ++i) {
        const double wx = w[P[i]];
        // advance j while w[Q[j]] < wx - target (delta still above target)
        while (j < Q.size() && wx - w[Q[j]] > target) ++j;
        for (std::size_t c : {j, j == 0 ? Q.size() : j - 1}) {
          if (c >= Q.size()) continue;
          const double d = wx - w[Q[c]];
          if (d > 0.0 && d < gap && std::abs(d - target) < best_err) {
            best_err = std::abs(d - target);
            best_x = static_cast<index_t>(i);
            best_y = static_cast<index_t>(c);
          }
        }
      }
      if (best_x < 0) continue;
      const index_t x = P[static_cast<std::size_t>(best_x)];
      const double dx = w[x], dy = best_y >= 0 ? w[Q[static_cast<std::size_t>(best_y)]] : 0.0;
      const double new_p = hi - dx + dy, new_q = load[o] + dx - dy;
      if (std::max(new_p, new_q) >= hi) continue;
      P.erase(P.begin() + best_x);
      if (best_y >= 0) {
        const index_t y = Q[static_cast<std::size_t>(best_y)];
        Q.erase(Q.begin() + best_y);
        P.insert(std::upper_bound(P.begin(), P.end(), y, by_weight), y);
      }
      Q.insert(std::upper_bound(Q.begin(), Q.end(), x, by_weight), x);
      load[top] = sum_of(P, w); // exact re-summation: no drift
      load[o] = sum_of(Q, w);
      improved = true;
      break;
    }
    if (!improved) break;
  }
}

RLPT_DEFER RLPT_INLINE partition to_partition(const std::vector<index_t>& owner, index_t k, view<const double> w) {
  partition out;
  const auto n = owner.size();
  const auto parts = static_cast<std::size_t>(k);
  // Items ascending within each part: bucket by owner in index order (O(n), no sort). offsets[p + 1]
  // serves as part p's cursor (it starts at the part's first slot and ends at its last + 1), so
  // shifting the offsets up one place afterwards restores them.
  out.offsets.assign(parts + 1, 0);
  out.loads.assign(parts, 0.0);
  for (const index_t p : owner) ++out.offsets[static_cast<std::size_t>(p) + 1];
  for (std::size_t p = 1; p < parts; ++p) out.offsets[p + 1] += out.offsets[p];
  for (std::size_t p = parts; p > 0; --p) out.offsets[p] = out.offsets[p - 1];
  out.items.resize(n);
  for (std::size_t i = 0; i < n; ++i) {
    const auto p = static_cast<std::size_t>(owner[i]);
    out.items[static_cast<std::size_t>(out.offsets[p + 1]++)] = static_cast<index_t>(i);
    out.loads[p] += w[static_cast<index_t>(i)];
  }
  return out;
}

RLPT_DEFER RLPT_INLINE partition partition_checked(view<const double> weights, const length_hint& hint, index_t parts,
                                                   partition_algorithm algorithm, bool equal_count, bool refine) {
  std::vector<std::uint32_t> order;
  order_items(weights, hint, order);
  std::vector<index_t> owner;
  switch (algorithm) {
  case partition_algorithm::karmarkar_karp:
    owner = kk_assign(weights, std::move(order), parts, equal_count);
    break;
  case partition_algorithm::lpt:
    owner = lpt_assign(weights, order, parts, equal_count);
    break;
  case partition_algorithm::best: {
    auto b = lpt_assign(weights, order, parts, equal_count);
    auto a = kk_assign(weights, std::move(order), parts, equal_count);
    owner = max_of(b, parts, weights) < max_of(a, parts, weights) ? std::move(b) : std::move(a);
    break;
  }
  }
  if (refine) detail::refine(owner, parts, weights, equal_count);
  return to_partition(owner, parts, weights);
}

RLPT_DEFER RLPT_INLINE std::vector<double> costs_of(view<const index_t> lengths, const cost_model& cost,
                                                    length_hint* hint) {
  const auto n = static_cast<std::size_t>(lengths.size());
  std::vector<double> w(n);
  index_t lo = std::numeric_limits<index_t>::max(), hi = std::numeric_limits<index_t>::min();
  bool bad = false, strict = false;
  auto check_lengths = [&] {
    for (std::size_t i = 0; i < n; ++i)
      RLPT_CHECK(lengths[static_cast<index_t>(i)] >= 0, errors::rollout::bad_length, "sequence {} has length {}", i,
                 lengths[static_cast<index_t>(i)]);
  };
  if (cost.custom) {
    check_lengths(); // before the caller's function sees a length
    for (std::size_t i = 0; i < n; ++i) {
      const index_t l = lengths[static_cast<index_t>(i)];
      lo = std::min(lo, l);
      hi = std::max(hi, l);
      w[i] = cost.custom(l);
      bad |= !(w[i] >= 0.0 && w[i] <= std::numeric_limits<double>::max());
    }
  } else {
    const double a = cost.linear, q = cost.quadratic;
    for (std::size_t i = 0; i < n; ++i) {
      const index_t l = lengths[static_cast<index_t>(i)];
      lo = std::min(lo, l);
      hi = std::max(hi, l);
      const auto x = static_cast<double>(l);
      w[i] = a * x + q * x * x; // as cost_model::operator()
    }
    if (lo < 0) check_lengths();
    // Finite coefficients >= 0 make the cost non-decreasing in the length (every rounding
    // step is): all costs lie in [0, cost(hi)], so only cost(hi) needs checking. Integer
    // coefficients, not both 0, with cost(hi) below 2^53 compute every cost exactly: the
    // costs rise strictly (verl's 24576·L + L², tokens).
    const auto top = static_cast<double>(hi);
    const double max_cost = a * top + q * top * top;
    const bool monotone =
        a >= 0.0 && q >= 0.0 && a <= std::numeric_limits<double>::max() && q <= std::numeric_limits<double>::max();
    if (!monotone || !(max_cost <= std::numeric_limits<double>::max()))
      for (const double c : w) bad |= !(c >= 0.0 && c <= std::numeric_limits<double>::max());
    strict = monotone && a == std::floor(a) && q == std::floor(q) && a + q > 0.0 && max_cost < 0x1p53;
  }
  if (bad) check_weights(w, 1);
  if (hint != nullptr) *hint = {lengths, lo, hi, strict};
  return w;
}

} // namespace detail

RLPT_DEFER RLPT_INLINE partition balance_groups(view<const index_t> lengths, const groups& g,
                                                const balance_options& o) {
  g.expect_items("lengths", lengths.size());
  detail::check_parts(o.ranks, g.num_groups());
  const std::vector<double> seq = detail::costs_of(lengths, o.cost, nullptr);
  std::vector<double> w(static_cast<std::size_t>(g.num_groups()), 0.0);
  for (index_t k = 0; k < g.num_groups(); ++k)
    for (const index_t i : g.members(k)) w[static_cast<std::size_t>(k)] += seq[static_cast<std::size_t>(i)];
  const partition by_group = partition_weights(w, o.ranks, o.algorithm, o.equal_count, o.refine);
  partition out;
  out.offsets.assign(1, 0);
  for (index_t p = 0; p < by_group.num_parts(); ++p) {
    const auto first = out.items.size();
    double load = 0.0;
    for (const index_t k : by_group.part(p))
      for (const index_t i : g.members(k)) {
        out.items.push_back(i);
        load += seq[static_cast<std::size_t>(i)];
      }
    std::sort(out.items.begin() + static_cast<std::ptrdiff_t>(first), out.items.end());
    out.offsets.push_back(static_cast<index_t>(out.items.size()));
    out.loads.push_back(load);
  }
  return out;
}

RLPT_DEFER RLPT_INLINE void order_small_at_ends(std::span<index_t> items, view<const double> costs, ends_order how,
                                                view<const index_t> ties) {
  for (std::size_t k = 0; k < items.size(); ++k)
    RLPT_CHECK(items[k] >= 0 && items[k] < costs.size(), errors::rollout::bad_items,
               "items[{}] = {} is outside the {} costs", k, items[k], costs.size());
  RLPT_CHECK(how == ends_order::rank || how == ends_order::microbatches, errors::rollout::bad_option,
             "ends_order code {} is not an ends_order", static_cast<int>(how));
  RLPT_CHECK(ties.empty() || (how == ends_order::microbatches && ties.size() == costs.size()),
             errors::rollout::bad_items, "{} tie keys for {} costs: the microbatches order takes one per cost, or none",
             ties.size(), costs.size());
  std::vector<index_t> s(items.begin(), items.end());
  std::size_t at = 0;
  if (how == ends_order::rank) {
    std::sort(s.begin(), s.end(),
              [&](index_t a, index_t b) { return costs[a] != costs[b] ? costs[a] < costs[b] : a < b; });
    for (std::size_t i = 0; i < s.size(); i += 2) items[at++] = s[i];
    const std::size_t last_odd = s.size() % 2 == 0 ? s.size() : s.size() - 1; // one past the last odd position
    for (std::size_t i = last_odd; i >= 2; i -= 2) items[at++] = s[i - 1];
    return;
  }
  const auto tie = [&](index_t i) { return ties.empty() ? i : ties[i]; };
  std::stable_sort(s.begin(), s.end(),
                   [&](index_t a, index_t b) { return costs[a] != costs[b] ? costs[a] > costs[b] : tie(a) > tie(b); });
  if (s.empty()) return;
  for (std::size_t i = (s.size() - 1) / 2 * 2 + 2; i >= 2; i -= 2) items[at++] = s[i - 2]; // evens, last first
  for (std::size_t i = 1; i < s.size(); i += 2) items[at++] = s[i];
}

RLPT_NAMESPACE_END
#endif // RLPT_HEADER_IMPL()
