// SPDX-License-Identifier: Apache-2.0
//! @file
//! Loss aggregation: how per-token losses become one scalar, with every denominator explicit.
//!
//! Every mode reduces to a weight per sequence: loss = sum_i alpha_i * sum_t m[i,t] * l[i,t].
//!
//! | mode                      | alpha_i                              | verl / TRL / OpenRLHF name            |
//! |---------------------------|--------------------------------------|---------------------------------------|
//! | token_mean                | factor / N                           | token-mean / dapo, bnpo / token level |
//! | token_sum                 | factor                               | token-sum                             |
//! | seq_mean_token_sum        | factor / B                           | seq-mean-token-sum                    |
//! | seq_mean_token_mean       | factor / (B * (L_i + len_eps))       | seq-mean-token-mean / grpo, sapo      |
//! | seq_mean_token_sum_norm   | factor / (B * norm)                  | seq-mean-token-sum-norm / dr_grpo     |
//!
//! N (tokens) and B (sequences) are *global* when the loss of one optimizer step is split over
//! data-parallel ranks and gradient-accumulation micro-batches: pass them in `global_tokens` /
//! `global_seqs` (sum `local_denominators` over the micro-batches of the step and all-reduce it
//! over the ranks), and the micro-batch losses and gradients add up to the full-batch ones. Left
//! empty, they are this call's own counts, which is what a single micro-batch means. Rows
//! without a valid token contribute nothing; whether they count in a local B is explicit.
#pragma once

#include <rlpt/config.hpp>
#include <rlpt/core/error.hpp>

#include <cmath>
#include <cstdint>
#include <optional>
#include <string_view>

RLPT_NO_CONTRACT_BEGIN
RLPT_NAMESPACE_BEGIN

enum class agg_mode : std::uint8_t {
  token_mean,             //!< sum over tokens / N
  token_sum,              //!< sum over tokens
  seq_mean_token_sum,     //!< mean over sequences of each sequence's token sum
  seq_mean_token_mean,    //!< mean over sequences of each sequence's token mean
  seq_mean_token_sum_norm //!< seq_mean_token_sum / norm (Dr. GRPO's constant normaliser)
};

[[nodiscard]] constexpr std::string_view name(agg_mode m) noexcept {
  switch (m) {
  case agg_mode::token_mean:
    return "token_mean";
  case agg_mode::token_sum:
    return "token_sum";
  case agg_mode::seq_mean_token_sum:
    return "seq_mean_token_sum";
  case agg_mode::seq_mean_token_mean:
    return "seq_mean_token_mean";
  case agg_mode::seq_mean_token_sum_norm:
    return "seq_mean_token_sum_norm";
  }
  return "?";
}

struct aggregation {
  //! verl `loss_agg_mode` default "token-mean".
  agg_mode mode = agg_mode::token_mean;
  //! N for token_mean across ranks and micro-batches. Empty: this call's valid-token count
  //! (verl / OpenRLHF single-micro-batch fallback, TRL bnpo).
  std::optional<double> global_tokens{};
  //! B for the seq_mean_* modes across ranks and micro-batches. Empty: this call's count.
  std::optional<double> global_seqs{};
  //! Constant normaliser of seq_mean_token_sum_norm (Dr. GRPO: the maximum response length;
  //! verl `loss_scale_factor`, TRL `max_completion_length`). Required (> 0) for that mode:
  //! verl's fallback, the padded width of the micro-batch, would make the loss depend on padding.
  double norm = 0.0;
  //! Multiplies the aggregated loss: verl and OpenRLHF pass dp_size (cancelling the DDP average),
  //! TRL 1 / gradient_accumulation_steps for grpo/bnpo/dr_grpo. Default 1. (Named factor, not
  //! scale: rlpt::scale is the advantages' std-scaling choice.)
  double factor = 1.0;
  //! seq_mean_token_mean divides a sequence's token sum by L_i + len_eps. verl and OpenRLHF add
  //! 1e-8; TRL divides by max(L_i, 1), which is len_eps = 0 for the non-empty rows that count.
  //! Default 0.
  double len_eps = 0.0;
  //! Whether a local B counts rows with no valid token. TRL grpo / dr_grpo take `.mean()` over
  //! every row (true); verl and OpenRLHF count only non-empty rows (false, the default).
  bool count_empty_rows = false;
};

