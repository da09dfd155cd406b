// SPDX-License-Identifier: Apache-2.0
// Group estimators against naive fp64 references, and the properties they promise: exact zeros
// for zero-std groups (no cancellation), permutation equivariance, results independent of thread
// count and of the other groups in the batch, NaN policies.
#include "common.hpp"
#include <rlpt/core/thread_pool.hpp>

#include "support/errors.hpp"
#include "support/random.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <numeric>
#include <vector>

namespace {

using rlpt::test::tolerance;

//! One fp32 rounding of an fp64 result (plus a rounding of an fp32 input difference).
constexpr tolerance rounding{2.5e-7, 1e-12};

struct batch {
  std::vector<std::int64_t> ids;
  std::vector<float> rewards;
};

//! Ragged groups (sizes 1..20) in shuffled order with mixed reward shapes.
batch random_batch(std::uint64_t stream, int groups = 60) {
  rlpt::test::rng r(stream);
  batch b;
  for (int g = 0; g < groups; ++g) {
    const auto n = r.integer(1, 20);
    const int kind = g % 4;
    for (std::int64_t i = 0; i < n; ++i) {
      b.ids.push_back(500 + 3 * g);
      b.rewards.push_back(kind == 0   ? static_cast<float>(r.integer(0, 1))
                          : kind == 1 ? static_cast<float>(r.normal(2.0, 3.0))
                          : kind == 2 ? 0.35f
                                      : static_cast<float>(std::vector<double>{
                                            0.35, 0.4, 0.3}[static_cast<std::size_t>(r.integer(0, 2))]));
    }
  }
  std::vector<std::size_t> perm(b.ids.size());
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), r.engine());
  batch s;
  for (std::size_t i : perm) {
    s.ids.push_back(b.ids[i]);
    s.rewards.push_back(b.rewards[i]);
  }
  return s;
}

struct naive_group {
  double mean = 0, m2 = 0, sum = 0;
  int n = 0;
};

std::map<std::int64_t, naive_group> naive_groups(const batch& b) {
  std::map<std::int64_t, naive_group> g;
  for (std::size_t i = 0; i < b.ids.size(); ++i) {
    g[b.ids[i]].sum += b.rewards[i];
    ++g[b.ids[i]].n;
  }
  for (auto& [id, s] : g) s.mean = s.sum / s.n;
  for (std::size_t i = 0; i < b.ids.size(); ++i) {
    const double d = b.rewards[i] - g[b.ids[i]].mean;
    g[b.ids[i]].m2 += d * d;
  }
  return g;
}

//! GRPO by the definition, in fp64.
std::vector<double> naive_grpo(const batch& b, const rlpt::grpo_options& o) {
  auto g = naive_groups(b);
  double bs = 0;
  {
    double s = 0, m2 = 0;
    for (float x : b.rewards) s += x;
    const double mu = s / static_cast<double>(b.rewards.size());
    for (float x : b.rewards) m2 += (x - mu) * (x - mu);
    bs = std::sqrt(m2 / (static_cast<double>(b.rewards.size()) - (o.unbiased ? 1 : 0)));
  }
  std::vector<double> out;
  for (std::size_t i = 0; i < b.ids.size(); ++i) {
    const naive_group& s = g[b.ids[i]];
    double mu = s.mean, sigma = 1.0;
    if (s.n == 1) {
      if (o.single == rlpt::single::zero) {
        out.push_back(0.0);
        continue;
      }
      mu = 0.0;
      sigma = o.scale == rlpt::scale::batch_std ? bs : 1.0;
    } else {
      sigma = o.scale == rlpt::scale::group_std   ? std::sqrt(s.m2 / (s.n - (o.unbiased ? 1 : 0)))
              : o.scale == rlpt::scale::batch_std ? bs
                                                  : 1.0;
    }
    const double div = o.scale == rlpt::scale::none ? 1.0 : std::max(sigma, o.std_floor) + o.epsilon;
    out.push_back((b.rewards[i] - mu) / div);
  }
  return out;
}

} // namespace

