// SPDX-License-Identifier: Apache-2.0
//! @file
//! Element types: runtime dtype tags, the 16-bit float storage types, and dtype dispatch.
//!
//! rlpt::bf16 and rlpt::f16 are plain 16-bit storage types with the same layout as
//! torch.bfloat16 / __nv_bfloat16 and torch.float16 / __half. Arithmetic happens in float:
//! convert on load, compute in fp32 or wider, round once on store (round-to-nearest-even).
#pragma once

#include <rlpt/config.hpp>
#include <rlpt/core/error.hpp>
#include <rlpt/core/float_bits.hpp>
#include <rlpt/core/format.hpp>

#include <bit>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <type_traits>

RLPT_NAMESPACE_BEGIN

//! Runtime element type tag.
enum class dtype : std::uint8_t { f32, f64, f16, bf16, i8, u8, i32, i64 };

//! bfloat16 storage: the upper 16 bits of an IEEE binary32.
struct bf16 {
  std::uint16_t bits;

  bf16() = default;
  RLPT_HD explicit bf16(float f) : bits(from_float(f)) {}
  RLPT_HD explicit operator float() const { return detail::bits_float(std::uint32_t{bits} << 16); }

  [[nodiscard]] RLPT_HD static bf16 from_bits(std::uint16_t b) {
    bf16 r{};
    r.bits = b;
    return r;
  }

private:
  RLPT_HD static std::uint16_t from_float(float f) {
    std::uint32_t u = detail::float_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x40u); // quiet NaN
    u += 0x7fffu + ((u >> 16) & 1u); // round to nearest, ties to even
    return static_cast<std::uint16_t>(u >> 16);
  }
};

//! IEEE binary16 storage.
struct f16 {
  std::uint16_t bits;

  f16() = default;
  RLPT_HD explicit f16(float f) : bits(from_float(f)) {}
  RLPT_HD explicit operator float() const { return to_float(bits); }

  [[nodiscard]] RLPT_HD static f16 from_bits(std::uint16_t b) {
    f16 r{};
    r.bits = b;
    return r;
  }

private:
  RLPT_HD static std::uint16_t from_float(float f) {
    const std::uint32_t u = detail::float_bits(f);
    const auto sign = static_cast<std::uint16_t>((u >> 16) & 0x8000u);
    const std::uint32_t x = u & 0x7fffffffu;
    if (x >= 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7c00u | (x > 0x7f800000u ? 0x200u : 0u));
    if (x >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u); // rounds past 65504
    if (x < 0x38800000u) {                                                   // half subnormal or zero
      if (x <= 0x33000000u) return sign;                                     // at most 2^-25: ties to 0
      const std::uint32_t e = x >> 23;
      const std::uint32_t m = (x & 0x7fffffu) | 0x800000u;
      const std::uint32_t shift = 126u - e; // value / 2^-24 = m * 2^(e-126)
      std::uint32_t r = m >> shift;
      const std::uint32_t rem = m & ((1u << shift) - 1u);
      const std::uint32_t half = 1u << (shift - 1u);
      if (rem > half || (rem == half && (r & 1u))) ++r;
      return static_cast<std::uint16_t>(sign | r);
    }
    std::uint32_t r = (x - 0x38000000u) >> 13; // rebias the exponent from 127 to 15
    const std::uint32_t rem = x & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) ++r;
    return static_cast<std::uint16_t>(sign | r);
  }

  RLPT_HD static float to_float(std::uint16_t h) {
    const std::uint32_t sign = std::uint32_t{h & 0x8000u} << 16;
    const std::uint32_t e = (h >> 10) & 0x1fu;
    const std::uint32_t m = h & 0x3ffu;
    if (e == 0) {
      const float v = static_cast<float>(m) * 5.9604644775390625e-8f; // m * 2^-24, exact
      return sign ? -v : v;
    }
    if (e == 31) return detail::bits_float(sign | 0x7f800000u | (m << 13));
    return detail::bits_float(sign | ((e + 112u) << 23) | (m << 13));
  }
};

