// SPDX-License-Identifier: Apache-2.0
// Receiver-side transforms: rename_tensor, concat (q/k/v -> qkv), slice, cast and drop, checked
// against element-wise references, plus the errors for rules that do not fit the manifest.
#include "sync_support.hpp"

using namespace rlpt::sync;
using rlpt::test::sync::make_model;
using rlpt::test::sync::sink;

namespace {

std::map<std::string, std::vector<std::byte>> run(const rlpt::test::sync::model& md, const manifest& m,
                                                  const std::vector<transform>& rules, sink& s) {
  const transform_plan p(m, rules);
  auto source = [&](std::size_t i) {
    return std::span<const std::byte>(static_cast<const std::byte*>(md.refs[i].data), m[i].nbytes);
  };
  for (std::size_t k = 0; k < p.outputs().size(); ++k) p.run(k, source, s.fn());
  return s.got;
}

} // namespace

TEST_CASE("transform: identity passes every tensor through unchanged") {
  auto md = make_model(1, 1);
  const manifest m = plan(md.refs);
  sink s;
  const auto got = run(md, m, {}, s);
  CHECK(got.size() == md.refs.size());
  for (const auto& t : md.refs) CHECK(rlpt::test::sync::same_bytes(got.at(t.name), md.bytes(t.name)));
}

TEST_CASE("transform: q/k/v -> qkv and gate/up -> gate_up concatenate along dim 0 for every layer") {
  auto md = make_model(2, 2);
  const manifest m = plan(md.refs);
  sink s;
  const auto got = run(md, m,
                       {concat{{"*.self_attn.q_proj.weight", "*.self_attn.k_proj.weight", "*.self_attn.v_proj.weight"},
                               "*.self_attn.qkv_proj.weight"},
                        concat{{"*.mlp.gate_proj.weight", "*.mlp.up_proj.weight"}, "*.mlp.gate_up_proj.weight"}},
                       s);
  for (int l = 0; l < 2; ++l) {
    const std::string p = fmt::format("model.layers.{}.", l);
    std::vector<std::byte> want;
    for (auto n : {"self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"}) {
      auto b = md.bytes(p + n);
      want.insert(want.end(), b.begin(), b.end());
    }
    CHECK(got.at(p + "self_attn.qkv_proj.weight") == want);
    CHECK(s.shape.at(p + "self_attn.qkv_proj.weight") == std::vector<std::int64_t>{64, 16});
    CHECK(s.shape.at(p + "mlp.gate_up_proj.weight") == std::vector<std::int64_t>{96, 16});
    CHECK(got.count(p + "self_attn.q_proj.weight") == 0);
  }
  CHECK(got.size() == 2 * 3 + 2); // qkv, gate_up, norm per layer; embed; lm_head.bias
}

TEST_CASE("transform: concat along the last dim interleaves rows") {
  rlpt::test::rng r(3);
  rlpt::test::sync::model md;
  md.add("a", wire_dtype::f32, {3, 2}, r);
  md.add("b", wire_dtype::f32, {3, 4}, r);
  const manifest m = plan(md.refs);
  sink s;
  const auto got = run(md, m, {concat{{"a", "b"}, "ab", -1}}, s);
  const auto& ab = got.at("ab");
  REQUIRE(ab.size() == 3 * 6 * 4);
  for (int row = 0; row < 3; ++row) {
    CHECK(std::memcmp(&ab[static_cast<std::size_t>(row * 24)], &md.bytes("a")[static_cast<std::size_t>(row * 8)], 8) ==
          0);
    CHECK(std::memcmp(&ab[static_cast<std::size_t>(row * 24 + 8)], &md.bytes("b")[static_cast<std::size_t>(row * 16)],
                      16) == 0);
  }
}

