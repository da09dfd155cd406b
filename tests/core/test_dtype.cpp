// SPDX-License-Identifier: Apache-2.0
#include <rlpt/core/dtype.hpp>

#include "support/errors.hpp"
#include "support/random.hpp"

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>

namespace {

// Reference float -> bf16: truncation gives the neighbour toward zero (lo), the next pattern
// the neighbour away from zero (hi, where one past the largest finite value stands for 2^128,
// the IEEE overflow rule); round to nearest by comparing magnitudes in exact double arithmetic.
std::uint16_t bf16_reference(float f) {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(f);
  const auto lo = static_cast<std::uint16_t>(u >> 16);
  const auto hi = static_cast<std::uint16_t>(lo + 1);
  const double a = std::fabs(static_cast<double>(f));
  const double alo = std::fabs(static_cast<double>(std::bit_cast<float>(std::uint32_t{lo} << 16)));
  const double ahi = (hi & 0x7fffu) == 0x7f80u
                         ? std::ldexp(1.0, 128)
                         : std::fabs(static_cast<double>(std::bit_cast<float>(std::uint32_t{hi} << 16)));
  const double mid = (alo + ahi) / 2;
  if (a < mid) return lo;
  if (a > mid) return hi;
  return (lo & 1u) ? hi : lo;
}

} // namespace

TEST_CASE("dtype tags: sizes, names, static mapping") {
  CHECK(rlpt::size_of(rlpt::dtype::bf16) == 2);
  CHECK(rlpt::size_of(rlpt::dtype::f64) == 8);
  CHECK(rlpt::size_of(rlpt::dtype::u8) == 1);
  CHECK(rlpt::name(rlpt::dtype::bf16) == "bf16");
  CHECK(rlpt::dtype_of<const float> == rlpt::dtype::f32);
  CHECK(rlpt::dtype_of<rlpt::f16> == rlpt::dtype::f16);
  CHECK(fmt::format("{}", rlpt::dtype::i64) == "i64");
}

TEST_CASE("bf16 -> float is exact and float -> bf16 rounds to nearest even") {
  for (std::uint32_t b = 0; b <= 0xffffu; ++b) {
    const auto h = rlpt::bf16::from_bits(static_cast<std::uint16_t>(b));
    const float f = static_cast<float>(h);
    if (std::isnan(f)) {
      CHECK(std::isnan(static_cast<float>(rlpt::bf16(f))));
      continue;
    }
    REQUIRE(rlpt::bf16(f).bits == b); // exact round trip for every non-NaN pattern
  }
  rlpt::test::rng r(1);
  for (int i = 0; i < 200000; ++i) {
    const auto u = static_cast<std::uint32_t>(r.integer(0, 0xffffffffLL));
    const float f = std::bit_cast<float>(u);
    if (std::isnan(f)) continue;
    REQUIRE_MESSAGE(rlpt::bf16(f).bits == bf16_reference(f), "bits 0x", std::hex, u);
  }
  CHECK(rlpt::bf16(1.00390625f).bits == rlpt::bf16(1.0f).bits);      // tie, even stays
  CHECK(rlpt::bf16(1.01171875f).bits == rlpt::bf16(1.015625f).bits); // tie, odd rounds up
  CHECK(std::isnan(static_cast<float>(rlpt::bf16(std::numeric_limits<float>::quiet_NaN()))));
}

TEST_CASE("f16 conversions match the compiler's IEEE binary16 in both directions") {
  for (std::uint32_t b = 0; b <= 0xffffu; ++b) {
    const auto bits = static_cast<std::uint16_t>(b);
    _Float16 ref;
    std::memcpy(&ref, &bits, 2);
    const float want = static_cast<float>(ref);
    const float got = static_cast<float>(rlpt::f16::from_bits(bits));
    if (std::isnan(want)) {
      REQUIRE(std::isnan(got));
      continue;
    }
    REQUIRE(std::bit_cast<std::uint32_t>(got) == std::bit_cast<std::uint32_t>(want));
    REQUIRE(rlpt::f16(got).bits == bits);
  }
  rlpt::test::rng r(2);
  for (int i = 0; i < 300000; ++i) {
    // Mostly the interesting range: subnormal halves up to past the largest finite half.
    const float f = i % 2 ? std::bit_cast<float>(static_cast<std::uint32_t>(r.integer(0x32000000LL, 0x47900000LL)))
                          : std::bit_cast<float>(static_cast<std::uint32_t>(r.integer(0, 0xffffffffLL)));
    if (std::isnan(f)) continue;
    const _Float16 ref = static_cast<_Float16>(f);
    std::uint16_t want;
    std::memcpy(&want, &ref, 2);
    REQUIRE_MESSAGE(rlpt::f16(f).bits == want, "float bits 0x", std::hex, std::bit_cast<std::uint32_t>(f));
    REQUIRE(rlpt::f16(-f).bits == static_cast<std::uint16_t>(want ^ 0x8000u));
  }
}

TEST_CASE("dispatch_floating picks the static type and rejects integers by name") {
  const auto bytes = rlpt::dispatch_floating(rlpt::dtype::bf16, "logits",
                                             [](auto tag) { return sizeof(typename decltype(tag)::type); });
  CHECK(bytes == 2);
  RLPT_CHECK_ERROR(rlpt::dispatch_floating(rlpt::dtype::i32, "logits", [](auto) { return 0; }),
                   "rlpt.dtype.unsupported", "logits has dtype i32");
}
