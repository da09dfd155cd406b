// SPDX-License-Identifier: Apache-2.0
// Token-level estimators against naive fp64 definitions (GAE as a sum of discounted TD errors,
// not the recurrence), masked-garbage invariance, packed == padded, thread and batch
// independence, distributed whitening, NaN policies, and the token helpers.
#include "common.hpp"
#include <rlpt/core/thread_pool.hpp>

#include "support/random.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

namespace {

using rlpt::test::tolerance;

struct token_batch {
  rlpt::index_t B = 0, T = 0;
  std::vector<float> rewards, values;
  std::vector<std::uint8_t> mask;
};

//! Prefix masks with interior holes (tool tokens), an empty row and a full row.
token_batch random_tokens(std::uint64_t stream, rlpt::index_t B = 24, rlpt::index_t T = 50) {
  rlpt::test::rng r(stream);
  token_batch b{B, T, r.normals(static_cast<std::size_t>(B * T), 0.0, 0.3), r.normals(static_cast<std::size_t>(B * T)),
                std::vector<std::uint8_t>(static_cast<std::size_t>(B * T), 0)};
  for (rlpt::index_t i = 0; i < B; ++i) {
    const rlpt::index_t n = i == 1 ? 0 : i == 2 ? T : r.integer(1, T);
    for (rlpt::index_t t = 0; t < n; ++t) b.mask[static_cast<std::size_t>(i * T + t)] = 1;
    if (i % 3 == 0 && n > 6)
      for (rlpt::index_t t = r.integer(1, n - 4), e = t + r.integer(1, 3); t < e; ++t)
        b.mask[static_cast<std::size_t>(i * T + t)] = 0;
  }
  return b;
}

//! GAE by definition: A_t = sum_j (gamma lambda)^j delta_{k_j}, over the chain of tokens that
//! follow t under the mask mode; fp64.
std::vector<double> naive_gae(const token_batch& b, double gamma, double lambda, rlpt::mask_mode mode,
                              const std::vector<float>* values, std::vector<double>* returns = nullptr) {
  std::vector<double> adv(b.rewards.size(), 0.0);
  if (returns) returns->assign(b.rewards.size(), 0.0);
  for (rlpt::index_t i = 0; i < b.B; ++i) {
    auto at = [&](rlpt::index_t t) { return static_cast<std::size_t>(i * b.T + t); };
    auto ok = [&](rlpt::index_t t) { return b.mask[at(t)] != 0; };
    auto V = [&](rlpt::index_t t) { return values && ok(t) ? static_cast<double>((*values)[at(t)]) : 0.0; };
    auto R = [&](rlpt::index_t t) { return ok(t) ? static_cast<double>(b.rewards[at(t)]) : 0.0; };
    // The chain of positions the recurrence visits after t, and the next value of each.
    for (rlpt::index_t t = 0; t < b.T; ++t) {
      if (!ok(t)) continue;
      std::vector<rlpt::index_t> chain;
      for (rlpt::index_t k = t; k < b.T; ++k) {
        if (mode == rlpt::mask_mode::skip && !ok(k)) continue;
        if (mode == rlpt::mask_mode::reset && !ok(k)) break;
        chain.push_back(k);
      }
      double a = 0.0, w = 1.0;
      for (std::size_t j = 0; j < chain.size(); ++j) {
        const rlpt::index_t k = chain[j];
        const double next = j + 1 < chain.size() ? V(chain[j + 1]) : 0.0;
        a += w * (R(k) + gamma * next - V(k));
        w *= gamma * lambda;
      }
      adv[at(t)] = a;
      if (returns) (*returns)[at(t)] = a + V(t);
    }
  }
  return adv;
}

constexpr tolerance fp32_out{2e-6, 1e-9}; // fp32 outputs of fp64 accumulations

} // namespace

