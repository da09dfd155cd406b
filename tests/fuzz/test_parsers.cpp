// SPDX-License-Identifier: Apache-2.0
// Regression tests for what the fuzz targets found in the parsers, where replaying the input
// through its target is not enough to show the bug (a time or memory bound, an error id).
#include "support/errors.hpp"

#include <rlpt/core/dlpack.hpp>
#include <rlpt/rollout/record.hpp>
#include <rlpt/staleness/buffer.hpp>
#include <rlpt/sync/detail/json.hpp>
#include <rlpt/sync/manifest.hpp>
#include <rlpt/sync/safetensors.hpp>

#include <unistd.h>

#include <doctest/doctest.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

using rlpt::sync::manifest;
using rlpt::sync::detail::parse_json;

namespace {

std::string manifest_with(std::string_view bucket_bytes, std::string_view tensor) {
  return fmt::format(
      R"({{"format":"rlpt.sync.manifest/1","version":1,"base_version":0,"bucket_bytes":{},"alignment":1,)"
      R"("layout_hash":"0000000000000000","tensors":[{}]}})",
      bucket_bytes, tensor);
}

} // namespace

TEST_CASE("json: an object with 200,000 keys parses in well under a second per 100,000 keys") {
  // Duplicate keys were found by a linear search per key: a 100,000-tensor safetensors header
  // took 90 s, 200,000 keys about 6 minutes.
  std::string doc = "{";
  for (int i = 0; i < 200000; ++i) doc += fmt::format(R"({}"model.layers.{}.weight":{})", i ? "," : "", i, i);
  doc += "}";
  const auto t0 = std::chrono::steady_clock::now();
  const auto j = parse_json(doc, "big");
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CHECK(j.size() == 200000);
  CHECK(s < 20.0); // ~0.3 s at -O2 on the CI machine, a few s under the sanitizers

  // Duplicates are still found, anywhere, naming the first repeated key and its byte offset.
  std::string dup = doc;
  dup.insert(dup.size() - 1, R"(,"model.layers.123456.weight":0)");
  RLPT_CHECK_ERROR(parse_json(dup, "big"), "rlpt.sync.json", "duplicate key \"model.layers.123456.weight\"",
                   fmt::format("at byte {}", doc.size()));
  RLPT_CHECK_ERROR(parse_json(R"({"a":1,"b":2,"a":3})", "small"), "rlpt.sync.json", "at byte 13",
                   "duplicate key \"a\"");
  std::string twenty = "{";
  for (int i = 0; i < 20; ++i) twenty += fmt::format(R"({}"k{}":{})", i ? "," : "", i % 18, i);
  twenty += "}";
  RLPT_CHECK_ERROR(parse_json(twenty, "twenty"), "rlpt.sync.json", "duplicate key \"k0\"",
                   fmt::format("at byte {}", twenty.find(R"("k0")", 2)));
}

TEST_CASE("manifest: a bucket index of 2^64 - 1 is rejected, not wrapped to an empty bucket table") {
  // Wrapped to 0 buckets, the bucket table was written at index 2^64 - 1 (heap out of bounds).
  RLPT_CHECK_ERROR(
      manifest::from_json(manifest_with(
          "1", R"({"name":"a","dtype":"U8","shape":[0],"bucket":18446744073709551615,"offset":0,"nbytes":0,)"
               R"("checksum":"0000000000000000"})")),
      "rlpt.sync.bad_manifest", "spans 2^64 buckets but has only 1 pieces");
}

TEST_CASE("manifest: a few hundred bytes cannot make the receiver build tables of gigabytes") {
  // One 64 MiB tensor in 1-byte buckets: 2^26 pieces, about 5 GB of tables, from 250 bytes of
  // JSON (libFuzzer: out-of-memory). The default limit is now 2^22 pieces.
  CHECK(rlpt::sync::manifest_limits{}.max_pieces <= (std::uint64_t{1} << 22));
  RLPT_CHECK_ERROR(manifest::from_json(manifest_with(
                       "1", R"({"name":"a","dtype":"U8","shape":[67108864],"bucket":0,"offset":0,"nbytes":67108864,)"
                            R"("checksum":"0000000000000000"})")),
                   "rlpt.sync.bad_manifest", "more than 4194304 bucket pieces");
}

TEST_CASE("safetensors transport: a file name with a version beyond 2^64 - 1 is not a version") {
  // The directory scan parsed the 20 digits with std::stoull, which threw std::out_of_range
  // (not an rlpt::error) out of the receiver's receive().
  char name[] = "/tmp/rlpt-test-XXXXXX";
  REQUIRE(::mkdtemp(name) != nullptr);
  const std::string dir = name;
  const std::string file = dir + "/rlpt-v99999999999999999999.safetensors";
  std::ofstream(file) << "not a safetensors file";
  {
    rlpt::sync::safetensors_transport in(dir, rlpt::sync::role::receiver);
    std::optional<rlpt::sync::message> got;
    CHECK_NOTHROW(got = in.receive(rlpt::sync::clock::now()));
    CHECK_FALSE(got.has_value());
  }
  ::unlink(file.c_str());
  ::rmdir(dir.c_str());
}

