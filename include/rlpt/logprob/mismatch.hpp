// SPDX-License-Identifier: Apache-2.0
//! @file
//! How far the trainer's log-probs of the sampled tokens are from the rollout engine's: the
//! per-step metrics of the training-inference mismatch, in one call.
//!
//! On-policy, the two should agree; in practice precision, attention kernels, the tensor-parallel
//! layout, MoE routing and a bad weight sync make them drift, and a rising mismatch is the
//! earliest warning of a collapse or a broken sync (verl #2996, vime #64). `logprob_mismatch`
//! reports every statistic the peers log for it, computed as they compute them: verl's
//! off-policy metrics (`compute_offpolicy_metrics`: k1 and k3 KL, both perplexities, their
//! log difference and ratio, token and sequence chi-squared) and its debug metrics
//! (`calculate_debug_metrics`: |p_trainer - p_rollout| and the Pearson correlation of the
//! probabilities), plus |Δ log p|, the correlation of the log-probs and the share of importance
//! ratios outside a band. Everything is summed in fp64 in row order: the result does not depend on
//! how the batch was padded or packed.
//!
//! A zero mismatch does not mean zero staleness, nor the reverse: with staleness 0 (synchronous
//! training) the implementation mismatch is still there, and the off-policy correction that
//! absorbs it (objective/correction.hpp) is still needed.
#pragma once

#include <rlpt/config.hpp>
#include <rlpt/core/error.hpp>
#include <rlpt/core/float_bits.hpp>
#include <rlpt/core/layout.hpp>
#include <rlpt/core/nonfinite.hpp>
#include <rlpt/core/stats.hpp>
#include <rlpt/core/views.hpp>

#include <algorithm>
#include <cmath>
#include <string_view>

RLPT_NAMESPACE_BEGIN

//! The two log-probs of each sampled token over one token layout (padded or packed): every view
//! has layout.storage_size() elements.
template <class T> struct basic_mismatch_inputs {
  token_layout layout{};
  view<const mask_t> mask{};    //!< nonzero = the token counts; empty: every token counts
  view<const T> trainer_logp{}; //!< the trainer's (verl old_log_prob, at the rollout's weights)
  view<const T> rollout_logp{}; //!< the rollout engine's (verl rollout_log_probs)
};
using mismatch_inputs = basic_mismatch_inputs<float>;

struct mismatch_options {
  //! out_of_band counts importance ratios exp(trainer - rollout) outside [1 - eps_low,
  //! 1 + eps_high] (default: PPO's clip range).
  double eps_low = 0.2;
  double eps_high = 0.2;
  //! The chi-squared terms clamp log rho (token) and its row sum (sequence) to [-c, c] before
  //! the exp (verl's SAFETY_BOUND, 20).
  double log_ratio_clamp = 20.0;
  //! A NaN or infinite log-prob (or one above 700, whose exp overflows) at a valid token: raise,
  //! or leave the token out and count it.
  rlpt::nonfinite nonfinite = rlpt::nonfinite::raise;
};

//! The metrics of one call. Token statistics are over the valid tokens, sequence statistics over
//! the rows with at least one; with none, every statistic is 0. rho = exp(trainer - rollout) is
//! the importance ratio that corrects rollout samples to the trainer's policy.
struct mismatch_metrics {
  double tokens = 0.0;           //!< valid tokens
  double seqs = 0.0;             //!< rows with a valid token
  double nonfinite_tokens = 0.0; //!< valid tokens left out for an unusable log-prob (nonfinite::mask)

  double k1 = 0.0;            //!< mean(rollout - trainer): KL(rollout || trainer) by k1 (verl `kl`)
  double k3 = 0.0;            //!< mean(rho - log rho - 1) (verl `k3_kl`)
  double abs_diff_mean = 0.0; //!< mean |trainer - rollout|
  double abs_diff_max = 0.0;  //!< max |trainer - rollout|
  //! |exp(trainer) - exp(rollout)| (verl `training/rollout_probs_diff_{mean,max,std}`; the std
  //! with Bessel's correction, 0 for fewer than two tokens)
  double prob_abs_diff_mean = 0.0;
  double prob_abs_diff_max = 0.0;
  double prob_abs_diff_std = 0.0;
  //! Pearson correlation of the two log-prob vectors, and of the two probability vectors (verl
  //! `training/rollout_actor_probs_pearson_corr`); 0 where it is undefined (fewer than two
  //! tokens, or either vector constant).
  double pearson_logp = 0.0;
  double pearson_prob = 0.0;
  double out_of_band = 0.0; //!< share of valid tokens with rho outside [1 - eps_low, 1 + eps_high]
  double chi2_token = 0.0;  //!< mean(rho_c^2) - 1, rho_c with log rho clamped (verl `chi2_token`)

