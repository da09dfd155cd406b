// SPDX-License-Identifier: Apache-2.0
// Host-testable logic of the device transports (include/rlpt/cuda/sync/*.hpp): the wsum64
// checksum, the element casts against the host `cast` transform, the copy plans run by their
// host reference, and the device delta planner against the host delta_encoder's records.
#include "sync_support.hpp"

#include <rlpt/cuda/sync/cast.hpp>
#include <rlpt/cuda/sync/copy_plan.hpp>
#include <rlpt/cuda/sync/delta_plan.hpp>
#include <rlpt/cuda/sync/wsum.hpp>

#include <bit>
#include <limits>

using namespace rlpt::sync;
using rlpt::test::rng;

namespace {

std::vector<std::byte> random_bytes(std::size_t n, rng& r) {
  std::vector<std::byte> v(n);
  for (auto& b : v) b = static_cast<std::byte>(r.integer(0, 255));
  return v;
}

// wsum64 spelled out from its definition (file comment of wsum.hpp), independently of wsum.hpp.
std::uint64_t wsum_reference(const std::vector<std::byte>& v) {
  auto mix = [](std::uint64_t x) {
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
  };
  std::uint64_t raw = 0;
  for (std::size_t w = 0; w * 8 < v.size(); ++w) {
    std::uint64_t word = 0;
    for (std::size_t k = 0; k < 8 && w * 8 + k < v.size(); ++k)
      word |= std::uint64_t{std::to_integer<unsigned char>(v[w * 8 + k])} << (8 * k);
    raw += mix(word + (w + 1) * 0x9e3779b97f4a7c15ull);
  }
  return mix(raw ^ mix(v.size() + 0x5851f42d4c957f2dull));
}

} // namespace

TEST_CASE("device sync: wsum64 matches its definition, adds over 8-byte-aligned pieces and sees every change") {
  rng r(1);
  for (std::size_t n : {0u, 1u, 7u, 8u, 9u, 63u, 64u, 1000u, 4099u}) {
    const auto v = random_bytes(n, r);
    CHECK(wsum(v.data(), n) == wsum_reference(v));
    for (std::size_t cut = 0; cut <= n; cut += 8) { // any 8-aligned split: raw sums add up
      const std::uint64_t raw = wsum_raw(v.data(), cut, 0) + wsum_raw(v.data() + cut, n - cut, cut);
      CHECK(wsum_finish(raw, n) == wsum(v.data(), n));
    }
    if (n == 0) continue;
    auto w = v; // one flipped bit anywhere changes the checksum
    const auto at = static_cast<std::size_t>(r.integer(0, static_cast<std::int64_t>(n) - 1));
    w[at] ^= std::byte{0x10};
    CHECK(wsum(w.data(), n) != wsum(v.data(), n));
    if (n >= 16) { // so does swapping two different words (a position-blind sum would not see it)
      auto s = v;
      std::swap_ranges(s.begin(), s.begin() + 8, s.begin() + 8);
      if (!std::equal(v.begin(), v.begin() + 8, v.begin() + 8)) CHECK(wsum(s.data(), n) != wsum(v.data(), n));
    }
  }
  // The length counts: trailing zero bytes change the checksum.
  const std::vector<std::byte> z4(4), z8(8);
  CHECK(wsum(z4.data(), 4) != wsum(z8.data(), 8));
}

