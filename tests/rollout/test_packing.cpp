// SPDX-License-Identifier: Apache-2.0
// Micro-batch planning (cap never exceeded, singleton fallback, forced counts, divisors),
// the whole-step planner (balanced ranks, equal micro-batch counts, global denominators),
// golden comparison with verl's rearrange_micro_batches, and the packed varlen layout.
#include <rlpt/rollout/compat.hpp>
#include <rlpt/rollout/packing.hpp>

#include "helpers.hpp"
#include "support/errors.hpp"
#include "support/golden.hpp"
#include "support/random.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

using namespace rlpt;

namespace {

std::vector<index_t> lengths(test::rng& r, index_t n, index_t hi) {
  std::vector<index_t> l(static_cast<std::size_t>(n));
  for (auto& x : l)
    x = r.bernoulli(0.1) ? r.integer(hi / 2, hi)
                         : std::min<index_t>(hi, 1 + static_cast<index_t>(std::exp(r.normal(6.0, 1.0))));
  return l;
}

// Each item exactly once; every micro-batch within the budget unless it is a lone oversize item.
void check_plan(const microbatch_plan& p, view<const index_t> len, const microbatch_options& o) {
  std::vector<int> seen(static_cast<std::size_t>(len.size()), 0);
  index_t oversize = 0, empty = 0;
  for (index_t m = 0; m < p.num_microbatches(); ++m) {
    const auto mb = p.microbatch(m);
    index_t tokens = 0;
    for (const index_t i : mb) {
      REQUIRE(i >= 0);
      REQUIRE(i < len.size());
      ++seen[static_cast<std::size_t>(i)];
      tokens += len[i];
    }
    CHECK(p.tokens[static_cast<std::size_t>(m)] == tokens);
    if (mb.size() == 1 && tokens > o.token_budget)
      ++oversize;
    else
      CHECK(tokens <= o.token_budget);
    empty += mb.empty();
  }
  CHECK(std::all_of(seen.begin(), seen.end(), [](int s) { return s == 1; }));
  CHECK(p.oversize == oversize);
  CHECK(p.empty == empty);
  CHECK(p.num_microbatches() % o.divisor == 0);
  CHECK(p.num_microbatches() >= o.min_microbatches);
  index_t regular = 0;
  for (const index_t l : len) regular += l <= o.token_budget ? l : 0;
  CHECK(p.num_microbatches() - oversize >= detail::ceil_div(regular, o.token_budget));
}

} // namespace

TEST_CASE("micro-batches never exceed the token budget (KK, FFD and first fit, forced counts, divisors)") {
  test::rng r(40);
  for (const auto alg : {pack_algorithm::karmarkar_karp, pack_algorithm::ffd, pack_algorithm::first_fit})
    for (const index_t n : {1, 5, 64, 300})
      for (const index_t budget : {512, 4096, 16384})
        for (const index_t minimum : {1, 3, 17})
          for (const index_t divisor : {1, 2, 4}) {
            const auto len = lengths(r, n, budget * 5 / 4); // ~some longer than the budget
            const microbatch_options o{.token_budget = budget,
                                       .algorithm = alg,
                                       .min_microbatches = minimum,
                                       .divisor = divisor,
                                       .small_at_ends = r.bernoulli(0.5)};
            CAPTURE(n);
            CAPTURE(budget);
            CAPTURE(minimum);
            CAPTURE(divisor);
            const microbatch_plan p = plan_microbatches(len, o);
            check_plan(p, len, o);
            // Deterministic.
            const microbatch_plan again = plan_microbatches(len, o);
            CHECK(again.items == p.items);
            CHECK(again.offsets == p.offsets);
          }
}

