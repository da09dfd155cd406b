// SPDX-License-Identifier: Apache-2.0
// Properties: gradient accumulation with global denominators equals the full batch for every
// mode; garbage (NaN, inf) under the mask changes nothing; packed equals padded; results do not
// depend on the thread count; huge log-ratio gaps give finite results; per-token hand checks.
#include <rlpt/objective.hpp>
#include <rlpt/core/thread_pool.hpp>

#include "batch.hpp"
#include "shared_configurations.hpp"
#include "support/errors.hpp"
#include "support/reference.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <tuple>
#include <vector>

using rlpt::test::batch;
using rlpt::test::grads;
using rlpt::test::ulps;
using namespace rlpt;

namespace {

//! One sequence of three tokens, logp -1 each, ratios 4, 0.5 and 1.1, advantages -2, 3 and 0.5.
struct three_tokens {
  std::vector<mask_t> mask{1, 1, 1};
  std::vector<double> lp{-1.0, -1.0, -1.0};
  std::vector<double> old{-1.0 - std::log(4.0), -1.0 + std::log(2.0), -1.0 - std::log(1.1)};
  std::vector<double> adv{-2.0, 3.0, 0.5};
  [[nodiscard]] basic_objective_inputs<double> inputs() const {
    return {.layout = token_layout::padded(1, 3), .mask = mask, .logp = lp, .old_logp = old, .adv = adv};
  }
};

//! A copy of rows [r0, r1) of a batch as its own padded batch.
template <class T> batch<T> rows(const batch<T>& b, index_t r0, index_t r1) {
  batch<T> m = b;
  m.B = r1 - r0;
  const auto lo = static_cast<std::ptrdiff_t>(r0 * b.stride), hi = static_cast<std::ptrdiff_t>(r1 * b.stride);
  auto cut = [&](auto& dst, const auto& src) { dst.assign(src.begin() + lo, src.begin() + hi); };
  cut(m.mask, b.mask);
  cut(m.lp, b.lp);
  cut(m.old, b.old);
  cut(m.behav, b.behav);
  cut(m.ref, b.ref);
  cut(m.adv, b.adv);
  cut(m.entropy, b.entropy);
  cut(m.values, b.values);
  cut(m.old_values, b.old_values);
  cut(m.returns, b.returns);
  m.seq_adv.assign(b.seq_adv.begin() + r0, b.seq_adv.begin() + r1);
  if (!b.in_denominator.empty()) m.in_denominator.assign(b.in_denominator.begin() + r0, b.in_denominator.begin() + r1);
  m.teachers.clear();
  const std::size_t n = b.size();
  for (int k = 0; k < b.n_teachers; ++k)
    m.teachers.insert(m.teachers.end(), b.teachers.begin() + static_cast<std::ptrdiff_t>(k * n) + lo,
                      b.teachers.begin() + static_cast<std::ptrdiff_t>(k * n) + hi);
  return m;
}

std::vector<objective> accumulation_objectives(agg_mode m) {
  aggregation a{.mode = m, .norm = 13.0, .factor = 2.0};
  std::vector<objective> out;
  out.push_back({.policy = ppo_clip{}, .kl = {.coef = 0.1}, .entropy = {.coef = 0.01}, .agg = a});
  out.push_back({.policy = gspo{.token_level = false}, .correction = seq_is(2.0), .agg = a});
  out.push_back({.policy = cispo{}, .correction = token_tis(1.5), .agg = a});
  out.push_back({.policy = dppo{.divergence = dppo_divergence::binary_kl, .eps_low = 0.01, .eps_high = 0.02},
                 .correction = token_tis(1.5),
                 .agg = a});
  out.push_back({.policy = sapo{},
                 .correction = {.reject = {.stat = rs_stat::k3, .level = rs_level::seq_mean, .hi = 0.02}},
                 .agg = a});
  out.push_back({.policy = dro{.beta = 0.7}, .correction = token_tis(1.5), .kl = {.coef = 0.1}, .agg = a});
  out.push_back({.policy = vespo{}, .agg = a});
  out.push_back({.policy = ppo_clip{},
                 .correction = {.reject = {.stat = rs_stat::tv, .level = rs_level::seq_mean, .hi = 0.1}},
                 .agg = a});
  out.push_back({.policy = ppo_clip{},
                 .correction = {.reject = {.stat = rs_stat::k1, .level = rs_level::token, .lo = 0.8, .hi = 1.25},
                                .rejected = rejected_tokens::removed},
                 .value = {.coef = 0.5},
                 .agg = a});
  if (m == agg_mode::seq_mean_token_sum || m == agg_mode::seq_mean_token_mean)
    out.push_back({.policy = gmpo{}, .agg = {.mode = m, .count_empty_rows = true}});
  return out;
}

} // namespace

TEST_CASE("gradient accumulation: micro-batch losses and gradients add up to the full batch in every mode") {
  const batch<double> full(11, 12, 21, 0.3, 0.3);
  const index_t cuts[] = {0, 2, 3, 7, 11}; // uneven micro-batches, one with a single (empty) row
  for (agg_mode m : {agg_mode::token_mean, agg_mode::token_sum, agg_mode::seq_mean_token_sum,
                     agg_mode::seq_mean_token_mean, agg_mode::seq_mean_token_sum_norm}) {
    for (objective obj : accumulation_objectives(m)) {
      INFO("mode ", name(m), ", policy ", obj.policy.index());
      // The step's denominators: sum of what each micro-batch contributes.
      loss_denominators total;
      for (int k = 0; k < 4; ++k) total += local_denominators(obj, rows(full, cuts[k], cuts[k + 1]).inputs());
      CHECK(total.tokens == local_denominators(obj, full.inputs()).tokens);
      obj.agg = with_denominators(obj.agg, total);

      grads<double> gf(full.size());
      const objective_result rf = evaluate(obj, full.inputs(), gf.view());
      double sum = 0.0;
      std::vector<double> gl, ge, gv;
      for (int k = 0; k < 4; ++k) {
        const batch<double> mb = rows(full, cuts[k], cuts[k + 1]);
        grads<double> g(mb.size());
        sum += evaluate(obj, mb.inputs(), g.view()).loss;
        gl.insert(gl.end(), g.logp.begin(), g.logp.end());
        ge.insert(ge.end(), g.entropy.begin(), g.entropy.end());
        gv.insert(gv.end(), g.values.begin(), g.values.end());
      }
      CHECK(sum == doctest::Approx(rf.loss).epsilon(1e-12));
      RLPT_CHECK_CLOSE(gl, gf.logp, 1e-12, 1e-15);
      RLPT_CHECK_CLOSE(ge, gf.entropy, 1e-12, 1e-15);
      RLPT_CHECK_CLOSE(gv, gf.values, 1e-12, 1e-15);
    }
  }
}

TEST_CASE("seq_in_denominator: marked sequences stay in the loss and out of its denominators, in every mode") {
  const batch<double> full(11, 12, 23, 0.3, 0.3);
  std::vector<mask_t> counted(11, 1);
  counted[0] = counted[4] = counted[7] = 0; // row 1 is empty: it counts where count_empty_rows says so
  for (agg_mode m : {agg_mode::token_mean, agg_mode::token_sum, agg_mode::seq_mean_token_sum,
                     agg_mode::seq_mean_token_mean, agg_mode::seq_mean_token_sum_norm}) {
    for (const objective& obj : accumulation_objectives(m)) {
      INFO("mode ", name(m), ", policy ", obj.policy.index());
      auto marked = full.inputs();
      marked.seq_in_denominator = counted;
      const loss_denominators all = local_denominators(obj, full.inputs());
      const loss_denominators own = local_denominators(obj, marked);
      // The counts without the marked rows' tokens and sequences, by hand from the plain call's rows.
      double tokens = 0.0, seqs = 0.0;
      for (index_t b = 0; b < 11; ++b) {
        if (counted[static_cast<std::size_t>(b)] == 0) continue;
        const loss_denominators r = local_denominators(obj, rows(full, b, b + 1).inputs());
        tokens += r.tokens;
        seqs += r.seqs;
      }
      CHECK(own.tokens == tokens);
      CHECK(own.seqs == seqs);
      CHECK(own.tokens <= all.tokens); // SAPO's sequence rejection here drops the marked rows anyway

      // Every term is linear in 1/N (token_mean) or 1/B (the sequence modes): the marked call is the
      // plain one scaled by the ratio of the denominators, term by term and slot by slot.
      const double f = m == agg_mode::token_mean  ? all.tokens / own.tokens
                       : m == agg_mode::token_sum ? 1.0
                                                  : all.seqs / own.seqs;
      grads<double> gp(full.size()), gm(full.size());
      const objective_result rp = evaluate(obj, full.inputs(), gp.view());
      const objective_result rm = evaluate(obj, marked, gm.view());
      CHECK(rm.loss == doctest::Approx(rp.loss * f).epsilon(1e-12));
      CHECK(rm.policy_loss == doctest::Approx(rp.policy_loss * f).epsilon(1e-12));
      CHECK(rm.kl_loss == doctest::Approx(rp.kl_loss * f).epsilon(1e-12));
      CHECK(rm.value_loss == doctest::Approx(rp.value_loss * f).epsilon(1e-12));
      for (auto* g : {&gp.logp, &gp.entropy, &gp.values})
        for (double& x : *g) x = x == -777.0 ? x : x * f;
      RLPT_CHECK_CLOSE(gm.logp, gp.logp, 1e-12, 1e-15);
      RLPT_CHECK_CLOSE(gm.entropy, gp.entropy, 1e-12, 1e-15);
      RLPT_CHECK_CLOSE(gm.values, gp.values, 1e-12, 1e-15);
      // Metrics are over every token of the call.
      CHECK(rm.tokens == rp.tokens);
      CHECK(rm.loss_tokens == rp.loss_tokens);
      CHECK(rm.clip_frac_low == rp.clip_frac_low);
      CHECK(rm.kl_mean == rp.kl_mean);

      // Micro-batches: their local denominators add up to the step's, and with those the micro-batch
      // losses and gradients add up to the marked full batch (each micro-batch's global count may be
      // below its own in-loss tokens, never below its counted ones).
      const index_t cuts[] = {0, 1, 3, 8, 11}; // the first micro-batch is a marked row alone
      objective step = obj;
      loss_denominators total;
      for (int k = 0; k < 4; ++k) {
        const batch<double> mb = rows(full, cuts[k], cuts[k + 1]);
        auto in = mb.inputs();
        in.seq_in_denominator = view<const mask_t>(counted.data() + cuts[k], cuts[k + 1] - cuts[k]);
        total += local_denominators(obj, in);
      }
      CHECK(total.tokens == own.tokens);
      CHECK(total.seqs == own.seqs);
      step.agg = with_denominators(step.agg, total);
      if (step.policy_agg) step.policy_agg = with_denominators(*step.policy_agg, total);
      double sum = 0.0;
      std::vector<double> gl;
      for (int k = 0; k < 4; ++k) {
        const batch<double> mb = rows(full, cuts[k], cuts[k + 1]);
        auto in = mb.inputs();
        in.seq_in_denominator = view<const mask_t>(counted.data() + cuts[k], cuts[k + 1] - cuts[k]);
        grads<double> g(mb.size());
        sum += evaluate(step, in, g.view()).loss;
        gl.insert(gl.end(), g.logp.begin(), g.logp.end());
      }
      CHECK(sum == doctest::Approx(rm.loss).epsilon(1e-12));
      RLPT_CHECK_CLOSE(gl, gm.logp, 1e-12, 1e-15);
    }
  }
}