TEST_CASE("device sync: element casts are bit-identical to the host cast transform, NaN payloads included") {
  const wire_dtype fl[] = {wire_dtype::f32, wire_dtype::f64, wire_dtype::f16, wire_dtype::bf16};
  rng r(2);
  for (wire_dtype from : fl) {
    const std::size_t fb = size_of(from);
    // Random bit patterns (NaNs with payloads, infinities, subnormals, both zeros) plus normals.
    std::vector<std::byte> src = random_bytes(fb * 4096, r);
    for (std::size_t i = 0; i < 256; ++i) { // special values at the front
      const std::uint64_t specials[] = {0,
                                        0x8000000000000000ull,
                                        0x7ff0000000000000ull,
                                        0x7ff8000000000001ull,
                                        0xfff4000000000abcull,
                                        1,
                                        0x7f800000u,
                                        0x7fc00001u,
                                        0xff800001u,
                                        0x7c00u,
                                        0x7e01u,
                                        0x7f81u,
                                        0x0001u,
                                        0x8001u,
                                        0x3c00u,
                                        0x3f80u};
      const std::uint64_t s = specials[i % std::size(specials)];
      std::memcpy(src.data() + i * fb, &s, fb);
    }
    for (wire_dtype to : fl) {
      if (from == to) continue;
      const std::size_t tb = size_of(to);
      for (std::size_t i = 0; i < 4096; ++i) {
        std::uint64_t want = 0, got = 0;
        detail::store_float(to, reinterpret_cast<std::byte*>(&want), detail::load_float(from, src.data() + i * fb));
        detail::cast_element(from, to, reinterpret_cast<const unsigned char*>(src.data() + i * fb),
                             reinterpret_cast<unsigned char*>(&got));
        if (got != want) {
          std::uint64_t in = 0;
          std::memcpy(&in, src.data() + i * fb, fb);
          FAIL_CHECK(fmt::format("{} -> {}: input bits {:#x} gave {:#x}, the host transform {:#x}", name(from),
                                 name(to), in, got, want));
        }
        (void)tb;
      }
    }
  }
  CHECK(detail::castable(wire_dtype::bf16));
  CHECK_FALSE(detail::castable(wire_dtype::i32));
  CHECK(detail::elem_bytes(wire_dtype::bf16) == 2);
  CHECK(detail::elem_bytes(wire_dtype::f64) == 8);
  CHECK(detail::elem_bytes(wire_dtype::u8) == 1);
}

namespace {

struct dev_model { // "device" tensors in host memory: the host reference runs the same tables
  std::vector<std::vector<std::byte>> storage;
  std::vector<device_tensor> tensors;
  void add(std::string name, wire_dtype dt, std::vector<std::int64_t> shape, rng& r) {
    std::uint64_t n = size_of(dt);
    for (auto d : shape) n *= static_cast<std::uint64_t>(d);
    std::vector<std::byte> bytes(static_cast<std::size_t>(n) + 16);
    rlpt::test::sync::model::fill(bytes, dt, r);
    storage.push_back(std::move(bytes));
    tensors.push_back({std::move(name), dt, std::move(shape), nullptr});
    for (std::size_t i = 0; i < tensors.size(); ++i) tensors[i].data = storage[i].data();
  }
};

std::vector<tensor_entry> entries_of(const dev_model& d, wire_dtype wire_for_f32) {
  std::vector<tensor_entry> e;
  for (const auto& t : d.tensors)
    e.push_back({t.name, t.dtype == wire_dtype::f32 ? wire_for_f32 : t.dtype, t.shape, 0, 0, 0, 0});
  return e;
}

} // namespace