TEST_CASE("first fit keeps the input order: OpenRLHF's get_minimum_num_micro_batch_size, bin for bin") {
  // The reference scans the open bins left to right for each sequence, in input order, and
  // opens a bin when none fits; a sequence over the budget fills a bin of its own.
  const auto reference = [](const std::vector<index_t>& len, index_t cap) {
    std::vector<index_t> load;
    std::vector<std::vector<index_t>> bins;
    for (std::size_t i = 0; i < len.size(); ++i) {
      std::size_t b = 0;
      while (b < load.size() && load[b] + len[i] > cap) ++b;
      if (b == load.size()) {
        load.push_back(0);
        bins.emplace_back();
      }
      load[b] += len[i];
      bins[b].push_back(static_cast<index_t>(i));
    }
    return bins;
  };
  test::rng r(41);
  for (const index_t n : {0, 1, 2, 7, 64, 500})
    for (const index_t budget : {1, 9, 512, 4096}) {
      auto len = lengths(r, n, budget * 5 / 4 + 1);
      for (auto& l : len)
        if (r.bernoulli(0.05)) l = 0; // empty sequences fit anywhere
      CAPTURE(n);
      CAPTURE(budget);
      const microbatch_options o{.token_budget = budget,
                                 .algorithm = pack_algorithm::first_fit,
                                 .min_microbatches = 0,
                                 .small_at_ends = false};
      const microbatch_plan p = plan_microbatches(len, o);
      check_plan(p, len, o);
      auto want = reference(len, budget);
      REQUIRE(p.num_microbatches() == static_cast<index_t>(want.size()));
      // Same bins (rlpt orders micro-batches by their first sequence, as the reference opens them).
      for (index_t m = 0; m < p.num_microbatches(); ++m) {
        const auto mb = p.microbatch(m);
        CHECK(std::vector<index_t>(mb.begin(), mb.end()) == want[static_cast<std::size_t>(m)]);
      }
    }
  // Order matters: FFD packs [3, 3, 3, 7, 7, 7] into 3 bins of 10, first fit in order into 4.
  const std::vector<index_t> len{3, 3, 3, 7, 7, 7};
  CHECK(plan_microbatches(len, {.token_budget = 10, .algorithm = pack_algorithm::first_fit}).num_microbatches() == 4);
  CHECK(plan_microbatches(len, {.token_budget = 10, .algorithm = pack_algorithm::ffd}).num_microbatches() == 3);
}

TEST_CASE("the verl KK counterexample: C = 8, L = [7] * 8 needs 8 micro-batches, never one of 14") {
  const std::vector<index_t> len(8, 7);
  const microbatch_options o{.token_budget = 8};
  const microbatch_plan p = plan_microbatches(len, o);
  check_plan(p, len, o);
  CHECK(p.num_microbatches() == 8);
  CHECK(p.max_tokens() == 7);
}

TEST_CASE("a sequence longer than the budget becomes its own micro-batch") {
  const std::vector<index_t> len{20, 3, 3, 4};
  const microbatch_options o{.token_budget = 10};
  const microbatch_plan p = plan_microbatches(len, o);
  check_plan(p, len, o);
  CHECK(p.oversize == 1);
  CHECK(p.num_microbatches() == 2);
  CHECK(p.max_tokens() == 20);
}

TEST_CASE("a forced count larger than the items gives explicit empty micro-batches") {
  const std::vector<index_t> len{5, 6};
  const microbatch_options o{.token_budget = 100, .min_microbatches = 5};
  const microbatch_plan p = plan_microbatches(len, o);
  check_plan(p, len, o);
  CHECK(p.num_microbatches() == 5);
  CHECK(p.empty == 3);
  const std::vector<index_t> nothing;
  CHECK(plan_microbatches(nothing, {}).num_microbatches() == 1);
}

