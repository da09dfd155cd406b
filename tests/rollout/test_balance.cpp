// SPDX-License-Identifier: Apache-2.0
// Rank balancing: partition properties (each item exactly once, equal counts, groups atomic,
// loads), refinement never worse, errors, and golden partitions from verl's own
// get_seqlen_balanced_partitions / get_group_balanced_partitions: rlpt's max load is never
// above verl's on the same inputs.
#include <rlpt/rollout/balance.hpp>
#include <rlpt/rollout/compat.hpp>
#include <rlpt/rollout/packing.hpp>

#include "support/errors.hpp"
#include "support/golden.hpp"
#include "support/random.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <queue>
#include <string>
#include <vector>

using namespace rlpt;

namespace {

std::vector<index_t> random_lengths(test::rng& r, index_t n, int dist) {
  std::vector<index_t> l(static_cast<std::size_t>(n));
  for (auto& x : l) {
    switch (dist) {
    case 0:
      x = 256 + static_cast<index_t>(std::exp(std::log(2000.0) + 0.8 * r.normal()));
      break;
    case 1:
      x = r.bernoulli(0.15) ? 16384 : 256 + static_cast<index_t>(std::exp(std::log(1500.0) + 0.9 * r.normal()));
      break;
    case 2:
      x = r.integer(256, 8192);
      break;
    default:
      x = r.integer(0, 3);
      break; // tiny, many ties and zeros
    }
    x = std::min<index_t>(x, 16384);
  }
  return l;
}

void check_partition(const partition& p, view<const double> w, index_t k, bool equal_count) {
  const index_t n = w.size();
  REQUIRE(p.num_parts() == k);
  REQUIRE(static_cast<index_t>(p.items.size()) == n);
  std::vector<int> seen(static_cast<std::size_t>(n), 0);
  for (index_t q = 0; q < k; ++q) {
    double load = 0.0;
    const auto part = p.part(q);
    CHECK(std::is_sorted(part.begin(), part.end()));
    for (const index_t i : part) {
      REQUIRE(i >= 0);
      REQUIRE(i < n);
      ++seen[static_cast<std::size_t>(i)];
      load += w[i];
    }
    CHECK(p.loads[static_cast<std::size_t>(q)] == doctest::Approx(load).epsilon(1e-12));
    if (equal_count) CHECK((part.size() == n / k || part.size() == n / k + 1));
  }
  CHECK(std::all_of(seen.begin(), seen.end(), [](int s) { return s == 1; }));
  if (equal_count) {
    index_t big = 0;
    for (index_t q = 0; q < k; ++q) big += p.part_size(q) == n / k + 1 && n % k != 0;
    CHECK(big == n % k);
  }
}

} // namespace

TEST_CASE("partitions: each item exactly once, equal counts when asked, loads are sums") {
  test::rng r(30);
  for (int dist = 0; dist < 4; ++dist)
    for (const index_t n : {1, 7, 64, 257, 1000})
      for (const index_t k : {1, 2, 3, 8, 13, 64})
        for (const bool equal : {true, false}) {
          const auto len = random_lengths(r, n, dist);
          std::vector<double> w(len.begin(), len.end());
          CAPTURE(dist);
          CAPTURE(n);
          CAPTURE(k);
          CAPTURE(equal);
          const partition kk = partition_weights(w, k, partition_algorithm::karmarkar_karp, equal, false);
          const partition lp = partition_weights(w, k, partition_algorithm::lpt, equal, false);
          const partition best = partition_weights(w, k, partition_algorithm::best, equal, true);
          const partition kk_refined = partition_weights(w, k, partition_algorithm::karmarkar_karp, equal, true);
          check_partition(kk, w, k, equal);
          check_partition(lp, w, k, equal);
          check_partition(best, w, k, equal);
          check_partition(kk_refined, w, k, equal);
          // best picks the better algorithm and refinement never raises the max load.
          CHECK(best.max_load() <= std::min(kk.max_load(), lp.max_load()));
          CHECK(kk_refined.max_load() <= kk.max_load());
          // The max load is at least the mean and the largest item.
          const double total = std::accumulate(w.begin(), w.end(), 0.0);
          const double largest = w.empty() ? 0.0 : *std::max_element(w.begin(), w.end());
          CHECK(best.max_load() >= std::max(total / static_cast<double>(k), largest) * (1 - 1e-12));
        }
}

