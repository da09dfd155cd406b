// SPDX-License-Identifier: Apache-2.0
//! @file
//! Off-policy corrections between the behaviour policy (the rollout engine's log-probs) and the
//! policy the surrogate's ratio is taken against (the proximal / "old" policy, or the current
//! one in verl's bypass mode): importance weights (token TIS, IcePop band, sequence IS as a
//! product or a geometric mean) and rejection (hard trust-region masks on ratio, k1, k2, k3 or
//! the sampled token's binary KL or total variation, per token or per sequence). The weights are
//! always detached: they scale the policy term's value and gradient but are never differentiated.
//!
//! log rho = numerator - behav_logp, numerator = old_logp (decoupled PPO: AReaL, verl's
//! decoupled mode, TRL's vLLM correction, OpenRLHF, slime) or the current logp (verl bypass).
#pragma once

#include <rlpt/config.hpp>
#include <rlpt/objective/detail/math.hpp>

#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string_view>

RLPT_NO_CONTRACT_BEGIN
RLPT_NAMESPACE_BEGIN

enum class is_level : std::uint8_t {
  none,        //!< no importance weight
  token,       //!< w_t = rho_t (verl rollout_is=token, TRL token_*, OpenRLHF tis/icepop, slime)
  seq_product, //!< w_i = exp(sum_t log rho_t) (verl rollout_is=sequence, TRL sequence_*)
  seq_geomean  //!< w_i = exp(mean_t log rho_t) (AReaL sequence level)
};

enum class is_bound : std::uint8_t {
  none,     //!< the raw weight
  truncate, //!< clamp(w, lo, hi): TIS
  mask      //!< w where lo <= w <= hi, else 0: IcePop / MIS
};

//! The importance weight multiplying the policy term.
struct is_weighting {
  is_level level = is_level::none;
  is_bound bound = is_bound::truncate;
  double lo = 0.0; //!< lower bound (0 = none: verl TIS is upper-only; OpenRLHF tis uses 0.5)
  double hi = 2.0; //!< upper bound: verl rollout_is_threshold 2.0 (TRL clip_max 3.0, OpenRLHF/AReaL 5.0)
  //! Divide every weight by the batch's mean weight (verl rollout_is_batch_normalize): the mean of
  //! the bounded weights over the valid tokens (token level) or over the sequences with a valid
  //! token (sequence levels; each row's weight as verl's masked mean of its tokens', w L / (L +
  //! 1e-8)), rejected tokens included (with rejection, rejected must be `removed`, as verl's). No
  //! division where that mean is <= 1e-8, as verl.
  bool batch_normalize = false;
  //! The mean over the whole step's batch, every micro-batch and rank (sum rlpt::local_is_weights
  //! over them; verl takes it over the training batch on its driver). < 0: this call's inputs.
  double batch_mean = -1.0;
};

enum class rs_stat : std::uint8_t {
  none,  //!< no rejection
  ratio, //!< log rho, kept iff lo <= exp(stat) <= hi (OpenRLHF/AReaL ratio gating)
  k1,    //!< -log rho, kept iff log lo <= stat <= log hi (verl token_k1 / seq_*_k1; note the sign)
  // The divergences below are >= 0; each is kept iff stat <= hi and, where lo > 0, stat >= lo
  // (lo <= 0: no lower bound).
  k2, //!< 0.5 (log rho)^2 (verl *_k2, AReaL kl_k2)
  k3, //!< exp(log rho) - 1 - log rho (verl *_k3)
  //! KL(Bernoulli(p) || Bernoulli(q)) of the sampled token, p = exp(behav_logp) and q =
  //! exp(numerator), each clamped to [1e-6, 1 - 1e-6]: p log(p / q) + (1 - p) log((1 - p) / (1 - q))
  //! (OpenRLHF is_correction_gating = binary_kl)
  binary_kl,
  tv, //!< |p - q| with p and q as for binary_kl (OpenRLHF gating tv)
  //! log rho itself, kept iff lo <= stat <= hi: bounds on the log-ratio, either sign (AReaL
  //! kl_k1). Unlike ratio and k1, lo is a log bound and 0 is a bound: -inf for none.
  log_ratio,
  //! exp(-log rho) - 1 + log rho, k3 of 1 / rho (AReaL kl_k3); bounded as k2
  k3_inverse
};

