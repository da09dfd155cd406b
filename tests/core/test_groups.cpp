// SPDX-License-Identifier: Apache-2.0
#include <rlpt/core/groups.hpp>

#include "support/errors.hpp"
#include "support/random.hpp"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <map>
#include <thread>
#include <utility>
#include <vector>

namespace {
// The views a groups object returns borrow its arrays: from a temporary groups they would
// dangle (`for (auto i : groups::from_ids(ids).members(0))`), so that does not compile.
template <class G>
concept members_of = requires(G&& g) {
  std::forward<G>(g).members(0);
};
template <class G>
concept offsets_of = requires(G&& g) {
  std::forward<G>(g).offsets();
};
template <class G>
concept group_of_view = requires(G&& g) {
  std::forward<G>(g).group_of();
};
static_assert(!members_of<rlpt::groups>);
static_assert(!offsets_of<rlpt::groups>);
static_assert(!group_of_view<rlpt::groups>);
static_assert(members_of<const rlpt::groups&> && offsets_of<rlpt::groups&> && group_of_view<const rlpt::groups&>);
} // namespace

TEST_CASE("groups from ids: any order, ragged, first-appearance numbering, ascending members") {
  std::vector<std::int64_t> ids{42, 7, 42, 9, 7, 42};
  const auto g = rlpt::groups::from_ids(ids);
  CHECK(g.num_groups() == 3);
  CHECK(g.num_items() == 6);
  CHECK(g.id(0) == 42);
  CHECK(g.id(1) == 7);
  CHECK(g.id(2) == 9);
  CHECK(g.size(0) == 3);
  CHECK(g.size(2) == 1);
  const auto m = g.members(0);
  CHECK(std::vector<rlpt::index_t>(m.begin(), m.end()) == std::vector<rlpt::index_t>{0, 2, 5});
  CHECK(g.group_of(4) == 1);
  RLPT_CHECK_ERROR(g.expect_items("rewards", 5), "rlpt.view.size_mismatch", "rewards has 5 elements, expected 6");
}

TEST_CASE("groups from ids: every item in exactly one group (random property)") {
  rlpt::test::rng r(3);
  for (int trial = 0; trial < 20; ++trial) {
    const auto n = static_cast<std::size_t>(r.integer(0, 300));
    std::vector<std::int64_t> ids(n);
    for (auto& id : ids) id = r.integer(-5, 40);
    const auto g = rlpt::groups::from_ids(ids);
    std::vector<int> seen(n, 0);
    for (rlpt::index_t k = 0; k < g.num_groups(); ++k) {
      const auto m = g.members(k);
      CHECK(std::is_sorted(m.begin(), m.end()));
      for (auto i : m) {
        ++seen[static_cast<std::size_t>(i)];
        CHECK(ids[static_cast<std::size_t>(i)] == g.id(k));
        CHECK(g.group_of(i) == k);
      }
    }
    CHECK(std::all_of(seen.begin(), seen.end(), [](int s) { return s == 1; }));
  }
}

TEST_CASE("groups from offsets and uniform groups") {
  std::vector<rlpt::index_t> off{0, 2, 5, 6};
  const auto g = rlpt::groups::from_offsets(off);
  CHECK(g.num_groups() == 3);
  CHECK(g.size(1) == 3);
  CHECK(g.group_of(5) == 2);
  const auto u = rlpt::groups::uniform(12, 4);
  CHECK(u.num_groups() == 3);
  CHECK(u.members(2)[0] == 8);
  RLPT_CHECK_ERROR(rlpt::groups::uniform(10, 4), "rlpt.groups.bad_size", "10 sequences", "groups of 4");
  std::vector<rlpt::index_t> empty_group{0, 2, 2};
  RLPT_CHECK_ERROR(rlpt::groups::from_offsets(empty_group), "rlpt.groups.bad_offsets", "group 1 is empty");
  std::vector<rlpt::index_t> bad_start{1, 2};
  RLPT_CHECK_ERROR(rlpt::groups::from_offsets(bad_start), "rlpt.groups.bad_offsets", "first 1");
  std::vector<rlpt::index_t> reversed{0, 5, 3};
  RLPT_CHECK_ERROR(rlpt::groups::from_offsets(reversed), "rlpt.groups.bad_offsets", "group 1 is empty or reversed",
                   "offsets[1] = 5, offsets[2] = 3");
}