  //! mean over rows of (prod_t rho_t)^2 - 1, the row's log-ratio sum clamped (verl `chi2_seq`)
  double chi2_seq = 0.0;
  double trainer_ppl = 0.0;      //!< mean over rows of exp(-mean trainer logp) (verl `training_ppl`)
  double rollout_ppl = 0.0;      //!< the same for the rollout's (verl `rollout_ppl`)
  double trainer_log_ppl = 0.0;  //!< mean over rows of -mean trainer logp (verl `training_log_ppl`)
  double rollout_log_ppl = 0.0;  //!< (verl `rollout_log_ppl`)
  double log_ppl_diff = 0.0;     //!< mean over rows of mean(rollout) - mean(trainer) (verl `log_ppl_diff`)
  double log_ppl_abs_diff = 0.0; //!< mean of its absolute value (verl `log_ppl_abs_diff`)
  double log_ppl_diff_max = 0.0; //!< (verl `log_ppl_diff_max`)
  double log_ppl_diff_min = 0.0; //!< (verl `log_ppl_diff_min`)
  double ppl_ratio = 0.0; //!< mean over rows of exp(log_ppl_diff): trainer / rollout perplexity (verl `ppl_ratio`)
};

namespace detail {

inline void check_mismatch_options(const mismatch_options& o) {
  RLPT_CHECK(std::isfinite(o.eps_low) && o.eps_low >= 0.0 && o.eps_low <= 1.0, errors::logprob::bad_option,
             "mismatch_options::eps_low = {} must be in [0, 1] (the band's lower end is 1 - eps_low)", o.eps_low);
  RLPT_CHECK(std::isfinite(o.eps_high) && o.eps_high >= 0.0, errors::logprob::bad_option,
             "mismatch_options::eps_high = {} must be finite and >= 0", o.eps_high);
  RLPT_CHECK(o.log_ratio_clamp > 0.0 && o.log_ratio_clamp <= 300.0, errors::logprob::bad_option,
             "mismatch_options::log_ratio_clamp = {} must be in (0, 300] (exp(2 c) stays finite in fp64)",
             o.log_ratio_clamp);
}

} // namespace detail

