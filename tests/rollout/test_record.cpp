// SPDX-License-Identifier: Apache-2.0
// Trajectory records: append-only multi-turn building, the token-in/token-out prefix rule,
// validation naming the field, extras, and the columnar batch.
#include <rlpt/rollout/batch.hpp>
#include <rlpt/rollout/checkpoint.hpp>
#include <rlpt/rollout/record.hpp>

#include "helpers.hpp"
#include "support/errors.hpp"
#include "support/random.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <utility>
#include <vector>

using namespace rlpt;

namespace {

template <class T> std::vector<T> to_vec(view<const T> v) { return {v.begin(), v.end()}; }

trajectory multi_turn() {
  const std::vector<token_id> prompt{11, 12, 13};
  const std::vector<token_id> out1{21, 22};
  const std::vector<float> lp1{-0.5f, -1.5f};
  const std::vector<token_id> tool{31, 32};
  const std::vector<token_id> out2{41};
  const std::vector<float> lp2{-0.25f};
  trajectory_builder b(7, prompt);
  b.model(out1, lp1, 3).context(tool, token_source::tool).model(out2, lp2, 4).reward(1.0f);
  return std::move(b).finish();
}

} // namespace

TEST_CASE("multi-turn builder appends model tokens, then masked context tokens") {
  const trajectory t = multi_turn();
  CHECK(t.group_id == 7);
  CHECK(t.prompt_len == 3);
  CHECK(t.tokens == std::vector<token_id>{11, 12, 13, 21, 22, 31, 32, 41});
  CHECK(t.loss_mask == std::vector<mask_t>{0, 0, 0, 1, 1, 0, 0, 1});
  CHECK(t.versions == std::vector<policy_version>{-1, -1, -1, 3, 3, -1, -1, 4});
  CHECK(t.logprobs == std::vector<float>{0, 0, 0, -0.5f, -1.5f, 0, 0, -0.25f});
  CHECK(t.rewards == std::vector<float>{1.0f});
  REQUIRE(t.segments.size() == 4);
  CHECK(t.segments[0] == segment{0, 3, token_source::prompt, 0});
  CHECK(t.segments[1] == segment{3, 5, token_source::model, 0});
  CHECK(t.segments[2] == segment{5, 7, token_source::tool, 1});
  CHECK(t.segments[3] == segment{7, 8, token_source::model, 1});

  const trajectory_view v = t.view();
  CHECK(v.size() == 8);
  CHECK(v.response_len() == 5);
  CHECK(to_vec(v.prompt()) == std::vector<token_id>{11, 12, 13});
  CHECK(v.loss_tokens() == 3);
  CHECK(v.version_span() == std::pair<policy_version, policy_version>{3, 4});
  CHECK(v.tokens.data() == t.tokens.data()); // zero-copy
}

TEST_CASE("per-token versions and a resumed partial rollout keep the versions already generated") {
  const std::vector<token_id> prompt{1, 2};
  const std::vector<token_id> out{3, 4, 5};
  const std::vector<float> lp{-1, -2, -3};
  const std::vector<policy_version> ver{5, 5, 6};
  trajectory_builder b(0, prompt);
  b.model(out, lp, ver);
  trajectory partial = std::move(b).finish();

  trajectory_builder resumed(std::move(partial), builder_options{});
  const std::vector<token_id> more{6};
  const std::vector<float> lp2{-4};
  resumed.model(more, lp2, 7);
  const trajectory t = std::move(resumed).finish();
  CHECK(t.versions == std::vector<policy_version>{-1, -1, 5, 5, 6, 7});
  CHECK(t.segments.back().turn == 1);
  CHECK(t.view().version_span() == std::pair<policy_version, policy_version>{5, 7});
}

TEST_CASE("context_from enforces the token-in/token-out prefix rule") {
  const std::vector<token_id> prompt{1, 2, 3};
  const std::vector<token_id> out{4, 5};
  const std::vector<float> lp{-1, -1};
  trajectory_builder b(0, prompt);
  b.model(out, lp, 0);

  SUBCASE("an exact extension appends the suffix as context") {
    const std::vector<token_id> next{1, 2, 3, 4, 5, 6, 7};
    b.context_from(next);
    CHECK(b.peek().tokens == next);
    CHECK(b.peek().loss_mask == std::vector<mask_t>{0, 0, 0, 1, 1, 0, 0});
    CHECK(b.peek().segments.back() == segment{5, 7, token_source::environment, 1});
  }
  SUBCASE("a re-tokenised history is an error naming the position and both tokens") {
    const std::vector<token_id> next{1, 2, 3, 9, 5, 6};
    RLPT_CHECK_ERROR(b.context_from(next), "rlpt.rollout.prefix_mismatch", "position 3", "9 != 4");
  }
  SUBCASE("a shorter input cannot extend the record") {
    const std::vector<token_id> next{1, 2, 3, 4};
    RLPT_CHECK_ERROR(b.context_from(next), "rlpt.rollout.prefix_mismatch", "4 tokens", "5 already held");
  }
}