TEST_CASE("seq_in_denominator: all ones changes no bit, all zeros leave no denominator and a zero loss") {
  const batch<float> b(6, 40, 24);
  const objective obj{.policy = ppo_clip{}, .kl = {.coef = 0.1}, .entropy = {.coef = 0.01}};
  grads<float> g0(b.size()), g1(b.size()), gz(b.size());
  const objective_result r0 = evaluate(obj, b.inputs(), g0.view());
  const std::vector<mask_t> ones(6, 1), zeros(6, 0);
  auto in = b.inputs();
  in.seq_in_denominator = ones;
  const objective_result r1 = evaluate(obj, in, g1.view());
  CHECK(std::memcmp(&r0, &r1, sizeof r0) == 0);
  CHECK(g0.logp == g1.logp);
  CHECK(g0.entropy == g1.entropy);
  in.seq_in_denominator = zeros;
  CHECK(local_denominators(obj, in).tokens == 0.0);
  const objective_result rz = evaluate(obj, in, gz.view());
  CHECK(rz.loss == 0.0);
  CHECK(rz.tokens == r0.tokens);                              // the metrics still see every token
  for (float x : gz.logp) CHECK((x == 0.0f || x == -777.0f)); // -777: the stride's slots between rows
}

TEST_CASE("gradient accumulation without global denominators is a mean of micro-batch means (the classic bug)") {
  const batch<double> full(8, 12, 22);
  const objective obj{.policy = ppo_clip{}};
  double sum = 0.0;
  for (index_t r = 0; r < 8; r += 4) sum += evaluate(obj, rows(full, r, r + 4).inputs()).loss / 2.0;
  CHECK(sum != doctest::Approx(evaluate(obj, full.inputs()).loss).epsilon(1e-6));
}

namespace {

//! The mean importance weight of is_weighting::batch_normalize, in fp64 from its definition:
//! the bounded weights of valid tokens (token level) or of rows with a valid token (sequence).
double reference_batch_mean(const off_policy_correction& c, const batch<double>& b) {
  const is_weighting& w = c.weight;
  auto bound = [&](double raw) {
    if (w.bound == is_bound::truncate) return std::clamp(raw, w.lo, w.hi);
    if (w.bound == is_bound::mask) return raw >= w.lo && raw <= w.hi ? raw : 0.0;
    return raw;
  };
  auto ratio = [&](double lr) { return std::exp(std::clamp(lr, -c.log_ratio_clamp, c.log_ratio_clamp)); };
  double sum = 0.0, count = 0.0;
  for (index_t r = 0; r < b.B; ++r) {
    double lr = 0.0, len = 0.0;
    for (index_t t = 0; t < b.L; ++t) {
      const auto i = static_cast<std::size_t>(r * b.stride + t);
      if (b.mask[i] == 0) continue;
      const double x = b.old[i] - b.behav[i]; // the proximal numerator
      if (w.level == is_level::token) sum += bound(ratio(x)), count += 1.0;
      lr += x, len += 1.0;
    }
    if (w.level != is_level::token && len > 0.0) {
      sum += bound(ratio(w.level == is_level::seq_geomean ? lr / len : lr)) * len / (len + 1e-8); // verl's masked mean
      count += 1.0;
    }
  }
  return sum / count;
}

} // namespace

TEST_CASE("batch-normalised importance weights are the weights divided by the batch's mean weight") {
  const batch<double> b(9, 40, 23, 0.3, 0.5);
  // The last two with rejection (removed, verl's): the mean still takes every valid token's weight.
  const off_policy_correction corrs[] = {
      token_tis(2.0),
      icepop(0.6, 1.8),
      seq_is(2.0),
      seq_geo_is(1.5),
      seq_is(3.0, is_bound::mask, 0.2),
      {.weight = {.level = is_level::token, .hi = 2.0}, .reject = {.stat = rs_stat::k2, .hi = 0.02}},
      {.weight = {.level = is_level::seq_product, .hi = 2.0},
       .reject = {.stat = rs_stat::k3, .level = rs_level::seq_mean, .hi = 0.05}}};
  for (off_policy_correction c : corrs) {
    INFO("level ", static_cast<int>(c.weight.level), ", bound ", static_cast<int>(c.weight.bound));
    // PPO's term is linear in the weight (value w * l, gradient w * dl): normalising divides it.
    const objective plain{.policy = ppo_clip{}, .correction = c};
    objective normed = plain;
    normed.correction.weight.batch_normalize = true;
    const double mean = reference_batch_mean(c, b);
    REQUIRE(mean > 0.05);
    CHECK(local_is_weights(normed, b.inputs()).mean() == doctest::Approx(mean).epsilon(1e-13));
    grads<double> gp(b.size()), gn(b.size());
    const objective_result rp = evaluate(plain, b.inputs(), gp.view());
    const objective_result rn = evaluate(normed, b.inputs(), gn.view());
    CHECK(rn.policy_loss == doctest::Approx(rp.policy_loss / mean).epsilon(1e-12));
    CHECK(rn.is_weight_mean == doctest::Approx(rp.is_weight_mean / mean).epsilon(1e-12));
    CHECK(rn.loss_tokens == rp.loss_tokens);
    if (c.reject.stat != rs_stat::none) CHECK(rn.loss_tokens < rn.tokens); // some tokens are rejected
    for (double& g : gp.logp) g = g == -777.0 ? g : g / mean;
    RLPT_CHECK_CLOSE(gn.logp, gp.logp, 1e-12, 1e-15);
    // The same mean given explicitly (what a micro-batch of a larger step passes) gives the same bits.
    objective given = normed;
    given.correction.weight.batch_mean = mean;
    grads<double> gg(b.size());
    (void)evaluate(given, b.inputs(), gg.view());
    RLPT_CHECK_CLOSE(gg.logp, gn.logp, 1e-12, 1e-15);
  }
  // verl's flag, which its config ignores without rollout_is.
  CHECK(compat::verl::rollout_correction("token", "2.0", "", "", false, true).weight.batch_normalize);
  CHECK_FALSE(compat::verl::rollout_correction("", "2.0", "", "", false, true).weight.batch_normalize);
}

TEST_CASE("batch-normalised weights over micro-batches: the step's mean from local_is_weights") {
  const batch<double> full(11, 12, 24, 0.3, 0.4);
  const index_t cuts[] = {0, 2, 3, 7, 11};
  for (const off_policy_correction& c : {token_tis(1.5), seq_is(2.0)}) {
    objective obj{.policy = cispo{}, .correction = c, .kl = {.coef = 0.1}};
    obj.correction.weight.batch_normalize = true; // the full batch's own mean
    grads<double> gf(full.size());
    const objective_result rf = evaluate(obj, full.inputs(), gf.view());
    loss_denominators den;
    is_weight_sums w;
    for (int k = 0; k < 4; ++k) {
      const batch<double> mb = rows(full, cuts[k], cuts[k + 1]);
      den += local_denominators(obj, mb.inputs());
      w += local_is_weights(obj, mb.inputs());
    }
    CHECK(w.mean() == doctest::Approx(local_is_weights(obj, full.inputs()).mean()).epsilon(1e-13));
    obj.agg = with_denominators(obj.agg, den);
    obj.correction.weight.batch_mean = w.mean();
    double sum = 0.0;
    std::vector<double> gl;
    for (int k = 0; k < 4; ++k) {
      const batch<double> mb = rows(full, cuts[k], cuts[k + 1]);
      grads<double> g(mb.size());
      sum += evaluate(obj, mb.inputs(), g.view()).loss;
      gl.insert(gl.end(), g.logp.begin(), g.logp.end());
    }
    CHECK(sum == doctest::Approx(rf.loss).epsilon(1e-12));
    RLPT_CHECK_CLOSE(gl, gf.logp, 1e-12, 1e-15);
  }
}

TEST_CASE("batch-normalised weights whose mean is <= 1e-8 are left as they are (verl)") {
  const batch<double> b(5, 20, 25);
  // A band no ratio reaches: every weight is 0, so is their mean.
  const objective plain{.policy = ppo_clip{}, .correction = icepop(50.0, 60.0)};
  objective normed = plain;
  normed.correction.weight.batch_normalize = true;
  CHECK(local_is_weights(normed, b.inputs()).mean() == 0.0);
  grads<double> gp(b.size()), gn(b.size());
  const objective_result rp = evaluate(plain, b.inputs(), gp.view());
  const objective_result rn = evaluate(normed, b.inputs(), gn.view());
  CHECK(rn.loss == rp.loss);
  CHECK(std::isfinite(rn.loss));
  CHECK(gn.logp == gp.logp);
  normed.correction.weight.batch_mean = 1e-9; // given: the same rule
  grads<double> gg(b.size());
  (void)evaluate(normed, b.inputs(), gg.view());
  CHECK(gg.logp == gp.logp);
}

TEST_CASE("masked garbage (NaN, inf, huge) changes no output bit") {
  batch<float> clean(7, 16, 23, 0.5, 0.5);
  batch<float> dirty = clean;
  const float garbage[] = {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                           -std::numeric_limits<float>::infinity(), 3e38f, -1e30f};
  std::size_t k = 0;
  for (std::size_t i = 0; i < dirty.size(); ++i) {
    if (dirty.mask[i]) continue;
    for (auto* v : {&dirty.lp, &dirty.old, &dirty.behav, &dirty.ref, &dirty.adv, &dirty.entropy, &dirty.values,
                    &dirty.old_values, &dirty.returns})
      (*v)[i] = garbage[k++ % 5];
    for (int t = 0; t < dirty.n_teachers; ++t)
      dirty.teachers[static_cast<std::size_t>(t) * dirty.size() + i] = garbage[k++ % 5];
  }
  const std::vector<double> tw{0.5, 0.5};
  const objective objs[] = {
      {.policy = ppo_clip{},
       .correction = token_tis(2.0),
       .kl = {.coef = 0.1},
       .entropy = {.coef = 0.01},
       .value = {.coef = 0.5}},
      {.policy = gspo{.token_level = false}, .correction = seq_is(2.0), .agg = {.mode = agg_mode::seq_mean_token_mean}},
      {.policy = gmpo{}, .correction = icepop(0.5, 2.0), .agg = {.mode = agg_mode::seq_mean_token_sum}},
      {.policy = sapo{}, .correction = {.reject = {.stat = rs_stat::k2, .level = rs_level::seq_max, .hi = 0.2}}},
      {.policy = cispo{}, .distill = {.coef = 0.5, .teacher_weights = tw}},
      {.policy = dppo{.divergence = dppo_divergence::binary_kl, .eps_low = 0.01, .eps_high = 0.02}},
      {.policy = dro{.beta = 1.5}, .correction = token_tis(2.0), .kl = {.coef = 0.1}},
      {.policy = vespo{}, .correction = seq_is(2.0)},
  };
  for (const objective& obj : objs) {
    grads<float> gc(clean.size()), gd(dirty.size());
    const auto rc = evaluate(obj, clean.inputs(), gc.view());
    const auto rd = evaluate(obj, dirty.inputs(), gd.view());
    CHECK(std::isfinite(rc.loss));
    CHECK(rc.loss == rd.loss);
    CHECK(rc.is_weight_max == rd.is_weight_max);
    CHECK(rc.clip_frac_high == rd.clip_frac_high);
    CHECK(gc.logp == gd.logp);
    CHECK(gc.entropy == gd.entropy);
    CHECK(gc.values == gd.values);
    for (std::size_t i = 0; i < clean.size(); ++i) {
      if (static_cast<index_t>(i) % clean.stride >= clean.L) continue; // stride gap: not a layout slot
      if (!clean.mask[i]) {
        CHECK(gc.logp[i] == 0.0f);
        CHECK(gc.entropy[i] == 0.0f);
        CHECK(gc.values[i] == 0.0f);
      }
    }
  }
}

TEST_CASE("no mask means every token is valid, as an all-ones mask") {
  const batch<double> b(5, 9, 30);
  std::vector<mask_t> ones(b.size(), 1);
  auto with_ones = b.inputs();
  with_ones.mask = ones;
  auto without = b.inputs();
  without.mask = {};
  const objective objs[] = {
      {.policy = ppo_clip{}, .correction = token_tis(2.0), .kl = {.coef = 0.1}, .entropy = {.coef = 0.01}},
      {.policy = gspo{.token_level = false}, .agg = {.mode = agg_mode::seq_mean_token_mean}},
      {.policy = no_policy{}, .value = {.coef = 0.5}},
  };
  for (const objective& obj : objs) {
    grads<double> g1(b.size()), g2(b.size());
    const auto r1 = evaluate(obj, with_ones, g1.view());
    const auto r2 = evaluate(obj, without, g2.view());
    CHECK(r2.tokens == static_cast<double>(b.B * b.L));
    CHECK(r1.loss == r2.loss);
    CHECK(r1.tokens == r2.tokens);
    CHECK(g1.logp == g2.logp);
    CHECK(g1.values == g2.values);
    CHECK(local_denominators(obj, without).tokens == r2.tokens);
  }
}

