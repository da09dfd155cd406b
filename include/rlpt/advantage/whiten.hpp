// SPDX-License-Identifier: Apache-2.0
//! @file
//! Masked advantage whitening, (x - mean) / std over the valid tokens of a batch, in a form that
//! distributes exactly: each rank computes the (count, mean, M2) of its own tokens with
//! whiten_moments, the ranks exchange them (any all-gather, or rlpt's NCCL helper), merge them in
//! rank order with merge_moments, and apply the merged statistics with whiten_apply. A rank
//! without valid tokens contributes count 0 (the identity of the merge) and still takes part, so
//! nobody skips the collective and hangs the job.
//!
//! Frameworks disagree on three details, all explicit here: the std flavour (verl and AReaL
//! unbiased, OpenRLHF biased), where epsilon goes (verl rsqrt(var + 1e-8), OpenRLHF
//! rsqrt(max(var, 1e-8)), AReaL / (std + 1e-5)), and what fewer than 2 valid tokens mean (verl
//! raises, AReaL uses std 1). Outputs at masked tokens are 0.
#pragma once

#include <rlpt/config.hpp>
#include <rlpt/advantage/common.hpp>
#include <rlpt/advantage/detail/recurrence.hpp>
#include <rlpt/advantage/tokens.hpp>
#include <rlpt/core/cpu.hpp>
#include <rlpt/core/error.hpp>
#include <rlpt/core/executor.hpp>
#include <rlpt/core/layout.hpp>
#include <rlpt/core/stats.hpp>
#include <rlpt/core/views.hpp>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

RLPT_NAMESPACE_BEGIN

//! Where the whitening epsilon enters.
enum class eps_mode : std::uint8_t {
  add_var,   //!< 1 / sqrt(var + eps) (verl masked_whiten, eps 1e-8)
  floor_var, //!< 1 / sqrt(max(var, eps)) (OpenRLHF, eps 1e-8)
  add_std,   //!< 1 / (std + eps) (AReaL Normalization, eps 1e-5)
};

//! What whitening does with fewer valid tokens than its variance needs (< 2 unbiased, 0 biased).
enum class too_few : std::uint8_t {
  raise,    //!< throw rlpt::error (verl's masked_var raises for 0 or 1 valid tokens)
  unit_std, //!< use std 1 (AReaL); with 0 valid tokens there is nothing to write but zeros
};

struct whiten_options {
  bool unbiased = true;                            //!< verl masked_var(unbiased=True); OpenRLHF false
  double eps = 1e-8;                               //!< verl 1e-8
  rlpt::eps_mode eps_at = rlpt::eps_mode::add_var; //!< verl
  bool scale = true;                               //!< false: centre only (OpenRLHF no_std_norm)
  bool shift_mean = true;                          //!< false: add the mean back after scaling (verl shift_mean=False)
  rlpt::too_few on_too_few = rlpt::too_few::raise; //!< verl
  rlpt::nonfinite on_nonfinite = rlpt::nonfinite::raise; //!< verl would propagate NaN
};

//! What a whitening call applied.
struct whiten_result {
  rlpt::moments stats;       //!< the (merged) moments the transform came from
  double mean = 0.0;         //!< subtracted from every valid value
  double inv_std = 1.0;      //!< multiplier applied after subtracting the mean
  index_t num_nonfinite = 0; //!< valid tokens left out under nonfinite::mask (output 0)
};