TEST_CASE("validate names the field that breaks an invariant") {
  test::rng r(1);
  const record_schema schema{};
  const trajectory good = test::make_record(r, 3, 0, 4, 6, 2, 0.5f);
  CHECK_NOTHROW(validate(good, schema));

  trajectory t = good;
  t.loss_mask.pop_back();
  RLPT_CHECK_ERROR(validate(t, schema), "rlpt.rollout.record_size", "loss_mask", "9 elements", "expected 10");
  t = good;
  t.logprobs.push_back(0);
  RLPT_CHECK_ERROR(validate(t, schema), "rlpt.rollout.record_size", "logprobs", "11 elements");
  t = good;
  t.versions.clear();
  RLPT_CHECK_ERROR(validate(t, schema), "rlpt.rollout.record_size", "versions", "0 elements");
  t = good;
  t.rewards.push_back(1);
  RLPT_CHECK_ERROR(validate(t, schema), "rlpt.rollout.record_size", "rewards", "one per reward channel");
  t = good;
  t.token_rewards.assign(3, 0.0f);
  RLPT_CHECK_ERROR(validate(t, schema), "rlpt.rollout.record_size", "token_rewards");
  t = good;
  t.prompt_len = 11;
  RLPT_CHECK_ERROR(validate(t, schema), "rlpt.rollout.record_value", "prompt_len = 11");
  t = good;
  t.loss_mask[1] = 1;
  RLPT_CHECK_ERROR(validate(t, schema), "rlpt.rollout.record_value", "loss_mask[1]", "prompt token");
  t = good;
  t.versions[6] = -1;
  RLPT_CHECK_ERROR(validate(t, schema), "rlpt.rollout.record_value", "versions[6] = -1", "loss_mask[6] = 1");
  t = good;
  t.versions[2] = -2;
  RLPT_CHECK_ERROR(validate(t, schema), "rlpt.rollout.record_value", "versions[2] = -2");
  t = good;
  t.logprobs[5] = std::numeric_limits<float>::quiet_NaN();
  RLPT_CHECK_ERROR(validate(t, schema), "rlpt.rollout.record_value", "logprobs[5]", "not finite");
  t = good;
  t.rewards[0] = std::numeric_limits<float>::infinity();
  RLPT_CHECK_ERROR(validate(t, schema), "rlpt.rollout.record_value", "rewards[0]", "group 3");
  t = good;
  t.segments.push_back({2, 5, token_source::tool, 9});
  RLPT_CHECK_ERROR(validate(t, schema), "rlpt.rollout.record_value", "segments[2] = [2, 5)");
  t = good;
  t.tokens.clear();
  t.loss_mask.clear();
  RLPT_CHECK_ERROR(validate(t, schema), "rlpt.rollout.record_size", "no tokens");

  // Masked garbage is not an error: a NaN logprob on a masked-out token is accepted.
  t = good;
  t.loss_mask[9] = 0;
  t.logprobs[9] = std::numeric_limits<float>::quiet_NaN();
  t.versions[9] = -1;
  CHECK_NOTHROW(validate(t, schema));

  // Schema without logprobs/versions: the fields must be absent.
  const record_schema bare{.logprobs = false, .versions = false};
  RLPT_CHECK_ERROR(validate(good, bare), "rlpt.rollout.record_size", "logprobs", "the schema has no logprobs");
}