TEST_CASE("packed and padded layouts give the same loss and gradients") {
  const batch<double> b(6, 14, 24);
  std::vector<index_t> offsets{0};
  std::vector<double> lp, old, adv, ref;
  std::vector<mask_t> mask;
  std::vector<std::size_t> where;
  for (index_t s = 0; s < b.B; ++s) {
    // Each packed sequence keeps its valid prefix length (trailing padding dropped).
    index_t len = 0;
    for (index_t t = 0; t < b.L; ++t)
      if (b.mask[static_cast<std::size_t>(s * b.stride + t)]) len = t + 1;
    for (index_t t = 0; t < len; ++t) {
      const auto i = static_cast<std::size_t>(s * b.stride + t);
      lp.push_back(b.lp[i]), old.push_back(b.old[i]), adv.push_back(b.adv[i]), ref.push_back(b.ref[i]);
      mask.push_back(b.mask[i]), where.push_back(i);
    }
    offsets.push_back(static_cast<index_t>(lp.size()));
  }
  for (agg_mode m : {agg_mode::token_mean, agg_mode::seq_mean_token_mean, agg_mode::seq_mean_token_sum_norm}) {
    const objective obj{.policy = gspo{.token_level = false}, .kl = {.coef = 0.2}, .agg = {.mode = m, .norm = 14.0}};
    grads<double> gp(b.size());
    const auto rp = evaluate(obj, b.inputs(), gp.view());
    std::vector<double> g(lp.size());
    basic_objective_inputs<double> in{.layout = token_layout::packed(offsets),
                                      .mask = mask,
                                      .logp = lp,
                                      .old_logp = old,
                                      .ref_logp = ref,
                                      .adv = adv};
    const auto rk = evaluate(obj, in, {.logp = g});
    CHECK(rk.loss == doctest::Approx(rp.loss).epsilon(1e-14));
    for (std::size_t j = 0; j < g.size(); ++j) CHECK(g[j] == doctest::Approx(gp.logp[where[j]]).epsilon(1e-14));
  }
}

TEST_CASE("results do not depend on the number of threads") {
  const batch<float> b(300, 64, 25);
  const objective obj{
      .policy = ppo_clip{}, .correction = token_tis(2.0), .kl = {.coef = 0.05}, .entropy = {.coef = 0.01}};
  grads<float> g1(b.size()), g2(b.size());
  const auto r1 = evaluate(obj, b.inputs(), g1.view());
  thread_pool pool(3);
  const auto r2 = evaluate(obj, b.inputs(), g2.view(), host_executor{&pool});
  CHECK(r1.loss == r2.loss);
  CHECK(r1.kl_loss == r2.kl_loss);
  CHECK(r1.clip_frac_low == r2.clip_frac_low);
  CHECK(g1.logp == g2.logp);
  CHECK(g1.entropy == g2.entropy);
}

TEST_CASE("huge log-ratio gaps give finite losses, gradients and metrics") {
  batch<float> b(4, 12, 26);
  for (std::size_t i = 0; i < b.size(); ++i) {
    const float gaps[] = {-90.f, -60.f, -25.f, 25.f, 60.f, 90.f};
    b.old[i] = b.lp[i] + gaps[i % 6];
    b.behav[i] = b.old[i] - gaps[(i + 2) % 6];
    b.ref[i] = b.lp[i] - gaps[(i + 1) % 6];
  }
  const std::vector<double> tw{1.0, 0.0};
  const objective objs[] = {
      {.policy = ppo_clip{.dual_clip = 0.0, .log_ratio_clamp = 80.0},
       .correction = token_tis(2.0),
       .kl = {.coef = 1.0, .k3_x_min = -80.0, .k3_x_max = 80.0, .output_clamp = 0.0}},
      {.policy = gspo{.token_level = false, .log_ratio_max = 80.0}, .correction = seq_is(2.0, is_bound::mask)},
      {.policy = gmpo{}, .correction = seq_geo_is(), .agg = {.mode = agg_mode::seq_mean_token_sum}},
      {.policy = sapo{.log_ratio_clamp = 80.0},
       .kl = {.coef = 1.0, .estimator = kl_estimator::k2, .importance_corrected = true}},
      {.policy = cispo{.bounds = cispo_bounds::absolute, .log_ratio_clamp = 80.0}, .correction = icepop()},
  };
  for (const objective& obj : objs) {
    grads<float> g(b.size());
    const auto r = evaluate(obj, b.inputs(), g.view());
    CHECK(std::isfinite(r.loss));
    CHECK(std::isfinite(r.is_weight_max));
    CHECK(r.clamped_frac >= 0.0);
    for (float x : g.logp) CHECK(std::isfinite(x));
  }
}

TEST_CASE("hand-computed tokens: verl dual clip, TRL delta, GMPO sign-aware clip, SAPO gate") {
  // One sequence of three tokens, token-sum, so the loss is the sum of per-token terms.
  const three_tokens tokens;
  const basic_objective_inputs<double> in = tokens.inputs();
  const aggregation sum{.mode = agg_mode::token_sum};
  std::vector<double> g(3);
  // ratios 4, 0.5, 1.1. verl: token 0 (A<0, r=4): max(8, 2*1.2) = 8 capped at c|A| = 6; token 1
  // (A>0, r=0.5): max(-1.5, -3*0.8) = -1.5; token 2: -0.55.
  auto r = evaluate(objective{.policy = ppo_clip{}, .agg = sum}, in, {.logp = g});
  CHECK(r.loss == doctest::Approx(6.0 - 1.5 - 0.55));
  CHECK(g[0] == 0.0);
  CHECK(g[1] == doctest::Approx(-1.5));
  CHECK(g[2] == doctest::Approx(-0.55));
  CHECK(r.clip_frac_dual == doctest::Approx(1.0 / 3.0));
  // TRL delta = 3: token 0: -min(min(4,3)*-2, 1.2*-2) = 6 (r capped at delta, gradient 0).
  r = evaluate(objective{.policy = ppo_clip{.dual_clip = 0.0, .delta = 3.0}, .agg = sum}, in, {.logp = g});
  CHECK(r.loss == doctest::Approx(6.0 - 1.5 - 0.55));
  CHECK(g[0] == 0.0);
  // Both on, delta = 2.5 under the dual clip's 6: token 0: the capped ratio's 5 (gradient 0), the
  // dual clip not reached.
  r = evaluate(objective{.policy = ppo_clip{.dual_clip = 3.0, .delta = 2.5}, .agg = sum}, in, {.logp = g});
  CHECK(r.loss == doctest::Approx(5.0 - 1.5 - 0.55));
  CHECK(g[0] == 0.0);
  CHECK(r.clip_frac_dual == 0.0);
  // Without either cap the negative-advantage token costs |A| r = 8 with gradient 8.
  r = evaluate(objective{.policy = ppo_clip{.dual_clip = 0.0}, .agg = sum}, in, {.logp = g});
  CHECK(r.loss == doctest::Approx(8.0 - 1.5 - 0.55));
  CHECK(g[0] == doctest::Approx(8.0));
  // SAPO: -A sigmoid(tau (r - 1)) 4 / tau.
  r = evaluate(objective{.policy = sapo{}, .agg = sum}, in, {.logp = g});
  auto sapo_term = [](double ratio, double A) {
    const double tau = A > 0 ? 1.0 : 1.05;
    return -A * 4.0 / tau / (1.0 + std::exp(-tau * (ratio - 1.0)));
  };
  CHECK(r.loss == doctest::Approx(sapo_term(4.0, -2.0) + sapo_term(0.5, 3.0) + sapo_term(1.1, 0.5)));
  // GMPO over one sequence, eps 0.2: x = log 4 (A<0: x* = max(x, 0.2) = log 4), x = -log 2
  // (A>0: x* = min(x, -0.2) = -log 2), x = log 1.1 (A>0, inside: x* = log 1.1).
  r = evaluate(objective{.policy = gmpo{}, .agg = {.mode = agg_mode::seq_mean_token_sum}}, in, {.logp = g});
  const double xs = (std::log(4.0) - std::log(2.0) + std::log(1.1)) / 3.0;
  CHECK(r.loss == doctest::Approx(-(-2.0 + 3.0 + 0.5) / 3.0 * std::exp(xs)));
}

TEST_CASE("hand-computed tokens: DPPO keeps a token by the divergence in its advantage's direction") {
  // p = exp(-1) for every token; q = p / 4, 2 p, p / 1.1 (ratios 4, 0.5, 1.1); token-sum.
  const three_tokens tokens;
  const basic_objective_inputs<double> in = tokens.inputs();
  const aggregation sum{.mode = agg_mode::token_sum};
  std::vector<double> g(3);
  const double p = std::exp(-1.0), q2 = p / 1.1;
  // TV, eps_high 0.03: token 0 (A < 0, p - q = 0.28 >= -eps_low) is kept with its ratio 4 truncated
  // to 3: -A * 3 * logp = -6, gradient 6. Token 1 (A > 0, p - q < 0) is kept: 1.5, gradient -1.5.
  // Token 2 (A > 0, p - q = 0.033 > 0.03) is dropped.
  auto r = evaluate(objective{.policy = dppo{.eps_high = 0.03}, .agg = sum}, in, {.logp = g});
  CHECK(p - q2 > 0.03);
  CHECK(r.loss == doctest::Approx(-6.0 + 1.5));
  CHECK(g[0] == doctest::Approx(6.0));
  CHECK(g[1] == doctest::Approx(-1.5));
  CHECK(g[2] == 0.0);
  CHECK(r.clip_frac_high == doctest::Approx(1.0 / 3.0)); // token 2 dropped
  CHECK(r.clip_frac_low == 0.0);
  CHECK(r.clip_frac_dual == doctest::Approx(1.0 / 3.0)); // token 0 truncated
  // With the bound above its change, token 2 is kept: -0.5 * 1.1 * -1 = 0.55, gradient -0.55.
  r = evaluate(objective{.policy = dppo{.eps_high = 0.04}, .agg = sum}, in, {.logp = g});
  CHECK(r.loss == doctest::Approx(-6.0 + 1.5 + 0.55));
  CHECK(g[2] == doctest::Approx(-0.55));
  // Binary KL: token 2's D decides; tokens 0 and 1 moved against their advantage's push and stay.
  const double d = q2 * (-std::log(1.1)) + (1.0 - q2) * std::log((1.0 - q2 + 1e-8) / (1.0 - p + 1e-8));
  CHECK(d > 0.0);
  for (double f : {0.99, 1.01}) {
    r = evaluate(objective{.policy = dppo{.divergence = dppo_divergence::binary_kl, .eps_low = 0.0, .eps_high = d * f},
                           .agg = sum},
                 in, {.logp = g});
    CHECK(g[0] == doctest::Approx(6.0));
    CHECK(g[1] == doctest::Approx(-1.5));
    CHECK(g[2] == (f < 1.0 ? 0.0 : doctest::Approx(-0.55)));
  }
  // A negative advantage is held by eps_low on the downward side: token 1 flipped to A = -3.
  const std::vector<double> adv2{-2.0, -3.0, 0.5};
  basic_objective_inputs<double> in2 = in;
  in2.adv = adv2;
  // p - q = -0.37: dropped below -eps_low = -0.3 (a low clip), kept above -0.4 (-A * 0.5 = 1.5).
  r = evaluate(objective{.policy = dppo{.eps_low = 0.3, .eps_high = 0.04}, .agg = sum}, in2, {.logp = g});
  CHECK(g[1] == 0.0);
  CHECK(r.clip_frac_low == doctest::Approx(1.0 / 3.0));
  r = evaluate(objective{.policy = dppo{.eps_low = 0.4, .eps_high = 0.04}, .agg = sum}, in2, {.logp = g});
  CHECK(g[1] == doctest::Approx(1.5));
  CHECK(r.clip_frac_low == 0.0);
}