TEST_CASE("Karmarkar-Karp differencing on a textbook input, and what refinement adds") {
  const std::vector<double> w{8, 7, 6, 5, 4};
  // KK: 8-7 -> 1; 6-5 -> 1; 4-1 -> 3; 3-1 -> 2: sums 16 / 14.
  const partition kk = partition_weights(w, 2, partition_algorithm::karmarkar_karp, false, false);
  CHECK(kk.max_load() == 16.0);
  CHECK(kk.min_load() == 14.0);
  // The optimum 15 / 15 ({8, 7} vs {6, 5, 4}) is one swap away.
  const partition best = partition_weights(w, 2, partition_algorithm::best, false, true);
  CHECK(best.max_load() == 15.0);
  CHECK(best.min_load() == 15.0);
}

TEST_CASE("count-capped LPT puts n % k extra items on distinct ranks") {
  const std::vector<double> w{10, 1, 1, 1, 1, 1, 1};
  const partition p = partition_weights(w, 3, partition_algorithm::lpt, true, false);
  check_partition(p, w, 3, true);
  // The heavy item's rank takes only two items; the remaining five ones spread 2 / 3.
  for (index_t q = 0; q < 3; ++q)
    if (std::find(p.part(q).begin(), p.part(q).end(), 0) != p.part(q).end()) CHECK(p.part_size(q) == 2);
  CHECK(p.max_load() == 11.0);
}

TEST_CASE("fewer items than ranks leaves empty parts instead of failing") {
  const std::vector<double> w{5, 3};
  for (const auto a : {partition_algorithm::karmarkar_karp, partition_algorithm::lpt, partition_algorithm::best}) {
    const partition p = partition_weights(w, 4, a, true, true);
    check_partition(p, w, 4, true);
    CHECK(p.max_load() == 5.0);
  }
  const std::vector<double> nothing;
  const partition none = partition_weights(nothing, 3);
  CHECK(none.num_parts() == 3);
  CHECK(none.max_load() == 0.0);
  CHECK(none.imbalance() == 1.0);
}

TEST_CASE("cost models and groups kept whole") {
  const cost_model verl = cost_model::attention();
  CHECK(verl(1000) == 24576.0 * 1000 + 1000.0 * 1000);
  CHECK(cost_model::tokens()(77) == 77.0);
  CHECK(cost_model::squared()(3) == 9.0);
  CHECK(cost_model::of([](index_t l) { return 2.0 * static_cast<double>(l) + 1; })(4) == 9.0);

  test::rng r(31);
  const index_t n_groups = 40, size = 8;
  const auto len = random_lengths(r, n_groups * size, 1);
  std::vector<std::int64_t> ids(len.size());
  for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<std::int64_t>((i * 7919) % n_groups); // scattered
  const groups g = groups::from_ids(ids);
  const partition p = balance_groups(len, g, {.ranks = 8, .cost = cost_model::tokens()});
  std::vector<double> w(len.begin(), len.end());
  REQUIRE(p.num_parts() == 8);
  std::vector<int> owner(len.size(), -1);
  for (index_t q = 0; q < 8; ++q) {
    CHECK(p.part_size(q) == 5 * size); // equal count of groups: 40 / 8
    for (const index_t i : p.part(q)) owner[static_cast<std::size_t>(i)] = static_cast<int>(q);
    double load = 0;
    for (const index_t i : p.part(q)) load += w[static_cast<std::size_t>(i)];
    CHECK(p.loads[static_cast<std::size_t>(q)] == load);
  }
  for (index_t k = 0; k < g.num_groups(); ++k)
    for (const index_t i : g.members(k))
      CHECK(owner[static_cast<std::size_t>(i)] == owner[static_cast<std::size_t>(g.members(k)[0])]);
  CHECK(std::count(owner.begin(), owner.end(), -1) == 0);
}

