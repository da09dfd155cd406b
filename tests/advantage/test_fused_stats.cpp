// SPDX-License-Identifier: Apache-2.0
// The fast paths of the advantage block against their definitions: the whitening statistics GAE
// and REINFORCE++ take in their own pass (detail::whiten_sums) against whiten_moments and an fp64
// two-pass reference, and the one-member-per-lane group moments against canonical_sum.
#include <rlpt/advantage.hpp>
#if __has_include(<rlpt/core/thread_pool.hpp>)
#include <rlpt/core/thread_pool.hpp> // (thread_pool is moving out of executor.hpp)
#endif

#include "support/random.hpp"

#include <doctest/doctest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

namespace {

struct batch {
  rlpt::index_t B = 0, T = 0;
  std::vector<float> rewards, values;
  std::vector<std::uint8_t> mask;
};

// Ragged masks with holes (multi-turn tool tokens), fully masked rows, odd B and T.
batch make_batch(std::uint64_t stream, rlpt::index_t B, rlpt::index_t T, float offset = 0.0f) {
  rlpt::test::rng r(stream);
  batch b{B, T, r.normals(static_cast<std::size_t>(B * T), 0.0, 0.3), r.normals(static_cast<std::size_t>(B * T)),
          std::vector<std::uint8_t>(static_cast<std::size_t>(B * T), 0)};
  for (rlpt::index_t i = 0; i < B; ++i) {
    const rlpt::index_t len = i % 7 == 3 ? 0 : r.integer(1, T);
    for (rlpt::index_t t = 0; t < len; ++t) b.mask[static_cast<std::size_t>(i * T + t)] = r.bernoulli(0.85) ? 1 : 0;
  }
  for (auto& x : b.rewards) x += offset;
  return b;
}

// fp64 two-pass moments of the valid values (the definition).
rlpt::moments two_pass(const std::vector<float>& x, const std::vector<std::uint8_t>& m) {
  double n = 0, s = 0;
  for (std::size_t i = 0; i < x.size(); ++i)
    if (m[i]) n += 1, s += x[i];
  rlpt::moments r;
  r.count = n;
  if (n == 0) return r;
  r.mean = s / n;
  for (std::size_t i = 0; i < x.size(); ++i)
    if (m[i]) r.m2 += (x[i] - r.mean) * (x[i] - r.mean);
  return r;
}

} // namespace

TEST_CASE("GAE whitening statistics taken in the recurrence pass equal whiten_moments of its advantages") {
  for (const auto mode : {rlpt::mask_mode::skip, rlpt::mask_mode::zero, rlpt::mask_mode::reset})
    for (const auto& shape : {std::pair<rlpt::index_t, rlpt::index_t>{13, 37}, {8, 64}, {1, 1}, {3, 1000}}) {
      const rlpt::index_t B = shape.first, T = shape.second;
      CAPTURE(B);
      CAPTURE(T);
      const batch b = make_batch(static_cast<std::uint64_t>(B * 1000 + T), B, T);
      const auto layout = rlpt::token_layout::padded(B, T);
      const rlpt::gae_inputs in{.layout = layout, .rewards = b.rewards, .values = b.values, .mask = b.mask};
      auto o = rlpt::compat::verl::gae(0.99, 0.95);
      o.masked = mode;
      o.whiten->on_too_few = rlpt::too_few::unit_std;
      std::vector<float> adv(b.rewards.size()), ret(adv.size()), raw(adv.size()), raw_ret(adv.size());
      const rlpt::gae_result r = rlpt::gae(in, adv, ret, o);
      auto plain = o;
      plain.whiten.reset();
      (void)rlpt::gae(in, raw, raw_ret, plain);
      CHECK(ret == raw_ret);
      const rlpt::moments m = rlpt::whiten_moments(layout, raw, b.mask);
      REQUIRE(r.whitening.has_value());
      CHECK(r.whitening->stats.count == m.count);
      CHECK(r.whitening->stats.mean == m.mean); // the same additions in the same order
      CHECK(r.whitening->stats.m2 == m.m2);
      const rlpt::moments ref = two_pass(raw, b.mask);
      CHECK(m.count == ref.count);
      CHECK(m.mean == doctest::Approx(ref.mean).epsilon(1e-12).scale(1.0));
      CHECK(m.m2 == doctest::Approx(ref.m2).epsilon(1e-12).scale(1.0));
      std::vector<float> sep(adv.size());
      (void)rlpt::whiten(layout, raw, b.mask, sep, *o.whiten);
      CHECK(adv == sep);
      // Masked tokens hold +0.0, bit for bit (== would let -0.0 through), on every path.
      std::size_t not_plus_zero = 0;
      for (std::size_t i = 0; i < adv.size(); ++i)
        if (b.mask[i] == 0)
          for (const float y : {adv[i], ret[i], raw[i], sep[i]}) not_plus_zero += std::bit_cast<std::uint32_t>(y) != 0u;
      CHECK(not_plus_zero == 0);
    }
}

