// SPDX-License-Identifier: Apache-2.0
// rlpt against OpenRLHF 0.11.2 (compute_advantages_and_returns end to end, with its length
// penalties, reward clip and token whitening) and TRL 1.16.0 (GRPO / RLOO advantage formulas
// with TRL's nanstd, soft overlong punishment).
#include "common.hpp"

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

namespace {

using rlpt::test::at_valid;
using rlpt::test::tolerance;
using rlpt::test::vs_f32;
using rlpt::test::vs_f64;

struct openrlhf_case {
  rlpt::test::golden_file file = rlpt::test::advantage_golden("openrlhf.bin");
  std::vector<std::uint8_t> mask = file.get<std::uint8_t>("mask");
  std::vector<float> rewards = file.get<float>("rewards");
  std::vector<float> values = file.get<float>("values");
  std::vector<rlpt::index_t> lengths = file.get<rlpt::index_t>("lengths");
  std::vector<std::uint8_t> truncated = file.get<std::uint8_t>("truncated");
  rlpt::index_t B = static_cast<rlpt::index_t>(file["mask"].shape[0]);
  rlpt::index_t T = static_cast<rlpt::index_t>(file["mask"].shape[1]);
  rlpt::token_layout layout = rlpt::token_layout::padded(B, T);
  rlpt::groups groups = rlpt::groups::uniform(B, 4); // n_samples_per_prompt = 4, prompt order

  //! The valid-token values OpenRLHF produced for `name` (float64 or float32 run).
  std::vector<double> want(const std::string& name) const { return at_valid(file.get<double>(name), mask); }

  //! OpenRLHF's outcome path after the baseline: clip to (-10, 10), put R on the last valid
  //! token, gamma = 1 cumulative return = R on every valid token.
  std::vector<double> outcome_tokens(std::vector<float> seq) const {
    rlpt::transform_rewards(seq, rlpt::compat::openrlhf::clip());
    std::vector<float> tok(static_cast<std::size_t>(B * T));
    rlpt::broadcast_to_tokens(layout, seq, mask, tok);
    return at_valid(tok, mask);
  }
};

} // namespace

TEST_CASE("openrlhf golden: group_norm, dr_grpo, rloo baselines") {
  openrlhf_case c;
  std::vector<float> adv(static_cast<std::size_t>(c.B));
  (void)rlpt::grpo_advantages(c.rewards, c.groups, adv, rlpt::compat::openrlhf::group_norm());
  ADV_CHECK_CLOSE(c.outcome_tokens(adv), c.want("group_norm_adv_f64"), vs_f64);
  ADV_CHECK_CLOSE(c.outcome_tokens(adv), c.want("group_norm_adv_f32"), vs_f32);
  (void)rlpt::grpo_advantages(c.rewards, c.groups, adv, rlpt::compat::openrlhf::dr_grpo());
  ADV_CHECK_CLOSE(c.outcome_tokens(adv), c.want("dr_grpo_adv_f64"), vs_f64);
  ADV_CHECK_CLOSE(c.outcome_tokens(adv), c.want("dr_grpo_adv_f32"), vs_f32);
  (void)rlpt::rloo_advantages(c.rewards, c.groups, adv, rlpt::compat::openrlhf::rloo());
  ADV_CHECK_CLOSE(c.outcome_tokens(adv), c.want("rloo_adv_f64"), vs_f64);
  ADV_CHECK_CLOSE(c.outcome_tokens(adv), c.want("rloo_adv_f32"), vs_f32);
}