TEST_CASE("order_small_at_ends puts the cheap items first and last, in either of verl's orders") {
  const std::vector<double> cost{6, 1, 5, 2, 4, 3};
  std::vector<index_t> items{0, 1, 2, 3, 4, 5};
  order_small_at_ends(items, cost);
  // verl _balance_batch: ascending by cost 1 3 5 4 2 0; evens 1 5 2, then odds reversed 0 4 3.
  CHECK(items == std::vector<index_t>{1, 5, 2, 0, 4, 3});
  std::vector<index_t> mbs{0, 1, 2, 3, 4, 5};
  order_small_at_ends(mbs, cost, ends_order::microbatches);
  // verl rearrange_micro_batches: descending 0 2 4 5 3 1; the even positions reversed (3 4 0),
  // then the odd ones (2 5 1): an even count comes out reversed against the rank order.
  CHECK(mbs == std::vector<index_t>{3, 4, 0, 2, 5, 1});
  const std::vector<double> odd_cost{3, 2, 1};
  for (const ends_order how : {ends_order::rank, ends_order::microbatches}) {
    std::vector<index_t> odd{0, 1, 2};
    order_small_at_ends(odd, odd_cost, how);
    CHECK(odd == std::vector<index_t>{2, 0, 1}); // an odd count: both orders agree
  }
  // Equal costs: descending by the tie key (verl: the micro-batch's first sequence), and equal
  // keys (empty micro-batches, key 0) keep their order.
  std::vector<index_t> tied{0, 1, 2, 3, 4};
  const std::vector<double> tied_cost{1, 1, 1, 0, 0};
  const std::vector<index_t> first{7, 2, 9, 0, 0};
  order_small_at_ends(tied, tied_cost, ends_order::microbatches, first);
  // descending: 2 (9) 0 (7) 1 (2) 3 4; evens 2 1 4 reversed, then odds 0 3.
  CHECK(tied == std::vector<index_t>{4, 1, 2, 0, 3});
  const std::vector<index_t> short_ties{1};
  RLPT_CHECK_ERROR(order_small_at_ends(tied, tied_cost, ends_order::microbatches, short_ties), "rlpt.rollout.bad_items",
                   "1 tie keys for 5");
  RLPT_CHECK_ERROR(order_small_at_ends(tied, tied_cost, ends_order::rank, first), "rlpt.rollout.bad_items",
                   "5 tie keys for 5");
  RLPT_CHECK_ERROR(order_small_at_ends(tied, tied_cost, static_cast<ends_order>(7)), "rlpt.rollout.bad_option",
                   "ends_order code 7");
}

TEST_CASE("balancing errors name the offending value") {
  const std::vector<double> w12{1, 2}, w1m2{1, -2}, w1nan{1, std::nan("")};
  RLPT_CHECK_ERROR(partition_weights(w12, 0), "rlpt.rollout.bad_partition", "0 parts");
  RLPT_CHECK_ERROR(partition_weights(w1m2, 2), "rlpt.rollout.bad_cost", "item 1", "-2");
  RLPT_CHECK_ERROR(partition_weights(w1nan, 2), "rlpt.rollout.bad_cost", "item 1");
  const std::vector<index_t> l3m1{3, -1}, l34{3, 4}, l123{1, 2, 3};
  RLPT_CHECK_ERROR(balance(l3m1, {.ranks = 2}), "rlpt.rollout.bad_length", "sequence 1", "-1");
  RLPT_CHECK_ERROR(balance(l34, {.ranks = 2, .cost = cost_model::of([](index_t) { return -1.0; })}),
                   "rlpt.rollout.bad_cost", "item 0");
  const groups g = groups::uniform(4, 2);
  RLPT_CHECK_ERROR(balance_groups(l123, g), "rlpt.view.size_mismatch", "lengths");
  RLPT_CHECK_ERROR(partition_weights(w12, 2, static_cast<partition_algorithm>(7)), "rlpt.rollout.bad_option", "code 7");
}

