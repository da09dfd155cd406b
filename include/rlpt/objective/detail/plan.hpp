// SPDX-License-Identifier: Apache-2.0
//! @file
//! The trivially copyable form of an objective (what kernels take by value) and the per-row
//! logic host and device evaluation share: row statistics (lengths, sequence ratios,
//! sequence-level corrections) turned into the constants of a row's token pass, and the per-call
//! sums turned into an objective_result. How one token's terms combine is in detail/token.hpp.
#pragma once

#include <rlpt/config.hpp>
#include <rlpt/core/nonfinite.hpp>
#include <rlpt/objective/aggregate.hpp>
#include <rlpt/objective/correction.hpp>
#include <rlpt/objective/detail/math.hpp>
#include <rlpt/objective/distill.hpp>
#include <rlpt/objective/inputs.hpp>
#include <rlpt/objective/kl.hpp>
#include <rlpt/objective/policy.hpp>
#include <rlpt/objective/value.hpp>

#include <cstdint>
#include <limits>

RLPT_NO_CONTRACT_BEGIN
RLPT_NAMESPACE_BEGIN
namespace detail {

//! Per-call sums: the four aggregated terms and the metric counters. Merged in a fixed order
//! (host chunks, device blocks), so the result does not depend on thread count or scheduling.
struct objective_sums {
  double policy = 0.0; //!< aggregated policy term (alpha-weighted)
  double kl = 0.0;
  double entropy = 0.0;
  double value = 0.0;
  double valid = 0.0;     //!< valid tokens (mask, before rejection)
  double in_loss = 0.0;   //!< tokens that stay in the loss
  double seqs = 0.0;      //!< rows with a valid token
  double loss_seqs = 0.0; //!< rows with a token in the loss
  double rows = 0.0;      //!< all rows
  double clip_low = 0.0;
  double clip_high = 0.0;
  double clip_dual = 0.0;
  double clamped = 0.0;
  double approx_kl = 0.0; //!< sum of old - logp over in-loss tokens
  double kl_value = 0.0;  //!< sum of the KL estimator over in-loss tokens
  double w_sum = 0.0;     //!< importance weights over valid tokens
  double w_min = std::numeric_limits<double>::infinity();
  double w_max = -std::numeric_limits<double>::infinity();
  double rejected = 0.0; //!< valid tokens rejected or given weight 0 by the correction
  double entropy_value = 0.0;
  double value_clipped = 0.0;
  double nonfinite = 0.0;

  RLPT_HD void merge(const objective_sums& o) {
    policy += o.policy;
    kl += o.kl;
    entropy += o.entropy;
    value += o.value;
    valid += o.valid;
    in_loss += o.in_loss;
    seqs += o.seqs;
    loss_seqs += o.loss_seqs;
    rows += o.rows;
    clip_low += o.clip_low;
    clip_high += o.clip_high;
    clip_dual += o.clip_dual;
    clamped += o.clamped;
    approx_kl += o.approx_kl;
    kl_value += o.kl_value;
    w_sum += o.w_sum;
    w_min = o.w_min < w_min ? o.w_min : w_min;
    w_max = o.w_max > w_max ? o.w_max : w_max;
    rejected += o.rejected;
    entropy_value += o.entropy_value;
    value_clipped += o.value_clipped;
    nonfinite += o.nonfinite;
  }
};

//! One rejection criterion as the passes test it: k1's lower bound resolved (1 / hi when 0) and
//! the k1 bounds in log space.
struct rs_plan {
  rs_stat stat = rs_stat::none;
  rs_level level = rs_level::token;
  double lo = 0.0, hi = 0.0;
  double log_lo = 0.0, log_hi = 0.0;
};

struct objective_plan {
  policy_kind policy = policy_kind::ppo_clip;
  ppo_clip ppo{};
  gspo gs{};
  gmpo gm{};
  cispo ci{};
  sapo sa{};
  dppo dp{};
  dro dr{};
  vespo ve{};
  off_policy_correction corr{};
  kl_penalty kl{};
  double entropy_coef = 0.0;
  value_loss value{};
  double distill_coef = 0.0;
  student_logp student = student_logp::behaviour;
  int teachers = 0;
  double teacher_w[max_teachers] = {};
  agg_plan agg_policy{};
  agg_plan agg_kl{};
  agg_plan agg_entropy{};
  agg_plan agg_value{};
  rlpt::nonfinite nonfinite = rlpt::nonfinite::raise;