TEST_CASE("openrlhf golden: overlong penalty and stop-properly penalty before group_norm") {
  openrlhf_case c;
  struct variant {
    std::string name;
    double factor;
    double coef;
  };
  for (const variant& v :
       {variant{"shaped_group_norm_adv", 0.5, 0.3}, variant{"shaped_neg_group_norm_adv", 2.0, -0.5}}) {
    CAPTURE(v.name);
    std::vector<float> r = c.rewards, adv(r.size());
    CHECK(rlpt::apply_overlong_penalty(c.lengths, r, rlpt::compat::openrlhf::overlong(c.T, 8, v.factor)) > 0);
    CHECK(rlpt::apply_truncation(c.truncated, r, rlpt::compat::openrlhf::stop_properly(v.coef)) > 0);
    (void)rlpt::grpo_advantages(r, c.groups, adv, rlpt::compat::openrlhf::group_norm());
    ADV_CHECK_CLOSE(c.outcome_tokens(adv), c.want(v.name + "_f64"), vs_f64);
    ADV_CHECK_CLOSE(c.outcome_tokens(adv), c.want(v.name + "_f32"), vs_f32);
  }
}

TEST_CASE("openrlhf golden: reinforce_baseline (group mean, biased token whitening)") {
  openrlhf_case c;
  std::vector<float> adv(static_cast<std::size_t>(c.B * c.T));
  const auto r = rlpt::reinforce_pp_baseline_advantages(c.rewards, c.groups, c.layout, c.mask, adv,
                                                        rlpt::compat::openrlhf::reinforce_baseline());
  REQUIRE(r.whitening.has_value());
  CHECK(r.whitening->stats.count == static_cast<double>(at_valid(c.mask, c.mask).size()));
  // OpenRLHF whitens in float32 even in its float64 run: 1e-6 absolute.
  ADV_CHECK_CLOSE(at_valid(adv, c.mask), c.want("reinforce_baseline_adv_f64"), (tolerance{1e-6, 1e-6}));
  ADV_CHECK_CLOSE(at_valid(adv, c.mask), c.want("reinforce_baseline_adv_f32"), vs_f32);
}

TEST_CASE("openrlhf golden: reinforce (KL in reward, zero-mode discounted return, whitening)") {
  openrlhf_case c;
  for (const std::string run : {"f64", "f32"}) {
    CAPTURE(run);
    const auto tok = c.file.get<float>("token_rewards_" + run);
    std::vector<float> adv(tok.size()), ret(tok.size());
    (void)rlpt::reinforce_pp_advantages(c.layout, tok, c.mask, adv, ret, rlpt::compat::openrlhf::reinforce(0.98));
    const tolerance tol = run == "f64" ? tolerance{1e-6, 1e-6} : vs_f32;
    ADV_CHECK_CLOSE(at_valid(adv, c.mask), c.want("reinforce_adv_" + run), tol);
    ADV_CHECK_CLOSE(at_valid(ret, c.mask), c.want("reinforce_ret_" + run), tol);
  }
}

TEST_CASE("openrlhf golden: gae (zero-mode masking, gamma 0.99, lambda 0.95, whitening / no_std_norm)") {
  openrlhf_case c;
  for (const std::string run : {"f64", "f32"}) {
    CAPTURE(run);
    const auto tok = c.file.get<float>("token_rewards_" + run);
    const tolerance tol = run == "f64" ? tolerance{1e-6, 1e-6} : vs_f32;
    std::vector<float> adv(tok.size()), ret(tok.size());
    const rlpt::gae_inputs in{.layout = c.layout, .rewards = tok, .values = c.values, .mask = c.mask};
    (void)rlpt::gae(in, adv, ret, rlpt::compat::openrlhf::gae(0.99, 0.95));
    ADV_CHECK_CLOSE(at_valid(adv, c.mask), c.want("gae_adv_" + run), tol);
    ADV_CHECK_CLOSE(at_valid(ret, c.mask), c.want("gae_ret_" + run), tol);
    auto o = rlpt::compat::openrlhf::gae(1.0, 0.9);
    o.whiten = rlpt::compat::openrlhf::whiten(/*no_std_norm=*/true);
    (void)rlpt::gae(in, adv, {}, o);
    ADV_CHECK_CLOSE(at_valid(adv, c.mask), c.want("gae_nostd_adv_" + run), tol);
  }
}

