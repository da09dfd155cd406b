// SPDX-License-Identifier: Apache-2.0
// Token-level staleness masks (masked tokens leave the loss and its denominators; fully stale
// sequences still feed their group's baseline), the proximal log-linear interpolation
// (endpoints, monotonicity, fp64 reference), and partial rollouts (interrupt/resume keeps
// tokens, logprobs, versions and the budget).
#include <rlpt/core/layout.hpp>
#include <rlpt/staleness/compat.hpp>
#include <rlpt/staleness/partial.hpp>
#include <rlpt/staleness/proximal.hpp>
#include <rlpt/staleness/token_mask.hpp>

#include "support/errors.hpp"
#include "support/random.hpp"
#include "support/reference.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

using namespace rlpt;

namespace {

struct token_batch {
  token_layout layout;
  std::vector<index_t> offsets;
  std::vector<policy_version> versions;
  std::vector<mask_t> mask;
  std::vector<double> loss; // a per-token loss term
};

// Random sequences, packed or padded; versions spread over [current - 4, current]; prompt
// tokens untagged and masked out.
token_batch make_batch(rlpt::test::rng& rng, bool packed, policy_version current) {
  token_batch b;
  const index_t seqs = rng.integer(1, 9);
  const index_t T = rng.integer(4, 30);
  std::vector<index_t> lens(static_cast<std::size_t>(seqs));
  for (auto& l : lens) l = packed ? rng.integer(0, T) : T;
  b.offsets.assign(1, 0);
  for (const auto l : lens) b.offsets.push_back(b.offsets.back() + l);
  b.layout = packed ? token_layout::packed(b.offsets) : token_layout::padded(seqs, T, T + 3);
  const auto n = static_cast<std::size_t>(b.layout.storage_size());
  b.versions.assign(n, -7); // garbage in slots no sequence owns
  b.mask.assign(n, 1);      // garbage too: those slots must never be read
  b.loss.assign(n, std::numeric_limits<double>::quiet_NaN());
  for (index_t s = 0; s < seqs; ++s) {
    const index_t len = b.layout.length(s);
    const index_t prompt = len > 0 ? rng.integer(0, len / 2) : 0;
    // Each sequence's tokens were generated across a few consecutive versions.
    auto v = static_cast<policy_version>(rng.integer(current - 4, current));
    for (index_t t = 0; t < len; ++t) {
      const auto i = static_cast<std::size_t>(b.layout.at(s, t));
      b.loss[i] = rng.normal();
      if (t < prompt) {
        b.versions[i] = -1;
        b.mask[i] = 0;
        continue;
      }
      if (v < current && rng.bernoulli(0.15)) ++v;
      b.versions[i] = v;
      b.mask[i] = rng.bernoulli(0.85) ? 1 : 0;
      if (b.mask[i] == 0 && rng.bernoulli(0.5)) b.loss[i] = std::numeric_limits<double>::quiet_NaN();
    }
  }
  return b;
}

} // namespace