TEST_CASE("gae equals the discounted-TD-error definition for every mask mode") {
  const token_batch b = random_tokens(11);
  const auto layout = rlpt::token_layout::padded(b.B, b.T);
  std::vector<float> adv(b.rewards.size()), ret(adv.size());
  for (const auto mode : {rlpt::mask_mode::skip, rlpt::mask_mode::zero, rlpt::mask_mode::reset})
    for (const auto& [gamma, lambda] : {std::pair{1.0, 1.0}, std::pair{0.99, 0.95}, std::pair{0.9, 0.0}}) {
      CAPTURE(static_cast<int>(mode));
      CAPTURE(gamma);
      CAPTURE(lambda);
      const auto r = rlpt::gae({.layout = layout, .rewards = b.rewards, .values = b.values, .mask = b.mask}, adv, ret,
                               {.gamma = gamma, .lambda = lambda, .masked = mode});
      CHECK(!r.whitening.has_value());
      std::vector<double> want_ret;
      const auto want = naive_gae(b, gamma, lambda, mode, &b.values, &want_ret);
      ADV_CHECK_CLOSE(adv, want, fp32_out);
      ADV_CHECK_CLOSE(ret, want_ret, fp32_out);
    }
}

TEST_CASE("discounted returns equal GAE with V = 0 and lambda = 1, remax subtracts the baseline") {
  const token_batch b = random_tokens(12);
  const auto layout = rlpt::token_layout::padded(b.B, b.T);
  std::vector<float> g(b.rewards.size());
  for (const auto mode : {rlpt::mask_mode::skip, rlpt::mask_mode::zero, rlpt::mask_mode::reset}) {
    CAPTURE(static_cast<int>(mode));
    CHECK(rlpt::discounted_returns(layout, b.rewards, b.mask, g, {.gamma = 0.97, .masked = mode}) == 0);
    ADV_CHECK_CLOSE(g, naive_gae(b, 0.97, 1.0, mode, nullptr), fp32_out);
  }
  std::vector<float> baselines(static_cast<std::size_t>(b.B), 0.25f), adv(g.size()), ret(g.size());
  (void)rlpt::remax_advantages(layout, b.rewards, b.mask, baselines, adv, ret);
  auto want = naive_gae(b, 1.0, 1.0, rlpt::mask_mode::skip, nullptr);
  ADV_CHECK_CLOSE(ret, want, fp32_out);
  for (std::size_t i = 0; i < want.size(); ++i)
    if (b.mask[i]) want[i] -= 0.25;
  ADV_CHECK_CLOSE(adv, want, fp32_out);
}

TEST_CASE("masked garbage (huge, NaN, inf) never changes valid outputs") {
  const token_batch b = random_tokens(13);
  token_batch dirty = b;
  for (std::size_t i = 0; i < b.mask.size(); ++i)
    if (!b.mask[i]) {
      dirty.rewards[i] = i % 3 == 0   ? 1e30f
                         : i % 3 == 1 ? std::numeric_limits<float>::quiet_NaN()
                                      : -std::numeric_limits<float>::infinity();
      dirty.values[i] = i % 2 ? std::numeric_limits<float>::infinity() : -1e30f;
    }
  const auto layout = rlpt::token_layout::padded(b.B, b.T);
  std::vector<float> a1(b.rewards.size()), r1(a1.size()), a2(a1.size()), r2(a1.size());
  auto same = [&] {
    CHECK(std::memcmp(a1.data(), a2.data(), a1.size() * sizeof(float)) == 0);
    CHECK(std::memcmp(r1.data(), r2.data(), r1.size() * sizeof(float)) == 0);
  };
  for (const auto& o :
       {rlpt::compat::verl::gae(0.99, 0.95), rlpt::compat::openrlhf::gae(), rlpt::compat::areal::gae(1.0, 1.0, true),
        rlpt::gae_options{.masked = rlpt::mask_mode::reset}}) {
    (void)rlpt::gae({.layout = layout, .rewards = b.rewards, .values = b.values, .mask = b.mask}, a1, r1, o);
    (void)rlpt::gae({.layout = layout, .rewards = dirty.rewards, .values = dirty.values, .mask = b.mask}, a2, r2, o);
    same();
  }
  (void)rlpt::reinforce_pp_advantages(layout, b.rewards, b.mask, a1, r1, rlpt::compat::openrlhf::reinforce(0.9));
  (void)rlpt::reinforce_pp_advantages(layout, dirty.rewards, b.mask, a2, r2, rlpt::compat::openrlhf::reinforce(0.9));
  same();
  std::vector<float> base(static_cast<std::size_t>(b.B), 0.5f);
  (void)rlpt::remax_advantages(layout, b.rewards, b.mask, base, a1, r1);
  (void)rlpt::remax_advantages(layout, dirty.rewards, b.mask, base, a2, r2);
  same();
  (void)rlpt::whiten(layout, b.rewards, b.mask, a1, rlpt::compat::areal::adv_norm());
  (void)rlpt::whiten(layout, dirty.rewards, b.mask, a2, rlpt::compat::areal::adv_norm());
  CHECK(std::memcmp(a1.data(), a2.data(), a1.size() * sizeof(float)) == 0);
  CHECK(rlpt::test::masked_zero(a1, b.mask));
}

