// SPDX-License-Identifier: Apache-2.0
//! @file
//! Top-k / top-p / min-p support of one logits row by radix selection, without sorting or
//! scratch.
//!
//! Tempered logits map to order-preserving 32-bit keys. Top-k finds the k-th largest key in
//! three digit passes (11 + 11 + 10 bits) of counting. Top-p walks the same digits with the
//! probability mass per digit, in 2^-40 fixed point: integer sums are associative, so the
//! chosen support is the same however the sums are ordered (host loop or GPU atomics). The
//! result is a threshold value plus, for ties at it, the last kept column: column j is kept iff
//! z_j > threshold or (z_j == threshold and j <= tie_last). Min-p is a bound on the key
//! itself (min_p_key), combined with top-k's before the top-p walk (vLLM) or with the final
//! support after it (SGLang, Hugging Face).
#pragma once

#include <rlpt/config.hpp>
#include <rlpt/core/dtype.hpp>
#include <rlpt/logprob/math.hpp>
#include <rlpt/logprob/options.hpp>

#include <cmath>
#include <cstdint>
#include <limits>

RLPT_NAMESPACE_BEGIN
namespace detail {

//! Monotone map float -> uint32 (for non-NaN values); −0 and +0 share a key.
RLPT_HD_FORCEINLINE std::uint32_t order_key(float z) {
  const std::uint32_t u = float_bits(z + 0.0f);
  return (u & 0x80000000u) != 0 ? ~u : (u | 0x80000000u);
}

//! Inverse of order_key.
RLPT_HD_FORCEINLINE float key_value(std::uint32_t k) {
  return bits_float((k & 0x80000000u) != 0 ? (k & 0x7fffffffu) : ~k);
}

//! Probability mass exp(z − m) ∈ [0, 1] in 2^-40 fixed point: a row of up to 2^24 columns sums
//! without overflow.
RLPT_HD_FORCEINLINE std::uint64_t mass_fixed(float z, float m) {
  float dc;
  const float e = shifted_exp(z - m, dc);
  return static_cast<std::uint64_t>(e * 1099511627776.0f);
}

struct radix_level {
  int shift;
  int bits;
};
inline constexpr radix_level radix_levels[3] = {{21, 11}, {10, 11}, {0, 10}};
inline constexpr int radix_buckets = 2048;

//! radix_levels[i] by value (device code cannot read a host array).
RLPT_HD_FORCEINLINE radix_level radix_level_at(int i) {
  return i == 0 ? radix_level{21, 11} : i == 1 ? radix_level{10, 11} : radix_level{0, 10};
}

//! A row's truncation as the host and device passes take it (trivially copyable: a kernel
//! argument).
struct truncation_rule {
  index_t top_k = 0;                                           //!< 0: off
  float top_p = 1.0f;                                          //!< 1: off
  double log_min_p = -std::numeric_limits<double>::infinity(); //!< log(min_p); −inf: off
  bool min_p_first = true;                                     //!< min-p before top-k/top-p (vLLM), else after top-p

  [[nodiscard]] RLPT_HD bool use_min_p() const { return log_min_p > -1.0e308; }