TEST_CASE("stale tokens leave the loss mask and every denominator, masked garbage never matters") {
  rlpt::test::rng rng(11);
  for (int trial = 0; trial < 300; ++trial) {
    const bool packed = trial % 2 == 0;
    const auto current = static_cast<policy_version>(rng.integer(4, 20));
    token_batch b = make_batch(rng, packed, current);
    const index_t max_age = rng.integer(0, 3);
    std::vector<mask_t> out(b.mask.size(), 42);
    std::vector<index_t> kept(static_cast<std::size_t>(b.layout.num_seqs()), -1);
    std::vector<mask_t> has_loss(kept.size(), 9);
    const token_mask_result r =
        mask_stale_tokens(b.layout, b.versions, b.mask, current, out, {.max_age = max_age}, kept, has_loss);

    // fp64 reference: token-mean over fresh trained tokens only, and per-sequence counts.
    double ref_sum = 0.0;
    index_t ref_count = 0, ref_trained = 0, ref_fully = 0;
    for (index_t s = 0; s < b.layout.num_seqs(); ++s) {
      index_t seq_trained = 0, seq_kept = 0;
      for (index_t t = 0; t < b.layout.length(s); ++t) {
        const auto i = static_cast<std::size_t>(b.layout.at(s, t));
        if (b.mask[i] == 0) {
          CHECK(out[i] == 0);
          continue;
        }
        ++seq_trained;
        const bool fresh = current - b.versions[i] <= max_age;
        CHECK(out[i] == (fresh ? 1 : 0));
        if (fresh) {
          ++seq_kept;
          ref_sum += b.loss[i];
        }
      }
      CHECK(kept[static_cast<std::size_t>(s)] == seq_kept);
      CHECK(has_loss[static_cast<std::size_t>(s)] == (seq_kept > 0 ? 1 : 0));
      ref_count += seq_kept;
      ref_trained += seq_trained;
      ref_fully += (seq_trained > 0 && seq_kept == 0) ? 1 : 0;
    }
    CHECK(r.kept == ref_count);
    CHECK(r.trained == ref_trained);
    CHECK(r.masked == ref_trained - ref_count);
    CHECK(r.sequences_fully_stale == ref_fully);
    // The loss a trainer computes with the new mask: every term and the denominator come from
    // kept tokens only, whatever garbage (NaN) sits under masked or stale tokens.
    double sum = 0.0;
    index_t den = 0;
    for (index_t s = 0; s < b.layout.num_seqs(); ++s)
      for (index_t t = 0; t < b.layout.length(s); ++t) {
        const auto i = static_cast<std::size_t>(b.layout.at(s, t));
        if (out[i] != 0) {
          sum += b.loss[i];
          ++den;
        }
      }
    CHECK(den == ref_count);
    if (den > 0) CHECK(sum / static_cast<double>(den) == doctest::Approx(ref_sum / static_cast<double>(ref_count)));
    CHECK_FALSE(std::isnan(sum));
    // Slots outside every sequence (padding beyond T in each row) are untouched.
    if (!packed)
      for (index_t s = 0; s < b.layout.num_seqs(); ++s)
        for (index_t t = b.layout.length(s); t < b.layout.row_stride(); ++t)
          CHECK(out[static_cast<std::size_t>(s * b.layout.row_stride() + t)] == 42);
    // In place gives the same mask; unbounded keeps every trained token.
    std::vector<mask_t> inplace = b.mask;
    mask_stale_tokens(b.layout, b.versions, inplace, current, inplace, {.max_age = max_age});
    for (index_t s = 0; s < b.layout.num_seqs(); ++s)
      for (index_t t = 0; t < b.layout.length(s); ++t) {
        const auto i = static_cast<std::size_t>(b.layout.at(s, t));
        CHECK(inplace[i] == out[i]);
      }
    const token_mask_result all =
        mask_stale_tokens(b.layout, b.versions, b.mask, current, out, {.max_age = unbounded_staleness});
    CHECK(all.kept == all.trained);
  }
}

TEST_CASE("a fully stale sequence drops out of the loss but still feeds its group's baseline") {
  // One GRPO group of 3 samples; sample 1 was generated entirely 3 versions ago.
  const std::vector<index_t> offsets{0, 4, 8, 12};
  const token_layout layout = token_layout::packed(offsets);
  const std::vector<policy_version> versions{-1, 5, 5, 5, -1, 2, 2, 2, -1, 4, 5, 5};
  const std::vector<mask_t> mask{0, 1, 1, 1, 0, 1, 1, 1, 0, 1, 1, 1};
  const std::vector<double> rewards{1.0, 0.0, 0.5};
  std::vector<mask_t> out(mask.size());
  std::vector<index_t> kept(3);
  std::vector<mask_t> has_loss(3);
  const token_mask_result r = mask_stale_tokens(layout, versions, mask, 5, out, {.max_age = 1}, kept, has_loss);
  CHECK(out == std::vector<mask_t>{0, 1, 1, 1, 0, 0, 0, 0, 0, 1, 1, 1});
  CHECK(kept == std::vector<index_t>{3, 0, 3});
  CHECK(has_loss == std::vector<mask_t>{1, 0, 1});
  CHECK(r.sequences_fully_stale == 1);
  // The baseline is the mean over all three rewards (the stale sample included), so the
  // advantages of the trained samples are those of the full group, not of a shrunken one.
  const double baseline = (rewards[0] + rewards[1] + rewards[2]) / 3.0;
  const double shrunk = (rewards[0] + rewards[2]) / 2.0;
  CHECK(rewards[0] - baseline == doctest::Approx(0.5));
  CHECK(rewards[0] - shrunk != doctest::Approx(0.5)); // what dropping the sample would do
}