enum class rs_level : std::uint8_t {
  token,    //!< each token on its own statistic
  seq_sum,  //!< a sequence on the sum of its tokens' statistic (ratio: the product of ratios)
  seq_mean, //!< on the mean (ratio: the geometric mean: OpenRLHF seq-mask-tis, verl seq_mean_k1)
  seq_max   //!< on the maximum (verl seq_max_k2/k3, AReaL agg max; a sequence without valid tokens is kept)
};

//! Hard trust region: tokens or whole sequences outside it are rejected.
struct rejection {
  rs_stat stat = rs_stat::none;
  rs_level level = rs_level::token;
  //! Lower bound: on the ratio (ratio and k1 statistics; k1 with lo = 0 uses 1/hi as verl), on
  //! log rho (log_ratio), on the divergence itself (the others; lo <= 0: none).
  double lo = 0.0;
  double hi = std::numeric_limits<double>::infinity(); //!< upper bound
};

enum class ratio_numerator : std::uint8_t {
  proximal, //!< rho = pi_old / pi_behav (decoupled: AReaL, verl decoupled, TRL, OpenRLHF, slime)
  current   //!< rho = sg(pi_theta) / pi_behav (verl bypass mode)
};

enum class rejected_tokens : std::uint8_t {
  //! Rejected tokens leave the loss: every term and every local denominator (verl overwrites
  //! response_mask).
  removed,
  //! Rejected tokens get policy weight 0 but stay in the KL and entropy terms, in the sequence
  //! statistics (GSPO's mean) and in every denominator (TRL *_mask modes, OpenRLHF, slime keep the
  //! pre-rejection counts).
  zero_weight,
  //! Rejected tokens leave every term, the sequence statistics included, but stay in every
  //! denominator (AReaL: its rejection-updated loss_mask over the pre-rejection token count).
  masked
};

//! What happens to the tokens or sequences outside a rejection criterion's bounds.
enum class rejection_action : std::uint8_t {
  reject, //!< they are rejected (rejected_tokens says how)
  //! Sequences outside the bounds stay in the loss with their sequence-level importance weight
  //! bounded by is_weighting's bound; those inside keep the raw weight (AReaL's action = clamp at
  //! sequence level: the geometric-mean weight clamped where the sum, mean or max is out of
  //! bounds). Needs a sequence-level weight and sequence-level criteria only.
  bound_weight
};

//! The most rejection criteria one correction takes: `reject` and ten in `reject_also`, so that
//! every verl rollout_rs option (11) can be in force at once.
inline constexpr int max_rejections = 11;

struct off_policy_correction {
  is_weighting weight{};
  rejection reject{};
  //! Further criteria a token (a sequence, for the sequence levels) must also pass to stay: verl's
  //! comma-separated rollout_rs, where every option must pass. Each is decided on its own
  //! statistic over the valid tokens, as `reject`; entries with stat = none are unused.
  std::array<rejection, max_rejections - 1> reject_also{};
  ratio_numerator numerator = ratio_numerator::proximal; //!< decoupled PPO
  rejected_tokens rejected = rejected_tokens::removed;   //!< verl
  rejection_action action = rejection_action::reject;    //!< what failing the criteria does
  //! |log rho| clamp before exp (token ratio, or sequence sum / mean): verl SAFETY_BOUND 20.
  double log_ratio_clamp = 20.0;

  [[nodiscard]] constexpr bool rejects() const noexcept {
    bool any = reject.stat != rs_stat::none;
    for (const rejection& r : reject_also) any = any || r.stat != rs_stat::none;
    return any;
  }
  [[nodiscard]] constexpr bool active() const noexcept { return weight.level != is_level::none || rejects(); }
};

//! A call's share of the batch mean that is_weighting::batch_normalize divides by
//! (rlpt::local_is_weights): add the shares of a step's micro-batches and ranks, then take mean().
struct is_weight_sums {
  double sum = 0.0;   //!< the bounded weights
  double count = 0.0; //!< valid tokens (token level) or sequences with one (sequence levels)
  [[nodiscard]] constexpr double mean() const noexcept { return count > 0.0 ? sum / count : 0.0; }
  constexpr is_weight_sums& operator+=(const is_weight_sums& o) noexcept {
    sum += o.sum;
    count += o.count;
    return *this;
  }
};

//! Token TIS: w = min(rho, hi) (verl rollout_is=token), or clamp(rho, lo, hi) with lo > 0.
[[nodiscard]] constexpr off_policy_correction token_tis(double hi = 2.0, double lo = 0.0) {
  return {.weight = {.level = is_level::token, .bound = is_bound::truncate, .lo = lo, .hi = hi}};
}

