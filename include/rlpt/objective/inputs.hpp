// SPDX-License-Identifier: Apache-2.0
//! @file
//! What rlpt::evaluate reads and writes: per-token inputs as views over one token layout (host
//! or device memory), gradient outputs into caller buffers, and the loss terms and metrics it
//! returns. The same types serve the host and the CUDA entry points.
#pragma once

#include <rlpt/config.hpp>
#include <rlpt/core/layout.hpp>
#include <rlpt/core/views.hpp>

RLPT_NAMESPACE_BEGIN

//! Per-token inputs over one token layout (padded [B, T] with a row stride, or packed). Every
//! per-token view has layout.storage_size() elements; empty views are absent inputs.
template <class T, memory_space Space = memory_space::host> struct basic_objective_inputs {
  basic_token_layout<Space> layout{};
  view<const mask_t, Space> mask{};      //!< loss mask, nonzero = the token counts; empty: every token counts
  view<const T, Space> logp{};           //!< current policy (the differentiated input)
  view<const T, Space> old_logp{};       //!< proximal / old policy (PPO ratio denominator)
  view<const T, Space> behav_logp{};     //!< behaviour policy (rollout engine), for corrections
  view<const T, Space> ref_logp{};       //!< reference policy, for the KL term
  view<const T, Space> adv{};            //!< per-token advantages
  view<const T, Space> seq_adv{};        //!< or per-sequence advantages (num_seqs), broadcast
  view<const T, Space> entropy{};        //!< per-token entropy (entropy term and metric)
  view2d<const T, Space> teacher_logp{}; //!< [teachers, storage_size], for distillation
  view<const T, Space> values{};         //!< critic predictions (differentiated)
  view<const T, Space> old_values{};     //!< critic values at rollout time (clip centre)
  view<const T, Space> returns{};        //!< value targets
  //! Per sequence (num_seqs): 0 leaves the sequence out of the loss denominators (the tokens N
  //! and sequences B of the aggregation, this call's own counts and local_denominators) while its
  //! terms stay in the loss. Empty: every sequence counts. With the sequences of zero-variance
  //! groups at 0 (rlpt::nondegenerate_items), their tokens no longer dilute the mean of the
  //! groups that carry a signal, and their KL and entropy terms still apply (TRL PRs #6368 and
  //! #7068 ask for this; no peer has it by default).
  view<const mask_t, Space> seq_in_denominator{};
};

//! Gradient outputs (caller buffers, storage_size elements; empty = not wanted). Every slot of
//! the layout is written: masked and rejected tokens get exactly 0.
template <class T, memory_space Space = memory_space::host> struct basic_objective_grads {
  view<T, Space> logp{};    //!< d loss / d logp
  view<T, Space> entropy{}; //!< d loss / d entropy
  view<T, Space> values{};  //!< d loss / d values
};

using objective_inputs = basic_objective_inputs<float>;
using objective_grads = basic_objective_grads<float>;

//! Loss terms and metrics of one call. Metrics are over this call's tokens; fractions are of
//! the tokens in the loss unless noted, and 0 when there are none.
struct objective_result {
  double loss = 0.0;         //!< policy + kl.coef * kl - entropy.coef * entropy + value.coef * value
  double policy_loss = 0.0;  //!< aggregated policy term (importance weights applied)
  double kl_loss = 0.0;      //!< aggregated KL estimator, before kl.coef
  double entropy_loss = 0.0; //!< aggregated entropy, before entropy.coef (0 unless the term is on)
  double value_loss = 0.0;   //!< aggregated value loss, before value.coef
  double tokens = 0.0;       //!< valid tokens (mask), before rejection
  double loss_tokens = 0.0;  //!< tokens that stay in the loss
  double seqs = 0.0;         //!< rows with a valid token
  //! ratio < 1 - eps_low with A < 0 (GMPO: log-ratio clipped, A < 0; DPPO: dropped, A <= 0)
  double clip_frac_low = 0.0;
  //! ratio > 1 + eps_high with A > 0 (CISPO: ratio above its bound; DPPO: dropped, A > 0)
  double clip_frac_high = 0.0;
  double clip_frac_dual = 0.0; //!< dual clip binds (DPPO: a kept token's ratio is truncated)
  double clamped_frac = 0.0;   //!< the policy log-ratio hit its safety clamp
  double approx_kl = 0.0;      //!< mean(old_logp - logp) (verl ppo_kl); 0 without old_logp
  double kl_mean = 0.0;        //!< mean KL estimator value
  double is_weight_min = 0.0;  //!< importance weights over valid tokens (1 when off)
  double is_weight_mean = 0.0;
  double is_weight_max = 0.0;
  double rejected_frac = 0.0; //!< of valid tokens: rejected, or weighted 0 by a band
  double entropy_mean = 0.0;  //!< mean entropy (when entropies were given)
  double value_clip_frac = 0.0;
  double nonfinite_tokens = 0.0; //!< valid tokens with a non-finite input (skipped, or the device's raise: loss = NaN)
  //! Device entry point only (the host throws instead): 1 when an explicit global denominator is
  //! smaller than this call's own count; the loss is then NaN.
  double denominator_error = 0.0;
};

RLPT_NAMESPACE_END