TEST_CASE("grpo equals the fp64 definition for every scaling, ddof, floor and single-sample policy") {
  const batch b = random_batch(1);
  const auto g = rlpt::groups::from_ids(b.ids);
  std::vector<float> adv(b.rewards.size());
  for (const auto scale : {rlpt::scale::group_std, rlpt::scale::batch_std, rlpt::scale::none})
    for (const bool unbiased : {true, false})
      for (const double floor : {0.0, 0.05})
        for (const auto single : {rlpt::single::raw, rlpt::single::zero}) {
          const rlpt::grpo_options o{
              .scale = scale, .unbiased = unbiased, .epsilon = 1e-4, .std_floor = floor, .single = single};
          CAPTURE(static_cast<int>(scale));
          CAPTURE(unbiased);
          CAPTURE(floor);
          CAPTURE(static_cast<int>(single));
          (void)rlpt::grpo_advantages(b.rewards, g, adv, o);
          ADV_CHECK_CLOSE(adv, naive_grpo(b, o), rounding);
        }
}

TEST_CASE("zero-std groups give exactly 0 (0.35, 0.4, 0.3 regression): no cancellation residue") {
  // NeMo-RL #4161: sqrt(E[x^2] - E[x]^2) in fp32 turned a true std of 0 into ~1.6e-4 and
  // amplified advantages ~4000x. Two-pass fp64 statistics give M2 == 0 exactly.
  std::vector<float> rewards;
  std::vector<std::int64_t> ids;
  const std::vector<std::vector<float>> groups = {{0.35f, 0.35f, 0.35f},        {0.4f, 0.4f, 0.4f, 0.4f, 0.4f},
                                                  std::vector<float>(64, 0.3f), {0.1f, 0.1f, 0.1f},
                                                  {0.35f, 0.4f, 0.3f},          std::vector<float>(7, 0.7f)};
  for (std::size_t k = 0; k < groups.size(); ++k)
    for (float x : groups[k]) {
      rewards.push_back(x);
      ids.push_back(static_cast<std::int64_t>(k));
    }
  const auto g = rlpt::groups::from_ids(ids);
  std::vector<float> adv(rewards.size());
  for (const auto& o : {rlpt::compat::verl::grpo(), rlpt::compat::trl::grpo(), rlpt::compat::openrlhf::group_norm(),
                        rlpt::compat::areal::reward_norm()}) {
    const rlpt::group_stats s = rlpt::grpo_advantages(rewards, g, adv, o);
    for (std::size_t i = 0; i < rewards.size(); ++i) {
      CAPTURE(i);
      if (ids[i] == 4)
        CHECK(std::fabs(adv[i]) < 1.2f); // (0.35, 0.4, 0.3): z-scores 0, 1, -1
      else
        CHECK(adv[i] == 0.0f);
    }
    CHECK(s.num_degenerate == 5);
    CHECK(s.frac_degenerate == doctest::Approx(5.0 / 6.0));
    CHECK(s.degenerate[4] == 0);
    CHECK(s.std[0] == 0.0f);
    CHECK(s.mean[0] == 0.35f);
    CHECK(s.size[2] == 64);
  }
}

TEST_CASE("nondegenerate_items: one byte per sequence, 0 where its group has zero variance, groups interleaved") {
  // Groups 7 (constant), 3 (varied), 9 (one sample) and 5 (varied), their members interleaved.
  const std::vector<std::int64_t> ids{7, 3, 9, 7, 3, 5, 5, 7, 3, 5};
  const std::vector<float> rewards{1.0f, 0.0f, 1.0f, 1.0f, 1.0f, 0.5f, 0.25f, 1.0f, 0.0f, 0.5f};
  const auto g = rlpt::groups::from_ids(ids);
  std::vector<float> adv(rewards.size());
  const rlpt::group_stats s = rlpt::grpo_advantages(rewards, g, adv, rlpt::compat::verl::grpo());
  const std::vector<rlpt::mask_t> counted = rlpt::nondegenerate_items(g, s);
  CHECK(counted == std::vector<rlpt::mask_t>{0, 1, 0, 0, 1, 1, 1, 0, 1, 1});
  // The constant group has no policy signal; the single sample is degenerate too (max == min, as TRL
  // PR #6368 tests it), though verl's convention (mean 0, std 1) leaves it its reward as advantage.
  for (std::size_t i = 0; i < counted.size(); ++i)
    if (ids[i] == 7) CHECK(adv[i] == 0.0f);
  CHECK(adv[2] == doctest::Approx(1.0f));
  rlpt::group_stats other;
  other.degenerate.assign(3, 0);
  RLPT_CHECK_ERROR(static_cast<void>(rlpt::nondegenerate_items(g, other)), "rlpt.view.size_mismatch",
                   "group_stats.degenerate has 3 elements, expected 4");
}

