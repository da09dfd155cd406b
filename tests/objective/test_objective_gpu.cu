// SPDX-License-Identifier: Apache-2.0
// Device rlpt::evaluate against the host one on the same inputs (every configuration family,
// padded and packed layouts, global and local denominators), bit-for-bit determinism across
// runs, the workspace size query, and the device's error reporting (NaN loss + counts).
#include <rlpt/cuda/objective/evaluate.cuh>
#include <rlpt/cuda/workspace.cuh>
#include <rlpt/objective.hpp>

#include "batch.hpp"
#include "shared_configurations.hpp"
#include "support/device_buffer.cuh"
#include "support/errors.hpp"

#include <cuda_runtime_api.h>
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

using rlpt::test::batch;
using namespace rlpt;

namespace {

template <class T> using dbuf = rlpt::test::device_buffer<T>;

struct device_run {
  objective_result r{};
  std::vector<float> g_logp, g_entropy, g_values;
};

//! Copies a host batch to the device, evaluates there, copies everything back.
device_run run_device(const objective& obj, const batch<float>& b, bool packed_layout = false, bool no_mask = false) {
  dbuf<mask_t> mask(b.mask);
  dbuf<float> lp(b.lp), old(b.old), behav(b.behav), ref(b.ref), adv(b.adv), ent(b.entropy), val(b.values),
      vold(b.old_values), ret(b.returns), teach(b.teachers);
  dbuf<float> gl(b.size()), ge(b.size()), gv(b.size());
  dbuf<mask_t> in_den(b.in_denominator.empty() ? std::vector<mask_t>{1} : b.in_denominator);
  std::vector<index_t> offs;
  for (index_t s = 0; s <= b.B; ++s) offs.push_back(s * b.stride);
  dbuf<index_t> d_offs(offs);
  device_objective_inputs<float> in;
  in.layout = packed_layout ? device_token_layout::packed(d_offs.cview(), static_cast<index_t>(b.size()), b.stride)
                            : device_token_layout::padded(b.B, b.L, b.stride);
  if (!no_mask) in.mask = mask.cview(); // no mask: every token is valid
  in.logp = lp.cview();
  in.old_logp = old.cview();
  in.behav_logp = behav.cview();
  in.ref_logp = ref.cview();
  in.adv = adv.cview();
  in.entropy = ent.cview();
  in.values = val.cview();
  in.old_values = vold.cview();
  in.returns = ret.cview();
  in.teacher_logp = device_view2d<const float>(teach.data(), b.n_teachers, static_cast<index_t>(b.size()));
  if (!b.in_denominator.empty()) in.seq_in_denominator = in_den.cview();
  device_objective_grads<float> g{.logp = gl.view(), .entropy = ge.view(), .values = gv.view()};
  dbuf<objective_result> result(1);
  workspace ws;
  evaluate(obj, in, g, result.data(), ws, nullptr);
  CHECK(ws.bytes > 0);
  RLPT_CUDA_CHECK(cudaMalloc(&ws.data, ws.bytes));
  evaluate(obj, in, g, result.data(), ws, nullptr);
  RLPT_CUDA_CHECK(cudaDeviceSynchronize());
  RLPT_CUDA_CHECK(cudaFree(ws.data));
  device_run out;
  out.r = result.get()[0];
  out.g_logp = gl.get();
  out.g_entropy = ge.get();
  out.g_values = gv.get();
  return out;
}

void check_close(const char* what, double got, double want, double scale) {
  CHECK_MESSAGE(std::fabs(got - want) <= 2e-6 * std::fabs(want) + 1e-6 * scale, what, ": device ", got, " host ", want);
}

void compare(const objective& obj, const batch<float>& b, bool packed_layout = false) {
  test::grads<float> hg(b.size());
  auto in = b.inputs();
  std::vector<index_t> offs;
  for (index_t s = 0; s <= b.B; ++s) offs.push_back(s * b.stride);
  if (packed_layout) in.layout = token_layout::packed(offs);
  const objective_result h = evaluate(obj, in, hg.view());
  const device_run d = run_device(obj, b, packed_layout);
  const double scale = std::fabs(h.policy_loss) + std::fabs(h.kl_loss) + std::fabs(h.value_loss) + 1e-30;
  check_close("loss", d.r.loss, h.loss, scale);
  check_close("policy_loss", d.r.policy_loss, h.policy_loss, scale);
  check_close("kl_loss", d.r.kl_loss, h.kl_loss, std::fabs(h.kl_loss) + 1e-30);
  check_close("value_loss", d.r.value_loss, h.value_loss, std::fabs(h.value_loss) + 1e-30);
  CHECK(d.r.tokens == h.tokens);
  CHECK(d.r.loss_tokens == h.loss_tokens);
  CHECK(d.r.seqs == h.seqs);
  check_close("clip_frac_high", d.r.clip_frac_high, h.clip_frac_high, 1e-3);
  check_close("clip_frac_low", d.r.clip_frac_low, h.clip_frac_low, 1e-3);
  check_close("is_weight_mean", d.r.is_weight_mean, h.is_weight_mean, 1.0);
  check_close("rejected_frac", d.r.rejected_frac, h.rejected_frac, 1e-3);
  check_close("entropy_mean", d.r.entropy_mean, h.entropy_mean, 1.0);
  double gscale = 0.0;
  for (float x : hg.logp) gscale = std::max(gscale, static_cast<double>(std::fabs(x)));
  for (std::size_t i = 0; i < b.size(); ++i) {
    if (static_cast<index_t>(i) % b.stride >= b.L && !packed_layout) continue; // stride gap: not a layout slot
    if (!(std::fabs(d.g_logp[i] - hg.logp[i]) <= 1e-5 * std::fabs(hg.logp[i]) + 1e-6 * gscale)) {
      FAIL_CHECK("grad_logp[", i, "]: device ", d.g_logp[i], " host ", hg.logp[i]);
      break;
    }
    CHECK(d.g_entropy[i] == doctest::Approx(hg.entropy[i]).epsilon(1e-6));
    if (!(std::fabs(d.g_values[i] - hg.values[i]) <= 1e-5 * std::fabs(hg.values[i]) + 1e-7)) {
      FAIL_CHECK("grad_values[", i, "]: device ", d.g_values[i], " host ", hg.values[i]);
      break;
    }
  }
}

std::vector<objective> configurations() {
  static const std::vector<double> tw{0.25, 0.75};
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
      {.policy = dro{.beta = 0.5}, .correction = token_tis(2.0), .agg = {.mode = agg_mode::seq_mean_token_sum}},
      {.policy = vespo{}, .kl = {.coef = 0.1}, .agg = {.mode = agg_mode::seq_mean_token_mean}},
      {.policy = ppo_clip{},
       .correction = {.weight = {.level = is_level::token, .bound = is_bound::none},
                      .reject = {.stat = rs_stat::binary_kl, .level = rs_level::seq_mean, .hi = 0.01},
                      .rejected = rejected_tokens::zero_weight}},
      {.policy = policy_gradient{},
       .correction = {.weight = {.level = is_level::token, .bound = is_bound::none},
                      .reject = {.stat = rs_stat::ratio, .level = rs_level::seq_mean, .lo = 0.9, .hi = 1.1},
                      .rejected = rejected_tokens::zero_weight}},
      {.policy = ppo_clip{}, // several criteria (verl's comma-separated rollout_rs): two sequence maxima folded
       .correction = {.weight = {.level = is_level::token, .hi = 2.0},
                      .reject = {.stat = rs_stat::k2, .level = rs_level::token, .hi = 0.2},
                      .reject_also = {{{.stat = rs_stat::k3, .level = rs_level::seq_max, .hi = 0.3},
                                       {.stat = rs_stat::tv, .level = rs_level::seq_max, .hi = 0.2},
                                       {.stat = rs_stat::k1, .level = rs_level::seq_mean, .hi = 1.1}}}},
       .kl = {.coef = 0.1}},
      {.policy = vespo{.fold_is_weight = true}, // TRL vespo with the vLLM ratio
       .correction = {.weight = {.level = is_level::token, .bound = is_bound::mask, .lo = 0.6, .hi = 1.6},
                      .rejected = rejected_tokens::zero_weight},
       .kl = {.coef = 0.1}},
      {.policy = gspo{.token_level = false, .mean_advantage = true}, // AReaL GSPO with KL-metric rejection
       .correction = {.weight = {.level = is_level::token, .bound = is_bound::none},
                      .reject = {.stat = rs_stat::log_ratio, .lo = -0.3, .hi = 0.25},
                      .reject_also = {{{.stat = rs_stat::k3_inverse, .level = rs_level::seq_max, .hi = 0.3},
                                       {.stat = rs_stat::ratio, .level = rs_level::seq_max, .hi = 1.6}}},
                      .rejected = rejected_tokens::masked}},
      {.policy = sapo{.token_level = false, .mean_advantage = true}, // sequence-level SAPO (AReaL, TRL)
       .correction = {.weight = {.level = is_level::token, .hi = 2.0},
                      .reject = {.stat = rs_stat::k2, .level = rs_level::seq_mean, .hi = 0.05},
                      .rejected = rejected_tokens::masked},
       .entropy = {.coef = 0.01}},
      {.policy = no_policy{}, .value = {.coef = 1.0, .clip = 0.2, .huber_delta = 0.5}},
  };
  for (const objective& o : rlpt::test::shared_configurations()) v.push_back(o);
  return v;
}

} // namespace