  bool has_old = false;
  bool has_behav = false;
  bool has_ref = false;
  bool has_adv = false;      //!< per-token advantages
  bool has_seq_adv = false;  //!< per-sequence advantages
  bool has_den_mask = false; //!< seq_in_denominator: some sequences stay out of the denominators
  bool has_entropy = false;
  bool has_values = false;

  bool use_policy = false;
  bool use_kl = false;
  bool use_entropy = false; //!< the entropy term is in the loss (coef != 0)
  bool use_value = false;
  bool use_is = false;      //!< importance weights on
  bool use_rs = false;      //!< rejection on (rs_count criteria)
  bool removes = false;     //!< rejected tokens leave the terms (removed, masked)
  bool drops_count = false; //!< and the denominators (removed)
  bool is_seq = false;      //!< sequence-level importance weight
  bool rs_seq = false;      //!< a sequence-level rejection criterion
  bool rs_token = false;    //!< a token-level rejection criterion
  bool need_row_pass = false;
  bool sequence_form = false; //!< GSPO or SAPO with the gradient through the sequence mean
  bool seq_ratio = false; //!< the row's mean log-ratio s_seq: GSPO, the sequence form, CISPO per sequence, kl_seq_ic
  bool seq_sum = false;   //!< s_seq is the sum of the log-ratios, not their mean (gspo.length_normalized = false)
  bool coupled = false;   //!< a coupling pass adds d loss / d s: the sequence form, kl_seq_ic
  bool mean_advantage = false; //!< GSPO or SAPO: every token takes its row's mean advantage
  bool fold_w = false;         //!< VESPO: token weights folded into the sequence weight, not the term
  bool kl_seq_ic = false;      //!< the KL term weighted by the row's sequence ratio (kl.importance_per_sequence)

  bool w_norm_local = false; //!< batch-normalised weights whose mean this call takes from its inputs
  double w_norm = 1.0;       //!< the divisor of every importance weight (1: none)

  int rs_count = 0;                //!< rejection criteria in rs (all must pass)
  rs_plan rs[max_rejections] = {}; //!< off_policy_correction::reject, then reject_also's in use
  //! The statistic correction leaves in a chunk's pv (its last token-level criterion's; none
  //! without one): stats_chunk takes it from there for a sequence-level criterion of the same
  //! statistic (verl's "token_k3,seq_mean_k3").
  rs_stat rs_held = rs_stat::none;

  [[nodiscard]] RLPT_HD bool needs_length() const {
    return (use_policy && agg_policy.needs_length()) || (use_kl && agg_kl.needs_length()) ||
           (use_entropy && agg_entropy.needs_length()) || (use_value && agg_value.needs_length());
  }
};

//! Sums over one row's tokens that sequence-level pieces need. Accumulated in double.
struct row_stats {
  double len = 0.0;                   //!< valid tokens
  double len_keep = 0.0;              //!< valid tokens passing token-level rejection
  double sum_lr = 0.0;                //!< sum of log rho over valid tokens (sequence IS)
  double rs_sum[max_rejections] = {}; //!< per criterion: sum of its statistic over valid tokens
  //! per criterion: maximum of its statistic over valid tokens (the only fields reduced by max;
  //! the constructor starts each at -inf)
  double rs_max[max_rejections] = {};
  double sum_x = 0.0;   //!< seq_ratio: sum of logp - old over in-loss tokens
  double sum_xc = 0.0;  //!< VESPO: sum of clamp(logp - old, -20, 20) over in-loss tokens
  double sum_xs = 0.0;  //!< GMPO: sum of x* over in-loss tokens
  double sum_adv = 0.0; //!< GMPO, mean_advantage: sum of A over in-loss tokens
  //! GMPO: sum of log(w + 1e-10) over in-loss tokens (token weights); VESPO with fold_w: sum of
  //! clamp(log w, log 1e-8, 20) over valid tokens
  double sum_logw = 0.0;
  double sum_w = 0.0; //!< token weights over valid tokens (w_norm_local: the batch mean's share)

