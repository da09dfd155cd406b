// SPDX-License-Identifier: Apache-2.0
// Bucket planner and manifest: determinism, layout properties, JSON round trip, validation.
#include "sync_support.hpp"

using namespace rlpt::sync;
using rlpt::test::rng;

namespace {

std::vector<tensor_ref> random_tensors(rng& r, int n) {
  static constexpr wire_dtype dts[] = {wire_dtype::bf16, wire_dtype::f32, wire_dtype::u8, wire_dtype::f64,
                                       wire_dtype::i16};
  std::vector<tensor_ref> v;
  for (int i = 0; i < n; ++i) {
    std::vector<std::int64_t> shape;
    const auto rank = r.integer(0, 3);
    std::int64_t numel = 1;
    for (int d = 0; d < rank; ++d) {
      const std::int64_t dim = r.bernoulli(0.05) ? 0 : r.integer(1, r.bernoulli(0.2) ? 900 : 40);
      if (numel * dim > 20000) break; // keeps the piece count (and the test) small
      shape.push_back(dim);
      numel *= dim;
    }
    v.push_back({fmt::format("t{}", i), dts[r.integer(0, 4)], shape, nullptr});
  }
  return v;
}

} // namespace

TEST_CASE("planner: same inputs give the same plan and hash, any change moves the hash") {
  rng r(1);
  const auto ts = random_tensors(r, 200);
  const manifest a = plan(ts, {.bucket_bytes = 4096, .alignment = 64});
  const manifest b = plan(ts, {.bucket_bytes = 4096, .alignment = 64});
  CHECK(a.to_json() == b.to_json());
  CHECK(a.layout_hash() == b.layout_hash());
  CHECK(a.same_layout(b));
  auto renamed = ts;
  renamed[17].name = "other";
  CHECK(plan(renamed, {.bucket_bytes = 4096, .alignment = 64}).layout_hash() != a.layout_hash());
  auto reshaped = ts;
  reshaped[3].shape.push_back(1); // same bytes, different shape
  CHECK(plan(reshaped, {.bucket_bytes = 4096, .alignment = 64}).layout_hash() != a.layout_hash());
  CHECK(plan(ts, {.bucket_bytes = 8192, .alignment = 64}).layout_hash() != a.layout_hash());
  CHECK(plan(ts, {.bucket_bytes = 4096, .alignment = 128}).layout_hash() != a.layout_hash());
  // Checksums and versions are not part of the layout.
  manifest c = a;
  c.set_checksum(0, 1234);
  c.set_versions(9, 8);
  CHECK(c.layout_hash() == a.layout_hash());
  CHECK(c.to_json() != a.to_json());
}

TEST_CASE("planner: properties over random tensor lists (alignment, no overlap, splitting, packing)") {
  for (std::uint64_t seed = 0; seed < 60; ++seed) {
    rng r(100 + seed);
    const std::uint64_t align = std::uint64_t{1} << r.integer(0, 8);
    const std::uint64_t B = std::max<std::uint64_t>(256, align * static_cast<std::uint64_t>(r.integer(1, 40)));
    const auto ts = random_tensors(r, static_cast<int>(r.integer(1, 80)));
    const manifest m = plan(ts, {.bucket_bytes = B, .alignment = align});
    CAPTURE(seed);
    CAPTURE(B);
    REQUIRE(m.size() == ts.size());
    std::vector<std::uint64_t> covered(m.size(), 0);
    std::uint64_t prev_linear_end = 0;
    for (std::size_t i = 0; i < m.size(); ++i) {
      const auto& t = m[i];
      CHECK(t.name == ts[i].name); // order preserved
      CHECK(t.offset % align == 0);
      const std::uint64_t start = t.bucket * B + t.offset;
      CHECK(start >= prev_linear_end); // in order, never overlapping
      prev_linear_end = start + t.nbytes;
      if (t.nbytes > B)
        CHECK(t.offset == 0);
      else
        CHECK(t.offset + t.nbytes <= B);
    }
    std::uint64_t packed = 0;
    for (std::uint64_t b = 0; b < m.bucket_count(); ++b) {
      CHECK(m.bucket_size(b) <= B);
      CHECK(m.bucket_packed_offset(b) == packed);
      packed += m.bucket_size(b);
      std::uint64_t end = 0;
      REQUIRE_FALSE(m.pieces(b).empty());
      for (const piece& p : m.pieces(b)) {
        CHECK(p.bucket_offset >= end);
        end = p.bucket_offset + p.nbytes;
        covered[p.tensor] += p.nbytes;
        // A tensor's packed position is where its pieces land in the packed layout.
        CHECK(m.packed_offset(p.tensor) + p.tensor_offset == m.bucket_packed_offset(b) + p.bucket_offset);
      }
      CHECK(end == m.bucket_size(b));
    }
    CHECK(packed == m.packed_bytes());
    for (std::size_t i = 0; i < m.size(); ++i) CHECK(covered[i] == m[i].nbytes); // reassembly covers every byte once
  }
}