TEST_CASE("std_floor bounds the amplification of a near-constant group") {
  const std::vector<float> rewards = {1.0f, std::nextafter(1.0f, 2.0f), 1.0f};
  const auto g = rlpt::groups::uniform(3, 3);
  std::vector<float> adv(3);
  (void)rlpt::grpo_advantages(rewards, g, adv, {.epsilon = 0.0, .std_floor = 1e-3});
  for (float a : adv) CHECK(std::fabs(a) < 1e-3f);
  (void)rlpt::grpo_advantages(rewards, g, adv, {.epsilon = 1e-12});
  CHECK(std::fabs(adv[1]) > 1.0f); // without a floor a 1-ulp spread is a full standard score
}

TEST_CASE("group estimators: permuting sequences permutes the advantages") {
  const batch b = random_batch(2);
  rlpt::test::rng r(3);
  std::vector<std::size_t> perm(b.ids.size());
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), r.engine());
  batch p;
  for (std::size_t i : perm) {
    p.ids.push_back(b.ids[i]);
    p.rewards.push_back(b.rewards[i]);
  }
  const auto g = rlpt::groups::from_ids(b.ids);
  const auto gp = rlpt::groups::from_ids(p.ids);
  std::vector<float> a(b.ids.size()), ap(a.size());
  std::vector<rlpt::index_t> len(a.size());
  for (std::size_t i = 0; i < len.size(); ++i) len[i] = static_cast<rlpt::index_t>(1 + i % 17);
  std::vector<rlpt::index_t> lenp;
  for (std::size_t i : perm) lenp.push_back(len[i]);
  auto check_permuted = [&] {
    std::vector<float> back(a.size());
    for (std::size_t k = 0; k < perm.size(); ++k) back[perm[k]] = ap[k];
    ADV_CHECK_CLOSE(back, a, rounding);
  };
  (void)rlpt::grpo_advantages(b.rewards, g, a, rlpt::compat::verl::grpo());
  (void)rlpt::grpo_advantages(p.rewards, gp, ap, rlpt::compat::verl::grpo());
  check_permuted();
  (void)rlpt::rloo_advantages(b.rewards, g, a, rlpt::compat::verl::rloo());
  (void)rlpt::rloo_advantages(p.rewards, gp, ap, rlpt::compat::verl::rloo());
  check_permuted();
  (void)rlpt::opo_advantages(b.rewards, len, g, a, rlpt::compat::verl::opo());
  (void)rlpt::opo_advantages(p.rewards, lenp, gp, ap, rlpt::compat::verl::opo());
  check_permuted();
  (void)rlpt::gpg_advantages(b.rewards, g, a, rlpt::compat::verl::gpg());
  (void)rlpt::gpg_advantages(p.rewards, gp, ap, rlpt::compat::verl::gpg());
  check_permuted();
}

TEST_CASE("group estimators: same bits for any thread count and whatever other groups are in the batch") {
  const batch b = random_batch(4, 400);
  const auto g = rlpt::groups::from_ids(b.ids);
  std::vector<float> serial(b.rewards.size()), threaded(serial.size());
  rlpt::thread_pool pool(3);
  const rlpt::host_executor ex{&pool};
  for (const auto& o : {rlpt::compat::verl::grpo(), rlpt::compat::trl::grpo("batch"), rlpt::compat::verl::dr_grpo()}) {
    (void)rlpt::grpo_advantages(b.rewards, g, serial, o);
    (void)rlpt::grpo_advantages(b.rewards, g, threaded, o, ex);
    CHECK(std::memcmp(serial.data(), threaded.data(), serial.size() * sizeof(float)) == 0);
  }
  // Drop every other group: the remaining groups' advantages are bit-identical.
  const auto o = rlpt::compat::verl::grpo();
  (void)rlpt::grpo_advantages(b.rewards, g, serial, o);
  batch half;
  std::vector<float> expect;
  for (std::size_t i = 0; i < b.ids.size(); ++i)
    if ((b.ids[i] / 3) % 2 == 0) {
      half.ids.push_back(b.ids[i]);
      half.rewards.push_back(b.rewards[i]);
      expect.push_back(serial[i]);
    }
  std::vector<float> got(half.ids.size());
  (void)rlpt::grpo_advantages(half.rewards, rlpt::groups::from_ids(half.ids), got, o);
  CHECK(got == expect);
}

