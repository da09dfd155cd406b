// SPDX-License-Identifier: Apache-2.0
// Delta codec: round trips at several densities and dtypes, encoding choice, undo by
// re-application, checksums, validation and fuzzing of delta streams.
#include "sync_support.hpp"

using namespace rlpt::sync;
using rlpt::test::rng;

namespace {

struct delta_case {
  std::vector<std::byte> base, now;
  std::size_t eb;
};

delta_case make_case(wire_dtype dt, std::size_t n, double density, std::uint64_t seed) {
  rng r(seed);
  const std::size_t eb = size_of(dt);
  delta_case c{std::vector<std::byte>(n * eb), {}, eb};
  for (auto& b : c.base) b = static_cast<std::byte>(r.integer(0, 255));
  c.now = c.base;
  for (std::size_t i = 0; i < n; ++i)
    if (r.bernoulli(density))
      c.now[i * eb + static_cast<std::size_t>(r.integer(0, static_cast<std::int64_t>(eb) - 1))] ^=
          static_cast<std::byte>(r.integer(1, 255));
  return c;
}

// Applies every record of `stream` to `target` (a copy of the base).
void apply_all(std::vector<std::byte>& stream, std::vector<std::byte>& target, std::size_t eb) {
  for_each_delta_record(stream, "test", [&](delta_record& rec) {
    swap_apply(rec, std::span<std::byte>(target).subspan(rec.elem_begin * eb, rec.elem_count * eb));
  });
}

} // namespace

TEST_CASE("delta: encode then apply reproduces the new bytes at every density and element size") {
  const wire_dtype dts[] = {wire_dtype::bf16, wire_dtype::f32, wire_dtype::f64, wire_dtype::u8, wire_dtype::f16};
  const double densities[] = {0.0, 0.0001, 0.01, 0.03, 0.1, 0.5, 0.97, 1.0};
  std::uint64_t seed = 0;
  for (wire_dtype dt : dts)
    for (double d : densities)
      for (std::size_t n :
           {std::size_t{1}, std::size_t{63}, std::size_t{64}, std::size_t{65537}, std::size_t{200003}}) {
        CAPTURE(dt);
        CAPTURE(d);
        CAPTURE(n);
        delta_case c = make_case(dt, n, d, ++seed);
        std::vector<std::byte> stream;
        delta_stats st;
        delta_encoder enc(64 << 10); // small records: large tensors span several
        const std::uint64_t sum = enc.encode(3, c.now, c.base, c.eb, 77, 1 << 30, stream, st);
        CHECK(sum == xxh3(c.now.data(), c.now.size()));
        CHECK(st.elements == n);
        std::uint64_t changed = 0;
        for (std::size_t i = 0; i < n; ++i) changed += std::memcmp(&c.now[i * c.eb], &c.base[i * c.eb], c.eb) != 0;
        CHECK(st.changed == changed);
        CHECK(st.dense_bytes == n * c.eb);
        if (changed == 0) CHECK(stream.empty());
        std::vector<std::byte> target = c.base;
        apply_all(stream, target, c.eb);
        CHECK(rlpt::test::sync::same_bytes(target, c.now));
        apply_all(stream, target, c.eb); // swap-apply twice = undo
        CHECK(rlpt::test::sync::same_bytes(target, c.base));
        for_each_delta_record(stream, "test", [&](delta_record& rec) {
          CHECK(rec.tensor == 3);
          CHECK(rec.base_checksum == 77);
          CHECK(delta_header_bytes + rec.elem_count * c.eb <= (64u << 10)); // dense records fit max_record_bytes
        });
      }
}

TEST_CASE("delta: the encoding follows the density (sparse, then bitmap, then dense)") {
  auto encoding_at = [](double density) {
    delta_case c = make_case(wire_dtype::bf16, 1 << 16, density, 99);
    std::vector<std::byte> stream;
    delta_stats st;
    delta_encoder(std::uint64_t{1} << 30).encode(0, c.now, c.base, 2, 0, std::uint64_t{1} << 30, stream, st);
    REQUIRE(st.records == 1);
    return parse_delta_record(stream, "t").encoding;
  };
  CHECK(encoding_at(0.01) == delta_encoding::sparse);
  CHECK(encoding_at(0.025) == delta_encoding::sparse);
  CHECK(encoding_at(0.05) == delta_encoding::sparse);
  CHECK(encoding_at(0.08) == delta_encoding::bitmap);
  CHECK(encoding_at(0.5) == delta_encoding::bitmap);
  CHECK(encoding_at(0.99) == delta_encoding::dense);
}

TEST_CASE("delta: bytes on the wire at 1% of bf16 elements changed are >= 20x fewer than dense") {
  delta_case c = make_case(wire_dtype::bf16, 1 << 20, 0.01, 5);
  std::vector<std::byte> stream;
  delta_stats st;
  delta_encoder(std::uint64_t{64} << 20).encode(0, c.now, c.base, 2, 0, std::uint64_t{1} << 30, stream, st);
  CHECK(static_cast<double>(st.dense_bytes) / static_cast<double>(st.bytes) > 20.0);
}

TEST_CASE("delta: checksums of split tensors follow the bucket pieces") {
  delta_case c = make_case(wire_dtype::f32, 1000, 0.2, 8);
  std::vector<std::byte> stream;
  delta_stats st;
  const std::uint64_t sum = delta_encoder(4096).encode(0, c.now, c.base, 4, 0, 1024, stream, st);
  CHECK(sum == tensor_checksum(c.now.data(), c.now.size(), 1024));
  CHECK(sum != xxh3(c.now.data(), c.now.size()));
}