TEST_CASE("device evaluate equals host evaluate for every configuration family (padded layout)") {
  const batch<float> b(37, 700, 41, 0.4, 0.3);
  for (const objective& obj : configurations()) compare(obj, b);
}

TEST_CASE("device evaluate equals host evaluate on packed layouts and with explicit global denominators") {
  const batch<float> b(13, 2100, 42, 0.3, 0.3); // rows longer than one 1024-token tile
  for (objective obj : configurations()) {
    compare(obj, b, /*packed=*/true);
    obj.agg = with_denominators(obj.agg, local_denominators(obj, b.inputs()) + loss_denominators{17.0, 3.0});
    compare(obj, b);
  }
}

TEST_CASE("device: seq_in_denominator leaves the marked sequences out of the denominators, as on the host") {
  batch<float> b(13, 2100, 48, 0.3, 0.3);
  b.in_denominator.assign(13, 1);
  b.in_denominator[0] = b.in_denominator[5] = b.in_denominator[6] = 0;
  for (objective obj : configurations()) {
    compare(obj, b);
    // Explicit global denominators are checked against the counted sequences: equal passes, one less fails.
    const loss_denominators own = local_denominators(obj, b.inputs());
    obj.agg = with_denominators(obj.agg, own);
    compare(obj, b);
    if (obj.agg.mode == agg_mode::token_mean) {
      obj.agg.global_tokens = own.tokens - 1.0;
      CHECK(run_device(obj, b).r.denominator_error == 1.0);
    }
  }
}