  //! The rule of validated options (the log is taken once here, so host and device compare
  //! against the same double).
  static truncation_rule of(const logprob_options& o) {
    return {o.top_k < 0 ? 0 : o.top_k, o.top_p,
            o.min_p > 0.0f ? std::log(static_cast<double>(o.min_p)) : -std::numeric_limits<double>::infinity(),
            o.min_p_order == min_p_order::first};
  }
};

//! Whether tempered logit z passes min-p against the row max m: z − m >= log(min_p), the
//! difference taken in double, where two floats subtract exactly (up to exponent gaps far past
//! the bound), so the test is monotone in z.
RLPT_HD_FORCEINLINE bool min_p_keeps(float z, float m, double log_min_p) {
  return static_cast<double>(z) - static_cast<double>(m) >= log_min_p;
}

//! The smallest key whose value passes min-p: every column at or above it is kept. Starts at
//! the float nearest m + log(min_p) and steps a key at a time (at most a few steps); the row
//! max itself always passes (log(min_p) <= 0), and keys below −inf's are NaNs, which fail.
RLPT_HD_FORCEINLINE std::uint32_t min_p_key(float m, double log_min_p) {
  std::uint32_t k = order_key(static_cast<float>(static_cast<double>(m) + log_min_p));
  while (!min_p_keeps(key_value(k), m, log_min_p)) ++k;
  while (k > 0 && min_p_keeps(key_value(k - 1), m, log_min_p)) --k;
  return k;
}

//! Min-p after top-k/top-p: both supports are upper sets of the key order (min-p keeps every
//! tie at its bound), so their intersection is the one with the higher bound.
RLPT_HD_FORCEINLINE void intersect_min_p(std::uint32_t mkey, index_t n, float& threshold, index_t& tie_last) {
  if (mkey > order_key(threshold)) {
    threshold = key_value(mkey);
    tie_last = n - 1;
  }
}

//! The kept support of a truncated row.
struct truncation {
  float threshold = -std::numeric_limits<float>::infinity();
  index_t tie_last = 0;
};

//! Number of kept ties at the crossing key: ties each have mass `unit`, and the i-th (by column)
//! is kept while cum + i·unit < target.
RLPT_HD_FORCEINLINE std::uint64_t kept_ties(std::uint64_t cum, std::uint64_t target, std::uint64_t unit,
                                            std::uint64_t count) {
  if (unit == 0) return count;
  const std::uint64_t r = (target - cum + unit - 1) / unit;
  return r < count ? r : count;
}

//! top_k/top_p/min_p support of x[0, n) / temp whose max is m (host; the row is read 3–8
//! times, from cache for vocabulary-sized rows).
template <class T> truncation row_truncation(const T* x, index_t n, float temp, float m, const truncation_rule& rule) {
  truncation tr;
  tr.tie_last = n - 1;
  const index_t top_k = rule.top_k;
  const float top_p = rule.top_p;
  const bool use_k = top_k > 0 && top_k < n;
  const bool use_p = top_p < 1.0f;
  const bool use_m = rule.use_min_p();
  if (!use_k && !use_p && !use_m) return tr;

  std::uint32_t kmin = 0; // top-k (and min-p first) support: key >= kmin
  if (use_k) {
    std::uint32_t count[radix_buckets];
    std::uint32_t prefix = 0, pmask = 0;
    auto remaining = static_cast<std::uint64_t>(top_k);
    for (const radix_level lv : radix_levels) {
      const std::uint32_t dmask = (1u << lv.bits) - 1u;
      for (int d = 0; d < radix_buckets; ++d) count[d] = 0;
      for (index_t j = 0; j < n; ++j) {
        const std::uint32_t key = order_key(load_logit(x[j]) / temp);
        if ((key & pmask) == prefix) ++count[(key >> lv.shift) & dmask];
      }
      for (auto d = static_cast<int>(dmask); d >= 0; --d) {
        if (count[d] >= remaining) {
          prefix |= static_cast<std::uint32_t>(d) << lv.shift;
          break;
        }
        remaining -= count[d];
      }
      pmask |= dmask << lv.shift;
    }
    kmin = prefix;
  }
  const std::uint32_t mkey = use_m ? min_p_key(m, rule.log_min_p) : 0;
  // Without top-p the order does not matter: both bounds hold.
  if (use_m && (rule.min_p_first || !use_p) && mkey > kmin) kmin = mkey;
  if (use_k || use_m) tr.threshold = key_value(kmin);
  if (!use_p) return tr;

  std::uint64_t mass[radix_buckets];
  std::uint32_t count[radix_buckets];
  std::uint32_t prefix = 0, pmask = 0;
  std::uint64_t cum = 0, target = 0;
  bool first = true;
  int last_digit = 0;
  for (const radix_level lv : radix_levels) {
    const std::uint32_t dmask = (1u << lv.bits) - 1u;
    for (int d = 0; d < radix_buckets; ++d) mass[d] = count[d] = 0;
    for (index_t j = 0; j < n; ++j) {
      const float z = load_logit(x[j]) / temp;
      const std::uint32_t key = order_key(z);
      if (key >= kmin && (key & pmask) == prefix) {
        const std::uint32_t d = (key >> lv.shift) & dmask;
        mass[d] += mass_fixed(z, m);
        ++count[d];
      }
    }
    if (first) {
      std::uint64_t total = 0;
      for (int d = 0; d < radix_buckets; ++d) total += mass[d];
      const auto t = static_cast<std::uint64_t>(static_cast<double>(top_p) * static_cast<double>(total));
      target = t > 0 ? t : 1; // the most probable token is always kept
      first = false;
    }
    for (auto d = static_cast<int>(dmask); d >= 0; --d) {
      if (cum + mass[d] >= target) {
        prefix |= static_cast<std::uint32_t>(d) << lv.shift;
        last_digit = d;
        break;
      }
      cum += mass[d];
    }
    pmask |= dmask << lv.shift;
  }
  tr.threshold = key_value(prefix);
  const std::uint64_t ties = count[last_digit];
  const std::uint64_t keep = kept_ties(cum, target, mass_fixed(tr.threshold, m), ties);
  if (keep < ties) {
    std::uint64_t seen = 0;
    for (index_t j = 0; j < n; ++j) {
      if (order_key(load_logit(x[j]) / temp) == prefix && ++seen == keep) {
        tr.tie_last = j;
        break;
      }
    }
  }
  if (use_m && !rule.min_p_first) intersect_min_p(mkey, n, tr.threshold, tr.tie_last);
  return tr;
}

} // namespace detail
RLPT_NAMESPACE_END