TEST_CASE("token mask errors name the sequence, the token and the versions") {
  const std::vector<index_t> offsets{0, 3};
  const token_layout layout = token_layout::packed(offsets);
  std::vector<mask_t> out(3);
  const std::vector<mask_t> mask{0, 1, 1};
  const std::vector<policy_version> untagged{-1, -1, 2};
  RLPT_CHECK_ERROR(mask_stale_tokens(layout, untagged, mask, 3, out), "rlpt.staleness.untagged_token",
                   "sequence 0 token 1", "version -1");
  const std::vector<policy_version> future{-1, 4, 2};
  RLPT_CHECK_ERROR(mask_stale_tokens(layout, future, mask, 3, out), "rlpt.staleness.future_version",
                   "sequence 0 token 1 has version 4", "current version 3");
  const std::vector<policy_version> ok{-1, 3, 2};
  const std::vector<mask_t> short_mask{0, 1};
  RLPT_CHECK_ERROR(mask_stale_tokens(layout, ok, short_mask, 3, out), "rlpt.view.size_mismatch", "loss_mask");
  RLPT_CHECK_ERROR(mask_stale_tokens(layout, ok, mask, 3, out, {.max_age = -5}), "rlpt.staleness.bad_option", "-5");
  std::vector<index_t> kept(2);
  RLPT_CHECK_ERROR(mask_stale_tokens(layout, ok, mask, 3, out, {}, kept), "rlpt.view.size_mismatch", "kept_per_seq");
}

TEST_CASE("proximal interpolation: endpoints are behaviour and current, monotone in the versions") {
  rlpt::test::rng rng(21);
  for (int trial = 0; trial < 2000; ++trial) {
    const float b = static_cast<float>(rng.uniform(-12.0, 0.0));
    const float c = static_cast<float>(rng.uniform(-12.0, 0.0));
    const auto u = static_cast<policy_version>(rng.integer(0, 10));
    const auto vt = static_cast<policy_version>(u + rng.integer(1, 6));
    for (const prox_method m : {prox_method::loglinear, prox_method::linear}) {
      // v_prox = u: the behaviour policy itself; v_prox = v_theta: the current one.
      CHECK(proximal_logprob(b, c, proximal_alpha(u, u, vt), m) == b);
      CHECK(proximal_logprob(b, c, proximal_alpha(u, vt, vt), m) == c);
      // Monotone between the endpoints as v_prox moves from u to v_theta.
      float prev = b;
      for (policy_version vp = u; vp <= vt; ++vp) {
        const float a = proximal_alpha(u, vp, vt);
        const double want_a = static_cast<double>(vp - u) / static_cast<double>(vt - u);
        CHECK(a == doctest::Approx(want_a).epsilon(1e-6));
        const float p = proximal_logprob(b, c, a, m);
        // fp64 reference formulas (AReaL prox_approx.md)
        const double ref = m == prox_method::loglinear ? b + want_a * (static_cast<double>(c) - b)
                                                       : std::log((1.0 - want_a) * std::exp(static_cast<double>(b)) +
                                                                  want_a * std::exp(static_cast<double>(c)));
        CHECK(p == doctest::Approx(ref).epsilon(1e-5));
        if (c >= b)
          CHECK(p >= prev - 1e-6f);
        else
          CHECK(p <= prev + 1e-6f);
        prev = p;
      }
      // Monotone in the token's version too: a more recent token is closer to behaviour.
      const policy_version vp = vt - 1;
      float last_gap = std::numeric_limits<float>::infinity();
      for (policy_version uu = 0; uu <= vp; ++uu) {
        const float a = proximal_alpha(uu, vp, vt);
        CHECK(a <= (uu == 0 ? 1.0f : proximal_alpha(uu - 1, vp, vt)));
        const float gap = std::fabs(proximal_logprob(b, c, a, m) - b);
        CHECK(gap <= last_gap + 1e-5f);
        last_gap = gap;
      }
    }
    // Jensen: probability-space interpolation is never below log-space interpolation.
    const float a = proximal_alpha(u, vt - 1, vt);
    CHECK(proximal_logprob(b, c, a, prox_method::linear) >= proximal_logprob(b, c, a, prox_method::loglinear) - 1e-5f);
  }
  CHECK(proximal_alpha(-1, 3, 4) == 0.0f); // prompt / tool token
  CHECK(proximal_alpha(4, 3, 4) == 0.0f);  // already on-policy
  CHECK(proximal_logprob(-1.0f, -3.0f, 0.5f, prox_method::behaviour) == -1.0f);
  // Extreme log-probs stay finite in probability space.
  CHECK(std::isfinite(proximal_logprob(-1000.0f, -2000.0f, 0.5f, prox_method::linear)));
  CHECK(proximal_logprob(-1000.0f, -2000.0f, 0.5f, prox_method::linear) == doctest::Approx(-1000.0 + std::log(0.5)));
}