TEST_CASE("whitening sums: shifted one-pass fp64, exact on constant rows, no cancellation at a large mean") {
  // A constant value: M2 == 0 exactly (the shift is the value itself).
  std::vector<float> c(999, 0.35f);
  const std::vector<std::uint8_t> all(c.size(), 1);
  const rlpt::moments mc = rlpt::whiten_moments(rlpt::token_layout::padded(9, 111), c, all);
  CHECK(mc.count == 999.0);
  CHECK(mc.m2 == 0.0);
  CHECK(mc.mean == static_cast<double>(0.35f));
  // Mean 1e4, std 1e-2: a plain sum of squares would lose the variance; the shifted sums do not.
  const batch b = make_batch(5, 17, 301, 1.0e4f);
  std::vector<float> x = b.rewards;
  for (auto& v : x) v = 1.0e4f + (v - 1.0e4f) * 0.03f;
  const auto layout = rlpt::token_layout::padded(b.B, b.T);
  const rlpt::moments m = rlpt::whiten_moments(layout, x, b.mask);
  const rlpt::moments ref = two_pass(x, b.mask);
  CHECK(m.mean == doctest::Approx(ref.mean).epsilon(1e-14));
  CHECK(m.m2 == doctest::Approx(ref.m2).epsilon(1e-9));
  // Any thread count, and masked garbage never read.
  rlpt::thread_pool pool(3);
  const rlpt::moments m3 = rlpt::whiten_moments(layout, x, b.mask, {}, rlpt::host_executor{&pool});
  CHECK(m3.mean == m.mean);
  CHECK(m3.m2 == m.m2);
  std::vector<float> dirty = x;
  for (std::size_t i = 0; i < dirty.size(); ++i)
    if (!b.mask[i]) dirty[i] = std::numeric_limits<float>::quiet_NaN();
  const rlpt::moments md = rlpt::whiten_moments(layout, dirty, b.mask);
  CHECK(md.mean == m.mean);
  CHECK(md.m2 == m.m2);
}

TEST_CASE("GAE across thread counts and row splits: the same bits") {
  const batch b = make_batch(23, 29, 203);
  const auto layout = rlpt::token_layout::padded(b.B, b.T);
  const rlpt::gae_inputs in{.layout = layout, .rewards = b.rewards, .values = b.values, .mask = b.mask};
  auto o = rlpt::compat::verl::gae(1.0, 0.95);
  o.whiten->on_too_few = rlpt::too_few::unit_std;
  std::vector<float> a1(b.rewards.size()), r1(a1.size()), a3(a1.size()), r3(a1.size());
  (void)rlpt::gae(in, a1, r1, o);
  rlpt::thread_pool pool(3);
  (void)rlpt::gae(in, a3, r3, o, rlpt::host_executor{&pool});
  CHECK(a1 == a3);
  CHECK(r1 == r3);
}

