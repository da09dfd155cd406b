// SPDX-License-Identifier: Apache-2.0
// Property test of the packing / balancing / layout / groups family on random, often hostile,
// input (issue 18): offsets that decrease, start elsewhere or hold 2^62; lengths that are
// negative or near index_t's limit; counts of 0, -1, 2^40 or INT64_MAX; costs that are NaN.
// Every call must give a valid result or throw rlpt::error: no other exception (a bad_alloc
// from an unbounded request counts as a failure), no crash, no undefined behaviour (the asan
// preset runs this file under ASan + UBSan). Valid results are checked against the invariants
// of their type. Seeded (RLPT_TEST_SEED overrides); RLPT_PROPERTY_ROUNDS scales the rounds.
#include <rlpt/core/groups.hpp>
#include <rlpt/core/layout.hpp>
#include <rlpt/core/views.hpp>
#include <rlpt/rollout/balance.hpp>
#include <rlpt/rollout/batch.hpp>
#include <rlpt/rollout/packing.hpp>

#include "helpers.hpp"
#include "support/random.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <typeinfo>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

using namespace rlpt;

namespace {

constexpr index_t big = std::numeric_limits<index_t>::max();

int rounds(int base) {
  const char* s = std::getenv("RLPT_PROPERTY_ROUNDS");
  const long scale = s != nullptr ? std::strtol(s, nullptr, 10) : 1;
  return base * static_cast<int>(std::max(1L, scale));
}

//! Outcome of one call: a valid result (then the invariants were checked) or an rlpt::error.
//! Anything else fails the test, naming the case.
template <class F> bool valid_or_error(const std::string& what, F&& f) {
  try {
    f();
    return true;
  } catch (const rlpt::error& e) {
    CHECK_MESSAGE(!e.message().empty(), what);
    CHECK_MESSAGE(e.id().rfind("rlpt.", 0) == 0, what, ": ", e.what());
    return false;
  } catch (const std::exception& e) {
    FAIL_CHECK(what << " threw " << typeid(e).name() << " (not rlpt::error): " << e.what());
  } catch (...) {
    FAIL_CHECK(what << " threw a non-standard exception");
  }
  return false;
}

//! A hostile integer: usually small, sometimes negative, at a power-of-two edge or the limit.
//! Large values are >= 2^32 - 1: beyond every bound (max_empty_parts, groups::max_items, int32
//! cu_seqlens). Values below a bound are valid requests, only slow to serve (a 2^30-sequence
//! group table is what the caller asked for), so they are left to the unit tests.
index_t hostile(test::rng& r, index_t small_hi) {
  switch (r.integer(0, 9)) {
  case 0:
    return -r.integer(1, 3);
  case 1:
    return 0;
  case 2:
    return big - r.integer(0, 1);
  case 3:
    return index_t{1} << r.integer(33, 62);
  case 4:
    return (index_t{1} << r.integer(32, 40)) + r.integer(-1, 1);
  default:
    return r.integer(1, small_hi);
  }
}

//! Lengths: mostly plausible, sometimes negative, huge, or 2^62 (sums overflow).
std::vector<index_t> lengths(test::rng& r, index_t n, bool nasty) {
  std::vector<index_t> l(static_cast<std::size_t>(n));
  for (auto& x : l) x = nasty && r.bernoulli(0.15) ? hostile(r, 4096) : r.integer(0, 4096);
  return l;
}

//! Offsets: valid cu_seqlens, or with one defect (decrease, wrong start, huge, empty).
std::vector<index_t> offsets(test::rng& r, index_t n, bool nasty) {
  std::vector<index_t> o(static_cast<std::size_t>(n) + 1, 0);
  for (std::size_t i = 1; i < o.size(); ++i) o[i] = o[i - 1] + r.integer(0, 40);
  if (!nasty) return o;
  switch (r.integer(0, 5)) {
  case 0:
    o.clear();
    break;
  case 1:
    o[0] = hostile(r, 5);
    break;
  case 2:
    if (o.size() > 1) o[static_cast<std::size_t>(r.integer(1, n))] = hostile(r, 100);
    break;
  case 3:
    o.back() = big;
    break;
  case 4:
    std::reverse(o.begin(), o.end());
    break;
  default:
    break;
  }
  return o;
}

//! Items: indices into n things, sometimes out of range or negative.
std::vector<index_t> items(test::rng& r, index_t n, bool nasty) {
  std::vector<index_t> it(static_cast<std::size_t>(r.integer(0, 2 * n + 2)));
  for (auto& x : it) x = nasty && r.bernoulli(0.1) ? hostile(r, n + 3) : r.integer(0, std::max<index_t>(n - 1, 0));
  if (!nasty) { // distinct when valid, as packing a micro-batch does
    std::sort(it.begin(), it.end());
    it.erase(std::unique(it.begin(), it.end()), it.end());
  }
  return it;
}

bool nondecreasing_from_zero(const std::vector<index_t>& o) {
  if (o.empty() || o[0] != 0) return false;
  for (std::size_t i = 1; i < o.size(); ++i)
    if (o[i] < o[i - 1]) return false;
  return true;
}

void check_partition(const partition& p, index_t n, index_t parts, bool equal_count) {
  REQUIRE(p.num_parts() == parts);
  REQUIRE(static_cast<index_t>(p.items.size()) == n);
  std::vector<int> seen(static_cast<std::size_t>(n), 0);
  index_t lo = big, hi = 0;
  for (index_t q = 0; q < parts; ++q) {
    const view<const index_t> part = p.part(q);
    CHECK(std::is_sorted(part.begin(), part.end()));
    for (const index_t i : part) {
      REQUIRE(i >= 0);
      REQUIRE(i < n);
      ++seen[static_cast<std::size_t>(i)];
    }
    lo = std::min(lo, part.size());
    hi = std::max(hi, part.size());
  }
  CHECK(std::all_of(seen.begin(), seen.end(), [](int s) { return s == 1; }));
  if (equal_count && parts > 0) CHECK(hi - lo <= 1);
}

void check_microbatches(const microbatch_plan& p, view<const index_t> len, const microbatch_options& o) {
  std::vector<int> seen(static_cast<std::size_t>(len.size()), 0);
  CHECK(p.num_microbatches() >= o.min_microbatches);
  CHECK(p.num_microbatches() % o.divisor == 0);
  for (index_t m = 0; m < p.num_microbatches(); ++m) {
    index_t tokens = 0;
    const view<const index_t> mb = p.microbatch(m);
    for (const index_t i : mb) {
      REQUIRE(i >= 0);
      REQUIRE(i < len.size());
      ++seen[static_cast<std::size_t>(i)];
      tokens += len[i];
    }
    CHECK(p.tokens[static_cast<std::size_t>(m)] == tokens);
    if (mb.size() > 1) CHECK(tokens <= o.token_budget);
  }
  CHECK(std::all_of(seen.begin(), seen.end(), [](int s) { return s == 1; }));
}

} // namespace

