// SPDX-License-Identifier: Apache-2.0
//! @file
//! Generalised advantage estimation (arXiv 1506.02438) and returns, per token, on a padded or
//! packed token layout:
//!
//!     delta_t = r_t + gamma * V_next - V_t,   A_t = delta_t + gamma * lambda * A_next,   ret_t = A_t + V_t
//!
//! run backwards over each sequence in fp64. What "next" means at masked tokens is an explicit
//! choice (rlpt::mask_mode): verl and AReaL skip them (multi-turn tool/observation tokens are
//! transparent), OpenRLHF and slime treat them as zero-reward zero-value tokens, `reset` restarts
//! at them. The value after the last token is 0 or a per-sequence bootstrap (AReaL bootstraps
//! truncated sequences with their last value). Inputs at masked tokens are never read, outputs
//! there are 0, and a sequence's results depend on that sequence only (no batch-size or thread
//! effects). Whitening (verl always whitens GAE advantages) is optional through the options.
#pragma once

#include <rlpt/config.hpp>
#include <rlpt/advantage/common.hpp>
#include <rlpt/advantage/tokens.hpp>
#include <rlpt/advantage/whiten.hpp>
#include <rlpt/core/error.hpp>
#include <rlpt/core/executor.hpp>
#include <rlpt/core/layout.hpp>
#include <rlpt/core/views.hpp>

#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <vector>

