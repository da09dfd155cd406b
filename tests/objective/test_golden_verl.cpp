// SPDX-License-Identifier: Apache-2.0
// verl 0.9.1 golden losses and gradients (core_algos policy kernels, agg_loss, kl_penalty,
// compute_value_loss, rollout_corr_helper), reproduced through rlpt::compat::verl presets.
#include <rlpt/objective.hpp>

#include "golden_check.hpp"

#include <doctest/doctest.h>

#include <vector>

namespace verl = rlpt::compat::verl;
using rlpt::test::check_golden_case;
using rlpt::test::golden_inputs;

TEST_CASE("golden verl vanilla under every loss_agg_mode") {
  for (const char* agg :
       {"token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"}) {
    std::string tag(agg);
    for (char& c : tag)
      if (c == '-') c = '_';
    verl::actor_config cfg{.loss_agg_mode = agg};
    if (tag == "seq_mean_token_sum_norm") cfg.loss_scale_factor = 32;
    const auto r = check_golden_case("verl_vanilla_" + tag, verl::actor(cfg), golden_inputs{});
    CHECK(r.r32.clamped_frac > 0.0); // the large set makes the +-20 clamp bind
  }
  // Per-sequence advantages (broadcast by rlpt) give the same numbers.
  check_golden_case("verl_vanilla_token_mean", verl::actor({}), golden_inputs{.seq_adv = true});
}

TEST_CASE("golden verl vanilla with clip-higher, dual clip and global batch info") {
  check_golden_case("verl_vanilla_clip_higher_global",
                    verl::actor({.clip_ratio_low = 0.2,
                                 .clip_ratio_high = 0.28,
                                 .dp_size = 4,
                                 .batch_num_tokens = 400.0,
                                 .global_batch_size = 31.0}),
                    golden_inputs{});
  check_golden_case("verl_vanilla_seq_mean_token_mean_global",
                    verl::actor({.loss_agg_mode = "seq-mean-token-mean", .dp_size = 2, .global_batch_size = 16.0}),
                    golden_inputs{});
}

TEST_CASE("golden verl gspo, sapo, geo_mean, cispo, dppo_tv, dppo_kl, dro, gpg") {
  for (const char* agg : {"token-mean", "seq-mean-token-mean"}) {
    std::string tag(agg);
    for (char& c : tag)
      if (c == '-') c = '_';
    check_golden_case(
        "verl_gspo_" + tag + "_wide",
        verl::actor({.loss_mode = "gspo", .clip_ratio_low = 0.2, .clip_ratio_high = 0.28, .loss_agg_mode = agg}),
        golden_inputs{});
    check_golden_case(
        "verl_gspo_" + tag + "_paper",
        verl::actor({.loss_mode = "gspo", .clip_ratio_low = 3e-4, .clip_ratio_high = 4e-4, .loss_agg_mode = agg}),
        golden_inputs{});
  }
  check_golden_case("verl_sapo", verl::actor({.loss_mode = "sapo"}), golden_inputs{});
  check_golden_case("verl_geo_mean",
                    verl::actor({.loss_mode = "geo_mean", .clip_ratio_low = 0.4, .clip_ratio_high = 0.4}),
                    golden_inputs{});
  check_golden_case("verl_cispo", verl::actor({.loss_mode = "cispo", .clip_ratio_low = 10.0, .clip_ratio_high = 0.28}),
                    golden_inputs{});
  check_golden_case("verl_dppo_tv",
                    verl::actor({.loss_mode = "dppo_tv", .clip_ratio_low = 0.05, .clip_ratio_high = 0.08}),
                    golden_inputs{});
  check_golden_case("verl_dppo_kl",
                    verl::actor({.loss_mode = "dppo_kl", .clip_ratio_low = 0.01, .clip_ratio_high = 0.02}),
                    golden_inputs{});
  check_golden_case("verl_dro_token_mean", verl::actor({.loss_mode = "dro", .dro_beta = 0.5}), golden_inputs{});
  check_golden_case("verl_dro_seq_mean_token_mean",
                    verl::actor({.loss_mode = "dro", .dro_beta = 2.0, .loss_agg_mode = "seq-mean-token-mean"}),
                    golden_inputs{});
  check_golden_case("verl_gpg", verl::actor({.loss_mode = "gpg", .loss_agg_mode = "seq-mean-token-sum"}),
                    golden_inputs{.old = false});
}