TEST_CASE("per-token extras: routed experts [T, L*k] and teacher logprobs") {
  const std::vector<token_id> prompt{1, 2};
  builder_options o{.token_reward_channels = 2,
                    .extras = {{"routed_experts", dtype::i32, 3 * 2}, {"teacher_logprobs", dtype::f32, 1}}};
  trajectory_builder b(0, prompt, o);
  const std::vector<token_id> out{3, 4, 5};
  const std::vector<float> lp{-1, -2, -3};
  b.model(out, lp, 1);
  std::vector<std::int32_t> experts(5 * 6);
  for (std::size_t i = 0; i < experts.size(); ++i) experts[i] = static_cast<std::int32_t>(i % 64);
  b.extra<std::int32_t>("routed_experts", 0, experts);
  const std::vector<float> teacher{-0.1f, -0.2f};
  b.extra<float>("teacher_logprobs", 3, teacher);
  b.token_reward(4, 0.75f, 1);
  RLPT_CHECK_ERROR(b.extra<float>("routed_experts", 0, teacher), "rlpt.rollout.extra_dtype", "routed_experts", "i32",
                   "f32");
  RLPT_CHECK_ERROR(b.extra<float>("teacher_logprobs", 4, teacher), "rlpt.rollout.bad_option", "does not fit");
  RLPT_CHECK_ERROR(b.extra<float>("nope", 0, teacher), "rlpt.rollout.bad_option", "'nope'");
  RLPT_CHECK_ERROR(b.token_reward(5, 1.0f), "rlpt.rollout.bad_option", "position 5");
  const trajectory t = std::move(b).finish();
  const trajectory_view v = t.view();
  REQUIRE(v.extra("routed_experts") != nullptr);
  CHECK(v.extra("routed_experts")->tokens() == 5);
  const auto e = v.extra("routed_experts")->as<std::int32_t>();
  CHECK(std::vector<std::int32_t>(e.begin(), e.end()) == experts);
  const auto tl = v.extra("teacher_logprobs")->as<float>();
  CHECK(std::vector<float>(tl.begin(), tl.end()) == std::vector<float>{0, 0, 0, -0.1f, -0.2f});
  CHECK(t.token_rewards[4 * 2 + 1] == 0.75f);
  RLPT_CHECK_ERROR(v.extra("teacher_logprobs")->as<double>(), "rlpt.rollout.extra_dtype", "f32", "f64");

  record_schema s = b.schema();
  CHECK_NOTHROW(validate(t, s));
  s.extras[0].width = 4;
  RLPT_CHECK_ERROR(validate(t, s), "rlpt.rollout.record_value", "routed_experts");
}

TEST_CASE("rollout_batch stacks records into columns with zero-copy row views") {
  test::rng r(2);
  const record_schema schema{.token_reward_channels = 1, .extras = {{"teacher", dtype::f32, 2}}};
  std::vector<trajectory> recs;
  for (int i = 0; i < 5; ++i) {
    builder_options o{.token_reward_channels = 1, .extras = {{"teacher", dtype::f32, 2}}};
    std::vector<token_id> p(static_cast<std::size_t>(r.integer(1, 4)), 1);
    trajectory_builder b(i / 2, p, o);
    const auto n = static_cast<std::size_t>(r.integer(1, 6));
    std::vector<token_id> out(n, 7);
    std::vector<float> lp = r.uniforms(n, -3.0, 0.0);
    b.model(out, lp, i).reward(static_cast<float>(i));
    std::vector<float> ex = r.uniforms(static_cast<std::size_t>(2 * b.size()));
    b.extra<float>("teacher", 0, ex);
    recs.push_back(std::move(b).finish());
  }
  const rollout_batch batch = rollout_batch::gather(recs, schema);
  REQUIRE(batch.size() == 5);
  index_t tokens = 0;
  for (std::size_t i = 0; i < recs.size(); ++i) {
    const trajectory_view a = recs[i].view();
    const trajectory_view b = batch[static_cast<index_t>(i)];
    CHECK(batch.offsets()[static_cast<index_t>(i)] == tokens);
    tokens += a.size();
    CHECK(to_vec(b.tokens) == to_vec(a.tokens));
    CHECK(to_vec(b.loss_mask) == to_vec(a.loss_mask));
    CHECK(to_vec(b.logprobs) == to_vec(a.logprobs));
    CHECK(to_vec(b.versions) == to_vec(a.versions));
    CHECK(to_vec(b.rewards) == to_vec(a.rewards));
    CHECK(to_vec(b.token_rewards) == to_vec(a.token_rewards));
    CHECK(to_vec(b.segments) == to_vec(a.segments));
    CHECK(to_vec(b.extra("teacher")->as<float>()) == to_vec(a.extra("teacher")->as<float>()));
    CHECK(b.group_id == a.group_id);
    CHECK(b.prompt_len == a.prompt_len);
    CHECK(batch.rewards()(static_cast<index_t>(i), 0) == static_cast<float>(i));
    CHECK(batch.loss_token_counts()[i] == a.loss_tokens());
    CHECK(b.tokens.data() == batch.tokens().data() + batch.offsets()[static_cast<index_t>(i)]); // zero-copy
  }
  CHECK(batch.num_tokens() == tokens);
  CHECK(batch.layout().num_seqs() == 5);
  CHECK(batch.layout().storage_size() == tokens);
  CHECK(batch.num_groups() == 5); // without group info every record is its own group
  CHECK(batch.groups().num_groups() == 5);
  CHECK(batch.extra("teacher").as<float>().size() == 2 * tokens);
  RLPT_CHECK_ERROR(batch.extra("missing"), "rlpt.rollout.no_extra", "'missing'");

  // A record that does not match the schema is rejected naming the field.
  std::vector<trajectory> bad{recs[0]};
  bad[0].token_rewards.clear();
  RLPT_CHECK_ERROR(rollout_batch::gather(bad, schema), "rlpt.rollout.record_size", "token_rewards");
}