TEST_CASE("property: token layouts from hostile shapes and offsets are valid or rlpt::error") {
  test::rng r(9001);
  for (int round = 0; round < rounds(2000); ++round) {
    const bool nasty = r.bernoulli(0.6);
    const index_t B = nasty ? hostile(r, 64) : r.integer(0, 64);
    const index_t T = nasty ? hostile(r, 64) : r.integer(0, 64);
    const index_t stride = r.bernoulli(0.5) ? -1 : (nasty ? hostile(r, 128) : T + r.integer(0, 8));
    token_layout l;
    if (valid_or_error("padded(" + std::to_string(B) + ", " + std::to_string(T) + ", " + std::to_string(stride) + ")",
                       [&] { l = token_layout::padded(B, T, stride); })) {
      CHECK(l.num_seqs() == B);
      CHECK(l.max_len() == T);
      CHECK(l.row_stride() >= T);
      CHECK(l.storage_size() >= l.num_slots());
      if (B > 0 && T > 0) CHECK(l.at(B - 1, T - 1) < l.storage_size()); // the last slot is inside, no wrap
    }
    const std::vector<index_t> off = offsets(r, r.integer(0, 12), nasty);
    if (valid_or_error("packed", [&] { l = token_layout::packed(off); })) {
      CHECK(nondecreasing_from_zero(off));
      CHECK(l.num_seqs() == static_cast<index_t>(off.size()) - 1);
      CHECK(l.storage_size() == off.back());
      index_t longest = 0;
      for (index_t b = 0; b < l.num_seqs(); ++b) {
        CHECK(l.length(b) >= 0);
        CHECK(l.begin(b) + l.length(b) <= l.storage_size());
        longest = std::max(longest, l.length(b));
      }
      CHECK(l.max_len() == longest);
    }
  }
}

