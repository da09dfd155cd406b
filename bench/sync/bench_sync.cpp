// SPDX-License-Identifier: Apache-2.0
// Weight-sync micro-benchmarks: delta encode/apply at RL densities against dense copy+hash and
// memcpy of the same bytes, manifest JSON and planning at model scale.
//
//   build/sync/bench/sync/bench_sync --benchmark_counters_tabular=true
#include <rlpt/sync.hpp>

#include <benchmark/benchmark.h>

#include <cstring>
#include <map>
#include <random>
#include <vector>

using namespace rlpt::sync;

namespace {

constexpr std::size_t numel = std::size_t{16} << 20; // 32 MiB of bf16

struct pair_t {
  std::vector<std::byte> base, now;
};

const pair_t& inputs(double density) {
  static std::map<int, pair_t> cache;
  const int key = static_cast<int>(density * 10000);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  std::mt19937_64 g(3);
  pair_t p{std::vector<std::byte>(numel * 2), {}};
  for (std::size_t i = 0; i < p.base.size(); i += 8) {
    const std::uint64_t v = g();
    std::memcpy(&p.base[i], &v, 8);
  }
  p.now = p.base;
  std::bernoulli_distribution flip(density);
  for (std::size_t i = 0; i < numel; ++i)
    if (flip(g)) p.now[i * 2] ^= std::byte{1};
  return cache.emplace(key, std::move(p)).first->second;
}

void encode(benchmark::State& s) {
  const double density = static_cast<double>(s.range(0)) / 1000.0;
  const pair_t& p = inputs(density);
  delta_encoder enc(std::uint64_t{256} << 20);
  std::vector<std::byte> out;
  delta_stats st;
  for (auto _ : s) {
    out.clear();
    benchmark::DoNotOptimize(enc.encode(0, p.now, p.base, 2, 0, std::uint64_t{512} << 20, out, st));
  }
  s.SetBytesProcessed(static_cast<std::int64_t>(s.iterations() * p.now.size()));
  s.counters["wire_fraction"] = static_cast<double>(out.size()) / static_cast<double>(p.now.size());
}

void apply(benchmark::State& s) {
  const double density = static_cast<double>(s.range(0)) / 1000.0;
  const pair_t& p = inputs(density);
  std::vector<std::byte> out;
  delta_stats st;
  delta_encoder(std::uint64_t{256} << 20).encode(0, p.now, p.base, 2, 0, std::uint64_t{512} << 20, out, st);
  std::vector<std::byte> target = p.base;
  for (auto _ : s) {
    for_each_delta_record(out, "bench", [&](delta_record& r) {
      swap_apply(r, std::span<std::byte>(target).subspan(r.elem_begin * 2, r.elem_count * 2));
    });
    benchmark::ClobberMemory();
  }
  s.SetBytesProcessed(static_cast<std::int64_t>(s.iterations() * p.now.size()));
}

// What a dense update costs per byte on each side: copy into the slot and hash.
void dense_copy_hash(benchmark::State& s) {
  const pair_t& p = inputs(0.01);
  std::vector<std::byte> dst(p.now.size());
  for (auto _ : s) benchmark::DoNotOptimize(copy_hash(dst.data(), p.now.data(), p.now.size()));
  s.SetBytesProcessed(static_cast<std::int64_t>(s.iterations() * p.now.size()));
}

void plain_memcpy(benchmark::State& s) {
  const pair_t& p = inputs(0.01);
  std::vector<std::byte> dst(p.now.size());
  for (auto _ : s) {
    std::memcpy(dst.data(), p.now.data(), p.now.size());
    benchmark::ClobberMemory();
  }
  s.SetBytesProcessed(static_cast<std::int64_t>(s.iterations() * p.now.size()));
}

void plain_xxh3(benchmark::State& s) {
  const pair_t& p = inputs(0.01);
  for (auto _ : s) benchmark::DoNotOptimize(xxh3(p.now.data(), p.now.size()));
  s.SetBytesProcessed(static_cast<std::int64_t>(s.iterations() * p.now.size()));
}

// The sender's packing at model scale, beyond every cache: 1 GiB in 32 MiB tensor pieces
// (copy_hash, or XXH3 alone as the receiver verifies) against glibc copying the 1 GiB in one
// call (its non-temporal path, the transport benchmark's memcpy reference). Arg 0: memcpy,
// 1: copy_hash, 2: xxh3, 3: the library's one-shot XXH3.
void large(benchmark::State& s) {
  static std::vector<std::byte> src = [] {
    std::vector<std::byte> v(std::size_t{1} << 30);
    std::mt19937_64 g(5);
    for (std::size_t i = 0; i < v.size(); i += 8) {
      const std::uint64_t x = g();
      std::memcpy(v.data() + i, &x, 8);
    }
    return v;
  }();
  static std::vector<std::byte> dst(src.size(), std::byte{1});
  const std::size_t piece = std::size_t{32} << 20;
  for (auto _ : s) {
    std::uint64_t h = 0;
    if (s.range(0) == 0) std::memcpy(dst.data(), src.data(), src.size());
    for (std::size_t at = 0; s.range(0) != 0 && at < src.size(); at += piece) {
      if (s.range(0) == 1)
        h ^= copy_hash(dst.data() + at, src.data() + at, piece);
      else if (s.range(0) == 2)
        h ^= xxh3(src.data() + at, piece);
      else
        h ^= RLPT_SYNC_XXH3_64(src.data() + at, piece);
    }
    benchmark::DoNotOptimize(h);
    benchmark::ClobberMemory();
  }
  s.SetLabel(s.range(0) == 0   ? "memcpy 1 GiB"
             : s.range(0) == 1 ? "copy_hash"
             : s.range(0) == 2 ? "xxh3"
                               : "XXH3 one-shot");
  s.SetBytesProcessed(static_cast<std::int64_t>(s.iterations() * src.size()));
}

std::vector<tensor_ref> model_tensors(int n) {
  std::vector<tensor_ref> v;
  for (int i = 0; i < n; ++i)
    v.push_back({fmt::format("model.layers.{}.mlp.experts.{}.down_proj.weight", i / 128, i % 128),
                 wire_dtype::bf16,
                 {2048, 768},
                 nullptr});
  return v;
}

void plan_tensors(benchmark::State& s) {
  const auto ts = model_tensors(static_cast<int>(s.range(0)));
  for (auto _ : s) benchmark::DoNotOptimize(plan(ts).layout_hash());
  s.SetItemsProcessed(static_cast<std::int64_t>(s.iterations() * s.range(0)));
}

void manifest_json_parse(benchmark::State& s) {
  const std::string j = plan(model_tensors(static_cast<int>(s.range(0)))).to_json();
  for (auto _ : s) benchmark::DoNotOptimize(manifest::from_json(j).size());
  s.SetBytesProcessed(static_cast<std::int64_t>(s.iterations() * j.size()));
}

} // namespace

BENCHMARK(encode)->Name("delta_encode/permille")->Arg(10)->Arg(30)->Arg(100)->Arg(1000)->Unit(benchmark::kMillisecond);
BENCHMARK(apply)->Name("delta_apply/permille")->Arg(10)->Arg(30)->Arg(100)->Arg(1000)->Unit(benchmark::kMillisecond);
BENCHMARK(dense_copy_hash)->Unit(benchmark::kMillisecond);
BENCHMARK(plain_memcpy)->Unit(benchmark::kMillisecond);
BENCHMARK(plain_xxh3)->Unit(benchmark::kMillisecond);
BENCHMARK(large)->Name("large_1GiB")->DenseRange(0, 3)->Iterations(5)->Unit(benchmark::kMillisecond);
BENCHMARK(plan_tensors)->Arg(100000)->Unit(benchmark::kMillisecond);
BENCHMARK(manifest_json_parse)->Arg(10000)->Unit(benchmark::kMillisecond);
BENCHMARK_MAIN();