TEST_CASE("hand-computed tokens: DRO's quadratic log-ratio penalty") {
  // x = logp - old = log 4, -log 2, log 1.1; A = -2, 3, 0.5; logp = -1. With beta = 2 each token's
  // loss is -(logp A - x^2) and its gradient -A + 2 x; no clip events.
  const three_tokens tokens;
  std::vector<double> g(3);
  const auto r = evaluate(objective{.policy = dro{.beta = 2.0}, .agg = {.mode = agg_mode::token_sum}}, tokens.inputs(),
                          {.logp = g});
  const double x[3] = {std::log(4.0), -std::log(2.0), std::log(1.1)};
  const double A[3] = {-2.0, 3.0, 0.5};
  double loss = 0.0;
  for (int t = 0; t < 3; ++t) {
    loss += -(-1.0 * A[t] - x[t] * x[t]);
    CHECK(g[static_cast<std::size_t>(t)] == doctest::Approx(-A[t] + 2.0 * x[t]).epsilon(1e-14));
  }
  CHECK(r.loss == doctest::Approx(loss).epsilon(1e-14));
  CHECK(r.clip_frac_low + r.clip_frac_high + r.clip_frac_dual + r.clamped_frac == 0.0);
  CHECK(r.approx_kl == doctest::Approx(-(x[0] + x[1] + x[2]) / 3.0).epsilon(1e-14));
}

TEST_CASE("hand-computed tokens: VESPO's soft sequence weight by the advantage's sign") {
  // One row, x = 0.3, -0.1, 25 (clamped to 20) and a masked 7: log w = 20.2 clamps to 20, so
  // phi = exp(lambda + 20 k - lambda e^20) underflows to 0. A second row, x = 0.3 and -0.1:
  // log w = 0.2; A = 1 and -2 take phi_pos and phi_neg; logp = -1; token-sum.
  const std::vector<mask_t> mask{1, 1, 1, 0, 1, 1, 0, 0};
  const std::vector<double> lp(8, -1.0);
  const std::vector<double> old{-1.3, -0.9, -26.0, -8.0, -1.3, -0.9, 0.0, 0.0};
  const std::vector<double> adv{1.0, -2.0, 1.0, 5.0, 1.0, -2.0, 0.0, 0.0};
  const basic_objective_inputs<double> in{
      .layout = token_layout::padded(2, 4), .mask = mask, .logp = lp, .old_logp = old, .adv = adv};
  std::vector<double> g(8);
  const auto r = evaluate(objective{.policy = vespo{}, .agg = {.mode = agg_mode::token_sum}}, in, {.logp = g});
  const double w = std::exp(0.2);
  const double pos = std::exp(3.0 + 2.0 * 0.2 - 3.0 * w), neg = std::exp(2.0 + 3.0 * 0.2 - 2.0 * w);
  for (std::size_t t = 0; t < 4; ++t) CHECK(g[t] == 0.0); // phi = 0, and the masked slot
  CHECK(g[4] == doctest::Approx(-pos * 1.0).epsilon(1e-14));
  CHECK(g[5] == doctest::Approx(-neg * -2.0).epsilon(1e-14));
  CHECK(r.loss == doctest::Approx(pos * 1.0 * -1.0 * -1.0 + neg * -2.0 * -1.0 * -1.0).epsilon(1e-14));
  CHECK(r.clip_frac_low + r.clip_frac_high + r.clip_frac_dual == 0.0);
}

TEST_CASE("hand-computed tokens: VESPO with token importance weights folded into its sequence weight") {
  // One row, x = 0.3 and -0.1 (sum 0.2); rollout ratios old / behav = e^0.5 (IcePop band [0.5, 2]
  // keeps it) and e^1 (outside: 0, whose log clamps to log 1e-8); a masked slot whose ratio is
  // outside the band too adds nothing. log w = 0.2 + 0.5 + log 1e-8 = -17.72; the weights scale
  // phi only, never the term. A second row with both ratios inside: log w = 0.2 + 0.25 - 0.25.
  const std::vector<mask_t> mask{1, 1, 0, 1, 1, 0};
  const std::vector<double> lp(6, -1.0);
  const std::vector<double> old{-1.3, -0.9, -1.0, -1.3, -0.9, 0.0};
  const std::vector<double> behav{-1.8, -1.9, -4.0, -1.55, -0.65, 0.0};
  const std::vector<double> adv{1.0, -2.0, 1.0, 1.0, -2.0, 0.0};
  const basic_objective_inputs<double> in{
      .layout = token_layout::padded(2, 3), .mask = mask, .logp = lp, .old_logp = old, .behav_logp = behav, .adv = adv};
  std::vector<double> g(6);
  const objective obj{
      .policy = vespo{.fold_is_weight = true},
      .correction = {.weight = {.level = is_level::token, .bound = is_bound::mask, .lo = 0.5, .hi = 2.0},
                     .rejected = rejected_tokens::zero_weight},
      .agg = {.mode = agg_mode::token_sum}};
  const auto r = evaluate(obj, in, {.logp = g});
  auto phi = [](double k, double lambda, double log_w) {
    return std::exp(lambda + k * log_w - lambda * std::exp(log_w));
  };
  const double lw0 = 0.2 + 0.5 + std::log(1e-8), lw1 = 0.2 + 0.25 - 0.25;
  const double want[] = {-phi(2.0, 3.0, lw0), phi(3.0, 2.0, lw0) * 2.0, 0.0,
                         -phi(2.0, 3.0, lw1), phi(3.0, 2.0, lw1) * 2.0, 0.0};
  for (std::size_t t = 0; t < 6; ++t) {
    INFO("slot ", t);
    if (want[t] == 0.0)
      CHECK(g[t] == 0.0);
    else // relative to the value alone: phi of the first row is about 1e-14
      CHECK(g[t] == doctest::Approx(want[t]).epsilon(1e-12).scale(0.0));
  }
  CHECK(g[0] != 0.0); // the zero weight of slot 1 shrinks phi, it does not remove slot 0 or 1
  double loss = 0.0;
  for (std::size_t t = 0; t < 6; ++t) loss += want[t] * lp[t];
  CHECK(r.loss == doctest::Approx(loss).epsilon(1e-12).scale(0.0));
  // Without folding, the weights scale the term: the same inputs give other gradients.
  std::vector<double> g_plain(6);
  objective plain = obj;
  std::get<vespo>(plain.policy).fold_is_weight = false;
  evaluate(plain, in, {.logp = g_plain});
  CHECK(g_plain[1] == 0.0);
}

TEST_CASE("metrics: clip fractions, approximate KL, importance weights, rejection") {
  const std::vector<mask_t> mask{1, 1, 1, 1, 0};
  const std::vector<double> lp{-1.0, -1.0, -1.0, -1.0, 99.0};
  const std::vector<double> old{-1.5, -0.5, -1.0, -1.1, 0.0};
  const std::vector<double> behav{-1.5 - std::log(3.0), -0.5, -1.0 + std::log(4.0), -1.1, 0.0};
  const std::vector<double> adv{1.0, -1.0, 1.0, 1.0, 0.0};
  const basic_objective_inputs<double> in{
      .layout = token_layout::padded(1, 5), .mask = mask, .logp = lp, .old_logp = old, .behav_logp = behav, .adv = adv};
  // ratios e^0.5 (A>0: high clip), e^-0.5 (A<0: low clip), 1, e^0.1
  const auto r = evaluate(objective{.policy = ppo_clip{}, .correction = icepop(0.5, 2.0)}, in);
  CHECK(r.tokens == 4.0);
  CHECK(r.clip_frac_high == doctest::Approx(0.25));
  CHECK(r.clip_frac_low == doctest::Approx(0.25));
  CHECK(r.approx_kl == doctest::Approx((-0.5 + 0.5 + 0.0 - 0.1) / 4.0));
  // behaviour weights 3 (masked to 0 by the band), 1, 1/4 (0), 1
  CHECK(r.is_weight_min == 0.0);
  CHECK(r.is_weight_max == doctest::Approx(1.0));
  CHECK(r.rejected_frac == doctest::Approx(0.5));
  CHECK(r.loss_tokens == 4.0); // IcePop zeroes weights but keeps tokens in the denominator
}

TEST_CASE(
    "rejection: several criteria keep a token only where each alone keeps it (verl's comma-separated rollout_rs)") {
  const batch<double> b(12, 40, 31, 0.3, 0.3);
  const rejection tok_k2{.stat = rs_stat::k2, .level = rs_level::token, .hi = 0.03};
  const rejection seq_k3{.stat = rs_stat::k3, .level = rs_level::seq_mean, .hi = 0.045};
  const rejection seq_tv{.stat = rs_stat::tv, .level = rs_level::seq_max, .hi = 0.12};
  const rejection tok_k1{.stat = rs_stat::k1, .level = rs_level::token, .lo = 0.8, .hi = 1.3};
  // The plain policy gradient summed over tokens: a kept token's gradient is -A, the same in every
  // run, and a rejected one's 0, so which tokens a run keeps reads off its gradient.
  auto run = [&](const off_policy_correction& c, grads<double>& g) {
    return evaluate(objective{.policy = policy_gradient{}, .correction = c, .agg = {.mode = agg_mode::token_sum}},
                    b.inputs(), g.view());
  };
  auto slot = [&](std::size_t i) { return static_cast<index_t>(i) % b.stride < b.L && b.mask[i] != 0; };
  grads<double> none(b.size());
  run({}, none);
  std::vector<std::uint8_t> kept_by_all(b.size(), 1);
  double most = 0.0;
  for (const rejection& r : {tok_k2, seq_k3, seq_tv, tok_k1}) {
    grads<double> g(b.size());
    const objective_result res = run({.reject = r}, g);
    INFO("stat ", static_cast<int>(r.stat), ", level ", static_cast<int>(r.level));
    REQUIRE(res.rejected_frac > 0.0); // each criterion rejects some tokens, and keeps some
    REQUIRE(res.rejected_frac < 1.0);
    most = std::max(most, res.rejected_frac);
    for (std::size_t i = 0; i < b.size(); ++i)
      if (slot(i)) {
        REQUIRE((g.logp[i] == none.logp[i] || g.logp[i] == 0.0)); // kept as without rejection, or removed
        kept_by_all[i] = static_cast<std::uint8_t>(kept_by_all[i] & (g.logp[i] != 0.0 ? 1 : 0));
      }
  }
  grads<double> all(b.size());
  const objective_result r_all = run({.reject = tok_k2, .reject_also = {seq_k3, seq_tv, tok_k1}}, all);
  double kept = 0.0;
  for (std::size_t i = 0; i < b.size(); ++i)
    if (slot(i)) {
      CHECK(all.logp[i] == (kept_by_all[i] != 0 ? none.logp[i] : 0.0));
      kept += kept_by_all[i];
    }
  CHECK(r_all.loss_tokens == kept);
  CHECK(r_all.rejected_frac > most); // the criteria reject different tokens here
  // The order of the criteria, an unused entry and a repeated criterion change no bit.
  for (const off_policy_correction& c :
       {off_policy_correction{.reject = tok_k1, .reject_also = {seq_tv, tok_k2, seq_k3}},
        off_policy_correction{.reject = seq_k3, .reject_also = {tok_k1, tok_k2, seq_tv}},
        off_policy_correction{.reject = seq_tv, .reject_also = {tok_k1, seq_k3, tok_k2}}}) {
    grads<double> g(b.size());
    const objective_result r = run(c, g);
    CHECK(r.loss == r_all.loss);
    CHECK(r.rejected_frac == r_all.rejected_frac);
    CHECK(g.logp == all.logp);
  }
  grads<double> g_once(b.size()), g_twice(b.size()), g_later(b.size());
  run({.reject = seq_k3}, g_once);
  run({.reject = seq_k3, .reject_also = {{{}, seq_k3}}}, g_twice);
  run({.reject_also = {{{}, {}, seq_k3}}}, g_later);
  CHECK(g_once.logp == g_twice.logp);
  CHECK(g_once.logp == g_later.logp);
  // One statistic at the token and sequence levels ("token_k3,seq_mean_k3"; the statistics pass
  // takes the sequence criteria's values from the token criterion's), and after a criterion of
  // another statistic.
  const rejection tok_k3{.stat = rs_stat::k3, .level = rs_level::token, .hi = 0.05};
  const rejection seq_max_k3{.stat = rs_stat::k3, .level = rs_level::seq_max, .hi = 0.3};
  for (const auto& set : {std::vector<rejection>{tok_k3, seq_k3}, std::vector<rejection>{tok_k3, seq_k3, seq_max_k3},
                          std::vector<rejection>{tok_k1, tok_k3, seq_max_k3, seq_tv, seq_k3},
                          std::vector<rejection>{tok_k3, tok_k1, seq_k3, seq_max_k3}}) {
    std::vector<std::uint8_t> kept_by_each(b.size(), 1);
    off_policy_correction c;
    for (std::size_t k = 0; k < set.size(); ++k) {
      grads<double> g(b.size());
      REQUIRE(run({.reject = set[k]}, g).rejected_frac < 1.0);
      for (std::size_t i = 0; i < b.size(); ++i)
        kept_by_each[i] = static_cast<std::uint8_t>(kept_by_each[i] & (g.logp[i] != 0.0 ? 1 : 0));
      (k == 0 ? c.reject : c.reject_also[k - 1]) = set[k];
    }
    grads<double> g(b.size());
    const objective_result r = run(c, g);
    INFO("criteria ", set.size());
    CHECK(r.rejected_frac > 0.0);
    for (std::size_t i = 0; i < b.size(); ++i)
      if (slot(i)) CHECK(g.logp[i] == (kept_by_each[i] != 0 ? none.logp[i] : 0.0));
  }
}