TEST_CASE("staleness: a refused restore leaves the adapter fresh, and a blob lists each group once") {
  using namespace rlpt;
  const gate_options go{.max_staleness = 2, .batch_groups = 2, .max_concurrent = 16};
  const buffer_options bo{.capacity_groups = 16, .group_size = 2};
  buffer_state bs;
  staleness_state vs;
  {
    staleness_gate gate(go);
    staleness_buffer sb(gate, bo);
    auto push_group = [&](std::int64_t id) {
      const ticket t = gate.try_admit();
      for (std::int32_t k = 0; k < 2; ++k) {
        const std::vector<token_id> prompt{1, 2}, out{3, 4};
        const std::vector<float> lp{-0.5f, -0.25f};
        trajectory_builder b(id, prompt);
        b.model(out, lp, t.version).reward(static_cast<float>(k));
        trajectory r = std::move(b).finish();
        r.sample_index = k;
        CHECK(sb.push(t, std::move(r)));
      }
    };
    push_group(1);
    sb.publish();
    push_group(2); // dispatched at version 1
    bs = sb.buffer().snapshot();
    vs = sb.state();
  }
  REQUIRE(vs.version == 1);
  // The blob names no group and an older version: group 2's own version (1) is beyond it. The
  // gate refuses it, but the buffer had been loaded first, so no second restore was possible.
  staleness_gate gate(go);
  staleness_buffer sb(gate, bo);
  RLPT_CHECK_ERROR(sb.restore(bs, staleness_state{0, {}}), "rlpt.staleness.bad_version", "ready group 2",
                   "version 1, outside [0, 0]");
  CHECK(sb.buffer().stats().inserted.records == 0);
  CHECK(gate.counts().admitted == 0);
  CHECK_NOTHROW(sb.restore(bs, vs));
  CHECK(gate.counts().buffered == 2);

  staleness_state twice = vs;
  twice.groups.push_back(twice.groups.front());
  RLPT_CHECK_ERROR(decode_staleness_state(encode(twice)), "rlpt.staleness.state_corrupt",
                   "lists group 1 more than once");
}

#if RLPT_HAS_DLPACK()

namespace {

struct tensor {
  std::vector<std::int64_t> shape, strides;
  DLTensor t{};
  tensor(void* data, DLDataType dt, std::vector<std::int64_t> s, std::vector<std::int64_t> st = {})
      : shape(std::move(s)), strides(std::move(st)) {
    t.data = data;
    t.device = {kDLCPU, 0};
    t.ndim = static_cast<std::int32_t>(shape.size());
    t.dtype = dt;
    t.shape = shape.data();
    t.strides = strides.empty() ? nullptr : strides.data();
  }
};

} // namespace

TEST_CASE("dlpack: null shapes, overflowing extents and byte ranges are rejected") {
  alignas(16) static float buf[64] = {};
  constexpr DLDataType f32{kDLFloat, 32, 1};
  constexpr std::int64_t big = INT64_MAX / 2;

  tensor null_shape(buf, f32, {4});
  null_shape.t.shape = nullptr; // crashed (null dereference)
  RLPT_CHECK_ERROR(rlpt::from_dlpack<float>(null_shape.t, "x"), "rlpt.dlpack.shape",
                   "x has 1 dimensions but a null shape");

  tensor numel(buf, f32, {big, 4}); // numel overflowed int64 (undefined), the view was accepted
  RLPT_CHECK_ERROR(rlpt::from_dlpack_2d<float>(numel.t, "x"), "rlpt.dlpack.shape", "more than 2^63");

  tensor bytes(buf, f32, {big}); // 2^62 floats: 2^64 bytes
  RLPT_CHECK_ERROR(rlpt::from_dlpack<float>(bytes.t, "x"), "rlpt.dlpack.shape", "the byte range overflows");

  tensor rows(buf, f32, {4, 2}, {big, 1}); // (rows - 1) * row_stride overflows
  RLPT_CHECK_ERROR(rlpt::from_dlpack_2d<float>(rows.t, "x"), "rlpt.dlpack.strides", "4 rows of stride");

  tensor offset(buf, f32, {4});
  offset.t.byte_offset = ~std::uint64_t{0} - 3; // data + byte_offset wrapped the address space
  RLPT_CHECK_ERROR(rlpt::from_dlpack<float>(offset.t, "x"), "rlpt.dlpack.shape", "wraps around");

  tensor lanes(buf, DLDataType{6, 8, 4}, {4}); // bool x4 was taken as a u8 mask
  RLPT_CHECK_ERROR(rlpt::from_dlpack<std::uint8_t>(lanes.t, "mask"), "rlpt.dlpack.dtype", "x4");

  // A device type outside DLDeviceType's enumerators is read as a number, not an enum.
  tensor odd(buf, f32, {4});
  const std::int32_t weird = 0x7fff0000;
  std::memcpy(&odd.t.device.device_type, &weird, sizeof(weird));
  RLPT_CHECK_ERROR(rlpt::from_dlpack<float>(odd.t, "x"), "rlpt.dlpack.device", "type 2147418112");

  // Still accepted: a one-row tensor with any row stride, and empty tensors with any shape.
  tensor one_row(buf, f32, {1, 8}, {-5, 1});
  CHECK(rlpt::from_dlpack_2d<float>(one_row.t).cols() == 8);
  tensor empty(nullptr, f32, {0, big});
  CHECK(rlpt::from_dlpack_2d<float>(empty.t).rows() == 0);
}

#endif