TEST_CASE("small micro-batches sit at both ends (verl use_dynamic_bsz_balance)") {
  test::rng r(41);
  const auto len = lengths(r, 200, 4096);
  const microbatch_options o{.token_budget = 4096, .cost = cost_model::tokens()};
  const microbatch_plan p = plan_microbatches(len, o);
  // Costs rise to a peak then fall.
  const auto& t = p.tokens;
  const auto peak = static_cast<std::size_t>(std::max_element(t.begin(), t.end()) - t.begin());
  CHECK(std::is_sorted(t.begin(), t.begin() + static_cast<std::ptrdiff_t>(peak) + 1));
  CHECK(std::is_sorted(t.rbegin(), t.rend() - static_cast<std::ptrdiff_t>(peak)));
}

TEST_CASE("micro-batch option errors") {
  const std::vector<index_t> len{1, 2};
  RLPT_CHECK_ERROR(plan_microbatches(len, {.token_budget = 0}), "rlpt.rollout.bad_option", "token_budget");
  RLPT_CHECK_ERROR(plan_microbatches(len, {.divisor = 0}), "rlpt.rollout.bad_option", "divisor (0)");
  const std::vector<index_t> negative{4, -3};
  RLPT_CHECK_ERROR(plan_microbatches(negative), "rlpt.rollout.bad_length", "sequence 1", "-3");
  RLPT_CHECK_ERROR(plan_microbatches(len, {.algorithm = static_cast<pack_algorithm>(9)}), "rlpt.rollout.bad_option",
                   "code 9");
}

TEST_CASE("plan_step: balanced ranks, equal micro-batch counts, global denominators") {
  test::rng r(42);
  for (int trial = 0; trial < 20; ++trial) {
    const index_t ranks = r.integer(1, 8);
    const index_t group_size = r.integer(1, 8);
    const index_t n_groups = r.integer(ranks, 6 * ranks);
    const index_t n = n_groups * group_size;
    const auto len = lengths(r, n, 8192);
    std::vector<index_t> loss(len.size());
    for (std::size_t i = 0; i < len.size(); ++i) loss[i] = r.bernoulli(0.1) ? 0 : r.integer(0, len[i]);
    const groups g = groups::uniform(n, group_size);
    const bool atomic = r.bernoulli(0.5);
    const step_options o{.ranks = ranks,
                         .groups_atomic = atomic,
                         .microbatch = {.token_budget = 8192, .divisor = r.bernoulli(0.3) ? 2 : 1}};
    CAPTURE(trial);
    const step_plan plan = plan_step(len, o, loss, &g);
    REQUIRE(static_cast<index_t>(plan.ranks.size()) == ranks);
    std::vector<int> seen(len.size(), 0), owner(len.size(), -1);
    index_t tokens = 0, loss_tokens = 0, loss_seqs = 0;
    for (index_t q = 0; q < ranks; ++q) {
      const rank_plan& rp = plan.ranks[static_cast<std::size_t>(q)];
      CHECK(rp.microbatches.num_microbatches() == plan.totals.microbatches_per_rank);
      std::vector<index_t> from_mbs = rp.microbatches.items;
      std::sort(from_mbs.begin(), from_mbs.end());
      CHECK(from_mbs == rp.items);
      std::vector<index_t> rank_len;
      for (const index_t i : rp.items) {
        ++seen[static_cast<std::size_t>(i)];
        owner[static_cast<std::size_t>(i)] = static_cast<int>(q);
      }
      for (index_t m = 0; m < rp.microbatches.num_microbatches(); ++m) {
        index_t t = 0;
        for (const index_t i : rp.microbatches.microbatch(m)) t += len[static_cast<std::size_t>(i)];
        CHECK(t == rp.microbatches.tokens[static_cast<std::size_t>(m)]);
        CHECK((t <= 8192 || rp.microbatches.microbatch(m).size() == 1));
      }
      index_t rt = 0, rl = 0;
      for (const index_t i : rp.items) {
        rt += len[static_cast<std::size_t>(i)];
        rl += loss[static_cast<std::size_t>(i)];
        loss_seqs += loss[static_cast<std::size_t>(i)] > 0;
      }
      CHECK(rp.tokens == rt);
      CHECK(rp.loss_tokens == rl);
      tokens += rt;
      loss_tokens += rl;
    }
    CHECK(std::all_of(seen.begin(), seen.end(), [](int s) { return s == 1; }));
    CHECK(plan.totals.tokens == tokens);
    CHECK(plan.totals.tokens == std::accumulate(len.begin(), len.end(), index_t{0}));
    CHECK(plan.totals.loss_tokens == loss_tokens);
    CHECK(plan.totals.loss_sequences == loss_seqs);
    CHECK(plan.totals.sequences == n);
    if (atomic)
      for (index_t k = 0; k < g.num_groups(); ++k)
        for (const index_t i : g.members(k))
          CHECK(owner[static_cast<std::size_t>(i)] == owner[static_cast<std::size_t>(g.members(k)[0])]);
  }
  const std::vector<index_t> len{1, 2};
  RLPT_CHECK_ERROR(plan_step(len, {.ranks = 2, .groups_atomic = true}), "rlpt.rollout.bad_option", "groups_atomic");
  RLPT_CHECK_ERROR(plan_step(len, {.ranks = 0}), "rlpt.rollout.bad_option", "ranks");
  const std::vector<index_t> one{1};
  RLPT_CHECK_ERROR(plan_step(len, {.ranks = 1}, one), "rlpt.view.size_mismatch", "loss_tokens");
}