//! What one call (micro-batch) contributes to the global denominators. Sum these over the
//! micro-batches of an optimizer step and all-reduce over data-parallel ranks.
struct loss_denominators {
  double tokens = 0.0; //!< valid tokens that stay in the loss
  double seqs = 0.0;   //!< sequences (non-empty ones unless count_empty_rows)

  loss_denominators& operator+=(const loss_denominators& o) noexcept {
    tokens += o.tokens;
    seqs += o.seqs;
    return *this;
  }
  friend loss_denominators operator+(loss_denominators a, const loss_denominators& b) noexcept { return a += b; }
};

//! A copy of `agg` whose denominators are the given global counts.
[[nodiscard]] inline aggregation with_denominators(aggregation agg, const loss_denominators& d) {
  agg.global_tokens = d.tokens;
  agg.global_seqs = d.seqs;
  return agg;
}

namespace detail {

//! Trivially copyable form of an aggregation (device kernels take it by value). Negative
//! tokens / seqs mean "this call's count" until the host resolves them.
struct agg_plan {
  agg_mode mode = agg_mode::token_mean;
  bool count_empty_rows = false;
  double tokens = -1.0;
  double seqs = -1.0;
  double norm = 0.0;
  double factor = 1.0;
  double len_eps = 0.0;

  [[nodiscard]] RLPT_HD bool needs_tokens() const { return mode == agg_mode::token_mean; }
  [[nodiscard]] RLPT_HD bool needs_seqs() const {
    return mode == agg_mode::seq_mean_token_sum || mode == agg_mode::seq_mean_token_mean ||
           mode == agg_mode::seq_mean_token_sum_norm;
  }
  [[nodiscard]] RLPT_HD bool needs_length() const { return mode == agg_mode::seq_mean_token_mean; }

  //! alpha_i of a sequence with `len` valid tokens (rows without one get 0). A zero
  //! denominator only meets rows without valid tokens (validated), so it never divides.
  [[nodiscard]] RLPT_HD double row_weight(double len) const {
    if (len <= 0.0) return 0.0;
    switch (mode) {
    case agg_mode::token_mean:
      return tokens > 0.0 ? factor / tokens : 0.0;
    case agg_mode::token_sum:
      return factor;
    case agg_mode::seq_mean_token_sum:
      return seqs > 0.0 ? factor / seqs : 0.0;
    case agg_mode::seq_mean_token_mean:
      return seqs > 0.0 ? factor / (seqs * (len + len_eps)) : 0.0;
    case agg_mode::seq_mean_token_sum_norm:
      return seqs > 0.0 ? factor / (seqs * norm) : 0.0;
    }
    return 0.0;
  }
};

inline agg_plan make_agg_plan(const aggregation& a, std::string_view term) {
  RLPT_CHECK(std::isfinite(a.factor), errors::objective::bad_option, "{} aggregation factor = {} is not finite", term,
             a.factor);
  RLPT_CHECK(a.len_eps >= 0.0 && std::isfinite(a.len_eps), errors::objective::bad_option,
             "{} aggregation len_eps = {} must be finite and >= 0", term, a.len_eps);
  if (a.mode == agg_mode::seq_mean_token_sum_norm)
    RLPT_CHECK(a.norm > 0.0 && std::isfinite(a.norm), errors::objective::bad_option,
               "{} aggregation seq_mean_token_sum_norm needs norm > 0 (the constant normaliser, e.g. the maximum "
               "response length), got {}",
               term, a.norm);
  if (a.global_tokens)
    RLPT_CHECK(*a.global_tokens >= 0.0 && std::isfinite(*a.global_tokens), errors::objective::bad_denominator,
               "{} aggregation global_tokens = {} must be finite and >= 0", term, *a.global_tokens);
  if (a.global_seqs)
    RLPT_CHECK(*a.global_seqs >= 0.0 && std::isfinite(*a.global_seqs), errors::objective::bad_denominator,
               "{} aggregation global_seqs = {} must be finite and >= 0", term, *a.global_seqs);
  agg_plan p;
  p.mode = a.mode;
  p.count_empty_rows = a.count_empty_rows;
  p.tokens = a.global_tokens ? *a.global_tokens : -1.0;
  p.seqs = a.global_seqs ? *a.global_seqs : -1.0;
  p.norm = a.norm;
  p.factor = a.factor;
  p.len_eps = a.len_eps;
  return p;
}

} // namespace detail
RLPT_NAMESPACE_END
RLPT_NO_CONTRACT_END