TEST_CASE("gae: packed layout equals padded, a row's bits depend on that row only, any thread count") {
  const token_batch b = random_tokens(14, 40, 64);
  const auto padded = rlpt::token_layout::padded(b.B, b.T);
  // Packed copy: each row truncated to a random length (the rest is padding anyway).
  rlpt::test::rng r(15);
  std::vector<rlpt::index_t> offsets{0};
  token_batch packed;
  std::vector<rlpt::index_t> keep;
  for (rlpt::index_t i = 0; i < b.B; ++i) {
    rlpt::index_t last = 0;
    for (rlpt::index_t t = 0; t < b.T; ++t)
      if (b.mask[static_cast<std::size_t>(i * b.T + t)]) last = t + 1;
    const rlpt::index_t n = std::min(b.T, last + r.integer(0, 3));
    keep.push_back(n);
    for (rlpt::index_t t = 0; t < n; ++t) {
      const auto k = static_cast<std::size_t>(i * b.T + t);
      packed.rewards.push_back(b.rewards[k]);
      packed.values.push_back(b.values[k]);
      packed.mask.push_back(b.mask[k]);
    }
    offsets.push_back(offsets.back() + n);
  }
  const auto layout = rlpt::token_layout::packed(offsets);
  std::vector<float> a(b.rewards.size()), ret(a.size()), pa(packed.rewards.size()), pret(pa.size());
  const auto o = rlpt::gae_options{.gamma = 0.99, .lambda = 0.95};
  (void)rlpt::gae({.layout = padded, .rewards = b.rewards, .values = b.values, .mask = b.mask}, a, ret, o);
  rlpt::thread_pool pool(3);
  (void)rlpt::gae({.layout = layout, .rewards = packed.rewards, .values = packed.values, .mask = packed.mask}, pa, pret,
                  o, rlpt::host_executor{&pool});
  for (rlpt::index_t i = 0; i < b.B; ++i)
    for (rlpt::index_t t = 0; t < keep[static_cast<std::size_t>(i)]; ++t) {
      const auto k = static_cast<std::size_t>(offsets[static_cast<std::size_t>(i)] + t);
      CHECK(pa[k] == a[static_cast<std::size_t>(i * b.T + t)]);
      CHECK(pret[k] == ret[static_cast<std::size_t>(i * b.T + t)]);
    }
  // One row alone gives the same bits as inside the batch.
  const rlpt::index_t row = 5;
  std::vector<float> one(static_cast<std::size_t>(b.T)), one_ret(one.size());
  const auto sub = [&](const auto& v) { return std::vector(v.begin() + row * b.T, v.begin() + (row + 1) * b.T); };
  const auto r1 = sub(b.rewards), v1 = sub(b.values);
  const auto m1 = sub(b.mask);
  (void)rlpt::gae({.layout = rlpt::token_layout::padded(1, b.T), .rewards = r1, .values = v1, .mask = m1}, one, one_ret,
                  o);
  CHECK(one == sub(a));
}

