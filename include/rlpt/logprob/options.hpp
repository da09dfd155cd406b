// SPDX-License-Identifier: Apache-2.0
//! @file
//! What distribution a logprob is taken under (temperature, top-k, top-p, min-p), where the
//! results go, and the per-row statistics a forward pass saves for its backward.
//!
//! One options struct serves the host and the device entry points of the logprob family, so a
//! trainer scores tokens under exactly the distribution its inference engine sampled from:
//! logits are divided by the temperature, then (optionally) truncated to the top-k tokens,
//! then to the top-p nucleus of that, with min-p before both (vLLM) or after (SGLang, Hugging
//! Face), and renormalised.
#pragma once

#include <rlpt/config.hpp>
#include <rlpt/core/error.hpp>
#include <rlpt/core/views.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string_view>

RLPT_NAMESPACE_BEGIN

//! What happens when a target token lies outside the top-k / top-p support (the engine could not
//! have sampled it; usually a sign the trainer's logits or sampling parameters differ).
enum class dropped_target : std::uint8_t {
  raise,   //!< rlpt::error naming the row, the token and its probability rank
  neg_inf, //!< logp = −inf, counted in logprob_stats::dropped, no gradient
};

//! Where an engine applies min-p among its truncations. Min-p keeps the tokens whose
//! probability is at least min_p times the most probable token's, which is the same set before
//! or after a renormalisation; the order matters only for top-p, whose nucleus is taken over
//! what min-p kept (first) or is cut by min-p afterwards (last).
enum class min_p_order : std::uint8_t {
  first, //!< vLLM: temperature, min-p, then top-k and top-p over what min-p kept
  last,  //!< SGLang, Hugging Face generate: temperature, top-k, top-p, then min-p
};

struct logprob_options {
  //! Logits are divided by T > 0 before the softmax. 1 = raw logits (vLLM "raw_logprobs");
  //! verl, TRL, OpenRLHF and slime divide by the rollout temperature (see compat.hpp).
  float temperature = 1.0f;
  //! Keep only the k largest tempered logits; every token tied with the k-th is kept (the
  //! vLLM and Hugging Face rule). 0 or −1 = off (HF default 0, vLLM −1).
  index_t top_k = 0;
  //! Then keep the most probable tokens of the top-k distribution while the mass before them
  //! is < top_p (tokens sorted by probability, ties by lower id; the most probable token is
  //! always kept), and renormalise: the vLLM / HF nucleus rule. 1 = off.
  float top_p = 1.0f;
  //! Targets equal to this are not scored: logp 0 and no gradient (torch cross_entropy: −100).
  //! The entropy of such rows is still computed.
  index_t ignore_index = -100;
  //! Targets outside the top-k/top-p/min-p support (only possible when truncation is on).
  dropped_target on_dropped = dropped_target::raise;
  //! Keep only tokens with p >= min_p · max p, i.e. tempered logit z >= max z + log(min_p)
  //! (decided exactly, in double: engines compare rounded float probabilities, which can
  //! differ only for a token within an ulp of the bound; the most probable token is always
  //! kept). 0 = off (vLLM, SGLang and HF default); in [0, 1].
  float min_p = 0.0f;
  //! Before top-k/top-p (vLLM) or after them (SGLang, HF); see min_p_order.
  rlpt::min_p_order min_p_order = rlpt::min_p_order::first;

  [[nodiscard]] bool truncated() const noexcept { return top_k > 0 || top_p < 1.0f || min_p > 0.0f; }
};

//! The forward's per-row statistics as a backward reads them (host or device memory).
template <memory_space Space = memory_space::host> struct basic_logprob_saved_view {
  view<const float, Space> lse{};        //!< log Σ_kept exp(logits / T), one per logits row
  view<const float, Space> threshold{};  //!< top-k/top-p/min-p: lower bound of the kept tempered logits
  view<const index_t, Space> tie_last{}; //!< top-k/top-p/min-p: last kept column among ties at threshold
};
using logprob_saved_view = basic_logprob_saved_view<>;