TEST_CASE("property: groups from hostile offsets, ids and sizes are valid or rlpt::error") {
  test::rng r(9002);
  for (int round = 0; round < rounds(2000); ++round) {
    const bool nasty = r.bernoulli(0.6);
    auto check = [](const groups& g) {
      const index_t n = g.num_items();
      std::vector<int> seen(static_cast<std::size_t>(n), 0);
      CHECK(g.offsets().size() == g.num_groups() + 1);
      for (index_t k = 0; k < g.num_groups(); ++k) {
        const view<const index_t> m = g.members(k);
        CHECK(m.size() == g.size(k));
        CHECK(std::is_sorted(m.begin(), m.end()));
        for (const index_t i : m) {
          REQUIRE(i >= 0);
          REQUIRE(i < n);
          ++seen[static_cast<std::size_t>(i)];
          CHECK(g.group_of(i) == k);
        }
      }
      CHECK(std::all_of(seen.begin(), seen.end(), [](int s) { return s == 1; }));
    };
    std::vector<index_t> off = offsets(r, r.integer(0, 10), nasty);
    if (!nasty) // groups are never empty
      for (std::size_t i = 1; i < off.size(); ++i) off[i] = off[i - 1] + 1 + (off[i] - off[i - 1]) % 5;
    groups g;
    if (valid_or_error("groups::from_offsets", [&] { g = groups::from_offsets(off); })) check(g);
    std::vector<std::int64_t> ids(static_cast<std::size_t>(r.integer(0, 30)));
    for (auto& id : ids) id = nasty ? hostile(r, 5) : r.integer(0, 5);
    if (valid_or_error("groups::from_ids", [&] { g = groups::from_ids(ids); })) check(g);
    const index_t n = nasty ? hostile(r, 40) : r.integer(0, 40), size = nasty ? hostile(r, 8) : r.integer(1, 8);
    if (valid_or_error("groups::uniform(" + std::to_string(n) + ", " + std::to_string(size) + ")",
                       [&] { g = groups::uniform(n, size); }))
      check(g);
  }
}

TEST_CASE("property: balancing hostile lengths, costs and rank counts is valid or rlpt::error") {
  test::rng r(9003);
  for (int round = 0; round < rounds(400); ++round) {
    const bool nasty = r.bernoulli(0.6);
    const index_t n = r.integer(0, 40);
    const std::vector<index_t> len = lengths(r, n, nasty);
    const index_t ranks = nasty ? hostile(r, 9) : r.integer(1, 9);
    const auto algorithm = static_cast<partition_algorithm>(r.integer(0, 2));
    const bool equal = r.bernoulli(0.5);
    const cost_model cost = r.bernoulli(0.5) ? cost_model::attention() : cost_model::tokens();
    const std::string what = "balance(n = " + std::to_string(n) + ", ranks = " + std::to_string(ranks) + ")";
    partition p;
    if (valid_or_error(what, [&] {
          p = balance(len, {.ranks = ranks, .algorithm = algorithm, .equal_count = equal, .cost = cost});
        }))
      check_partition(p, n, ranks, equal);

    std::vector<double> w(static_cast<std::size_t>(n));
    for (auto& x : w) x = nasty && r.bernoulli(0.1) ? (r.bernoulli(0.5) ? std::nan("") : -1.0) : r.uniform(0.0, 100.0);
    if (valid_or_error("partition_weights", [&] { p = partition_weights(w, ranks, algorithm, equal); }))
      check_partition(p, n, ranks, equal);

    if (n > 0) {
      const groups g = groups::uniform(n, n % 3 == 0 ? 3 : 1);
      if (valid_or_error("balance_groups", [&] { p = balance_groups(len, g, {.ranks = ranks, .cost = cost}); })) {
        REQUIRE(p.num_parts() == ranks);
        CHECK(static_cast<index_t>(p.items.size()) == n);
      }
    }
    std::vector<index_t> order = items(r, n, nasty);
    valid_or_error("order_small_at_ends", [&] { order_small_at_ends(order, w); });
  }
}

