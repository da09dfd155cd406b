// SPDX-License-Identifier: Apache-2.0
// rlpt against verl 0.9.1's own advantage functions (tools/golden/gen_advantage.py).
#include "common.hpp"

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

namespace {

using rlpt::test::at_valid;
using rlpt::test::vs_f32;
using rlpt::test::vs_f64;

struct outcome_case {
  rlpt::test::golden_file file = rlpt::test::advantage_golden("verl_outcome.bin");
  std::vector<std::int64_t> ids = file.get<std::int64_t>("ids");
  std::vector<std::uint8_t> mask = file.get<std::uint8_t>("mask");
  std::vector<float> token_rewards = file.get<float>("token_rewards");
  rlpt::index_t B = static_cast<rlpt::index_t>(file["mask"].shape[0]);
  rlpt::index_t T = static_cast<rlpt::index_t>(file["mask"].shape[1]);
  rlpt::token_layout layout = rlpt::token_layout::padded(B, T);
  rlpt::groups groups = rlpt::groups::from_ids(ids);
  std::vector<float> rewards = [&] {
    std::vector<float> r(static_cast<std::size_t>(B));
    rlpt::sum_token_rewards(layout, token_rewards, {}, r); // verl sums every slot of the row
    return r;
  }();

  //! Broadcasts a per-sequence result onto the tokens, as verl's A_i * response_mask.
  std::vector<float> tokens(const std::vector<float>& seq) const {
    std::vector<float> out(static_cast<std::size_t>(B * T));
    rlpt::broadcast_to_tokens(layout, seq, mask, out);
    return out;
  }
  //! Rows of degenerate groups, where verl's float32 run amplifies its own rounding of the mean
  //! (R - mean(R) is not 0 for three 0.35s in fp32) and rlpt is exactly 0.
  std::vector<float> without_degenerate(std::vector<float> x, const rlpt::group_stats& s) const {
    for (rlpt::index_t b = 0; b < B; ++b)
      if (s.degenerate[static_cast<std::size_t>(groups.group_of(b))])
        for (rlpt::index_t t = 0; t < T; ++t) x[static_cast<std::size_t>(b * T + t)] = 0.0f;
    return x;
  }
};

} // namespace

TEST_CASE("verl golden: grpo (loop and vectorised) and Dr. GRPO") {
  outcome_case c;
  for (const bool norm : {true, false}) {
    CAPTURE(norm);
    const std::string tag = norm ? "std" : "nostd";
    std::vector<float> adv(static_cast<std::size_t>(c.B));
    const rlpt::group_stats s = rlpt::grpo_advantages(c.rewards, c.groups, adv, rlpt::compat::verl::grpo(norm));
    const std::vector<float> got = c.tokens(adv);
    ADV_CHECK_CLOSE(got, c.file.get<double>("grpo_" + tag + "_f64"), (rlpt::test::tolerance{vs_f64.rel, vs_f64.abs}));
    const std::vector<float> want32 = c.without_degenerate(c.file.get<float>("grpo_" + tag + "_f32"), s);
    ADV_CHECK_CLOSE(c.without_degenerate(got, s), want32, (rlpt::test::tolerance{vs_f32.rel, vs_f32.abs}));
    const std::vector<float> vec32 = c.without_degenerate(c.file.get<float>("grpo_vectorized_" + tag + "_f32"), s);
    ADV_CHECK_CLOSE(c.without_degenerate(got, s), vec32, (rlpt::test::tolerance{vs_f32.rel, vs_f32.abs}));
    CHECK(s.num_degenerate > 0);
  }
}

TEST_CASE("verl golden: grpo singleton groups give R / (1 + 1e-6), zero-std groups give exactly 0") {
  outcome_case c;
  std::vector<float> adv(static_cast<std::size_t>(c.B));
  const rlpt::group_stats s = rlpt::grpo_advantages(c.rewards, c.groups, adv, rlpt::compat::verl::grpo());
  int singles = 0, flat = 0;
  for (rlpt::index_t k = 0; k < c.groups.num_groups(); ++k) {
    const auto mem = c.groups.members(k);
    if (mem.size() == 1) {
      ++singles;
      CHECK(adv[static_cast<std::size_t>(mem[0])] ==
            static_cast<float>(static_cast<double>(c.rewards[static_cast<std::size_t>(mem[0])]) / (1.0 + 1e-6)));
    } else if (s.degenerate[static_cast<std::size_t>(k)]) {
      ++flat;
      for (rlpt::index_t i : mem) CHECK(adv[static_cast<std::size_t>(i)] == 0.0f);
    }
  }
  CHECK(singles > 0);
  CHECK(flat > 0);
}