namespace detail {

struct whiten_transform {
  double mean = 0.0;
  double inv_std = 1.0;
  double add_back = 0.0;
};

//! The affine map whitening applies, from merged moments (shared with the device kernels).
RLPT_HD whiten_transform whiten_from(double count, double mean, double m2, const whiten_options& o) {
  whiten_transform t;
  const double need = o.unbiased ? 2.0 : 1.0;
  double var = 1.0;
  if (count >= need) {
    var = m2 / (o.unbiased ? count - 1.0 : count);
    if (var < 0.0) var = 0.0;
  }
  if (count > 0.0) t.mean = mean;
  if (o.scale) {
    switch (o.eps_at) {
    case eps_mode::add_var:
      t.inv_std = 1.0 / std::sqrt(var + o.eps);
      break;
    case eps_mode::floor_var:
      t.inv_std = 1.0 / std::sqrt(var > o.eps ? var : o.eps);
      break;
    case eps_mode::add_std:
      t.inv_std = 1.0 / (std::sqrt(var) + o.eps);
      break;
    }
  }
  if (!o.shift_mean) t.add_back = t.mean;
  return t;
}

RLPT_HD float whiten_value(float x, const whiten_transform& t) {
  return static_cast<float>((static_cast<double>(x) - t.mean) * t.inv_std + t.add_back);
}

//! The loop of whiten_span over one source and destination (the same pointer when in place).
template <bool HasMask>
RLPT_ADVANTAGE_INLINE index_t whiten_loop(const float* src, const mask_t* m, float* dst, index_t n,
                                          const whiten_transform t) {
  index_t bad = 0;
  for (index_t i = 0; i < n; ++i) {
    const float v = src[i];
    const bool valid = !HasMask || m[i] != 0;
    const bool ok = valid & finite(v);
    const float w = whiten_value(v, t); // computed for every slot: no branch
    bad += (valid & !ok) ? 1 : 0;
    dst[i] = sel(ok, w, 0.0f);
  }
  return bad;
}

//! whiten_loop with in-place spans read and written through one pointer. (With the transform
//! behind a reference that y's stores might change, x and y that might overlap, or ?: over a
//! computed value, g++ kept the loop scalar.)
template <bool HasMask>
RLPT_ADVANTAGE_INLINE index_t whiten_span_body(const float* x, const mask_t* m, float* y, index_t n,
                                               const whiten_transform& tr) {
  return x == y ? whiten_loop<HasMask>(y, m, y, n, tr) : whiten_loop<HasMask>(x, m, y, n, tr);
}

#if RLPT_ISA_DISPATCH()
// The SSE2 build of this loop is compute-bound (fp64 per value: 2 ns per token on the 2-vCPU
// Xeon, as long as the recurrence before it). AVX2 without FMA does the same operations four
// doubles at a time: the same bits.
template <bool HasMask>
__attribute__((target("avx2"), RLPT_HOST_LOOP_ATTR)) index_t whiten_span_avx2(const float* x, const mask_t* m, float* y,
                                                                              index_t n, const whiten_transform& tr) {
  return whiten_span_body<HasMask>(x, m, y, n, tr);
}
#endif

//! Whitens n values (0 where masked or not finite) and returns how many valid ones were not
//! finite. Branch-free (bitwise &, the value computed everywhere), so the loop vectorises.
template <bool HasMask>
index_t whiten_span(const float* x, const mask_t* m, float* y, index_t n, const whiten_transform& tr) {
#if RLPT_ISA_DISPATCH()
  if (cpu_has_avx2()) return whiten_span_avx2<HasMask>(x, m, y, n, tr);
#endif
  return whiten_span_body<HasMask>(x, m, y, n, tr);
}

inline void check_whiten_options(const whiten_options& o) {
  RLPT_CHECK(std::isfinite(o.eps) && o.eps >= 0.0, errors::advantage::bad_option,
             "whiten_options: eps must be finite and >= 0, got {}", o.eps);
  RLPT_CHECK(!o.scale || o.eps > 0.0 || o.on_too_few == too_few::raise, errors::advantage::bad_option,
             "whiten_options: eps = 0 would divide by a zero std; use eps > 0");
}

//! Names the first non-finite values at valid tokens as "(sequence b, token t) = v".
inline std::string name_nonfinite_tokens(const token_layout& layout, view<const float> x, const mask_t* m,
                                         index_t& count) {
  std::string listed;
  count = 0;
  for (index_t b = 0; b < layout.num_seqs(); ++b) {
    const index_t base = layout.begin(b), n = layout.length(b);
    for (index_t t = 0; t < n; ++t)
      if (valid_at(m, base + t) && !finite(x[base + t])) {
        if (count < max_named)
          listed += rlpt::detail::format("{}(sequence {}, token {}) = {}", count ? ", " : "", b, t, x[base + t]);
        ++count;
      }
  }
  return listed;
}

} // namespace detail

namespace detail {

//! Whitening sums (whiten_sums, detail/recurrence.hpp) of the valid, finite values of one sequence;
//! adds the valid non-finite ones to `nonfinite`.
inline whiten_sums sums_of_row(const float* x, const mask_t* m, index_t n, index_t& nonfinite) {
  lanes::state<double, bool> s = lanes::start(0.0);
  if (m != nullptr) n = end_of_valid(m, n); // trailing padding would add +0.0 to sums still +0.0
  for (index_t t = n - 1; t >= 0; --t) {
    const bool valid = m == nullptr || m[t] != 0;
    const bool counts = valid && finite(x[t]);
    nonfinite += (valid && !counts) ? 1 : 0;
    lanes::add_value(static_cast<double>(x[t]), counts, s);
  }
  return lanes::sums_of(s);
}

//! The batch's moments: the sequences' moments merged in sequence order.
inline moments merge_rows(const std::vector<whiten_sums>& sums) {
  moments total;
  for (const whiten_sums& r : sums) total.merge(moments_of(r));
  return total;
}

} // namespace detail

