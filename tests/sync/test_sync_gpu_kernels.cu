// SPDX-License-Identifier: Apache-2.0
// Device kernels of the sync transports against their host references on the same inputs:
// the gather/scatter copy kernel (with casts and wsum64), the checksum kernel, the device
// delta encoder (byte-identical to the host delta_encoder) and the device delta applier
// (apply, undo, malformed records refused before anything is written).
#include "support/errors.hpp"
#include "support/random.hpp"

#include <rlpt/cuda/sync/sync.cuh>
#include <rlpt/sync.hpp>

#include <doctest/doctest.h>

#include <cuda_runtime_api.h>

#include <chrono>
#include <cstring>
#include <limits>
#include <vector>

using namespace rlpt::sync;
using rlpt::test::rng;

namespace {

std::vector<std::byte> random_bytes(std::size_t n, rng& r) {
  std::vector<std::byte> v(n);
  for (auto& b : v) b = static_cast<std::byte>(r.integer(0, 255));
  return v;
}

struct dbuf { // device bytes with host upload/download
  detail::device_bytes d;
  explicit dbuf(std::size_t n) : d(std::max<std::size_t>(n, 1)) { RLPT_CUDA_CHECK(cudaMemset(d.get(), 0, d.size())); }
  explicit dbuf(const std::vector<std::byte>& h) : dbuf(h.size()) {
    if (!h.empty()) RLPT_CUDA_CHECK(cudaMemcpy(d.get(), h.data(), h.size(), cudaMemcpyHostToDevice));
  }
  [[nodiscard]] std::vector<std::byte> get(std::size_t n) const {
    std::vector<std::byte> h(n);
    if (n) RLPT_CUDA_CHECK(cudaMemcpy(h.data(), d.get(), n, cudaMemcpyDeviceToHost));
    return h;
  }
  [[nodiscard]] std::byte* ptr() const { return d.get(); }
};

} // namespace

TEST_CASE("sync gpu: the checksum kernel equals wsum64 on the host") {
  rng r(21);
  dbuf sum(8);
  for (std::size_t n : {1u, 8u, 13u, 4096u, 65537u, 3000001u}) {
    const auto h = random_bytes(n, r);
    dbuf d(h);
    RLPT_CUDA_CHECK(cudaMemset(sum.ptr(), 0, 8));
    run_checksum(d.ptr(), n, reinterpret_cast<std::uint64_t*>(sum.ptr()), nullptr);
    std::uint64_t raw = 0;
    RLPT_CUDA_CHECK(cudaMemcpy(&raw, sum.ptr(), 8, cudaMemcpyDeviceToHost));
    CHECK(wsum_finish(raw, n) == wsum(h.data(), n));
  }
}