TEST_CASE("delta: input validation") {
  std::vector<std::byte> a(8), b(12), out;
  delta_stats st;
  delta_encoder enc(4096);
  RLPT_CHECK_ERROR(enc.encode(0, a, b, 4, 0, 64, out, st), "rlpt.sync.bad_delta", "has 8 bytes but its base has 12");
  RLPT_CHECK_ERROR(enc.encode(0, a, a, 3, 0, 64, out, st), "rlpt.sync.bad_delta", "element size 3");
  RLPT_CHECK_ERROR(delta_encoder(64), "rlpt.sync.bad_delta", "max_record_bytes 64 is too small");
}

TEST_CASE("delta: malformed records are rejected with what is wrong") {
  delta_case c = make_case(wire_dtype::bf16, 1000, 0.01, 3);
  std::vector<std::byte> good;
  delta_stats st;
  delta_encoder(1 << 20).encode(0, c.now, c.base, 2, 0, 1 << 30, good, st);
  REQUIRE(parse_delta_record(good, "t").encoding == delta_encoding::sparse);
  auto rehash = [](std::vector<std::byte>& v) {
    const std::uint64_t h = xxh3(v.data(), 56);
    std::memcpy(v.data() + 56, &h, 8);
  };
  {
    auto v = good;
    v[0] = std::byte{0};
    RLPT_CHECK_ERROR(static_cast<void>(parse_delta_record(v, "w")), "rlpt.sync.bad_delta", "w: delta record at byte 0",
                     "bad magic");
  }
  {
    auto v = good;
    v[20] ^= std::byte{1};
    RLPT_CHECK_ERROR(static_cast<void>(parse_delta_record(v, "w")), "rlpt.sync.bad_delta", "header checksum mismatch");
  }
  {
    auto v = good;
    v[4] = std::byte{9};
    rehash(v);
    RLPT_CHECK_ERROR(static_cast<void>(parse_delta_record(v, "w")), "rlpt.sync.bad_delta", "unknown encoding 9");
  }
  {
    auto v = good;
    std::uint64_t changed;
    std::memcpy(&changed, v.data() + 32, 8);
    changed += 8; // past the arrays' 8-byte padding
    std::memcpy(v.data() + 32, &changed, 8);
    rehash(v);
    RLPT_CHECK_ERROR(static_cast<void>(parse_delta_record(v, "w")), "rlpt.sync.bad_delta", "sparse body of");
  }
  {
    auto v = good; // an empty record (the encoder never writes one), dense so the body size still matches
    v[4] = std::byte{3};
    const std::uint64_t zeros[3] = {0, 0, 0}; // elem_count, changed, body bytes
    std::memcpy(v.data() + 24, zeros, sizeof(zeros));
    rehash(v);
    RLPT_CHECK_ERROR(static_cast<void>(parse_delta_record(v, "w")), "rlpt.sync.bad_delta",
                     "0 elements: a record covers 1 to 2^40 elements");
  }
  {
    auto v = good;
    v.resize(v.size() - 8);
    RLPT_CHECK_ERROR(static_cast<void>(parse_delta_record(v, "w")), "rlpt.sync.bad_delta", "runs past the stream");
  }
  {
    auto v = good; // indices out of order
    const auto r = parse_delta_record(v, "w");
    REQUIRE(r.changed >= 2);
    auto* lo = const_cast<std::uint16_t*>(r.lo);
    std::swap(lo[0], lo[1]);
    RLPT_CHECK_ERROR(static_cast<void>(parse_delta_record(v, "w")), "rlpt.sync.bad_delta", "not strictly increasing");
  }
}

TEST_CASE("delta: fuzzed streams parse and apply or fail cleanly, never writing out of range") {
  delta_case c = make_case(wire_dtype::bf16, 3000, 0.02, 4);
  delta_case d = make_case(wire_dtype::bf16, 3000, 0.4, 5);
  std::vector<std::byte> seed;
  delta_stats st;
  delta_encoder enc(2048);
  enc.encode(0, c.now, c.base, 2, 0, 1 << 30, seed, st);
  enc.encode(0, d.now, d.base, 2, 0, 1 << 30, seed, st);
  std::vector<std::byte> target(3000 * 2 + 64); // guard bytes past the tensor
  const auto rejected = rlpt::test::sync::fuzz(seed, 15000, 31, [&](const std::vector<std::byte>& in) {
    std::vector<std::byte> v(in); // std::vector data is suitably aligned
    std::fill(target.begin() + 6000, target.end(), std::byte{0xab});
    for_each_delta_record(v, "fuzz", [&](delta_record& rec) {
      RLPT_CHECK(rec.elem_bytes == 2 && rec.elem_begin <= 3000 && rec.elem_count <= 3000 - rec.elem_begin,
                 rlpt::errors::sync::bad_delta, "record outside the tensor");
      swap_apply(rec, std::span<std::byte>(target).subspan(rec.elem_begin * 2, rec.elem_count * 2));
    });
    for (std::size_t i = 6000; i < target.size(); ++i) REQUIRE(target[i] == std::byte{0xab});
  });
  CHECK(rejected > 0);
}