namespace rlpt {

//! Per-token inputs of GAE. All per-token arrays share the layout's indexing.
struct gae_inputs {
  token_layout layout;
  view<const float> rewards;        //!< token-level rewards (outcome reward on the last valid token, KL terms, ...)
  view<const float> values;         //!< critic values V_t
  view<const mask_t> mask = {};     //!< nonzero = valid token; empty = every slot valid
  view<const float> bootstrap = {}; //!< per sequence: V after its last token; empty = 0 (verl, OpenRLHF)
};

struct gae_options {
  double gamma = 1.0;                               //!< verl algorithm.gamma default
  double lambda = 1.0;                              //!< verl algorithm.lam default (OpenRLHF 0.95)
  rlpt::mask_mode masked = rlpt::mask_mode::skip;   //!< verl / AReaL
  std::optional<whiten_options> whiten = std::nullopt; //!< whiten the advantages afterwards (verl: always)
  rlpt::nonfinite on_nonfinite = rlpt::nonfinite::raise; //!< mask: zero the whole sequence and count it
};

struct gae_result {
  index_t num_nonfinite_seqs = 0;        //!< sequences zeroed under nonfinite::mask
  std::optional<whiten_result> whitening; //!< set when the options asked for whitening
};

namespace detail {

//! Reverse recurrence over one sequence of n tokens, fp64. values == nullptr means V = 0 (then it
//! computes discounted returns with gamma_lambda = gamma). Writes adv (and ret = adv + V when
//! non-null) at valid tokens and 0 at masked ones. Returns false when a valid output is not
//! finite, i.e. some valid input was NaN or inf.
template <mask_mode Mode>
bool reverse_recurrence(const float* RLPT_RESTRICT r, const float* RLPT_RESTRICT v, const mask_t* RLPT_RESTRICT m,
                        index_t n, double boot, double gamma, double gamma_lambda, float* RLPT_RESTRICT adv,
                        float* RLPT_RESTRICT ret) {
  double next_value = boot, acc = 0.0, check = 0.0;
  for (index_t t = n - 1; t >= 0; --t) {
    const bool ok = m == nullptr || m[t] != 0;
    if (ok) {
      const double vt = v ? static_cast<double>(v[t]) : 0.0;
      const double delta = static_cast<double>(r[t]) + gamma * next_value - vt;
      acc = delta + gamma_lambda * acc;
      next_value = vt;
      const float a = static_cast<float>(acc);
      adv[t] = a;
      if (ret) ret[t] = static_cast<float>(acc + vt);
      check += static_cast<double>(a);
    } else {
      if constexpr (Mode == mask_mode::zero) {
        acc = gamma * next_value + gamma_lambda * acc;
        next_value = 0.0;
      } else if constexpr (Mode == mask_mode::reset) {
        acc = 0.0;
        next_value = 0.0;
      }
      adv[t] = 0.0f;
      if (ret) ret[t] = 0.0f;
    }
  }
  return finite(static_cast<float>(check)) && std::isfinite(check);
}

using recurrence_fn = bool (*)(const float*, const float*, const mask_t*, index_t, double, double, double, float*,
                               float*);

inline recurrence_fn recurrence_for(mask_mode mode) {
  switch (mode) {
  case mask_mode::zero: return &reverse_recurrence<mask_mode::zero>;
  case mask_mode::reset: return &reverse_recurrence<mask_mode::reset>;
  case mask_mode::skip: break;
  }
  return &reverse_recurrence<mask_mode::skip>;
}

inline void check_discount(const char* what, double x) {
  RLPT_CHECK(std::isfinite(x) && x >= 0.0 && x <= 1.0, "rlpt.advantage.bad_option", "{} must be in [0, 1], got {}",
             what, x);
}

//! Names the first non-finite inputs at valid tokens of the given sequences.
inline std::string name_bad_tokens(const token_layout& layout, const std::vector<index_t>& seqs,
                                   view<const float> rewards, view<const float> values, const mask_t* m,
                                   view<const float> bootstrap, index_t& count) {
  std::string listed;
  count = 0;
  auto note = [&](std::string s) {
    if (count < max_named) listed += (count ? ", " : "") + s;
    ++count;
  };
  for (index_t b : seqs) {
    if (!bootstrap.empty() && !finite(bootstrap[b])) note(fmt::format("bootstrap[{}] = {}", b, bootstrap[b]));
    const index_t base = layout.begin(b), n = layout.length(b);
    for (index_t t = 0; t < n; ++t) {
      if (!valid_at(m, base + t)) continue;
      if (!finite(rewards[base + t])) note(fmt::format("reward (sequence {}, token {}) = {}", b, t, rewards[base + t]));
      if (!values.empty() && !finite(values[base + t]))
        note(fmt::format("value (sequence {}, token {}) = {}", b, t, values[base + t]));
    }
  }
  if (count == 0) listed = "the outputs overflow float";
  return listed;
}

//! Runs the recurrence over every sequence; returns the sequences whose outputs were not finite.
//! Under nonfinite::mask their valid advantages are set to `poison` and returns to 0.
inline std::vector<index_t> run_recurrence(const token_layout& layout, view<const float> rewards,
                                           view<const float> values, view<const mask_t> mask,
                                           view<const float> bootstrap, double gamma, double gamma_lambda,
                                           mask_mode mode, view<float> adv, view<float> ret, nonfinite policy,
                                           float poison, const char* what, const host_executor& ex) {
  const recurrence_fn fn = recurrence_for(mode);
  const mask_t* m = mask.empty() ? nullptr : mask.data();
  std::vector<mask_t> bad(static_cast<std::size_t>(layout.num_seqs()), 0);
  ex.parallel_for(layout.num_seqs(), seq_grain(layout), [&](index_t b0, index_t b1) {
    for (index_t b = b0; b < b1; ++b) {
      const index_t base = layout.begin(b), n = layout.length(b);
      const double boot = bootstrap.empty() ? 0.0 : static_cast<double>(bootstrap[b]);
      const bool ok = fn(rewards.data() + base, values.empty() ? nullptr : values.data() + base,
                         m ? m + base : nullptr, n, boot, gamma, gamma_lambda, adv.data() + base,
                         ret.empty() ? nullptr : ret.data() + base);
      if (!ok || !finite(static_cast<float>(boot))) {
        bad[static_cast<std::size_t>(b)] = 1;
        if (policy == nonfinite::mask)
          for (index_t t = 0; t < n; ++t) {
            const bool valid = valid_at(m, base + t);
            adv[base + t] = valid ? poison : 0.0f;
            if (!ret.empty()) ret[base + t] = 0.0f;
          }
      }
    }
  });
  std::vector<index_t> seqs;
  for (std::size_t b = 0; b < bad.size(); ++b)
    if (bad[b]) seqs.push_back(static_cast<index_t>(b));
  if (!seqs.empty() && policy == nonfinite::raise) {
    index_t c = 0;
    const std::string listed = name_bad_tokens(layout, seqs, rewards, values, m, bootstrap, c);
    RLPT_FAIL("rlpt.advantage.nonfinite", "{}: {} sequence{} with non-finite inputs at valid tokens: {}{} (set "
              "on_nonfinite = rlpt::nonfinite::mask to zero such sequences and count them)",
              what, seqs.size(), seqs.size() == 1 ? "" : "s", listed, c > max_named ? ", ..." : "");
  }
  return seqs;
}

} // namespace detail

//! GAE advantages and returns (ret = A + V before any whitening), both per token. `returns` may
//! be empty when only advantages are wanted.
inline gae_result gae(const gae_inputs& in, view<float> advantages, view<float> returns, const gae_options& o = {},
                      const host_executor& ex = {}) {
  detail::check_discount("gae_options::gamma", o.gamma);
  detail::check_discount("gae_options::lambda", o.lambda);
  const token_layout& layout = in.layout;
  layout.expect_tokens("rewards", in.rewards);
  layout.expect_tokens("values", in.values);
  layout.expect_tokens("advantages", advantages);
  if (!returns.empty()) layout.expect_tokens("returns", returns);
  detail::expect_mask(layout, in.mask);
  detail::expect_size_or_empty("bootstrap", in.bootstrap.size(), layout.num_seqs(), "one value per sequence");
  if (o.whiten) detail::check_whiten_options(*o.whiten);

  const bool whitening = o.whiten.has_value();
  // Under nonfinite::mask, a bad sequence's valid advantages become NaN so that whitening (told
  // to mask non-finite values) leaves them out of its statistics and writes 0 there.
  const float poison = whitening ? std::numeric_limits<float>::quiet_NaN() : 0.0f;
  const std::vector<index_t> bad =
      detail::run_recurrence(layout, in.rewards, in.values, in.mask, in.bootstrap, o.gamma, o.gamma * o.lambda,
                             o.masked, advantages, returns, o.on_nonfinite, poison, "gae", ex);
  gae_result result;
  result.num_nonfinite_seqs = static_cast<index_t>(bad.size());
  if (whitening) {
    whiten_options w = *o.whiten;
    if (!bad.empty()) w.on_nonfinite = nonfinite::mask;
    result.whitening = whiten(layout, view<const float>(advantages), in.mask, advantages, w, ex);
  }
  return result;
}

} // namespace rlpt
