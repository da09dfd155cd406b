// SPDX-License-Identifier: Apache-2.0
//! @file
//! GRPO group normalisation and its relatives that share the group mean baseline: GRPO
//! (std, batch std or no scaling = Dr. GRPO), GPG (batch-rescaled mean baseline) and verl's
//! pass@k (only each group's best sample learns).
//!
//! Inputs are one scalar reward per sequence and explicit groups (ids or offsets, any order,
//! ragged); outputs are one advantage per sequence (broadcast onto tokens with
//! rlpt::broadcast_to_tokens). Statistics are two-pass fp64 in a fixed per-group order
//! (detail::canonical_sum), so results do not depend on batch size, thread count or backend.
#pragma once

#include <rlpt/config.hpp>
#include <rlpt/advantage/common.hpp>
#include <rlpt/core/error.hpp>
#include <rlpt/core/executor.hpp>
#include <rlpt/core/groups.hpp>
#include <rlpt/core/views.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

RLPT_NAMESPACE_BEGIN

struct grpo_options {
  rlpt::scale scale = rlpt::scale::group_std; //!< verl default (norm_adv_by_std_in_grpo=True), TRL "group"
  bool unbiased = true;                       //!< Bessel-corrected std, as torch.std in verl, TRL and OpenRLHF
  double epsilon = 1e-6;                      //!< added to the std: verl 1e-6 (TRL 1e-4, OpenRLHF 1e-9, AReaL 1e-5)
  double std_floor = 0.0;                     //!< std <- max(std, floor) before epsilon; 0 = off (verl)
  rlpt::single single = rlpt::single::raw;    //!< verl: a lone sample gets mean 0, std 1, i.e. R / (1 + eps)
  rlpt::nonfinite on_nonfinite = rlpt::nonfinite::raise; //!< verl would propagate NaN; rlpt raises
};