TEST_CASE("verl golden: rloo (loop keeps singletons, vectorised zeroes them)") {
  outcome_case c;
  std::vector<float> adv(static_cast<std::size_t>(c.B));
  (void)rlpt::rloo_advantages(c.rewards, c.groups, adv, rlpt::compat::verl::rloo());
  ADV_CHECK_CLOSE(c.tokens(adv), c.file.get<double>("rloo_f64"), (rlpt::test::tolerance{vs_f64.rel, vs_f64.abs}));
  ADV_CHECK_CLOSE(c.tokens(adv), c.file.get<float>("rloo_f32"), (rlpt::test::tolerance{vs_f32.rel, vs_f32.abs}));
  (void)rlpt::rloo_advantages(c.rewards, c.groups, adv, rlpt::compat::verl::rloo_vectorized());
  ADV_CHECK_CLOSE(c.tokens(adv), c.file.get<double>("rloo_vectorized_f64"),
                  (rlpt::test::tolerance{vs_f64.rel, vs_f64.abs}));
  ADV_CHECK_CLOSE(c.tokens(adv), c.file.get<float>("rloo_vectorized_f32"),
                  (rlpt::test::tolerance{vs_f32.rel, vs_f32.abs}));
}

TEST_CASE("verl golden: opo (length-weighted baseline)") {
  outcome_case c;
  std::vector<rlpt::index_t> lengths(static_cast<std::size_t>(c.B));
  rlpt::valid_lengths(c.layout, c.mask, lengths);
  CHECK(lengths == c.file.get<rlpt::index_t>("lengths"));
  std::vector<float> adv(static_cast<std::size_t>(c.B));
  (void)rlpt::opo_advantages(c.rewards, lengths, c.groups, adv, rlpt::compat::verl::opo());
  ADV_CHECK_CLOSE(c.tokens(adv), c.file.get<double>("opo_f64"), (rlpt::test::tolerance{vs_f64.rel, vs_f64.abs}));
  ADV_CHECK_CLOSE(c.tokens(adv), c.file.get<float>("opo_f32"), (rlpt::test::tolerance{vs_f32.rel, vs_f32.abs}));
}

TEST_CASE("verl golden: gpg (batch-rescaled mean baseline)") {
  outcome_case c;
  std::vector<float> adv(static_cast<std::size_t>(c.B));
  (void)rlpt::gpg_advantages(c.rewards, c.groups, adv, rlpt::compat::verl::gpg());
  ADV_CHECK_CLOSE(c.tokens(adv), c.file.get<double>("gpg_f64"), (rlpt::test::tolerance{vs_f64.rel, vs_f64.abs}));
  ADV_CHECK_CLOSE(c.tokens(adv), c.file.get<float>("gpg_f32"), (rlpt::test::tolerance{vs_f32.rel, vs_f32.abs}));
}

TEST_CASE("verl golden: reinforce_plus_plus_baseline (group mean, token whitening)") {
  outcome_case c;
  std::vector<float> adv(static_cast<std::size_t>(c.B * c.T));
  const auto r = rlpt::reinforce_pp_baseline_advantages(c.rewards, c.groups, c.layout, c.mask, adv,
                                                        rlpt::compat::verl::reinforce_pp_baseline());
  REQUIRE(r.whitening.has_value());
  ADV_CHECK_CLOSE(adv, c.file.get<double>("reinforce_baseline_f64"), (rlpt::test::tolerance{vs_f64.rel, 1e-7}));
  ADV_CHECK_CLOSE(adv, c.file.get<float>("reinforce_baseline_f32"), (rlpt::test::tolerance{vs_f32.rel, vs_f32.abs}));
}

