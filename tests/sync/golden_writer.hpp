// SPDX-License-Identifier: Apache-2.0
// The files rlpt writes for the Python cross-check (tools/golden/gen_sync.py runs the bench
// runner's `write-golden`, which calls write_golden_files; the test rebuilds them and compares
// bytes with the ones safetensors (Python) read back).
#pragma once

#include <rlpt/sync.hpp>

#include <fmt/format.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace rlpt::test::sync {

struct golden_tensor {
  std::string name;
  rlpt::sync::wire_dtype dtype;
  std::vector<std::int64_t> shape;
  std::vector<std::byte> bytes;
};

//! Deterministic tensors of every dtype rlpt writes, with awkward names.
inline std::vector<golden_tensor> golden_tensors(std::uint64_t seed) {
  using rlpt::sync::wire_dtype;
  std::mt19937_64 g(seed ^ 0x5eedull);
  std::vector<golden_tensor> out;
  auto add = [&](std::string name, wire_dtype dt, std::vector<std::int64_t> shape) {
    std::uint64_t n = rlpt::sync::size_of(dt);
    for (auto d : shape) n *= static_cast<std::uint64_t>(d);
    golden_tensor t{std::move(name), dt, std::move(shape), std::vector<std::byte>(static_cast<std::size_t>(n))};
    std::normal_distribution<float> normal(0.f, 1.f);
    const std::size_t eb = rlpt::sync::size_of(dt);
    for (std::size_t i = 0; i < t.bytes.size(); i += eb) {
      const float v = normal(g);
      switch (dt) {
      case wire_dtype::bf16: {
        const auto b = rlpt::bf16(v).bits;
        std::memcpy(&t.bytes[i], &b, 2);
        break;
      }
      case wire_dtype::f16: {
        const auto b = rlpt::f16(v).bits;
        std::memcpy(&t.bytes[i], &b, 2);
        break;
      }
      case wire_dtype::f32:
        std::memcpy(&t.bytes[i], &v, 4);
        break;
      case wire_dtype::f64: {
        const double d = v;
        std::memcpy(&t.bytes[i], &d, 8);
        break;
      }
      case wire_dtype::boolean:
        t.bytes[i] = static_cast<std::byte>(g() & 1);
        break;
      default:
        for (std::size_t k = 0; k < eb; ++k) t.bytes[i + k] = static_cast<std::byte>(g());
      }
    }
    out.push_back(std::move(t));
  };
  add("model.layers.0.self_attn.q_proj.weight", wire_dtype::bf16, {8, 4});
  add("model.layers.0.input_layernorm.weight", wire_dtype::f32, {4});
  add("half", wire_dtype::f16, {3, 3});
  add("double", wire_dtype::f64, {2});
  add("ids", wire_dtype::i64, {3});
  add("i32", wire_dtype::i32, {2, 2});
  add("u8", wire_dtype::u8, {5});
  add("i8", wire_dtype::i8, {5});
  add("i16", wire_dtype::i16, {3});
  add("mask", wire_dtype::boolean, {7});
  add("scalar", wire_dtype::f32, {});
  add("empty", wire_dtype::bf16, {0, 4});
  add("ünï\"quoted\"\\", wire_dtype::f32, {1});
  return out;
}

inline std::vector<rlpt::sync::tensor_ref> refs_of(const std::vector<golden_tensor>& ts) {
  std::vector<rlpt::sync::tensor_ref> r;
  for (const auto& t : ts) r.push_back({t.name, t.dtype, t.shape, t.bytes.data()});
  return r;
}

//! Writes the golden files into `dir` and returns their names: a plain file, one with
//! metadata, and a dense + a delta version published through safetensors_transport.
inline std::vector<std::string> write_golden_files(const std::string& dir, std::uint64_t seed) {
  using namespace rlpt::sync;
  auto ts = golden_tensors(seed);
  const auto refs = refs_of(ts);
  write_safetensors(dir + "/plain.safetensors", refs);
  write_safetensors(dir + "/meta.safetensors", refs, {{"format", "pt"}, {"note", "rlpt \"golden\"\n"}});
  // A published model: the transport's dense file and a delta on top of it.
  std::vector<golden_tensor> model(ts.begin(), ts.begin() + 2);
  const auto mrefs = refs_of(model);
  const manifest m = plan(mrefs, {.bucket_bytes = 64, .alignment = 16});
  safetensors_transport out(dir, role::sender);
  sender tx(out, m, mrefs, {.delta = true});
  tx.publish(1);
  model[0].bytes[3] ^= std::byte{1};
  tx.publish(2);
  return {"plain.safetensors", "meta.safetensors", fmt::format("rlpt-v{:020}.safetensors", 1),
          fmt::format("rlpt-v{:020}.delta.safetensors", 2)};
}

} // namespace rlpt::test::sync
