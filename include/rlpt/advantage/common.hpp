// SPDX-License-Identifier: Apache-2.0
//! @file
//! Vocabulary every advantage estimator shares: the per-call policies for non-finite rewards and
//! single-sample groups, the std scaling choice, the mask semantics of token recurrences, and the
//! fixed-order group reduction that makes results independent of thread count, batch size and
//! backend (the CUDA kernels reproduce the same order bit for bit).
#pragma once

#include <rlpt/config.hpp>
#include <rlpt/core/float_bits.hpp>
#include <rlpt/core/error.hpp>
#include <rlpt/core/executor.hpp>
#include <rlpt/core/groups.hpp>
#include <rlpt/core/nonfinite.hpp>
#include <rlpt/core/views.hpp>

#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

RLPT_NAMESPACE_BEGIN

//! What a group with a single counted sample gets (frameworks disagree; each preset says which).
enum class single : std::uint8_t {
  raw,   //!< baseline 0 and scale 1: the reward passes through (verl grpo: R / (1 + eps); verl rloo: R)
  zero,  //!< advantage 0 (verl rloo_vectorized, TRL, AReaL, OpenRLHF reinforce_baseline)
  raise, //!< throw rlpt::error naming the group (where the peer would produce NaN or refuse)
};

//! How GRPO-family advantages are scaled after the group mean is subtracted.
enum class scale : std::uint8_t {
  group_std, //!< divide by the group's std (GRPO; verl, TRL "group", OpenRLHF group_norm, AReaL)
  batch_std, //!< divide by the std of the whole batch (TRL "batch", AReaL std_level batch)
  none,      //!< no division (Dr. GRPO; verl norm_adv_by_std_in_grpo=False, TRL "none")
};

//! How a reverse token recurrence (GAE, discounted returns) treats tokens whose mask is 0.
//! Valid outputs never depend on the inputs at masked tokens; masked outputs are written as 0.
enum class mask_mode : std::uint8_t {
  skip,  //!< transparent: the recurrence carries over them unchanged (verl, AReaL; multi-turn tool tokens)
  zero,  //!< treated as tokens with reward 0 and value 0, still discounted (OpenRLHF, slime)
  reset, //!< end an episode: the carry restarts from 0 before them (segments are independent)
};

