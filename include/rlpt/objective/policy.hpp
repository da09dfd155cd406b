// SPDX-License-Identifier: Apache-2.0
//! @file
//! Policy terms: the per-token surrogate losses (PPO clip family, GSPO, GMPO, CISPO, SAPO, DPPO,
//! DRO, VESPO, plain policy gradient) as option structs, and their value and derivative with
//! respect to the current log-probability, written once for host and device.
//!
//! Notation: x = logp - old_logp (current vs proximal policy), r = exp(x), A = advantage. Every
//! term is a loss (minimised). Log-ratios are clamped before exp, so no input gap produces
//! inf or NaN; where a framework clamps, the gradient beyond the clamp is 0, as torch.clamp's.
#pragma once

#include <rlpt/config.hpp>
#include <rlpt/objective/detail/math.hpp>

#include <cstdint>
#include <string_view>
#include <variant>

RLPT_NO_CONTRACT_BEGIN
RLPT_NAMESPACE_BEGIN

//! PPO clipped surrogate with asymmetric bounds (clip-higher), dual clip and TRL's delta:
//! L = max(-A r', -A clip(r, 1 - eps_low, 1 + eps_high)), r' = min(r, delta) when delta > 0;
//! for A < 0 with dual_clip c > 0: L = min(L, -A c).
struct ppo_clip {
  double eps_low = 0.2;  //!< verl clip_ratio_low, TRL epsilon, OpenRLHF/AReaL eps_clip: 0.2
  double eps_high = 0.2; //!< verl clip_ratio_high (0.2; DAPO clip-higher uses 0.28), TRL epsilon_high
  //! Dual-clip constant c (> 1) capping the loss of negative-advantage tokens at c|A|. verl's
  //! clip_ratio_c = 3.0 is always on; 0 turns it off (TRL, OpenRLHF `dual_clip=None`, AReaL).
  double dual_clip = 3.0;
  //! TRL `delta` (INTELLECT-2 two-sided clip): the unclipped ratio is capped at delta after the
  //! clipped one was formed. 0 = off (TRL default None).
  double delta = 0.0;
  //! |x| clamp before exp: verl and OpenRLHF 20. TRL, AReaL and slime do not clamp; rlpt always
  //! does (at most 80, where exp is still finite in fp32).
  double log_ratio_clamp = 20.0;
};

//! GSPO (arXiv 2507.18071): the PPO clip on the sequence ratio s_i = exp(mean_t x). With
//! length_normalized = false, on the sequence's likelihood ratio exp(sum_t x) instead: PPO at
//! sequence level (TRL's RLOOTrainer).
struct gspo {
  double eps_low = 0.2;  //!< verl falls back to clip_ratio 0.2 (the paper uses 3e-4)
  double eps_high = 0.2; //!< verl clip_ratio_high 0.2 (the paper uses 4e-4)
  //! true: GSPO-token (verl `gspo`, TRL experimental gspo_token): s_it = sg(s_i) pi/sg(pi), so
  //! token t's gradient is s_i * grad logp_t and per-token advantages are allowed. false: TRL
  //! `importance_sampling_level="sequence"` and OpenRLHF `gspo`, the gradient flows through the
  //! sequence mean to every token of the sequence. Default true (verl).
  bool token_level = true;
  //! Upper clamp on log s_i before exp: verl 10. TRL and OpenRLHF do not clamp (rlpt caps at 80).
  double log_ratio_max = 10.0;
  double dual_clip = 0.0; //!< as ppo_clip::dual_clip; verl's gspo has none (0)
  double delta = 0.0;     //!< as ppo_clip::delta (TRL applies delta to the sequence ratio too)
  //! Every token's advantage is its sequence's mean over the tokens in the terms (AReaL); false:
  //! each token's own (verl, TRL, OpenRLHF). The same for advantages constant along a sequence.
  bool mean_advantage = false;
  //! true: log s_i is the mean of the in-loss tokens' log-ratios (GSPO); false: their sum, the
  //! sequence's likelihood ratio, whose gradient reaches each token undivided (TRL RLOOTrainer).
  //! false needs token_level = false: GSPO-token's s_it = sg(s_i) pi/sg(pi) is written for the mean.
  bool length_normalized = true;
};