TEST_CASE("device sync: pack plans lay buckets out as the manifest says and checksum every piece") {
  rng r(3);
  dev_model d;
  d.add("a", wire_dtype::bf16, {33, 7}, r); // odd sizes: tails inside words
  d.add("b", wire_dtype::f32, {300}, r);    // master weights cast to bf16 on the wire
  d.add("c", wire_dtype::u8, {5}, r);
  d.add("big", wire_dtype::f32, {2000}, r); // 4000 wire bytes: split over 1 KiB buckets
  d.add("empty", wire_dtype::bf16, {0}, r);
  d.add("f64", wire_dtype::f64, {17}, r);
  const manifest m = plan(entries_of(d, wire_dtype::bf16), {.bucket_bytes = 1024, .alignment = 64});
  detail::check_device_manifest(m, "test");
  const auto src = detail::bind(m, d.tensors, "test", "source", true);
  const detail::copy_plan p = detail::plan_pack(m, src);
  REQUIRE(p.launches.size() == m.bucket_count());
  const auto piece_at = detail::piece_offsets(m);
  std::vector<std::uint64_t> sums(piece_at.back(), 0);
  // Expected wire bytes of every tensor: cast where the source differs.
  std::vector<std::vector<std::byte>> wire(m.size());
  for (std::size_t i = 0; i < m.size(); ++i) {
    wire[i].resize(m[i].nbytes);
    for (std::uint64_t e = 0; e < m[i].numel(); ++e)
      detail::cast_element(d.tensors[i].dtype, m[i].dtype,
                           reinterpret_cast<const unsigned char*>(d.storage[i].data()) +
                               e * size_of(d.tensors[i].dtype),
                           reinterpret_cast<unsigned char*>(wire[i].data()) + e * size_of(m[i].dtype));
  }
  std::vector<std::uint64_t> raw(m.size(), 0);
  for (std::uint64_t b = 0; b < m.bucket_count(); ++b) {
    std::vector<std::byte> bucket(m.bucket_size(b) + 8, std::byte{0xee});
    detail::run_copy_host(p.tasks, p.launches[b], 0, reinterpret_cast<std::uintptr_t>(bucket.data()), sums);
    const auto pieces = m.pieces(b);
    for (std::size_t j = 0; j < pieces.size(); ++j) {
      const piece& pc = pieces[j];
      // An empty tensor's piece has 0 bytes and a null data(): memcmp of a null pointer is undefined.
      CHECK((pc.nbytes == 0 ||
             std::memcmp(bucket.data() + pc.bucket_offset, wire[pc.tensor].data() + pc.tensor_offset, pc.nbytes) == 0));
      CHECK(sums[piece_at[b] + j] == wsum_raw(wire[pc.tensor].data() + pc.tensor_offset, pc.nbytes, pc.tensor_offset));
      raw[pc.tensor] += sums[piece_at[b] + j];
    }
    CHECK(bucket[m.bucket_size(b)] == std::byte{0xee}); // nothing written past the bucket
  }
  for (std::size_t i = 0; i < m.size(); ++i)
    CHECK(wsum_finish(raw[i], m[i].nbytes) == wsum(wire[i].data(), m[i].nbytes));
  CHECK(m.piece_count(*m.find("big")) == 4);
}