TEST_CASE("golden: the verl preset is verl rearrange_micro_batches, micro-batch for micro-batch and in its order") {
  const test::golden_file f(test::golden_path("rollout", "microbatch.bin"));
  const auto cases = f.get<index_t>("cases")[0];
  for (index_t c = 0; c < cases; ++c) {
    const std::string p = fmt::format("c{}_", c);
    const auto len = f.get<index_t>(p + "lengths");
    const auto params = f.get<index_t>(p + "params");
    const index_t budget = params[0], verl_count = params[1];
    const auto assign = f.get<index_t>(p + "assign");
    std::vector<index_t> verl_tokens(static_cast<std::size_t>(verl_count), 0);
    for (std::size_t i = 0; i < len.size(); ++i) verl_tokens[static_cast<std::size_t>(assign[i])] += len[i];
    CAPTURE(c);
    const microbatch_options o = compat::verl::microbatches(budget);
    const microbatch_plan plan = plan_microbatches(len, o);
    check_plan(plan, len, o);
    CHECK(plan.num_microbatches() <= verl_count);
    CHECK(plan.max_tokens() <= budget);
    CHECK(*std::max_element(verl_tokens.begin(), verl_tokens.end()) <= budget); // verl 0.9.1 verifies its cap too
    // The same micro-batches in verl's order (cheap ones at both ends, use_dynamic_bsz_balance).
    std::vector<index_t> owner(len.size(), -1);
    for (index_t m = 0; m < plan.num_microbatches(); ++m)
      for (const index_t i : plan.microbatch(m)) owner[static_cast<std::size_t>(i)] = m;
    CHECK(std::equal(owner.begin(), owner.end(), assign.begin(), assign.end()));
  }
}

