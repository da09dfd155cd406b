// SPDX-License-Identifier: Apache-2.0
// The seed corpus: small valid inputs made by rlpt's own writers, plus hand-made edge cases,
// for every fuzz target. `rlpt_fuzz_seeds <dir>` (scripts/fuzz --seeds) writes them to
// tests/fuzz/corpus/<target>/seed-*; the replay test checks that every seed marked valid is
// accepted by its target, so the writers and the parsers cannot drift apart unnoticed.
#pragma once

#include "fuzz.hpp"

#include <rlpt/rollout/buffer.hpp>
#include <rlpt/rollout/checkpoint.hpp>
#include <rlpt/rollout/filters.hpp>
#include <rlpt/rollout/record.hpp>
#include <rlpt/staleness/buffer.hpp>
#include <rlpt/sync/delta.hpp>
#include <rlpt/sync/frame.hpp>
#include <rlpt/sync/manifest.hpp>
#include <rlpt/sync/planner.hpp>
#include <rlpt/sync/preflight.hpp>
#include <rlpt/sync/safetensors.hpp>

#include <cstring>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#if RLPT_HAS_DLPACK()
#include <dlpack/dlpack.h>
#endif

namespace rlpt::fuzz {

struct seed {
  std::string name;
  std::vector<std::uint8_t> bytes;
  bool valid = true; //!< the target must accept it
};

namespace seeds_detail {

inline std::vector<std::uint8_t> bytes_of(std::span<const std::byte> b, int mode = -1) {
  std::vector<std::uint8_t> v;
  if (mode >= 0) v.push_back(static_cast<std::uint8_t>(mode));
  const auto* p = reinterpret_cast<const std::uint8_t*>(b.data());
  v.insert(v.end(), p, p + b.size());
  return v;
}
inline std::vector<std::uint8_t> bytes_of(std::string_view s, int mode = -1) {
  return bytes_of(std::span<const std::byte>(reinterpret_cast<const std::byte*>(s.data()), s.size()), mode);
}

//! Small tensors of every dtype family, filled from a fixed generator.
struct model {
  std::vector<std::vector<std::byte>> storage;
  std::vector<sync::tensor_ref> refs;