//! What a backward reads besides the logits and the targets: the upstream gradients and what
//! the forward wrote. Per-target views have one value per forward output (logp, entropy);
//! `saved` one per logits row. Empty views are absent:
//!
//!     rlpt::logprob_entropy_backward(logits, targets,
//!                                    {.dlogp = g, .logp = logp, .saved = out.saved}, dlogits);
template <memory_space Space = memory_space::host> struct basic_logprob_backward_inputs {
  view<const float, Space> dlogp{};    //!< ∂loss/∂logp (empty: no logp term)
  view<const float, Space> dentropy{}; //!< ∂loss/∂entropy (empty: no entropy term)
  //! The forward's logp: a target it scored −inf (outside the top-k/top-p support, or logit −inf)
  //! gets no gradient. Required with dlogp on the device (kernels decide from it, never from
  //! logits an in-place backward overwrites); on the host, absent means "decide from the logits".
  view<const float, Space> logp{};
  view<const float, Space> entropy{};      //!< the forward's entropy (with dentropy; host: recomputed when absent)
  basic_logprob_saved_view<Space> saved{}; //!< the forward's statistics (host: recomputed when absent)
};
using logprob_backward_inputs = basic_logprob_backward_inputs<>;

//! Per-row statistics the forward writes and the backward reads ([N] each, caller memory).
//! `lse` is needed by every backward; `threshold` and `tie_last` only with top-k/top-p/min-p.
struct logprob_saved {
  view<float> lse{};        //!< log Σ_kept exp(logits / T)
  view<float> threshold{};  //!< lower bound of the kept tempered logits (−inf when nothing is truncated)
  view<index_t> tie_last{}; //!< column j is kept iff z_j > threshold or (z_j == threshold and j ≤ tie_last)

  operator logprob_saved_view() const noexcept { return {lse, threshold, tie_last}; } // NOLINT: views convert
};

//! Where a forward writes. Only `logp` is required; empty views are skipped.
struct logprob_outputs {
  view<float> logp{};    //!< [N] log-probability of the target under the (truncated) distribution
  view<float> entropy{}; //!< [N] entropy of that distribution
  logprob_saved saved{}; //!< for the backward
  view2d<mask_t> kept{}; //!< [N, V] 1 where a token survives top-k/top-p (the sampling mask)
  view<mask_t> scored{}; //!< [N] 1 where a target was scored (0: ignored, dropped, no successor)
};

//! Counts a forward returns (the non-finite policy's "mask and count" side).
struct logprob_stats {
  index_t scored = 0;  //!< rows whose target was scored
  index_t ignored = 0; //!< rows skipped (ignore_index, no successor in the sequence, masked)
  index_t dropped = 0; //!< targets outside the top-k/top-p support (on_dropped = neg_inf)

  logprob_stats& operator+=(const logprob_stats& o) noexcept {
    scored += o.scored;
    ignored += o.ignored;
    dropped += o.dropped;
    return *this;
  }
};