//! GMPO (verl `geo_mean`, arXiv 2507.20673): per sequence, L_i = -mean_t(A) * exp(mean_t x*),
//! x* = sign(A) min(sign(A) x, sign(A) clamp(x, -eps_low, eps_high)) (clipping in log space).
//! One loss per sequence: aggregate it with a seq_mean_* mode (verl: torch.mean over rows).
//! The means divide by the token count L_i (verl writes L_i + 1e-8, but with its bool response
//! mask the 1e-8 is added to an integer count in float32 and rounds away); empty rows give 0.
struct gmpo {
  double eps_low = 0.2;  //!< verl clip_ratio_low 0.2 (paper and TRL experimental gmpo: 0.4)
  double eps_high = 0.2; //!< verl clip_ratio_high 0.2 (paper: 0.4)
  //! |mean_t x*| clamp before exp. verl does not clamp (a large positive gap on a negative-
  //! advantage sequence overflows there); rlpt clamps at 80.
  double log_ratio_clamp = 80.0;
};

enum class cispo_bounds : std::uint8_t {
  relative, //!< clamp(r, 1 - eps_low, 1 + eps_high): verl `cispo`, slime
  absolute  //!< min(r, cap), no lower bound: TRL `loss_type="cispo"` (epsilon_high is the cap)
};

//! CISPO (MiniMax-M1, arXiv 2506.13585): L = -sg(w) A logp with w the clipped ratio.
struct cispo {
  double eps_low = 0.2;  //!< relative bounds: verl clip_ratio_low (paper: no lower bound, eps_low >= 1)
  double eps_high = 0.2; //!< relative bounds: verl clip_ratio_high
  cispo_bounds bounds = cispo_bounds::relative; //!< verl
  //! Absolute cap (bounds = absolute). TRL uses epsilon_high, which silently defaults to
  //! epsilon = 0.2 there; rlpt defaults to 5.0, the value TRL's documentation recommends (ScaleRL).
  double cap = 5.0;
  double log_ratio_clamp = 20.0; //!< verl 20 (TRL none)
  //! false: every token's ratio is its row's sequence ratio exp(s), s the mean of logp - old_logp
  //! over the row's tokens in the loss (TRL importance_sampling_level = "sequence"). The weight is
  //! detached either way, so nothing is differentiated through s.
  bool token_level = true;
};

//! SAPO (arXiv 2511.20347): L = -A * sigmoid(tau (r - 1)) * 4 / tau, tau = tau_pos if A > 0
//! else tau_neg.
struct sapo {
  double tau_pos = 1.0;          //!< verl tau_pos, TRL sapo_temperature_pos, AReaL sapo_tau_pos
  double tau_neg = 1.05;         //!< verl tau_neg, TRL sapo_temperature_neg, AReaL sapo_tau_neg
  double log_ratio_clamp = 20.0; //!< verl 20 (TRL none)
  //! false: the gate reads the sequence ratio s = exp(mean_t (logp - old)) over the row's in-loss
  //! tokens and the gradient flows through that mean to every token of the row, as gspo's
  //! sequence form (TRL and AReaL `importance_sampling_level="sequence"`). Default true (verl).
  bool token_level = true;
  bool mean_advantage = false; //!< as gspo::mean_advantage (AReaL)
};

//! Which divergence DPPO bounds.
enum class dppo_divergence : std::uint8_t {
  tv,       //!< p - q, the change of the sampled token's probability: verl `dppo_tv`
  binary_kl //!< KL(Bernoulli(q) || Bernoulli(p)) of the sampled token: verl `dppo_kl`
};

//! DPPO (arXiv 2602.04879): L = -A sg(min(r, trunc)) logp on the tokens whose probability moved
//! less than a divergence bound in the direction the advantage pushes it, 0 on the others
//! (their gradient is 0). With p = exp(logp) and q = exp(old_logp):
//!   tv:        A > 0 keeps p - q <= eps_high; A <= 0 keeps p - q >= -eps_low
//!   binary_kl: D = q (old_logp - logp) + (1 - q) log((1 - q + 1e-8) / (1 - p + 1e-8));
//!              A > 0 keeps D <= eps_high or p <= q; A <= 0 keeps D <= eps_low or p >= q
//! Clip events: a dropped token counts as high (A > 0) or low (A <= 0), a kept token whose ratio
//! the truncation caps as dual (verl reports those as pg_clipfrac and pg_clipfrac_lower).
struct dppo {
  dppo_divergence divergence = dppo_divergence::tv;
  double eps_low = 0.2;  //!< verl clip_ratio_low: a divergence bound here, not a ratio bound
  double eps_high = 0.2; //!< verl clip_ratio_high
  //! Cap on the detached ratio (truncated importance sampling in place of a dual clip): verl
  //! clip_ratio_c, 3.0 in its ActorConfig (the paper recommends a large value).
  double trunc = 3.0;
  double log_ratio_clamp = 20.0; //!< verl 20
};