TEST_CASE("device sync: stage, apply and unpack plans deliver the wire bytes into cast targets") {
  rng r(4);
  dev_model s; // sender: bf16 wire tensors
  s.add("w", wire_dtype::bf16, {100, 3}, r);
  s.add("v", wire_dtype::bf16, {1500}, r); // 3000 bytes: split
  s.add("n", wire_dtype::f32, {9}, r);
  const manifest m = plan(entries_of(s, wire_dtype::f32), {.bucket_bytes = 1024, .alignment = 256});
  const auto src = detail::bind(m, s.tensors, "test", "source", true);
  const detail::copy_plan pack = detail::plan_pack(m, src);
  const auto piece_at = detail::piece_offsets(m);
  std::vector<std::uint64_t> sums(piece_at.back(), 0);
  std::vector<std::vector<std::byte>> buckets(m.bucket_count());
  for (std::uint64_t b = 0; b < m.bucket_count(); ++b) {
    buckets[b].resize(m.bucket_size(b));
    detail::run_copy_host(pack.tasks, pack.launches[b], 0, reinterpret_cast<std::uintptr_t>(buckets[b].data()), sums);
  }
  // Receiver targets: "w" as f32, "v" as bf16 (same), "n" as f64.
  dev_model t;
  t.add("w", wire_dtype::f32, {100, 3}, r);
  t.add("v", wire_dtype::bf16, {1500}, r);
  t.add("n", wire_dtype::f64, {9}, r);
  const auto dst = detail::bind(m, t.tensors, "test", "target", true);
  auto expect = [&](std::size_t i, std::vector<std::byte>& out) {
    out.resize(m[i].numel() * size_of(t.tensors[i].dtype));
    for (std::uint64_t e = 0; e < m[i].numel(); ++e)
      detail::cast_element(s.tensors[i].dtype, t.tensors[i].dtype,
                           reinterpret_cast<const unsigned char*>(s.storage[i].data()) +
                               e * size_of(s.tensors[i].dtype),
                           reinterpret_cast<unsigned char*>(out.data()) + e * size_of(t.tensors[i].dtype));
  };
  SUBCASE("staged: slots -> arena (checksummed), then arena -> targets") {
    const detail::copy_plan stage = detail::plan_stage(m);
    std::vector<std::byte> arena(m.packed_bytes());
    std::vector<std::uint64_t> got(piece_at.back(), 0);
    for (std::uint64_t b = 0; b < m.bucket_count(); ++b)
      detail::run_copy_host(stage.tasks, stage.launches[b], reinterpret_cast<std::uintptr_t>(buckets[b].data()),
                            reinterpret_cast<std::uintptr_t>(arena.data()), got);
    CHECK(got == sums);
    const detail::copy_plan apply = detail::plan_apply_staged(m, dst);
    detail::run_copy_host(apply.tasks, apply.launches[0], reinterpret_cast<std::uintptr_t>(arena.data()), 0, got);
  }
  SUBCASE("streaming: slots -> targets directly") {
    const detail::copy_plan unpack = detail::plan_unpack(m, dst);
    std::vector<std::uint64_t> got(piece_at.back(), 0);
    for (std::uint64_t b = 0; b < m.bucket_count(); ++b)
      detail::run_copy_host(unpack.tasks, unpack.launches[b], reinterpret_cast<std::uintptr_t>(buckets[b].data()), 0,
                            got);
    CHECK(got == sums);
  }
  for (std::size_t i = 0; i < m.size(); ++i) {
    std::vector<std::byte> want;
    expect(i, want);
    CHECK_MESSAGE(std::memcmp(t.storage[i].data(), want.data(), want.size()) == 0, "target ", m[i].name);
  }
  // Checksum-only plan over the targets that hold wire bytes ("v").
  std::vector<device_tensor> only_v{t.tensors[1]};
  const auto at = detail::bind(m, only_v, "test", "target", false);
  const detail::copy_plan chk = detail::plan_checksum(m, at);
  std::vector<std::uint64_t> c(m.size(), 0);
  detail::run_copy_host(chk.tasks, chk.launches[0], 0, 0, c);
  CHECK(wsum_finish(c[1], m[1].nbytes) == wsum(s.storage[1].data(), m[1].nbytes));
  CHECK(c[0] == 0);
}

TEST_CASE("device sync: binding sources and targets rejects what a kernel could not handle") {
  rng r(5);
  dev_model d;
  d.add("a", wire_dtype::bf16, {4, 4}, r);
  d.add("i", wire_dtype::i32, {8}, r);
  const manifest m = plan(entries_of(d, wire_dtype::f32), {.bucket_bytes = 1024, .alignment = 64});
  auto bad = d.tensors;
  bad[0].shape = {16};
  RLPT_CHECK_ERROR(detail::bind(m, bad, "here", "source", true), "rlpt.sync.bad_source", "here", "\"a\"", "[16]",
                   "[4, 4]");
  bad = d.tensors;
  bad[1].dtype = wire_dtype::f32;
  RLPT_CHECK_ERROR(detail::bind(m, bad, "here", "target", true), "rlpt.sync.bad_source", "\"i\"", "F32", "I32");
  bad = d.tensors;
  bad[0].data = static_cast<std::byte*>(bad[0].data) + 1;
  RLPT_CHECK_ERROR(detail::bind(m, bad, "here", "source", true), "rlpt.sync.bad_source", "not aligned", "2-byte");
  bad = d.tensors;
  bad[0].name = "zzz";
  RLPT_CHECK_ERROR(detail::bind(m, bad, "here", "source", true), "rlpt.sync.unknown_tensor", "\"zzz\"");
  bad = {d.tensors[0]};
  RLPT_CHECK_ERROR(detail::bind(m, bad, "here", "source", true), "rlpt.sync.bad_source", "\"i\"", "has no source");
  bad = {d.tensors[0], d.tensors[0]};
  RLPT_CHECK_ERROR(detail::bind(m, bad, "here", "source", false), "rlpt.sync.bad_source", "bound twice");
  const manifest m4 = plan(entries_of(d, wire_dtype::f32), {.bucket_bytes = 1024, .alignment = 4});
  RLPT_CHECK_ERROR(detail::check_device_manifest(m4, "here"), "rlpt.sync.bad_plan", "alignment of at least 8", "4");
}