TEST_CASE("gae bootstrap: the value after the last token (AReaL truncated sequences)") {
  token_batch b = random_tokens(16, 6, 12);
  std::fill(b.mask.begin(), b.mask.end(), std::uint8_t{1});
  const auto layout = rlpt::token_layout::padded(b.B, b.T);
  std::vector<float> boot = {0.5f, -1.0f, 0.0f, 2.0f, 0.25f, -0.75f};
  std::vector<float> adv(b.rewards.size()), ret(adv.size());
  (void)rlpt::gae({.layout = layout, .rewards = b.rewards, .values = b.values, .mask = b.mask, .bootstrap = boot}, adv,
                  ret, {.gamma = 0.9, .lambda = 0.8});
  // Bootstrapping adds gamma * V_T to the last TD error: A_t gains (gamma lambda)^(T-1-t) * gamma * V_T.
  const auto plain = naive_gae(b, 0.9, 0.8, rlpt::mask_mode::skip, &b.values);
  std::vector<double> want(plain);
  for (rlpt::index_t i = 0; i < b.B; ++i)
    for (rlpt::index_t t = 0; t < b.T; ++t)
      want[static_cast<std::size_t>(i * b.T + t)] +=
          std::pow(0.72, static_cast<double>(b.T - 1 - t)) * 0.9 * boot[static_cast<std::size_t>(i)];
  ADV_CHECK_CLOSE(adv, want, fp32_out);
}

TEST_CASE("whitening: each framework's formula, in fp64") {
  const token_batch b = random_tokens(17);
  const auto layout = rlpt::token_layout::padded(b.B, b.T);
  double n = 0, s = 0;
  for (std::size_t i = 0; i < b.mask.size(); ++i)
    if (b.mask[i]) {
      n += 1;
      s += b.rewards[i];
    }
  const double mu = s / n;
  double m2 = 0;
  for (std::size_t i = 0; i < b.mask.size(); ++i)
    if (b.mask[i]) m2 += (b.rewards[i] - mu) * (b.rewards[i] - mu);
  struct variant {
    rlpt::whiten_options o;
    double scale;
    double add;
  };
  const double vu = m2 / (n - 1), vb = m2 / n;
  for (const auto& v : {variant{rlpt::compat::verl::whiten(), 1 / std::sqrt(vu + 1e-8), 0},
                        variant{rlpt::compat::openrlhf::whiten(), 1 / std::sqrt(std::max(vb, 1e-8)), 0},
                        variant{rlpt::compat::openrlhf::whiten(true), 1, 0},
                        variant{rlpt::compat::areal::adv_norm(), 1 / (std::sqrt(vu) + 1e-5), 0},
                        variant{rlpt::whiten_options{.shift_mean = false}, 1 / std::sqrt(vu + 1e-8), mu}}) {
    std::vector<float> out(b.rewards.size());
    const auto r = rlpt::whiten(layout, b.rewards, b.mask, out, v.o);
    CHECK(r.stats.count == n);
    CHECK(r.mean == doctest::Approx(mu).epsilon(1e-12));
    std::vector<double> want(out.size(), 0.0);
    for (std::size_t i = 0; i < want.size(); ++i)
      if (b.mask[i]) want[i] = (b.rewards[i] - mu) * v.scale + v.add;
    ADV_CHECK_CLOSE(out, want, fp32_out);
  }
}