namespace detail {

//! fp64 product and sum that never contract into an FMA, so that host and device round alike.
RLPT_HD_FORCEINLINE double mul_rn(double a, double b) {
#if RLPT_DEVICE_PASS()
  return __dmul_rn(a, b);
#else
  return a * b;
#endif
}
RLPT_HD_FORCEINLINE double add_rn(double a, double b) {
#if RLPT_DEVICE_PASS()
  return __dadd_rn(a, b);
#else
  return a + b;
#endif
}

//! Lanes of the canonical group reduction (one warp).
inline constexpr int reduce_lanes = 32;
//! Lanes of the canonical batch reduction (one 256-thread block).
inline constexpr int batch_lanes = 256;

//! The tree width (1, 2, 4, ..., Lanes) canonical_sum<Lanes> uses for n terms.
template <int Lanes = reduce_lanes> RLPT_HD_FORCEINLINE int canonical_width(index_t n) {
  int width = 1;
  while (width < Lanes && width < n) width <<= 1;
  return width;
}

//! The canonical tree over the first `width` lanes (a power of two): lane l += lane l + s for
//! s = width / 2, ..., 2, 1; returns lane 0.
RLPT_HD_FORCEINLINE double lane_tree(double* lane, int width) {
  for (int s = width / 2; s >= 1; s >>= 1)
    for (int l = 0; l < s; ++l) lane[l] = add_rn(lane[l], lane[l + s]);
  return lane[0];
}

//! Canonical fp64 sum over n terms with `Lanes` partials: term k is added, in order, into
//! partial k % Lanes (each starting at +0.0); the partials are then combined pairwise with
//! offsets Lanes/2, ..., 2, 1 (partial l += partial l + s). Offsets at or above the smallest power
//! of two covering min(n, Lanes) only add exact zeros and are skipped. The device kernels perform
//! exactly these operations (a warp butterfly for groups, a shared-memory tree for the batch), so
//! statistics are bit-identical on host and device and a group's depend on its own members only.
template <int Lanes = reduce_lanes, class F> [[nodiscard]] double canonical_sum(index_t n, F&& term) {
  static_assert(Lanes >= 1 && (Lanes & (Lanes - 1)) == 0, "lane count must be a power of two");
  const int width = canonical_width<Lanes>(n);
  double lane[Lanes]; // only the first `width` lanes are ever read
  for (int l = 0; l < width; ++l) lane[l] = 0.0;
  for (index_t k = 0; k < n; ++k) {
    double& p = lane[k & (Lanes - 1)];
    p = add_rn(p, term(k));
  }
  return lane_tree(lane, width);
}

//! Count, mean and M2 (sum of squared deviations) of the finite values among n terms, each
//! reduced with canonical_sum<Lanes>: a two-pass computation, so a constant group has M2 == 0
//! exactly and near-constant rewards (0.35, 0.4, 0.3, ...) lose nothing to cancellation.
struct canonical_moments {
  double count = 0.0;
  double mean = 0.0; //!< sum / count
  double m2 = 0.0;
  double sum = 0.0; //!< the canonical sum of the finite values
};

//! moments_canonical for n <= Lanes, the common group size: term k is alone in lane k, so each
//! lane is 0.0 + term k (the canonical_sum addition), and the values are read once into a local
//! buffer instead of once per pass. The same operations as the general path, so the same bits.
template <int Lanes, class Get> [[nodiscard]] canonical_moments moments_one_per_lane(index_t n, Get&& get) {
  canonical_moments m;
  float x[Lanes];
  double lane[Lanes];
  const int width = canonical_width<Lanes>(n);
  const int k_n = static_cast<int>(n);
  int c = 0;
  for (int k = 0; k < k_n; ++k) {
    x[k] = get(k);
    c += finite(x[k]) ? 1 : 0;
  }
  m.count = static_cast<double>(c);
  if (c == 0) return m;
  for (int k = k_n; k < width; ++k) x[k] = std::numeric_limits<float>::quiet_NaN(); // empty lanes hold 0.0
  for (int k = 0; k < width; ++k) lane[k] = finite(x[k]) ? add_rn(0.0, static_cast<double>(x[k])) : 0.0;
  m.sum = lane_tree(lane, width);
  m.mean = m.sum / m.count;
  for (int k = 0; k < width; ++k) {
    const double d = static_cast<double>(x[k]) - m.mean;
    lane[k] = finite(x[k]) ? add_rn(0.0, mul_rn(d, d)) : 0.0;
  }
  m.m2 = lane_tree(lane, width);
  return m;
}

template <int Lanes = reduce_lanes, class Get> [[nodiscard]] canonical_moments moments_canonical(index_t n, Get&& get) {
  if constexpr (Lanes <= reduce_lanes)
    if (n <= Lanes) return moments_one_per_lane<Lanes>(n, get);
  canonical_moments m;
  index_t c = 0;
  for (index_t k = 0; k < n; ++k) c += finite(get(k)) ? 1 : 0;
  m.count = static_cast<double>(c);
  if (c == 0) return m;
  m.sum = canonical_sum<Lanes>(n, [&](index_t k) {
    const float x = get(k);
    return finite(x) ? static_cast<double>(x) : 0.0;
  });
  m.mean = m.sum / m.count;
  m.m2 = canonical_sum<Lanes>(n, [&](index_t k) {
    const float x = get(k);
    if (!finite(x)) return 0.0;
    const double d = static_cast<double>(x) - m.mean;
    return mul_rn(d, d);
  });
  return m;
}

//! Standard deviation from canonical moments; 0 when the ddof leaves no degrees of freedom.
RLPT_HD_FORCEINLINE double std_of(double count, double m2, bool unbiased) {
  const double dof = unbiased ? count - 1.0 : count;
  return dof > 0.0 ? std::sqrt(m2 / dof) : 0.0;
}

//! Up to this many offending indices are named in an error message.
inline constexpr index_t max_named = 8;

//! Formats "[i]=value" for the first max_named indices of non-finite values in x.
template <class T> std::string name_nonfinite(view<const T> x, index_t& count) {
  std::string listed;
  count = 0;
  for (index_t i = 0; i < x.size(); ++i)
    if (!finite(static_cast<float>(x[i]))) {
      if (count < max_named)
        listed += rlpt::detail::format("{}[{}]={}", count ? ", " : "", i, static_cast<double>(x[i]));
      ++count;
    }
  return listed;
}

//! The sum of one(i) (0 or 1) over [0, n), counted in 32-bit chunks: a 64-bit counter per lane
//! halves what a vector of floats checks, and a local counter (not the caller's field, which a
//! byte store may alias) stays in a register.
template <class One> index_t count_chunked(index_t n, One one) {
  index_t count = 0;
  for (index_t b = 0; b < n; b += index_t{1} << 30) {
    const index_t e = std::min(n, b + (index_t{1} << 30));
    std::uint32_t c = 0;
    for (index_t i = b; i < e; ++i) c += one(i);
    count += c;
  }
  return count;
}

//! Counts non-finite per-sequence rewards; with nonfinite::raise throws naming them.
inline index_t check_rewards(view<const float> rewards, nonfinite policy, const char* what = "rewards") {
  const float* r = rewards.data();
  const index_t count = count_chunked(rewards.size(), [r](index_t i) { return finite(r[i]) ? 0u : 1u; });
  if (count != 0 && policy == nonfinite::raise) {
    index_t c = 0;
    const std::string listed = name_nonfinite(rewards, c);
    RLPT_FAIL(errors::advantage::nonfinite,
              "{} of {} {} are not finite: {}{} (set on_nonfinite = rlpt::nonfinite::mask "
              "to leave them out of the statistics with advantage 0)",
              count, rewards.size(), what, listed, count > max_named ? ", ..." : "");
  }
  return count;
}

} // namespace detail