TEST_CASE("device: no mask means every token is valid, as on the host") {
  batch<float> b(9, 300, 47, 0.4, 0.3);
  for (auto& m : b.mask) m = 1; // the host runs with an all-ones mask, the device with none
  for (const objective& obj : configurations()) {
    test::grads<float> hg(b.size());
    const objective_result h = evaluate(obj, b.inputs(), hg.view());
    const device_run d = run_device(obj, b, /*packed=*/false, /*no_mask=*/true);
    CHECK(d.r.tokens == h.tokens);
    CHECK(d.r.loss_tokens == h.loss_tokens);
    const double scale = std::fabs(h.policy_loss) + std::fabs(h.kl_loss) + std::fabs(h.value_loss) + 1e-30;
    check_close("loss", d.r.loss, h.loss, scale);
    double gscale = 0.0;
    for (float x : hg.logp) gscale = std::max(gscale, static_cast<double>(std::fabs(x)));
    for (std::size_t i = 0; i < b.size(); ++i) {
      if (static_cast<index_t>(i) % b.stride >= b.L) continue; // stride gap: not a layout slot
      if (!(std::fabs(d.g_logp[i] - hg.logp[i]) <= 1e-5 * std::fabs(hg.logp[i]) + 1e-6 * gscale)) {
        FAIL_CHECK("grad_logp[", i, "]: device ", d.g_logp[i], " host ", hg.logp[i]);
        break;
      }
    }
  }
}

TEST_CASE("device results are bit-identical across runs") {
  const batch<float> b(64, 900, 43);
  for (const objective& obj : configurations()) {
    const device_run a = run_device(obj, b);
    const device_run c = run_device(obj, b);
    CHECK(std::memcmp(&a.r, &c.r, sizeof(objective_result)) == 0);
    CHECK(a.g_logp == c.g_logp);
  }
}

TEST_CASE("device workspace: size query, and a too-small workspace is an error") {
  const batch<float> b(4, 50, 44);
  dbuf<mask_t> mask(b.mask);
  dbuf<float> lp(b.lp), old(b.old), adv(b.adv);
  dbuf<objective_result> result(1);
  device_objective_inputs<float> in{.layout = device_token_layout::padded(b.B, b.L, b.stride),
                                    .mask = mask.cview(),
                                    .logp = lp.cview(),
                                    .old_logp = old.cview(),
                                    .adv = adv.cview()};
  workspace ws;
  evaluate(objective{}, in, device_objective_grads<float>{}, result.data(), ws, nullptr);
  REQUIRE(ws.bytes > 0);
  dbuf<char> small(16);
  workspace tiny{small.data(), 16};
  RLPT_CHECK_ERROR(evaluate(objective{}, in, device_objective_grads<float>{}, result.data(), tiny, nullptr),
                   "rlpt.cuda.workspace_too_small", "workspace has 16 bytes");
  auto no_old = in;
  no_old.old_logp = {};
  workspace q;
  RLPT_CHECK_ERROR(evaluate(objective{}, no_old, device_objective_grads<float>{}, result.data(), q, nullptr),
                   "rlpt.objective.missing_input", "ppo_clip needs old_logp");
}

TEST_CASE("device reports non-finite inputs and short global denominators through the result") {
  batch<float> b(6, 80, 45);
  std::size_t at = 0;
  while (!b.mask[at]) ++at;
  b.old[at] = std::numeric_limits<float>::quiet_NaN();
  const device_run raise = run_device(objective{}, b);
  CHECK(std::isnan(raise.r.loss));
  CHECK(raise.r.nonfinite_tokens == 1.0);
  const device_run skip = run_device(objective{.nonfinite = nonfinite::mask}, b);
  CHECK(std::isfinite(skip.r.loss));
  CHECK(skip.r.nonfinite_tokens == 1.0);
  const batch<float> c(6, 80, 46);
  const device_run shortd = run_device(objective{.agg = {.global_tokens = 3.0}}, c);
  CHECK(shortd.r.denominator_error == 1.0);
  CHECK(std::isnan(shortd.r.loss));
}