namespace detail {

inline void check_logprob_options(const logprob_options& o) {
  RLPT_CHECK(o.temperature > 0.0f && std::isfinite(o.temperature), errors::logprob::temperature,
             "temperature must be finite and > 0, got {} (greedy decoding has no distribution to score: "
             "use top_k = 1 for an argmax check)",
             o.temperature);
  RLPT_CHECK(o.top_k >= -1, errors::logprob::top_k, "top_k must be >= 0 (or -1 = off), got {}", o.top_k);
  RLPT_CHECK(o.top_p > 0.0f && o.top_p <= 1.0f, errors::logprob::top_p, "top_p must be in (0, 1], got {}", o.top_p);
  RLPT_CHECK(o.min_p >= 0.0f && o.min_p <= 1.0f, errors::logprob::min_p, "min_p must be in [0, 1] (0 = off), got {}",
             o.min_p);
  RLPT_CHECK(o.min_p_order == min_p_order::first || o.min_p_order == min_p_order::last, errors::logprob::min_p,
             "min_p_order is {}: neither first (vLLM) nor last (SGLang, Hugging Face)",
             static_cast<int>(o.min_p_order));
}

//! Validates the outputs of an N-row forward over V columns.
inline void check_outputs(const logprob_outputs& out, index_t rows, index_t vocab, bool truncated) {
  expect_size("logp", out.logp.size(), rows, "one per row");
  expect_size_or_empty("entropy", out.entropy.size(), rows, "one per row");
  expect_size_or_empty("scored", out.scored.size(), rows, "one per row");
  expect_size_or_empty("saved.lse", out.saved.lse.size(), rows, "one per row");
  expect_size_or_empty("saved.threshold", out.saved.threshold.size(), rows, "one per row");
  expect_size_or_empty("saved.tie_last", out.saved.tie_last.size(), rows, "one per row");
  if (out.kept.data() != nullptr) {
    RLPT_CHECK(out.kept.rows() == rows && out.kept.cols() == vocab, errors::logprob::shape_mismatch,
               "kept mask is [{}, {}], expected [{}, {}] like the logits", out.kept.rows(), out.kept.cols(), rows,
               vocab);
  }
  if (truncated && !out.saved.lse.empty()) {
    RLPT_CHECK(!out.saved.threshold.empty() && !out.saved.tie_last.empty(), errors::logprob::missing_saved,
               "top-k/top-p is on, so saving statistics for the backward needs saved.threshold and "
               "saved.tie_last as well as saved.lse ({} rows each)",
               rows);
  }
}

inline void check_target(index_t row, index_t target, index_t vocab, index_t ignore_index) {
  if (RLPT_UNLIKELY((target < 0 || target >= vocab) && target != ignore_index))
    RLPT_FAIL(errors::logprob::target_out_of_range,
              "target {} of row {} is outside the vocabulary [0, {}) "
              "and is not ignore_index ({})",
              target, row, vocab, ignore_index);
}

//! Validates a logits view's shape before any size is compared against it (a view built with
//! −1 rows would otherwise report "targets has 0 elements, expected -1").
inline void check_logits_shape(index_t rows, index_t cols, index_t row_stride, bool has_data,
                               std::string_view what = "logits") {
  RLPT_CHECK(rows >= 0 && cols >= 0, errors::logprob::shape_mismatch, "{} view is [{}, {}]: a negative extent", what,
             rows, cols);
  RLPT_CHECK(cols > 0, errors::logprob::shape_mismatch, "{} have 0 columns (an empty vocabulary or hidden size)", what);
  RLPT_CHECK(rows <= 1 || row_stride >= cols, errors::logprob::shape_mismatch,
             "{} are [{}, {}] with row stride {}: rows would overlap (the stride must be >= the columns)", what, rows,
             cols, row_stride);
  RLPT_CHECK(rows == 0 || has_data, errors::logprob::shape_mismatch, "{} are [{}, {}] but their data pointer is null",
             what, rows, cols);
}

//! Raises rlpt.logprob.nonfinite for an unusable row, naming the row, the first offending column
//! and its value (NaN or +inf, raw and tempered), or saying that every logit is −inf. `col_value`
//! reads the raw logit of a column as float (a cold path: the row is scanned once more).
template <class ColValue>
[[noreturn]] void fail_nonfinite_row(index_t row, index_t cols, float temperature, ColValue&& col_value) {
  for (index_t j = 0; j < cols; ++j) {
    const float x = col_value(j);
    const float z = x / temperature;
    if (x != x || z != z || z == std::numeric_limits<float>::infinity())
      RLPT_FAIL(errors::logprob::nonfinite,
                "logits row {} has no usable softmax (a NaN or +inf logit): column {} is {} ({} after temperature "
                "{}), the row's first such column",
                row, j, x, z, temperature);
  }
  RLPT_FAIL(errors::logprob::nonfinite,
            "logits row {} has no usable softmax: every logit is -inf (all {} columns, temperature {})", row, cols,
            temperature);
}

} // namespace detail
RLPT_NAMESPACE_END
