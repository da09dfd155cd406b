// SPDX-License-Identifier: Apache-2.0
// Bad input gets an rlpt::error with a stable id and a message naming the values.
#include "common.hpp"

#include "support/errors.hpp"

#include <cstdint>
#include <limits>
#include <vector>

namespace {
const float qnan = std::numeric_limits<float>::quiet_NaN();
const float pinf = std::numeric_limits<float>::infinity();
} // namespace

TEST_CASE("errors: non-finite rewards are named by index") {
  const std::vector<float> r = {0.1f, 0.2f, 0.3f, qnan, 0.5f, 0.6f, 0.7f, pinf};
  const auto g = rlpt::groups::uniform(8, 4);
  std::vector<float> adv(8);
  RLPT_CHECK_ERROR(rlpt::grpo_advantages(r, g, adv), "rlpt.advantage.nonfinite", "2 of 8 rewards are not finite",
                   "[3]=nan", "[7]=inf", "rlpt::nonfinite::mask");
  RLPT_CHECK_ERROR(rlpt::rloo_advantages(r, g, adv), "rlpt.advantage.nonfinite", "[3]=nan");
  RLPT_CHECK_ERROR(rlpt::gpg_advantages(r, g, adv), "rlpt.advantage.nonfinite", "[7]=inf");
  std::vector<float> many(20, qnan);
  std::vector<float> out(20);
  RLPT_CHECK_ERROR(rlpt::grpo_advantages(many, rlpt::groups::uniform(20, 4), out), "rlpt.advantage.nonfinite",
                   "20 of 20", "[7]=nan", ", ...");
}

TEST_CASE("errors: single-sample groups under single::raise name the group") {
  const std::vector<float> r = {1, 0, 1, 0.5f, 0, 1};
  const std::vector<std::int64_t> ids = {5, 5, 42, 9, 9, 9};
  const auto g = rlpt::groups::from_ids(ids);
  std::vector<float> adv(6);
  RLPT_CHECK_ERROR(rlpt::rloo_advantages(r, g, adv), "rlpt.advantage.group_size",
                   "group 1 (id 42) has 1 sample; RLOO needs at least 2",
                   "rlpt::rloo_options::single = rlpt::single::zero");
  RLPT_CHECK_ERROR(rlpt::grpo_advantages(r, g, adv, rlpt::compat::openrlhf::group_norm()), "rlpt.advantage.group_size",
                   "id 42", "grpo_options");
  RLPT_CHECK_ERROR(rlpt::passk_advantages(r, g, adv), "rlpt.advantage.group_size", "pass@k");
  // A group whose other samples are NaN (masked) has one counted sample too.
  const std::vector<float> r2 = {1, qnan, 0, 1};
  std::vector<float> adv2(4);
  RLPT_CHECK_ERROR(
      rlpt::rloo_advantages(r2, rlpt::groups::uniform(4, 2), adv2, {.on_nonfinite = rlpt::nonfinite::mask}),
      "rlpt.advantage.group_size", "group 0 (id 0)");
}