namespace {

//! The recurrence stepping through every token of every row (what one_sequence did before it
//! skipped padding): its outputs and whitening sums.
template <rlpt::mask_mode Mode>
void step_every_token(const batch& b, const std::vector<float>& boot, std::vector<float>& adv, std::vector<float>& ret,
                      std::vector<rlpt::detail::whiten_sums>& sums) {
  namespace lanes = rlpt::detail::lanes;
  const double gamma = 0.99, gamma_lambda = 0.99 * 0.9;
  for (rlpt::index_t i = 0; i < b.B; ++i) {
    lanes::state<double, bool> s =
        lanes::start(boot.empty() ? 0.0 : static_cast<double>(boot[static_cast<std::size_t>(i)]));
    for (rlpt::index_t t = b.T - 1; t >= 0; --t) {
      const auto k = static_cast<std::size_t>(i * b.T + t);
      double a = 0.0, g = 0.0;
      lanes::step<Mode>(static_cast<double>(b.rewards[k]), static_cast<double>(b.values[k]), b.mask[k] != 0, gamma,
                        gamma_lambda, s, a, g);
      adv[k] = static_cast<float>(a);
      ret[k] = static_cast<float>(g);
      lanes::add_value(static_cast<double>(adv[k]), b.mask[k] != 0, s);
    }
    sums[static_cast<std::size_t>(i)] = lanes::sums_of(s);
  }
}

template <rlpt::mask_mode Mode> void check_padding_skip(const batch& b, const std::vector<float>& boot) {
  const auto layout = rlpt::token_layout::padded(b.B, b.T);
  const auto n = b.rewards.size(), rows = static_cast<std::size_t>(b.B);
  std::vector<float> want_a(n), want_r(n), got_a(n, -7.0f), got_r(n, -7.0f);
  std::vector<rlpt::detail::whiten_sums> want_s(rows), got_s(rows);
  std::vector<std::uint8_t> ok(rows, 1);
  step_every_token<Mode>(b, boot, want_a, want_r, want_s);
  rlpt::detail::recurrence_rows<Mode, true, true>(layout, b.rewards.data(), b.values.data(), b.mask.data(),
                                                  boot.empty() ? nullptr : boot.data(), 0.99, 0.99 * 0.9, got_a.data(),
                                                  got_r.data(), 0, b.B, got_s.data(), ok.data());
  CHECK(std::memcmp(got_a.data(), want_a.data(), n * sizeof(float)) == 0);
  CHECK(std::memcmp(got_r.data(), want_r.data(), n * sizeof(float)) == 0);
  for (std::size_t i = 0; i < rows; ++i) {
    INFO("row ", i);
    CHECK(std::memcmp(&got_s[i], &want_s[i], sizeof got_s[i]) == 0);
  }
}

} // namespace

TEST_CASE("GAE skips a padded row's padding only where stepping through it changes no bit") {
  // Rows with long masked tails (whole rows among them), holes, and rewards of -0.0 at their last
  // valid token; bootstraps absent, +0.0, -0.0 and nonzero, where the zero and reset modes must
  // step through the padding (the value after the last token moves to 0 there).
  batch b = make_batch(41, 23, 150);
  for (rlpt::index_t i = 0; i < b.B; ++i) {
    const auto row = static_cast<std::size_t>(i * b.T);
    const rlpt::index_t end = rlpt::detail::end_of_valid(b.mask.data() + row, b.T);
    if (end > 0 && i % 3 == 0) b.rewards[row + static_cast<std::size_t>(end - 1)] = -0.0f;
    if (i % 4 == 1)
      for (rlpt::index_t t = b.T / 3; t < b.T; ++t) b.mask[row + static_cast<std::size_t>(t)] = 0;
  }
  rlpt::test::rng r(42);
  const std::vector<float> nonzero = r.normals(static_cast<std::size_t>(b.B));
  for (const std::vector<float>& boot : {std::vector<float>{}, std::vector<float>(static_cast<std::size_t>(b.B), 0.0f),
                                         std::vector<float>(static_cast<std::size_t>(b.B), -0.0f), nonzero}) {
    INFO("bootstrap ", boot.empty() ? "none" : boot[0] == 0.0f ? (std::signbit(boot[0]) ? "-0" : "+0") : "nonzero");
    check_padding_skip<rlpt::mask_mode::skip>(b, boot);
    check_padding_skip<rlpt::mask_mode::zero>(b, boot);
    check_padding_skip<rlpt::mask_mode::reset>(b, boot);
  }
}