TEST_CASE("planner: a tensor larger than a bucket is split and the next tensor follows its tail") {
  const std::vector<tensor_ref> ts = {{"small", wire_dtype::f32, {10}, nullptr},
                                      {"big", wire_dtype::u8, {2500}, nullptr},
                                      {"after", wire_dtype::u8, {100}, nullptr},
                                      {"exact", wire_dtype::u8, {2048}, nullptr},
                                      {"next", wire_dtype::u8, {1}, nullptr}};
  const manifest m = plan(ts, {.bucket_bytes = 1024, .alignment = 256});
  CHECK(m[0].bucket == 0);
  CHECK(m[1].bucket == 1); // fresh bucket
  CHECK(m[1].offset == 0);
  CHECK(m.piece_count(1) == 3);
  CHECK(m[2].bucket == 3); // tail of "big" is 452 bytes in bucket 3
  CHECK(m[2].offset == 512);
  CHECK(m[3].bucket == 4); // exactly two buckets
  CHECK(m[4].bucket == 6); // starts fresh after an exact fit
  CHECK(m[4].offset == 0);
  CHECK(m.bucket_count() == 7);
  CHECK(m.bucket_size(3) == 612);
  // The split tensor's checksum combines its piece checksums.
  std::vector<std::byte> bytes(2500);
  for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<std::byte>(i * 7);
  const std::uint64_t parts[3] = {xxh3(bytes.data(), 1024), xxh3(bytes.data() + 1024, 1024),
                                  xxh3(bytes.data() + 2048, 452)};
  CHECK(tensor_checksum(bytes.data(), 2500, 1024) == combine_piece_checksums(parts));
  CHECK(tensor_checksum(bytes.data(), 1000, 1024) == xxh3(bytes.data(), 1000));
}

TEST_CASE("manifest: JSON round trip and hash check") {
  const auto md = rlpt::test::sync::make_model(3);
  manifest m = plan(md.refs, {.bucket_bytes = 1024, .alignment = 256});
  m.set_versions(42, 41);
  for (std::size_t i = 0; i < m.size(); ++i) m.set_checksum(i, 0x0123456789abcdefull * (i + 1));
  const manifest back = manifest::from_json(m.to_json());
  CHECK(back.to_json() == m.to_json());
  CHECK(back.version() == 42);
  CHECK(back.base_version() == 41);
  CHECK(back[5].checksum == m[5].checksum);
  std::string tampered = m.to_json();
  const auto at = tampered.find("\"offset\":256");
  REQUIRE(at != std::string::npos);
  tampered.replace(at, 12, "\"offset\":512");
  RLPT_CHECK_ERROR(manifest::from_json(tampered), "rlpt.sync.manifest_hash", "does not match its layout");
}