TEST_CASE("distributed whitening: merging k shards equals the single-shot result (empty shards included)") {
  const token_batch b = random_tokens(18, 40, 30);
  const auto layout = rlpt::token_layout::padded(b.B, b.T);
  std::vector<float> single(b.rewards.size());
  const auto o = rlpt::compat::verl::whiten();
  const auto ref = rlpt::whiten(layout, b.rewards, b.mask, single, o);
  for (const rlpt::index_t k : {rlpt::index_t{2}, rlpt::index_t{5}, rlpt::index_t{8}}) {
    CAPTURE(k);
    // Shard s owns rows [cut[s], cut[s+1]); shard 1 is empty and shard 2 holds only row 1 (no valid tokens).
    std::vector<rlpt::index_t> cut = {0, 1, 1, 2};
    for (rlpt::index_t s = 1; s <= k - 3; ++s) cut.push_back(2 + s * (b.B - 2) / (k - 2));
    cut.push_back(b.B);
    std::vector<rlpt::moments> parts;
    for (std::size_t s = 0; s + 1 < cut.size(); ++s) {
      const rlpt::index_t rows = cut[s + 1] - cut[s];
      const auto l = rlpt::token_layout::padded(rows, b.T);
      const auto off = static_cast<std::size_t>(cut[s] * b.T);
      parts.push_back(rlpt::whiten_moments(l, rlpt::view<const float>(b.rewards.data() + off, rows * b.T),
                                           rlpt::view<const rlpt::mask_t>(b.mask.data() + off, rows * b.T), o));
    }
    CHECK(parts[1].count == 0.0);
    CHECK(parts[2].count == 0.0);
    const rlpt::moments merged = rlpt::merge_moments(parts);
    CHECK(merged.count == ref.stats.count);
    CHECK(merged.mean == doctest::Approx(ref.stats.mean).epsilon(1e-14));
    CHECK(merged.m2 == doctest::Approx(ref.stats.m2).epsilon(1e-13));
    std::vector<float> out(b.rewards.size());
    for (std::size_t s = 0; s + 1 < cut.size(); ++s) {
      const rlpt::index_t rows = cut[s + 1] - cut[s];
      const auto off = static_cast<std::size_t>(cut[s] * b.T);
      (void)rlpt::whiten_apply(merged, rlpt::token_layout::padded(rows, b.T),
                               rlpt::view<const float>(b.rewards.data() + off, rows * b.T),
                               rlpt::view<const rlpt::mask_t>(b.mask.data() + off, rows * b.T),
                               rlpt::view<float>(out.data() + off, rows * b.T), o);
    }
    ADV_CHECK_CLOSE(out, single, (tolerance{2.5e-7, 1e-12}));
  }
}

TEST_CASE("whitening statistics do not depend on the thread count") {
  const token_batch b = random_tokens(19, 300, 400);
  const auto layout = rlpt::token_layout::padded(b.B, b.T);
  rlpt::thread_pool pool(4);
  const auto m1 = rlpt::whiten_moments(layout, b.rewards, b.mask);
  const auto m4 = rlpt::whiten_moments(layout, b.rewards, b.mask, {}, rlpt::host_executor{&pool});
  CHECK(m1.count == m4.count);
  CHECK(m1.mean == m4.mean);
  CHECK(m1.m2 == m4.m2);
}

TEST_CASE("nonfinite::mask in token estimators: the sequence is zeroed, counted, and left out of whitening") {
  token_batch b = random_tokens(20);
  const auto layout = rlpt::token_layout::padded(b.B, b.T);
  token_batch clean = b;
  // Poison a valid token of row 4 and of row 9.
  for (const rlpt::index_t row : {rlpt::index_t{4}, rlpt::index_t{9}})
    for (rlpt::index_t t = 0; t < b.T; ++t)
      if (b.mask[static_cast<std::size_t>(row * b.T + t)]) {
        b.values[static_cast<std::size_t>(row * b.T + t)] = std::numeric_limits<float>::quiet_NaN();
        for (rlpt::index_t u = 0; u < b.T; ++u) clean.mask[static_cast<std::size_t>(row * b.T + u)] = 0;
        break;
      }
  auto o = rlpt::compat::verl::gae(0.99, 0.95);
  o.on_nonfinite = rlpt::nonfinite::mask;
  std::vector<float> adv(b.rewards.size()), ret(adv.size()), cadv(adv.size()), cret(adv.size());
  const auto r = rlpt::gae({.layout = layout, .rewards = b.rewards, .values = b.values, .mask = b.mask}, adv, ret, o);
  CHECK(r.num_nonfinite_seqs == 2);
  (void)rlpt::gae({.layout = layout, .rewards = clean.rewards, .values = clean.values, .mask = clean.mask}, cadv, cret,
                  o);
  CHECK(adv == cadv); // the poisoned rows are all 0, the rest whitened without them
  CHECK(ret == cret);
}