TEST_CASE("rloo equals the leave-one-out definition and the k/(k-1) form") {
  const batch b = random_batch(5);
  const auto g = rlpt::groups::from_ids(b.ids);
  auto ng = naive_groups(b);
  std::vector<float> adv(b.rewards.size());
  (void)rlpt::rloo_advantages(b.rewards, g, adv, {.single = rlpt::single::raw});
  std::vector<double> loo, kk;
  for (std::size_t i = 0; i < b.ids.size(); ++i) {
    const auto& s = ng[b.ids[i]];
    if (s.n == 1) {
      loo.push_back(b.rewards[i]);
      kk.push_back(b.rewards[i]);
      continue;
    }
    loo.push_back(b.rewards[i] - (s.sum - b.rewards[i]) / (s.n - 1));
    kk.push_back(static_cast<double>(s.n) / (s.n - 1) * (b.rewards[i] - s.mean));
  }
  ADV_CHECK_CLOSE(adv, loo, (tolerance{2.5e-7, 1e-9}));
  ADV_CHECK_CLOSE(adv, kk, (tolerance{1e-6, 1e-9}));
}

TEST_CASE("opo and gpg equal their definitions") {
  const batch b = random_batch(6);
  const auto g = rlpt::groups::from_ids(b.ids);
  std::vector<rlpt::index_t> len(b.ids.size());
  for (std::size_t i = 0; i < len.size(); ++i) len[i] = static_cast<rlpt::index_t>(3 + (i * 7) % 29);
  std::map<std::int64_t, std::pair<double, double>> w; // sum L R, sum L
  std::map<std::int64_t, int> n;
  for (std::size_t i = 0; i < len.size(); ++i) {
    w[b.ids[i]].first += static_cast<double>(len[i]) * b.rewards[i];
    w[b.ids[i]].second += static_cast<double>(len[i]);
    ++n[b.ids[i]];
  }
  std::vector<float> adv(b.rewards.size());
  (void)rlpt::opo_advantages(b.rewards, len, g, adv, rlpt::compat::verl::opo());
  std::vector<double> want;
  for (std::size_t i = 0; i < len.size(); ++i)
    want.push_back(b.rewards[i] - (n[b.ids[i]] == 1 ? 0.0 : w[b.ids[i]].first / w[b.ids[i]].second));
  ADV_CHECK_CLOSE(adv, want, (tolerance{2.5e-7, 1e-9}));

  auto ng = naive_groups(b);
  double nonzero = 0;
  for (float x : b.rewards) nonzero += x != 0.0f ? 1 : 0;
  const double alpha = static_cast<double>(b.rewards.size()) / std::max(1.0, nonzero);
  (void)rlpt::gpg_advantages(b.rewards, g, adv, {.f_norm = 2.0});
  want.clear();
  for (std::size_t i = 0; i < len.size(); ++i)
    want.push_back(alpha * (b.rewards[i] - (ng[b.ids[i]].n == 1 ? 0.0 : ng[b.ids[i]].mean)) / 2.0);
  ADV_CHECK_CLOSE(adv, want, (tolerance{2.5e-7, 1e-9}));
}

