// SPDX-License-Identifier: Apache-2.0
// The model the device-transport tests move between processes: every tensor's bytes at every
// version are a pure function of (tensor, element, version), so a sender process and a
// receiver process agree on what each version must hold without sharing memory. About 2-4 %
// of the elements change from one version to the next (an RL step's density), so deltas are
// exercised; tensors larger than a bucket are split.
#pragma once

#include <rlpt/sync/manifest.hpp>
#include <rlpt/sync/planner.hpp>

#include <fmt/format.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace rlpt::test::sync_gpu {

struct spec {
  std::string name;
  rlpt::sync::wire_dtype dtype;
  std::vector<std::int64_t> shape;
  [[nodiscard]] std::uint64_t numel() const {
    std::uint64_t n = 1;
    for (auto d : shape) n *= static_cast<std::uint64_t>(d);
    return n;
  }
  [[nodiscard]] std::uint64_t nbytes() const { return numel() * rlpt::sync::size_of(dtype); }
};

//! ~2.6 MB: bf16 matrices (one split over 1 MiB buckets), an fp32 norm, an odd-sized tensor.
inline std::vector<spec> model_specs() {
  using rlpt::sync::wire_dtype;
  std::vector<spec> s;
  for (int l = 0; l < 2; ++l) {
    s.push_back({fmt::format("layers.{}.qkv.weight", l), wire_dtype::bf16, {384, 256}});
    s.push_back({fmt::format("layers.{}.mlp.weight", l), wire_dtype::bf16, {256, 512}});
    s.push_back({fmt::format("layers.{}.norm.weight", l), wire_dtype::f32, {256}});
  }
  s.push_back({"embed.weight", wire_dtype::bf16, {1000, 700}}); // 1.4 MB: split over 1 MiB buckets
  s.push_back({"odd.bias", wire_dtype::bf16, {77}});
  return s;
}

inline rlpt::sync::manifest model_manifest(std::uint64_t bucket_bytes) {
  std::vector<rlpt::sync::tensor_entry> e;
  for (const auto& t : model_specs()) e.push_back({t.name, t.dtype, t.shape, 0, 0, 0, 0});
  return rlpt::sync::plan(e, {.bucket_bytes = bucket_bytes, .alignment = 256});
}

[[nodiscard]] inline std::uint64_t mix(std::uint64_t x) noexcept {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

//! Tensor `i`'s wire bytes at `version`: a base value per element whose lowest byte is
//! XOR-ed with a version-dependent value for the ~2 % of elements whose phase matches.
inline std::vector<std::byte> tensor_bytes(const spec& t, std::size_t i, std::uint64_t version) {
  const std::size_t eb = rlpt::sync::size_of(t.dtype);
  const std::uint64_t n = t.numel();
  std::vector<std::byte> out(static_cast<std::size_t>(n * eb));
  for (std::uint64_t e = 0; e < n; ++e) {
    const std::uint64_t h = mix((std::uint64_t{i} << 40) ^ e);
    std::uint64_t bits;
    if (eb == 2)
      bits = (h & 0x807f) | 0x3c00; // bf16 of magnitude ~2^-7 .. 2^-6
    else
      bits = (h & 0x807fffffu) | 0x3c000000u;                // f32 likewise
    if (h % 50 == version % 50) bits ^= (version % 127) + 1; // this element's phase: it changes
    std::memcpy(out.data() + e * eb, &bits, eb);
  }
  return out;
}

} // namespace rlpt::test::sync_gpu