TEST_CASE("golden: balance is never worse than verl get_seqlen_balanced_partitions, and its verl preset is verl") {
  const test::golden_file f(test::golden_path("rollout", "balance.bin"));
  const auto cases = f.get<index_t>("cases")[0];
  REQUIRE(cases > 0);
  int kk_same = 0, best_better = 0;
  for (index_t c = 0; c < cases; ++c) {
    const std::string p = fmt::format("c{}_", c);
    const auto len = f.get<index_t>(p + "lengths");
    const auto assign = f.get<index_t>(p + "assign");
    const auto params = f.get<index_t>(p + "params");
    const index_t k = params[0];
    const bool equal = params[1] != 0;
    CAPTURE(c);
    CAPTURE(k);
    CAPTURE(equal);
    const cost_model cost = cost_model::attention();
    std::vector<double> verl_load(static_cast<std::size_t>(k), 0.0);
    for (std::size_t i = 0; i < len.size(); ++i) verl_load[static_cast<std::size_t>(assign[i])] += cost(len[i]);
    const double verl_max = *std::max_element(verl_load.begin(), verl_load.end());

    const partition ours = balance(len, {.ranks = k, .equal_count = equal});
    std::vector<double> w(len.size());
    for (std::size_t i = 0; i < len.size(); ++i) w[i] = cost(len[i]);
    check_partition(ours, w, k, equal);
    CHECK(ours.max_load() <= verl_max);
    best_better += ours.max_load() < verl_max;

    // rlpt's KK alone (the verl preset) gives verl's partitions, item for item and in verl's
    // order of parts, ties included.
    balance_options kk = compat::verl::balance(k);
    kk.equal_count = equal;
    const partition mine = balance(len, kk);
    std::vector<index_t> owner(len.size(), -1);
    for (index_t part = 0; part < mine.num_parts(); ++part)
      for (const index_t i : mine.part(part)) owner[static_cast<std::size_t>(i)] = part;
    CHECK(std::equal(owner.begin(), owner.end(), assign.begin(), assign.end()));
    kk_same += std::equal(owner.begin(), owner.end(), assign.begin(), assign.end());
  }
  MESSAGE(cases, " verl cases: rlpt best strictly better on ", best_better, "; the verl preset gives verl's parts on ",
          kk_same);
}

TEST_CASE("golden: whole-group balance is never worse than verl get_group_balanced_partitions") {
  const test::golden_file f(test::golden_path("rollout", "groups.bin"));
  const auto cases = f.get<index_t>("cases")[0];
  for (index_t c = 0; c < cases; ++c) {
    const std::string p = fmt::format("c{}_", c);
    const auto len = f.get<index_t>(p + "lengths");
    const auto assign = f.get<index_t>(p + "assign");
    const auto params = f.get<index_t>(p + "params");
    const index_t k = params[0], size = params[1];
    CAPTURE(c);
    const cost_model cost = cost_model::attention();
    std::vector<double> verl_load(static_cast<std::size_t>(k), 0.0);
    for (std::size_t i = 0; i < len.size(); ++i) verl_load[static_cast<std::size_t>(assign[i])] += cost(len[i]);
    const double verl_max = *std::max_element(verl_load.begin(), verl_load.end());
    const groups g = groups::uniform(static_cast<index_t>(len.size()), size);
    const partition ours = balance_groups(len, g, {.ranks = k});
    CHECK(ours.max_load() <= verl_max);
    for (index_t q = 0; q < k; ++q) CHECK(ours.part_size(q) == static_cast<index_t>(len.size()) / k);
  }
}

namespace {
// (weight, index) pairs in index order, put heaviest first by detail::order_heaviest_first
// (-0.0 comes back as 0.0).
void sort_by_weight(std::vector<std::pair<double, index_t>>& v) {
  std::vector<double> w(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) w[i] = v[i].first == 0.0 ? 0.0 : v[i].first;
  std::vector<std::uint32_t> order;
  detail::order_heaviest_first(view<const double>(w.data(), static_cast<index_t>(w.size())), order);
  REQUIRE(order.size() == v.size());
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = {w[order[i]], static_cast<index_t>(order[i])};
}
} // namespace