TEST_CASE("verl golden: remax (greedy baseline)") {
  outcome_case c;
  const auto baselines = c.file.get<float>("baselines");
  std::vector<float> adv(static_cast<std::size_t>(c.B * c.T)), ret(adv.size());
  CHECK(rlpt::remax_advantages(c.layout, c.token_rewards, c.mask, baselines, adv, ret, rlpt::compat::verl::remax()) ==
        0);
  // verl's returns run a cumsum through masked slots; rlpt writes 0 there: compare valid tokens.
  ADV_CHECK_CLOSE(at_valid(adv, c.mask), at_valid(c.file.get<double>("remax_adv_f64"), c.mask),
                  (rlpt::test::tolerance{vs_f64.rel, vs_f64.abs}));
  ADV_CHECK_CLOSE(at_valid(ret, c.mask), at_valid(c.file.get<double>("remax_ret_f64"), c.mask),
                  (rlpt::test::tolerance{vs_f64.rel, vs_f64.abs}));
  ADV_CHECK_CLOSE(at_valid(adv, c.mask), at_valid(c.file.get<float>("remax_adv_f32"), c.mask),
                  (rlpt::test::tolerance{vs_f32.rel, vs_f32.abs}));
  CHECK(rlpt::test::masked_zero(adv, c.mask));
}

TEST_CASE("verl golden: grpo_passk") {
  const auto f = rlpt::test::advantage_golden("verl_passk.bin");
  const auto ids = f.get<std::int64_t>("ids");
  const auto mask = f.get<std::uint8_t>("mask");
  const auto tok = f.get<float>("token_rewards");
  const auto B = static_cast<rlpt::index_t>(f["mask"].shape[0]), T = static_cast<rlpt::index_t>(f["mask"].shape[1]);
  const auto layout = rlpt::token_layout::padded(B, T);
  std::vector<float> rewards(static_cast<std::size_t>(B)), adv(rewards.size()), out(tok.size());
  rlpt::sum_token_rewards(layout, tok, {}, rewards);
  const auto g = rlpt::groups::from_ids(ids);
  for (const bool norm : {true, false}) {
    CAPTURE(norm);
    (void)rlpt::passk_advantages(rewards, g, adv, rlpt::compat::verl::grpo_passk(norm));
    rlpt::broadcast_to_tokens(layout, adv, mask, out);
    const std::string tag = norm ? "std" : "nostd";
    ADV_CHECK_CLOSE(out, f.get<double>("passk_" + tag + "_f64"), (rlpt::test::tolerance{vs_f64.rel, vs_f64.abs}));
    ADV_CHECK_CLOSE(out, f.get<float>("passk_" + tag + "_f32"), (rlpt::test::tolerance{vs_f32.rel, vs_f32.abs}));
  }
}

TEST_CASE("verl golden: gae (skip semantics, holes, empty row, whitening) and returns") {
  const auto f = rlpt::test::advantage_golden("verl_tokens.bin");
  const auto mask = f.get<std::uint8_t>("mask");
  const auto values = f.get<float>("values");
  const auto tok = f.get<float>("token_rewards");
  const auto settings = f.get<double>("gae_settings");
  const auto B = static_cast<rlpt::index_t>(f["mask"].shape[0]), T = static_cast<rlpt::index_t>(f["mask"].shape[1]);
  const auto layout = rlpt::token_layout::padded(B, T);
  std::vector<float> adv(tok.size()), ret(tok.size());
  for (std::size_t k = 0; k < settings.size() / 2; ++k) {
    CAPTURE(k);
    const auto res = rlpt::gae({.layout = layout, .rewards = tok, .values = values, .mask = mask}, adv, ret,
                               rlpt::compat::verl::gae(settings[2 * k], settings[2 * k + 1]));
    CHECK(res.whitening.has_value());
    const std::string p = "gae" + std::to_string(k);
    // verl leaves carried values at masked tokens (whitened); rlpt writes 0: compare valid tokens.
    ADV_CHECK_CLOSE(at_valid(adv, mask), at_valid(f.get<double>(p + "_adv_f64"), mask),
                    (rlpt::test::tolerance{vs_f64.rel, 1e-7}));
    ADV_CHECK_CLOSE(at_valid(ret, mask), at_valid(f.get<double>(p + "_ret_f64"), mask),
                    (rlpt::test::tolerance{vs_f64.rel, vs_f64.abs}));
    ADV_CHECK_CLOSE(at_valid(adv, mask), at_valid(f.get<float>(p + "_adv_f32"), mask),
                    (rlpt::test::tolerance{vs_f32.rel, vs_f32.abs}));
    ADV_CHECK_CLOSE(at_valid(ret, mask), at_valid(f.get<float>(p + "_ret_f32"), mask),
                    (rlpt::test::tolerance{vs_f32.rel, vs_f32.abs}));
    CHECK(rlpt::test::masked_zero(adv, mask));
    CHECK(rlpt::test::masked_zero(ret, mask));
  }
}