TEST_CASE("pack lays micro-batches out for varlen attention") {
  test::rng r(43);
  std::vector<trajectory> recs;
  for (int i = 0; i < 6; ++i)
    recs.push_back(test::make_record(r, i, 0, r.integer(1, 5), r.integer(1, 9), i, 0.0f, true));
  const rollout_batch batch = rollout_batch::gather(recs, record_schema{});
  const std::vector<index_t> items{4, 1, 3};

  const packed_microbatch m = pack(batch, items, {.pad_to_multiple = 16});
  const index_t real = batch.length(4) + batch.length(1) + batch.length(3);
  const index_t padded = (real + 15) / 16 * 16;
  CHECK(m.info.tokens == real);
  CHECK(m.info.pad_tokens == padded - real);
  REQUIRE(static_cast<index_t>(m.tokens.size()) == padded);
  REQUIRE(m.cu_seqlens.size() == (padded > real ? 5u : 4u));
  CHECK(m.cu_seqlens.front() == 0);
  CHECK(m.cu_seqlens.back() == padded);
  index_t at = 0, loss = 0, longest = 0;
  for (std::size_t s = 0; s < items.size(); ++s) {
    const trajectory_view v = batch[items[s]];
    CHECK(m.cu_seqlens[s] == at);
    for (index_t t = 0; t < v.size(); ++t) {
      const auto u = static_cast<std::size_t>(at + t);
      CHECK(m.tokens[u] == v.tokens[t]);
      CHECK(m.position_ids[u] == t);
      CHECK(m.loss_mask[u] == v.loss_mask[t]);
      CHECK(m.logprobs[u] == v.logprobs[t]);
      CHECK(m.versions[u] == v.versions[t]);
      // Next-token targets stay inside the sequence: the last token has none.
      CHECK(m.targets[u] == (t + 1 < v.size() ? v.tokens[t + 1] : -100));
      loss += v.loss_mask[t] != 0;
    }
    at += v.size();
    longest = std::max(longest, v.size());
  }
  for (index_t t = real; t < padded; ++t) {
    const auto u = static_cast<std::size_t>(t);
    CHECK(m.loss_mask[u] == 0);
    CHECK(m.targets[u] == -100);
    CHECK(m.versions[u] == -1);
    CHECK(m.position_ids[u] == t - real);
  }
  CHECK(m.info.loss_tokens == loss);
  CHECK(m.info.max_seqlen == std::max(longest, padded - real));
  CHECK(m.items == items);

  // pack_into validates caller buffers, naming the one of the wrong size.
  const packed_extent e = packed_size(batch, items);
  std::vector<token_id> tok(static_cast<std::size_t>(e.tokens)), tgt;
  std::vector<std::int32_t> cu(static_cast<std::size_t>(e.sequences)), pos(static_cast<std::size_t>(e.tokens));
  std::vector<mask_t> mask(static_cast<std::size_t>(e.tokens));
  RLPT_CHECK_ERROR(pack_into(batch, items, {tok, cu, pos, mask}), "rlpt.view.size_mismatch", "cu_seqlens");
  cu.resize(cu.size() + 1);
  const packed_info info = pack_into(batch, items, {tok, cu, pos, mask});
  CHECK(info.pad_tokens == 0);
  CHECK(cu.back() == real);
  const std::vector<index_t> seven{7};
  RLPT_CHECK_ERROR(packed_size(batch, seven), "rlpt.rollout.bad_items", "item 7", "6 records");

  // Per-token and per-sequence columns follow the same order.
  std::vector<float> adv{0.5f, -1.0f, 2.0f, 0.0f, 3.0f, 1.5f};
  std::vector<float> expanded(static_cast<std::size_t>(padded));
  expand_per_sequence<float>(batch.offsets(), adv, items, expanded, 0.0f);
  CHECK(expanded[0] == 3.0f);
  CHECK(expanded[static_cast<std::size_t>(batch.length(4))] == -1.0f);
  for (index_t t = real; t < padded; ++t) CHECK(expanded[static_cast<std::size_t>(t)] == 0.0f);
  std::vector<token_id> again(static_cast<std::size_t>(padded));
  pack_tokens<token_id>(batch.offsets(), batch.tokens(), 1, items, again, 0);
  CHECK(std::equal(again.begin(), again.begin() + real, m.tokens.begin()));
}

// --- hostile inputs (issue 18): an rlpt::error naming the values, never UB or a runaway request --