TEST_CASE("groups that would allocate beyond their limit are errors, not terabyte allocations") {
  // Offsets and uniform sizes imply one entry per sequence; nothing bounds them but a limit.
  std::vector<rlpt::index_t> huge{0, rlpt::index_t{1} << 40};
  RLPT_CHECK_ERROR(rlpt::groups::from_offsets(huge), "rlpt.groups.bad_offsets", "1099511627776 sequences",
                   std::to_string(rlpt::groups::max_items));
  RLPT_CHECK_ERROR(rlpt::groups::uniform(rlpt::index_t{1} << 40, 1), "rlpt.groups.bad_size", "1099511627776 sequences");
  CHECK(rlpt::groups::uniform(0, 3).num_groups() == 0);
}

namespace {
// The definition from_ids must reproduce: a map from id to group (numbered by first appearance),
// members ascending.
struct reference_groups {
  std::vector<std::int64_t> ids;
  std::vector<std::vector<rlpt::index_t>> members;
  std::vector<rlpt::index_t> group_of;
};

reference_groups reference_from_ids(const std::vector<std::int64_t>& ids) {
  reference_groups g;
  std::map<std::int64_t, rlpt::index_t> number;
  for (std::size_t i = 0; i < ids.size(); ++i) {
    const auto [it, fresh] = number.try_emplace(ids[i], static_cast<rlpt::index_t>(g.ids.size()));
    if (fresh) {
      g.ids.push_back(ids[i]);
      g.members.emplace_back();
    }
    g.members[static_cast<std::size_t>(it->second)].push_back(static_cast<rlpt::index_t>(i));
    g.group_of.push_back(it->second);
  }
  return g;
}

void check_against_reference(const std::vector<std::int64_t>& ids) {
  const auto g = rlpt::groups::from_ids(ids);
  const reference_groups want = reference_from_ids(ids);
  REQUIRE(g.num_groups() == static_cast<rlpt::index_t>(want.ids.size()));
  REQUIRE(g.num_items() == static_cast<rlpt::index_t>(ids.size()));
  const auto offsets = g.offsets();
  REQUIRE(offsets.size() == g.num_groups() + 1);
  CHECK(offsets[0] == 0);
  for (rlpt::index_t k = 0; k < g.num_groups(); ++k) {
    const auto& m = want.members[static_cast<std::size_t>(k)];
    CHECK(g.id(k) == want.ids[static_cast<std::size_t>(k)]);
    CHECK(g.size(k) == static_cast<rlpt::index_t>(m.size()));
    CHECK(offsets[k + 1] - offsets[k] == g.size(k));
    const auto got = g.members(k);
    CHECK(std::vector<rlpt::index_t>(got.begin(), got.end()) == m);
  }
  const auto group_of = g.group_of();
  CHECK(std::vector<rlpt::index_t>(group_of.begin(), group_of.end()) == want.group_of);
  std::vector<rlpt::index_t> flat;
  for (const auto& m : want.members) flat.insert(flat.end(), m.begin(), m.end());
  const auto members = g.members();
  CHECK(std::vector<rlpt::index_t>(members.begin(), members.end()) == flat);
}
} // namespace