TEST_CASE("proximal_logprobs over a batch: AReaL's default lag, masks, errors") {
  const std::vector<float> behav{-1.0f, -2.0f, -0.5f, -3.0f, std::numeric_limits<float>::quiet_NaN()};
  const std::vector<float> cur{-1.5f, -1.0f, -0.25f, -2.0f, -9.0f};
  const std::vector<policy_version> ver{-1, 3, 5, 1, 2};
  const std::vector<mask_t> mask{0, 1, 1, 1, 0};
  std::vector<float> out(5);
  const proximal_result r = proximal_logprobs(behav, cur, ver, mask, 5, out, compat::areal::proximal());
  // v_theta = 5, v_prox = 4: token 1 (u = 3) alpha 1/2; token 2 on-policy alpha 0; token 3 (u = 1) alpha 3/4.
  CHECK(out[0] == -1.0f);
  CHECK(out[1] == doctest::Approx(-1.5));
  CHECK(out[2] == -0.5f);
  CHECK(out[3] == doctest::Approx(-3.0 + 0.75 * 1.0));
  CHECK(out[4] == 0.0f); // masked, non-finite behaviour: a finite placeholder
  CHECK(r.tokens == 3);
  CHECK(r.interpolated == 2);
  const std::vector<float> bad_behav{-1.0f, std::numeric_limits<float>::infinity(), -0.5f, -3.0f, 0.0f};
  RLPT_CHECK_ERROR(proximal_logprobs(bad_behav, cur, ver, mask, 5, out), "rlpt.staleness.non_finite", "token 1", "inf");
  RLPT_CHECK_ERROR(proximal_logprobs(behav, cur, ver, mask, 4, out), "rlpt.staleness.future_version",
                   "token 2 has version 5", "v_theta 4");
  const std::vector<float> short_cur{-1.0f};
  RLPT_CHECK_ERROR(proximal_logprobs(behav, short_cur, ver, mask, 5, out), "rlpt.view.size_mismatch",
                   "current logprobs");
  RLPT_CHECK_ERROR(proximal_logprobs(behav, cur, ver, mask, 5, out, {.lag = -1}), "rlpt.staleness.bad_option", "-1");
}