TEST_CASE("golden verl kl_penalty estimators and straight-through forms") {
  for (const char* type : {"kl", "abs", "mse", "low_var_kl", "k1+", "abs+", "low_var_kl+"}) {
    std::string tag(type);
    if (tag.back() == '+') tag = tag.substr(0, tag.size() - 1) + "_plus";
    rlpt::objective obj{.policy = rlpt::no_policy{}, .kl = verl::kl(type, 1.0), .agg = verl::agg("token-mean")};
    check_golden_case("verl_kl_" + tag, obj, golden_inputs{.old = false, .ref = true});
    // The same in one preset: verl's kl_penalty + agg_loss.
    const auto r = check_golden_case("verl_kl_" + tag, verl::kl_loss(type, 1.0, "token-mean"),
                                     golden_inputs{.old = false, .ref = true});
    CHECK(r.r64.loss == r.r64.kl_loss); // kl_loss_coef 1
  }
}

TEST_CASE("verl kl_loss preset: the coefficient scales the loss, not the kl_loss metric") {
  const rlpt::objective a = verl::kl_loss("low_var_kl", 1.0, "seq-mean-token-mean");
  const rlpt::objective b = verl::kl_loss("low_var_kl", 0.001, "seq-mean-token-mean");
  CHECK(a.kl.coef == 1.0);
  CHECK(b.kl.coef == 0.001);
  CHECK(b.agg.mode == rlpt::agg_mode::seq_mean_token_mean);
  CHECK(b.policy.index() == rlpt::policy_term(rlpt::no_policy{}).index());
}

TEST_CASE("every token masked: rlpt gives a loss and gradients of 0 where verl and OpenRLHF give NaN") {
  const std::vector<rlpt::mask_t> mask(6, 0);
  const std::vector<double> lp{-1, -2, -3, -1, -2, -3}, old{-1.1, -2, -2.9, -1, -2.2, -3}, adv{1, -1, 1, 1, -1, 1};
  const std::vector<double> ref{-1.2, -2, -3, -1, -2, -3.1};
  const rlpt::basic_objective_inputs<double> in{.layout = rlpt::token_layout::padded(2, 3),
                                                .mask = mask,
                                                .logp = lp,
                                                .old_logp = old,
                                                .ref_logp = ref,
                                                .adv = adv};
  const rlpt::objective objs[] = {verl::actor({}), verl::actor({.loss_agg_mode = "seq-mean-token-mean"}),
                                  verl::kl_loss("low_var_kl", 1.0), rlpt::compat::openrlhf::policy_loss({}),
                                  rlpt::compat::openrlhf::policy_loss({.token_level_loss = false})};
  for (const rlpt::objective& obj : objs) {
    std::vector<double> g(6, 7.0);
    const rlpt::objective_result r = rlpt::evaluate(obj, in, {.logp = g});
    CHECK(r.loss == 0.0);
    CHECK(r.tokens == 0.0);
    for (double x : g) CHECK(x == 0.0);
  }
}

TEST_CASE("golden verl compute_value_loss") {
  for (const char* agg : {"token-mean", "seq-mean-token-mean"}) {
    std::string tag(agg);
    for (char& c : tag)
      if (c == '-') c = '_';
    const auto r = check_golden_case("verl_value_" + tag, verl::critic(0.5, agg),
                                     golden_inputs{.old = false, .values = true}, false, true);
    CHECK(r.r64.value_clip_frac > 0.0);
  }
}

