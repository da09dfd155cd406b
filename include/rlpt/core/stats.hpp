// SPDX-License-Identifier: Apache-2.0
//! @file
//! Mean/variance that stay accurate and merge exactly across threads and ranks.
//!
//! `moments` is (count, mean, M2) in fp64. Single values fold in with Welford's update; partial
//! results merge with Chan's formula, so per-shard statistics (threads, data-parallel ranks,
//! micro-batches) combine into the statistics of the whole, and a shard with no valid
//! elements (count 0) merges as the identity.
#pragma once

#include <rlpt/config.hpp>
#include <rlpt/core/dtype.hpp>
#include <rlpt/core/views.hpp>

#include <cmath>
#include <limits>

RLPT_NAMESPACE_BEGIN

struct moments {
  double count = 0.0;
  double mean = 0.0;
  double m2 = 0.0; //!< sum of squared deviations from the mean

  //! Welford update with one value.
  RLPT_HD void add(double x) {
    count += 1.0;
    const double delta = x - mean;
    mean += delta / count;
    m2 += delta * (x - mean);
  }

  //! Chan et al. parallel merge; exact in exact arithmetic, order-stable in fp64.
  RLPT_HD void merge(const moments& o) {
    if (o.count == 0.0) return;
    if (count == 0.0) {
      *this = o;
      return;
    }
    const double n = count + o.count;
    const double delta = o.mean - mean;
    mean += delta * (o.count / n);
    m2 += o.m2 + delta * delta * (count * o.count / n);
    count = n;
  }

  //! Population (biased, divide by n) or sample (unbiased, divide by n - 1) variance.
  //! Unbiased variance of fewer than 2 values is NaN, as in torch: callers that can meet
  //! single-element groups decide explicitly what they mean.
  [[nodiscard]] RLPT_HD double variance(bool unbiased) const {
    const double d = unbiased ? count - 1.0 : count;
    if (d <= 0.0) return unbiased ? std::numeric_limits<double>::quiet_NaN() : 0.0;
    const double v = m2 / d;
    return v > 0.0 ? v : 0.0; // M2 can round to a tiny negative after merges
  }
  [[nodiscard]] RLPT_HD double stddev(bool unbiased) const { return std::sqrt(variance(unbiased)); }
};

//! Two-pass mean and M2 of all elements (fp64 accumulation, no cancellation).
template <class T> [[nodiscard]] moments moments_of(view<const T> x) {
  moments m;
  if (x.empty()) return m;
  double sum = 0.0;
  for (index_t i = 0; i < x.size(); ++i) sum += static_cast<double>(x[i]);
  m.count = static_cast<double>(x.size());
  m.mean = sum / m.count;
  for (index_t i = 0; i < x.size(); ++i) {
    const double d = static_cast<double>(x[i]) - m.mean;
    m.m2 += d * d;
  }
  return m;
}

//! Two-pass moments of the elements whose mask is nonzero. Masked values are never read into
//! the result, so garbage (even NaN) under a zero mask cannot change it.
template <class T> [[nodiscard]] moments moments_of(view<const T> x, view<const mask_t> mask) {
  detail::expect_size("mask", mask.size(), x.size(), "one per value");
  moments m;
  double sum = 0.0;
  for (index_t i = 0; i < x.size(); ++i)
    if (mask[i]) {
      sum += static_cast<double>(x[i]);
      m.count += 1.0;
    }
  if (m.count == 0.0) return m;
  m.mean = sum / m.count;
  for (index_t i = 0; i < x.size(); ++i)
    if (mask[i]) {
      const double d = static_cast<double>(x[i]) - m.mean;
      m.m2 += d * d;
    }
  return m;
}

// Template argument deduction helpers for non-const views and containers.
template <class T, class M>
[[nodiscard]] moments moments_of(const T& x,
                                 const M& mask) requires(!std::is_same_v<T, view<const typename T::value_type>>) {
  return moments_of<typename T::value_type>(view<const typename T::value_type>(x), view<const mask_t>(mask));
}
template <class T>
[[nodiscard]] moments moments_of(const T& x) requires(!std::is_same_v<T, view<const typename T::value_type>>) {
  return moments_of<typename T::value_type>(view<const typename T::value_type>(x));
}

RLPT_NAMESPACE_END