TEST_CASE("sync gpu: pack, stage, unpack and apply kernels equal their host reference, casts and checksums included") {
  rng r(22);
  struct t_spec {
    const char* name;
    wire_dtype wire, src, dst;
    std::int64_t n;
  };
  const t_spec specs[] = {
      {"a", wire_dtype::bf16, wire_dtype::bf16, wire_dtype::bf16, 300001}, // many chunks, vector path
      {"b", wire_dtype::bf16, wire_dtype::f32, wire_dtype::f32, 70001},    // fp32 master -> bf16 -> fp32
      {"c", wire_dtype::f16, wire_dtype::f64, wire_dtype::f32, 1234},
      {"d", wire_dtype::u8, wire_dtype::u8, wire_dtype::u8, 99},
      {"e", wire_dtype::f32, wire_dtype::f32, wire_dtype::bf16, 5}};
  std::vector<tensor_entry> entries;
  std::vector<std::vector<std::byte>> src_h, dst_h;
  std::vector<dbuf> src_d, dst_d;
  std::vector<device_tensor> src_t, dst_t, src_host_t, dst_host_t;
  for (const auto& s : specs) {
    entries.push_back({s.name, s.wire, {s.n}, 0, 0, 0, 0});
    src_h.push_back(random_bytes(static_cast<std::size_t>(s.n) * size_of(s.src), r));
    dst_h.push_back(std::vector<std::byte>(static_cast<std::size_t>(s.n) * size_of(s.dst)));
  }
  for (std::size_t i = 0; i < std::size(specs); ++i) {
    src_d.emplace_back(src_h[i]);
    dst_d.emplace_back(dst_h[i].size());
  }
  for (std::size_t i = 0; i < std::size(specs); ++i) {
    src_t.push_back({specs[i].name, specs[i].src, {specs[i].n}, src_d[i].ptr()});
    dst_t.push_back({specs[i].name, specs[i].dst, {specs[i].n}, dst_d[i].ptr()});
    src_host_t.push_back({specs[i].name, specs[i].src, {specs[i].n}, src_h[i].data()});
    dst_host_t.push_back({specs[i].name, specs[i].dst, {specs[i].n}, dst_h[i].data()});
  }
  const manifest m = plan(entries, {.bucket_bytes = 256 << 10, .alignment = 256}); // "a" (600 KB) is split
  const auto piece_at = detail::piece_offsets(m);
  const std::size_t pieces = piece_at.back();
  // Host reference: pack -> buckets -> stage -> arena -> apply; and unpack straight from buckets.
  const auto pack_h = detail::plan_pack(m, detail::bind(m, src_host_t, "t", "source", true));
  std::vector<std::uint64_t> sums_h(pieces, 0);
  std::vector<std::vector<std::byte>> buckets_h(m.bucket_count());
  for (std::uint64_t b = 0; b < m.bucket_count(); ++b) {
    buckets_h[b].resize(m.bucket_size(b));
    detail::run_copy_host(pack_h.tasks, pack_h.launches[b], 0, reinterpret_cast<std::uintptr_t>(buckets_h[b].data()),
                          sums_h);
  }
  const auto unpack_h = detail::plan_unpack(m, detail::bind(m, dst_host_t, "t", "target", true));
  std::vector<std::uint64_t> usums_h(pieces, 0);
  for (std::uint64_t b = 0; b < m.bucket_count(); ++b)
    detail::run_copy_host(unpack_h.tasks, unpack_h.launches[b], reinterpret_cast<std::uintptr_t>(buckets_h[b].data()),
                          0, usums_h);
  CHECK(usums_h == sums_h);
  // Device: the same plans with device addresses.
  auto upload = [](const detail::copy_plan& p) {
    detail::device_bytes t(std::max<std::size_t>(1, p.tasks.size()) * sizeof(detail::copy_task));
    RLPT_CUDA_CHECK(
        cudaMemcpy(t.get(), p.tasks.data(), p.tasks.size() * sizeof(detail::copy_task), cudaMemcpyHostToDevice));
    return t;
  };
  const auto pack_p = detail::plan_pack(m, detail::bind(m, src_t, "t", "source", true));
  const auto pack_d = upload(pack_p);
  dbuf sums_d(pieces * 8);
  std::vector<dbuf> buckets_d;
  for (std::uint64_t b = 0; b < m.bucket_count(); ++b) {
    buckets_d.emplace_back(m.bucket_size(b));
    run_copy(pack_d.get<detail::copy_task>(), pack_p.launches[b], 0,
             reinterpret_cast<std::uintptr_t>(buckets_d[b].ptr()), reinterpret_cast<std::uint64_t*>(sums_d.ptr()),
             nullptr);
  }
  std::vector<std::uint64_t> sums(pieces);
  RLPT_CUDA_CHECK(cudaMemcpy(sums.data(), sums_d.ptr(), pieces * 8, cudaMemcpyDeviceToHost));
  CHECK(sums == sums_h);
  for (std::uint64_t b = 0; b < m.bucket_count(); ++b)
    CHECK_MESSAGE(buckets_d[b].get(m.bucket_size(b)) == buckets_h[b], "bucket ", b);
  SUBCASE("staged") {
    const auto stage_p = detail::plan_stage(m);
    const auto stage_d = upload(stage_p);
    dbuf arena(m.packed_bytes());
    dbuf ssum(pieces * 8);
    for (std::uint64_t b = 0; b < m.bucket_count(); ++b)
      run_copy(stage_d.get<detail::copy_task>(), stage_p.launches[b],
               reinterpret_cast<std::uintptr_t>(buckets_d[b].ptr()), reinterpret_cast<std::uintptr_t>(arena.ptr()),
               reinterpret_cast<std::uint64_t*>(ssum.ptr()), nullptr);
    std::vector<std::uint64_t> s(pieces);
    RLPT_CUDA_CHECK(cudaMemcpy(s.data(), ssum.ptr(), pieces * 8, cudaMemcpyDeviceToHost));
    CHECK(s == sums_h);
    const auto apply_p = detail::plan_apply_staged(m, detail::bind(m, dst_t, "t", "target", true));
    const auto apply_d = upload(apply_p);
    run_copy(apply_d.get<detail::copy_task>(), apply_p.launches[0], reinterpret_cast<std::uintptr_t>(arena.ptr()), 0,
             nullptr, nullptr);
  }
  SUBCASE("streaming") {
    const auto unpack_p = detail::plan_unpack(m, detail::bind(m, dst_t, "t", "target", true));
    const auto unpack_d = upload(unpack_p);
    dbuf usum(pieces * 8);
    for (std::uint64_t b = 0; b < m.bucket_count(); ++b)
      run_copy(unpack_d.get<detail::copy_task>(), unpack_p.launches[b],
               reinterpret_cast<std::uintptr_t>(buckets_d[b].ptr()), 0, reinterpret_cast<std::uint64_t*>(usum.ptr()),
               nullptr);
    std::vector<std::uint64_t> s(pieces);
    RLPT_CUDA_CHECK(cudaMemcpy(s.data(), usum.ptr(), pieces * 8, cudaMemcpyDeviceToHost));
    CHECK(s == sums_h);
  }
  RLPT_CUDA_CHECK(cudaDeviceSynchronize());
  for (std::size_t i = 0; i < std::size(specs); ++i)
    CHECK_MESSAGE(dst_d[i].get(dst_h[i].size()) == dst_h[i], "target ", specs[i].name);
}