TEST_CASE("property: micro-batch and step plans of hostile input are valid or rlpt::error") {
  test::rng r(9004);
  for (int round = 0; round < rounds(400); ++round) {
    const bool nasty = r.bernoulli(0.6);
    const index_t n = r.integer(0, 40);
    const std::vector<index_t> len = lengths(r, n, nasty);
    const microbatch_options o{.token_budget = nasty ? hostile(r, 8192) : r.integer(1, 8192),
                               .algorithm = static_cast<pack_algorithm>(r.integer(0, 2)),
                               .min_microbatches = nasty ? hostile(r, 6) : r.integer(0, 6),
                               .divisor = nasty ? hostile(r, 4) : r.integer(1, 4),
                               .small_at_ends = r.bernoulli(0.5),
                               .kk_attempts = nasty ? hostile(r, 8) : r.integer(1, 8)};
    const std::string what =
        "plan_microbatches(n = " + std::to_string(n) + ", budget = " + std::to_string(o.token_budget) +
        ", min = " + std::to_string(o.min_microbatches) + ", divisor = " + std::to_string(o.divisor) + ")";
    microbatch_plan p;
    if (valid_or_error(what, [&] { p = plan_microbatches(len, o); })) check_microbatches(p, len, o);

    std::vector<index_t> loss(r.bernoulli(0.3) ? 0 : len.size());
    for (std::size_t i = 0; i < loss.size(); ++i)
      loss[i] = nasty && r.bernoulli(0.1) ? hostile(r, 10) : (len[i] > 0 ? r.integer(0, len[i]) : 0);
    const step_options so{.ranks = nasty ? hostile(r, 5) : r.integer(1, 5), .microbatch = o};
    step_plan sp;
    if (valid_or_error("plan_step", [&] { sp = plan_step(len, so, loss); })) {
      REQUIRE(static_cast<index_t>(sp.ranks.size()) == so.ranks);
      index_t tokens = 0, seqs = 0, trained = 0;
      std::vector<int> seen(len.size(), 0);
      for (const auto& rp : sp.ranks) {
        for (index_t m = 0; m < rp.microbatches.num_microbatches(); ++m) {
          index_t mb_tokens = 0;
          for (const index_t i : rp.microbatches.microbatch(m)) {
            REQUIRE(i >= 0);
            REQUIRE(i < n);
            ++seen[static_cast<std::size_t>(i)];
            CHECK(std::binary_search(rp.items.begin(), rp.items.end(), i));
            mb_tokens += len[static_cast<std::size_t>(i)];
          }
          if (rp.microbatches.microbatch(m).size() > 1) CHECK(mb_tokens <= o.token_budget);
        }
        tokens += rp.tokens;
        seqs += rp.sequences;
        trained += rp.loss_tokens;
        CHECK(rp.microbatches.num_microbatches() == sp.totals.microbatches_per_rank);
      }
      CHECK(std::all_of(seen.begin(), seen.end(), [](int c) { return c == 1; }));
      CHECK(sp.totals.tokens == std::accumulate(len.begin(), len.end(), index_t{0}));
      CHECK(sp.totals.tokens == tokens);
      CHECK(sp.totals.sequences == n);
      CHECK(sp.totals.sequences == seqs);
      CHECK(sp.totals.loss_tokens == trained);
      CHECK(sp.totals.loss_tokens == std::accumulate(loss.begin(), loss.end(), index_t{0}));
    }
  }
}