//! Per-group results of the group estimators (GRPO, RLOO, OPO, GPG, pass@k): for logging, for
//! DAPO-style filtering of zero-variance groups, and to see exactly which baseline was used.
//! Pass the same object to successive calls to reuse its storage.
struct group_stats {
  std::vector<float> mean;        //!< mean of the group's counted (finite) rewards; 0 when none
  std::vector<float> std;         //!< their std (unbiased unless the options say otherwise); 0 below 2 counted
  std::vector<index_t> size;      //!< counted rewards per group
  std::vector<mask_t> degenerate; //!< 1 when fewer than 2 rewards were counted or all are equal (zero std)
  index_t num_degenerate = 0;     //!< groups flagged degenerate
  double frac_degenerate = 0.0;   //!< num_degenerate / number of groups (0 for no groups)
  index_t num_nonfinite = 0;      //!< rewards left out under nonfinite::mask (their advantage is 0)
  double batch_std = 0.0;         //!< scale::batch_std: the batch std that was used; otherwise 0
};

//! One byte per sequence of `g`: 0 where its group is degenerate in `s` (group_stats::degenerate:
//! zero std, or fewer than two counted rewards, as TRL PR #6368's max == min; a single sample keeps
//! its reward as advantage under verl's convention), 1 elsewhere. As objective_inputs::
//! seq_in_denominator it leaves zero-variance groups out of the loss denominators, so that they
//! do not dilute the groups that carry a signal, while their KL and entropy terms stay in the
//! loss (docs/objective.md, "Degenerate groups and the denominator"). `s` comes from an estimator
//! called with `g`.
[[nodiscard]] inline std::vector<mask_t> nondegenerate_items(const groups& g, const group_stats& s) {
  detail::expect_size("group_stats.degenerate", static_cast<index_t>(s.degenerate.size()), g.num_groups(),
                      "one per group of g (the stats of an estimator called with these groups)");
  std::vector<mask_t> out(static_cast<std::size_t>(g.num_items()));
  for (index_t i = 0; i < g.num_items(); ++i)
    out[static_cast<std::size_t>(i)] = s.degenerate[static_cast<std::size_t>(g.group_of(i))] != 0 ? 0 : 1;
  return out;
}