TEST_CASE("errors: sizes and options") {
  const std::vector<float> r = {1, 0, 1, 0};
  const auto g = rlpt::groups::uniform(4, 2);
  std::vector<float> small(3), adv(4);
  RLPT_CHECK_ERROR(rlpt::grpo_advantages(r, g, small), "rlpt.view.size_mismatch",
                   "advantages has 3 elements, expected 4");
  RLPT_CHECK_ERROR(rlpt::grpo_advantages(r, rlpt::groups::uniform(6, 2), adv), "rlpt.view.size_mismatch", "rewards");
  RLPT_CHECK_ERROR(rlpt::grpo_advantages(r, g, adv, {.epsilon = 0.0}), "rlpt.advantage.bad_option", "divides by zero");
  RLPT_CHECK_ERROR(rlpt::grpo_advantages(r, g, adv, {.epsilon = -1.0}), "rlpt.advantage.bad_option", "epsilon (-1)");
  RLPT_CHECK_ERROR(rlpt::passk_advantages(r, g, adv, {.single = rlpt::single::raw}), "rlpt.advantage.bad_option",
                   "single = raw");
  RLPT_CHECK_ERROR(rlpt::gpg_advantages(r, g, adv, {.f_norm = 0.0}), "rlpt.advantage.bad_option", "f_norm");
  const std::vector<rlpt::index_t> zero_len = {0, 0, 3, 4};
  RLPT_CHECK_ERROR(rlpt::opo_advantages(r, zero_len, g, adv), "rlpt.advantage.bad_length", "group 0 (id 0)", "0/0");
  const std::vector<rlpt::index_t> neg = {1, -2, 3, 4};
  RLPT_CHECK_ERROR(rlpt::opo_advantages(r, neg, g, adv), "rlpt.advantage.bad_length", "lengths[1] = -2");
}

TEST_CASE("errors: token estimators name (sequence, token) of non-finite inputs") {
  const auto layout = rlpt::token_layout::padded(2, 4);
  std::vector<float> rew = {0, 0, 0, 1, 0, 0, 0, 1};
  std::vector<float> val = {0.1f, 0.2f, 0.3f, 0.4f, 0.1f, pinf, 0.3f, 0.4f};
  const std::vector<std::uint8_t> mask = {1, 1, 1, 1, 1, 1, 1, 0};
  std::vector<float> adv(8), ret(8);
  RLPT_CHECK_ERROR(rlpt::gae({.layout = layout, .rewards = rew, .values = val, .mask = mask}, adv, ret),
                   "rlpt.advantage.nonfinite", "gae: 1 sequence", "value (sequence 1, token 1) = inf");
  val[5] = 0.2f;
  rew[7] = qnan; // masked: never read, no error
  CHECK_NOTHROW(rlpt::gae({.layout = layout, .rewards = rew, .values = val, .mask = mask}, adv, ret));
  rew[2] = qnan;
  RLPT_CHECK_ERROR(rlpt::reinforce_pp_advantages(layout, rew, mask, adv, ret), "rlpt.advantage.nonfinite",
                   "reward (sequence 0, token 2) = nan");
  RLPT_CHECK_ERROR(rlpt::gae({.layout = layout, .rewards = rew, .values = val, .mask = mask}, adv, ret, {.gamma = 1.5}),
                   "rlpt.advantage.bad_option", "gae_options::gamma must be in [0, 1], got 1.5");
  std::vector<float> short_values(7);
  RLPT_CHECK_ERROR(rlpt::gae({.layout = layout, .rewards = rew, .values = short_values, .mask = mask}, adv, ret),
                   "rlpt.view.size_mismatch", "values has 7 elements, expected 8");
  const std::vector<float> boot = {0.0f};
  RLPT_CHECK_ERROR(
      rlpt::gae({.layout = layout, .rewards = rew, .values = val, .mask = mask, .bootstrap = boot}, adv, ret),
      "rlpt.view.size_mismatch", "bootstrap has 1 elements, expected 2");
}

TEST_CASE("errors: whitening with too few valid tokens, as verl's masked_var") {
  const std::vector<float> x = {1.0f, 2.0f, 3.0f};
  const std::vector<std::uint8_t> one = {0, 1, 0}, none = {0, 0, 0};
  std::vector<float> out(3);
  RLPT_CHECK_ERROR(rlpt::whiten(x, one, out), "rlpt.advantage.whiten_too_few", "at least 2 valid", "got 1",
                   "rlpt::too_few::unit_std");
  RLPT_CHECK_ERROR(rlpt::whiten(x, none, out), "rlpt.advantage.whiten_too_few", "got 0");
  CHECK_NOTHROW(rlpt::whiten(x, one, out, rlpt::compat::areal::adv_norm()));
  CHECK(out == std::vector<float>{0.0f, 0.0f, 0.0f});
  const std::vector<float> bad = {1.0f, qnan, 3.0f};
  const std::vector<std::uint8_t> all = {1, 1, 1};
  RLPT_CHECK_ERROR(rlpt::whiten(bad, all, out), "rlpt.advantage.nonfinite", "(sequence 0, token 1) = nan");
  RLPT_CHECK_ERROR(rlpt::whiten(x, all, out, {.eps = -1e-8}), "rlpt.advantage.bad_option", "eps");
}