TEST_CASE("nonfinite::mask leaves NaN/inf rewards out of every statistic and gives them 0") {
  batch b = random_batch(7);
  const auto g = rlpt::groups::from_ids(b.ids);
  // Reference: the batch without the poisoned samples.
  std::vector<std::size_t> poisoned = {3, 10, 11, 40};
  batch clean;
  for (std::size_t i = 0; i < b.ids.size(); ++i)
    if (std::find(poisoned.begin(), poisoned.end(), i) == poisoned.end()) {
      clean.ids.push_back(b.ids[i]);
      clean.rewards.push_back(b.rewards[i]);
    }
  b.rewards[3] = std::numeric_limits<float>::quiet_NaN();
  b.rewards[10] = std::numeric_limits<float>::infinity();
  b.rewards[11] = -std::numeric_limits<float>::infinity();
  b.rewards[40] = std::numeric_limits<float>::quiet_NaN();
  for (const auto& o : {rlpt::compat::trl::grpo(), rlpt::compat::trl::grpo("batch")}) {
    std::vector<float> adv(b.rewards.size()), cadv(clean.rewards.size());
    const auto s = rlpt::grpo_advantages(b.rewards, g, adv, o);
    (void)rlpt::grpo_advantages(clean.rewards, rlpt::groups::from_ids(clean.ids), cadv, o);
    CHECK(s.num_nonfinite == 4);
    std::vector<float> kept;
    for (std::size_t i = 0; i < adv.size(); ++i) {
      CHECK(std::isfinite(adv[i]));
      if (std::find(poisoned.begin(), poisoned.end(), i) == poisoned.end())
        kept.push_back(adv[i]);
      else
        CHECK(adv[i] == 0.0f);
    }
    ADV_CHECK_CLOSE(kept, cadv, rounding);
  }
  std::vector<float> adv(b.rewards.size());
  const auto s = rlpt::rloo_advantages(b.rewards, g, adv, rlpt::compat::trl::rloo(true));
  CHECK(s.num_nonfinite == 4);
  for (float a : adv) CHECK(std::isfinite(a));
}

TEST_CASE("GRPO gives each sample the same bits whether its groups are contiguous or interleaved") {
  // Contiguous groups take apply_norm_run (two samples per packed division), interleaved ones the
  // scalar apply_norm: the same bits, non-finite rewards (masked) included, in pairs and in tails.
  batch shuffled = random_batch(11, 80);
  const auto gs = rlpt::groups::from_ids(shuffled.ids);
  std::vector<std::size_t> order(shuffled.ids.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return gs.group_of(static_cast<rlpt::index_t>(a)) < gs.group_of(static_cast<rlpt::index_t>(b));
  });
  batch sorted;
  for (const std::size_t i : order) {
    sorted.ids.push_back(shuffled.ids[i]);
    sorted.rewards.push_back(shuffled.rewards[i]);
  }
  for (const std::size_t i : {std::size_t{0}, std::size_t{5}, std::size_t{6}, std::size_t{31}})
    sorted.rewards[i] = i % 2 == 0 ? std::numeric_limits<float>::quiet_NaN() : std::numeric_limits<float>::infinity();
  for (std::size_t k = 0; k < order.size(); ++k) shuffled.rewards[order[k]] = sorted.rewards[k];
  const auto gc = rlpt::groups::from_ids(sorted.ids);
  REQUIRE(gc.contiguous());
  REQUIRE_FALSE(gs.contiguous());
  for (const auto& o : {rlpt::compat::trl::grpo(), rlpt::compat::trl::grpo("batch"), rlpt::compat::trl::grpo("none")}) {
    std::vector<float> a(sorted.rewards.size()), b(sorted.rewards.size());
    (void)rlpt::grpo_advantages(sorted.rewards, gc, a, o);
    (void)rlpt::grpo_advantages(shuffled.rewards, gs, b, o);
    for (std::size_t k = 0; k < order.size(); ++k) {
      CAPTURE(k);
      CHECK(std::bit_cast<std::uint32_t>(a[k]) == std::bit_cast<std::uint32_t>(b[order[k]]));
    }
  }
}

TEST_CASE("passk: only the best sample of each group learns") {
  const std::vector<float> rewards = {0.2f, 0.9f, 0.5f, /**/ 1.0f, 1.0f, /**/ -1.0f, 3.0f, 2.5f, 0.0f};
  const std::vector<std::int64_t> ids = {7, 7, 7, 8, 8, 9, 9, 9, 9};
  std::vector<float> adv(rewards.size());
  (void)rlpt::passk_advantages(rewards, rlpt::groups::from_ids(ids), adv, {.scale_by_std = false});
  const std::vector<float> want = {0.0f, 0.4f, 0.0f, 0.0f, 0.0f, 0.0f, 0.5f, 0.0f, 0.0f};
  ADV_CHECK_CLOSE(adv, want, rounding);
}