namespace {

//! Evaluates obj on b and on clean: the same loss and gradients, with `nonfinite` tokens counted on b.
void check_as_clean(const objective& obj, const batch<float>& b, const batch<float>& clean, double nonfinite) {
  grads<float> g(b.size()), gc(b.size());
  const auto r = evaluate(obj, b.inputs(), g.view());
  const auto rc = evaluate(obj, clean.inputs(), gc.view());
  CHECK(r.nonfinite_tokens == nonfinite);
  CHECK(r.loss == rc.loss);
  CHECK(g.logp == gc.logp);
}

} // namespace

TEST_CASE("non-finite valid inputs: nonfinite::mask leaves them out and counts them") {
  batch<float> b(3, 8, 27);
  std::size_t bad = 0;
  for (std::size_t i = 0; i < b.size(); ++i)
    if (b.mask[i]) {
      bad = i;
      break;
    }
  batch<float> clean = b;
  clean.mask[bad] = 0;
  b.old[bad] = std::numeric_limits<float>::quiet_NaN();
  check_as_clean({.policy = ppo_clip{}, .nonfinite = nonfinite::mask}, b, clean, 1.0);
}

TEST_CASE("inputs no term reads are not checked: a NaN there changes nothing, where a term reads it it counts") {
  batch<float> b(3, 300, 28);
  const batch<float> clean = b;
  for (std::size_t i = 0; i < b.size(); i += 7)
    if (b.mask[i]) (i % 2 ? b.behav : b.ref)[i] = std::numeric_limits<float>::quiet_NaN();
  // Neither a correction nor distillation reads behav_logp, nor does anything but the KL term read ref_logp.
  check_as_clean({.policy = ppo_clip{}}, b, clean, 0.0);
  // Read: the correction reads behav_logp, the KL term ref_logp (raise: an error naming the input).
  RLPT_CHECK_ERROR(evaluate(objective{.policy = ppo_clip{}, .correction = token_tis(2.0)}, b.inputs()),
                   "rlpt.objective.nonfinite", "behav_logp[");
  RLPT_CHECK_ERROR(evaluate(objective{.policy = ppo_clip{}, .kl = {.coef = 0.1}}, b.inputs()),
                   "rlpt.objective.nonfinite", "ref_logp[");
  const auto masked =
      evaluate(objective{.policy = ppo_clip{}, .kl = {.coef = 0.1}, .nonfinite = nonfinite::mask}, b.inputs());
  CHECK(masked.nonfinite_tokens > 0.0);
}

TEST_CASE("plans with a row pass: a non-finite input raises or is left out whichever pass reads it") {
  // The row pass (statistics, coupling) loads only what it reads and checks nothing under
  // nonfinite::raise (load_chunk<Row>): the token pass must still report every input, including
  // the ones only the row pass reads (behav_logp for a sequence weight) and the advantage the
  // row pass skips.
  const gspo token_level{.eps_low = 0.05, .eps_high = 0.05};
  const gspo coupled{.eps_low = 0.05, .eps_high = 0.05, .token_level = false, .mean_advantage = true};
  const objective plans[] = {
      {.policy = token_level, .correction = seq_is(2.0), .agg = {.mode = agg_mode::seq_mean_token_mean}},
      {.policy = coupled, .correction = seq_is(2.0), .agg = {.mode = agg_mode::seq_mean_token_mean}},
      {.policy = gmpo{}, .correction = token_tis(2.0), .agg = {.mode = agg_mode::seq_mean_token_mean}},
  };
  struct input {
    std::vector<float> batch<float>::*values;
    const char* name;
  };
  const input inputs[] = {{&batch<float>::lp, "logp["},
                          {&batch<float>::old, "old_logp["},
                          {&batch<float>::behav, "behav_logp["},
                          {&batch<float>::adv, "adv["}};
  for (const objective& obj : plans)
    for (const input& x : inputs)
      for (const float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
        CAPTURE(x.name);
        batch<float> b(4, 600, 29);
        std::size_t at = 300; // a valid token of a later chunk of row 0 (host chunks of 256)
        while (!b.mask[at]) ++at;
        batch<float> clean = b;
        clean.mask[at] = 0;
        (b.*x.values)[at] = bad;
        RLPT_CHECK_ERROR(evaluate(obj, b.inputs()), "rlpt.objective.nonfinite", x.name);
        objective masked = obj;
        masked.nonfinite = nonfinite::mask;
        check_as_clean(masked, b, clean, 1.0);
      }
}

TEST_CASE("entropy coefficient helpers: schedule and Skywork/TRL target tracking") {
  const entropy_schedule lin{.start = 0.01, .end = 0.0, .steps = 100, .shape = schedule_shape::linear};
  CHECK(lin.at(0) == doctest::Approx(0.01));
  CHECK(lin.at(50) == doctest::Approx(0.005));
  CHECK(lin.at(500) == doctest::Approx(0.0));
  const entropy_schedule cosine{.start = 1.0, .end = 0.0, .steps = 10, .shape = schedule_shape::cosine};
  CHECK(cosine.at(5) == doctest::Approx(0.5));
  adaptive_entropy a{.coef = 0.0, .target = 0.2, .delta = 0.005, .min = 0.0, .max = 0.01};
  CHECK(a.current() == 0.0); // gated until the first measurement, as TRL (last entropy = inf)
  a.update(0.1);             // below target: raise and apply
  CHECK(a.coef == doctest::Approx(0.005));
  CHECK(a.current() == doctest::Approx(0.005));
  a.update(0.1);
  a.update(0.1);
  CHECK(a.coef == doctest::Approx(0.01)); // capped at max
  a.update(0.5);                          // above target: lower and gate off
  CHECK(a.coef == doctest::Approx(0.005));
  CHECK(a.current() == 0.0);
}

TEST_CASE("distillation: reverse-KL advantage against weighted teachers") {
  const std::vector<mask_t> mask{1, 1};
  const std::vector<double> lp{-1.0, -2.0}, behav{-1.2, -1.8};
  const std::vector<double> teachers{-0.5, -3.0, /* teacher 2 */ -1.5, -1.0};
  const std::vector<double> w{0.25, 0.75};
  basic_objective_inputs<double> in{
      .layout = token_layout::padded(1, 2), .mask = mask, .logp = lp, .behav_logp = behav};
  in.teacher_logp = view2d<const double>(teachers.data(), 2, 2);
  std::vector<double> g(2);
  const auto r = evaluate(objective{.policy = policy_gradient{},
                                    .distill = {.coef = 1.0, .teacher_weights = w},
                                    .agg = {.mode = agg_mode::token_sum}},
                          in, {.logp = g});
  const double a0 = 0.25 * -0.5 + 0.75 * -1.5 - (-1.2);
  const double a1 = 0.25 * -3.0 + 0.75 * -1.0 - (-1.8);
  CHECK(g[0] == doctest::Approx(-a0));
  CHECK(g[1] == doctest::Approx(-a1));
  CHECK(r.loss == doctest::Approx(-(a0 * -1.0 + a1 * -2.0)));
}

TEST_CASE("distillation without advantages: each chunk and each pass sees its own term only") {
  // Rows of 600 tokens span three host chunks; GSPO's sequence form adds a statistics pass.
  // Absent advantages must read as zeros: before the fix, the distillation term accumulated in
  // the chunk's advantage array from chunk to chunk and pass to pass.
  const index_t B = 2, T = 600;
  std::vector<mask_t> mask(static_cast<std::size_t>(B * T), 1);
  std::vector<double> lp(mask.size()), behav(mask.size()), teacher(mask.size()), zeros(mask.size(), 0.0);
  for (std::size_t i = 0; i < mask.size(); ++i) {
    lp[i] = -1.0 - 0.001 * static_cast<double>(i % 700);
    behav[i] = lp[i] - 0.1;
    teacher[i] = lp[i] + 0.3;
  }
  mask[static_cast<std::size_t>(T + 599)] = 0;
  const std::vector<double> w{1.0};
  const objective objs[] = {
      {.policy = policy_gradient{},
       .distill = {.coef = 1.0, .teacher_weights = w},
       .agg = {.mode = agg_mode::token_sum}},
      {.policy = gspo{.token_level = false},
       .distill = {.coef = 1.0, .teacher_weights = w},
       .agg = {.mode = agg_mode::seq_mean_token_mean}},
  };
  for (const objective& obj : objs) {
    basic_objective_inputs<double> in{
        .layout = token_layout::padded(B, T), .mask = mask, .logp = lp, .old_logp = behav, .behav_logp = behav};
    in.teacher_logp = view2d<const double>(teacher.data(), 1, B * T);
    std::vector<double> g_absent(mask.size()), g_zero(mask.size());
    const auto r_absent = evaluate(obj, in, {.logp = g_absent});
    in.adv = zeros;
    const auto r_zero = evaluate(obj, in, {.logp = g_zero});
    CHECK(r_absent.loss == r_zero.loss);
    CHECK(g_absent == g_zero);
  }
  // The policy-gradient case by hand: adv = teacher - behav = 0.4 at every token, d loss / d logp = -adv.
  basic_objective_inputs<double> in{
      .layout = token_layout::padded(B, T), .mask = mask, .logp = lp, .behav_logp = behav};
  in.teacher_logp = view2d<const double>(teacher.data(), 1, B * T);
  std::vector<double> g(mask.size());
  (void)evaluate(objs[0], in, {.logp = g});
  for (std::size_t i = 0; i < g.size(); ++i) {
    INFO("token " << i);
    CHECK(g[i] == doctest::Approx(mask[i] != 0 ? -0.4 : 0.0).epsilon(1e-12));
  }
}

