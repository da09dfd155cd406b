// SPDX-License-Identifier: Apache-2.0
//! @file
//! Element types on the wire: the safetensors dtype set (what trainers and engines exchange),
//! with their safetensors names, sizes and the mapping to rlpt::dtype.
//!
//! Weight sync moves bytes; the dtype matters for naming (safetensors headers, manifests),
//! element width (delta change detection) and receiver-side casts. The safetensors set is
//! wider than rlpt::dtype (BOOL, FP8, unsigned 16/32/64, C64), so sync has its own tag.
//! Sub-byte types (F4, F6_*) are not supported: their byte size is not per element.
#pragma once

#include <rlpt/config.hpp>
#include <rlpt/core/dtype.hpp>
#include <rlpt/core/error.hpp>
#include <rlpt/core/format.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

RLPT_NAMESPACE_BEGIN
namespace sync {

//! Wire element type. Declared in safetensors' own order (alignment ascending), which its
//! writer uses to sort tensors (dtype descending, then name): rlpt writes the same order.
enum class wire_dtype : std::uint8_t {
  boolean,
  u8,
  i8,
  f8_e5m2,
  f8_e4m3,
  f8_e8m0,
  i16,
  u16,
  f16,
  bf16,
  i32,
  u32,
  f32,
  c64,
  f64,
  i64,
  u64
};

inline constexpr std::size_t wire_dtype_count = 17;

namespace detail {
struct wire_dtype_info {
  wire_dtype tag;
  std::string_view name; // safetensors spelling
  std::size_t size;
};
inline constexpr std::array<wire_dtype_info, wire_dtype_count> wire_dtypes{{
    {wire_dtype::boolean, "BOOL", 1},
    {wire_dtype::u8, "U8", 1},
    {wire_dtype::i8, "I8", 1},
    {wire_dtype::f8_e5m2, "F8_E5M2", 1},
    {wire_dtype::f8_e4m3, "F8_E4M3", 1},
    {wire_dtype::f8_e8m0, "F8_E8M0", 1},
    {wire_dtype::i16, "I16", 2},
    {wire_dtype::u16, "U16", 2},
    {wire_dtype::f16, "F16", 2},
    {wire_dtype::bf16, "BF16", 2},
    {wire_dtype::i32, "I32", 4},
    {wire_dtype::u32, "U32", 4},
    {wire_dtype::f32, "F32", 4},
    {wire_dtype::c64, "C64", 8},
    {wire_dtype::f64, "F64", 8},
    {wire_dtype::i64, "I64", 8},
    {wire_dtype::u64, "U64", 8},
}};
} // namespace detail

//! Bytes per element.
[[nodiscard]] constexpr std::size_t size_of(wire_dtype t) noexcept {
  return detail::wire_dtypes[static_cast<std::size_t>(t)].size;
}

//! The safetensors name ("BF16", "F32", ...).
[[nodiscard]] constexpr std::string_view name(wire_dtype t) noexcept {
  return detail::wire_dtypes[static_cast<std::size_t>(t)].name;
}

//! Parses a safetensors dtype name; nullopt for an unknown or unsupported (sub-byte) name.
[[nodiscard]] constexpr std::optional<wire_dtype> parse_wire_dtype(std::string_view s) noexcept {
  for (const auto& d : detail::wire_dtypes)
    if (d.name == s) return d.tag;
  return std::nullopt;
}

//! The wire tag of an rlpt::dtype.
[[nodiscard]] constexpr wire_dtype to_wire(dtype t) noexcept {
  switch (t) {
  case dtype::f32:
    return wire_dtype::f32;
  case dtype::f64:
    return wire_dtype::f64;
  case dtype::f16:
    return wire_dtype::f16;
  case dtype::bf16:
    return wire_dtype::bf16;
  case dtype::i8:
    return wire_dtype::i8;
  case dtype::u8:
    return wire_dtype::u8;
  case dtype::i32:
    return wire_dtype::i32;
  case dtype::i64:
    return wire_dtype::i64;
  }
  return wire_dtype::u8;
}

//! The rlpt::dtype of a wire tag, if rlpt's compute types include it.
[[nodiscard]] constexpr std::optional<dtype> to_core(wire_dtype t) noexcept {
  switch (t) {
  case wire_dtype::f32:
    return dtype::f32;
  case wire_dtype::f64:
    return dtype::f64;
  case wire_dtype::f16:
    return dtype::f16;
  case wire_dtype::bf16:
    return dtype::bf16;
  case wire_dtype::i8:
    return dtype::i8;
  case wire_dtype::u8:
    return dtype::u8;
  case wire_dtype::i32:
    return dtype::i32;
  case wire_dtype::i64:
    return dtype::i64;
  default:
    return std::nullopt;
  }
}

} // namespace sync
RLPT_NAMESPACE_END

template <> struct fmt::formatter<rlpt::sync::wire_dtype> : rlpt::detail::name_formatter {
  template <class Ctx> auto format(rlpt::sync::wire_dtype t, Ctx& ctx) const {
    return format_name(rlpt::sync::name(t), ctx);
  }
};