TEST_CASE("transform: slice keeps a shard, rename_tensor, drop and cast follow") {
  rlpt::test::rng r(4);
  rlpt::test::sync::model md;
  md.add("model.embed.weight", wire_dtype::f32, {10, 3}, r);
  md.add("model.norm.weight", wire_dtype::f32, {3}, r);
  md.add("model.rotary.inv_freq", wire_dtype::f32, {2}, r);
  const manifest m = plan(md.refs);
  sink s;
  const auto got = run(md, m,
                       {slice{"model.embed.weight", "", 0, 2, 6}, rename_tensor{"model.*", "*"},
                        drop{"rotary.inv_freq"}, cast{"*", wire_dtype::bf16}},
                       s);
  CHECK(got.size() == 2);
  REQUIRE(got.count("embed.weight") == 1);
  CHECK(s.shape.at("embed.weight") == std::vector<std::int64_t>{4, 3});
  CHECK(s.dtype.at("embed.weight") == wire_dtype::bf16);
  const auto& src = md.bytes("model.embed.weight");
  for (int i = 0; i < 12; ++i) {
    float f;
    std::memcpy(&f, &src[static_cast<std::size_t>((6 + i) * 4)], 4);
    std::uint16_t b;
    std::memcpy(&b, &got.at("embed.weight")[static_cast<std::size_t>(i * 2)], 2);
    CHECK(b == rlpt::bf16(f).bits); // round to nearest even, like torch .to(bfloat16)
  }
}

TEST_CASE("transform: casts between f32, f64, f16 and bf16 round to nearest even") {
  rlpt::test::rng r(5);
  rlpt::test::sync::model md;
  md.add("x", wire_dtype::f64, {257}, r);
  const manifest m = plan(md.refs);
  for (wire_dtype to : {wire_dtype::f32, wire_dtype::f16, wire_dtype::bf16}) {
    sink s;
    const auto got = run(md, m, {cast{"x", to}}, s);
    const auto& in = md.bytes("x");
    for (std::size_t i = 0; i < 257; ++i) {
      double v;
      std::memcpy(&v, &in[i * 8], 8);
      const auto f = static_cast<float>(v);
      if (to == wire_dtype::f32) {
        float g;
        std::memcpy(&g, &got.at("x")[i * 4], 4);
        CHECK(g == f);
      } else {
        std::uint16_t g;
        std::memcpy(&g, &got.at("x")[i * 2], 2);
        CHECK(g == (to == wire_dtype::f16 ? rlpt::f16(f).bits : rlpt::bf16(f).bits));
      }
    }
  }
}

TEST_CASE("transform: rules that do not fit the manifest are errors naming the rule") {
  auto md = make_model(6, 1);
  const manifest m = plan(md.refs);
  RLPT_CHECK_ERROR(transform_plan(m, {rename_tensor{"nope.*", "x.*"}}), "rlpt.sync.bad_transform",
                   "transform #0 (rename \"nope.*\" -> \"x.*\") matches no tensor");
  RLPT_CHECK_ERROR(transform_plan(m, {concat{{"*.q_proj.weight", "*.missing.weight"}, "*.qm"}}),
                   "rlpt.sync.bad_transform", "input \"model.layers.0.self_attn.missing.weight\" does not exist");
  RLPT_CHECK_ERROR(transform_plan(m, {concat{{"*.q_proj.weight", "*.input_layernorm.weight"}, "x", 0}}),
                   "rlpt.sync.bad_transform", "does not exist");
  RLPT_CHECK_ERROR(
      transform_plan(
          m, {concat{{"model.layers.0.self_attn.q_proj.weight", "model.layers.0.input_layernorm.weight"}, "x"}}),
      "rlpt.sync.bad_transform", "differ in dtype");
  RLPT_CHECK_ERROR(
      transform_plan(m,
                     {concat{{"model.layers.0.self_attn.q_proj.weight", "model.layers.0.mlp.up_proj.weight"}, "x", 1}}),
      "rlpt.sync.bad_transform", "differ outside dim 1");
  RLPT_CHECK_ERROR(transform_plan(m, {slice{"model.embed_tokens.weight", "", 0, 5, 200}}), "rlpt.sync.bad_transform",
                   "slice [5, 200) is outside dim 0 of \"model.embed_tokens.weight\" (size 100)");
  RLPT_CHECK_ERROR(transform_plan(m, {slice{"model.embed_tokens.weight", "", 2, 0, 1}}), "rlpt.sync.bad_transform",
                   "slice dim 2 is out of range");
  RLPT_CHECK_ERROR(transform_plan(m, {rename_tensor{"*.q_proj.weight", "model.embed_tokens.weight"}}),
                   "rlpt.sync.bad_transform", "which already exists");
  RLPT_CHECK_ERROR(transform_plan(m, {rename_tensor{"a*b*", "x"}}), "rlpt.sync.bad_transform", "more than one '*'");
  RLPT_CHECK_ERROR(transform_plan(m, {cast{"*", wire_dtype::i32}}), "rlpt.sync.bad_transform",
                   "casts go to F32, F64, F16 or BF16");
}