TEST_CASE("token helpers: sums, lengths, last-token placement and broadcast on packed layouts") {
  const std::vector<rlpt::index_t> offsets = {0, 3, 3, 7};
  const auto layout = rlpt::token_layout::packed(offsets);
  const std::vector<float> tok = {1, 2, 3, /* empty */ 4, 5, 6, 7};
  const std::vector<std::uint8_t> mask = {1, 0, 1, 0, 1, 1, 0};
  std::vector<float> sums(3), all(3), placed(7), bc(7);
  std::vector<rlpt::index_t> len(3);
  rlpt::sum_token_rewards(layout, tok, mask, sums);
  rlpt::sum_token_rewards(layout, tok, {}, all);
  rlpt::valid_lengths(layout, mask, len);
  CHECK(sums == std::vector<float>{4, 0, 11});
  CHECK(all == std::vector<float>{6, 0, 22});
  CHECK(len == std::vector<rlpt::index_t>{2, 0, 2});
  const std::vector<float> seq = {10, 20, 30};
  rlpt::place_at_last_token(layout, seq, mask, placed);
  CHECK(placed == std::vector<float>{0, 0, 10, 0, 0, 30, 0});
  rlpt::broadcast_to_tokens(layout, seq, mask, bc);
  CHECK(bc == std::vector<float>{10, 0, 10, 0, 30, 30, 0});
}

TEST_CASE("shaping: overlong penalties (verl linear, OpenRLHF / TRL capped), truncation, channels, clip") {
  const std::vector<rlpt::index_t> lengths = {10, 80, 81, 90, 100, 120};
  std::vector<float> r(lengths.size(), 1.0f), capped = r;
  CHECK(rlpt::apply_overlong_penalty(lengths, r, rlpt::compat::verl::overlong(100, 20, 0.5)) == 4);
  CHECK(rlpt::apply_overlong_penalty(lengths, capped, rlpt::compat::openrlhf::overlong(100, 20, 0.5)) == 4);
  const std::vector<double> want = {1, 1, 1 - 0.5 / 20, 1 - 0.25, 0.5, 1 - 0.5 * 40 / 20};
  const std::vector<double> want_capped = {1, 1, 1 - 0.5 / 20, 1 - 0.25, 0.5, 0.5};
  ADV_CHECK_CLOSE(r, want, (tolerance{1e-7, 0}));
  ADV_CHECK_CLOSE(capped, want_capped, (tolerance{1e-7, 0}));
  CHECK(rlpt::overlong_penalty(101, rlpt::compat::trl::soft_overlong(100, 0)) == -1.0);
  CHECK(rlpt::overlong_penalty(100, rlpt::compat::trl::soft_overlong(100, 0)) == 0.0);

  std::vector<float> t = {1.0f, 0.5f, -2.0f, 4.0f};
  const std::vector<std::uint8_t> trunc = {1, 0, 1, 1};
  auto t2 = t, t3 = t;
  CHECK(rlpt::apply_truncation(trunc, t, rlpt::compat::openrlhf::stop_properly(0.5)) == 3);
  CHECK(t == std::vector<float>{0.5f, 0.5f, -1.0f, 2.0f});
  (void)rlpt::apply_truncation(trunc, t2, rlpt::compat::openrlhf::stop_properly(-0.5));
  CHECK(t2 == std::vector<float>{-0.5f, 0.5f, -0.5f, -0.5f});
  (void)rlpt::apply_truncation(trunc, t3, rlpt::compat::areal::mask_no_eos_with_zero());
  CHECK(t3 == std::vector<float>{0.0f, 0.5f, 0.0f, 0.0f});

  std::vector<std::uint8_t> mask(8, 1);
  const std::vector<rlpt::index_t> off = {0, 3, 5, 8};
  const std::vector<std::uint8_t> tr = {0, 1, 0};
  CHECK(rlpt::mask_truncated_tokens(rlpt::token_layout::packed(off), tr, mask) == 1);
  CHECK(mask == std::vector<std::uint8_t>{1, 1, 1, 0, 0, 1, 1, 1});

  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> ch = {1, 2, nan, 4, nan, nan};
  const std::vector<float> w = {0.5f, 2.0f};
  std::vector<float> out(3);
  CHECK(rlpt::combine_reward_channels(rlpt::view2d<const float>(ch.data(), 3, 2), w, out,
                                      rlpt::compat::trl::channels()) == 1);
  CHECK(out[0] == 4.5f);
  CHECK(out[1] == 8.0f);
  CHECK(std::isnan(out[2]));

  std::vector<float> x = {1.9f, -3.0f, 0.0f, nan};
  rlpt::transform_rewards(x, rlpt::compat::areal::rewards(-0.5, 10.0, 4.0));
  CHECK(x[0] == 4.0f);
  CHECK(x[1] == -4.0f);
  CHECK(x[2] == -4.0f);
  CHECK(std::isnan(x[3]));
}