TEST_CASE("partial rollouts: interrupt (retract) and resume keep tokens, logprobs, versions and budget") {
  const std::vector<token_id> prompt{101, 102, 103};
  partial_rollout p(42, prompt, 7, {.max_new_tokens = 10});
  CHECK(p.remaining() == 10);
  CHECK(p.versions()[0] == -1);
  const std::vector<token_id> c1{1, 2, 3, 4};
  const std::vector<float> l1{-0.1f, -0.2f, -0.3f, -0.4f};
  p.append(c1, l1, 7);
  CHECK(p.interrupt(pause_mode::keep) == partial_state::running); // in-flight update: nothing stops
  CHECK(p.interrupt(pause_mode::retract) == partial_state::interrupted);
  RLPT_CHECK_ERROR(p.append(c1, l1, 8), "rlpt.staleness.partial_state", "group 42", "interrupted");
  p.resume(9);
  p.server = 3;
  const std::vector<token_id> c2{5, 6, 7};
  const std::vector<float> l2{-0.5f, -0.6f, -0.7f};
  const std::vector<policy_version> v2{9, 9, 10}; // the engine swapped weights mid-chunk
  p.append(c2, l2, v2);
  CHECK(p.remaining() == 3);
  CHECK(std::vector<token_id>(p.tokens().begin(), p.tokens().end()) ==
        std::vector<token_id>{101, 102, 103, 1, 2, 3, 4, 5, 6, 7});
  CHECK(std::vector<policy_version>(p.versions().begin(), p.versions().end()) ==
        std::vector<policy_version>{-1, -1, -1, 7, 7, 7, 7, 9, 9, 10});
  CHECK(std::vector<float>(p.logprobs().begin(), p.logprobs().end()) ==
        std::vector<float>{0, 0, 0, -0.1f, -0.2f, -0.3f, -0.4f, -0.5f, -0.6f, -0.7f});
  CHECK(std::vector<mask_t>(p.loss_mask().begin(), p.loss_mask().end()) ==
        std::vector<mask_t>{0, 0, 0, 1, 1, 1, 1, 1, 1, 1});
  CHECK(p.head_version() == 7);
  CHECK(p.tail_version() == 10);
  CHECK(p.version_span() == 3);
  CHECK(p.interruptions() == 1);
  CHECK(p.resumes() == 1);
  CHECK(p.server == 3);
  RLPT_CHECK_ERROR(p.append(c1, l1, 10), "rlpt.staleness.partial_budget", "got 4 tokens but only 3");
  const std::vector<token_id> c3{8, 9, 10};
  p.append(c3, l2, 10);
  CHECK(p.done()); // budget exhausted
  CHECK(p.remaining() == 0);
  RLPT_CHECK_ERROR(p.finish(), "rlpt.staleness.partial_state", "already finished");
}