//! IcePop / token MIS: w = rho inside [lo, hi], 0 outside (verl "lo_hi", TRL token_mask,
//! OpenRLHF icepop). The zeroed tokens stay in the denominators.
[[nodiscard]] constexpr off_policy_correction icepop(double lo = 0.5, double hi = 5.0) {
  return {.weight = {.level = is_level::token, .bound = is_bound::mask, .lo = lo, .hi = hi}};
}

//! Sequence IS as a product of token ratios, truncated (verl rollout_is=sequence) or masked.
[[nodiscard]] constexpr off_policy_correction seq_is(double hi = 2.0, is_bound bound = is_bound::truncate,
                                                     double lo = 0.0) {
  return {.weight = {.level = is_level::seq_product, .bound = bound, .lo = lo, .hi = hi}};
}

//! Sequence IS as the geometric mean of token ratios (AReaL sequence level).
[[nodiscard]] constexpr off_policy_correction seq_geo_is(double hi = 5.0, is_bound bound = is_bound::truncate,
                                                         double lo = 0.0) {
  return {.weight = {.level = is_level::seq_geomean, .bound = bound, .lo = lo, .hi = hi}};
}

namespace detail {

//! Applies the bound of an importance weight (branch-free: the bound kind is per call).
template <class R> RLPT_HD_FORCEINLINE R bound_weight(is_bound b, R raw, R lo, R hi) {
  const R t = clamp_r(raw, lo, hi);
  const R m = sel((raw >= lo) & (raw <= hi), raw, R(0));
  return sel(b == is_bound::truncate, t, sel(b == is_bound::mask, m, raw));
}

//! The sampled token's probabilities under the behaviour policy (p) and the numerator's (q),
//! clamped to [1e-6, 1 - 1e-6] as OpenRLHF does, so the binary KL's logs stay finite.
template <class R> RLPT_HD_FORCEINLINE void token_probs(R num, R behav, R& p, R& q) {
  p = clamp_r(exp_r(behav), R(1e-6), R(1) - R(1e-6));
  q = clamp_r(exp_r(num), R(1e-6), R(1) - R(1e-6));
}

//! The per-token rejection statistic: of the (clamped) log rho lr, or for the divergences of the
//! log-probabilities num (the ratio's numerator) and behav.
template <class R> RLPT_HD_FORCEINLINE R rs_token_stat(rs_stat s, R lr, R num, R behav) {
  switch (s) {
  case rs_stat::none:
    return R(0);
  case rs_stat::ratio:
    return lr;
  case rs_stat::k1:
    return -lr;
  case rs_stat::k2:
    return R(0.5) * lr * lr;
  case rs_stat::k3:
    return exp_r(lr) - R(1) - lr;
  case rs_stat::log_ratio:
    return lr;
  case rs_stat::k3_inverse:
    return exp_r(-lr) - R(1) + lr;
  case rs_stat::binary_kl: {
    // OpenRLHF's form (clamped probabilities, KL(p || q)); DPPO's bound is verl's, a different
    // direction and an additive 1e-8 (dppo_token), so the two stay separate to match each peer.
    R p, q;
    token_probs(num, behav, p, q);
    return p * log_r(p / q) + (R(1) - p) * log_r((R(1) - p) / (R(1) - q));
  }
  case rs_stat::tv: {
    R p, q;
    token_probs(num, behav, p, q);
    const R d = p - q;
    return sel(d < R(0), -d, d);
  }
  }
  return R(0);
}

//! Whether a (token or aggregated) statistic passes. For `ratio`, stat is in log space.
template <class R> RLPT_HD_FORCEINLINE bool rs_keep(rs_stat s, R stat, R lo, R hi, R log_lo, R log_hi) {
  switch (s) {
  case rs_stat::none:
    return true;
  case rs_stat::ratio: {
    const R e = exp_r(clamp_r(stat, R(-80), R(80)));
    return e >= lo && e <= hi;
  }
  case rs_stat::k1:
    return stat >= log_lo && stat <= log_hi;
  case rs_stat::log_ratio:
    return stat >= lo && stat <= hi;
  case rs_stat::k2:
  case rs_stat::k3_inverse:
  case rs_stat::k3:
  case rs_stat::binary_kl:
  case rs_stat::tv:
    return (stat <= hi) & ((lo <= R(0)) | (stat >= lo));
  }
  return true;
}

} // namespace detail
RLPT_NAMESPACE_END
RLPT_NO_CONTRACT_END