namespace {

struct delta_case {
  manifest m;
  std::vector<std::vector<std::byte>> base, now;
  std::vector<std::uint64_t> base_sums;
};

delta_case make_case(double density, std::uint64_t seed) {
  rng r(seed);
  delta_case c;
  const std::pair<wire_dtype, std::uint64_t> specs[] = {{wire_dtype::bf16, 1000003},
                                                        {wire_dtype::f32, 70000},
                                                        {wire_dtype::u8, 131075},
                                                        {wire_dtype::f64, 999},
                                                        {wire_dtype::f16, 1}};
  std::vector<tensor_entry> e;
  for (std::size_t i = 0; i < std::size(specs); ++i) {
    const auto [dt, n] = specs[i];
    const std::size_t eb = size_of(dt);
    e.push_back({fmt::format("t{}", i), dt, {static_cast<std::int64_t>(n)}, 0, 0, 0, 0});
    c.base.push_back(random_bytes(n * eb, r));
    c.now.push_back(c.base.back());
    for (std::uint64_t k = 0; k < n; ++k)
      if (r.bernoulli(density))
        c.now.back()[k * eb + static_cast<std::size_t>(r.integer(0, static_cast<std::int64_t>(eb) - 1))] ^=
            std::byte{0x11};
    c.base_sums.push_back(static_cast<std::uint64_t>(r.integer(1, std::numeric_limits<std::int64_t>::max())));
  }
  c.m = plan(e, {.bucket_bytes = 1 << 20, .alignment = 256});
  return c;
}

} // namespace

