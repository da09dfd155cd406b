// SPDX-License-Identifier: Apache-2.0
//! @file
//! The host token pass over one sequence. Tokens go through in chunks that stay in L1: each
//! component (load, correction, policy term, KL, combine) is a separate tight loop over the
//! chunk with its configuration switch outside the loop, so the compiler vectorises every
//! loop and the composition costs no per-token dispatch. Sums are accumulated in fp64 over
//! fixed lanes, so the result does not depend on how rows are split across threads.
#pragma once

#include <rlpt/config.hpp>
#include <rlpt/core/layout.hpp>
#include <rlpt/core/views.hpp>
#include <rlpt/objective/detail/math.hpp>
#include <rlpt/objective/detail/plan.hpp>
#include <rlpt/objective/detail/token.hpp>
#include <rlpt/objective/inputs.hpp>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <type_traits>

RLPT_NAMESPACE_BEGIN
namespace detail {

inline constexpr int host_chunk = 256;

// Host-only force-inline (RLPT_OBJECTIVE_HOST_INLINE would make these host+device under nvcc): the
// whole token pass must inline into each ISA clone below.
#if defined(__GNUC__) || defined(__clang__)
#define RLPT_OBJECTIVE_HOST_INLINE inline __attribute__((always_inline))
#else
#define RLPT_OBJECTIVE_HOST_INLINE inline
#endif

//! Sum of v[0..n) in fp64 over eight independent lanes (vectorises without reassociation).
template <class T>
RLPT_OBJECTIVE_HOST_INLINE double lane_sum(const T* v, int n) {
  double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int j = 0;
  for (; j + 8 <= n; j += 8)
    for (int k = 0; k < 8; ++k) acc[k] += static_cast<double>(v[j + k]);
  for (; j < n; ++j) acc[0] += static_cast<double>(v[j]);
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

template <class F>
RLPT_OBJECTIVE_HOST_INLINE std::int32_t count(const F* v, int n) {
  std::int32_t c = 0;
  for (int j = 0; j < n; ++j) c += v[j] ? 1 : 0;
  return c;
}

template <class T>
struct host_chunk_data {
  T lp[host_chunk], old[host_chunk], behav[host_chunk], ref[host_chunk], adv[host_chunk];
  T ent[host_chunk], v[host_chunk], v_old[host_chunk], ret[host_chunk];
  T w[host_chunk], pv[host_chunk], pg[host_chunk], kv[host_chunk], kg[host_chunk], vv[host_chunk], vg[host_chunk];
  T tmp[host_chunk];
  std::uint8_t valid[host_chunk], keep[host_chunk], inl[host_chunk], rej[host_chunk];
  std::uint32_t flags[host_chunk];
  std::uint8_t vclip[host_chunk];
};

//! Zeroes the chunk arrays of inputs this call does not have (they are read as 0).
template <class T>
RLPT_OBJECTIVE_HOST_INLINE void zero_absent(const objective_plan& p, const basic_objective_inputs<T>& in, host_chunk_data<T>& c) {
  auto zero = [](T* dst) {
    for (int j = 0; j < host_chunk; ++j) dst[j] = T(0);
  };
  if (in.logp.size() == 0) zero(c.lp);
  if (!p.has_old) zero(c.old);
  if (!p.has_behav) zero(c.behav);
  if (!p.has_ref) zero(c.ref);
  if (!p.has_adv && !p.has_seq_adv) zero(c.adv);
  if (!p.has_entropy) zero(c.ent);
  if (!p.use_value) zero(c.v), zero(c.ret);
  if (!p.use_value || in.old_values.size() == 0) zero(c.v_old);
}

//! Loads a chunk [i0, i0 + n) of sequence b (absent inputs stay zero); returns the number of
//! valid tokens with a non-finite input (they become invalid under nonfinite_policy::skip).
template <class T>
RLPT_OBJECTIVE_HOST_INLINE int load_chunk(const objective_plan& p, const basic_objective_inputs<T>& in, index_t b, index_t i0, int n,
               host_chunk_data<T>& c) {
  const mask_t* m = in.mask.data() + i0;
  for (int j = 0; j < n; ++j) {
    c.valid[j] = m[j] != 0 ? 1 : 0;
    c.rej[j] = 0; // scratch: non-finite flags
  }
  auto fill = [&](T* dst, const view<const T>& src, bool present) {
    if (!present) return;
    const T* s = src.data() + i0;
    for (int j = 0; j < n; ++j) {
      const T x = s[j];
      dst[j] = x;
      c.rej[j] = static_cast<std::uint8_t>(c.rej[j] | static_cast<std::uint8_t>(!finite_r(x)));
    }
  };
  fill(c.lp, in.logp, in.logp.size() != 0);
  fill(c.old, in.old_logp, p.has_old);
  fill(c.behav, in.behav_logp, p.has_behav);
  fill(c.ref, in.ref_logp, p.has_ref);
  if (p.has_seq_adv) {
    const T a = in.seq_adv[b];
    const std::uint8_t bad = finite_r(a) ? 0 : 1;
    for (int j = 0; j < n; ++j) c.adv[j] = a, c.rej[j] = static_cast<std::uint8_t>(c.rej[j] | bad);
  } else {
    fill(c.adv, in.adv, p.has_adv);
  }
  fill(c.ent, in.entropy, p.has_entropy);
  fill(c.v, in.values, p.use_value);
  fill(c.ret, in.returns, p.use_value);
  fill(c.v_old, in.old_values, p.use_value && in.old_values.size() != 0);
  if (p.distill_coef != 0.0) {
    for (int j = 0; j < n; ++j) c.tmp[j] = T(0);
    for (int k = 0; k < p.teachers; ++k) {
      const T* tk = in.teacher_logp.data() + k * in.teacher_logp.row_stride() + i0;
      const T wk = T(p.teacher_w[k]);
      for (int j = 0; j < n; ++j) {
        c.tmp[j] += wk * tk[j];
        c.rej[j] = static_cast<std::uint8_t>(c.rej[j] | static_cast<std::uint8_t>(!finite_r(tk[j])));
      }
    }
    const T* student = p.student == student_logp::behaviour ? c.behav : p.student == student_logp::proximal ? c.old : c.lp;
    const T coef = T(p.distill_coef);
    for (int j = 0; j < n; ++j) c.adv[j] += coef * (c.tmp[j] - student[j]);
  }
  for (int j = 0; j < n; ++j) c.rej[j] = static_cast<std::uint8_t>(c.rej[j] & c.valid[j]);
  const int bad = count(c.rej, n);
  if (bad != 0 && p.nonfinite == nonfinite_policy::skip)
    for (int j = 0; j < n; ++j) c.valid[j] = static_cast<std::uint8_t>(c.valid[j] & (c.rej[j] ^ 1));
  return bad;
}

//! Importance weights, rejection and which tokens stay in the loss.
template <class T>
RLPT_OBJECTIVE_HOST_INLINE void correction_chunk(const objective_plan& p, const row_consts& rc, int n, host_chunk_data<T>& c) {
  if (!p.use_is && !p.use_rs) {
    for (int j = 0; j < n; ++j) {
      c.w[j] = T(1);
      c.keep[j] = 1;
      c.inl[j] = c.valid[j];
      c.rej[j] = 0;
    }
    return;
  }
  const T cl = T(p.corr.log_ratio_clamp);
  const T* num = p.corr.numerator == ratio_numerator::proximal ? c.old : c.lp;
  for (int j = 0; j < n; ++j) c.tmp[j] = clamp_r(num[j] - c.behav[j], -cl, cl); // clamped log rho
  if (p.use_rs && !p.rs_seq) {
    const T lo = T(p.corr.reject.lo), hi = T(p.corr.reject.hi), llo = T(p.rs_log_lo), lhi = T(p.rs_log_hi);
    auto loop = [&](auto stat) {
      constexpr rs_stat st = decltype(stat)::value;
      for (int j = 0; j < n; ++j) c.keep[j] = rs_keep(st, rs_token_stat(st, c.tmp[j]), lo, hi, llo, lhi) ? 1 : 0;
    };
    switch (p.corr.reject.stat) {
    case rs_stat::ratio: loop(std::integral_constant<rs_stat, rs_stat::ratio>{}); break;
    case rs_stat::k1: loop(std::integral_constant<rs_stat, rs_stat::k1>{}); break;
    case rs_stat::k2: loop(std::integral_constant<rs_stat, rs_stat::k2>{}); break;
    case rs_stat::k3: loop(std::integral_constant<rs_stat, rs_stat::k3>{}); break;
    case rs_stat::none: break;
    }
  } else {
    for (int j = 0; j < n; ++j) c.keep[j] = 1;
  }
  if (!rc.seq_keep)
    for (int j = 0; j < n; ++j) c.keep[j] = 0;
  if (p.use_is && !p.is_seq) {
    const is_bound bd = p.corr.weight.bound;
    const T lo = T(p.corr.weight.lo), hi = T(p.corr.weight.hi);
    for (int j = 0; j < n; ++j) c.w[j] = bound_weight(bd, exp_r(c.tmp[j]), lo, hi);
  } else {
    const T w = p.use_is ? T(rc.w_seq) : T(1);
    for (int j = 0; j < n; ++j) c.w[j] = w;
  }
  const bool removes = p.removes;
  for (int j = 0; j < n; ++j) {
    const bool keep = c.keep[j] != 0;
    const bool valid = c.valid[j] != 0;
    c.w[j] = sel((!keep) & (!removes), T(0), c.w[j]);
    c.inl[j] = (valid & (keep | (!removes))) ? 1 : 0;
    c.rej[j] = (valid & ((!keep) | (c.w[j] == T(0)))) ? 1 : 0;
  }
}

//! Maximum of v[0..n) where use[j], over eight lanes (-inf when none).
template <class T>
RLPT_OBJECTIVE_HOST_INLINE double lane_max(const T* v, const std::uint8_t* use, int n) {
  T acc[8];
  for (int k = 0; k < 8; ++k) acc[k] = -std::numeric_limits<T>::infinity();
  int j = 0;
  for (; j + 8 <= n; j += 8)
    for (int k = 0; k < 8; ++k) acc[k] = max_r(acc[k], sel(use[j + k] != 0, v[j + k], acc[k]));
  for (; j < n; ++j) acc[0] = max_r(acc[0], sel(use[j] != 0, v[j], acc[0]));
  T m = acc[0];
  for (int k = 1; k < 8; ++k) m = max_r(m, acc[k]);
  return static_cast<double>(m);
}

//! One chunk's share of the row statistics, after load_chunk and correction_chunk (seq_keep set).
template <class T>
RLPT_OBJECTIVE_HOST_INLINE void stats_chunk(const objective_plan& p, int n, host_chunk_data<T>& c, row_stats& st) {
  st.len += static_cast<double>(count(c.valid, n));
  for (int j = 0; j < n; ++j) c.rej[j] = static_cast<std::uint8_t>(c.valid[j] & c.keep[j]);
  st.len_keep += static_cast<double>(count(c.rej, n));
  if (p.use_rs && p.rs_seq) {
    const rs_stat stat = p.corr.reject.stat;
    for (int j = 0; j < n; ++j) c.pv[j] = rs_token_stat(stat, c.tmp[j]);
    for (int j = 0; j < n; ++j) c.pg[j] = sel(c.valid[j] != 0, c.pv[j], T(0));
    st.rs_sum += lane_sum(c.pg, n);
    st.rs_max = std::max(st.rs_max, lane_max(c.pv, c.valid, n));
  }
  if (p.use_is && p.is_seq) {
    const T* num = p.corr.numerator == ratio_numerator::proximal ? c.old : c.lp;
    for (int j = 0; j < n; ++j) {
      const T lr = num[j] - c.behav[j];
      c.pg[j] = sel(c.valid[j] != 0, lr, T(0));
    }
    st.sum_lr += lane_sum(c.pg, n);
  }
  if (p.policy == policy_kind::gspo) {
    for (int j = 0; j < n; ++j) {
      const T x = c.lp[j] - c.old[j];
      c.pg[j] = sel(c.inl[j] != 0, x, T(0));
    }
    st.sum_x += lane_sum(c.pg, n);
  }
  if (p.policy == policy_kind::gmpo) {
    const gmpo o = p.gm;
    for (int j = 0; j < n; ++j) {
      T xs, dxs;
      std::uint32_t f;
      gmpo_token(o, c.lp[j] - c.old[j], c.adv[j], xs, dxs, f);
      c.pv[j] = sel(c.inl[j] != 0, xs, T(0));
      c.pg[j] = sel(c.inl[j] != 0, c.adv[j], T(0));
    }
    st.sum_xs += lane_sum(c.pv, n);
    st.sum_adv += lane_sum(c.pg, n);
    if (p.use_is && !p.is_seq)
      for (int j = 0; j < n; ++j) // log has no vectorised form here; GMPO with token weights is rare
        if (c.inl[j]) st.sum_logw += static_cast<double>(log_r(c.w[j] + T(1e-10)));
  }
}

template <class T>
RLPT_OBJECTIVE_HOST_INLINE void policy_chunk(const objective_plan& p, const row_consts& rc, int n, host_chunk_data<T>& c) {
  for (int j = 0; j < n; ++j) c.tmp[j] = c.lp[j] - c.old[j]; // x
  // Options copied into locals: the compiler then knows the chunk stores cannot change them
  // and hoists every conversion out of the loops.
  switch (p.policy) {
  case policy_kind::ppo_clip: {
    const ppo_clip o = p.ppo;
    for (int j = 0; j < n; ++j) {
      const policy_token<T> q = ppo_token(o, c.tmp[j], c.adv[j]);
      c.pv[j] = q.value, c.pg[j] = q.grad;
      c.flags[j] = q.flags;
    }
    break;
  }
  case policy_kind::gspo: {
    const gspo o = p.gs;
    const T s = T(rc.s_gspo);
    for (int j = 0; j < n; ++j) {
      const policy_token<T> q = gspo_token(o, s, c.adv[j]);
      c.pv[j] = q.value, c.pg[j] = q.grad; // sequence form: d value / d s_i, chained by the caller
      c.flags[j] = q.flags;
    }
    break;
  }
  case policy_kind::gmpo: {
    const T coef = rc.gmpo_clamped || rc.len_loss <= 0.0
                       ? T(0)
                       : -T(rc.gmpo_adv) * T(rc.gmpo_w) * T(rc.gmpo_ratio) / T(rc.len_loss);
    const gmpo o = p.gm;
    const std::uint32_t cl = flag_if(rc.gmpo_clamped, flag_clamped);
    for (int j = 0; j < n; ++j) {
      T xs, dxs;
      std::uint32_t f;
      gmpo_token(o, c.tmp[j], c.adv[j], xs, dxs, f);
      c.pv[j] = T(0), c.pg[j] = coef * dxs;
      c.flags[j] = f | cl;
    }
    break;
  }
  case policy_kind::cispo: {
    const cispo o = p.ci;
    for (int j = 0; j < n; ++j) {
      const policy_token<T> q = cispo_token(o, c.tmp[j], c.lp[j], c.adv[j]);
      c.pv[j] = q.value, c.pg[j] = q.grad;
      c.flags[j] = q.flags;
    }
    break;
  }
  case policy_kind::sapo: {
    const sapo o = p.sa;
    for (int j = 0; j < n; ++j) {
      const policy_token<T> q = sapo_token(o, c.tmp[j], c.adv[j]);
      c.pv[j] = q.value, c.pg[j] = q.grad;
      c.flags[j] = q.flags;
    }
    break;
  }
  case policy_kind::policy_gradient:
    for (int j = 0; j < n; ++j) {
      c.pv[j] = -c.lp[j] * c.adv[j], c.pg[j] = -c.adv[j];
      c.flags[j] = 0;
    }
    break;
  case policy_kind::none:
    for (int j = 0; j < n; ++j) {
      c.pv[j] = T(0), c.pg[j] = T(0);
      c.flags[j] = 0;
    }
    break;
  }
}

template <class T>
RLPT_OBJECTIVE_HOST_INLINE void kl_chunk(const objective_plan& p, int n, host_chunk_data<T>& c) {
  if (!p.use_kl) return;
  if (!p.has_old)
    for (int j = 0; j < n; ++j) c.tmp[j] = T(0); // x = logp - old is 0 without old_logp
  const kl_penalty k = p.kl; // a local: see policy_chunk
  auto estimate = [&](auto e) {
    for (int j = 0; j < n; ++j) {
      const kl_token<T> q = kl_estimate<decltype(e)::value>(k, c.lp[j] - c.ref[j]);
      c.kv[j] = q.value, c.kg[j] = q.grad;
    }
  };
  switch (k.estimator) {
  case kl_estimator::k1: estimate(std::integral_constant<kl_estimator, kl_estimator::k1>{}); break;
  case kl_estimator::abs: estimate(std::integral_constant<kl_estimator, kl_estimator::abs>{}); break;
  case kl_estimator::k2: estimate(std::integral_constant<kl_estimator, kl_estimator::k2>{}); break;
  case kl_estimator::k3: estimate(std::integral_constant<kl_estimator, kl_estimator::k3>{}); break;
  }
  if (k.gradient == kl_gradient::straight_through)
    for (int j = 0; j < n; ++j) c.kg[j] = kl_regrad<kl_gradient::straight_through>(k, c.lp[j] - c.ref[j], c.tmp[j]);
  else if (k.gradient == kl_gradient::k2_importance)
    for (int j = 0; j < n; ++j) c.kg[j] = kl_regrad<kl_gradient::k2_importance>(k, c.lp[j] - c.ref[j], c.tmp[j]);
  if (k.importance_corrected)
    for (int j = 0; j < n; ++j) {
      const kl_token<T> q = kl_importance(kl_token<T>{c.kv[j], c.kg[j]}, c.tmp[j]);
      c.kv[j] = q.value, c.kg[j] = q.grad;
    }
}

//! Per-row fp64 running sums of the unweighted terms and the metric counts.
struct host_row_acc {
  double policy = 0, kl = 0, entropy = 0, value = 0, dcoef = 0, approx_kl = 0;
  double w_sum = 0, w_min = 1e300, w_max = -1e300;
  std::int64_t valid = 0, in_loss = 0, rejected = 0, nonfinite = 0;
  std::int64_t low = 0, high = 0, dual = 0, clamped = 0, vclip = 0;
};

template <class T>
RLPT_OBJECTIVE_HOST_INLINE void combine_chunk(const objective_plan& p, const row_consts& rc, index_t i0, int n, host_chunk_data<T>& c,
                   const basic_objective_grads<T>& gr, host_row_acc& a) {
  const T ap = T(rc.a_policy);
  const T ak = T(p.kl.coef * rc.a_kl);
  const bool kl = p.use_kl;
  const bool seq_gspo = p.gspo_sequence;
  if (gr.logp.size() != 0) {
    T* g = gr.logp.data() + i0;
    const T pf = seq_gspo ? T(0) : ap;
    const bool folded = p.policy == policy_kind::gmpo; // GMPO's weight is folded into its row coefficient
    if (kl) {
      for (int j = 0; j < n; ++j) {
        const T v = pf * sel(folded, T(1), c.w[j]) * c.pg[j] + ak * c.kg[j];
        g[j] = sel(c.inl[j] != 0, v, T(0));
      }
    } else {
      for (int j = 0; j < n; ++j) {
        const T v = pf * sel(folded, T(1), c.w[j]) * c.pg[j];
        g[j] = sel(c.inl[j] != 0, v, T(0));
      }
    }
  }
  if (gr.entropy.size() != 0) {
    const T ge = p.use_entropy ? T(-p.entropy_coef * rc.a_entropy) : T(0);
    T* g = gr.entropy.data() + i0;
    for (int j = 0; j < n; ++j) g[j] = sel(c.inl[j] != 0, ge, T(0));
  }
  if (p.use_value) {
    for (int j = 0; j < n; ++j) {
      const value_token<T> q = value_term(p.value, c.v[j], c.v_old[j], c.ret[j]);
      c.vv[j] = q.value, c.vg[j] = q.grad, c.vclip[j] = static_cast<std::uint8_t>(q.clipped);
    }
  }
  if (gr.values.size() != 0) {
    const T av = T(p.value.coef * rc.a_value);
    const bool on = p.use_value;
    T* g = gr.values.data() + i0;
    for (int j = 0; j < n; ++j) {
      const T v = av * c.vg[j];
      g[j] = sel((c.inl[j] != 0) & on, v, T(0));
    }
  }
  // Term sums over the tokens in the loss.
  for (int j = 0; j < n; ++j) {
    const T v = c.w[j] * c.pv[j];
    c.tmp[j] = sel(c.inl[j] != 0, v, T(0));
  }
  a.policy += lane_sum(c.tmp, n);
  if (seq_gspo) {
    for (int j = 0; j < n; ++j) {
      const T v = c.w[j] * c.pg[j];
      c.tmp[j] = sel(c.inl[j] != 0, v, T(0));
    }
    a.dcoef += lane_sum(c.tmp, n);
  }
  if (kl) {
    for (int j = 0; j < n; ++j) c.tmp[j] = sel(c.inl[j] != 0, c.kv[j], T(0));
    a.kl += lane_sum(c.tmp, n);
  }
  if (p.has_entropy) {
    for (int j = 0; j < n; ++j) c.tmp[j] = sel(c.inl[j] != 0, c.ent[j], T(0));
    a.entropy += lane_sum(c.tmp, n);
  }
  if (p.use_value) {
    for (int j = 0; j < n; ++j) c.tmp[j] = sel(c.inl[j] != 0, c.vv[j], T(0));
    a.value += lane_sum(c.tmp, n);
    for (int j = 0; j < n; ++j) c.vclip[j] = c.inl[j] & c.vclip[j];
    a.vclip += count(c.vclip, n);
  }
  if (p.has_old) {
    for (int j = 0; j < n; ++j) {
      const T v = c.old[j] - c.lp[j];
      c.tmp[j] = sel(c.inl[j] != 0, v, T(0));
    }
    a.approx_kl += lane_sum(c.tmp, n);
  }
  std::int32_t low = 0, high = 0, dual = 0, clamped = 0;
  for (int j = 0; j < n; ++j) {
    const std::uint32_t f = c.flags[j] & (0u - static_cast<std::uint32_t>(c.inl[j]));
    low += static_cast<std::int32_t>(f & 1u);
    high += static_cast<std::int32_t>((f >> 1) & 1u);
    dual += static_cast<std::int32_t>((f >> 2) & 1u);
    clamped += static_cast<std::int32_t>((f >> 3) & 1u);
  }
  a.low += low;
  a.high += high;
  a.dual += dual;
  a.clamped += clamped;
  const std::int32_t valid = count(c.valid, n);
  a.valid += valid;
  a.in_loss += count(c.inl, n);
  a.rejected += count(c.rej, n);
  if (p.use_is) {
    for (int j = 0; j < n; ++j) c.tmp[j] = sel(c.valid[j] != 0, c.w[j], T(0));
    a.w_sum += lane_sum(c.tmp, n);
    a.w_max = std::max(a.w_max, lane_max(c.w, c.valid, n));
    for (int j = 0; j < n; ++j) c.tmp[j] = -c.w[j];
    a.w_min = std::min(a.w_min, -lane_max(c.tmp, c.valid, n));
  } else if (valid > 0) {
    a.w_sum += static_cast<double>(valid);
    a.w_min = std::min(a.w_min, 1.0);
    a.w_max = std::max(a.w_max, 1.0);
  }
}

// x86-64 builds default to SSE2. The token pass is compute-bound (two exp per token), so an
// AVX2 clone roughly halves its time; it is chosen at run time when the CPU has AVX2. The clone
// enables AVX2 only (no FMA): with the same operations per lane and fixed summation lanes, both
// clones give bit-identical results.
#if (defined(__GNUC__) || defined(__clang__)) && defined(__x86_64__) && !defined(__AVX2__) && \
    !defined(RLPT_NO_ISA_DISPATCH)
#define RLPT_OBJECTIVE_AVX2_CLONE() 1
#else
#define RLPT_OBJECTIVE_AVX2_CLONE() 0
#endif

// Each chunk stage is compiled once per instruction set as its own out-of-line function (a call
// per 256 tokens costs nothing). Force-inlining all of them into one row function per ISA made
// two functions of ~200 KB of machine code, and GCC's -O3 passes that grow faster than linearly
// with function size (PRE, post-reload CSE, liveness) took over a minute in every TU calling
// evaluate. The chunk is a local of the row driver, so __restrict tells the truth: nothing else
// the stage reads (plan, inputs, outputs) overlaps it. Running sums go in and come back by value:
// passed by reference, g++ 12 -O3 lost the AVX2 stats stage's update of row_stats::sum_logw in
// its caller (GMPO with token weights; gone with -fno-ipa-modref).
#if defined(__GNUC__) || defined(__clang__)
#define RLPT_OBJECTIVE_STAGE_NOINLINE __attribute__((noinline))
#define RLPT_OBJECTIVE_RESTRICT __restrict__
#else
#define RLPT_OBJECTIVE_STAGE_NOINLINE
#define RLPT_OBJECTIVE_RESTRICT
#endif

#define RLPT_OBJECTIVE_HOST_STAGES(ATTR)                                                                           \
  ATTR static int load(const objective_plan& p, const basic_objective_inputs<T>& in, index_t b, index_t i0, int n, \
                       host_chunk_data<T>& RLPT_OBJECTIVE_RESTRICT c) {                                             \
    return load_chunk(p, in, b, i0, n, c);                                                                          \
  }                                                                                                                 \
  ATTR static void correction(const objective_plan& p, const row_consts& rc, int n,                                 \
                              host_chunk_data<T>& RLPT_OBJECTIVE_RESTRICT c) {                                      \
    correction_chunk(p, rc, n, c);                                                                                  \
  }                                                                                                                 \
  ATTR static row_stats stats(const objective_plan& p, int n, host_chunk_data<T>& RLPT_OBJECTIVE_RESTRICT c,        \
                              row_stats st) {                                                                      \
    stats_chunk(p, n, c, st);                                                                                       \
    return st;                                                                                                      \
  }                                                                                                                 \
  ATTR static void policy(const objective_plan& p, const row_consts& rc, int n,                                     \
                          host_chunk_data<T>& RLPT_OBJECTIVE_RESTRICT c) {                                          \
    policy_chunk(p, rc, n, c);                                                                                      \
  }                                                                                                                 \
  ATTR static void kl(const objective_plan& p, int n, host_chunk_data<T>& RLPT_OBJECTIVE_RESTRICT c) {             \
    kl_chunk(p, n, c);                                                                                              \
  }                                                                                                                 \
  ATTR static host_row_acc combine(const objective_plan& p, const row_consts& rc, index_t i0, int n,                \
                                   host_chunk_data<T>& RLPT_OBJECTIVE_RESTRICT c, const basic_objective_grads<T>& gr, \
                                   host_row_acc a) {                                                               \
    combine_chunk(p, rc, i0, n, c, gr, a);                                                                          \
    return a;                                                                                                       \
  }

//! The chunk stages for the default instruction set.
template <class T>
struct host_stages_default {
  RLPT_OBJECTIVE_HOST_STAGES(RLPT_OBJECTIVE_STAGE_NOINLINE)
};

#if RLPT_OBJECTIVE_AVX2_CLONE()
//! The chunk stages compiled for AVX2 (chosen at run time).
template <class T>
struct host_stages_avx2 {
  RLPT_OBJECTIVE_HOST_STAGES(__attribute__((noinline, target("avx2"))))
};
#endif

#undef RLPT_OBJECTIVE_HOST_STAGES

//! The row statistics of sequence b (what row_stats_add accumulates token by token, for the
//! device and the tests), computed chunk by chunk with the stages S.
template <class T, class S>
row_stats host_row_stats_with(const objective_plan& p, const basic_objective_inputs<T>& in, index_t b,
                              host_chunk_data<T>& c) {
  row_stats st;
  const token_layout& L = in.layout;
  const index_t base = L.begin(b);
  const index_t n = L.length(b);
  const row_consts keep_all; // seq_keep = true: sequence-level rejection is decided from these sums
  for (index_t t0 = 0; t0 < n; t0 += host_chunk) {
    const int cn = static_cast<int>(std::min<index_t>(host_chunk, n - t0));
    S::load(p, in, b, base + t0, cn, c);
    S::correction(p, keep_all, cn, c); // keep, inl (and tmp = clamped log rho when a correction is on)
    st = S::stats(p, cn, c, st);
  }
  return st;
}

//! The row statistics with the default-ISA stages (count_local; `c` from zero_absent).
template <class T>
row_stats host_row_stats(const objective_plan& p, const basic_objective_inputs<T>& in, index_t b,
                         host_chunk_data<T>& c) {
  return host_row_stats_with<T, host_stages_default<T>>(p, in, b, c);
}

//! Evaluates one sequence with the chunk stages S: writes its gradients and returns its sums.
template <class T, class S>
RLPT_OBJECTIVE_HOST_INLINE objective_sums host_row_body(const objective_plan& p, const basic_objective_inputs<T>& in,
                                                        const basic_objective_grads<T>& gr, index_t b) {
  const token_layout& L = in.layout;
  host_chunk_data<T> c;
  zero_absent(p, in, c);
  row_consts rc;
  if (p.need_row_pass) {
    rc = row_finish(p, host_row_stats_with<T, S>(p, in, b, c));
  } else {
    rc.len_loss = 1.0; // no term of this plan depends on the length; rows without tokens add nothing
  }
  row_alphas(p, rc);
  const index_t base = L.begin(b);
  const index_t n = L.length(b);
  host_row_acc a;
  for (index_t t0 = 0; t0 < n; t0 += host_chunk) {
    const int cn = static_cast<int>(std::min<index_t>(host_chunk, n - t0));
    const index_t i0 = base + t0;
    a.nonfinite += S::load(p, in, b, i0, cn, c);
    S::correction(p, rc, cn, c);
    S::policy(p, rc, cn, c);
    S::kl(p, cn, c);
    a = S::combine(p, rc, i0, cn, c, gr, a);
  }
  objective_sums s;
  double pol = a.policy;
  if (p.policy == policy_kind::gmpo) pol = a.in_loss > 0 ? -rc.gmpo_adv * rc.gmpo_ratio * rc.gmpo_w : 0.0;
  if (p.gspo_sequence && gr.logp.size() != 0 && a.in_loss > 0 && a.dcoef != 0.0) {
    // d loss / d logp_t = alpha * sum_t' w d value / d s * d s / d logp_t, d s / d logp_t = 1 / L.
    const double len = rc.len_loss > 1.0 ? rc.len_loss : 1.0;
    const T scale = static_cast<T>(rc.a_policy * a.dcoef / len);
    for (index_t t0 = 0; t0 < n; t0 += host_chunk) {
      const int cn = static_cast<int>(std::min<index_t>(host_chunk, n - t0));
      const index_t i0 = base + t0;
      S::load(p, in, b, i0, cn, c);
      S::correction(p, rc, cn, c);
      T* g = gr.logp.data() + i0;
      for (int j = 0; j < cn; ++j) g[j] += sel(c.inl[j] != 0, scale, T(0));
    }
  }
  s.policy = rc.a_policy * pol;
  s.kl = rc.a_kl * a.kl;
  s.entropy = rc.a_entropy * a.entropy;
  s.value = rc.a_value * a.value;
  s.kl_value = a.kl;
  s.entropy_value = a.entropy;
  s.approx_kl = a.approx_kl;
  s.valid = static_cast<double>(a.valid);
  s.in_loss = static_cast<double>(a.in_loss);
  s.seqs = a.valid > 0 ? 1.0 : 0.0;
  s.loss_seqs = a.in_loss > 0 ? 1.0 : 0.0;
  s.rows = 1.0;
  s.clip_low = static_cast<double>(a.low);
  s.clip_high = static_cast<double>(a.high);
  s.clip_dual = static_cast<double>(a.dual);
  s.clamped = static_cast<double>(a.clamped);
  s.rejected = static_cast<double>(a.rejected);
  s.value_clipped = static_cast<double>(a.vclip);
  s.nonfinite = static_cast<double>(a.nonfinite);
  if (a.valid > 0) {
    s.w_sum = a.w_sum;
    s.w_min = a.w_min;
    s.w_max = a.w_max;
  }
  return s;
}

template <class T>
objective_sums host_row_default(const objective_plan& p, const basic_objective_inputs<T>& in,
                                const basic_objective_grads<T>& gr, index_t b) {
  return host_row_body<T, host_stages_default<T>>(p, in, gr, b);
}

#if RLPT_OBJECTIVE_AVX2_CLONE()
template <class T>
__attribute__((target("avx2"))) objective_sums host_row_avx2(const objective_plan& p,
                                                             const basic_objective_inputs<T>& in,
                                                             const basic_objective_grads<T>& gr, index_t b) {
  return host_row_body<T, host_stages_avx2<T>>(p, in, gr, b);
}

inline bool cpu_has_avx2() noexcept {
  static const bool has = __builtin_cpu_supports("avx2");
  return has;
}
#endif

//! The row kernel for this CPU.
template <class T>
auto host_row_kernel() noexcept {
#if RLPT_OBJECTIVE_AVX2_CLONE()
  if (cpu_has_avx2()) return &host_row_avx2<T>;
#endif
  return &host_row_default<T>;
}

} // namespace detail
RLPT_NAMESPACE_END