//! This rank's (count, mean, M2) over its valid tokens: one-pass shifted fp64 sums per sequence
//! (detail::whiten_sums documents the order), merged in sequence order, so the same bits for any
//! thread count, and the same as the statistics gae() takes in its own pass. Non-finite values at
//! valid tokens raise or, under nonfinite::mask, are left out.
[[nodiscard]] inline moments whiten_moments(const token_layout& layout, view<const float> x, view<const mask_t> mask,
                                            const whiten_options& o = {}, const host_executor& ex = {}) {
  layout.expect_tokens("values", x);
  detail::expect_mask(layout, mask);
  const mask_t* m = mask.empty() ? nullptr : mask.data();
  std::vector<detail::whiten_sums> sums(static_cast<std::size_t>(layout.num_seqs()));
  const index_t nonfinite = ex.parallel_reduce(
      layout.num_seqs(), detail::seq_grain(layout), index_t{0},
      [&](index_t b0, index_t b1) {
        index_t bad = 0;
        for (index_t b = b0; b < b1; ++b) {
          const index_t base = layout.begin(b);
          sums[static_cast<std::size_t>(b)] =
              detail::sums_of_row(x.data() + base, m ? m + base : nullptr, layout.length(b), bad);
        }
        return bad;
      },
      [](index_t& acc, index_t part) { acc += part; });
  if (nonfinite != 0 && o.on_nonfinite == nonfinite::raise) {
    index_t c = 0;
    const std::string listed = detail::name_nonfinite_tokens(layout, x, m, c);
    RLPT_FAIL(errors::advantage::nonfinite,
              "{} valid tokens hold non-finite values: {}{} (set on_nonfinite = "
              "rlpt::nonfinite::mask to leave them out of the statistics with output 0)",
              c, listed, c > detail::max_named ? ", ..." : "");
  }
  return detail::merge_rows(sums);
}

//! Merges per-rank moments in the given (rank) order; count-0 entries are the identity.
[[nodiscard]] inline moments merge_moments(view<const moments> parts) {
  moments m;
  for (const moments& p : parts) m.merge(p);
  return m;
}

//! Applies whitening with (merged, global) statistics to this rank's tokens. Masked outputs
//! are 0; under nonfinite::mask so are valid tokens holding NaN or inf.
inline whiten_result whiten_apply(const moments& stats, const token_layout& layout, view<const float> x,
                                  view<const mask_t> mask, view<float> out, const whiten_options& o = {},
                                  const host_executor& ex = {}) {
  detail::check_whiten_options(o);
  layout.expect_tokens("values", x);
  layout.expect_tokens("out", out);
  detail::expect_mask(layout, mask);
  const double need = o.unbiased ? 2.0 : 1.0;
  RLPT_CHECK(stats.count >= need || o.on_too_few == too_few::unit_std, errors::advantage::whiten_too_few,
             "whitening needs at least {} valid finite value{} for a{} variance, got {} (verl raises here too; set "
             "whiten_options::on_too_few = rlpt::too_few::unit_std to use std 1)",
             need, need > 1.0 ? "s" : "", o.unbiased ? "n unbiased" : " biased", stats.count);
  const detail::whiten_transform tr = detail::whiten_from(stats.count, stats.mean, stats.m2, o);
  detail::prefault_for_write(out);
  const mask_t* m = mask.empty() ? nullptr : mask.data();
  const index_t bad = ex.parallel_reduce(
      layout.num_seqs(), detail::seq_grain(layout), index_t{0},
      [&](index_t b0, index_t b1) {
        index_t nonfinite_here = 0;
        for (index_t b = b0; b < b1; ++b) {
          const index_t base = layout.begin(b), n = layout.length(b);
          float* const y = out.data() + base;
          if (m == nullptr) {
            nonfinite_here += detail::whiten_span<false>(x.data() + base, nullptr, y, n, tr);
            continue;
          }
          // A padded row's trailing masked tokens are only written 0 (a fill, without reading x;
          // after GAE's recurrence, in place, they are 0 already, and the write-only fill is the
          // price of not passing that down). out may equal x: each slot is read, then written.
          const index_t live = detail::end_of_valid(m + base, n);
          nonfinite_here += detail::whiten_span<true>(x.data() + base, m + base, y, live, tr);
          std::fill(y + live, y + n, 0.0f);
        }
        return nonfinite_here;
      },
      [](index_t& acc, index_t part) { acc += part; });
  RLPT_CHECK(bad == 0 || o.on_nonfinite == nonfinite::mask, errors::advantage::nonfinite,
             "{} valid tokens hold non-finite values (set on_nonfinite = rlpt::nonfinite::mask to leave them out)",
             bad);
  return {stats, tr.mean, tr.inv_std, bad};
}

//! Single-shot whitening over this batch: whiten_moments then whiten_apply.
inline whiten_result whiten(const token_layout& layout, view<const float> x, view<const mask_t> mask, view<float> out,
                            const whiten_options& o = {}, const host_executor& ex = {}) {
  detail::check_whiten_options(o);
  const moments stats = whiten_moments(layout, x, mask, o, ex);
  return whiten_apply(stats, layout, x, mask, out, o, ex);
}

//! Whitening of a flat array (e.g. per-sequence advantages) with an optional mask.
inline whiten_result whiten(view<const float> x, view<const mask_t> mask, view<float> out, const whiten_options& o = {},
                            const host_executor& ex = {}) {
  return whiten(token_layout::padded(1, x.size()), x, mask, out, o, ex);
}

RLPT_NAMESPACE_END
