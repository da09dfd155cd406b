// SPDX-License-Identifier: Apache-2.0
#include <rlpt/core/groups.hpp>

#include "support/errors.hpp"
#include "support/random.hpp"

#include <algorithm>
#include <map>
#include <utility>
#include <vector>

namespace {
// The views a groups object returns borrow its arrays: from a temporary groups they would
// dangle (`for (auto i : groups::from_ids(ids).members(0))`), so that does not compile.
template <class G>
concept members_of = requires(G&& g) { std::forward<G>(g).members(0); };
template <class G>
concept offsets_of = requires(G&& g) { std::forward<G>(g).offsets(); };
template <class G>
concept group_of_view = requires(G&& g) { std::forward<G>(g).group_of(); };
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
