// SPDX-License-Identifier: Apache-2.0
#include <rlpt/core/stats.hpp>

#include "support/random.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <vector>

namespace {

// Naive fp64 reference: mean, then squared deviations (long double for headroom).
struct naive {
  long double mean = 0, m2 = 0;
  std::size_t n = 0;
};
naive reference(const std::vector<double>& x) {
  naive r;
  for (double v : x) r.mean += v;
  r.n = x.size();
  r.mean /= static_cast<long double>(x.size());
  for (double v : x) r.m2 += (v - r.mean) * (v - r.mean);
  return r;
}

} // namespace

TEST_CASE("moments: two-pass and Welford agree with an fp64 reference") {
  rlpt::test::rng r(10);
  const auto x = r.normals<double>(10000, 3.0, 2.0);
  const auto ref = reference(x);
  const auto two_pass = rlpt::moments_of(x);
  rlpt::moments welford;
  for (double v : x) welford.add(v);
  for (const auto& m : {two_pass, welford}) {
    CHECK(m.count == 10000.0);
    CHECK(m.mean == doctest::Approx(static_cast<double>(ref.mean)).epsilon(1e-14));
    CHECK(m.m2 == doctest::Approx(static_cast<double>(ref.m2)).epsilon(1e-12));
  }
  CHECK(two_pass.variance(true) == doctest::Approx(static_cast<double>(ref.m2) / 9999.0).epsilon(1e-12));
  CHECK(two_pass.variance(false) == doctest::Approx(static_cast<double>(ref.m2) / 10000.0).epsilon(1e-12));
}

TEST_CASE("moments: no catastrophic cancellation for large offsets") {
  // Naive E[x^2] - E[x]^2 in fp64 loses every digit here; two-pass and Welford do not.
  std::vector<double> x;
  for (int i = 0; i < 1000; ++i) x.push_back(1e9 + (i % 3) * 0.1);
  const auto ref = reference(x);
  rlpt::moments w;
  for (double v : x) w.add(v);
  CHECK(rlpt::moments_of(x).variance(false) == doctest::Approx(static_cast<double>(ref.m2) / 1000).epsilon(1e-6));
  CHECK(w.variance(false) == doctest::Approx(static_cast<double>(ref.m2) / 1000).epsilon(1e-6));
}

TEST_CASE("moments: merging k shards equals the single-shot result, empty shards included") {
  rlpt::test::rng r(11);
  const auto x = r.normals<double>(5003, -1.0, 0.5);
  const auto whole = rlpt::moments_of(x);
  for (int k : {1, 2, 7, 64}) {
    rlpt::moments merged;
    const std::size_t step = (x.size() + static_cast<std::size_t>(k) - 1) / static_cast<std::size_t>(k);
    for (std::size_t b = 0; b < x.size(); b += step) {
      const std::vector<double> part(x.begin() + static_cast<std::ptrdiff_t>(b),
                                     x.begin() + static_cast<std::ptrdiff_t>(std::min(x.size(), b + step)));
      merged.merge(rlpt::moments_of(part));
      merged.merge(rlpt::moments{}); // a rank with zero valid elements still participates
    }
    CHECK(merged.count == whole.count);
    CHECK(merged.mean == doctest::Approx(whole.mean).epsilon(1e-13));
    CHECK(merged.m2 == doctest::Approx(whole.m2).epsilon(1e-12));
  }
  rlpt::moments empty;
  empty.merge(whole);
  CHECK(empty.m2 == whole.m2);
}

TEST_CASE("moments: masked values never reach the result, even NaN or huge garbage") {
  rlpt::test::rng r(12);
  auto x = r.normals<float>(2000);
  const auto mask = r.mask(2000, 0.6);
  const auto clean = rlpt::moments_of(x, mask);
  for (std::size_t i = 0; i < x.size(); ++i)
    if (!mask[i]) x[i] = (i % 2) ? std::numeric_limits<float>::quiet_NaN() : 3e38f;
  const auto dirty = rlpt::moments_of(x, mask);
  CHECK(dirty.count == clean.count);
  CHECK(dirty.mean == clean.mean);
  CHECK(dirty.m2 == clean.m2);
  const std::vector<std::uint8_t> none(2000, 0);
  CHECK(rlpt::moments_of(x, none).count == 0.0);
}

TEST_CASE("moments: edge cases of variance") {
  rlpt::moments one;
  one.add(5.0);
  CHECK(one.variance(false) == 0.0);
  CHECK(std::isnan(one.variance(true))); // unbiased variance of one value is undefined, as in torch
  CHECK(rlpt::moments{}.variance(false) == 0.0);
}
