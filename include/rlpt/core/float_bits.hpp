// SPDX-License-Identifier: Apache-2.0
//! @file
//! Branch-free helpers on floating-point bits that every block's per-element loops share, host
//! and device: a float's bits and back, a finiteness test that -ffast-math cannot fold away,
//! and a select that keeps a host loop vectorisable.
#pragma once

#include <rlpt/config.hpp>

#include <bit>
#include <cstdint>
#include <cstring>

RLPT_NAMESPACE_BEGIN
namespace detail {

//! The bits of a float and back.
RLPT_HD_FORCEINLINE std::uint32_t float_bits(float f) {
#if RLPT_DEVICE_PASS()
  return __float_as_uint(f);
#else
  return std::bit_cast<std::uint32_t>(f);
#endif
}

RLPT_HD_FORCEINLINE float bits_float(std::uint32_t u) {
#if RLPT_DEVICE_PASS()
  return __uint_as_float(u);
#else
  return std::bit_cast<float>(u);
#endif
}

//! Finiteness by bit pattern, so that -ffast-math in a user's build cannot fold the test away.
RLPT_HD_FORCEINLINE bool finite(float x) {
#if RLPT_DEVICE_PASS()
  return (__float_as_uint(x) & 0x7f800000u) != 0x7f800000u;
#else
  std::uint32_t u = 0;
  std::memcpy(&u, &x, sizeof u);
  return (u & 0x7f800000u) != 0x7f800000u;
#endif
}
RLPT_HD_FORCEINLINE bool finite(double x) {
#if RLPT_DEVICE_PASS()
  return (static_cast<unsigned long long>(__double_as_longlong(x)) & 0x7ff0000000000000ull) != 0x7ff0000000000000ull;
#else
  std::uint64_t u = 0;
  std::memcpy(&u, &x, sizeof u);
  return (u & 0x7ff0000000000000ull) != 0x7ff0000000000000ull;
#endif
}

//! c ? a : b without a branch. GCC keeps a floating-point operation that may trap out of a
//! conditional arm (-ftrapping-math is the default), so a plain ?: whose arm computes something
//! keeps a loop scalar; blending the bits does not (and is what the vector code does anyway).
//! Changing the flag for the loops instead (optimize attribute) blocks their inlining.
RLPT_HD_FORCEINLINE float sel(bool c, float a, float b) {
#if RLPT_DEVICE_PASS()
  return c ? a : b;
#else
  std::uint32_t ua, ub;
  std::memcpy(&ua, &a, sizeof(ua));
  std::memcpy(&ub, &b, sizeof(ub));
  const std::uint32_t m = 0u - static_cast<std::uint32_t>(c);
  const std::uint32_t r = (ua & m) | (ub & ~m);
  float f;
  std::memcpy(&f, &r, sizeof(f));
  return f;
#endif
}
RLPT_HD_FORCEINLINE double sel(bool c, double a, double b) {
#if RLPT_DEVICE_PASS()
  return c ? a : b;
#else
  std::uint64_t ua, ub;
  std::memcpy(&ua, &a, sizeof(ua));
  std::memcpy(&ub, &b, sizeof(ub));
  const std::uint64_t m = 0u - static_cast<std::uint64_t>(c);
  const std::uint64_t r = (ua & m) | (ub & ~m);
  double f;
  std::memcpy(&f, &r, sizeof(f));
  return f;
#endif
}

} // namespace detail
RLPT_NAMESPACE_END
