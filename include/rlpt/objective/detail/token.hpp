// SPDX-License-Identifier: Apache-2.0
//! @file
//! Pieces host and device evaluation share beyond the per-token math: reading one token's
//! inputs from the views (masked slots read as zeros, never as garbage) and turning the sums
//! into an objective_result.
#pragma once

#include <rlpt/config.hpp>
#include <rlpt/core/views.hpp>
#include <rlpt/objective/detail/math.hpp>
#include <rlpt/objective/detail/plan.hpp>
#include <rlpt/objective/inputs.hpp>

RLPT_NAMESPACE_BEGIN
namespace detail {

//! Reads token i of sequence b; masked slots (and, under nonfinite_policy::skip, slots with a
//! non-finite input) come back invalid with zeros. `bad` is set for a valid slot whose inputs
//! are not all finite.
template <class T, memory_space S = memory_space::host>
struct token_loader {
  const objective_plan& p;
  const basic_objective_inputs<T, S>& in;

  RLPT_HD_FORCEINLINE token_inputs<T> operator()(index_t b, index_t i, bool& bad) const {
    token_inputs<T> t;
    const bool m = in.mask[i] != 0;
    bad = false;
    if (!m) return t;
    t.valid = true;
    if (in.logp.size() != 0) t.lp = in.logp[i];
    if (p.has_old) t.old = in.old_logp[i];
    if (p.has_behav) t.behav = in.behav_logp[i];
    if (p.has_ref) t.ref = in.ref_logp[i];
    if (p.has_adv) t.adv = in.adv[i];
    else if (p.has_seq_adv) t.adv = in.seq_adv[b];
    if (p.has_entropy) t.ent = in.entropy[i];
    if (p.use_value) {
      t.v = in.values[i];
      t.ret = in.returns[i];
      if (in.old_values.size() != 0) t.v_old = in.old_values[i];
    }
    bool ok = finite_r(t.lp) && finite_r(t.old) && finite_r(t.behav) && finite_r(t.ref) && finite_r(t.adv) &&
              finite_r(t.ent) && finite_r(t.v) && finite_r(t.ret) && finite_r(t.v_old);
    if (p.distill_coef != 0.0) {
      T teacher = T(0);
      for (int k = 0; k < p.teachers; ++k) {
        const T tk = in.teacher_logp(k, i);
        ok = ok && finite_r(tk);
        teacher += T(p.teacher_w[k]) * tk;
      }
      const T student = p.student == student_logp::behaviour ? t.behav
                        : p.student == student_logp::proximal ? t.old
                                                              : t.lp;
      t.adv += T(p.distill_coef) * (teacher - student);
    }
    if (!ok) {
      bad = true;
      if (p.nonfinite == nonfinite_policy::skip) t = token_inputs<T>{};
    }
    return t;
  }
};

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