TEST_CASE("the SSE2, AVX2 and AVX-512 row kernels give identical bits") {
#if RLPT_OBJECTIVE_AVX2_CLONE()
  if (!detail::cpu_has_avx2_fma()) return;
  const batch<float> b(9, 300, 28, 0.4, 0.4);
  const std::vector<double> tw{0.5, 0.5};
  const objective objs[] = {
      {.policy = ppo_clip{},
       .correction = token_tis(2.0),
       .kl = {.coef = 0.1},
       .entropy = {.coef = 0.01},
       .value = {.coef = 0.5}},
      {.policy = gspo{.token_level = false}, .correction = seq_is(2.0), .agg = {.mode = agg_mode::seq_mean_token_mean}},
      {.policy = gmpo{}, .correction = icepop(0.5, 2.0), .agg = {.mode = agg_mode::seq_mean_token_sum}},
      {.policy = sapo{},
       .correction = {.reject = {.stat = rs_stat::k2, .level = rs_level::token, .hi = 0.2}},
       .kl = {.coef = 0.3, .estimator = kl_estimator::abs, .gradient = kl_gradient::k2_importance}},
      {.policy = cispo{},
       .kl = {.coef = 0.2, .estimator = kl_estimator::k3, .importance_corrected = true},
       .distill = {.coef = 0.5, .teacher_weights = tw}},
      {.policy = dppo{.eps_low = 0.05, .eps_high = 0.08}, .correction = token_tis(2.0)},
      {.policy = dppo{.divergence = dppo_divergence::binary_kl, .eps_low = 0.01, .eps_high = 0.02}},
      {.policy = dro{.beta = 1.5}, .correction = token_tis(2.0), .kl = {.coef = 0.1}},
      {.policy = vespo{}, .correction = seq_is(2.0)},
      {.policy = ppo_clip{},
       .correction = {.weight = {.level = is_level::token, .hi = 2.0, .batch_normalize = true, .batch_mean = 0.83}}},
      {.policy = ppo_clip{}, // every statistic at a sequence level (the row statistics pass)
       .correction = {.reject = {.stat = rs_stat::binary_kl, .level = rs_level::seq_max, .hi = 0.5},
                      .reject_also = {{{.stat = rs_stat::k3, .level = rs_level::seq_mean, .hi = 0.5},
                                       {.stat = rs_stat::ratio, .level = rs_level::seq_mean, .lo = 0.1, .hi = 10.0},
                                       {.stat = rs_stat::k1, .level = rs_level::seq_sum, .lo = 0.01, .hi = 100.0},
                                       {.stat = rs_stat::tv, .level = rs_level::seq_max, .hi = 0.9},
                                       {.stat = rs_stat::log_ratio, .level = rs_level::seq_mean, .lo = -2.0, .hi = 2.0},
                                       {.stat = rs_stat::k2, .level = rs_level::seq_sum, .hi = 100.0},
                                       {.stat = rs_stat::k3_inverse, .level = rs_level::seq_max, .hi = 5.0}}}}},
  };
  for (const objective& obj : objs) {
    const auto in = b.inputs();
    detail::objective_plan p = detail::make_plan(obj, in, basic_objective_grads<float>{});
    const detail::local_counts c = detail::count_local(p, in, host_executor{});
    for (detail::agg_plan* a : {&p.agg_policy, &p.agg_kl, &p.agg_entropy, &p.agg_value}) detail::resolve_local(*a, c);
    grads<float> g1(b.size()), g2(b.size()), g3(b.size());
    int avx512_rows = 0;
    for (index_t s = 0; s < b.B; ++s) {
      const detail::objective_sums s1 = detail::host_rows_default(p, in, g1.view(), nullptr, s, s + 1);
      const detail::objective_sums s2 = detail::host_rows_avx2(p, in, g2.view(), nullptr, s, s + 1);
      CHECK(s1.policy == s2.policy);
      CHECK(s1.kl == s2.kl);
      CHECK(s1.value == s2.value);
      CHECK(s1.clip_high == s2.clip_high);
#if RLPT_OBJECTIVE_AVX512_CLONE()
      if (detail::cpu_has_avx512()) {
        const detail::objective_sums s3 = detail::host_rows_avx512(p, in, g3.view(), nullptr, s, s + 1);
        CHECK(s1.policy == s3.policy);
        CHECK(s1.kl == s3.kl);
        CHECK(s1.value == s3.value);
        CHECK(s1.clip_high == s3.clip_high);
        ++avx512_rows;
      }
#endif
    }
    CHECK(g1.logp == g2.logp);
    CHECK(g1.values == g2.values);
    if (avx512_rows > 0) {
      CHECK(g1.logp == g3.logp);
      CHECK(g1.values == g3.values);
    }
    // The row statistics pass of every clone gives the same sums (count_local takes this CPU's).
    for (index_t s = 0; s < b.B; ++s) {
      detail::host_chunk_data<float> c1{}, c2{};
      const detail::row_stats r1 = detail::host_row_stats_with<float, detail::host_stages_default<float>>(p, in, s, c1);
      const detail::row_stats r2 = detail::host_row_stats_with<float, detail::host_stages_avx2<float>>(p, in, s, c2);
      std::vector<detail::row_stats> others{r2};
#if RLPT_OBJECTIVE_AVX512_CLONE()
      if (detail::cpu_has_avx512()) {
        detail::host_chunk_data<float> c3{};
        others.push_back(detail::host_row_stats_with<float, detail::host_stages_avx512<float>>(p, in, s, c3));
      }
#endif
      for (const detail::row_stats& r : others) {
        CHECK(r.len_keep == r1.len_keep);
        CHECK(r.sum_lr == r1.sum_lr);
        CHECK(r.sum_x == r1.sum_x);
        CHECK(r.sum_w == r1.sum_w);
        CHECK(r.sum_logw == r1.sum_logw);
        for (int i = 0; i < p.rs_count; ++i) {
          CHECK(r.rs_sum[i] == r1.rs_sum[i]);
          CHECK(r.rs_max[i] == r1.rs_max[i]);
        }
      }
    }
    // All rows in one call (one chunk object reused from row to row) give each row's bits.
    grads<float> g_all(b.size());
    (void)detail::host_rows_kernel<float>()(p, in, g_all.view(), nullptr, 0, b.B);
    CHECK(g_all.logp == g1.logp);
    CHECK(g_all.values == g1.values);
  }
#else
  MESSAGE("no AVX2 clone in this build");
#endif
}

TEST_CASE("the pass counting a call's own denominators takes this CPU's stage clone, as the rows do") {
  // It took the default stages before: on x86-64 SSE2 with a libm call per fma, three quarters of
  // a call with verl's rollout_rs.
  const auto rows = detail::host_rows_kernel<float>();
  const auto stats = detail::host_row_stats_kernel<float>();
  CHECK((rows == &detail::host_rows_default<float>) ==
        (stats == &detail::host_row_stats_with<float, detail::host_stages_default<float>>));
#if RLPT_OBJECTIVE_AVX2_CLONE()
  CHECK((rows == &detail::host_rows_avx2<float>) ==
        (stats == &detail::host_row_stats_with<float, detail::host_stages_avx2<float>>));
#endif
#if RLPT_OBJECTIVE_AVX512_CLONE()
  CHECK((rows == &detail::host_rows_avx512<float>) ==
        (stats == &detail::host_row_stats_with<float, detail::host_stages_avx512<float>>));
#endif
}

TEST_CASE("a call whose counts come from its rows' statistics gives the bits of one that computes them again") {
  // evaluate keeps the statistics count_local computes and the rows kernel reads them; here the
  // rows kernel computes its own, on every thread split.
  const batch<float> clean(48, 1024, 31, 0.3, 0.1); // rows in three chunks of 16 (evaluate's grain)
  batch<float> dirty = clean;
  dirty.lp[5] = std::numeric_limits<float>::quiet_NaN(); // a non-finite input for nonfinite::mask
  const objective objs[] = {
      {.policy = ppo_clip{}, // verl's rollout_rs "token_k3,seq_mean_k3": token and sequence rejection
       .correction = {.weight = {.level = is_level::token, .hi = 2.0},
                      .reject = {.stat = rs_stat::k3, .level = rs_level::token, .hi = 0.01},
                      .reject_also = {{{.stat = rs_stat::k3, .level = rs_level::seq_mean, .hi = 0.0052}}}},
       .kl = {.coef = 0.1}},
      {.policy = gspo{.token_level = false},
       .correction = {.weight = {.level = is_level::seq_product, .hi = 2.0},
                      .reject = {.stat = rs_stat::ratio, .level = rs_level::token, .lo = 0.5, .hi = 2.0}},
       .agg = {.mode = agg_mode::seq_mean_token_mean}},
      {.policy = gmpo{},
       .correction = {.reject = {.stat = rs_stat::binary_kl, .level = rs_level::seq_max, .hi = 0.5}},
       .agg = {.mode = agg_mode::seq_mean_token_sum},
       .nonfinite = nonfinite::mask},
      {.policy = gspo{.token_level = false}, .correction = seq_is(2.0), .nonfinite = nonfinite::mask},
  };
  thread_pool pool(3);
  for (const objective& obj : objs) {
    const batch<float>& b = obj.nonfinite == nonfinite::mask ? dirty : clean;
    const auto in = b.inputs();
    detail::objective_plan p = detail::make_plan(obj, in, basic_objective_grads<float>{});
    REQUIRE(detail::reuses_stats(p));
    const detail::local_counts c = detail::count_local(p, in, host_executor{});
    for (detail::agg_plan* a : {&p.agg_policy, &p.agg_kl, &p.agg_entropy, &p.agg_value}) detail::resolve_local(*a, c);
    grads<float> g0(b.size());
    const auto rows = detail::host_rows_kernel<float>();
    // evaluate's chunks of rows (its grain) and merge, the statistics computed by the rows kernel
    const detail::objective_sums s0 = host_executor{}.parallel_reduce(
        b.B, 16384 / b.L, detail::objective_sums{},
        [&](index_t b0, index_t b1) { return rows(p, in, g0.view(), nullptr, b0, b1); },
        [](detail::objective_sums& x, const detail::objective_sums& y) { x.merge(y); });
    const objective_result r0 = detail::finish_result(p, s0);
    for (const host_executor& ex : {host_executor{}, host_executor{&pool}}) {
      grads<float> g(b.size());
      const objective_result r = evaluate(obj, in, g.view(), ex);
      CHECK(r.loss == r0.loss);
      CHECK(r.policy_loss == r0.policy_loss);
      CHECK(r.kl_loss == r0.kl_loss);
      CHECK(r.rejected_frac == r0.rejected_frac);
      CHECK(r.is_weight_mean == r0.is_weight_mean);
      CHECK(r.loss_tokens == r0.loss_tokens);
      CHECK(r.nonfinite_tokens == r0.nonfinite_tokens);
      CHECK(g.logp == g0.logp);
    }
  }
}

