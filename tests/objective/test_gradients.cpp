// SPDX-License-Identifier: Apache-2.0
// fp64 finite-difference checks of every differentiated term under every aggregation, and the
// analytic gradients of the terms whose gradient is by design not the derivative of their value
// (detached weights, straight-through KL, GSPO-token, CISPO).
#include <rlpt/objective.hpp>

#include "batch.hpp"
#include "support/reference.hpp"

#include <doctest/doctest.h>
#include <fmt/format.h>

#include <cmath>
#include <string>
#include <vector>

using rlpt::test::batch;
using rlpt::test::grads;

namespace {

using namespace rlpt;

const agg_mode all_modes[] = {agg_mode::token_mean, agg_mode::token_sum, agg_mode::seq_mean_token_sum,
                              agg_mode::seq_mean_token_mean, agg_mode::seq_mean_token_sum_norm};

aggregation agg_of(agg_mode m) {
  aggregation a{.mode = m, .norm = 11.0, .factor = 1.7};
  if (m == agg_mode::seq_mean_token_mean) a.len_eps = 1e-8;
  return a;
}

enum class wrt { logp, entropy, values };

//! Central differences of the total loss with respect to every valid slot of one input.
std::string fd_check(const objective& obj, batch<double> b, wrt which, double rel = 2e-7) {
  std::vector<double>* x = which == wrt::logp ? &b.lp : which == wrt::entropy ? &b.entropy : &b.values;
  grads<double> g(b.size());
  evaluate(obj, b.inputs(), g.view());
  const std::vector<double>& grad = which == wrt::logp ? g.logp : which == wrt::entropy ? g.entropy : g.values;
  double scale = 0.0;
  for (std::size_t i = 0; i < b.size(); ++i)
    if (b.mask[i]) scale = std::max(scale, std::fabs(grad[i]));
  int checked = 0;
  for (std::size_t i = 0; i < b.size(); ++i) {
    if (!b.mask[i]) continue;
    const double x0 = (*x)[i];
    const double h = 1e-6 * std::max(1.0, std::fabs(x0));
    (*x)[i] = x0 + h;
    const double lp = evaluate(obj, b.inputs()).loss;
    (*x)[i] = x0 - h;
    const double lm = evaluate(obj, b.inputs()).loss;
    (*x)[i] = x0;
    const double fd = (lp - lm) / (2.0 * h);
    ++checked;
    if (!(std::fabs(fd - grad[i]) <= rel * std::fabs(grad[i]) + 1e-6 * scale + 1e-10))
      return fmt::format("slot {}: analytic {:.12g}, finite difference {:.12g}", i, grad[i], fd);
  }
  if (checked == 0) return "no valid slot";
  return {};
}

void check_fd(const char* what, const objective& obj, const batch<double>& b, wrt which = wrt::logp) {
  const std::string m = fd_check(obj, b, which);
  CHECK_MESSAGE(m.empty(), std::string(what), ": ", m);
}

} // namespace

TEST_CASE("finite differences: PPO clip (clip-higher, dual clip, delta) under every aggregation") {
  const batch<double> b(6, 10, 1);
  for (agg_mode m : all_modes) {
    INFO("aggregation ", name(m));
    check_fd("ppo", {.policy = ppo_clip{.eps_low = 0.2, .eps_high = 0.28}, .agg = agg_of(m)}, b);
    check_fd("ppo dual off", {.policy = ppo_clip{.dual_clip = 0.0}, .agg = agg_of(m)}, b);
    check_fd("ppo delta", {.policy = ppo_clip{.dual_clip = 0.0, .delta = 1.3}, .agg = agg_of(m)}, b);
  }
}

TEST_CASE("finite differences: GSPO and SAPO sequence forms, SAPO, policy gradient under every aggregation") {
  const batch<double> b(6, 10, 2);
  for (agg_mode m : all_modes) {
    INFO("aggregation ", name(m));
    check_fd("gspo sequence", {.policy = gspo{.token_level = false}, .agg = agg_of(m)}, b);
    check_fd("gspo sequence dual", {.policy = gspo{.token_level = false, .dual_clip = 2.0}, .agg = agg_of(m)}, b);
    check_fd("gspo summed log-ratio",
             {.policy = gspo{.eps_low = 0.1, .token_level = false, .length_normalized = false}, .agg = agg_of(m)}, b);
    check_fd("sapo", {.policy = sapo{}, .agg = agg_of(m)}, b);
    check_fd("sapo sequence", {.policy = sapo{.token_level = false}, .agg = agg_of(m)}, b);
    check_fd("sapo sequence, mean advantages",
             {.policy = sapo{.tau_neg = 2.0, .token_level = false, .mean_advantage = true}, .agg = agg_of(m)}, b);
    check_fd("policy_gradient", {.policy = policy_gradient{}, .agg = agg_of(m)}, b);
  }
}