TEST_CASE("errors: shaping options") {
  const std::vector<rlpt::index_t> len = {10, 20};
  std::vector<float> r = {1, 1};
  RLPT_CHECK_ERROR(rlpt::apply_overlong_penalty(len, r, {.max_len = 10, .buffer_len = 20}), "rlpt.advantage.bad_option",
                   "buffer_len (20) <= max_len (10)");
  RLPT_CHECK_ERROR(rlpt::apply_overlong_penalty(len, r, rlpt::compat::verl::overlong(100, 0)),
                   "rlpt.advantage.bad_option", "buffer_len = 0 needs cap = true");
  const std::vector<float> ch = {1, qnan, 3, 4};
  const std::vector<float> w = {1, 1};
  std::vector<float> out(2);
  RLPT_CHECK_ERROR(rlpt::combine_reward_channels(rlpt::view2d<const float>(ch.data(), 2, 2), w, out),
                   "rlpt.advantage.nonfinite", "(row 0, channel 1) = nan");
  RLPT_CHECK_ERROR(rlpt::transform_rewards(r, {.clip_low = 1.0, .clip_high = -1.0}), "rlpt.advantage.bad_option",
                   "clip_low (1) <= clip_high (-1)");
}

TEST_CASE("errors: presets take the framework's spelling and name an unknown value") {
  CHECK(rlpt::compat::trl::grpo("batch").scale == rlpt::scale::batch_std);
  CHECK(rlpt::compat::areal::reward_norm("none").scale == rlpt::scale::none);
  RLPT_CHECK_ERROR(rlpt::compat::trl::grpo("Group"), "rlpt.advantage.bad_option",
                   "trl scale_rewards = \"Group\" is not reproduced by rlpt (supported: group, batch, none)");
  RLPT_CHECK_ERROR(rlpt::compat::areal::reward_norm("token"), "rlpt.advantage.bad_option", "reward_norm.std_level");
}

TEST_CASE("areal normalize: refusals name the option") {
  namespace areal = rlpt::compat::areal;
  std::vector<float> out(4);
  const std::vector<float> x = {1.0f, 2.0f, std::numeric_limits<float>::quiet_NaN(), 4.0f};
  RLPT_CHECK_ERROR(areal::normalize({.mean_level = "row"}, 4, x, {}, out), "rlpt.advantage.bad_option",
                   "mean_level = \"row\"", "batch, group, none");
  RLPT_CHECK_ERROR(areal::normalize({.std_level = "group", .group_size = 3}, 4, x, {}, out),
                   "rlpt.advantage.bad_groups", "4 rows are not groups of group_size = 3");
  RLPT_CHECK_ERROR(areal::normalize({.eps = -1.0}, 4, x, {}, out), "rlpt.advantage.bad_option", "eps = -1");
  RLPT_CHECK_ERROR(areal::normalize({}, 3, x, {}, out), "rlpt.advantage.bad_shape", "4 values do not make 3 rows");
  RLPT_CHECK_ERROR(areal::normalize({}, 4, x, {}, out), "rlpt.advantage.nonfinite", "x[2] (row 2) = nan");
  const std::vector<std::uint8_t> skip_nan = {1, 1, 0, 1};
  CHECK_NOTHROW(areal::normalize({}, 4, x, skip_nan, out));
  CHECK(out[2] == 0.0f);
}