TEST_CASE("manifest: validation errors name the tensor and the values") {
  using E = tensor_entry;
  RLPT_CHECK_ERROR(manifest({E{"a", wire_dtype::f32, {2}, 0, 0, 9, 0}}, 64, 8), "rlpt.sync.bad_manifest",
                   "tensor \"a\" says nbytes 9 but F32 [2] has 8 bytes");
  RLPT_CHECK_ERROR(manifest({E{"a", wire_dtype::f32, {2}, 0, 4, 8, 0}}, 64, 8), "rlpt.sync.bad_manifest",
                   "tensor \"a\" at offset 4");
  RLPT_CHECK_ERROR(
      manifest({E{"a", wire_dtype::f32, {2}, 0, 0, 8, 0}, E{"b", wire_dtype::f32, {2}, 0, 0, 8, 0}}, 64, 8),
      "rlpt.sync.bad_manifest", "tensors \"a\" and \"b\" overlap");
  RLPT_CHECK_ERROR(
      manifest({E{"a", wire_dtype::f32, {2}, 0, 0, 8, 0}, E{"a", wire_dtype::f32, {2}, 0, 8, 8, 0}}, 64, 8),
      "rlpt.sync.bad_manifest", "tensor name \"a\" appears twice");
  RLPT_CHECK_ERROR(manifest({E{"a", wire_dtype::u8, {100}, 0, 8, 100, 0}}, 64, 8), "rlpt.sync.bad_manifest",
                   "is split over buckets (100 bytes > 64) and must start at offset 0, not 8");
  RLPT_CHECK_ERROR(manifest({E{"a", wire_dtype::u8, {8}, 2, 0, 8, 0}}, 64, 8), "rlpt.sync.bad_manifest",
                   "spans 3 buckets but has only 1 pieces");
  RLPT_CHECK_ERROR(manifest({E{"a", wire_dtype::u8, {8}, std::uint64_t{1} << 62, 0, 8, 0}}, 64, 8),
                   "rlpt.sync.bad_manifest", "lies beyond 2^64 bytes");
  RLPT_CHECK_ERROR(manifest({E{"a", wire_dtype::u8, {-1}, 0, 0, 0, 0}}, 64, 8), "rlpt.sync.bad_shape",
                   "negative dimension -1");
  RLPT_CHECK_ERROR(manifest({}, 60, 8), "rlpt.sync.bad_manifest",
                   "bucket_bytes 60 is not a multiple of the alignment 8");
  RLPT_CHECK_ERROR(manifest({}, 64, 3), "rlpt.sync.bad_manifest", "alignment must be a power of two, got 3");
  RLPT_CHECK_ERROR(plan(std::vector<tensor_ref>{}, {.bucket_bytes = 0}), "rlpt.sync.bad_plan", "must be positive");
  RLPT_CHECK_ERROR(manifest({E{"a", wire_dtype::u8, {std::int64_t{1} << 40}, 0, 0, std::uint64_t{1} << 40, 0}}, 64, 8,
                            {.max_pieces = 1000}),
                   "rlpt.sync.bad_manifest", "more than 1000 bucket pieces");
  const std::string ok = plan(std::vector<tensor_ref>{{"w", wire_dtype::f32, {4}, nullptr}}).to_json();
  auto edit = [&](std::string_view from, std::string_view to) {
    std::string s = ok;
    const auto at = s.find(from);
    REQUIRE(at != std::string::npos);
    s.replace(at, from.size(), to);
    return s;
  };
  RLPT_CHECK_ERROR(manifest::from_json(edit("\"F32\"", "\"F4\"")), "rlpt.sync.bad_manifest", "unsupported dtype F4");
  RLPT_CHECK_ERROR(manifest::from_json(edit("\"format\"", "\"formats\"")), "rlpt.sync.bad_manifest",
                   "unknown key \"formats\"");
  RLPT_CHECK_ERROR(manifest::from_json(edit("\"version\":0", "\"version\":-1")), "rlpt.sync.bad_manifest",
                   "\"version\" of the document is not an unsigned integer");
  RLPT_CHECK_ERROR(manifest::from_json(edit("\"checksum\":\"0000000000000000\"", "\"checksum\":\"00\"")),
                   "rlpt.sync.bad_manifest", "checksum of tensor #0 (\"w\") is not 16 hex digits");
  RLPT_CHECK_ERROR(manifest::from_json("[]"), "rlpt.sync.bad_manifest", "not an object");
}

TEST_CASE("manifest: fuzzed JSON is accepted only when valid, never crashes") {
  const auto md = rlpt::test::sync::make_model(5, 1);
  manifest m = plan(md.refs, {.bucket_bytes = 1024, .alignment = 64});
  const auto seed = rlpt::test::sync::to_bytes(m.to_json());
  int accepted = 0;
  rlpt::test::sync::fuzz(seed, 6000, 21, [&](const std::vector<std::byte>& in) {
    const manifest x = manifest::from_json(std::string_view(reinterpret_cast<const char*>(in.data()), in.size()));
    ++accepted;
    CHECK(manifest::from_json(x.to_json()).to_json() == x.to_json()); // what parses is self-consistent
  });
  CHECK(accepted >= 0);
}