//! DRO, direct reward optimisation with a quadratic log-ratio penalty (verl `dro`):
//! L = -(A logp - beta / 2 x^2), d L / d logp = -A + beta x. No ratio, so no clip events and no
//! clamp; the penalty keeps logp near old_logp.
struct dro {
  //! Penalty coefficient, > 0. verl's policy_loss.dro_beta has no default (it raises when unset),
  //! so neither has this: 0 is an error.
  double beta = 0.0;
};

//! VESPO (TRL `vespo`): L = -phi(w) A logp with phi detached, a soft sequence-level weight in
//! place of a clip. w = exp(clamp(sum_t clamp(x_t, -20, 20), log 1e-8, 20)) over the row's tokens
//! in the loss, and phi(w) = exp(lambda + k log w - lambda w) (phi(1) = 1; 0 where it is not
//! finite), with (k, lambda) = (k_pos, lambda_pos) for A >= 0, (k_neg, lambda_neg) for A < 0 and
//! lambda at least 1e-4. The clamps are TRL's. No clip events.
struct vespo {
  double k_pos = 2.0;      //!< TRL vespo_k_pos
  double lambda_pos = 3.0; //!< TRL vespo_lambda_pos
  double k_neg = 3.0;      //!< TRL vespo_k_neg
  double lambda_neg = 2.0; //!< TRL vespo_lambda_neg
  //! The correction's token importance weights enter w instead of scaling the term: log w adds
  //! sum_t clamp(log w_t, log 1e-8, 20) over the row's valid tokens (TRL vespo with
  //! vllm_importance_sampling_correction). Needs token-level weights.
  bool fold_is_weight = false;
};

//! Plain policy gradient (REINFORCE): L = -A logp (verl `gpg`, bypass `reinforce`).
struct policy_gradient {};

//! No policy term (an objective of KL, entropy or value terms only).
struct no_policy {};

using policy_term = std::variant<ppo_clip, gspo, gmpo, cispo, sapo, dppo, dro, vespo, policy_gradient, no_policy>;

enum class policy_kind : std::uint8_t { ppo_clip, gspo, gmpo, cispo, sapo, dppo, dro, vespo, policy_gradient, none };

[[nodiscard]] constexpr std::string_view name(policy_kind k) noexcept {
  switch (k) {
  case policy_kind::ppo_clip:
    return "ppo_clip";
  case policy_kind::gspo:
    return "gspo";
  case policy_kind::gmpo:
    return "gmpo";
  case policy_kind::cispo:
    return "cispo";
  case policy_kind::sapo:
    return "sapo";
  case policy_kind::dppo:
    return "dppo";
  case policy_kind::dro:
    return "dro";
  case policy_kind::vespo:
    return "vespo";
  case policy_kind::policy_gradient:
    return "policy_gradient";
  case policy_kind::none:
    return "no_policy";
  }
  return "?";
}