TEST_CASE("pack_tokens and expand_per_sequence reject offsets that are not cu_seqlens") {
  // Non-monotonic and negative offsets used to read and write outside src and dst.
  std::vector<float> src(16, 1.0f), dst(32, 0.0f), per_seq{1.0f, 2.0f};
  const std::vector<index_t> items{0, 1};
  // src sized as offsets.back() says, so only the offsets are wrong: item 0 of {0, 10, 4} read
  // 10 of 4 elements, {-6, 4} read from src - 6.
  const std::vector<float> src4(4, 1.0f);
  const std::vector<index_t> reversed{0, 10, 4};
  RLPT_CHECK_ERROR(pack_tokens<float>(reversed, src4, 1, items, dst), "rlpt.rollout.bad_items",
                   "decrease at sequence 1", "offsets[1] = 10 > offsets[2] = 4");
  const std::vector<index_t> negative{-6, 4};
  const std::vector<index_t> first{0};
  RLPT_CHECK_ERROR(pack_tokens<float>(negative, src4, 1, first, dst), "rlpt.rollout.bad_items",
                   "must start at 0, got -6");
  const std::vector<index_t> none;
  RLPT_CHECK_ERROR(pack_tokens<float>(none, src, 1, items, dst), "rlpt.rollout.bad_items", "empty");
  // {0, 5, 3}: sequence 1 has length -2, so the items after it were written before dst.
  const std::vector<index_t> dip{0, 5, 3};
  const std::vector<index_t> second_first{1, 0};
  RLPT_CHECK_ERROR(expand_per_sequence<float>(dip, per_seq, second_first, dst), "rlpt.rollout.bad_items",
                   "decrease at sequence 1", "offsets[1] = 5 > offsets[2] = 3");
  RLPT_CHECK_ERROR(expand_per_sequence<float>(none, per_seq, items, dst), "rlpt.rollout.bad_items", "empty");
  // offsets.back() * width beyond index_t.
  const std::vector<index_t> huge{0, index_t{1} << 62};
  RLPT_CHECK_ERROR(pack_tokens<float>(huge, src, 4, items, dst), "rlpt.rollout.bad_items", "offsets.back() * width",
                   "4611686018427387904 * 4");
  // Item INT64_MAX: the bound check i + 1 < offsets.size() overflowed and let it through (found
  // by the property test).
  const std::vector<index_t> ok3{0, 6, 11, 24};
  const std::vector<index_t> last_item{1, std::numeric_limits<index_t>::max()};
  std::vector<float> src24(24, 1.0f);
  RLPT_CHECK_ERROR(pack_tokens<float>(ok3, src24, 1, last_item, dst), "rlpt.rollout.bad_items",
                   "item 9223372036854775807 (items[1]) is outside 3 sequences");
  // A dst too small names the item and the sizes.
  const std::vector<index_t> ok{0, 10, 16};
  std::vector<float> small(12);
  RLPT_CHECK_ERROR(pack_tokens<float>(ok, src, 1, items, small), "rlpt.rollout.bad_items", "dst of 12 elements",
                   "items[1] = 1 needs 6 more after 10");
  RLPT_CHECK_ERROR(expand_per_sequence<float>(ok, per_seq, items, small), "rlpt.rollout.bad_items",
                   "dst of 12 elements");
}

TEST_CASE("plan_microbatches: budgets and lengths near index_t's limit do not overflow") {
  constexpr index_t big = std::numeric_limits<index_t>::max();
  // token_budget = INT64_MAX: ceil(tokens / budget) used to compute tokens + budget - 1.
  const std::vector<index_t> len{5, 7, 3};
  const microbatch_options whole{.token_budget = big};
  const microbatch_plan p = plan_microbatches(len, whole);
  check_plan(p, len, whole);
  CHECK(p.num_microbatches() == 1);
  CHECK(p.total_tokens() == 15);
  // Lengths near 2^62: each fits, their sum does not.
  const std::vector<index_t> huge{index_t{1} << 62, index_t{1} << 62, index_t{1} << 62};
  RLPT_CHECK_ERROR(plan_microbatches(huge, whole), "rlpt.rollout.bad_length", "add up to more than", "at sequence 1");
  RLPT_CHECK_ERROR(plan_step(huge, {.ranks = 2}), "rlpt.rollout.bad_length", "add up to more than");
  const std::vector<index_t> two{index_t{1} << 61, index_t{1} << 61};
  const microbatch_plan q = plan_microbatches(two, whole);
  check_plan(q, two, whole);
  CHECK(q.total_tokens() == index_t{1} << 62);
}