  RLPT_HD row_stats() {
    for (double& m : rs_max) m = -std::numeric_limits<double>::infinity();
  }
};

//! The per-row constants the token pass needs, derived from the row statistics.
struct row_consts {
  bool seq_keep = true;  //!< sequence-level rejection passed
  double len_loss = 0.0; //!< tokens in the loss (the length every per-row denominator uses)
  double len_in = 0.0;   //!< tokens in the terms: len_loss, less the rejected ones when masked
  double w_seq = 1.0;    //!< sequence-level importance weight
  double s_seq = 0.0;    //!< seq_ratio: the mean log-ratio over the in-loss tokens (the sum under seq_sum)
  double s_den = 1.0;    //!< seq_ratio: what the sum is divided by for s_seq; d s_seq / d logp_t = 1 / s_den
  double kl_r = 1.0;     //!< kl_seq_ic: the KL term's weight exp(clamp(s_seq, -20, 20))
  double kl_dr = 0.0;    //!< kl_seq_ic: d kl_r / d s_seq (0 where the clamp binds)
  double gmpo_ratio = 0.0;
  double mean_adv = 0.0; //!< GMPO, mean_advantage: mean advantage over the in-term tokens
  double gmpo_w = 1.0;   //!< geometric mean of the token weights
  bool gmpo_clamped = false;
  double vespo_pos = 1.0, vespo_neg = 1.0;                           //!< VESPO: phi(w) for A >= 0 and A < 0
  double a_policy = 0.0, a_kl = 0.0, a_entropy = 0.0, a_value = 0.0; //!< alpha_i per term
};

//! Sequence-level decisions of a row: rejection, weight, GSPO / GMPO ratios. Aggregation
//! weights are filled by row_alphas once the denominators are known.
RLPT_HD row_consts row_finish(const objective_plan& p, const row_stats& s) {
  row_consts c;
  if (p.rs_seq) {
    // Each sequence-level criterion on its own statistic; all must pass. A row without valid
    // tokens counts as kept (nothing to reject).
    for (int i = 0; i < p.rs_count; ++i) {
      const rs_plan& r = p.rs[i];
      double stat = 0.0;
      switch (r.level) {
      case rs_level::seq_sum:
        stat = s.rs_sum[i];
        break;
      case rs_level::seq_mean:
        stat = s.len > 0.0 ? s.rs_sum[i] / s.len : 0.0;
        break;
      case rs_level::seq_max:
        stat = s.len > 0.0 ? s.rs_max[i] : 0.0;
        break;
      case rs_level::token:
        continue;
      }
      c.seq_keep = c.seq_keep && (s.len <= 0.0 || rs_keep(r.stat, stat, r.lo, r.hi, r.log_lo, r.log_hi));
    }
  }
  // rejection_action::bound_weight: a sequence out of bounds stays, with its weight bounded.
  const bool bound_all = p.corr.action == rejection_action::reject || !c.seq_keep;
  if (p.corr.action == rejection_action::bound_weight) c.seq_keep = true;
  c.len_in = p.removes ? (c.seq_keep ? s.len_keep : 0.0) : s.len;
  c.len_loss = p.drops_count ? c.len_in : s.len;
  if (p.use_is && p.is_seq) {
    const double cl = static_cast<double>(p.corr.log_ratio_clamp);
    double lr = s.sum_lr;
    if (p.corr.weight.level == is_level::seq_geomean) lr = s.len > 0.0 ? lr / s.len : 0.0;
    const double raw = exp_r(clamp_r(lr, -cl, cl));
    c.w_seq = bound_weight(bound_all ? p.corr.weight.bound : is_bound::none, raw, static_cast<double>(p.corr.weight.lo),
                           static_cast<double>(p.corr.weight.hi)) /
              p.w_norm;
  }
  if (p.seq_ratio) {
    const double den = c.len_in > 1.0 ? c.len_in : 1.0;
    c.s_den = p.seq_sum ? 1.0 : den;
    c.s_seq = s.sum_x / c.s_den;
    c.mean_adv = s.sum_adv / den;
    if (p.kl_seq_ic) {
      c.kl_r = exp_r(clamp_r(c.s_seq, -20.0, 20.0));
      c.kl_dr = c.s_seq >= -20.0 && c.s_seq <= 20.0 ? c.kl_r : 0.0;
    }
  }
  if (p.policy == policy_kind::vespo) {
    const double log_w = s.sum_xc + (p.fold_w ? s.sum_logw : 0.0);
    c.vespo_pos = vespo_phi(p.ve.k_pos, p.ve.lambda_pos, log_w);
    c.vespo_neg = vespo_phi(p.ve.k_neg, p.ve.lambda_neg, log_w);
  }
  if (p.policy == policy_kind::gmpo) {
    const double den = c.len_in > 0.0 ? c.len_in : 1.0;
    const double cl = static_cast<double>(p.gm.log_ratio_clamp);
    const double m = s.sum_xs / den;
    c.gmpo_clamped = m < -cl || m > cl;
    c.gmpo_ratio = exp_r(clamp_r(m, -cl, cl));
    c.mean_adv = s.sum_adv / den;
    if (p.use_is) {
      if (p.is_seq) {
        // verl takes the geometric mean of the (broadcast) weights: exp(L log(w + 1e-10) / L).
        const double lw = c.len_in * log_r(c.w_seq + 1e-10);
        c.gmpo_w = exp_r(lw / den);
      } else {
        c.gmpo_w = exp_r(s.sum_logw / den);
      }
    }
  }
  return c;
}

//! Fills the aggregation weight of every term from the row's in-loss length.
RLPT_HD void row_alphas(const objective_plan& p, row_consts& c) {
  c.a_policy = p.agg_policy.row_weight(c.len_loss);
  c.a_kl = p.agg_kl.row_weight(c.len_loss);
  c.a_entropy = p.agg_entropy.row_weight(c.len_loss);
  c.a_value = p.agg_value.row_weight(c.len_loss);
}

//! The result of a call from its sums.
RLPT_HD objective_result finish_result(const objective_plan& p, const objective_sums& s) {
  objective_result r;
  r.policy_loss = s.policy;
  r.kl_loss = s.kl;
  r.entropy_loss = p.use_entropy ? s.entropy : 0.0;
  r.value_loss = s.value;
  r.loss = s.policy + static_cast<double>(p.kl.coef) * s.kl - static_cast<double>(p.entropy_coef) * r.entropy_loss +
           static_cast<double>(p.value.coef) * s.value;
  r.tokens = s.valid;
  r.loss_tokens = s.in_loss;
  r.seqs = s.seqs;
  const double nl = s.in_loss > 0.0 ? s.in_loss : 1.0;
  r.clip_frac_low = s.clip_low / nl;
  r.clip_frac_high = s.clip_high / nl;
  r.clip_frac_dual = s.clip_dual / nl;
  r.clamped_frac = s.clamped / nl;
  r.approx_kl = p.has_old ? s.approx_kl / nl : 0.0;
  r.kl_mean = s.kl_value / nl;
  if (s.valid > 0.0) {
    r.is_weight_min = s.w_min;
    r.is_weight_max = s.w_max;
    r.is_weight_mean = s.w_sum / s.valid;
    r.rejected_frac = s.rejected / s.valid;
  }
  r.entropy_mean = s.entropy_value / nl;
  r.value_clip_frac = s.value_clipped / nl;
  r.nonfinite_tokens = s.nonfinite;
  return r;
}

} // namespace detail
RLPT_NAMESPACE_END
RLPT_NO_CONTRACT_END