TEST_CASE("the sort behind partitions puts items heaviest first, ties by index") {
  test::rng r(32);
  for (const std::size_t n : {std::size_t{100}, std::size_t{2048}, std::size_t{50000}}) {
    std::vector<std::pair<double, index_t>> v(n);
    for (std::size_t i = 0; i < n; ++i) {
      const double x = r.bernoulli(0.2) ? static_cast<double>(r.integer(0, 5)) // many ties, zeros
                                        : 24576.0 * static_cast<double>(r.integer(1, 16384)) + r.uniform(0, 1e9);
      v[i] = {x, static_cast<index_t>(i)};
    }
    auto want = v;
    std::sort(want.begin(), want.end(), [](const auto& a, const auto& b) {
      return a.first != b.first ? a.first > b.first : a.second < b.second;
    });
    sort_by_weight(v);
    CHECK(v == want);
  }
  // Integer-valued workloads (tokens, verl's 24576 L + L^2) with ties, zeros and -0.0 (equal to
  // 0.0): a stable sort by weight.
  for (const std::size_t n :
       {std::size_t{2}, std::size_t{47}, std::size_t{256}, std::size_t{1000}, std::size_t{2047}, std::size_t{5000}})
    for (const bool tokens : {false, true}) {
      CAPTURE(n);
      std::vector<std::pair<double, index_t>> v(n);
      for (std::size_t i = 0; i < n; ++i) {
        const auto l = static_cast<double>(r.bernoulli(0.1) ? 16384 : r.integer(0, 16384));
        double x = tokens ? l : 24576.0 * l + l * l;
        if (r.bernoulli(0.05)) x = r.bernoulli(0.5) ? -0.0 : 0.0;
        v[i] = {x, static_cast<index_t>(i)};
      }
      auto want = v;
      std::stable_sort(want.begin(), want.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
      sort_by_weight(v);
      REQUIRE(v.size() == want.size());
      bool same = true;
      for (std::size_t i = 0; i < n; ++i) same = same && v[i].first == want[i].first && v[i].second == want[i].second;
      CHECK(same);
    }
}

TEST_CASE("partitions do not depend on the sign of zero costs") {
  test::rng r(33);
  for (const index_t n : {index_t{300}, index_t{3000}}) {
    std::vector<double> pos(static_cast<std::size_t>(n)), neg;
    for (auto& x : pos) x = r.bernoulli(0.3) ? 0.0 : static_cast<double>(r.integer(1, 1000));
    neg = pos;
    for (auto& x : neg)
      if (x == 0.0 && r.bernoulli(0.5)) x = -0.0;
    for (const auto algo : {partition_algorithm::karmarkar_karp, partition_algorithm::lpt, partition_algorithm::best})
      for (const bool equal : {false, true}) {
        const partition a = partition_weights(pos, 8, algo, equal);
        const partition b = partition_weights(neg, 8, algo, equal);
        CHECK(a.offsets == b.offsets);
        CHECK(a.items == b.items);
      }
  }
}

namespace {

// Karmarkar–Karp written as plainly as possible (states hold their sets' item lists, full
// sorts, a std::priority_queue): the definition the optimised detail::kk_assign must match
// item for item, ties included. Ties are verl's (karmarkar_karp in verl/utils/seqlen_balancing.py):
// sets descending by (sum, item count, item list), states by (spread, largest set); the padding
// of equal counts (rlpt's, for n % k != 0) starts below real zero weights.
std::vector<index_t> plain_kk(const std::vector<double>& w, index_t k, bool equal_count) {
  struct set {
    double sum = 0.0;
    index_t count = 0;
    std::vector<index_t> items; // items[0] is the first item: the tie-breaker
  };
  auto before = [](const set& a, const set& b) {
    if (a.sum != b.sum) return a.sum > b.sum;
    if (a.count != b.count) return a.count > b.count;
    return a.items > b.items;
  };
  struct state {
    std::vector<set> sets; // non-empty, in set order
  };
  const auto n = static_cast<index_t>(w.size());
  auto starts_before = [&](const set& a, const set& b) { // a chunk's one-item sets: padding last
    const bool pa = a.items.front() >= n, pb = b.items.front() >= n;
    return pa != pb && a.sum == b.sum ? pb : before(a, b);
  };
  const index_t pad = equal_count ? (k - n % k) % k : 0;
  std::vector<std::pair<double, index_t>> order;
  for (index_t i = 0; i < pad; ++i) order.push_back({0.0, n + i});
  std::vector<std::pair<double, index_t>> real;
  for (index_t i = 0; i < n; ++i)
    real.push_back({w[static_cast<std::size_t>(i)] == 0.0 ? 0.0 : w[static_cast<std::size_t>(i)], i});
  std::sort(real.begin(), real.end());
  order.insert(order.end(), real.begin(), real.end());
  std::vector<state> states;
  const index_t chunk = equal_count ? k : 1;
  for (std::size_t at = 0; at < order.size(); at += static_cast<std::size_t>(chunk)) {
    state s;
    for (index_t i = 0; i < chunk; ++i) {
      const auto& [wt, item] = order[at + static_cast<std::size_t>(i)];
      s.sets.push_back({wt, 1, {item}});
    }
    std::sort(s.sets.begin(), s.sets.end(), starts_before);
    states.push_back(std::move(s));
  }
  auto spread = [&](const state& s) {
    return s.sets.front().sum - (static_cast<index_t>(s.sets.size()) < k ? 0.0 : s.sets.back().sum);
  };
  auto after = [&](std::size_t a, std::size_t b) { // priority_queue: max first
    const state& x = states[a];
    const state& y = states[b];
    if (spread(x) != spread(y)) return spread(x) < spread(y);
    return before(y.sets.front(), x.sets.front());
  };
  std::priority_queue<std::size_t, std::vector<std::size_t>, decltype(after)> heap(after);
  for (std::size_t i = 0; i < states.size(); ++i) heap.push(i);
  while (heap.size() > 1) {
    const std::size_t a = heap.top();
    heap.pop();
    const std::size_t b = heap.top();
    heap.pop();
    std::vector<set> x = states[a].sets, y = states[b].sets;
    x.resize(static_cast<std::size_t>(k)); // pad with empty sets: sum 0, count 0, no items
    y.resize(static_cast<std::size_t>(k));
    std::vector<set> merged;
    for (index_t i = 0; i < k; ++i) {
      set s = x[static_cast<std::size_t>(i)];
      const set& t = y[static_cast<std::size_t>(k - 1 - i)];
      if (s.items.empty() && t.items.empty()) continue;
      if (s.items.empty()) {
        merged.push_back(t);
        continue;
      }
      s.sum += t.sum;
      s.count += t.count;
      s.items.insert(s.items.end(), t.items.begin(), t.items.end());
      merged.push_back(std::move(s));
    }
    std::sort(merged.begin(), merged.end(), before);
    states[a] = {std::move(merged)};
    heap.push(a);
  }
  std::vector<index_t> owner(static_cast<std::size_t>(n), -1);
  const state& fin = states[heap.top()];
  for (std::size_t p = 0; p < fin.sets.size(); ++p)
    for (const index_t i : fin.sets[p].items)
      if (i < n) owner[static_cast<std::size_t>(i)] = static_cast<index_t>(p);
  return owner;
}

} // namespace

TEST_CASE("the optimised Karmarkar-Karp assigns every item as the plain definition does") {
  test::rng r(34);
  int cases = 0;
  for (const index_t n : {index_t{1}, index_t{7}, index_t{64}, index_t{255}, index_t{1000}, index_t{3001}})
    for (const index_t k : {index_t{1}, index_t{2}, index_t{8}, index_t{17}, index_t{64}})
      for (int dist = 0; dist < 4; ++dist)
        for (const bool equal : {true, false}) {
          CAPTURE(n);
          CAPTURE(k);
          CAPTURE(dist);
          CAPTURE(equal);
          const auto len = random_lengths(r, n, dist);
          std::vector<double> w(len.size());
          const cost_model cost = dist == 3 ? cost_model::tokens() : cost_model::attention();
          for (std::size_t i = 0; i < len.size(); ++i) w[i] = cost(len[i]);
          if (dist == 2 && n > 100) w[5] = 1e-300 * r.uniform(1, 2); // a key far below the others: long keys
          const std::vector<index_t> want = plain_kk(w, k, equal);
          CHECK(detail::kk_assign(w, k, equal) == want);
          ++cases;
          // balance() orders the items by their lengths, not their costs: the same partition.
          if (dist == 2 && n > 100) continue; // w[5] is not the cost of a length
          const partition by_length = balance(len, {.ranks = k,
                                                    .algorithm = partition_algorithm::karmarkar_karp,
                                                    .equal_count = equal,
                                                    .refine = false,
                                                    .cost = cost});
          const partition by_cost = detail::to_partition(want, k, w);
          CHECK(by_length.offsets == by_cost.offsets);
          CHECK(by_length.items == by_cost.items);
        }
  MESSAGE(cases, " cases");
}

TEST_CASE("ordering by length gives the costs' heaviest-first order, or declines") {
  test::rng r(35);
  // Whenever the length order is kept, it is the costs' order.
  auto kept = [&](const std::vector<index_t>& len, const cost_model& cost) {
    detail::length_hint hint;
    const std::vector<double> w = detail::costs_of(len, cost, &hint);
    std::vector<std::uint32_t> by_length, by_cost;
    const bool ok = detail::order_by_length(w, hint, by_length);
    detail::order_heaviest_first(w, by_cost);
    if (ok) CHECK(by_length == by_cost);
    return ok;
  };
  // Ranges of 0 to 31 bits take 0 to 4 radix passes; zeros and the cap make ties.
  for (const index_t n : {index_t{2}, index_t{255}, index_t{4099}})
    for (const int bits : {0, 1, 5, 8, 9, 15, 17, 24, 25, 31}) {
      CAPTURE(n);
      CAPTURE(bits);
      std::vector<index_t> len(static_cast<std::size_t>(n));
      const index_t base = r.integer(0, 100), top = (index_t{1} << bits) - 1;
      for (auto& x : len) x = base + (r.bernoulli(0.1) ? top : r.integer(0, top));
      const bool distinct = *std::min_element(len.begin(), len.end()) != *std::max_element(len.begin(), len.end());
      CHECK(kept(len, cost_model::tokens()));
      if (bits <= 25)
        CHECK(kept(len, cost_model::attention())); // exact below 2^53: strictly increasing
      else
        kept(len, cost_model::attention()); // L² rounds: ties of unequal lengths may decline
      const bool decreasing = kept(len, cost_model::of([](index_t l) { return 1e9 / (1.0 + static_cast<double>(l)); }));
      CHECK(decreasing == !distinct);
      kept(len, cost_model::of([base](index_t l) { return static_cast<double>(l == base ? 1 : 0); }));
    }
  // Ranges past 32 bits decline; balance() then sorts the costs.
  const std::vector<index_t> wide{1, index_t{1} << 40, 7};
  CHECK_FALSE(kept(wide, cost_model::tokens()));
  CHECK(balance(wide, {.ranks = 2}).max_load() == 24576.0 * 0x1p40 + 0x1p80);
}

TEST_CASE("the branchless key sort sorts") {
  test::rng r(36);
  for (const std::size_t n :
       {std::size_t{8}, std::size_t{16}, std::size_t{32}, std::size_t{64}, std::size_t{128}, std::size_t{256}})
    for (int rep = 0; rep < 40; ++rep) {
      CAPTURE(n);
      const auto real = static_cast<std::size_t>(r.integer(static_cast<index_t>(n / 2) + 1, static_cast<index_t>(n)));
      std::vector<std::uint64_t> keys(2 * n);
      for (std::size_t i = 0; i < real; ++i) // distinct: the position in the low bits; some values far apart
        keys[i] = (static_cast<std::uint64_t>(r.integer(0, rep % 2 ? 3 : (index_t{1} << 53))) << 9) | i;
      for (std::size_t i = real; i < n; ++i) keys[i] = std::uint64_t{std::numeric_limits<std::int64_t>::max()};
      std::vector<std::uint64_t> want(keys.begin(), keys.begin() + static_cast<std::ptrdiff_t>(n));
      std::sort(want.begin(), want.end());
      detail::sort_keys_branchless(keys.data(), keys.data() + n, n);
      CHECK(std::equal(want.begin(), want.end(), keys.begin()));
    }
}

TEST_CASE("balancing counts are bounded by the input: ranks = 2^40 is an error, not terabytes") {
  const std::vector<index_t> len{3, 4, 5};
  const std::vector<double> w{3, 4, 5};
  constexpr index_t huge = index_t{1} << 40;
  RLPT_CHECK_ERROR(balance(len, {.ranks = huge}), "rlpt.rollout.bad_partition", "parts = 1099511627776",
                   "number of items (3)", std::to_string(max_empty_parts));
  RLPT_CHECK_ERROR(partition_weights(w, huge), "rlpt.rollout.bad_partition", "parts = 1099511627776");
  const groups g = groups::uniform(3, 1);
  RLPT_CHECK_ERROR(balance_groups(len, g, {.ranks = huge}), "rlpt.rollout.bad_partition", "parts = 1099511627776");
  RLPT_CHECK_ERROR(balance(len, {.ranks = std::numeric_limits<index_t>::max()}), "rlpt.rollout.bad_partition",
                   "parts = 9223372036854775807");
  RLPT_CHECK_ERROR(plan_step(len, {.ranks = huge}), "rlpt.rollout.bad_partition", "parts = 1099511627776");
  // More ranks than items stay allowed (empty parts), up to max_empty_parts.
  const partition p = balance(len, {.ranks = 1000});
  CHECK(p.num_parts() == 1000);
  CHECK(p.items.size() == 3);
}

TEST_CASE("order_small_at_ends rejects items outside the costs") {
  const std::vector<double> cost{1, 2, 3};
  std::vector<index_t> items{0, 3, 1};
  RLPT_CHECK_ERROR(order_small_at_ends(items, cost), "rlpt.rollout.bad_items", "items[1] = 3", "3 costs");
  std::vector<index_t> negative{-1};
  RLPT_CHECK_ERROR(order_small_at_ends(negative, cost), "rlpt.rollout.bad_items", "items[0] = -1");
}
