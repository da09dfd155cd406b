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
#include <rlpt/advantage/detail/recurrence.hpp>
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

RLPT_NAMESPACE_BEGIN

//! Per-token inputs of GAE. All per-token arrays share the layout's indexing.
struct gae_inputs {
  token_layout layout;
  view<const float> rewards;        //!< token-level rewards (outcome reward on the last valid token, KL terms, ...)
  view<const float> values;         //!< critic values V_t
  view<const mask_t> mask = {};     //!< nonzero = valid token; empty = every slot valid
  view<const float> bootstrap = {}; //!< per sequence: V after its last token; empty = 0 (verl, OpenRLHF)
};

struct gae_options {
  double gamma = 1.0;                                    //!< verl algorithm.gamma default
  double lambda = 1.0;                                   //!< verl algorithm.lam default (OpenRLHF 0.95)
  rlpt::mask_mode masked = rlpt::mask_mode::skip;        //!< verl / AReaL
  std::optional<whiten_options> whiten = std::nullopt;   //!< whiten the advantages afterwards (verl: always)
  rlpt::nonfinite on_nonfinite = rlpt::nonfinite::raise; //!< mask: zero the whole sequence and count it
};

struct gae_result {
  index_t num_nonfinite_seqs = 0;         //!< sequences zeroed under nonfinite::mask
  std::optional<whiten_result> whitening; //!< set when the options asked for whitening
};