namespace detail {

//! Value and derivative of one per-token term, plus the clip events it reports.
//! Clip events, one bit each (a word, not bools: it keeps the struct in registers, so loops
//! over the per-token functions vectorise).
inline constexpr std::uint32_t flag_low = 1u;     //!< ratio below 1 - eps_low with A < 0 (TRL clip_ratio/low)
inline constexpr std::uint32_t flag_high = 2u;    //!< ratio above 1 + eps_high with A > 0 (TRL clip_ratio/high)
inline constexpr std::uint32_t flag_dual = 4u;    //!< dual clip (DPPO: truncation) binds (verl pg_clipfrac_lower)
inline constexpr std::uint32_t flag_clamped = 8u; //!< the log-ratio hit its clamp

RLPT_HD_FORCEINLINE std::uint32_t flag_if(bool c, std::uint32_t f) { return static_cast<std::uint32_t>(c) * f; }

template <class R> struct policy_token {
  R value = R(0);
  R grad = R(0); //!< d value / d logp (GSPO sequence form: d value / d s_i)
  std::uint32_t flags = 0;
};

//! The PPO clip given a ratio r, dr = d r / d logp and the clip bounds lo = 1 - eps_low,
//! hi = 1 + eps_high (formed in double and rounded once, as torch does with Python scalars).
//! Written with selects only, so loops over it vectorise. Dual = false leaves out the dual clip
//! (for loops whose dual_c <= 0), Cap = false the delta cap (delta <= 0): each is then off for
//! every token and changes no bit, and a loop skips its selects (a third of plain PPO's
//! operations, with both out).
template <bool Dual = true, bool Cap = true, class R>
RLPT_HD_FORCEINLINE policy_token<R> clip_surrogate(R r, R dr, R A, R lo, R hi, R dual_c, R delta) {
  policy_token<R> o;
  const R rc = clamp_r(r, lo, hi);
  const R drc = sel((r >= lo) & (r <= hi), dr, R(0));
  R r1 = r, dr1 = dr;
  if constexpr (Cap) {
    const bool capped = (delta > R(0)) & (r > delta); // TRL: coef_1 = clamp(coef_1, max=delta)
    r1 = sel(capped, delta, r);
    dr1 = sel(capped, R(0), dr);
  }
  const R l1 = -A * r1;
  const R l2 = -A * rc;
  R l = max_r(l1, l2);
  R dl = dmax(l1, l2, -A * dr1, -A * drc);
  bool dual = false;
  if constexpr (Dual) {
    const bool dual_on = (dual_c > R(0)) & (A < R(0));
    const R l3 = -A * dual_c;
    dual = dual_on & (l > l3);
    const R dl_dual = dmin(l3, l, R(0), dl);
    dl = sel(dual_on, dl_dual, dl);
    l = sel(dual, l3, l);
  }
  o.value = l;
  o.grad = dl;
  o.flags =
      flag_if((r < lo) & (A < R(0)), flag_low) | flag_if((r > hi) & (A > R(0)), flag_high) | flag_if(dual, flag_dual);
  return o;
}

//! exp(clamp(x, -c, c)) and its derivative with respect to x.
template <class R> RLPT_HD_FORCEINLINE void clamped_ratio(R x, R c, R& r, R& dr, bool& clamped) {
  const R xc = clamp_r(x, -c, c);
  r = exp_r(xc);
  const bool pass = (x >= -c) & (x <= c);
  dr = sel(pass, r, R(0));
  clamped = !pass;
}

//! Dual, Cap: see clip_surrogate (false only where p.dual_clip <= 0, p.delta <= 0).
template <bool Dual = true, bool Cap = true, class R>
RLPT_HD_FORCEINLINE policy_token<R> ppo_token(const ppo_clip& p, R x, R A) {
  R r, dr;
  bool clamped;
  clamped_ratio(x, R(p.log_ratio_clamp), r, dr, clamped);
  policy_token<R> o =
      clip_surrogate<Dual, Cap>(r, dr, A, R(1.0 - p.eps_low), R(1.0 + p.eps_high), R(p.dual_clip), R(p.delta));
  o.flags |= flag_if(clamped, flag_clamped);
  return o;
}

template <class R> RLPT_HD_FORCEINLINE policy_token<R> sapo_token(const sapo& p, R x, R A) {
  R r, dr;
  bool clamped;
  clamped_ratio(x, R(p.log_ratio_clamp), r, dr, clamped);
  const R tau = sel(A > R(0), R(p.tau_pos), R(p.tau_neg));
  const R sig = R(1) / (R(1) + exp_r(-(tau * (r - R(1)))));
  policy_token<R> o;
  o.value = -(sig * (R(4) / tau)) * A;
  o.grad = -A * (R(4) / tau) * (sig * (R(1) - sig)) * tau * dr;
  o.flags = flag_if(clamped, flag_clamped);
  return o;
}

template <class R> RLPT_HD_FORCEINLINE policy_token<R> cispo_token(const cispo& p, R x, R lp, R A) {
  R r, dr;
  bool clamped;
  clamped_ratio(x, R(p.log_ratio_clamp), r, dr, clamped);
  const bool rel = p.bounds == cispo_bounds::relative;
  const R lo = R(sel(rel, 1.0 - p.eps_low, 0.0));
  const R hi = R(sel(rel, 1.0 + p.eps_high, p.cap));
  const R w = clamp_r(r, lo, hi);
  policy_token<R> o;
  o.flags = flag_if(rel & (r < lo), flag_low) | flag_if(r > hi, flag_high) | flag_if(clamped, flag_clamped);
  o.value = -w * A * lp;
  o.grad = -w * A;
  return o;
}

template <dppo_divergence D, class R>
RLPT_HD_FORCEINLINE policy_token<R> dppo_token(const dppo& p, R x, R lp, R old, R A) {
  R r, dr;
  bool clamped;
  clamped_ratio(x, R(p.log_ratio_clamp), r, dr, clamped);
  const R cap = R(p.trunc);
  const R w = min_r(r, cap);
  const R prob = exp_r(lp), q = exp_r(old);
  bool keep_pos, keep_neg;
  if constexpr (D == dppo_divergence::tv) {
    const R d = prob - q;
    keep_pos = d <= R(p.eps_high);
    keep_neg = d >= -R(p.eps_low);
  } else {
    const R eps = R(1e-8);
    const R d = q * (old - lp) + (R(1) - q) * log_r((R(1) - q + eps) / (R(1) - prob + eps));
    keep_pos = (d <= R(p.eps_high)) | (prob <= q);
    keep_neg = (d <= R(p.eps_low)) | (prob >= q);
  }
  const bool pos = A > R(0);
  const bool keep = (pos & keep_pos) | ((!pos) & keep_neg);
  const R k = sel(keep, R(1), R(0));
  policy_token<R> o;
  o.value = -A * w * lp * k;
  o.grad = -A * w * k;
  o.flags = flag_if((!keep) & pos, flag_high) | flag_if((!keep) & (!pos), flag_low) |
            flag_if(keep & (r > cap), flag_dual) | flag_if(clamped, flag_clamped);
  return o;
}

//! DRO given x = logp - old_logp; beta_half = beta / 2 in R, as verl's `0.5 * beta` Python scalar.
template <class R> RLPT_HD_FORCEINLINE policy_token<R> dro_token(R beta_half, R x, R lp, R A) {
  policy_token<R> o;
  o.value = -(lp * A - beta_half * (x * x));
  o.grad = -A + R(2) * beta_half * x;
  return o;
}

//! VESPO's weight phi of a row whose clamped log-ratio sum is sum_x, for one advantage sign.
RLPT_HD_FORCEINLINE double vespo_phi(double k, double lambda, double sum_x) {
  const double log_w = clamp_r(sum_x, -18.420680743952367, 20.0); // [log 1e-8, 20]
  const double lam = lambda > 1e-4 ? lambda : 1e-4;
  const double phi = exp_r(lam + k * log_w - lam * exp_r(log_w));
  return finite(phi) ? phi : 0.0;
}

//! VESPO per token given the row's weight phi for this token's advantage sign.
template <class R> RLPT_HD_FORCEINLINE policy_token<R> vespo_token(R phi, R lp, R A) {
  policy_token<R> o;
  o.value = -phi * A * lp;
  o.grad = -phi * A;
  return o;
}

template <class R> RLPT_HD_FORCEINLINE policy_token<R> pg_token(R lp, R A) {
  policy_token<R> o;
  o.value = -lp * A;
  o.grad = -A;
  return o;
}

//! GSPO per token given the sequence's mean log-ratio s. Token form: grad is d/d logp_t.
//! Sequence form: grad is d value / d s_i (the caller chains it through the mean).
template <class R> RLPT_HD_FORCEINLINE policy_token<R> gspo_token(const gspo& p, R s, R A) {
  const R ls = min_r(s, R(p.log_ratio_max));
  const R r = exp_r(ls);
  const R dr = sel(s <= R(p.log_ratio_max), r, R(0));
  policy_token<R> o = clip_surrogate(r, dr, A, R(1.0 - p.eps_low), R(1.0 + p.eps_high), R(p.dual_clip), R(p.delta));
  o.flags |= flag_if(s > R(p.log_ratio_max), flag_clamped);
  return o;
}

//! GMPO's sign-aware log-space clip of one token: x* and d x* / d x.
template <class R> RLPT_HD_FORCEINLINE void gmpo_token(const gmpo& p, R x, R A, R& xs, R& dxs, std::uint32_t& flags) {
  const R xc = clamp_r(x, -R(p.eps_low), R(p.eps_high));
  const R sa = sign_r(A);
  const R a = sa * x;
  const R b = sa * xc;
  xs = sa * min_r(a, b);
  dxs = sa * dmin(a, b, sa, sa * clamp_pass(x, -R(p.eps_low), R(p.eps_high)));
  const bool clipped = x != xc;
  flags = flag_if(clipped & (A < R(0)), flag_low) | flag_if(clipped & (A > R(0)), flag_high);
}

} // namespace detail
RLPT_NAMESPACE_END
RLPT_NO_CONTRACT_END