TEST_CASE("group_stats storage is reused across calls") {
  const batch b = random_batch(8);
  const auto g = rlpt::groups::from_ids(b.ids);
  std::vector<float> adv(b.rewards.size());
  rlpt::group_stats s;
  rlpt::grpo_advantages(b.rewards, g, adv, {}, s);
  const float* storage = s.mean.data();
  rlpt::grpo_advantages(b.rewards, g, adv, {}, s);
  CHECK(s.mean.data() == storage);
  CHECK(s.mean.size() == static_cast<std::size_t>(g.num_groups()));
}

TEST_CASE("group estimators: equal-size contiguous groups (moments side by side) give the member-by-member bits") {
  // Contiguous groups of one size take their moments sixteen groups side by side; the same
  // groups interleaved (sequence i in group i % G) take them member by member. Every output and
  // statistic must be the same bits, for every width of the canonical tree and past 32 members.
  for (const rlpt::index_t w : {1, 2, 3, 4, 5, 8, 9, 16, 17, 31, 32, 33, 64, 100}) {
    CAPTURE(w);
    const rlpt::index_t G = 2 * 16 + 5; // two full blocks and a partial one
    const rlpt::index_t n = G * w;
    rlpt::test::rng r(static_cast<std::uint64_t>(40 + w));
    std::vector<float> rc(static_cast<std::size_t>(n)); // contiguous: group k is [k w, (k + 1) w)
    for (rlpt::index_t k = 0; k < G; ++k)
      for (rlpt::index_t j = 0; j < w; ++j)
        rc[static_cast<std::size_t>(k * w + j)] =
            k % 4 == 0   ? static_cast<float>(r.integer(0, 1))
            : k % 4 == 1 ? static_cast<float>(1e6 + r.normal(0.0, 1.0))
            : k % 4 == 2 ? std::vector<float>{0.35f, 0.4f, 0.3f}[static_cast<std::size_t>(r.integer(0, 2))]
                         : (k == 3 || j % 2 == 0 ? -0.0f : static_cast<float>(r.normal(-2.0, 3.0)));
    std::vector<float> ri(rc.size());
    std::vector<std::int64_t> ids(rc.size());
    std::vector<rlpt::index_t> lc(rc.size()), li(rc.size());
    auto at = [&](rlpt::index_t k, rlpt::index_t j) { return static_cast<std::size_t>(j * G + k); };
    for (rlpt::index_t k = 0; k < G; ++k)
      for (rlpt::index_t j = 0; j < w; ++j) {
        const auto c = static_cast<std::size_t>(k * w + j);
        ri[at(k, j)] = rc[c];
        ids[at(k, j)] = k;
        lc[c] = li[at(k, j)] = 1 + (k + j) % 7;
      }
    const auto gc = rlpt::groups::uniform(n, w);
    const auto gi = rlpt::groups::from_ids(ids);
    REQUIRE(gc.contiguous());
    REQUIRE(gi.contiguous() == (w == 1));
    std::vector<float> ac(rc.size()), ai(rc.size());
    auto same = [&](const rlpt::group_stats& sc, const rlpt::group_stats& si) {
      for (rlpt::index_t k = 0; k < G; ++k)
        for (rlpt::index_t j = 0; j < w; ++j) {
          const float x = ac[static_cast<std::size_t>(k * w + j)], y = ai[at(k, j)];
          if (std::memcmp(&x, &y, sizeof x) != 0) FAIL_CHECK("group ", k, " member ", j, ": ", x, " vs ", y);
        }
      CHECK(std::memcmp(sc.mean.data(), si.mean.data(), sc.mean.size() * sizeof(float)) == 0);
      CHECK(std::memcmp(sc.std.data(), si.std.data(), sc.std.size() * sizeof(float)) == 0);
      CHECK(sc.size == si.size);
      CHECK(sc.degenerate == si.degenerate);
    };
    rlpt::group_stats sc, si;
    // The last: the biased std, and a floor that binds on the groups of small spread.
    for (const auto& o : {rlpt::compat::verl::grpo(), rlpt::compat::trl::grpo("batch"), rlpt::compat::verl::dr_grpo(),
                          rlpt::grpo_options{.unbiased = false, .epsilon = 1e-4, .std_floor = 0.04}}) {
      rlpt::grpo_advantages(rc, gc, ac, o, sc);
      rlpt::grpo_advantages(ri, gi, ai, o, si);
      same(sc, si);
    }
    rlpt::rloo_advantages(rc, gc, ac, rlpt::compat::verl::rloo(), sc);
    rlpt::rloo_advantages(ri, gi, ai, rlpt::compat::verl::rloo(), si);
    same(sc, si);
    rlpt::opo_advantages(rc, lc, gc, ac, rlpt::compat::verl::opo(), sc);
    rlpt::opo_advantages(ri, li, gi, ai, rlpt::compat::verl::opo(), si);
    same(sc, si);
    rlpt::gpg_advantages(rc, gc, ac, rlpt::compat::verl::gpg(), sc);
    rlpt::gpg_advantages(ri, gi, ai, rlpt::compat::verl::gpg(), si);
    same(sc, si);
    if (w >= 2) {
      rlpt::passk_advantages(rc, gc, ac, rlpt::compat::verl::grpo_passk(), sc);
      rlpt::passk_advantages(ri, gi, ai, rlpt::compat::verl::grpo_passk(), si);
      same(sc, si);
    }
  }
}