namespace detail {

//! Baseline and divisor of one group (shared by the host loop and the CUDA kernel).
struct group_norm {
  double mean = 0.0;
  double div = 1.0;
  bool zero = false; //!< every member gets advantage 0
};

//! The divisor of a group of 2 or more members whose std is `group_std` (selects only, no
//! branches: grpo_finish_block evaluates it for side-by-side groups).
RLPT_HD double grpo_div(double group_std, double batch_std, const grpo_options& o) {
  const double sigma = o.scale == scale::group_std ? group_std : o.scale == scale::batch_std ? batch_std : 1.0;
  return o.scale == scale::none ? 1.0 : add_rn(sigma > o.std_floor ? sigma : o.std_floor, o.epsilon);
}

//! `group_std` is std_of(count, m2, o.unbiased): computed once by the caller, which records it too.
RLPT_HD group_norm grpo_norm(double count, double mean, double group_std, double batch_std, const grpo_options& o) {
  group_norm r;
  if (count < 1.0 || (count < 2.0 && o.single != single::raw)) { // single::raise was rejected before any work
    r.zero = true;
    return r;
  }
  if (count >= 2.0) r.mean = mean;
  // A single raw member keeps its reward, and a group std of 1 stands for the one it lacks.
  r.div = grpo_div(count >= 2.0 ? group_std : 1.0, batch_std, o);
  return r;
}

RLPT_HD float apply_norm(float x, const group_norm& n) {
  if (n.zero || !finite(x)) return 0.0f;
  const double d = static_cast<double>(x) - n.mean;
  // d / 1.0 is d: scale::none (Dr. GRPO) skips a division per sequence.
  return static_cast<float>(n.div == 1.0 ? d : d / n.div);
}

//! Batch std over every counted reward (canonical 256-lane order, shared with the device); a
//! batch with fewer than 2 counted rewards has std 1 (nothing to compare against).
inline double batch_std_of(view<const float> rewards, bool unbiased) {
  const canonical_moments m = moments_canonical<batch_lanes>(rewards.size(), [&](index_t i) { return rewards[i]; });
  return m.count < 2.0 ? 1.0 : std_of(m.count, m.m2, unbiased);
}

//! apply_norm over the contiguous sequences [0, count) of a group, on the host: two at a time
//! where the compiler has vector extensions. A packed IEEE division gives each lane the bits of
//! the scalar one and costs the divider about what one scalar division does (x / 1.0 is x, so
//! scale::none skips it). It serves the contiguous groups that no uniform block takes
//! (grpo_finish_block: ragged sizes, a non-finite reward, a partial block). Not in CUDA TUs,
//! whose host pass the scalar loop serves with the same bits.
inline void apply_norm_run(const float* x, float* out, index_t count, const group_norm& n) {
  if (n.zero) {
    std::fill_n(out, count, 0.0f);
    return;
  }
  index_t j = 0;
#if (defined(__GNUC__) || defined(__clang__)) && !defined(__CUDACC__)
  using f2 = float __attribute__((vector_size(8)));
  using d2 = double __attribute__((vector_size(16)));
  using i2 = std::int32_t __attribute__((vector_size(8)));
  const d2 mean = {n.mean, n.mean}, div = {n.div, n.div};
  for (; j + 2 <= count; j += 2) {
    f2 v;
    std::memcpy(&v, x + j, sizeof v);
    const d2 d = __builtin_convertvector(v, d2) - mean;
    const f2 q = __builtin_convertvector(n.div == 1.0 ? d : d / div, f2); // scale::none: no division
    i2 bits, out_bits;
    std::memcpy(&bits, &v, sizeof bits);
    std::memcpy(&out_bits, &q, sizeof out_bits);
    out_bits &= (bits & 0x7f800000) != 0x7f800000; // all ones where the reward is finite: 0 otherwise, as in apply_norm
    std::memcpy(out + j, &out_bits, sizeof out_bits);
  }
#endif
  for (; j < count; ++j) out[j] = apply_norm(x[j], n);
}

//! apply_norm over a uniform block of finite rewards: groups of W members (0: w, known at run time).
//! It leaves out apply_norm's zero and finite tests on purpose: the block's groups have w >= 2
//! members (never zero) and for_each_group_moments hands over only all-finite blocks.
template <int W>
void grpo_apply_block(const float* x, float* out, index_t w, const double (&mean)[moments_block],
                      const double (&div)[moments_block], bool divide) {
  const index_t n = W != 0 ? W : w;
  for (index_t l = 0; l < moments_block; ++l) {
    const float* xl = x + l * n;
    float* ol = out + l * n;
    if (divide)
      for (index_t j = 0; j < n; ++j) ol[j] = static_cast<float>((static_cast<double>(xl[j]) - mean[l]) / div[l]);
    else
      for (index_t j = 0; j < n; ++j) ol[j] = static_cast<float>(static_cast<double>(xl[j]) - mean[l]);
  }
}

//! GRPO's finish of a uniform block (for_each_group_moments' finish_block): moments_block
//! contiguous groups of w >= 2 finite rewards from x (advantages to out), lane by lane what
//! std_of, record_group, grpo_norm and apply_norm do group by group, with the same bits. Over
//! many small groups the per-group finish was about half of a call, its sqrt and divisions
//! waiting on each other group after group; side by side (the moments a field per array) they
//! overlap and the statistics are written a vector at a time.
inline void grpo_finish_block(const float* x, float* out, index_t w, const block_moments& m, group_stats& s, index_t k0,
                              double batch_std, const grpo_options& o) {
  constexpr int L = block_moments::lanes;
  const double count = static_cast<double>(w);
  double sd[L], div[L];
  const double dof = o.unbiased ? count - 1.0 : count; // > 0: w >= 2
#if defined(__SSE2__) && (defined(__GNUC__) || defined(__clang__)) && !defined(__CUDACC__)
  // Two lanes per sqrtpd (which the compiler does not vectorise std::sqrt into, for errno):
  // std_of's bits, as m2 >= 0 and dof > 0.
  using d2 = double __attribute__((vector_size(16)));
  for (int l = 0; l < L; l += 2) {
    d2 q;
    std::memcpy(&q, m.m2 + l, sizeof q);
    const d2 r = __builtin_ia32_sqrtpd(q / dof);
    std::memcpy(sd + l, &r, sizeof r);
  }
#else
  for (int l = 0; l < L; ++l) sd[l] = std_of(count, m.m2[l], o.unbiased);
#endif
  // record_group's fields (keep the two in step; w >= 2 here, so its count test is moot), through
  // local pointers: a store to one vector's elements must not make the compiler reload the others'
  // data pointers.
  const auto at = static_cast<std::size_t>(k0);
  float* const mean_out = s.mean.data() + at;
  float* const std_out = s.std.data() + at;
  index_t* const size_out = s.size.data() + at;
  mask_t* const degenerate_out = s.degenerate.data() + at;
  // A loop per field: one that mixes float, index_t and byte stores stays scalar.
  for (int l = 0; l < L; ++l) mean_out[l] = static_cast<float>(m.mean[l]);
  for (int l = 0; l < L; ++l) std_out[l] = static_cast<float>(sd[l]);
  for (int l = 0; l < L; ++l) size_out[l] = w;
  for (int l = 0; l < L; ++l) degenerate_out[l] = m.m2[l] == 0.0 ? 1 : 0;
  for (int l = 0; l < L; ++l) div[l] = grpo_div(sd[l], batch_std, o);
  const bool divide = o.scale != scale::none; // d / 1.0 is d
  switch (w) {                                // the common sizes with the member loop unrolled
  case 2:
    return grpo_apply_block<2>(x, out, w, m.mean, div, divide);
  case 4:
    return grpo_apply_block<4>(x, out, w, m.mean, div, divide);
  case 8:
    return grpo_apply_block<8>(x, out, w, m.mean, div, divide);
  case 16:
    return grpo_apply_block<16>(x, out, w, m.mean, div, divide);
  default:
    return grpo_apply_block<0>(x, out, w, m.mean, div, divide);
  }
}

inline void check_grpo_options(const grpo_options& o) {
  RLPT_CHECK(o.epsilon >= 0.0 && o.std_floor >= 0.0 && std::isfinite(o.epsilon) && std::isfinite(o.std_floor),
             errors::advantage::bad_option, "grpo_options: epsilon ({}) and std_floor ({}) must be finite and >= 0",
             o.epsilon, o.std_floor);
  RLPT_CHECK(o.scale == scale::none || o.epsilon > 0.0 || o.std_floor > 0.0, errors::advantage::bad_option,
             "grpo_options: scaling by std needs epsilon > 0 or std_floor > 0, or a zero-std group divides by zero");
}

} // namespace detail