TEST_CASE("golden verl rollout corrections (IS weights, IcePop, rejection) in decoupled mode") {
  const verl::actor_config cfg{.clip_ratio_low = 0.2, .clip_ratio_high = 0.28};
  struct spec {
    const char* name;
    rlpt::off_policy_correction c;
  };
  const spec specs[] = {
      {"token_tis", verl::rollout_correction("token", "2.0")},
      {"seq_tis", verl::rollout_correction("sequence", "2.0")},
      {"token_icepop", verl::rollout_correction("token", "0.5_2.0")},
      {"rs_token_k1", verl::rollout_correction("", "", "token_k1", "0.6_1.8")},
      {"rs_seq_mean_k3", verl::rollout_correction("", "", "seq_mean_k3", "0.02")},
      {"rs_seq_max_k2", verl::rollout_correction("", "", "seq_max_k2", "0.05")},
      {"rs_seq_sum_k1", verl::rollout_correction("", "", "seq_sum_k1", "0.7_1.4")},
      {"tis_and_rs_token_k2", verl::rollout_correction("token", "2.0", "token_k2", "0.5")},
      {"rs_seq_mean_k3_and_token_k1", verl::rollout_correction("", "", "seq_mean_k3,token_k1", "0.02,0.8_1.25")},
      {"rs_seq_shared_threshold", verl::rollout_correction("", "", "token_k2, seq_mean_k2,token_k2", "0.03")},
      {"rs_seq_four",
       verl::rollout_correction("", "", "token_k2,seq_max_k2,seq_mean_k3,seq_sum_k1", "0.08,0.1,0.03,0.5_1.2")},
      {"rs_all_eleven",
       verl::rollout_correction("", "",
                                "token_k1,token_k2,token_k3,seq_sum_k1,seq_sum_k2,seq_sum_k3,seq_mean_k1,seq_mean_k2,"
                                "seq_mean_k3,seq_max_k2,seq_max_k3",
                                "0.65_1.6,0.09,0.07,0.6_1.6,0.34,0.5,0.9_1.12,0.03,0.04,0.1,0.1")},
      {"tis_and_rs_token_k3_seq_sum_k1",
       verl::rollout_correction("token", "2.0", "token_k3,seq_sum_k1", "0.05,0.7_1.4")},
      {"token_tis_batch_norm", verl::rollout_correction("token", "2.0", "", "", false, true)},
      {"seq_icepop_batch_norm", verl::rollout_correction("sequence", "0.2_5.0", "", "", false, true)},
  };
  for (const spec& s : specs) {
    const auto r =
        check_golden_case(std::string("verl_corr_") + s.name, verl::actor(cfg, s.c), golden_inputs{.behav = true});
    const std::string n(s.name);
    INFO("correction ", n);
    if (n == "token_tis_batch_norm") {
      CHECK(r.r64.is_weight_mean == doctest::Approx(1.0).epsilon(1e-7)); // the point of it
      CHECK(r.r64.is_weight_max != doctest::Approx(2.0));                // the truncated 2.0, divided by the mean
    } else if (n == "seq_icepop_batch_norm") {
      CHECK(r.r64.rejected_frac > 0.0); // the band zeroes some rows, which the mean counts as 0
    } else if (n == "token_tis" || n == "seq_tis") {
      CHECK(r.r64.is_weight_max == doctest::Approx(2.0)); // the truncation binds
    } else {
      CHECK(r.r64.rejected_frac > 0.0); // some tokens are rejected or zero-weighted, not all
      CHECK(r.r64.rejected_frac < 1.0);
    }
  }
}

TEST_CASE("golden verl composed actor loss: vanilla + token TIS + low_var_kl + entropy") {
  const auto obj = verl::actor({.clip_ratio_low = 0.2,
                                .clip_ratio_high = 0.28,
                                .use_kl_loss = true,
                                .kl_loss_coef = 0.05,
                                .kl_loss_type = "low_var_kl",
                                .entropy_coeff = 0.01},
                               verl::rollout_correction("token", "2.0"));
  check_golden_case("verl_actor_full", obj, golden_inputs{.behav = true, .ref = true, .entropy = true}, true);
}

TEST_CASE("golden verl bypass mode with REINFORCE and token IS") {
  const auto obj = verl::actor({.loss_mode = "gpg", .loss_agg_mode = "seq-mean-token-sum"},
                               verl::rollout_correction("token", "2.0", "", "", /*bypass=*/true));
  check_golden_case("verl_bypass_reinforce", obj, golden_inputs{.old = false, .behav = true});
}