TEST_CASE("groups from ids: random ids (extremes, runs, interleaving, colliding hashes) match a map reference") {
  rlpt::test::rng r(17);
  constexpr std::int64_t lo = std::numeric_limits<std::int64_t>::min(), hi = std::numeric_limits<std::int64_t>::max();
  const std::vector<std::int64_t> special = {lo, hi, 0, -1, 1, lo + 1, hi - 1};
  for (int trial = 0; trial < 300; ++trial) {
    CAPTURE(trial);
    const auto n = static_cast<std::size_t>(r.integer(0, trial < 250 ? 200 : 5000));
    const int kind = trial % 5;
    std::vector<std::int64_t> ids;
    while (ids.size() < n) {
      std::int64_t id = 0;
      switch (kind) {
      case 0:
        id = special[static_cast<std::size_t>(r.integer(0, 6))];
        break; // extremes only
      case 1:
        id = r.integer(lo, hi);
        break; // all distinct
      case 2:
        id = r.integer(-3, 3);
        break; // few groups, interleaved
      case 3:
        id = r.integer(0, 40) << 58;
        break; // low bits equal
      default:
        id = r.bernoulli(0.2) ? special[static_cast<std::size_t>(r.integer(0, 6))] : r.integer(-1000, 1000);
      }
      const auto run = static_cast<std::size_t>(r.integer(1, 8)); // adjacent members: the common layout
      for (std::size_t k = 0; k < run && ids.size() < n; ++k) ids.push_back(id);
    }
    check_against_reference(ids);
  }
  // Contiguous groups in order (the in-order fast path) and the same ids coming back later.
  std::vector<std::int64_t> ids;
  for (std::int64_t k = 0; k < 1000; ++k)
    for (int j = 0; j < 4; ++j) ids.push_back(k * 7919 - 500);
  check_against_reference(ids);
  ids.push_back(ids.front());
  check_against_reference(ids);
  check_against_reference({});
  check_against_reference({lo});
  check_against_reference({hi, lo, hi, lo});
}

TEST_CASE("count_runs (from_ids sizes its table by it) matches the plain loop: ids equal in one 32-bit half") {
  // A count below the truth would leave from_ids' open-addressing table too small for its groups.
  const auto plain = [](const std::vector<std::int64_t>& ids) {
    rlpt::index_t runs = 1;
    for (std::size_t i = 1; i < ids.size(); ++i) runs += ids[i] != ids[i - 1] ? 1 : 0;
    return runs;
  };
  const auto count = [](const std::vector<std::int64_t>& ids) {
    return rlpt::detail::count_runs(ids.data(), static_cast<rlpt::index_t>(ids.size()));
  };
  rlpt::test::rng r(29);
  for (int trial = 0; trial < 400; ++trial) {
    CAPTURE(trial);
    const auto n = static_cast<std::size_t>(r.integer(1, 70));
    std::vector<std::int64_t> ids(n);
    const std::int64_t hi = r.integer(0, 3), lo = r.integer(0, 3);
    for (auto& id : ids) {
      switch (trial % 4) {
      case 0: // the low halves equal, the high ones differ
        id = r.integer(0, hi) * (std::int64_t{1} << 32) + lo;
        break;
      case 1: // the high halves equal, the low ones differ
        id = hi * (std::int64_t{1} << 32) + r.integer(0, lo + 1);
        break;
      case 2: // both may differ; negatives set every high bit
        id = r.integer(-2, 2) * (std::int64_t{1} << 32) + r.integer(-2, 2);
        break;
      default:
        id = r.bernoulli(0.7) && &id != ids.data() ? *(&id - 1) : r.integer(-5, 5);
      }
    }
    CHECK(count(ids) == plain(ids));
  }
  // Across a flush of the int32 lane sums (every 2^24 ids; an overflow would need 2^32 of them).
  const std::vector<std::int64_t> same((std::size_t{1} << 24) + 5, 7);
  CHECK(count(same) == 1);
  std::vector<std::int64_t> two = same;
  two.back() = 8;
  CHECK(count(two) == 2);
}

