// SPDX-License-Identifier: Apache-2.0
// core's exp (core/exp.hpp): within 2 ulp of the true value, special values as documented, and
// the logprob row kernels' SIMD packs (logprob/detail/simd.hpp) giving the same bits lane by lane
// at every pack width, so the objective's terms and the logprob rows share one exp.
#include <rlpt/core/exp.hpp>
#include <rlpt/core/float_bits.hpp>
#include <rlpt/logprob/detail/simd.hpp>
#include <rlpt/logprob/math.hpp>

#include "support/reference.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace rd = rlpt::detail;
namespace simd = rlpt::detail::simd;
using rlpt::test::ulps;

namespace {

bool same_bits(float a, float b) { return rd::float_bits(a) == rd::float_bits(b); }

// Every input through simd::exp and simd::shifted_exp at pack width NB, 16 lanes at a time; the
// index of the first lane whose bits differ from the scalar functions', or -1.
template <int NB> long first_mismatch(const std::vector<float>& xs) {
  for (std::size_t i = 0; i + simd::lanes <= xs.size(); i += simd::lanes) {
    float in[simd::lanes], e[simd::lanes], s[simd::lanes], dc[simd::lanes];
    std::copy_n(xs.data() + i, simd::lanes, in);
    const simd::vf<NB> x = simd::from_array<NB>(in);
    simd::vf<NB> vdc;
    simd::to_array(simd::exp<NB>(x), e);
    simd::to_array(simd::shifted_exp<NB>(x, vdc), s);
    simd::to_array(vdc, dc);
    for (int l = 0; l < simd::lanes; ++l) {
      float want_dc = 0;
      const float want_s = rd::shifted_exp(in[l], want_dc);
      const bool shifted_defined = !(in[l] > 0.0f); // shifted_exp takes d <= 0 (and NaN)
      if (!same_bits(e[l], rd::exp_poly(in[l])) ||
          (shifted_defined && (!same_bits(s[l], want_s) || !same_bits(dc[l], want_dc))))
        return static_cast<long>(i) + l;
    }
  }
  return -1;
}

} // namespace

TEST_CASE("exp_poly: within 2 ulp of the true value on [-87, 88], special values") {
  // every 97th float of magnitude up to 88 (11.4 million), both signs down to -87
  double worst = 0;
  float worst_x = 0;
  for (std::uint32_t b = 0; b <= 0x42b00000u; b += 97)
    for (const float v : {rd::bits_float(b), -rd::bits_float(b)}) {
      if (v < -87.0f) continue;
      const double u = ulps(rd::exp_poly(v), std::exp(static_cast<double>(v)));
      if (u > worst) worst = u, worst_x = v;
    }
  MESSAGE("worst exp_poly error ", worst, " ulp at x = ", worst_x);
  CHECK(worst <= 2.0);
  // the ends and the rounding boundaries of n, where r reaches +-ln2 / 2
  for (const float v : {-87.0f, 88.0f, 0.34657359f, -0.34657359f, 1.0397208f, -86.99999f, 87.99999f})
    CHECK(ulps(rd::exp_poly(v), std::exp(static_cast<double>(v))) <= 2.0);
  constexpr float inf = std::numeric_limits<float>::infinity();
  CHECK(rd::exp_poly(0.0f) == 1.0f);
  CHECK(rd::exp_poly(-0.0f) == 1.0f);
  CHECK(rd::exp_poly(-87.0001f) == 0.0f);
  CHECK(rd::exp_poly(-100.0f) == 0.0f);
  CHECK(rd::exp_poly(-inf) == 0.0f);
  CHECK(rd::exp_poly(inf) == rd::exp_poly(88.0f));
  CHECK(std::isfinite(rd::exp_poly(88.0f)));
  CHECK(std::isnan(rd::exp_poly(std::numeric_limits<float>::quiet_NaN())));
  float dc = 0;
  CHECK(rd::shifted_exp(-inf, dc) == 0.0f);
  CHECK(dc == -87.0f);
  CHECK(rd::shifted_exp(-1.0f, dc) == rd::exp_poly(-1.0f));
  CHECK(dc == -1.0f);
}

TEST_CASE("simd::exp and simd::shifted_exp: the scalar functions' bits in every lane, at every pack width") {
  std::vector<float> xs;
  for (std::uint32_t b = 0; b <= 0x42c00000u; b += 1009) // magnitudes up to 96: both clamps
    xs.push_back(rd::bits_float(b)), xs.push_back(-rd::bits_float(b));
  constexpr float inf = std::numeric_limits<float>::infinity();
  for (const float v : {0.0f, -0.0f, inf, -inf, std::numeric_limits<float>::quiet_NaN(), -87.0f, 88.0f, -87.0001f,
                        0.34657359f, -0.34657359f})
    xs.push_back(v);
  while (xs.size() % simd::lanes != 0) xs.push_back(0.5f);
  CHECK(first_mismatch<simd::baseline_bytes>(xs) == -1);
#if RLPT_LOGPROB_VECTOR_EXT()
  CHECK(first_mismatch<16>(xs) == -1);
  CHECK(first_mismatch<32>(xs) == -1);
  CHECK(first_mismatch<64>(xs) == -1);
#endif
}