namespace {

//! The device algorithm run on the host: the token stages on one token at a time (the device's
//! chunk of one, detail::inline_stages), rows assembled as the device kernels do (row pass, token
//! pass, GSPO coupling, row_sums), every token of a row in one tile.
objective_result scalar_reference(const objective& obj, const basic_objective_inputs<double>& in,
                                  std::vector<double>& grad) {
  const basic_objective_grads<double> gr{.logp = grad};
  detail::objective_plan p = detail::make_plan(obj, in, gr);
  const detail::local_counts counts = detail::count_local(p, in, host_executor{});
  for (detail::agg_plan* a : {&p.agg_policy, &p.agg_kl, &p.agg_entropy, &p.agg_value})
    detail::resolve_local(*a, counts);
  using stages = detail::inline_stages;
  // Zeroed: g++ 12 cannot see that every slot read was written first (-Wmaybe-uninitialized).
  detail::token_chunk<double, 1> c{};
  detail::zero_absent(p, in, c);
  detail::objective_sums total;
  for (index_t b = 0; b < in.layout.num_seqs(); ++b) {
    const index_t base = in.layout.begin(b), n = in.layout.length(b);
    detail::row_consts rc;
    if (p.need_row_pass) {
      detail::row_stats st;
      for (index_t t = 0; t < n; ++t) st = detail::row_stats_pass<stages>(p, in, b, base + t, 1, c, st);
      rc = detail::row_finish(p, st);
    } else {
      rc.len_loss = 1.0;
    }
    detail::row_alphas(p, rc);
    const auto k = detail::make_token_consts<double>(p, rc);
    detail::token_acc<double, std::uint32_t> a;
    for (index_t t = 0; t < n; ++t) a = detail::token_pass<stages>(p, k, in, gr, b, base + t, 1, c, a);
    const double num = p.coupled ? detail::coupling_numerator(p, rc, a.dcoef, a.kl) : 0.0;
    if (num != 0.0)
      for (index_t t = 0; t < n; ++t)
        detail::coupling_pass<stages>(p, k, in, gr, detail::sequence_coupling(rc, num), b, base + t, 1, c);
    total.merge(detail::row_sums(p, rc, a, /*head=*/true));
  }
  return detail::finish_result(p, total);
}

//! One objective of every policy kind, with corrections, KL modes, distillation, values and
//! aggregations spread over them.
std::vector<objective> every_kind() {
  static const std::vector<double> tw{0.25, 0.75}; // distill's teacher weights: a borrowed span
  std::vector<objective> v{
      {.policy = ppo_clip{.eps_high = 0.28},
       .correction = token_tis(2.0),
       .kl = {.coef = 0.1},
       .entropy = {.coef = 0.01},
       .value = {.coef = 0.5}},
      {.policy = ppo_clip{.dual_clip = 0.0, .delta = 2.0},
       .kl = {.coef = 0.2, .estimator = kl_estimator::k2, .gradient = kl_gradient::k2_importance},
       .agg = {.mode = agg_mode::seq_mean_token_mean, .len_eps = 1e-8}},
      {.policy = gspo{.token_level = false}, .correction = seq_is(2.0), .agg = {.mode = agg_mode::seq_mean_token_mean}},
      {.policy = gspo{},
       .correction = {.reject = {.stat = rs_stat::k3, .level = rs_level::seq_mean, .hi = 0.02}},
       .agg = {.mode = agg_mode::token_sum}},
      {.policy = gmpo{},
       .correction = icepop(0.5, 2.0),
       .agg = {.mode = agg_mode::seq_mean_token_sum, .count_empty_rows = true}},
      {.policy = sapo{},
       .correction = {.reject = {.stat = rs_stat::k1, .level = rs_level::token, .lo = 0.8, .hi = 1.25}},
       .kl = {.coef = 0.3, .estimator = kl_estimator::abs, .gradient = kl_gradient::straight_through}},
      {.policy = cispo{},
       .kl = {.coef = 0.2, .importance_corrected = true},
       .distill = {.coef = 0.5, .teacher_weights = tw},
       .agg = {.mode = agg_mode::seq_mean_token_sum_norm, .norm = 64.0}},
      {.policy = dppo{.eps_low = 0.05, .eps_high = 0.08}, .correction = token_tis(2.0)},
      {.policy = dppo{.divergence = dppo_divergence::binary_kl, .eps_low = 0.01, .eps_high = 0.02},
       .agg = {.mode = agg_mode::seq_mean_token_mean}},
      {.policy = dro{.beta = 0.5},
       .correction = {.reject = {.stat = rs_stat::k2, .level = rs_level::token, .hi = 0.3}},
       .agg = {.mode = agg_mode::seq_mean_token_sum}},
      {.policy = ppo_clip{},
       .correction = {.weight = {.level = is_level::token, .bound = is_bound::none},
                      .reject = {.stat = rs_stat::binary_kl, .level = rs_level::token, .hi = 0.01},
                      .rejected = rejected_tokens::zero_weight}},
      {.policy = cispo{},
       .correction = {.reject = {.stat = rs_stat::tv, .level = rs_level::seq_max, .hi = 0.2}},
       .agg = {.mode = agg_mode::seq_mean_token_mean}},
      {.policy = vespo{.k_pos = 1.5, .lambda_neg = 2.5},
       .correction = {.reject = {.stat = rs_stat::k1, .level = rs_level::token, .lo = 0.8, .hi = 1.25},
                      .rejected = rejected_tokens::removed},
       .kl = {.coef = 0.05}},
      {.policy = policy_gradient{},
       .correction = {.weight = {.level = is_level::token, .bound = is_bound::none},
                      .reject = {.stat = rs_stat::ratio, .level = rs_level::seq_mean, .lo = 0.9, .hi = 1.1},
                      .rejected = rejected_tokens::zero_weight}},
      {.policy = ppo_clip{},
       .correction = {.weight = {.level = is_level::token, .hi = 2.0},
                      .reject = {.stat = rs_stat::k2, .level = rs_level::token, .lo = 0.002, .hi = 0.2},
                      .reject_also = {{{.stat = rs_stat::k3, .level = rs_level::seq_mean, .hi = 0.05},
                                       {.stat = rs_stat::tv, .level = rs_level::seq_max, .hi = 0.2},
                                       {.stat = rs_stat::k1, .level = rs_level::token, .lo = 0.8, .hi = 1.25}}}},
       .kl = {.coef = 0.1}},
      {.policy = vespo{.fold_is_weight = true},
       .correction = {.weight = {.level = is_level::token, .bound = is_bound::mask, .lo = 0.6, .hi = 1.6},
                      .rejected = rejected_tokens::zero_weight},
       .agg = {.mode = agg_mode::token_sum}},
      {.policy = gspo{.token_level = false, .mean_advantage = true}, // AReaL GSPO
       .correction = {.weight = {.level = is_level::token, .bound = is_bound::none},
                      .reject = {.stat = rs_stat::log_ratio, .lo = -0.3, .hi = 0.25},
                      .reject_also = {{{.stat = rs_stat::k3_inverse, .level = rs_level::seq_max, .hi = 0.3}}},
                      .rejected = rejected_tokens::masked}},
      {.policy = sapo{.token_level = false, .mean_advantage = true}, // AReaL / TRL sequence-level SAPO
       .correction = {.weight = {.level = is_level::token, .hi = 2.0},
                      .reject = {.stat = rs_stat::k2, .level = rs_level::seq_mean, .hi = 0.05},
                      .rejected = rejected_tokens::masked},
       .entropy = {.coef = 0.01}},
      {.policy = gmpo{},
       .correction = {.weight = {.level = is_level::seq_geomean, .bound = is_bound::none},
                      .reject = {.stat = rs_stat::ratio, .level = rs_level::seq_max, .hi = 1.4},
                      .reject_also = {{{.stat = rs_stat::log_ratio, .level = rs_level::token, .lo = -0.35, .hi = 1.0}}},
                      .rejected = rejected_tokens::masked},
       .kl = {.coef = 0.1},
       .agg = {.mode = agg_mode::seq_mean_token_mean}},
      {.policy = no_policy{}, .value = {.coef = 1.0, .clip = 0.2, .huber_delta = 0.5}},
  };
  for (const objective& o : rlpt::test::shared_configurations()) v.push_back(o);
  return v;
}

//! Evaluates obj on b with the host pass and with scalar_reference (every slot, one token at a
//! time), checks that they agree, and returns the host pass's gradients.
grads<double> check_per_token_path(const objective& obj, const batch<double>& b) {
  grads<double> g(b.size());
  const objective_result want = evaluate(obj, b.inputs(), g.view());
  std::vector<double> got_grad(b.size(), -777.0);
  const objective_result got = scalar_reference(obj, b.inputs(), got_grad);
  CHECK(got.tokens == want.tokens);
  CHECK(got.loss == doctest::Approx(want.loss).epsilon(1e-12));
  CHECK(got.kl_loss == doctest::Approx(want.kl_loss).epsilon(1e-12));
  CHECK(got.value_loss == doctest::Approx(want.value_loss).epsilon(1e-12));
  CHECK(got.clip_frac_high == want.clip_frac_high);
  CHECK(got.rejected_frac == want.rejected_frac);
  CHECK(got.is_weight_max == doctest::Approx(want.is_weight_max).epsilon(1e-15));
  // The sequence form's coupling sums a row in another order: where it nearly cancels a token's own
  // gradient (the KL weighted by the sequence ratio, rows of 700), the rounding is relative to the
  // row's gradients, not to the token's: an absolute floor of 1e-16.
  for (std::size_t i = 0; i < b.size(); ++i)
    if (static_cast<index_t>(i) % b.stride < b.L) // not the stride gap
      CHECK(got_grad[i] == doctest::Approx(g.logp[i]).epsilon(1e-12).scale(1e-4));
  return g;
}

} // namespace

TEST_CASE("the device's per-token path (the token stages on chunks of one token) equals the vectorised host pass") {
  const batch<double> b(17, 90, 29, 0.4, 0.4);
  for (const objective& obj : every_kind()) {
    INFO("policy ", obj.policy.index());
    (void)check_per_token_path(obj, b);
  }
}

TEST_CASE("long rows with masked heads, tails and whole chunks: results as the per-token path, gradients zeroed") {
  // Rows of 700 slots span three host chunks (256, 256, 188): the host pass skips each chunk's
  // masked head and tail and every chunk without a valid token, the per-token path does not.
  batch<double> b(10, 700, 32, 0.4, 0.4);
  auto row_mask = [&](index_t s, auto valid) {
    for (index_t t = 0; t < b.L; ++t) b.mask[static_cast<std::size_t>(s * b.stride + t)] = valid(t) ? 1 : 0;
  };
  row_mask(0, [](index_t) { return true; });
  row_mask(1, [](index_t) { return false; });
  row_mask(2, [](index_t t) { return t >= 256 && t < 600; });               // first chunk masked whole
  row_mask(3, [](index_t t) { return t == 255; });                          // the last token of a chunk
  row_mask(4, [](index_t t) { return t == 256; });                          // the first token of a chunk
  row_mask(5, [](index_t t) { return t == 699; });                          // the row's last slot
  row_mask(6, [](index_t t) { return t >= 13 && t < 517 && t % 37 != 0; }); // head, tail and holes
  row_mask(7, [](index_t t) { return t >= 300 && t < 310; });               // inside one chunk
  row_mask(8, [](index_t t) { return t < 9 || t > 690; });                  // both ends of the row
  row_mask(9, [](index_t t) { return t % 256 == 7 || t % 256 == 248; });    // lone tokens, every chunk
  for (const objective& obj : every_kind()) {
    INFO("policy ", obj.policy.index());
    const grads<double> g = check_per_token_path(obj, b);
    for (std::size_t i = 0; i < b.size(); ++i) {
      if (static_cast<index_t>(i) % b.stride >= b.L || b.mask[i]) continue;
      CHECK(g.logp[i] == 0.0);
      CHECK(g.entropy[i] == 0.0);
      CHECK(g.values[i] == 0.0);
    }
  }
}

TEST_CASE("every term is invariant under a permutation of the tokens within a row") {
  // No term of the objective depends on a token's position in its row, so shuffling each row's
  // slots (every input with them) gives the same loss and metrics and the shuffled gradients.
  // A state carried from chunk to chunk or from pass to pass (rows of 700 slots: three chunks)
  // depends on position and breaks it; so does a chunk-skipping rule that drops a valid token.
  const batch<double> b(9, 700, 41, 0.4, 0.4);
  batch<double> s = b;
  std::mt19937_64 gen(20261205);
  std::vector<std::size_t> to(b.size()); // slot i of b goes to slot to[i] of s
  for (std::size_t i = 0; i < to.size(); ++i) to[i] = i;
  for (index_t r = 0; r < b.B; ++r) {
    const auto first = to.begin() + static_cast<std::ptrdiff_t>(r * b.stride);
    std::shuffle(first, first + static_cast<std::ptrdiff_t>(b.L), gen); // the stride gap stays
  }
  auto scatter = [&](auto& dst, const auto& src, std::size_t offset) {
    for (std::size_t i = 0; i < b.size(); ++i) dst[offset + to[i]] = src[offset + i];
  };
  for (auto member :
       {&batch<double>::lp, &batch<double>::old, &batch<double>::behav, &batch<double>::ref, &batch<double>::adv,
        &batch<double>::entropy, &batch<double>::values, &batch<double>::old_values, &batch<double>::returns})
    scatter(s.*member, b.*member, 0);
  scatter(s.mask, b.mask, 0);
  for (int k = 0; k < b.n_teachers; ++k) scatter(s.teachers, b.teachers, static_cast<std::size_t>(k) * b.size());
  std::vector<objective> objs = every_kind();
  static const std::vector<double> tw{0.5, 0.5};
  objs.push_back({.policy = ppo_clip{}, .distill = {.coef = 0.7, .teacher_weights = tw}}); // advantages absent
  for (std::size_t o = 0; o < objs.size(); ++o) {
    INFO("objective ", o);
    const bool no_adv = o + 1 == objs.size();
    basic_objective_inputs<double> in = b.inputs(), in_s = s.inputs();
    if (no_adv) in.adv = {}, in_s.adv = {};
    grads<double> g(b.size()), g_s(b.size());
    const objective_result r = evaluate(objs[o], in, g.view());
    const objective_result r_s = evaluate(objs[o], in_s, g_s.view());
    CHECK(r_s.tokens == r.tokens);
    CHECK(r_s.loss_tokens == r.loss_tokens);
    CHECK(r_s.clip_frac_high == doctest::Approx(r.clip_frac_high).epsilon(1e-14));
    CHECK(r_s.rejected_frac == doctest::Approx(r.rejected_frac).epsilon(1e-14));
    CHECK(r_s.loss == doctest::Approx(r.loss).epsilon(1e-11));
    CHECK(r_s.kl_loss == doctest::Approx(r.kl_loss).epsilon(1e-11));
    CHECK(r_s.value_loss == doctest::Approx(r.value_loss).epsilon(1e-11));
    int bad = 0;
    for (std::size_t i = 0; i < b.size(); ++i) {
      const double want = g.logp[i], got = g_s.logp[to[i]];
      if (!(std::abs(got - want) <= 1e-11 * std::max(1.0, std::abs(want)))) ++bad;
      if (g.values[i] != doctest::Approx(g_s.values[to[i]]).epsilon(1e-11)) ++bad;
    }
    CHECK(bad == 0);
  }
}