//! The training-inference mismatch metrics of one batch (see mismatch_metrics for each).
//! Throws rlpt::error for views whose size is not the layout's storage size, options out of
//! range, and (nonfinite::raise) a non-finite log-prob at a valid token, naming it.
template <class T>
[[nodiscard]] mismatch_metrics logprob_mismatch(const basic_mismatch_inputs<T>& in, const mismatch_options& opt = {}) {
  detail::check_mismatch_options(opt);
  const token_layout& L = in.layout;
  if (in.mask.size() != 0) L.expect_tokens("mask", in.mask);
  L.expect_tokens("trainer_logp", in.trainer_logp);
  L.expect_tokens("rollout_logp", in.rollout_logp);

  const double lo = 1.0 - opt.eps_low, hi = 1.0 + opt.eps_high, c = opt.log_ratio_clamp;
  mismatch_metrics m;
  // A valid token counts when both are log-probabilities exp() can take: finite and at most
  // max_logp (a positive log-probability is already wrong, but rounding makes tiny ones); any
  // other raises, or (nonfinite::mask) is left out and counted.
  constexpr double max_logp = 700.0; // exp(700) ~ 1e304: every sum of such terms stays finite
  auto usable_value = [](T v) { return finite(v) && static_cast<double>(v) <= max_logp; };
  auto usable = [&](index_t b, index_t t, index_t i) {
    const T x = in.trainer_logp[i], y = in.rollout_logp[i];
    if (RLPT_LIKELY(usable_value(x) && usable_value(y))) return true;
    if (opt.nonfinite == nonfinite::mask) return false;
    const bool bad_trainer = !usable_value(x);
    RLPT_FAIL(errors::logprob::nonfinite,
              "{}[{}] = {} at a valid token (sequence {}, position {}) is not a finite log-probability of at most "
              "{}; set nonfinite = rlpt::nonfinite::mask to leave such tokens out and count them",
              bad_trainer ? "trainer_logp" : "rollout_logp", i, static_cast<double>(bad_trainer ? x : y), b, t,
              max_logp);
  };

  // Pass 1: the sums, extremes and row statistics.
  double sum_t = 0, sum_r = 0, sum_pt = 0, sum_pr = 0, sum_dp = 0, sum_adiff = 0, sum_k1 = 0, sum_k3 = 0, sum_chi = 0;
  double out = 0, max_adiff = 0, max_dp = 0;
  double ppl_t = 0, ppl_r = 0, lppl_t = 0, lppl_r = 0, lpd = 0, lpd_abs = 0, ppl_ratio = 0, chi_seq = 0;
  double lpd_max = -HUGE_VAL, lpd_min = HUGE_VAL;
  for (index_t b = 0; b < L.num_seqs(); ++b) {
    double n = 0, row_t = 0, row_r = 0;
    for (index_t t = 0; t < L.length(b); ++t) {
      const index_t i = L.at(b, t);
      if (in.mask.size() != 0 && in.mask[i] == 0) continue;
      if (!usable(b, t, i)) {
        m.nonfinite_tokens += 1;
        continue;
      }
      const double x = static_cast<double>(in.trainer_logp[i]), y = static_cast<double>(in.rollout_logp[i]);
      const double d = x - y, rho = std::exp(d), pt = std::exp(x), pr = std::exp(y), dp = std::fabs(pt - pr);
      n += 1;
      row_t += x;
      row_r += y;
      sum_pt += pt;
      sum_pr += pr;
      sum_dp += dp;
      max_dp = std::max(max_dp, dp);
      sum_adiff += std::fabs(d);
      max_adiff = std::max(max_adiff, std::fabs(d));
      sum_k1 += y - x;
      sum_k3 += rho - d - 1.0;
      const double rc = std::exp(std::clamp(d, -c, c));
      sum_chi += rc * rc;
      out += (rho < lo || rho > hi) ? 1.0 : 0.0;
    }
    if (n == 0) continue;
    m.tokens += n;
    m.seqs += 1;
    sum_t += row_t;
    sum_r += row_r;
    const double mt = row_t / n, mr = row_r / n, diff = mr - mt;
    ppl_t += std::exp(-mt);
    ppl_r += std::exp(-mr);
    lppl_t += -mt;
    lppl_r += -mr;
    lpd += diff;
    lpd_abs += std::fabs(diff);
    lpd_max = std::max(lpd_max, diff);
    lpd_min = std::min(lpd_min, diff);
    ppl_ratio += std::exp(diff);
    const double s = std::clamp(row_t - row_r, -c, c);
    chi_seq += std::exp(2.0 * s);
  }
  if (m.tokens == 0) return m;

  const double N = m.tokens, S = m.seqs;
  m.k1 = sum_k1 / N;
  m.k3 = sum_k3 / N;
  m.abs_diff_mean = sum_adiff / N;
  m.abs_diff_max = max_adiff;
  m.prob_abs_diff_mean = sum_dp / N;
  m.prob_abs_diff_max = max_dp;
  m.out_of_band = out / N;
  m.chi2_token = sum_chi / N - 1.0;
  m.chi2_seq = chi_seq / S - 1.0;
  m.trainer_ppl = ppl_t / S;
  m.rollout_ppl = ppl_r / S;
  m.trainer_log_ppl = lppl_t / S;
  m.rollout_log_ppl = lppl_r / S;
  m.log_ppl_diff = lpd / S;
  m.log_ppl_abs_diff = lpd_abs / S;
  m.log_ppl_diff_max = lpd_max;
  m.log_ppl_diff_min = lpd_min;
  m.ppl_ratio = ppl_ratio / S;

  // Pass 2: the centred sums of the correlations and the spread (two passes: no cancellation).
  const double mean_t = sum_t / N, mean_r = sum_r / N, mean_pt = sum_pt / N, mean_pr = sum_pr / N;
  const double mean_dp = m.prob_abs_diff_mean;
  double ctt = 0, crr = 0, ctr = 0, cpt = 0, cpr = 0, cpp = 0, cdp = 0;
  for (index_t b = 0; b < L.num_seqs(); ++b)
    for (index_t t = 0; t < L.length(b); ++t) {
      const index_t i = L.at(b, t);
      if (in.mask.size() != 0 && in.mask[i] == 0) continue;
      if (!usable_value(in.trainer_logp[i]) || !usable_value(in.rollout_logp[i])) continue; // counted in pass 1
      const double x = static_cast<double>(in.trainer_logp[i]), y = static_cast<double>(in.rollout_logp[i]);
      const double pt = std::exp(x), pr = std::exp(y);
      const double a = x - mean_t, r = y - mean_r, u = pt - mean_pt, v = pr - mean_pr;
      const double e = std::fabs(pt - pr) - mean_dp;
      ctt += a * a;
      crr += r * r;
      ctr += a * r;
      cpt += u * u;
      cpr += v * v;
      cpp += u * v;
      cdp += e * e;
    }
  auto pearson = [](double cov, double va, double vb) { return va > 0.0 && vb > 0.0 ? cov / std::sqrt(va * vb) : 0.0; };
  m.pearson_logp = pearson(ctr, ctt, crr);
  m.pearson_prob = pearson(cpp, cpt, cpr);
  const moments dp{.count = N, .mean = mean_dp, .m2 = cdp}; // core's moments: the spread with Bessel's correction
  m.prob_abs_diff_std = N > 1 ? dp.stddev(/*unbiased=*/true) : 0.0;
  return m;
}

RLPT_NAMESPACE_END