namespace {

struct trl_case {
  rlpt::test::golden_file file = rlpt::test::advantage_golden("trl.bin");
  std::vector<float> per_func = file.get<float>("per_func");
  std::vector<float> weights = file.get<float>("weights");
  rlpt::index_t B = static_cast<rlpt::index_t>(file["per_func"].shape[0]);
  rlpt::index_t K = static_cast<rlpt::index_t>(file["per_func"].shape[1]);
  rlpt::groups groups = rlpt::groups::uniform(B, file.get<rlpt::index_t>("num_generations")[0]);
  rlpt::view2d<const float> channels() const { return {per_func.data(), B, K}; }
  //! Rows whose every reward function returned None (NaN).
  rlpt::index_t unscorable() const {
    rlpt::index_t n = 0;
    for (rlpt::index_t b = 0; b < B; ++b) {
      bool all = true;
      for (rlpt::index_t k = 0; k < K; ++k) all = all && std::isnan(per_func[static_cast<std::size_t>(b * K + k)]);
      n += all ? 1 : 0;
    }
    return n;
  }
};

} // namespace

TEST_CASE("trl golden: sum_then_normalize with scale_rewards group / batch / none, unscorable samples") {
  trl_case c;
  std::vector<float> summed(static_cast<std::size_t>(c.B)), adv(summed.size());
  REQUIRE(c.unscorable() >= 2);
  CHECK(rlpt::combine_reward_channels(c.channels(), c.weights, summed, rlpt::compat::trl::channels()) ==
        c.unscorable());
  ADV_CHECK_CLOSE(summed, c.file.get<float>("summed"), vs_f32);
  struct variant {
    const char* scale_rewards; // TRL's own spelling
    std::string name;
  };
  for (const variant& v : {variant{"group", "sum_group"}, variant{"batch", "sum_batch"}, variant{"none", "sum_none"}}) {
    CAPTURE(v.name);
    const rlpt::group_stats s = rlpt::grpo_advantages(summed, c.groups, adv, rlpt::compat::trl::grpo(v.scale_rewards));
    CHECK(s.num_nonfinite == c.unscorable());
    ADV_CHECK_CLOSE(adv, c.file.get<float>(v.name), vs_f32);
  }
}

TEST_CASE("trl golden: normalize_then_sum (GDPO) and RLOO (with normalize_advantages)") {
  trl_case c;
  std::vector<float> adv(static_cast<std::size_t>(c.B)), summed(adv.size());
  const auto r = rlpt::gdpo_advantages(c.channels(), c.weights, c.groups, adv, rlpt::compat::trl::gdpo());
  CHECK(r.num_unscorable == c.unscorable());
  ADV_CHECK_CLOSE(adv, c.file.get<float>("norm_then_sum"), vs_f32);
  (void)rlpt::combine_reward_channels(c.channels(), c.weights, summed, rlpt::compat::trl::channels());
  (void)rlpt::rloo_advantages(summed, c.groups, adv, rlpt::compat::trl::rloo(false));
  ADV_CHECK_CLOSE(adv, c.file.get<float>("rloo"), vs_f32);
  (void)rlpt::rloo_advantages(summed, c.groups, adv, rlpt::compat::trl::rloo(true));
  ADV_CHECK_CLOSE(adv, c.file.get<float>("rloo_norm"), vs_f32);
}

TEST_CASE("trl golden: soft overlong punishment") {
  trl_case c;
  const auto lengths = c.file.get<rlpt::index_t>("overlong_lengths");
  const auto want = c.file.get<double>("overlong");
  std::vector<double> got;
  for (rlpt::index_t L : lengths) got.push_back(rlpt::overlong_penalty(L, rlpt::compat::trl::soft_overlong(100, 20)));
  ADV_CHECK_CLOSE(got, want, (tolerance{1e-15, 0}));
}