//! GRPO advantages: A_i = (R_i - mean_g) / (max(std_g, floor) + eps), or R_i - mean_g with
//! scale::none. Writes one advantage per sequence into `out` and the per-group statistics into
//! `stats` (reuse it across calls to avoid allocation).
inline void grpo_advantages(view<const float> rewards, const groups& g, view<float> out, const grpo_options& o,
                            group_stats& stats, const host_executor& ex = {}) {
  detail::check_grpo_options(o);
  const index_t bad = detail::start_group_estimator(rewards, g, out, o.on_nonfinite);
  detail::check_singles(rewards, g, o.single, "GRPO with single = raise", "grpo_options");
  detail::reset_stats(stats, g.num_groups());
  stats.num_nonfinite = bad;
  const double batch_std = o.scale == scale::batch_std ? detail::batch_std_of(rewards, o.unbiased) : 0.0;
  stats.batch_std = batch_std;
  detail::for_each_group_moments(
      g, rewards, ex,
      [&](index_t k, const auto& mem, const detail::canonical_moments& m) {
        const double sd = detail::std_of(m.count, m.m2, o.unbiased);
        detail::record_group(stats, k, m, sd);
        const detail::group_norm n = detail::grpo_norm(m.count, m.mean, sd, batch_std, o);
        if constexpr (std::is_same_v<std::decay_t<decltype(mem)>, detail::index_run>)
          detail::apply_norm_run(rewards.data() + mem.first, out.data() + mem.first, mem.count, n);
        else
          for (index_t i : mem) out[i] = detail::apply_norm(rewards[i], n);
      },
      bad == 0,
      [&](index_t k0, index_t w, const detail::block_moments& m) {
        const index_t first = g.offsets()[k0];
        detail::grpo_finish_block(rewards.data() + first, out.data() + first, w, m, stats, k0, batch_std, o);
      });
  detail::finish_stats(stats);
}

[[nodiscard]] inline group_stats grpo_advantages(view<const float> rewards, const groups& g, view<float> out,
                                                 const grpo_options& o = {}, const host_executor& ex = {}) {
  group_stats s;
  grpo_advantages(rewards, g, out, o, s, ex);
  return s;
}

// --- GPG -------------------------------------------------------------------------------------

struct gpg_options {
  double f_norm = 1.0;                     //!< verl compute_gpg_outcome_advantage f_norm (1.0)
  rlpt::single single = rlpt::single::raw; //!< verl: a lone sample has mean 0
  rlpt::nonfinite on_nonfinite = rlpt::nonfinite::raise;
};