TEST_CASE("finite differences: GMPO under the sequence aggregations") {
  const batch<double> b(6, 10, 3, 0.5);
  for (agg_mode m : {agg_mode::seq_mean_token_sum, agg_mode::seq_mean_token_mean}) {
    for (bool empty_rows : {false, true}) {
      aggregation a = agg_of(m);
      a.count_empty_rows = empty_rows;
      check_fd("gmpo", {.policy = gmpo{.eps_low = 0.3, .eps_high = 0.4}, .agg = a}, b);
      check_fd("gmpo with token IS", {.policy = gmpo{}, .correction = token_tis(1.5), .agg = a}, b);
    }
  }
}

TEST_CASE("finite differences: KL estimators (natural gradients, importance corrected) under every aggregation") {
  const batch<double> b(5, 9, 4);
  for (agg_mode m : all_modes) {
    INFO("aggregation ", name(m));
    for (kl_estimator e : {kl_estimator::k1, kl_estimator::abs, kl_estimator::k2, kl_estimator::k3}) {
      INFO("estimator ", name(e));
      check_fd("kl",
               {.policy = no_policy{}, .kl = {.coef = 0.7, .estimator = e, .output_clamp = 0.0}, .agg = agg_of(m)}, b);
      check_fd("kl clamped",
               {.policy = no_policy{},
                .kl = {.coef = 0.7, .estimator = e, .k3_x_min = -0.5, .k3_x_max = 0.5, .output_clamp = 0.3},
                .agg = agg_of(m)},
               b);
      check_fd(
          "kl importance corrected",
          {.policy = no_policy{}, .kl = {.coef = 0.7, .estimator = e, .importance_corrected = true}, .agg = agg_of(m)},
          b);
    }
  }
}

TEST_CASE("finite differences: entropy and value terms under every aggregation") {
  const batch<double> b(5, 9, 5);
  for (agg_mode m : all_modes) {
    INFO("aggregation ", name(m));
    const objective ent{.policy = ppo_clip{}, .entropy = {.coef = 0.03}, .agg = agg_of(m)};
    check_fd("entropy wrt entropy", ent, b, wrt::entropy);
    check_fd("entropy objective wrt logp", ent, b, wrt::logp);
    for (double clip : {0.0, 0.5})
      for (double huber : {0.0, 0.7})
        for (bool half : {false, true})
          check_fd("value",
                   {.policy = no_policy{},
                    .value = {.coef = 0.5, .clip = clip, .half = half, .huber_delta = huber},
                    .agg = agg_of(m)},
                   b, wrt::values);
  }
}

TEST_CASE("finite differences: corrections (their weights depend only on old/behaviour log-probs)") {
  const batch<double> b(6, 10, 6, 0.3, 0.4);
  const off_policy_correction corrections[] = {
      token_tis(1.5),
      icepop(0.7, 1.4),
      seq_is(3.0),
      seq_geo_is(1.2, is_bound::mask, 0.8),
      {.reject = {.stat = rs_stat::k1, .level = rs_level::token, .lo = 0.7, .hi = 1.5}},
      {.reject = {.stat = rs_stat::k3, .level = rs_level::seq_mean, .hi = 0.05}},
      {.reject = {.stat = rs_stat::k2, .level = rs_level::seq_max, .hi = 0.1},
       .rejected = rejected_tokens::zero_weight},
      {.weight = {.level = is_level::token, .bound = is_bound::none},
       .reject = {.stat = rs_stat::ratio, .level = rs_level::seq_mean, .lo = 0.9, .hi = 1.1}},
  };
  for (const auto& c : corrections) {
    for (agg_mode m : {agg_mode::token_mean, agg_mode::seq_mean_token_mean}) {
      check_fd(
          "ppo + correction + kl + entropy",
          {.policy = ppo_clip{}, .correction = c, .kl = {.coef = 0.1}, .entropy = {.coef = 0.01}, .agg = agg_of(m)}, b);
      check_fd("gspo sequence + correction", {.policy = gspo{.token_level = false}, .correction = c, .agg = agg_of(m)},
               b);
      check_fd("sapo sequence + correction", {.policy = sapo{.token_level = false}, .correction = c, .agg = agg_of(m)},
               b);
    }
  }
}

TEST_CASE("finite differences: distillation advantage (behaviour student) and per-term aggregation overrides") {
  const batch<double> b(5, 9, 7);
  const std::vector<double> w{0.3, 0.7};
  check_fd("distill",
           {.policy = ppo_clip{}, .distill = {.coef = 0.8, .teacher_weights = w}, .agg = agg_of(agg_mode::token_mean)},
           b);
  objective o{.policy = sapo{}, .kl = {.coef = 0.2}, .entropy = {.coef = 0.05}, .agg = agg_of(agg_mode::token_mean)};
  o.policy_agg = agg_of(agg_mode::seq_mean_token_mean);
  o.entropy_agg = agg_of(agg_mode::token_sum);
  check_fd("overrides", o, b);
  check_fd("overrides wrt entropy", o, b, wrt::entropy);
}

