// SPDX-License-Identifier: Apache-2.0
// Comparison helpers against fp64 references: report the first mismatching index with both
// values, the tolerance and the worst relative error, instead of a bare "false".
#pragma once

#include <rlpt/config.hpp>

#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <span>
#include <string>
#include <utility>

namespace rlpt::test {

struct tolerance {
  double rel = 1e-6;
  double abs = 0.0;
};

//! |got - want| in units of the float spacing at |want| (want rounded to float).
inline double ulps(float got, double want) {
  const auto w = static_cast<float>(want);
  const double spacing = static_cast<double>(std::nextafter(std::fabs(w), std::numeric_limits<float>::infinity())) -
                         static_cast<double>(std::fabs(w));
  return std::fabs(static_cast<double>(got) - want) / spacing;
}

//! |a - b| <= abs + rel * |b|, with NaN == NaN and equal infinities equal.
inline bool close(double a, double b, tolerance tol) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  if (std::isinf(a) || std::isinf(b)) return a == b;
  return std::fabs(a - b) <= tol.abs + tol.rel * std::fabs(b);
}

//! Empty string when all elements are close; otherwise a description of the first mismatch.
template <class A, class B> std::string compare(std::span<const A> got, std::span<const B> want, tolerance tol) {
  if (got.size() != want.size()) return fmt::format("size {} != expected {}", got.size(), want.size());
  std::size_t bad = 0, first = 0;
  double worst = 0.0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const auto a = static_cast<double>(got[i]);
    const auto b = static_cast<double>(want[i]);
    if (!close(a, b, tol)) {
      if (bad++ == 0) first = i;
      const double rel = std::fabs(a - b) / std::max(std::fabs(b), 1e-300);
      worst = std::max(worst, rel);
    }
  }
  if (bad == 0) return {};
  return fmt::format(
      "{} of {} elements differ; first at [{}]: got {:.17g}, expected {:.17g} (rel {:g}, abs {:g}); worst rel {:g}",
      bad, got.size(), first, static_cast<double>(got[first]), static_cast<double>(want[first]), tol.rel, tol.abs,
      worst);
}

} // namespace rlpt::test

//! CHECK that two ranges agree elementwise within a tolerance, printing the first mismatch.
#define RLPT_CHECK_CLOSE(got, want, ...)                                                                               \
  do {                                                                                                                 \
    const std::string rlpt_mismatch_ = ::rlpt::test::compare(                                                          \
        std::span(std::as_const(got)), std::span(std::as_const(want)), ::rlpt::test::tolerance{__VA_ARGS__});          \
    CHECK_MESSAGE(rlpt_mismatch_.empty(), rlpt_mismatch_);                                                             \
  } while (0)