namespace detail {

//! The reverse recurrence over sequences [b0, b1), fp64, branch-free per token. Valid token:
//! delta = r + gamma * V_next - V, A = delta + gamma_lambda * A, V_next = V; masked tokens follow
//! `Mode` through selects (never multiplies), so garbage there cannot leak. values == null means
//! V = 0 (discounted returns with gamma_lambda = gamma). Writes A (and A + V) at valid tokens and
//! 0 at masked ones, the sequence's whitening sums of the written advantages (whiten_sums), and
//! ok[b] = 0 when a valid output (or the bootstrap) is not finite (a NaN/inf input).
template <mask_mode Mode, bool HasValues, bool HasMask>
RLPT_HOST_LOOP void recurrence_rows(const token_layout& layout, const float* r, const float* v, const mask_t* m,
                                    const float* boot, double gamma, double gamma_lambda, float* adv, float* ret,
                                    index_t b0, index_t b1, whiten_sums* sums, mask_t* ok) {
  const auto boot_of = [&](index_t b) { return boot ? static_cast<double>(boot[b]) : 0.0; };
  using pass = lanes::sequence_pass<Mode, HasValues, HasMask>;
  const auto begin = [&](index_t b) {
    const index_t base = layout.begin(b);
    pass p{r + base, v ? v + base : nullptr, m ? m + base : nullptr,  adv + base, ret ? ret + base : nullptr,
           gamma,    gamma_lambda,           lanes::start(boot_of(b))};
    p.begin(layout.length(b));
    return p;
  };
  const auto end = [&](index_t b, pass& p) {
    p.finish();
    sums[b] = lanes::sums_of(p.s);
    ok[b] = (std::isfinite(sums[b].s2) && std::isfinite(boot_of(b))) ? 1 : 0;
  };
  // Two sequences side by side: the second's chain of dependent steps runs in the first's gaps.
  index_t b = b0;
  for (; b + 2 <= b1; b += 2) {
    pass p = begin(b), q = begin(b + 1);
    while (p.t >= 0 && q.t >= 0) {
      p.next();
      q.next();
    }
    end(b, p);
    end(b + 1, q);
  }
  if (b < b1) {
    pass p = begin(b);
    end(b, p);
  }
}

using recurrence_fn = void (*)(const token_layout&, const float*, const float*, const mask_t*, const float*, double,
                               double, float*, float*, index_t, index_t, whiten_sums*, mask_t*);

template <mask_mode Mode> recurrence_fn recurrence_for(bool has_values, bool has_mask) {
  if (has_values) return has_mask ? &recurrence_rows<Mode, true, true> : &recurrence_rows<Mode, true, false>;
  return has_mask ? &recurrence_rows<Mode, false, true> : &recurrence_rows<Mode, false, false>;
}

inline recurrence_fn recurrence_for(mask_mode mode, bool has_values, bool has_mask) {
  switch (mode) {
  case mask_mode::zero:
    return recurrence_for<mask_mode::zero>(has_values, has_mask);
  case mask_mode::reset:
    return recurrence_for<mask_mode::reset>(has_values, has_mask);
  case mask_mode::skip:
    break;
  }
  return recurrence_for<mask_mode::skip>(has_values, has_mask);
}

inline void check_discount(const char* what, double x) {
  RLPT_CHECK(std::isfinite(x) && x >= 0.0 && x <= 1.0, errors::advantage::bad_option, "{} must be in [0, 1], got {}",
             what, x);
}

//! Names the first non-finite inputs at valid tokens of the given sequences.
inline std::string name_bad_tokens(const token_layout& layout, const std::vector<index_t>& seqs,
                                   view<const float> rewards, view<const float> values, const mask_t* m,
                                   view<const float> bootstrap, index_t& count) {
  std::string listed;
  count = 0;
  auto note = [&](const std::string& s) {
    if (count < max_named) listed += (count ? ", " : "") + s;
    ++count;
  };
  for (index_t b : seqs) {
    if (!bootstrap.empty() && !finite(bootstrap[b])) note(rlpt::detail::format("bootstrap[{}] = {}", b, bootstrap[b]));
    const index_t base = layout.begin(b), n = layout.length(b);
    for (index_t t = 0; t < n; ++t) {
      if (!valid_at(m, base + t)) continue;
      if (!finite(rewards[base + t]))
        note(rlpt::detail::format("reward (sequence {}, token {}) = {}", b, t, rewards[base + t]));
      if (!values.empty() && !finite(values[base + t]))
        note(rlpt::detail::format("value (sequence {}, token {}) = {}", b, t, values[base + t]));
    }
  }
  if (count == 0) listed = "the outputs overflow float";
  return listed;
}

//! Runs the recurrence over every sequence; returns the sequences whose outputs were not finite.
//! Under nonfinite::mask their valid advantages are set to `poison` and returns to 0. `sums`
//! (one per sequence) receives each sequence's whitening sums of its advantages.
inline std::vector<index_t> run_recurrence(const token_layout& layout, view<const float> rewards,
                                           view<const float> values, view<const mask_t> mask,
                                           view<const float> bootstrap, double gamma, double gamma_lambda,
                                           mask_mode mode, view<float> adv, view<float> ret, nonfinite policy,
                                           float poison, const char* what, const host_executor& ex,
                                           std::vector<whiten_sums>& sums) {
  const recurrence_fn fn = recurrence_for(mode, !values.empty(), !mask.empty());
  const mask_t* m = mask.empty() ? nullptr : mask.data();
  const auto num = static_cast<std::size_t>(layout.num_seqs());
  sums.resize(num);
  std::vector<mask_t> ok(num, 1);
  prefault_for_write(adv);
  prefault_for_write(ret);
  const index_t grain = seq_grain(layout);
  ex.parallel_for(layout.num_seqs(), grain, [&](index_t b0, index_t b1) {
    fn(layout, rewards.data(), values.empty() ? nullptr : values.data(), m,
       bootstrap.empty() ? nullptr : bootstrap.data(), gamma, gamma_lambda, adv.data(),
       ret.empty() ? nullptr : ret.data(), b0, b1, sums.data(), ok.data());
    if (policy != nonfinite::mask) return;
    for (index_t b = b0; b < b1; ++b) {
      if (ok[static_cast<std::size_t>(b)]) continue;
      const index_t base = layout.begin(b), n = layout.length(b);
      for (index_t t = 0; t < n; ++t) {
        adv[base + t] = valid_at(m, base + t) ? poison : 0.0f;
        if (!ret.empty()) ret[base + t] = 0.0f;
      }
    }
  });
  std::vector<index_t> seqs;
  for (std::size_t b = 0; b < num; ++b)
    if (!ok[b]) seqs.push_back(static_cast<index_t>(b));
  if (!seqs.empty() && policy == nonfinite::raise) {
    index_t c = 0;
    const std::string listed = name_bad_tokens(layout, seqs, rewards, values, m, bootstrap, c);
    RLPT_FAIL(errors::advantage::nonfinite,
              "{}: {} sequence{} with non-finite inputs at valid tokens: {}{} (set "
              "on_nonfinite = rlpt::nonfinite::mask to zero such sequences and count them)",
              what, seqs.size(), seqs.size() == 1 ? "" : "s", listed, c > max_named ? ", ..." : "");
  }
  return seqs;
}

inline std::vector<index_t> run_recurrence(const token_layout& layout, view<const float> rewards,
                                           view<const float> values, view<const mask_t> mask,
                                           view<const float> bootstrap, double gamma, double gamma_lambda,
                                           mask_mode mode, view<float> adv, view<float> ret, nonfinite policy,
                                           float poison, const char* what, const host_executor& ex) {
  std::vector<whiten_sums> sums;
  return run_recurrence(layout, rewards, values, mask, bootstrap, gamma, gamma_lambda, mode, adv, ret, policy, poison,
                        what, ex, sums);
}

//! Recurrence + whitening with the statistics taken in the same pass (whiten_sums of every sequence
//! whose outputs are finite, merged in sequence order: the same bits as whiten_moments over the
//! advantages), then applied in one streaming pass; one pass less over memory than whiten().
inline std::vector<index_t> run_recurrence_whitened(const token_layout& layout, view<const float> rewards,
                                                    view<const float> values, view<const mask_t> mask,
                                                    view<const float> bootstrap, double gamma, double gamma_lambda,
                                                    mask_mode mode, view<float> adv, view<float> ret, nonfinite policy,
                                                    const whiten_options& w, const char* what, const host_executor& ex,
                                                    whiten_result& result) {
  std::vector<whiten_sums> sums;
  std::vector<index_t> bad = run_recurrence(layout, rewards, values, mask, bootstrap, gamma, gamma_lambda, mode, adv,
                                            ret, policy, std::numeric_limits<float>::quiet_NaN(), what, ex, sums);
  for (index_t b : bad) sums[static_cast<std::size_t>(b)] = {}; // poisoned: left out (count 0)
  whiten_options wo = w;
  if (!bad.empty()) wo.on_nonfinite = nonfinite::mask; // the poisoned sequences are left out
  result = whiten_apply(merge_rows(sums), layout, adv, mask, adv, wo, ex);
  return bad;
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

  gae_result result;
  if (o.whiten) {
    whiten_result w;
    const std::vector<index_t> bad = detail::run_recurrence_whitened(
        layout, in.rewards, in.values, in.mask, in.bootstrap, o.gamma, o.gamma * o.lambda, o.masked, advantages,
        returns, o.on_nonfinite, *o.whiten, "gae", ex, w);
    result.num_nonfinite_seqs = static_cast<index_t>(bad.size());
    result.whitening = w;
    return result;
  }
  const std::vector<index_t> bad =
      detail::run_recurrence(layout, in.rewards, in.values, in.mask, in.bootstrap, o.gamma, o.gamma * o.lambda,
                             o.masked, advantages, returns, o.on_nonfinite, 0.0f, "gae", ex);
  result.num_nonfinite_seqs = static_cast<index_t>(bad.size());
  return result;
}

RLPT_NAMESPACE_END