TEST_CASE("property: packing columns with hostile offsets, items and pads is valid or rlpt::error") {
  test::rng r(9005);
  std::vector<trajectory> recs;
  for (int i = 0; i < 7; ++i) recs.push_back(test::make_record(r, i, 0, r.integer(1, 4), r.integer(1, 9), i));
  const rollout_batch batch = rollout_batch::gather(recs, record_schema{});
  const std::vector<index_t> batch_offsets(batch.offsets().begin(), batch.offsets().end());
  for (int round = 0; round < rounds(2000); ++round) {
    const bool nasty = r.bernoulli(0.6);
    // pack(): items and padding against a real batch.
    const std::vector<index_t> it = items(r, batch.size(), nasty);
    const index_t pad = nasty ? hostile(r, 64) : r.integer(1, 64);
    packed_microbatch m;
    if (valid_or_error("pack(pad_to_multiple = " + std::to_string(pad) + ")",
                       [&] { m = pack(batch, it, {.pad_to_multiple = pad}); })) {
      REQUIRE(!m.cu_seqlens.empty());
      CHECK(m.cu_seqlens.front() == 0);
      CHECK(std::is_sorted(m.cu_seqlens.begin(), m.cu_seqlens.end()));
      CHECK(static_cast<index_t>(m.cu_seqlens.back()) == static_cast<index_t>(m.tokens.size()));
      CHECK(static_cast<index_t>(m.tokens.size()) % pad == 0);
      CHECK(m.info.tokens + m.info.pad_tokens == static_cast<index_t>(m.tokens.size()));
    }
    // pack_tokens / expand_per_sequence: their own offsets, items and destination sizes.
    const std::vector<index_t> off = offsets(r, r.integer(0, 8), nasty);
    const index_t width = nasty ? hostile(r, 3) : r.integer(1, 3);
    const index_t seqs = std::max<index_t>(static_cast<index_t>(off.size()) - 1, 0);
    const index_t total = nondecreasing_from_zero(off) ? off.back() : 0;
    std::vector<float> src(
        static_cast<std::size_t>(std::clamp<index_t>(total, 0, 4096) * std::clamp<index_t>(width, 1, 3)));
    std::iota(src.begin(), src.end(), 0.0f);
    std::vector<float> dst(static_cast<std::size_t>(r.integer(0, 400)), -1.0f);
    const std::vector<index_t> its = items(r, seqs, nasty);
    if (valid_or_error("pack_tokens", [&] { pack_tokens<float>(off, src, width, its, dst, 0.5f); })) {
      std::string case_;
      for (const index_t o : off) case_ += std::to_string(o) + " ";
      case_ += "| items ";
      for (const index_t i : its) case_ += std::to_string(i) + " ";
      case_ += "| width " + std::to_string(width);
      CAPTURE(case_);
      index_t at = 0;
      for (const index_t i : its)
        for (index_t e = off[static_cast<std::size_t>(i)] * width; e < off[static_cast<std::size_t>(i) + 1] * width;
             ++e)
          CHECK(dst[static_cast<std::size_t>(at++)] == src[static_cast<std::size_t>(e)]);
      for (auto u = static_cast<std::size_t>(at); u < dst.size(); ++u) CHECK(dst[u] == 0.5f);
    }
    std::vector<float> per_seq(static_cast<std::size_t>(nasty && r.bernoulli(0.2) ? r.integer(0, 9) : seqs), 2.0f);
    valid_or_error("expand_per_sequence", [&] { expand_per_sequence<float>(off, per_seq, its, dst, 0.0f); });
  }
}

TEST_CASE("property: views and subviews of hostile extents are valid or rlpt::error") {
  test::rng r(9006);
  std::vector<int> buf(64);
  for (int round = 0; round < rounds(4000); ++round) {
    view<int> v = buf;
    const index_t off = hostile(r, 70), count = hostile(r, 70);
    view<int> s;
    if (valid_or_error("subview", [&] { s = v.subview(off, count); })) {
      CHECK(s.data() >= buf.data());
      CHECK(s.data() + s.size() <= buf.data() + buf.size());
    }
    const index_t rows = hostile(r, 8), cols = hostile(r, 8), stride = hostile(r, 8);
    valid_or_error("view2d", [&] { static_cast<void>(view2d<int>(buf.data(), rows, cols)); });
    valid_or_error("view2d strided", [&] { static_cast<void>(view2d<int>(buf.data(), rows, cols, stride)); });
  }
}