  void add(std::string name, sync::wire_dtype dt, std::vector<std::int64_t> shape, std::mt19937_64& g) {
    std::uint64_t n = sync::size_of(dt);
    for (auto d : shape) n *= static_cast<std::uint64_t>(d);
    std::vector<std::byte> b(static_cast<std::size_t>(n));
    for (auto& x : b) x = static_cast<std::byte>(g() & 0xffu);
    storage.push_back(std::move(b));
    refs.push_back({std::move(name), dt, std::move(shape), nullptr});
    for (std::size_t i = 0; i < refs.size(); ++i) refs[i].data = storage[i].empty() ? nullptr : storage[i].data();
  }
};

inline model small_model() {
  std::mt19937_64 g(18);
  model m;
  m.add("model.embed_tokens.weight", sync::wire_dtype::bf16, {40, 8}, g); // 640 bytes: split by 256-byte buckets
  m.add("model.layers.0.self_attn.q_proj.weight", sync::wire_dtype::bf16, {8, 8}, g);
  m.add("model.layers.0.input_layernorm.weight", sync::wire_dtype::f32, {8}, g);
  m.add("model.layers.0.mlp.router.bias", sync::wire_dtype::f64, {3}, g);
  m.add("step", sync::wire_dtype::i64, {}, g);
  m.add("mask", sync::wire_dtype::boolean, {5}, g);
  m.add("fp8", sync::wire_dtype::f8_e4m3, {2, 3}, g);
  m.add("lm_head.bias", sync::wire_dtype::f32, {0}, g);
  m.add("caf\xc3\xa9.\"quoted\"\n", sync::wire_dtype::u16, {2}, g);
  return m;
}

inline std::vector<std::byte> raw_safetensors(std::string_view header, std::size_t data_bytes = 0) {
  std::vector<std::byte> out(8 + header.size() + data_bytes);
  const std::uint64_t n = header.size();
  std::memcpy(out.data(), &n, 8);
  std::memcpy(out.data() + 8, header.data(), header.size());
  return out;
}

inline sync::manifest planned(const model& m, std::uint64_t bucket, std::uint64_t version, std::uint64_t base) {
  sync::manifest mf = sync::plan(m.refs, {.bucket_bytes = bucket, .alignment = 8});
  for (std::size_t i = 0; i < mf.size(); ++i) {
    const auto& t = mf[i];
    const auto idx = *[&]() -> std::optional<std::size_t> {
      for (std::size_t k = 0; k < m.refs.size(); ++k)
        if (m.refs[k].name == t.name) return k;
      return std::nullopt;
    }();
    mf.set_checksum(i, sync::tensor_checksum(m.storage[idx].data(), t.nbytes, bucket));
  }
  mf.set_versions(version, base);
  return mf;
}

inline trajectory record(std::int64_t group, std::int32_t sample, policy_version v, float reward, std::mt19937_64& g,
                         const builder_options& o) {
  std::vector<token_id> prompt{11, 12, static_cast<token_id>(group)};
  trajectory_builder b(group, prompt, o);
  std::vector<token_id> out(2 + g() % 3);
  std::vector<float> lp(out.size());
  for (std::size_t i = 0; i < out.size(); ++i) {
    out[i] = static_cast<token_id>(g() % 1000);
    lp[i] = -0.25f * static_cast<float>(i + 1);
  }
  b.model(out, lp, v);
  if (sample == 1) {
    const std::vector<token_id> tool{7, 7};
    b.context(tool, token_source::tool);
  }
  b.reward(reward);
  if (o.token_reward_channels > 0) b.token_reward(b.size() - 1, 0.5f);
  for (const auto& e : o.extras) {
    std::vector<std::int32_t> ex(static_cast<std::size_t>(b.size() * e.width));
    for (auto& x : ex) x = static_cast<std::int32_t>(g() % 64);
    b.extra<std::int32_t>(e.name, 0, ex);
  }
  trajectory t = std::move(b).finish();
  t.sample_index = sample;
  return t;
}

} // namespace seeds_detail

inline std::vector<seed> safetensors_seeds() {
  using namespace seeds_detail;
  std::vector<seed> s;
  const model m = small_model();
  s.push_back({"model", bytes_of(sync::serialize_safetensors(m.refs, {{"format", "pt"}, {"note", "caf\xc3\xa9"}}))});
  s.push_back({"empty", bytes_of(sync::serialize_safetensors({}))});
  s.push_back({"metadata-only", bytes_of(sync::serialize_safetensors({}, {{"format", "pt"}}))});
  const std::vector<sync::tensor_ref> one(m.refs.begin() + 2, m.refs.begin() + 3);
  s.push_back({"one", bytes_of(sync::serialize_safetensors(one))});
  // Hand-written headers: key order, spacing and escapes HF's writer would not produce, but
  // any reader must take.
  s.push_back(
      {"escapes", bytes_of(raw_safetensors(
                      R"({"a\u00e9\ud83d\ude00": {"shape": [2], "data_offsets": [0, 4], "dtype": "I16"}} )", 4))});
  s.push_back({"zero-dim", bytes_of(raw_safetensors(R"({"z":{"dtype":"F32","shape":[3,0,2],"data_offsets":[0,0]}})"))});
  // Rejected: whitespace before '{', gaps, overlaps, trailing bytes, size mismatch, huge length.
  s.push_back({"leading-space",
               bytes_of(raw_safetensors(R"( {"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})", 1)),
               true}); // JSON whitespace before the object: safetensors accepts it
  s.push_back({"gap", bytes_of(raw_safetensors(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})", 2)), false});
  s.push_back(
      {"overlap",
       bytes_of(raw_safetensors(
           R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"b":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})",
           2)),
       false});
  s.push_back(
      {"trailing", bytes_of(raw_safetensors(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})", 3)), false});
  s.push_back({"size-mismatch",
               bytes_of(raw_safetensors(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", 4)), false});
  s.push_back({"unknown-dtype",
               bytes_of(raw_safetensors(R"({"a":{"dtype":"F4","shape":[2],"data_offsets":[0,1]}})", 1)), false});
  s.push_back(
      {"huge-dims",
       bytes_of(raw_safetensors(R"({"a":{"dtype":"F64","shape":[4294967296,4294967296],"data_offsets":[0,0]}})")),
       false});
  // As rlpt's safetensors transport writes a dense version: plain tensors, and the manifest and
  // piece checksums in the metadata (the target replays it through a receiving transport).
  {
    const sync::manifest mf = planned(m, 256, 3, 0);
    std::string pieces;
    for (std::uint64_t b = 0; b < mf.bucket_count(); ++b)
      for (const sync::piece& p : mf.pieces(b)) {
        std::size_t k = 0;
        while (m.refs[k].name != mf[p.tensor].name) ++k;
        pieces += sync::to_hex(sync::xxh3(m.storage[k].data() + p.tensor_offset, static_cast<std::size_t>(p.nbytes)));
      }
    s.push_back({"rlpt-dense", bytes_of(sync::serialize_safetensors(m.refs, {{"format", "pt"},
                                                                             {"rlpt.kind", "dense"},
                                                                             {"rlpt.manifest", mf.to_json()},
                                                                             {"rlpt.pieces", pieces}}))});
  }
  std::vector<std::byte> huge = raw_safetensors("{}");
  const std::uint64_t n = ~std::uint64_t{0} - 3;
  std::memcpy(huge.data(), &n, 8);
  s.push_back({"huge-length", bytes_of(huge), false});
  return s;
}

inline std::vector<seed> manifest_seeds() {
  using namespace seeds_detail;
  std::vector<seed> s;
  const model m = small_model();
  s.push_back({"planned-256", bytes_of(planned(m, 256, 7, 6).to_json())});
  s.push_back({"planned-4k", bytes_of(planned(m, 4096, 1, 0).to_json())});
  s.push_back({"empty", bytes_of(planned(model{}, 1024, 0, 0).to_json())});
  const std::vector<sync::tensor_ref> zero(m.refs.end() - 2, m.refs.end() - 1);
  s.push_back({"zero-bytes", bytes_of(planned(model{{{}}, zero}, 64, 3, 2).to_json())});
  // JSON the reader must take or reject precisely (these are not manifests).
  s.push_back({"json-numbers", bytes_of(R"([0,-0,1.5e300,-2E-7,18446744073709551616,1e+2,0.0])"), false});
  s.push_back({"json-strings", bytes_of(R"({"\u0000\"\\\/\b\f\n\r\t":"\ud83d\ude00\u00e9caf\u00c3"})"), false});
  s.push_back({"json-nesting", bytes_of(std::string(64, '[') + std::string(64, ']')), false});
  s.push_back({"json-too-deep", bytes_of(std::string(70, '[') + std::string(70, ']')), false});
  return s;
}

inline std::vector<seed> delta_seeds() {
  using namespace seeds_detail;
  std::vector<seed> s;
  std::mt19937_64 g(29);
  auto stream = [&](std::size_t eb, std::size_t n, double changed, std::uint64_t max_record) {
    std::vector<std::byte> base(n * eb), now;
    for (auto& x : base) x = static_cast<std::byte>(g() & 0xffu);
    now = base;
    std::bernoulli_distribution flip(changed);
    for (std::size_t i = 0; i < n; ++i)
      if (flip(g)) now[i * eb] ^= std::byte{1};
    sync::delta_encoder enc(max_record);
    std::vector<std::byte> out;
    sync::delta_stats st;
    static_cast<void>(enc.encode(3, now, base, eb, 0x1234, 1 << 20, out, st));
    return out;
  };
  s.push_back({"sparse-bf16-2-blocks", bytes_of(stream(2, 70000, 0.0001, 1 << 20), 1)});
  s.push_back({"sparse-u8", bytes_of(stream(1, 3000, 0.01, 1 << 20), 1)});
  s.push_back({"bitmap-f32", bytes_of(stream(4, 600, 0.3, 1 << 20), 1)});
  s.push_back({"dense-f64", bytes_of(stream(8, 40, 1.0, 1 << 20), 1)});
  s.push_back({"many-records", bytes_of(stream(2, 300, 0.5, 256), 1)});
  s.push_back({"unsigned", bytes_of(stream(4, 100, 0.2, 1 << 20), 0)});
  // Encoder round trips: mode 2 | element size code << 2, record byte, u16 bucket, now, base.
  std::vector<std::uint8_t> rt{static_cast<std::uint8_t>(2 | (1 << 2)), 3, 64, 0};
  for (int i = 0; i < 512; ++i) rt.push_back(static_cast<std::uint8_t>(g() & 0xffu));
  for (int i = 0; i < 256; ++i) rt.push_back(rt[4 + static_cast<std::size_t>(i)] ^ (i % 7 == 0 ? 1 : 0));
  s.push_back({"round-trip-bf16", rt});
  std::vector<std::uint8_t> rt8{static_cast<std::uint8_t>(2 | (3 << 2)), 0, 0, 1};
  for (int i = 0; i < 128; ++i) rt8.push_back(static_cast<std::uint8_t>(g() & 0xffu));
  s.push_back({"round-trip-f64", rt8});
  return s;
}

inline std::vector<seed> frame_seeds() {
  using namespace seeds_detail;
  std::vector<seed> s;
  const model m = small_model();
  const sync::manifest mf = planned(m, 256, 5, 4);
  const std::string json = mf.to_json();
  std::vector<std::byte> f;
  auto add = [&](std::string name, sync::frame_type t, std::uint64_t index, std::uint64_t count, std::uint64_t payload,
                 std::span<const std::byte> body) {
    sync::encode_frame(f, t, 0x9e3779b97f4a7c15ull, 5, 4, index, count, payload, body);
    s.push_back({std::move(name), bytes_of(f, 0)});
  };
  const std::vector<std::uint64_t> sums{1, 2, 3};
  const std::span<const std::byte> sum_bytes(reinterpret_cast<const std::byte*>(sums.data()), 24);
  add("begin", sync::frame_type::begin, 0, mf.layout_hash(), 0, sync::as_bytes(json));
  add("ready", sync::frame_type::ready, 1, mf.layout_hash(), 0, {});
  add("refuse", sync::frame_type::refuse, 1, 0, 0, sync::as_bytes("rlpt.sync.base_mismatch\nthe receiver holds 3"));
  add("bucket", sync::frame_type::bucket, 2, 3, 256, sum_bytes);
  add("delta", sync::frame_type::delta, 0, 4, 640, sum_bytes.first(8));
  add("commit", sync::frame_type::commit, 0, 7, 0, sum_bytes);
  add("ack", sync::frame_type::ack, 0, 0, 0, {});
  add("nack", sync::frame_type::nack, 0, 0, 0, sync::as_bytes("no newline in this body"));
  add("abort", sync::frame_type::abort, 0, 0, 0, sync::as_bytes("sender stopped"));
  return s;
}

namespace seeds_detail {

inline builder_options checkpoint_record_options() {
  return {.reward_channels = 2, .token_reward_channels = 1, .extras = {{"experts", dtype::i32, 2}}};
}

inline buffer_options checkpoint_buffer_options() {
  const builder_options b = checkpoint_record_options();
  return {.capacity_groups = 16,
          .group_size = 2,
          .min_group_size = 1,
          .schema = {.reward_channels = b.reward_channels,
                     .token_reward_channels = b.token_reward_channels,
                     .extras = b.extras},
          .filters = {filters::dapo()}};
}

} // namespace seeds_detail

inline std::vector<seed> checkpoint_seeds() {
  using namespace seeds_detail;
  std::vector<seed> s;
  std::mt19937_64 g(31);
  const builder_options ro = checkpoint_record_options();
  rollout_buffer b(checkpoint_buffer_options());
  s.push_back({"fresh", bytes_of(encode_checkpoint(b.snapshot()), 0)});
  for (std::int64_t grp = 0; grp < 5; ++grp)
    for (std::int32_t k = 0; k < 2; ++k)
      b.push(record(grp, k, static_cast<policy_version>(grp % 3), grp == 2 ? 1.0f : static_cast<float>(k), g, ro));
  b.push(record(9, 0, 1, 0.5f, g, ro)); // half a group: stays open
  const std::vector<std::byte> user{std::byte{1}, std::byte{2}, std::byte{3}};
  s.push_back({"groups", bytes_of(encode_checkpoint(b.snapshot(), user), 0)});
  static_cast<void>(b.pop(1));
  s.push_back({"after-pop", bytes_of(encode_checkpoint(b.snapshot()), 1 | (3 << 1))});
  // Without logprobs and versions, one reward channel.
  rollout_buffer plain(buffer_options{.group_size = 1, .schema = {.logprobs = false, .versions = false}});
  builder_options po{.logprobs = false, .versions = false};
  plain.push(record(4, 0, 0, 1.0f, g, po));
  s.push_back({"plain", bytes_of(encode_checkpoint(plain.snapshot()), 0)});
  return s;
}

inline std::vector<seed> staleness_seeds() {
  using namespace seeds_detail;
  std::vector<seed> s;
  s.push_back({"state-empty", bytes_of(encode(staleness_state{}), 0)});
  s.push_back({"state", bytes_of(encode(staleness_state{4, {{1, 2, -1}, {5, 3, 4}, {-7, 4, 4}}}), 0)});
  // A staleness_buffer checkpoint, as save_checkpoint writes it (mode 2: checkpoint form).
  std::mt19937_64 g(37);
  const gate_options go{.max_staleness = 2, .batch_groups = 2, .max_concurrent = 16};
  staleness_gate gate(go);
  staleness_buffer sb(gate, buffer_options{.capacity_groups = 16, .group_size = 2},
                      staleness_buffer_options{.select = {.max_staleness = 2}});
  const builder_options ro{};
  auto push_group = [&](std::int64_t id) {
    const ticket t = gate.try_admit();
    sb.push(t, record(id, 0, t.version, 0.0f, g, ro));
    sb.push(t, record(id, 1, t.version, 1.0f, g, ro));
  };
  push_group(1);
  push_group(2);
  static_cast<void>(sb.pop());
  sb.publish();
  push_group(3);
  sb.publish();
  push_group(4);
  const ticket open = gate.try_admit();
  sb.push(open, record(6, 0, open.version, 0.0f, g, ro));
  s.push_back(
      {"checkpoint", bytes_of(encode_checkpoint(sb.buffer().snapshot(), encode(sb.state())), 2 | (1 << 2) | (1 << 5))});
  sb.fail(open);
  return s;
}

inline std::vector<seed> dlpack_seeds() {
  std::vector<seed> s;
#if RLPT_HAS_DLPACK()
  struct desc {
    std::uint8_t op, flags;
    std::int32_t device_type, device_id;
    std::uint8_t code, bits;
    std::uint16_t lanes;
    std::int32_t ndim;
    std::uint64_t byte_offset;
    std::vector<std::int64_t> shape, strides;
  };
  auto add = [&](std::string name, const desc& d, bool valid = true) {
    std::vector<std::uint8_t> v;
    auto put = [&](const auto& x) {
      const auto* p = reinterpret_cast<const std::uint8_t*>(&x);
      v.insert(v.end(), p, p + sizeof(x));
    };
    put(d.op), put(d.flags), put(d.device_type), put(d.device_id), put(d.code), put(d.bits), put(d.lanes), put(d.ndim);
    put(d.byte_offset);
    for (std::size_t i = 0; i < 8; ++i) put(i < d.shape.size() ? d.shape[i] : std::int64_t{0});
    for (std::size_t i = 0; i < 8; ++i) put(i < d.strides.size() ? d.strides[i] : std::int64_t{0});
    s.push_back({std::move(name), v, valid});
  };
  // op: bit 0 2-D, bits 1-3 type (0 f32, 1 f64, 2 f16, 3 bf16, 4 i8, 5 u8, 6 i32, 7 i64),
  // bit 4 device view, bit 5 strides, bits 6-7 data pointer.
  add("f32-1d", {0, 0, kDLCPU, 0, kDLFloat, 32, 1, 1, 0, {16}, {}});
  add("f32-1d-strided", {32, 0, kDLCPU, 0, kDLFloat, 32, 1, 1, 4, {8}, {1}});
  add("i64-2d-padded-rows", {1 | (7 << 1) | 32, 0, kDLCPU, 0, kDLInt, 64, 1, 2, 16, {3, 4}, {5, 1}});
  add("bf16-2d", {1 | (3 << 1), 0, kDLCUDAHost, 0, kDLBfloat, 16, 1, 2, 0, {4, 8}, {}});
  add("f16-empty", {2 << 1 | (1 << 6), 0, kDLCPU, 0, kDLFloat, 16, 1, 1, 0, {0}, {}});
  add("bool-mask", {5 << 1, 0, kDLCPU, 0, 6, 8, 1, 1, 0, {12}, {}});
  add("cuda-view", {1 | (6 << 1) | 16, 0, kDLCUDA, 1, kDLInt, 32, 1, 2, 0, {1000000, 4096}, {}});
  add("one-row-any-stride", {1 | 32, 0, kDLCPU, 0, kDLFloat, 32, 1, 2, 0, {1, 4}, {-3, 1}});
  add("wrong-dtype", {0, 0, kDLCPU, 0, kDLFloat, 16, 1, 1, 0, {4}, {}}, false);
  add("misaligned", {0 | (2 << 6), 0, kDLCPU, 0, kDLFloat, 32, 1, 1, 0, {4}, {}}, false);
  add("overflowing-shape", {1, 0, kDLCPU, 0, kDLFloat, 32, 1, 2, 0, {INT64_MAX / 2, 4}, {}}, false);
  add("null-shape", {0, 1, kDLCPU, 0, kDLFloat, 32, 1, 1, 0, {4}, {}}, false);
#endif
  return s;
}

inline std::vector<seed> preflight_seeds() {
  std::vector<seed> s;
  auto add = [&](std::string name, const sync::environment& e) {
    s.push_back({std::move(name), seeds_detail::bytes_of(sync::encode_environment(e))});
  };
  add("empty", sync::environment{});
  sync::environment e;
  e.host = "engine-0";
  e.machine = "8c1f0d6e-2b9a-4c55-9d7e-1a2b3c4d5e6f";
  e.pid = 77;
  e.variables = {{"NCCL_CUMEM_ENABLE", "0"}, {"NCCL_PROTO", std::nullopt}};
  e.devices = {{"GPU-0a1b2c3d-0000-1111-2222-333344445555", 0}};
  e.nccl = "2.21.5";
  e.cuda_runtime = "12.4";
  add("nccl-end", e);
  e.devices.push_back(e.devices[0]); // one GPU listed twice
  add("shared-gpu", e);
  std::vector<std::byte> frame;
  sync::encode_frame(frame, sync::frame_type::ready, 1, 0, 0, 0, 0, 0, {});
  s.push_back({"protocol-frame", seeds_detail::bytes_of(frame), false});
  return s;
}

struct seed_set {
  std::string_view target;
  std::vector<seed> (*make)();
};

inline constexpr seed_set seed_sets[] = {
    {"safetensors", safetensors_seeds},
    {"manifest", manifest_seeds},
    {"delta", delta_seeds},
    {"frame", frame_seeds},
    {"checkpoint", checkpoint_seeds},
    {"staleness", staleness_seeds},
    {"dlpack", dlpack_seeds},
    {"preflight", preflight_seeds},
};

} // namespace rlpt::fuzz