TEST_CASE("plan_microbatches: counts are bounded by the input, not looped to") {
  const std::vector<index_t> len{5, 6};
  // min_microbatches = 2^40 used to loop for ever making empty micro-batches.
  RLPT_CHECK_ERROR(plan_microbatches(len, {.min_microbatches = index_t{1} << 40}), "rlpt.rollout.bad_option",
                   "min_microbatches = 1099511627776", "number of sequences (2)", std::to_string(max_empty_parts));
  RLPT_CHECK_ERROR(plan_microbatches(len, {.divisor = index_t{1} << 40}), "rlpt.rollout.bad_option",
                   "divisor = 1099511627776");
  RLPT_CHECK_ERROR(plan_microbatches(len, {.divisor = std::numeric_limits<index_t>::max()}), "rlpt.rollout.bad_option",
                   "divisor");
  // Up to the limit a forced count still gives empty micro-batches.
  const microbatch_options many{.min_microbatches = 1000, .divisor = 7};
  const microbatch_plan p = plan_microbatches(len, many);
  check_plan(p, len, many);
  CHECK(p.num_microbatches() == 1001);
}

TEST_CASE("plan_step rejects loss_tokens outside [0, length]") {
  const std::vector<index_t> len{10, 20, 30};
  const std::vector<index_t> negative{5, -1, 7};
  RLPT_CHECK_ERROR(plan_step(len, {.ranks = 2}, negative), "rlpt.rollout.bad_length", "loss_tokens[1] = -1", "[0, 20]");
  const std::vector<index_t> too_many{5, 20, 31};
  RLPT_CHECK_ERROR(plan_step(len, {.ranks = 2}, too_many), "rlpt.rollout.bad_length", "loss_tokens[2] = 31", "[0, 30]");
  const std::vector<index_t> ok{10, 0, 30};
  const step_plan p = plan_step(len, {.ranks = 2}, ok);
  CHECK(p.totals.loss_tokens == 40);
  CHECK(p.totals.loss_sequences == 2);
  CHECK(p.totals.tokens == 60);
}

TEST_CASE("pack: a padded length beyond int32 cu_seqlens is an error before anything is allocated") {
  test::rng r(44);
  std::vector<trajectory> recs;
  for (int i = 0; i < 3; ++i) recs.push_back(test::make_record(r, i, 0, 2, 5));
  const rollout_batch batch = rollout_batch::gather(recs, record_schema{});
  const std::vector<index_t> items{0, 2};
  // pad_to_multiple = INT64_MAX used to overflow in the round-up (tokens + multiple - 1).
  RLPT_CHECK_ERROR(pack(batch, items, {.pad_to_multiple = std::numeric_limits<index_t>::max()}),
                   "rlpt.rollout.bad_items", "14 packed tokens", "pad_to_multiple = 9223372036854775807", "int32");
  RLPT_CHECK_ERROR(pack(batch, items, {.pad_to_multiple = index_t{1} << 31}), "rlpt.rollout.bad_items",
                   "pad_to_multiple = 2147483648");
  const packed_microbatch m = pack(batch, items, {.pad_to_multiple = index_t{1} << 10});
  CHECK(m.cu_seqlens.back() == 1024);
  std::vector<index_t> bad{0, -1};
  RLPT_CHECK_ERROR(packed_size(batch, bad), "rlpt.rollout.bad_items", "item -1 (items[1])", "3 records");
}
