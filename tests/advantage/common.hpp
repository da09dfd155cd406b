// SPDX-License-Identifier: Apache-2.0
// Shared helpers of the advantage tests: golden arrays as rlpt inputs, per-token comparisons on
// valid positions only (rlpt writes 0 at masked tokens; peers leave their own values there).
#pragma once

#include <rlpt/advantage.hpp>

#include "support/golden.hpp"
#include "support/reference.hpp"

#include <doctest/doctest.h>

#include <cstdint>
#include <string>
#include <vector>

namespace rlpt::test {

inline golden_file advantage_golden(const std::string& name) { return golden_file(golden_path("advantage", name)); }

//! Tolerances. Against the peer run in float64 (its formula without fp32 rounding) rlpt must
//! agree to fp32 output rounding; against the peer's own float32 run, to the peer's fp32
//! accumulation noise.
inline constexpr tolerance vs_f64{1e-6, 1e-9};
inline constexpr tolerance vs_f32{2e-5, 2e-6};

//! Values of a [B, T] array at valid mask positions, in row-major order.
template <class T> std::vector<double> at_valid(const std::vector<T>& x, const std::vector<std::uint8_t>& mask) {
  std::vector<double> v;
  for (std::size_t i = 0; i < x.size(); ++i)
    if (mask[i]) v.push_back(static_cast<double>(x[i]));
  return v;
}

//! Every masked position of x is exactly 0.
template <class T> bool masked_zero(const std::vector<T>& x, const std::vector<std::uint8_t>& mask) {
  for (std::size_t i = 0; i < x.size(); ++i)
    if (!mask[i] && x[i] != T(0)) return false;
  return true;
}

//! Per-sequence value of a [B, T] token array broadcast from one scalar per row: the value at
//! the row's first valid token (rows without valid tokens give 0).
inline std::vector<double> row_value(const std::vector<double>& x, const std::vector<std::uint8_t>& mask, std::size_t B,
                                     std::size_t T) {
  std::vector<double> v(B, 0.0);
  for (std::size_t b = 0; b < B; ++b)
    for (std::size_t t = 0; t < T; ++t)
      if (mask[b * T + t]) {
        v[b] = x[b * T + t];
        break;
      }
  return v;
}

} // namespace rlpt::test

//! RLPT_CHECK_CLOSE for temporaries too (binds both sides to named references first).
#define ADV_CHECK_CLOSE(got, want, tol)                                                                                \
  do {                                                                                                                 \
    const auto& adv_got_ = (got);                                                                                      \
    const auto& adv_want_ = (want);                                                                                    \
    const ::rlpt::test::tolerance adv_tol_ = (tol);                                                                    \
    RLPT_CHECK_CLOSE(adv_got_, adv_want_, adv_tol_.rel, adv_tol_.abs);                                                 \
  } while (0)