TEST_CASE("areal normalize: NormConfig's means and stds, by hand") {
  namespace areal = rlpt::compat::areal;
  std::vector<float> out(4);
  const double e = 1e-5;
  // Groups of two rows, group mean and unbiased std: (1, 2) -> mean 1.5, std sqrt(0.5).
  const std::vector<float> x = {1.0f, 2.0f, 3.0f, 5.0f};
  areal::normalize({.mean_level = "group", .std_level = "group", .group_size = 2}, 4, x, {}, out);
  CHECK(out[0] == static_cast<float>(-0.5 / (std::sqrt(0.5) + e)));
  CHECK(out[3] == static_cast<float>(1.0 / (std::sqrt(2.0) + e)));
  // Leave-one-out batch mean over the valid values (1, 2, 3; 5 masked): 2.5, 2, 1.5; the std
  // around those, sqrt((1.5^2 + 0 + 1.5^2) / 2) = 1.5; a masked value gives 0.
  const std::vector<std::uint8_t> mask = {1, 1, 1, 0};
  areal::normalize({.mean_leave1out = true}, 4, x, mask, out);
  CHECK(out[0] == static_cast<float>(-1.5 / (1.5 + e)));
  CHECK(out[1] == 0.0f);
  CHECK(out[2] == static_cast<float>(1.5 / (1.5 + e)));
  CHECK(out[3] == 0.0f);
  // Group mean, batch std (biased), a row of two tokens each: rows (1, 2) and (3, 5).
  areal::normalize({.mean_level = "group", .std_level = "batch", .std_unbiased = false, .group_size = 1}, 2, x, {},
                   out);
  const double sd = std::sqrt((0.25 + 0.25 + 1.0 + 1.0) / 4.0);
  CHECK(out[0] == static_cast<float>(-0.5 / (sd + e)));
  CHECK(out[3] == static_cast<float>(1.0 / (sd + e)));
  // Groups of one row (and one token): mean 0 with leave-one-out, std 1 unbiased; none: no eps.
  areal::normalize({.mean_level = "group", .mean_leave1out = true, .std_level = "group", .group_size = 1}, 4, x, {},
                   out);
  CHECK(out[3] == static_cast<float>(5.0 / (1.0 + e)));
  areal::normalize({.mean_level = "none", .std_level = "none"}, 4, x, {}, out);
  CHECK(out == x);
  // Every value masked: x unchanged (AReaL's early return).
  const std::vector<std::uint8_t> none(4, 0);
  areal::normalize({}, 4, x, none, out);
  CHECK(out == x);
}