//! GPG (arXiv 2504.02546, verl `gpg`): A_i = alpha * (R_i - mean_g) / f_norm with
//! alpha = N / max(1, #{R != 0}) over the counted rewards of the whole batch, so advantages are
//! not group-local.
inline void gpg_advantages(view<const float> rewards, const groups& g, view<float> out, const gpg_options& o,
                           group_stats& stats, const host_executor& ex = {}) {
  RLPT_CHECK(std::isfinite(o.f_norm) && o.f_norm != 0.0, errors::advantage::bad_option,
             "gpg_options: f_norm must be finite and non-zero, got {}", o.f_norm);
  const index_t bad = detail::start_group_estimator(rewards, g, out, o.on_nonfinite);
  detail::check_singles(rewards, g, o.single, "GPG with single = raise", "gpg_options");
  detail::reset_stats(stats, g.num_groups());
  stats.num_nonfinite = bad;
  index_t nonzero = 0;
  for (index_t i = 0; i < rewards.size(); ++i) nonzero += (detail::finite(rewards[i]) && rewards[i] != 0.0f) ? 1 : 0;
  const double alpha = static_cast<double>(rewards.size() - bad) / static_cast<double>(std::max<index_t>(nonzero, 1));
  detail::for_each_group_moments(
      g, rewards, ex,
      [&](index_t k, const auto& mem, const detail::canonical_moments& m) {
        detail::record_group(stats, k, m);
        const bool zero = m.count < 1.0 || (m.count < 2.0 && o.single != single::raw);
        const double mean = m.count < 2.0 ? 0.0 : m.mean;
        for (index_t i : mem)
          out[i] = (zero || !detail::finite(rewards[i]))
                       ? 0.0f
                       : static_cast<float>(detail::mul_rn(alpha, static_cast<double>(rewards[i]) - mean) / o.f_norm);
      },
      bad == 0);
  detail::finish_stats(stats);
}

[[nodiscard]] inline group_stats gpg_advantages(view<const float> rewards, const groups& g, view<float> out,
                                                const gpg_options& o = {}, const host_executor& ex = {}) {
  group_stats s;
  gpg_advantages(rewards, g, out, o, s, ex);
  return s;
}

// --- pass@k ----------------------------------------------------------------------------------

struct passk_options {
  bool scale_by_std = true;                  //!< verl reads config.norm_adv_by_std_in_grpo (default True)
  double epsilon = 1e-6;                     //!< verl: (R_max - R_2nd) / (std + 1e-6)
  rlpt::single single = rlpt::single::raise; //!< verl raises for a group of 1; zero is the alternative
  rlpt::nonfinite on_nonfinite = rlpt::nonfinite::raise;
};

//! verl `grpo_passk` (arXiv 2503.19595): in each group only the best sample (the first member in
//! group order on ties) gets A = R_max - R_second [/ (std_g + eps)]; every other sample gets 0.
inline void passk_advantages(view<const float> rewards, const groups& g, view<float> out, const passk_options& o,
                             group_stats& stats, const host_executor& ex = {}) {
  RLPT_CHECK(o.single != single::raw, errors::advantage::bad_option,
             "passk_options: single = raw has no meaning for pass@k (no second sample to compare); use raise or zero");
  RLPT_CHECK(o.epsilon >= 0.0 && std::isfinite(o.epsilon), errors::advantage::bad_option,
             "passk_options: epsilon must be finite and >= 0, got {}", o.epsilon);
  const index_t bad = detail::start_group_estimator(rewards, g, out, o.on_nonfinite);
  detail::check_singles(rewards, g, o.single, "pass@k", "passk_options");
  detail::reset_stats(stats, g.num_groups());
  stats.num_nonfinite = bad;
  detail::for_each_group_moments(
      g, rewards, ex,
      [&](index_t k, const auto& mem, const detail::canonical_moments& m) {
        const double sd = detail::std_of(m.count, m.m2, true);
        detail::record_group(stats, k, m, sd);
        index_t best = -1;
        float top = 0.0f, second = 0.0f;
        bool have_second = false;
        for (index_t i : mem) {
          out[i] = 0.0f;
          const float x = rewards[i];
          if (!detail::finite(x)) continue;
          if (best < 0 || x > top) {
            if (best >= 0) {
              second = top;
              have_second = true;
            }
            top = x;
            best = i;
          } else if (!have_second || x > second) {
            second = x;
            have_second = true;
          }
        }
        if (!have_second) return; // 0 or 1 counted: advantage 0 (single::zero)
        double a = static_cast<double>(top) - static_cast<double>(second);
        if (o.scale_by_std) a /= detail::add_rn(sd, o.epsilon);
        out[best] = static_cast<float>(a);
      },
      bad == 0);
  detail::finish_stats(stats);
}

[[nodiscard]] inline group_stats passk_advantages(view<const float> rewards, const groups& g, view<float> out,
                                                  const passk_options& o = {}, const host_executor& ex = {}) {
  group_stats s;
  passk_advantages(rewards, g, out, o, s, ex);
  return s;
}

RLPT_NAMESPACE_END