namespace {

struct delta_fixture {
  manifest m;
  std::vector<std::vector<std::byte>> base, now;
  std::vector<std::uint64_t> base_sums;
};

delta_fixture make_delta(std::vector<std::pair<wire_dtype, std::uint64_t>> specs, double density, std::uint64_t seed) {
  rng r(seed);
  delta_fixture f;
  std::vector<tensor_entry> e;
  for (std::size_t i = 0; i < specs.size(); ++i) {
    const auto [dt, n] = specs[i];
    e.push_back({fmt::format("t{}", i), dt, {static_cast<std::int64_t>(n)}, 0, 0, 0, 0});
    const std::size_t eb = size_of(dt);
    f.base.push_back(random_bytes(n * eb, r));
    f.now.push_back(f.base.back());
    for (std::uint64_t k = 0; k < n; ++k)
      if (r.bernoulli(density))
        f.now.back()[k * eb + static_cast<std::size_t>(r.integer(0, static_cast<std::int64_t>(eb) - 1))] ^=
            std::byte{0x41};
    f.base_sums.push_back(static_cast<std::uint64_t>(r.integer(0, std::numeric_limits<std::int64_t>::max())));
  }
  f.m = plan(e, {.bucket_bytes = 1 << 20, .alignment = 256});
  return f;
}

} // namespace

TEST_CASE("device sync: the device delta planner chooses the host encoder's records, headers and messages") {
  const double densities[] = {0.0, 0.0005, 0.02, 0.3, 0.99, 1.0};
  const std::uint64_t max_records[] = {1024, 5000, 1 << 20};
  std::uint64_t seed = 100;
  for (double density : densities)
    for (std::uint64_t max_record : max_records) {
      CAPTURE(density);
      CAPTURE(max_record);
      const delta_fixture f = make_delta({{wire_dtype::bf16, 200000},
                                          {wire_dtype::f32, 777},
                                          {wire_dtype::u8, 70001},
                                          {wire_dtype::f64, 9000},
                                          {wire_dtype::f16, 3}},
                                         density, ++seed);
      // Host encoder: the records the host sender would send.
      delta_encoder enc(max_record);
      std::vector<std::byte> stream;
      delta_stats host_stats;
      for (std::size_t i = 0; i < f.m.size(); ++i)
        static_cast<void>(enc.encode(static_cast<std::uint32_t>(i), f.now[i], f.base[i], size_of(f.m[i].dtype),
                                     f.base_sums[i], f.m.bucket_bytes(), stream, host_stats));
      // Device planner, with its count pass run by the host reference on host memory.
      std::uint64_t chunks = 0;
      auto ranges = detail::plan_delta_ranges(f.m, max_record, chunks);
      for (auto& rg : ranges) {
        rg.now = reinterpret_cast<std::uintptr_t>(f.now[rg.tensor].data());
        rg.base = reinterpret_cast<std::uintptr_t>(f.base[rg.tensor].data());
      }
      std::vector<std::uint32_t> counts(chunks, 0);
      std::vector<std::uint64_t> raw(f.m.size(), 0);
      detail::delta_count_host(ranges, counts, raw);
      for (std::size_t i = 0; i < f.m.size(); ++i)
        CHECK(wsum_finish(raw[i], f.m[i].nbytes) == wsum(f.now[i].data(), f.m[i].nbytes));
      const detail::delta_plan p = detail::plan_delta(ranges, counts, f.base_sums, max_record);
      CHECK(p.stats.changed == host_stats.changed);
      CHECK(p.stats.elements == host_stats.elements);
      CHECK(p.stats.dense_bytes == host_stats.dense_bytes);
      CHECK(p.stats.bytes == host_stats.bytes);
      CHECK(p.stats.records == host_stats.records);
      for (int k = 0; k < 4; ++k) CHECK(p.stats.by_encoding[k] == host_stats.by_encoding[k]);
      CHECK(p.stats.bytes == stream.size());
      // Same headers in the same order, each at the host stream's offset.
      std::uint64_t at = 0;
      for (const auto& rec : p.records) {
        REQUIRE(at + 64 <= stream.size());
        CHECK(std::memcmp(rec.header.data(), stream.data() + at, 64) == 0);
        const detail::delta_head h =
            detail::parse_delta_head(std::span<const std::byte>(stream).subspan(at, 64), "test", at);
        CHECK(h.encoding == rec.encoding);
        CHECK(delta_header_bytes + h.body == rec.total);
        at += rec.total;
      }
      CHECK(at == stream.size());
      // Messages: the host sender's grouping (records never straddle, at most max_msg bytes
      // unless one record is larger on its own).
      std::uint64_t msg_at = 0;
      std::size_t next = 0;
      for (const auto& msg : p.messages) {
        CHECK(msg.record_begin == next);
        std::uint64_t end = msg_at, n = 0;
        while (end < stream.size()) {
          std::uint64_t body;
          std::memcpy(&body, stream.data() + end + 40, 8);
          if (end > msg_at && end + 64 + body - msg_at > max_record) break;
          end += 64 + body;
          ++n;
        }
        CHECK(msg.record_end - msg.record_begin == n);
        CHECK(msg.bytes == end - msg_at);
        msg_at = end;
        next = msg.record_end;
      }
      CHECK(next == p.records.size());
    }
}