TEST_CASE("analytic gradients of detached and straight-through terms") {
  const batch<double> b(5, 9, 8, 0.3, 0.4);
  const auto in = b.inputs();
  // Token-mean with explicit N: alpha = 1 / N for every token.
  const double N = 29.0;
  const aggregation a{.mode = agg_mode::token_mean, .global_tokens = N};

  SUBCASE("CISPO: -sg(clamp(r)) A") {
    grads<double> g(b.size());
    evaluate(objective{.policy = cispo{.eps_low = 0.1, .eps_high = 0.2}, .agg = a}, in, g.view());
    for (std::size_t i = 0; i < b.size(); ++i) {
      if (!b.mask[i]) continue;
      const double r = std::exp(b.lp[i] - b.old[i]);
      const double w = std::clamp(r, 0.9, 1.2);
      CHECK(g.logp[i] == doctest::Approx(-w * b.adv[i] / N).epsilon(1e-13));
    }
  }
  SUBCASE("straight-through KL: value of the estimator, gradient of k2") {
    for (kl_estimator e : {kl_estimator::k1, kl_estimator::abs, kl_estimator::k3}) {
      grads<double> g(b.size());
      const objective st{.policy = no_policy{},
                         .kl = {.coef = 1.0, .estimator = e, .gradient = kl_gradient::straight_through},
                         .agg = a};
      const objective nat{.policy = no_policy{}, .kl = {.coef = 1.0, .estimator = e}, .agg = a};
      const auto r_st = evaluate(st, in, g.view());
      CHECK(r_st.loss == doctest::Approx(evaluate(nat, in).loss).epsilon(1e-15));
      for (std::size_t i = 0; i < b.size(); ++i)
        if (b.mask[i]) CHECK(g.logp[i] == doctest::Approx((b.lp[i] - b.ref[i]) / N).epsilon(1e-13));
    }
  }
  SUBCASE("importance-weighted k2 gradient (OpenRLHF unbiased_gradient)") {
    grads<double> g(b.size());
    evaluate(
        objective{
            .policy = no_policy{},
            .kl = {.coef = 1.0, .estimator = kl_estimator::k3, .gradient = kl_gradient::k2_importance, .is_cap = 1.1},
            .agg = a},
        in, g.view());
    for (std::size_t i = 0; i < b.size(); ++i) {
      if (!b.mask[i]) continue;
      const double w = std::min(std::exp(b.lp[i] - b.old[i]), 1.1);
      CHECK(g.logp[i] == doctest::Approx(w * (b.lp[i] - b.ref[i]) / N).epsilon(1e-13));
    }
  }
  SUBCASE("GSPO-token: s_i times the token's own clip derivative, no coupling") {
    grads<double> g(b.size());
    evaluate(objective{.policy = gspo{.eps_low = 0.5, .eps_high = 0.5}, .agg = a}, in, g.view());
    for (index_t s = 0; s < b.B; ++s) {
      double sum = 0.0, n = 0.0;
      for (index_t t = 0; t < b.L; ++t) {
        const auto i = static_cast<std::size_t>(s * b.stride + t);
        if (b.mask[i]) sum += b.lp[i] - b.old[i], n += 1.0;
      }
      const double si = std::exp(sum / std::max(n, 1.0));
      for (index_t t = 0; t < b.L; ++t) {
        const auto i = static_cast<std::size_t>(s * b.stride + t);
        if (!b.mask[i]) continue;
        const double A = b.adv[i];
        const bool clipped = (A > 0 && si > 1.5) || (A < 0 && si < 0.5);
        CHECK(g.logp[i] == doctest::Approx(clipped ? 0.0 : -A * si / N).epsilon(1e-12));
      }
    }
  }
  SUBCASE("bypass mode: the weight sg(pi_theta)/pi_behav scales the gradient but is not differentiated") {
    grads<double> g(b.size());
    const off_policy_correction c{.weight = {.level = is_level::token, .bound = is_bound::truncate, .hi = 1.3},
                                  .numerator = ratio_numerator::current};
    evaluate(objective{.policy = policy_gradient{}, .correction = c, .agg = a}, in, g.view());
    for (std::size_t i = 0; i < b.size(); ++i) {
      if (!b.mask[i]) continue;
      const double w = std::min(std::exp(b.lp[i] - b.behav[i]), 1.3);
      CHECK(g.logp[i] == doctest::Approx(-w * b.adv[i] / N).epsilon(1e-13));
    }
  }
}