namespace {

// Writes a recognisable value of T for element k (in place through token_extra::as<T>()).
template <class T> T extra_value(std::size_t k) {
  if constexpr (std::is_same_v<T, bf16> || std::is_same_v<T, f16>) {
    return T(static_cast<float>(k) * 0.5f - 3.0f);
  } else {
    return static_cast<T>(static_cast<int>(k % 97) - 40);
  }
}

template <class T> std::vector<std::uint64_t> bits_of(view<const T> v) {
  std::vector<std::uint64_t> out;
  for (const T& x : v) {
    std::uint64_t u = 0;
    std::memcpy(&u, &x, sizeof(T));
    out.push_back(u);
  }
  return out;
}

template <class T> void check_extra_column(dtype type) {
  CAPTURE(name(type));
  const index_t width = 3;
  const record_schema schema{.extras = {{"pad", dtype::u8, 1}, {"x", type, width}}};
  builder_options o{.extras = schema.extras};
  std::vector<trajectory> recs;
  for (int i = 0; i < 3; ++i) {
    const std::vector<token_id> prompt(static_cast<std::size_t>(i + 1), 1);
    trajectory_builder b(i, prompt, o);
    const std::vector<token_id> out{4, 5};
    const std::vector<float> lp{-1, -2};
    b.model(out, lp, 0);
    recs.push_back(std::move(b).finish());
    token_extra& e = recs.back().extras[1];
    CHECK(e.type() == type);
    CHECK(e.elements() == width * recs.back().size());
    const view<T> v = e.as<T>();
    for (index_t k = 0; k < v.size(); ++k) CHECK(bits_of<T>(view<const T>(&v[k], 1))[0] == 0); // zero-filled
    for (index_t k = 0; k < v.size(); ++k) v[k] = extra_value<T>(detail::usize(k + 100 * i));
    using other = std::conditional_t<std::is_same_v<T, double>, float, double>;
    RLPT_CHECK_ERROR((void)e.as<other>(), "rlpt.rollout.extra_dtype", "'x'");
  }
  // Gathered into a batch, each row's view starts at its own first element of T.
  const rollout_batch batch = rollout_batch::gather(recs, schema);
  for (std::size_t i = 0; i < recs.size(); ++i) {
    const trajectory& t = recs[i];
    const view<const T> want = std::as_const(t.extras[1]).as<T>();
    CHECK(bits_of<T>(batch[static_cast<index_t>(i)].extra("x")->as<T>()) == bits_of<T>(want));
  }
  CHECK(batch.extra("x").type() == type);
  CHECK(batch.extra("x").as<T>().size() == width * batch.num_tokens());
  // A checkpoint's record codec gives back the same bits.
  for (const trajectory& t : recs) {
    detail::byte_writer w;
    detail::put_record(w, t, schema);
    detail::byte_reader r(w.bytes());
    const trajectory back = detail::get_record(r, schema);
    CHECK(back.extras[1].values == t.extras[1].values);
    CHECK(bits_of<T>(std::as_const(back.extras[1]).as<T>()) == bits_of<T>(std::as_const(t.extras[1]).as<T>()));
    CHECK(r.remaining() == 0);
  }
  // Records stacked twice compare equal; one changed bit does not.
  std::vector<trajectory> changed = recs;
  changed[2].extras[1].values.bytes()[changed[2].extras[1].values.size_bytes() - 1] ^= std::byte{1};
  CHECK(rollout_batch::gather(recs, schema) == batch);
  CHECK_FALSE(rollout_batch::gather(changed, schema) == batch);
}

} // namespace