#if defined(__linux__)
#include "support/pages.hpp"

TEST_CASE("evaluate maps fresh gradient buffers in one call, the slots between padded rows included") {
  // One token per row, rows two pages apart: the rows store into every other page only, so a
  // page between two rows is mapped only if evaluate mapped the whole gradient first.
  const index_t stride = static_cast<index_t>(2 * test::page_size() / sizeof(float)), B = 256;
  const auto n = static_cast<std::size_t>(B * stride);
  const std::vector<float> lp(n, -1.0f), old(n, -1.1f), ref(n, -0.9f), adv(n, 0.5f), ent(n, 1.0f);
  const std::vector<mask_t> mask(n, 1);
  const objective_inputs in{.layout = token_layout::padded(B, 1, stride),
                            .mask = mask,
                            .logp = lp,
                            .old_logp = old,
                            .ref_logp = ref,
                            .adv = adv,
                            .entropy = ent};
  const objective obj = compat::verl::actor(
      {.use_kl_loss = true, .kl_loss_coef = 0.001, .kl_loss_type = "low_var_kl", .entropy_coeff = 0.01});
  const test::fresh_mapping gl(n * sizeof(float)), ge(n * sizeof(float));
  const objective_result r = evaluate(obj, in,
                                      {.logp = view<float>(gl.as<float>(), static_cast<index_t>(n)),
                                       .entropy = view<float>(ge.as<float>(), static_cast<index_t>(n))});
  CHECK(std::isfinite(r.loss));
  CHECK(gl.as<float>()[0] != 0.0f);
  CHECK(ge.as<float>()[0] != 0.0f);
  if (test::kernel_populates()) { // a kernel before 5.14: the mapping is a no-op
    CHECK(gl.resident() == gl.pages());
    CHECK(ge.resident() == ge.pages());
  }
}
#endif

TEST_CASE("host log polynomial: within 2 ulp of the true value, special values as std's") {
  // Every 1021st positive float (2.1 million, subnormals included). The exp is core's
  // (tests/core/test_exp.cpp).
  double worst_log = 0;
  for (std::uint32_t b = 1; b < 0x7f800000u; b += 1021) {
    float x;
    std::memcpy(&x, &b, sizeof x);
    worst_log = std::max(worst_log, ulps(detail::log_poly(x), std::log(static_cast<double>(x))));
  }
  MESSAGE("worst log_poly error ", worst_log, " ulp");
  CHECK(worst_log <= 2.0);
  constexpr float inf = std::numeric_limits<float>::infinity();
  CHECK(detail::log_poly(0.0f) == -inf);
  CHECK(detail::log_poly(inf) == inf);
  CHECK(detail::log_poly(1.0f) == 0.0f);
  CHECK(std::isnan(detail::log_poly(-1.0f)));
  CHECK(std::isnan(detail::log_poly(std::numeric_limits<float>::quiet_NaN())));
}

TEST_CASE(
    "rejected_tokens::masked: rejected tokens leave every term, GSPO's means included, and stay in the denominator") {
  // The same as no rejection on the mask without the rejected tokens, over the original count.
  const batch<double> b(19, 70, 41, 0.3, 0.25);
  const rejection band{.stat = rs_stat::log_ratio, .lo = -0.2, .hi = 0.15};
  std::vector<mask_t> kept = b.mask;
  double valid = 0.0, rejected = 0.0;
  for (std::size_t i = 0; i < b.size(); ++i) {
    if (b.mask[i] == 0) continue;
    valid += 1.0;
    const double lr = b.old[i] - b.behav[i];
    if (lr < band.lo || lr > band.hi) kept[i] = 0, rejected += 1.0;
  }
  REQUIRE(rejected > 0.1 * valid);
  REQUIRE(rejected < 0.6 * valid);
  for (const policy_term& pol : {policy_term{ppo_clip{}}, policy_term{gspo{.token_level = false}},
                                 policy_term{gspo{.token_level = false, .mean_advantage = true}}}) {
    INFO("policy ", pol.index());
    const objective masked{.policy = pol, .correction = {.reject = band, .rejected = rejected_tokens::masked}};
    objective plain{.policy = pol};
    plain.agg.global_tokens = valid; // the pre-rejection count
    grads<double> gm(b.size()), gp(b.size());
    const objective_result rm = evaluate(masked, b.inputs(), gm.view());
    basic_objective_inputs<double> in = b.inputs();
    in.mask = kept;
    const objective_result rp = evaluate(plain, in, gp.view());
    CHECK(rm.loss == doctest::Approx(rp.loss).epsilon(1e-13));
    CHECK(rm.loss_tokens == rp.tokens);
    CHECK(rm.rejected_frac == doctest::Approx(rejected / valid).epsilon(1e-15));
    for (std::size_t i = 0; i < b.size(); ++i)
      if (static_cast<index_t>(i) % b.stride < b.L)
        CHECK(gm.logp[i] == doctest::Approx(gp.logp[i]).epsilon(1e-12).scale(1e-12));
  }
  // Where no term reads a sequence statistic, masked and zero_weight agree, the per-row
  // denominators included.
  for (const agg_mode mode : {agg_mode::token_mean, agg_mode::seq_mean_token_mean, agg_mode::seq_mean_token_sum}) {
    INFO("agg mode ", static_cast<int>(mode));
    const objective zw{.correction = {.reject = band, .rejected = rejected_tokens::zero_weight}, .agg = {.mode = mode}};
    objective m = zw;
    m.correction.rejected = rejected_tokens::masked;
    grads<double> ga(b.size()), gb(b.size());
    const double la = evaluate(zw, b.inputs(), ga.view()).loss;
    CHECK(la == doctest::Approx(evaluate(m, b.inputs(), gb.view()).loss).epsilon(1e-14));
    CHECK(ga.logp == gb.logp);
  }
}

TEST_CASE("rejection_action::bound_weight: a sequence outside the criterion keeps its tokens, its weight bounded") {
  // Token sums, so rows add: the result is that of the rows inside the bounds with the raw weight
  // plus that of the rows outside them with the bounded one.
  const batch<double> b(41, 70, 43, 0.3, 0.03);
  // On the sum, a weight (the geometric mean) out of bounds has its product in them only for lo > 1.
  for (const auto& [level, lo, hi] :
       {std::tuple{rs_level::seq_max, 0.995, 1.06}, std::tuple{rs_level::seq_sum, 1.002, 1.3}}) {
    INFO("level ", static_cast<int>(level));
    std::vector<mask_t> inside = b.mask, outside = b.mask;
    int moved_inside = 0, moved_outside = 0; // rows whose weight a plain clamp would move
    for (index_t r = 0; r < b.B; ++r) {
      double mx = -std::numeric_limits<double>::infinity(), sum = 0.0, len = 0.0;
      for (index_t t = 0; t < b.L; ++t) {
        const auto i = static_cast<std::size_t>(r * b.stride + t);
        if (b.mask[i] == 0) continue;
        const double lr = b.old[i] - b.behav[i];
        mx = std::max(mx, lr), sum += lr, len += 1.0;
      }
      if (len == 0.0) continue;
      const double agg = std::exp(level == rs_level::seq_max ? mx : sum);
      const bool in = agg >= lo && agg <= hi;
      const double gm = std::exp(sum / len);
      if (gm < lo || gm > hi) ++(in ? moved_inside : moved_outside);
      for (index_t t = 0; t < b.stride; ++t) (in ? outside : inside)[static_cast<std::size_t>(r * b.stride + t)] = 0;
    }
    REQUIRE(moved_inside > 0);
    REQUIRE(moved_outside > 0);
    const is_weighting raw{.level = is_level::seq_geomean, .bound = is_bound::none};
    is_weighting bounded = raw;
    bounded.bound = is_bound::truncate, bounded.lo = lo, bounded.hi = hi;
    const objective obj{.correction = {.weight = bounded,
                                       .reject = {.stat = rs_stat::ratio, .level = level, .lo = lo, .hi = hi},
                                       .action = rejection_action::bound_weight},
                        .agg = {.mode = agg_mode::token_sum}};
    grads<double> g(b.size()), g_in(b.size()), g_out(b.size());
    const objective_result r = evaluate(obj, b.inputs(), g.view());
    basic_objective_inputs<double> in = b.inputs();
    in.mask = inside;
    const objective_result r_in = evaluate(objective{.correction = {.weight = raw}, .agg = obj.agg}, in, g_in.view());
    in.mask = outside;
    const objective_result r_out =
        evaluate(objective{.correction = {.weight = bounded}, .agg = obj.agg}, in, g_out.view());
    CHECK(r.loss == doctest::Approx(r_in.loss + r_out.loss).epsilon(1e-14));
    CHECK(r.loss_tokens == r_in.tokens + r_out.tokens);
    CHECK(r.rejected_frac == 0.0);
    for (std::size_t i = 0; i < b.size(); ++i)
      if (static_cast<index_t>(i) % b.stride < b.L) CHECK(g.logp[i] == g_in.logp[i] + g_out.logp[i]);
  }
}

TEST_CASE("gspo::mean_advantage: every token's advantage is its row's mean, equal to per-token for constant ones") {
  const batch<double> b(13, 50, 43);
  basic_objective_inputs<double> in = b.inputs();
  std::vector<double> mean_adv(b.size(), 0.0);
  for (index_t s = 0; s < b.B; ++s) {
    double sum = 0.0, n = 0.0;
    for (index_t t = 0; t < b.L; ++t)
      if (b.mask[static_cast<std::size_t>(s * b.stride + t)])
        sum += b.adv[static_cast<std::size_t>(s * b.stride + t)], n += 1.0;
    for (index_t t = 0; t < b.stride; ++t)
      mean_adv[static_cast<std::size_t>(s * b.stride + t)] = n > 0.0 ? sum / n : 0.0;
  }
  // Narrow clips: with the sequence ratio inside them the loss is linear in A and both agree.
  const objective mean{.policy = gspo{.eps_low = 0.02, .eps_high = 0.02, .token_level = false, .mean_advantage = true}};
  const objective own{.policy = gspo{.eps_low = 0.02, .eps_high = 0.02, .token_level = false}};
  grads<double> g1(b.size()), g2(b.size());
  const objective_result r1 = evaluate(mean, in, g1.view());
  in.adv = mean_adv;
  const objective_result r2 = evaluate(own, in, g2.view());
  CHECK(r1.loss == doctest::Approx(r2.loss).epsilon(1e-14));
  CHECK(r1.clip_frac_high == r2.clip_frac_high);
  for (std::size_t i = 0; i < b.size(); ++i)
    if (static_cast<index_t>(i) % b.stride < b.L)
      CHECK(g1.logp[i] == doctest::Approx(g2.logp[i]).epsilon(1e-13).scale(1e-13));
  // The batch mixes per-token advantages in: the flag changes the result.
  grads<double> g3(b.size());
  CHECK(evaluate(own, b.inputs(), g3.view()).loss != doctest::Approx(r1.loss).epsilon(1e-6));
}