namespace detail {

//! Groups handed to one worker at a time (fixed, so chunking never depends on the thread count).
inline constexpr index_t group_grain = 512;

//! Shared entry checks of the per-sequence group estimators; returns the non-finite count.
inline index_t start_group_estimator(view<const float> rewards, const groups& g, view<float> out, nonfinite policy) {
  g.expect_items("rewards", rewards.size());
  expect_size("advantages", out.size(), rewards.size(), "one advantage per sequence");
  return check_rewards(rewards, policy);
}

//! With single::raise, throws if any group has exactly one counted (finite) reward.
inline void check_singles(view<const float> rewards, const groups& g, single policy, const char* estimator,
                          const char* options) {
  if (policy != single::raise) return;
  index_t bad = 0, first = -1;
  for (index_t k = 0; k < g.num_groups(); ++k) {
    index_t counted = 0;
    for (index_t i : g.members(k)) counted += finite(rewards[i]) ? 1 : 0;
    if (counted == 1) {
      if (first < 0) first = k;
      ++bad;
    }
  }
  if (bad != 0)
    RLPT_FAIL(errors::advantage::group_size,
              "group {} (id {}) has 1 sample; {} needs at least 2 ({} group{} of {} like it; set rlpt::{}::single = "
              "rlpt::single::zero to give such samples advantage 0, or rlpt::single::raw to pass the reward through)",
              first, g.id(first), estimator, bad, bad == 1 ? "" : "s", g.num_groups(), options);
}

//! Groups whose moments for_each_group_moments takes together, before it finishes any of them.
inline constexpr index_t moments_block = 16;

//! The canonical moments of a block of moments_block groups, a field per array (lane l is the
//! block's group l), so that work over the block's groups vectorises across them.
struct block_moments {
  static constexpr int lanes = static_cast<int>(moments_block);
  double count[lanes], mean[lanes], m2[lanes], sum[lanes];
  [[nodiscard]] canonical_moments operator[](int l) const noexcept { return {count[l], mean[l], m2[l], sum[l]}; }
  void set(int l, const canonical_moments& m) noexcept {
    count[l] = m.count, mean[l] = m.mean, m2[l] = m.m2, sum[l] = m.sum;
  }
};

//! moments_side_by_side when each group fills its tree exactly (w == Width, each lane one
//! member): the members are transposed once into rows of one double per lane (member j of
//! every group), so the tree and the second pass are whole-row operations the compiler
//! vectorises, rather than strided reads. The same bits with fewer operations, because:
//! - each lane's first term is 0.0 + x, which differs from x only for x = -0.0; a tree over the
//!   raw x is then -0.0 exactly where the canonical one is +0.0 (every leaf -0.0) and equal
//!   elsewhere, so one 0.0 + at the root gives the canonical sum;
//! - Width is a power of two, so sum / Width is sum * (1 / Width) exactly.
template <int Width> void moments_one_member_per_lane(const float* x, block_moments& m) {
  constexpr int Lanes = block_moments::lanes;
  double leaf[Width][Lanes], acc[Width][Lanes];
  double* const mean = m.mean;
  double* const sum = m.sum;
  for (int l = 0; l < Lanes; ++l)
    for (int j = 0; j < Width; ++j) leaf[j][l] = static_cast<double>(x[l * Width + j]);
  for (int i = 0; i < Width; ++i)
    for (int l = 0; l < Lanes; ++l) acc[i][l] = leaf[i][l];
  for (int s = Width / 2; s >= 1; s >>= 1)
    for (int i = 0; i < s; ++i)
      for (int l = 0; l < Lanes; ++l) acc[i][l] = add_rn(acc[i][l], acc[i + s][l]);
  constexpr double inv = 1.0 / Width;
  for (int l = 0; l < Lanes; ++l) sum[l] = add_rn(0.0, acc[0][l]), mean[l] = mul_rn(sum[l], inv);
  for (int i = 0; i < Width; ++i)
    for (int l = 0; l < Lanes; ++l) {
      const double d = leaf[i][l] - mean[l];
      acc[i][l] = add_rn(0.0, mul_rn(d, d)); // the 0.0 + keeps a build that contracts from fusing d * d into the tree
    }
  for (int s = Width / 2; s >= 1; s >>= 1)
    for (int i = 0; i < s; ++i)
      for (int l = 0; l < Lanes; ++l) acc[i][l] = add_rn(acc[i][l], acc[i + s][l]);
  for (int l = 0; l < Lanes; ++l) m.count[l] = static_cast<double>(Width), m.m2[l] = acc[0][l];
}

//! The canonical moments of a block's groups (block_moments::lanes of them) of w finite
//! rewards each, side by side: x[l * w + j] is member j of group l. The operations of
//! moments_one_per_lane / moments_canonical (lane j % 32 adds member j, starting from +0.0; the
//! tree over `Width` = canonical_width(w) lanes), so the same bits, with the groups in SIMD lanes.
template <int Width> void moments_side_by_side(const float* x, index_t w, block_moments& m) {
  constexpr int Lanes = block_moments::lanes;
  if (w == Width) { // one member per lane (w a power of two up to 32): the rows are the tree's leaves
    moments_one_member_per_lane<Width>(x, m);
    return;
  }
  double acc[Width][Lanes];
  double sum[Lanes], mean[Lanes];
  for (int i = 0; i < Width; ++i)
    for (int l = 0; l < Lanes; ++l) acc[i][l] = 0.0;
  for (index_t j = 0; j < w; ++j) {
    double* a = acc[j & (Width - 1)];
    for (int l = 0; l < Lanes; ++l) a[l] = add_rn(a[l], static_cast<double>(x[l * w + j]));
  }
  for (int s = Width / 2; s >= 1; s >>= 1)
    for (int i = 0; i < s; ++i)
      for (int l = 0; l < Lanes; ++l) acc[i][l] = add_rn(acc[i][l], acc[i + s][l]);
  const double count = static_cast<double>(w);
  for (int l = 0; l < Lanes; ++l) sum[l] = acc[0][l], mean[l] = sum[l] / count;
  for (int i = 0; i < Width; ++i)
    for (int l = 0; l < Lanes; ++l) acc[i][l] = 0.0;
  for (index_t j = 0; j < w; ++j) {
    double* a = acc[j & (Width - 1)];
    for (int l = 0; l < Lanes; ++l) {
      const double d = static_cast<double>(x[l * w + j]) - mean[l];
      a[l] = add_rn(a[l], mul_rn(d, d));
    }
  }
  for (int s = Width / 2; s >= 1; s >>= 1)
    for (int i = 0; i < s; ++i)
      for (int l = 0; l < Lanes; ++l) acc[i][l] = add_rn(acc[i][l], acc[i + s][l]);
  for (int l = 0; l < Lanes; ++l) m.set(l, {count, mean[l], acc[0][l], sum[l]});
}

//! The members of a contiguous group, sequences [first, first + count), read from the offsets
//! alone: walking contiguous groups this way never makes the groups object write its lazy
//! members array (core/groups.hpp). Iterates like the view groups::members(k) returns.
struct index_run {
  index_t first = 0;
  index_t count = 0;
  struct iterator {
    index_t i;
    [[nodiscard]] index_t operator*() const noexcept { return i; }
    iterator& operator++() noexcept {
      ++i;
      return *this;
    }
    [[nodiscard]] bool operator!=(const iterator& o) const noexcept { return i != o.i; }
  };
  [[nodiscard]] index_t size() const noexcept { return count; }
  [[nodiscard]] index_t operator[](index_t j) const noexcept { return first + j; }
  [[nodiscard]] iterator begin() const noexcept { return {first}; }
  [[nodiscard]] iterator end() const noexcept { return {first + count}; }
};

//! for_each_group_moments' default finish_block: none (f finishes every group).
struct no_finish_block {};

//! Runs f(k, members of k, canonical moments of k's rewards) for every group k, in chunks of
//! group_grain groups (one worker each), the moments of a block of moments_block groups taken
//! before f runs on any of them. Members are an index_run for contiguous groups and the view
//! groups::members(k) otherwise, so f takes either (`const auto&`). With `all_finite` (no reward
//! is NaN or infinite), a block of contiguous groups of one size takes them side by side
//! (moments_side_by_side: the same bits; 1.1-2x faster estimators at 65,536 sequences,
//! docs/advantage.md); any other block, group by group.
//!
//! `finish_block`, when given, takes such a uniform block of groups of w >= 2 whole:
//! finish_block(k0, w, m) finishes groups k0 .. k0 + moments_block - 1 (sequences
//! offsets[k0] + l * w + j) in place of f, so that an estimator can do its per-group scalar work
//! (std, divisor, statistics) for the block's groups side by side too.
template <class F, class B = no_finish_block>
void for_each_group_moments(const groups& g, view<const float> rewards, const host_executor& ex, F&& f, bool all_finite,
                            B&& finish_block = {}) {
  static_assert(group_grain % moments_block == 0, "blocks never straddle a worker's chunk");
  const auto blocks = [&](auto members_of) {
    ex.parallel_for(g.num_groups(), group_grain, [&](index_t b, index_t e) {
      block_moments m{};
      for (index_t k0 = b; k0 < e; k0 += moments_block) {
        const int n = static_cast<int>(std::min(moments_block, e - k0));
        const index_t w = g.size(k0);
        bool uniform = all_finite && g.contiguous() && n == moments_block;
        for (int j = 1; j < n && uniform; ++j) uniform = g.size(k0 + j) == w;
        if (uniform) {
          const float* x = rewards.data() + g.offsets()[k0];
          static_assert(reduce_lanes == 32, "the widths below are the powers of two up to reduce_lanes");
          const int width = canonical_width(w);
          const auto with_width = [&]<int... W>(std::integer_sequence<int, W...>) {
            (void)((width == W && (moments_side_by_side<W>(x, w, m), true)) || ...);
          };
          with_width(std::integer_sequence<int, 1, 2, 4, 8, 16, 32>{});
          if constexpr (!std::is_same_v<std::decay_t<B>, no_finish_block>) {
            if (w >= 2) {
              finish_block(k0, w, m);
              continue;
            }
          }
        } else {
          for (int j = 0; j < n; ++j) {
            const auto mem = members_of(k0 + j);
            m.set(j, moments_canonical(mem.size(), [&](index_t i) { return rewards[mem[i]]; }));
          }
        }
        for (int j = 0; j < n; ++j) f(k0 + j, members_of(k0 + j), m[j]);
      }
    });
  };
  if (g.contiguous())
    blocks([&](index_t k) { return index_run{g.offsets()[k], g.size(k)}; });
  else
    blocks([&](index_t k) { return g.members(k); });
}

inline void reset_stats(group_stats& s, index_t num_groups) {
  const auto g = static_cast<std::size_t>(num_groups);
  s.mean.assign(g, 0.0f);
  s.std.assign(g, 0.0f);
  s.size.assign(g, 0);
  s.degenerate.assign(g, 0);
  s.num_degenerate = 0;
  s.frac_degenerate = 0.0;
  s.num_nonfinite = 0;
  s.batch_std = 0.0;
}

//! Records group g's moments and its std (std_of(m.count, m.m2, unbiased), computed by the caller).
inline void record_group(group_stats& s, index_t g, const canonical_moments& m, double sd) {
  const auto i = static_cast<std::size_t>(g);
  s.mean[i] = static_cast<float>(m.mean);
  s.std[i] = static_cast<float>(sd);
  s.size[i] = static_cast<index_t>(m.count);
  s.degenerate[i] = (m.count < 2.0 || m.m2 == 0.0) ? 1 : 0;
}
// The std is a double; a bool (say, an `unbiased` flag passed where the std belongs) must not
// convert to 0 or 1 silently.
void record_group(group_stats&, index_t, const canonical_moments&, bool) = delete;
//! Records group g's moments with the unbiased std (every estimator but GRPO reports that one).
inline void record_group(group_stats& s, index_t g, const canonical_moments& m) {
  record_group(s, g, m, std_of(m.count, m.m2, true));
}

inline void finish_stats(group_stats& s) {
  const mask_t* d = s.degenerate.data();
  s.num_degenerate =
      count_chunked(static_cast<index_t>(s.degenerate.size()), [d](index_t i) { return std::uint32_t{d[i]}; });
  s.frac_degenerate =
      s.degenerate.empty() ? 0.0 : static_cast<double>(s.num_degenerate) / static_cast<double>(s.degenerate.size());
}

} // namespace detail
RLPT_NAMESPACE_END