TEST_CASE("group moments, one member per lane (n <= 32), equal the canonical sums bit for bit") {
  rlpt::test::rng r(41);
  for (int trial = 0; trial < 400; ++trial) {
    const auto n = static_cast<rlpt::index_t>(r.integer(1, 40));
    std::vector<float> x(static_cast<std::size_t>(n));
    for (auto& v : x) {
      const double u = r.uniform();
      v = u < 0.05   ? std::numeric_limits<float>::quiet_NaN()
          : u < 0.08 ? -0.0f
          : u < 0.5  ? 0.35f
                     : static_cast<float>(r.normal(3.0, 2.0));
    }
    const auto get = [&](rlpt::index_t k) { return x[static_cast<std::size_t>(k)]; };
    const auto m = rlpt::detail::moments_canonical(n, get);
    // The definition: canonical_sum of the finite values, then of the squared deviations.
    double count = 0;
    for (float v : x) count += rlpt::detail::finite(v) ? 1 : 0;
    CHECK(m.count == count);
    if (count == 0) continue;
    const double mean =
        rlpt::detail::canonical_sum(
            n, [&](rlpt::index_t k) { return rlpt::detail::finite(get(k)) ? static_cast<double>(get(k)) : 0.0; }) /
        count;
    const double m2 = rlpt::detail::canonical_sum(n, [&](rlpt::index_t k) {
      if (!rlpt::detail::finite(get(k))) return 0.0;
      const double d = static_cast<double>(get(k)) - mean;
      return d * d;
    });
    CHECK(std::signbit(m.mean) == std::signbit(mean));
    CHECK(m.mean == mean);
    CHECK(m.m2 == m2);
  }
}

TEST_CASE("the AVX2 build of the whitening pass gives the bits of the baseline build") {
#if RLPT_ISA_DISPATCH()
  if (!rlpt::detail::cpu_has_avx2()) return;
  rlpt::test::rng r(41);
  const rlpt::detail::whiten_transform tr{0.37, 1.0 / 0.83, 0.0};
  const rlpt::detail::whiten_transform tr_back{0.37, 1.0 / 0.83, 0.37}; // scale only
  for (const rlpt::index_t n : {1, 3, 7, 8, 9, 31, 64, 1000, 4099}) {
    std::vector<float> x = r.normals(static_cast<std::size_t>(n), 0.4, 1.7);
    const std::vector<std::uint8_t> m = r.mask(static_cast<std::size_t>(n), 0.8);
    x[static_cast<std::size_t>(n) / 2] = std::numeric_limits<float>::quiet_NaN(); // counted where valid
    if (n > 4) x[3] = -std::numeric_limits<float>::infinity();
    for (const auto& t : {tr, tr_back}) {
      CAPTURE(n);
      std::vector<float> a(x.size()), b(x.size());
      CHECK(rlpt::detail::whiten_span_body<true>(x.data(), m.data(), a.data(), n, t) ==
            rlpt::detail::whiten_span_avx2<true>(x.data(), m.data(), b.data(), n, t));
      CHECK(std::memcmp(a.data(), b.data(), sizeof(float) * a.size()) == 0);
      CHECK(rlpt::detail::whiten_span_body<false>(x.data(), nullptr, a.data(), n, t) ==
            rlpt::detail::whiten_span_avx2<false>(x.data(), nullptr, b.data(), n, t));
      CHECK(std::memcmp(a.data(), b.data(), sizeof(float) * a.size()) == 0);
      std::vector<float> in_place = x; // in place: one pointer
      rlpt::detail::whiten_span_avx2<true>(in_place.data(), m.data(), in_place.data(), n, t);
      rlpt::detail::whiten_span_body<true>(x.data(), m.data(), a.data(), n, t);
      CHECK(std::memcmp(a.data(), in_place.data(), sizeof(float) * a.size()) == 0);
    }
  }
#else
  MESSAGE("no AVX2 build of the whitening pass here");
#endif
}