#if defined(__linux__)
#include "support/pages.hpp"

TEST_CASE("token writers map a fresh output's pages in one call, padding between rows included") {
  // Rows of one token every two pages: the writers store into every other page only, so a page
  // between two rows is mapped only if the writer mapped the whole output first (core/copy.hpp).
  if (!rlpt::test::kernel_populates()) return; // a kernel before 5.14: the mapping is a no-op
  const std::size_t page = rlpt::test::page_size();
  const rlpt::index_t stride = static_cast<rlpt::index_t>(2 * page / sizeof(float)), B = 256;
  const auto n = static_cast<std::size_t>(B * stride);
  const auto layout = rlpt::token_layout::padded(B, 1, stride);
  const std::vector<float> rewards(n, 0.5f), values(n, 0.25f), per_seq(static_cast<std::size_t>(B), 1.0f);
  const std::vector<float> baselines(static_cast<std::size_t>(B), 0.0f);
  const std::vector<std::uint8_t> mask(n, 1);
  // write(advantages, returns): a writer of one output ignores the second.
  const auto check = [&](const char* what, bool two_outputs, const auto& write) {
    INFO(what);
    const rlpt::test::fresh_mapping a(n * sizeof(float)), r(n * sizeof(float));
    write(rlpt::view<float>(a.as<float>(), static_cast<rlpt::index_t>(n)),
          rlpt::view<float>(r.as<float>(), static_cast<rlpt::index_t>(n)));
    CHECK(a.resident() == a.pages());
    if (two_outputs) CHECK(r.resident() == r.pages());
    CHECK(a.as<float>()[0] != 0.0f); // and the rows were written
  };
  const rlpt::gae_inputs in{.layout = layout, .rewards = rewards, .values = values, .mask = mask};
  check("gae", true, [&](rlpt::view<float> a, rlpt::view<float> r) { (void)rlpt::gae(in, a, r); });
  check("gae, whitened", true, [&](rlpt::view<float> a, rlpt::view<float> r) {
    (void)rlpt::gae(in, a, r, {.whiten = rlpt::whiten_options{.shift_mean = false}});
  });
  check("discounted returns", false,
        [&](rlpt::view<float> a, rlpt::view<float>) { (void)rlpt::discounted_returns(layout, rewards, mask, a); });
  check("REINFORCE++", true, [&](rlpt::view<float> a, rlpt::view<float> r) {
    (void)rlpt::reinforce_pp_advantages(layout, rewards, mask, a, r, {.whiten = {}});
  });
  check("ReMax", true, [&](rlpt::view<float> a, rlpt::view<float> r) {
    (void)rlpt::remax_advantages(layout, rewards, mask, baselines, a, r);
  });
  check("whiten_apply", false, [&](rlpt::view<float> a, rlpt::view<float>) {
    rlpt::moments m;
    m.count = 4.0, m.mean = 0.0, m.m2 = 4.0;
    (void)rlpt::whiten_apply(m, layout, rewards, mask, a);
  });
  check("broadcast_to_tokens", false,
        [&](rlpt::view<float> a, rlpt::view<float>) { rlpt::broadcast_to_tokens(layout, per_seq, mask, a); });
  check("place_at_last_token", false,
        [&](rlpt::view<float> a, rlpt::view<float>) { rlpt::place_at_last_token(layout, per_seq, mask, a); });
}
#endif
