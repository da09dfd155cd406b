// SPDX-License-Identifier: Apache-2.0
//! @file
//! Overflow-checked index arithmetic and the one validation of offset arrays (cu_seqlens,
//! group offsets) that every block uses.
//!
//! Sizes, counts and offsets come from callers: a product such as B * row_stride, a sum of
//! sequence lengths or a count rounded up to a multiple can overflow index_t. Signed overflow
//! is undefined behaviour, so every such computation on caller values goes through these
//! helpers and raises rlpt::error naming the values instead.
#pragma once

#include <rlpt/config.hpp>
#include <rlpt/core/error.hpp>
#include <rlpt/core/views.hpp>

#include <limits>
#include <string_view>

RLPT_NAMESPACE_BEGIN
namespace detail {

inline constexpr index_t index_max = std::numeric_limits<index_t>::max();

//! out = a + b; true when that overflows index_t (out is then unspecified).
[[nodiscard]] constexpr bool add_overflows(index_t a, index_t b, index_t& out) noexcept {
  return __builtin_add_overflow(a, b, &out);
}

//! out = a * b; true when that overflows index_t (out is then unspecified).
[[nodiscard]] constexpr bool mul_overflows(index_t a, index_t b, index_t& out) noexcept {
  return __builtin_mul_overflow(a, b, &out);
}

//! ceil(a / b) for a >= 0 and b >= 1, for every such pair (no a + b - 1 to overflow).
[[nodiscard]] constexpr index_t ceil_div(index_t a, index_t b) noexcept { return a / b + (a % b != 0 ? 1 : 0); }

//! a rounded up to a multiple of b (a >= 0, b >= 1); true when the result overflows index_t.
[[nodiscard]] constexpr bool round_up_overflows(index_t a, index_t b, index_t& out) noexcept {
  return mul_overflows(ceil_div(a, b), b, out);
}

//! a + b, raising `id` with "`what` overflows: a + b" when the sum leaves index_t.
inline index_t checked_add(error_id id, std::string_view what, index_t a, index_t b) {
  index_t out = 0;
  if (RLPT_UNLIKELY(add_overflows(a, b, out)))
    RLPT_FAIL(id, "{} overflows a 64-bit index: {} + {} > {}", what, a, b, index_max);
  return out;
}

//! a * b, raising `id` with "`what` overflows: a * b" when the product leaves index_t.
inline index_t checked_mul(error_id id, std::string_view what, index_t a, index_t b) {
  index_t out = 0;
  if (RLPT_UNLIKELY(mul_overflows(a, b, out)))
    RLPT_FAIL(id, "{} overflows a 64-bit index: {} * {} > {}", what, a, b, index_max);
  return out;
}

//! Validates offsets (cu_seqlens, group offsets): at least one entry, offsets[0] == 0,
//! non-decreasing (increasing when `strict`: no empty entry). Afterwards every
//! offsets[i + 1] - offsets[i] is a valid length and offsets.back() bounds every offset.
//! `what` names the array and `unit` its entries ("sequence", "group") in the error.
inline void check_offsets(error_id id, std::string_view what, std::string_view unit, view<const index_t> offsets,
                          bool strict = false) {
  RLPT_CHECK(!offsets.empty(), id, "{} need one entry per {} plus one, starting at 0; got an empty array", what, unit);
  RLPT_CHECK(offsets[0] == 0, id, "{} must start at 0, got {}", what, offsets[0]);
  for (index_t i = 0; i + 1 < offsets.size(); ++i) {
    if (RLPT_LIKELY(strict ? offsets[i + 1] > offsets[i] : offsets[i + 1] >= offsets[i])) continue;
    if (strict)
      RLPT_FAIL(id, "{} {} is empty or reversed: {}[{}] = {}, {}[{}] = {}", unit, i, what, i, offsets[i], what, i + 1,
                offsets[i + 1]);
    RLPT_FAIL(id, "{} decrease at {} {}: offsets[{}] = {} > offsets[{}] = {}", what, unit, i, i, offsets[i], i + 1,
              offsets[i + 1]);
  }
}

} // namespace detail
RLPT_NAMESPACE_END