TEST_CASE("partial rollouts: abort restarts from the prompt, masking the off-policy prefix, limits, errors") {
  const std::vector<token_id> prompt{1, 2};
  const std::vector<token_id> c{5, 6, 7};
  const std::vector<float> l{-1.0f, -1.0f, -1.0f};
  {
    partial_rollout p(1, prompt, 3, {.max_new_tokens = 8});
    p.append(c, l, 3);
    p.interrupt(pause_mode::abort);
    CHECK(p.generated() == 0);
    CHECK(p.remaining() == 8);
    CHECK(p.discarded_tokens() == 3);
    p.resume(5);
    CHECK(p.head_version() == 5); // a fresh dispatch
  }
  {
    partial_rollout p(2, prompt, 3, compat::slime::partial(8, true));
    p.append(c, l, 3);
    p.interrupt(pause_mode::retract);
    p.resume(4);
    p.append(c, l, 4);
    p.finish();
    CHECK(std::vector<mask_t>(p.loss_mask().begin(), p.loss_mask().end()) ==
          std::vector<mask_t>{0, 0, 0, 0, 0, 1, 1, 1});
    CHECK(p.head_version() == 3);
  }
  {
    partial_rollout p(3, prompt, 0, {.max_new_tokens = 50, .max_interruptions = 1});
    p.append(c, l, 0);
    CHECK(p.interrupt(pause_mode::retract) == partial_state::interrupted);
    p.resume(1);
    p.append(c, l, 1);
    CHECK(p.interrupt(pause_mode::retract) == partial_state::finished);
    CHECK(p.truncated());
  }
  partial_rollout p(4, prompt, 2, {.max_new_tokens = 8});
  p.append(c, l, 3);
  RLPT_CHECK_ERROR(p.append(c, l, 2), "rlpt.staleness.bad_version", "version 2", "older than the version 3");
  const std::vector<policy_version> back{3, 4, 3};
  RLPT_CHECK_ERROR(p.append(c, l, back), "rlpt.staleness.bad_version", "token 2 has version 3");
  const std::vector<float> nan_l{-1.0f, std::numeric_limits<float>::quiet_NaN(), -1.0f};
  RLPT_CHECK_ERROR(p.append(c, nan_l, 3), "rlpt.staleness.non_finite", "token 1");
  RLPT_CHECK_ERROR(p.resume(3), "rlpt.staleness.partial_state", "running");
  p.interrupt(pause_mode::retract);
  RLPT_CHECK_ERROR(p.resume(2), "rlpt.staleness.bad_version", "resumes at version 2", "newest token's version 3");
  RLPT_CHECK_ERROR(partial_rollout(5, prompt, -1), "rlpt.staleness.bad_version", "-1");
  RLPT_CHECK_ERROR(partial_rollout(5, prompt, 0, {.max_new_tokens = 0}), "rlpt.staleness.bad_option", "got 0");
}

TEST_CASE("proximal_logprobs equals the per-token functions exactly, masked garbage never leaks") {
  rlpt::test::rng rng(31);
  for (int trial = 0; trial < 200; ++trial) {
    const auto n = static_cast<std::size_t>(rng.integer(1, 5000));
    const auto v_theta = static_cast<policy_version>(rng.integer(0, 12));
    const index_t lag = rng.integer(0, 3);
    std::vector<float> behav(n), cur(n), out(n, 123.0f);
    std::vector<policy_version> ver(n);
    std::vector<mask_t> mask(n);
    for (std::size_t i = 0; i < n; ++i) {
      mask[i] = rng.bernoulli(0.8) ? 1 : 0;
      behav[i] = static_cast<float>(rng.uniform(-20.0, 0.0));
      cur[i] = static_cast<float>(rng.uniform(-20.0, 0.0));
      ver[i] = static_cast<policy_version>(rng.integer(-1, v_theta));
      if (mask[i] == 0) { // garbage where nothing is valid
        if (rng.bernoulli(0.3)) behav[i] = std::numeric_limits<float>::quiet_NaN();
        if (rng.bernoulli(0.3)) cur[i] = -std::numeric_limits<float>::infinity();
        if (rng.bernoulli(0.3))
          ver[i] = static_cast<policy_version>(rng.bernoulli(0.5) ? std::numeric_limits<policy_version>::min()
                                                                  : std::numeric_limits<policy_version>::max());
      }
    }
    for (const prox_method m : {prox_method::loglinear, prox_method::linear, prox_method::behaviour}) {
      const proximal_result r = proximal_logprobs(behav, cur, ver, mask, v_theta, out, {.method = m, .lag = lag});
      const auto v_prox = static_cast<policy_version>(std::max<index_t>(v_theta - lag, -1));
      index_t tokens = 0, mid = 0;
      for (std::size_t i = 0; i < n; ++i) {
        if (mask[i] == 0) {
          CHECK(std::isfinite(out[i]));
          continue;
        }
        const float a = proximal_alpha(ver[i], v_prox, v_theta);
        CHECK(out[i] == proximal_logprob(behav[i], cur[i], a, m)); // bitwise: one definition
        ++tokens;
        mid += (a > 0.0f && a < 1.0f) ? 1 : 0;
      }
      CHECK(r.tokens == tokens);
      CHECK(r.interpolated == mid);
    }
  }
}