TEST_CASE("verl golden: reinforce_plus_plus (discounted return skipping masked tokens, whitening)") {
  const auto f = rlpt::test::advantage_golden("verl_tokens.bin");
  const auto mask = f.get<std::uint8_t>("mask");
  const auto tok = f.get<float>("token_rewards");
  const auto gammas = f.get<double>("rpp_gammas");
  const auto B = static_cast<rlpt::index_t>(f["mask"].shape[0]), T = static_cast<rlpt::index_t>(f["mask"].shape[1]);
  const auto layout = rlpt::token_layout::padded(B, T);
  std::vector<float> adv(tok.size()), ret(tok.size());
  for (std::size_t k = 0; k < gammas.size(); ++k) {
    CAPTURE(k);
    (void)rlpt::reinforce_pp_advantages(layout, tok, mask, adv, ret, rlpt::compat::verl::reinforce_pp(gammas[k]));
    const std::string p = "rpp" + std::to_string(k);
    ADV_CHECK_CLOSE(adv, f.get<double>(p + "_adv_f64"), (rlpt::test::tolerance{vs_f64.rel, 1e-7}));
    ADV_CHECK_CLOSE(ret, f.get<double>(p + "_ret_f64"), (rlpt::test::tolerance{vs_f64.rel, vs_f64.abs}));
    ADV_CHECK_CLOSE(adv, f.get<float>(p + "_adv_f32"), (rlpt::test::tolerance{vs_f32.rel, vs_f32.abs}));
    ADV_CHECK_CLOSE(ret, f.get<float>(p + "_ret_f32"), (rlpt::test::tolerance{vs_f32.rel, vs_f32.abs}));
  }
}

TEST_CASE("verl golden: gdpo (per-channel GRPO, weighted sum, token whitening)") {
  const auto f = rlpt::test::advantage_golden("verl_gdpo.bin");
  const auto ids = f.get<std::int64_t>("ids");
  const auto mask = f.get<std::uint8_t>("mask");
  const auto channels = f.get<float>("channels");
  const auto weights = f.get<float>("weights");
  const auto B = static_cast<rlpt::index_t>(f["mask"].shape[0]), T = static_cast<rlpt::index_t>(f["mask"].shape[1]);
  const auto K = static_cast<rlpt::index_t>(f["channels"].shape[1]);
  const auto layout = rlpt::token_layout::padded(B, T);
  const auto g = rlpt::groups::from_ids(ids);
  std::vector<float> seq(static_cast<std::size_t>(B)), tok(static_cast<std::size_t>(B * T));
  const auto r = rlpt::gdpo_advantages(rlpt::view2d<const float>(channels.data(), B, K), weights, g, seq,
                                       rlpt::compat::verl::gdpo());
  CHECK(r.channels.size() == static_cast<std::size_t>(K));
  rlpt::broadcast_to_tokens(layout, seq, mask, tok);
  (void)rlpt::whiten(layout, tok, mask, tok, rlpt::compat::verl::whiten());
  ADV_CHECK_CLOSE(tok, f.get<double>("gdpo_f64"), (rlpt::test::tolerance{vs_f64.rel, 1e-7}));
  ADV_CHECK_CLOSE(tok, f.get<float>("gdpo_f32"), (rlpt::test::tolerance{vs_f32.rel, vs_f32.abs}));
}