TEST_CASE("groups are values: copies and moves keep every array") {
  const std::vector<std::int64_t> ids{5, 5, 9, 5, 9, 1};
  const auto g = rlpt::groups::from_ids(ids);
  const rlpt::groups copy = g;
  rlpt::groups moved = rlpt::groups::from_ids(ids);
  rlpt::groups target;
  CHECK(target.num_groups() == 0);
  CHECK(target.offsets().size() == 1);
  target = std::move(moved);
  for (const rlpt::groups* x : {&copy, static_cast<const rlpt::groups*>(&target)}) {
    CHECK(x->num_groups() == 3);
    CHECK(x->id(2) == 1);
    const auto m = x->members(0);
    CHECK(std::vector<rlpt::index_t>(m.begin(), m.end()) == std::vector<rlpt::index_t>{0, 1, 3});
    CHECK(x->group_of(4) == 1);
  }
}

TEST_CASE("contiguous groups write members and group_of on first use, once, whoever asks first") {
  // from_ids in runs (each run a new group), from_offsets and uniform leave the two arrays for
  // their first reader; copies and moves taken before that read still hold the right arrays.
  std::vector<std::int64_t> ids;
  std::vector<rlpt::index_t> offsets{0};
  for (std::int64_t k = 0; k < 300; ++k) {
    const auto size = static_cast<int>(1 + k % 5);
    for (int j = 0; j < size; ++j) ids.push_back(1000 - 3 * k);
    offsets.push_back(static_cast<rlpt::index_t>(ids.size()));
  }
  const auto n = static_cast<rlpt::index_t>(ids.size());
  auto expect_arrays = [&](const rlpt::groups& g) {
    REQUIRE(g.contiguous());
    REQUIRE(g.num_groups() == 300);
    const auto m = g.members();
    const auto of = g.group_of();
    REQUIRE(m.size() == n);
    bool ok = true;
    for (rlpt::index_t k = 0; k < 300; ++k)
      for (rlpt::index_t i = offsets[static_cast<std::size_t>(k)]; i < offsets[static_cast<std::size_t>(k) + 1]; ++i)
        ok &= m[i] == i && of[i] == k && g.group_of(i) == k;
    CHECK(ok);
  };
  for (int source = 0; source < 2; ++source) {
    CAPTURE(source);
    auto make = [&] { return source == 0 ? rlpt::groups::from_ids(ids) : rlpt::groups::from_offsets(offsets); };
    const rlpt::groups g = make();
    const rlpt::groups copy = g; // before any reader: the copy fills the source first
    rlpt::groups source_of_move = make();
    const rlpt::groups moved = std::move(source_of_move);
    CHECK(source_of_move.num_groups() == 0); // moved-from: empty, still usable
    CHECK(source_of_move.members().size() == 0);
    expect_arrays(copy);
    expect_arrays(moved);
    // Eight threads ask a fresh object at once: one writes, the others wait for it.
    const rlpt::groups fresh = make();
    std::vector<int> good(8, 0);
    std::vector<std::thread> threads;
    for (int t = 0; t < 8; ++t)
      threads.emplace_back([&, t] {
        const auto m = t % 2 == 0 ? fresh.members(fresh.num_groups() - 1) : fresh.members();
        const auto of = fresh.group_of();
        good[static_cast<std::size_t>(t)] = m[m.size() - 1] == n - 1 && of[n - 1] == 299 && of[0] == 0;
      });
    for (auto& th : threads) th.join();
    CHECK(std::count(good.begin(), good.end(), 1) == 8);
    expect_arrays(fresh);
  }
}

TEST_CASE("groups from ids: a group seen again after runs in order writes group_of of the runs before it") {
  const std::vector<std::int64_t> ids{3, 3, 4, 4, 4, 3, 8};
  const auto g = rlpt::groups::from_ids(ids);
  CHECK_FALSE(g.contiguous());
  const auto of = g.group_of();
  CHECK(std::vector<rlpt::index_t>(of.begin(), of.end()) == std::vector<rlpt::index_t>{0, 0, 1, 1, 1, 0, 2});
  const auto m = g.members(0);
  CHECK(std::vector<rlpt::index_t>(m.begin(), m.end()) == std::vector<rlpt::index_t>{0, 1, 5});
}