TEST_CASE("extra columns of every dtype: zero-filled, written in place, stacked and checkpointed bit for bit") {
  check_extra_column<float>(dtype::f32);
  check_extra_column<double>(dtype::f64);
  check_extra_column<f16>(dtype::f16);
  check_extra_column<bf16>(dtype::bf16);
  check_extra_column<std::int8_t>(dtype::i8);
  check_extra_column<std::uint8_t>(dtype::u8);
  check_extra_column<std::int32_t>(dtype::i32);
  check_extra_column<std::int64_t>(dtype::i64);
}

TEST_CASE("reward_column gives one reward channel of every record, contiguous") {
  test::rng r(3);
  const record_schema schema{.reward_channels = 2};
  std::vector<trajectory> recs;
  for (int i = 0; i < 4; ++i) {
    std::vector<token_id> out(static_cast<std::size_t>(r.integer(1, 5)), 7);
    std::vector<float> lp = r.uniforms(out.size(), -3.0, 0.0);
    const std::vector<token_id> prompt{1, 2};
    trajectory_builder b(i / 2, prompt, {});
    b.model(out, lp, 0);
    trajectory t = std::move(b).finish();
    t.rewards = {static_cast<float>(r.uniform(0, 1)), static_cast<float>(r.uniform(-1, 0))};
    recs.push_back(std::move(t));
  }
  const rollout_batch batch = rollout_batch::gather(recs, schema);
  for (index_t c = 0; c < 2; ++c) {
    const std::vector<float> col = batch.reward_column(c);
    REQUIRE(col.size() == recs.size());
    for (std::size_t i = 0; i < recs.size(); ++i) {
      CHECK(col[i] == recs[i].rewards[static_cast<std::size_t>(c)]);
      CHECK(col[i] == batch.rewards()(static_cast<index_t>(i), c));
    }
  }
  RLPT_CHECK_ERROR((void)batch.reward_column(2), "rlpt.rollout.bad_selection",
                   "reward channel 2 does not exist: the batch has 2");
  RLPT_CHECK_ERROR((void)batch.reward_column(-1), "rlpt.rollout.bad_selection", "reward channel -1");
}

TEST_CASE("sizes that overflow index_t and group sizes that do not add up are errors") {
  test::rng r(7);
  const trajectory t = test::make_record(r, 1, 0, 2, 3);
  // tokens * token_reward_channels used to overflow for a huge channel count.
  const record_schema huge{.token_reward_channels = std::numeric_limits<index_t>::max() / 2};
  RLPT_CHECK_ERROR(validate(t, huge), "rlpt.rollout.record_size", "token_rewards", "5 tokens * 4611686018427387903");
  // Extra writes past the record (first * width used to overflow).
  const std::vector<token_id> prompt{1, 2};
  trajectory_builder b(3, prompt, {.extras = {{"teacher", dtype::f32, 2}}});
  const std::vector<float> two{0.5f, 0.25f};
  RLPT_CHECK_ERROR(b.extra<float>("teacher", std::numeric_limits<index_t>::max() / 2, two), "rlpt.rollout.bad_option",
                   "does not fit");
  b.extra<float>("teacher", 1, two);
  // Batch group sizes: negative or too large counts no longer make non-monotonic group offsets.
  std::vector<trajectory> recs{t, t, t};
  std::vector<const trajectory*> ptrs{&recs[0], &recs[1], &recs[2]};
  const std::vector<group_info> bad{{.id = 1, .samples = -1}, {.id = 2, .samples = 4}};
  RLPT_CHECK_ERROR(rollout_batch::gather(ptrs, record_schema{}, bad), "rlpt.rollout.bad_groups",
                   "groups[0] (id 1) has samples = -1");
  const std::vector<group_info> over{{.id = 1, .samples = 2}, {.id = 2, .samples = 2}};
  RLPT_CHECK_ERROR(rollout_batch::gather(ptrs, record_schema{}, over), "rlpt.rollout.bad_groups",
                   "groups[1] (id 2) has samples = 2", "1 records left");
  const std::vector<group_info> ok{{.id = 1, .samples = 2}, {.id = 2, .samples = 1}};
  const rollout_batch batch = rollout_batch::gather(ptrs, record_schema{}, ok);
  CHECK(batch.num_groups() == 2);
}