TEST_CASE(
    "sync gpu: the device delta encoder writes the host encoder's bytes, and the applier applies, undoes and refuses") {
  const double densities[] = {0.0001, 0.01, 0.05, 0.3, 1.0};
  const std::uint64_t max_records[] = {4096, 300000, 1 << 20};
  std::uint64_t seed = 500;
  for (double density : densities)
    for (std::uint64_t max_record : max_records) {
      CAPTURE(density);
      CAPTURE(max_record);
      const delta_case c = make_case(density, ++seed);
      delta_encoder enc(max_record);
      std::vector<std::byte> stream;
      delta_stats st;
      for (std::size_t i = 0; i < c.m.size(); ++i)
        static_cast<void>(enc.encode(static_cast<std::uint32_t>(i), c.now[i], c.base[i], size_of(c.m[i].dtype),
                                     c.base_sums[i], c.m.bucket_bytes(), stream, st));
      std::vector<dbuf> now_d, base_d;
      std::vector<const void*> now_p, base_p;
      for (std::size_t i = 0; i < c.m.size(); ++i) {
        now_d.emplace_back(c.now[i]);
        base_d.emplace_back(c.base[i]);
      }
      for (std::size_t i = 0; i < c.m.size(); ++i) {
        now_p.push_back(now_d[i].ptr());
        base_p.push_back(base_d[i].ptr());
      }
      device_delta_encoder denc(c.m, now_p, base_p, max_record);
      const detail::delta_plan& p =
          denc.plan(c.base_sums, max_record, nullptr, after(std::chrono::seconds(60)), "test");
      CHECK(p.stats.changed == st.changed);
      CHECK(p.stats.bytes == stream.size());
      const auto raw = denc.tensor_raw_sums();
      for (std::size_t i = 0; i < c.m.size(); ++i)
        CHECK(wsum_finish(raw[i], c.m[i].nbytes) == wsum(c.now[i].data(), c.now[i].size()));
      std::vector<std::byte> device_stream;
      for (std::size_t k = 0; k < p.messages.size(); ++k) {
        dbuf out(p.messages[k].bytes + 64);
        RLPT_CUDA_CHECK(cudaMemset(out.ptr(), 0xcd, p.messages[k].bytes + 64)); // padding must be written, not left
        denc.write(k, out.ptr(), nullptr);
        const auto h = out.get(p.messages[k].bytes);
        device_stream.insert(device_stream.end(), h.begin(), h.end());
      }
      REQUIRE(device_stream.size() == stream.size());
      CHECK(device_stream == stream);

      // Apply the host stream on the device: targets start at the base version.
      if (stream.empty()) continue;
      dbuf arena(stream);
      std::vector<device_delta_record> recs;
      std::uint64_t at = 0;
      while (at < stream.size()) {
        device_delta_record d;
        d.head = detail::parse_delta_head(std::span<const std::byte>(stream).subspan(at, 64), "test", at);
        std::memcpy(d.header.data(), stream.data() + at, 64);
        d.at = at;
        d.target = base_d[d.head.tensor].ptr();
        recs.push_back(d);
        at += 64 + d.head.body;
      }
      device_delta_applier app;
      CHECK(app.apply(recs, arena.ptr(), nullptr, after(std::chrono::seconds(60)), "test").empty());
      RLPT_CUDA_CHECK(cudaDeviceSynchronize());
      for (std::size_t i = 0; i < c.m.size(); ++i)
        CHECK_MESSAGE(base_d[i].get(c.now[i].size()) == c.now[i], "applied tensor ", i);
      app.undo(nullptr);
      RLPT_CUDA_CHECK(cudaDeviceSynchronize());
      for (std::size_t i = 0; i < c.m.size(); ++i)
        CHECK_MESSAGE(base_d[i].get(c.base[i].size()) == c.base[i], "undone tensor ", i);
      CHECK(arena.get(stream.size()) == stream); // swapped twice: the records hold the new values again

      // A sparse record whose indices are not increasing is refused before anything moves.
      for (std::size_t j = 0; j < recs.size(); ++j) {
        if (recs[j].head.encoding != delta_encoding::sparse || recs[j].head.changed < 2) continue;
        std::uint32_t in_block0 = 0; // block_start[1]: entries of block 0
        std::memcpy(&in_block0, stream.data() + recs[j].at + 64 + 4, 4);
        if (in_block0 < 2) continue;
        auto bad = stream;
        const detail::delta_layout l =
            detail::layout_of(1, recs[j].head.elem_count, recs[j].head.changed, recs[j].head.elem_bytes);
        std::byte* lo = bad.data() + recs[j].at + l.lo_at;
        std::swap_ranges(lo, lo + 2, lo + 2); // the first two indices of block 0 change places
        dbuf bad_arena(bad);
        device_delta_applier strict;
        const std::string why = strict.apply(recs, bad_arena.ptr(), nullptr, after(std::chrono::seconds(60)), "test");
        CHECK(why.find("not strictly increasing") != std::string::npos);
        RLPT_CUDA_CHECK(cudaDeviceSynchronize());
        for (std::size_t i = 0; i < c.m.size(); ++i) CHECK(base_d[i].get(c.base[i].size()) == c.base[i]);
        break;
      }
    }
}