TEST_CASE("device sync: delta record headers are parsed and checked like parse_delta_record does") {
  const delta_fixture f = make_delta({{wire_dtype::bf16, 5000}}, 0.01, 7);
  delta_encoder enc(1 << 20);
  std::vector<std::byte> stream;
  delta_stats st;
  static_cast<void>(enc.encode(0, f.now[0], f.base[0], 2, 42, f.m.bucket_bytes(), stream, st));
  REQUIRE(stream.size() > 64);
  const detail::delta_head h = detail::parse_delta_head(std::span<const std::byte>(stream).first(64), "hdr", 0);
  CHECK(h.tensor == 0);
  CHECK(h.elem_bytes == 2);
  CHECK(h.base_checksum == 42);
  CHECK(h.elem_count == 5000);
  CHECK(h.encoding == delta_encoding::sparse);
  auto bad = stream;
  bad[20] ^= std::byte{1};
  RLPT_CHECK_ERROR(detail::parse_delta_head(std::span<const std::byte>(bad).first(64), "hdr", 128),
                   "rlpt.sync.bad_delta", "hdr", "byte 128", "header checksum");
  bad = stream;
  bad[0] = std::byte{0};
  RLPT_CHECK_ERROR(detail::parse_delta_head(std::span<const std::byte>(bad).first(64), "hdr", 0), "rlpt.sync.bad_delta",
                   "magic");
  RLPT_CHECK_ERROR(detail::parse_delta_head(std::span<const std::byte>(stream).first(10), "hdr", 0),
                   "rlpt.sync.bad_delta", "10 header bytes");
  // Layout offsets agree with the host encoder's body.
  const detail::delta_layout l = detail::layout_of(1, h.elem_count, h.changed, 2);
  CHECK(l.total == 64 + h.body);
  CHECK(l.blocks == 1);
  // The count helper counts changed elements of any width inside a word.
  CHECK(detail::nonzero_elements(0x0001000000000100ull, 2) == 2);
  CHECK(detail::nonzero_elements(0x8000000000000000ull, 1) == 1);
  CHECK(detail::nonzero_elements(0x0000000100000000ull, 4) == 1);
  CHECK(detail::nonzero_elements(0, 8) == 0);
  CHECK(detail::byte_mask(2, 4) == 0x00000000ffff0000ull);
}