static_assert(sizeof(bf16) == 2 && std::is_trivially_copyable_v<bf16>);
static_assert(sizeof(f16) == 2 && std::is_trivially_copyable_v<f16>);

//! Loads any supported element as float (the compute type of every kernel).
template <class T> RLPT_HD_FORCEINLINE float to_float(T v) { return static_cast<float>(v); }

//! Stores a float into any supported element type, rounding to nearest even.
template <class T> RLPT_HD_FORCEINLINE T from_float(float v) { return static_cast<T>(v); }

// --- static <-> runtime mapping -----------------------------------------------------------

namespace detail {
template <class T> struct dtype_of_impl;
template <> struct dtype_of_impl<float> { static constexpr dtype value = dtype::f32; };
template <> struct dtype_of_impl<double> { static constexpr dtype value = dtype::f64; };
template <> struct dtype_of_impl<f16> { static constexpr dtype value = dtype::f16; };
template <> struct dtype_of_impl<bf16> { static constexpr dtype value = dtype::bf16; };
template <> struct dtype_of_impl<std::int8_t> { static constexpr dtype value = dtype::i8; };
template <> struct dtype_of_impl<std::uint8_t> { static constexpr dtype value = dtype::u8; };
template <> struct dtype_of_impl<std::int32_t> { static constexpr dtype value = dtype::i32; };
template <> struct dtype_of_impl<std::int64_t> { static constexpr dtype value = dtype::i64; };
} // namespace detail

//! The runtime tag of a static element type (cv-qualifiers ignored).
template <class T> inline constexpr dtype dtype_of = detail::dtype_of_impl<std::remove_cv_t<T>>::value;

//! Size in bytes of one element.
[[nodiscard]] constexpr std::size_t size_of(dtype t) noexcept {
  switch (t) {
  case dtype::f64:
  case dtype::i64:
    return 8;
  case dtype::f32:
  case dtype::i32:
    return 4;
  case dtype::f16:
  case dtype::bf16:
    return 2;
  case dtype::i8:
  case dtype::u8:
    return 1;
  }
  return 0;
}

//! Lower-case name as torch and safetensors spell the family ("f32", "bf16", ...).
[[nodiscard]] constexpr std::string_view name(dtype t) noexcept {
  switch (t) {
  case dtype::f32:
    return "f32";
  case dtype::f64:
    return "f64";
  case dtype::f16:
    return "f16";
  case dtype::bf16:
    return "bf16";
  case dtype::i8:
    return "i8";
  case dtype::u8:
    return "u8";
  case dtype::i32:
    return "i32";
  case dtype::i64:
    return "i64";
  }
  return "?";
}

[[nodiscard]] constexpr bool is_floating(dtype t) noexcept {
  return t == dtype::f32 || t == dtype::f64 || t == dtype::f16 || t == dtype::bf16;
}

//! Type tag handed to dispatch callbacks: `[](auto tag) { using T = typename decltype(tag)::type; }`.
template <class T> struct type_tag { using type = T; };

//! Calls `f(type_tag<T>{})` for the floating dtype `t`; other dtypes are an error naming `what`.
template <class F> decltype(auto) dispatch_floating(dtype t, std::string_view what, F&& f) {
  switch (t) {
  case dtype::f32:
    return f(type_tag<float>{});
  case dtype::f64:
    return f(type_tag<double>{});
  case dtype::f16:
    return f(type_tag<f16>{});
  case dtype::bf16:
    return f(type_tag<bf16>{});
  default:
    break;
  }
  RLPT_FAIL(errors::dtype::unsupported, "{} has dtype {}; expected one of f32, f64, f16, bf16", what, name(t));
}

RLPT_NAMESPACE_END

template <> struct fmt::formatter<rlpt::dtype> : rlpt::detail::name_formatter {
  template <class Ctx> auto format(rlpt::dtype t, Ctx& ctx) const { return format_name(rlpt::name(t), ctx); }
};
