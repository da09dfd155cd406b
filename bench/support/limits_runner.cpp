// SPDX-License-Identifier: Apache-2.0
// bench_limits: the hardware limits scripts/bench-peers states results against, measured in the
// same rounds as the comparison, with the same timing protocol (support/peer_timing.hpp).
//
//   bench_limits copy BYTES [timing]
//       single-thread memcpy of BYTES between two buffers touched beforehand; the harness
//       counts bytes read + written per CPU second.
//   bench_limits fresh BYTES [timing]
//       allocates BYTES with new[] inside the call, writes every byte once and releases it after
//       the clock is read: what a call that allocates its outputs (as torch.empty does for a
//       peer, and the runners do per call) pays before it computes anything. Large blocks come
//       from fresh mmap'd pages, so this is the kernel's page-fault cost of the outputs.
//   bench_limits expsum DIR N V f32|bf16 [timing]
//       rlpt's own SIMD exp (rlpt::detail::simd::exp, in the build the logprob row kernels
//       choose: AVX-512 or AVX2 where the CPU has it) summed over every logit of
//       DIR/logits.{f32,bf16}: one read and one exp per logit (each 512-column chunk loaded,
//       then exponentiated, as the row kernels read a row), the compute limit of the logprob
//       row passes.
//   bench_limits streams TOTAL_MB BUCKET_MB 3|4 [timing]
//       the memory streams of a weight sync on two threads (one per core, as the shm transport's
//       two processes): thread A copies the model bucket by bucket into one of two slots of
//       BUCKET_MB, thread B reads each slot (3 streams: model read, slot write, slot read) or
//       copies it on into destination weights (4 streams). One call = one model; cpu_s is the
//       busier thread's CPU time of the call (the rate with a core per side), wall_s the wall time.
//   bench_limits streams TOTAL_MB BUCKET_MB 4+hash [timing]
//       the 4 streams with both copies made by rlpt::sync::copy_hash (XXH3 of every byte, as the
//       transport's sender and receiver compute it): the limit of a transport that checksums
//       every byte on each side's one thread.
//
//   [timing] = --warmup N --calls N --flush BYTES (see support/peer_timing.hpp)
#include <rlpt/core/copy.hpp>
#include <rlpt/logprob/detail/row_kernels.hpp>
#include <rlpt/logprob/detail/simd.hpp>
#include <rlpt/sync/checksum.hpp>

#include "support/peer_timing.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {

using rlpt::bench::timing_plan;

int copy(std::size_t bytes, const timing_plan& plan) {
  std::vector<char> src(bytes, 1), dst(bytes, 0); // both touched: no page faults are timed
  const auto t = rlpt::bench::time_calls(plan, [&] {
    std::memcpy(dst.data(), src.data(), bytes);
    asm volatile("" : : "r"(dst.data()) : "memory");
  });
  std::printf("%s\n", fmt::format(R"({{"op": "copy", "bytes": {}, {}}})", bytes, rlpt::bench::json_series(t)).c_str());
  return 0;
}

// The first touch of freshly allocated memory, the cheapest way rlpt knows: huge pages asked for over
// the whole block, then each 4 MiB mapped in one call (prefault_for_write, as copy_bytes and the
// kernels writing fresh outputs do) and written.
int fresh(std::size_t bytes, const timing_plan& plan) {
  const auto t = rlpt::bench::time_calls(plan, [&] {
    auto out = rlpt::bench::output<char>(bytes); // the runners' output allocation, released after the clock
    constexpr std::size_t window = std::size_t{4} << 20;
    rlpt::detail::advise_huge_pages(out.get(), bytes);
    for (std::size_t off = 0; off < bytes; off += window) {
      const std::size_t n = std::min(window, bytes - off);
      rlpt::detail::prefault_for_write(out.get() + off, n);
      std::memset(out.get() + off, 1, n);
    }
    asm volatile("" : : "r"(out.get()) : "memory");
    return out;
  });
  std::printf("%s\n", fmt::format(R"({{"op": "fresh", "bytes": {}, {}}})", bytes, rlpt::bench::json_series(t)).c_str());
  return 0;
}

// --- exp + sum: the compute limit of the logprob row passes ---------------------------------

namespace simd = rlpt::detail::simd;

// The row is read as the row kernels read it: a chunk of row_chunk columns is loaded first, in a
// tight loop, then exponentiated from L1. Loading each block just before its exp (one load per
// ~40 instructions) kept too few lines in flight: on the 2-vCPU Xeon that loop read memory at
// 2.3 GB/s, half the row kernels' rate, and the "limit" came out at 45 % of rlpt's own forward.
template <int NB, class T> RLPT_LOGPROB_HOST_INLINE float expsum_row_body(const T* x, rlpt::index_t n) {
  constexpr int W = simd::lanes;
  simd::vf<NB> z[rlpt::detail::row_chunk / W];
  simd::vf<NB> acc = simd::splat<NB>(0.0f);
  rlpt::index_t c0 = 0;
  for (; c0 + rlpt::detail::row_chunk <= n; c0 += rlpt::detail::row_chunk) {
    for (int b = 0; b < rlpt::detail::row_chunk / W; ++b) z[b] = simd::load<NB>(x + c0 + b * W);
    for (int b = 0; b < rlpt::detail::row_chunk / W; ++b) acc = acc + simd::exp<NB>(z[b]);
  }
  rlpt::index_t j = c0;
  for (; j + W <= n; j += W) acc = acc + simd::exp<NB>(simd::load<NB>(x + j));
  float tail = 0.0f;
  for (; j < n; ++j) tail += rlpt::detail::exp_poly(static_cast<float>(x[j]));
  return simd::hsum<NB>(acc) + tail;
}

// GCC turns the f32 chunk load into its memcpy idiom (`rep movsq` of 2 KiB), which read memory
// 35 % slower than the row kernels' vector loads on the Xeon: the limit must load as they do.
#if defined(__GNUC__) && !defined(__clang__)
#define RLPT_BENCH_LOADS optimize("no-tree-loop-distribute-patterns")
#else
#define RLPT_BENCH_LOADS
#endif

template <class T>
__attribute__((RLPT_HOST_LOOP_ATTR, RLPT_BENCH_LOADS)) float expsum_row_generic(const T* x, rlpt::index_t n) {
  return expsum_row_body<simd::baseline_bytes>(x, n);
}
#if RLPT_LOGPROB_X86_DISPATCH()
template <class T>
RLPT_LOGPROB_AVX2 __attribute__((RLPT_BENCH_LOADS)) float expsum_row_avx2(const T* x, rlpt::index_t n) {
  return expsum_row_body<32>(x, n);
}
#endif
#if RLPT_LOGPROB_AVX512_CLONE()
template <class T>
RLPT_LOGPROB_AVX512 __attribute__((RLPT_BENCH_LOADS)) float expsum_row_avx512(const T* x, rlpt::index_t n) {
  return expsum_row_body<64>(x, n);
}
#endif

template <class T> double expsum(const T* x, rlpt::index_t rows, rlpt::index_t cols) {
  using rlpt::detail::row_isa;
  auto row = &expsum_row_generic<T>;
#if RLPT_LOGPROB_X86_DISPATCH()
  if (rlpt::detail::row_kernels_isa() == row_isa::avx2) row = &expsum_row_avx2<T>;
#endif
#if RLPT_LOGPROB_AVX512_CLONE()
  if (rlpt::detail::row_kernels_isa() == row_isa::avx512) row = &expsum_row_avx512<T>;
#endif
  double total = 0.0;
  for (rlpt::index_t r = 0; r < rows; ++r) total += row(x + r * cols, cols);
  return total;
}

const char* isa_name() {
  using rlpt::detail::row_isa;
  const row_isa isa = rlpt::detail::row_kernels_isa();
  return isa == row_isa::avx512 ? "avx512" : isa == row_isa::avx2 ? "avx2" : "generic";
}

template <class T> int expsum_mode(const std::string& dir, rlpt::index_t n, rlpt::index_t v, const timing_plan& plan) {
  const auto nv = static_cast<std::size_t>(n * v);
  const auto x = rlpt::bench::read_raw<T>(dir + (sizeof(T) == 2 ? "/logits.bf16" : "/logits.f32"), nv);
  double sum = 0.0;
  const auto t = rlpt::bench::time_calls(plan, [&] { sum = expsum(x.data(), n, v); });
  std::printf("%s\n", fmt::format(R"({{"op": "expsum", "N": {}, "V": {}, "bytes": {}, "isa": "{}", "sum": {}, {}}})", n,
                                  v, nv * sizeof(T), isa_name(), sum, rlpt::bench::json_series(t))
                          .c_str());
  return 0;
}

// --- memory streams of a weight sync ------------------------------------------------------------

int streams(std::size_t total, std::size_t bucket, int nstreams, bool hashed, const timing_plan& plan) {
  const std::size_t buckets = (total + bucket - 1) / bucket;
  std::vector<char> model(total, 1), weights(nstreams == 4 ? total : 0, 0);
  std::vector<char> slots[2] = {std::vector<char>(bucket, 0), std::vector<char>(bucket, 0)};
  // slot state: 0 free, 1 full; `pass` starts a model (A and B wait on it between calls)
  std::atomic<int> state[2] = {0, 0};
  std::atomic<int> pass{0}, done{0};
  std::atomic<bool> stop{false};
  double cpu_a = 0, cpu_b = 0;
  std::uint64_t sink = 0;
  auto worker_a = [&] {
    for (int p = 1;; ++p) {
      for (int seen = pass.load(); seen < p; seen = pass.load()) {
        if (stop.load()) return;
        pass.wait(seen);
      }
      if (stop.load()) return;
      const double c0 = rlpt::bench::thread_cpu_seconds();
      for (std::size_t b = 0; b < buckets; ++b) {
        auto& s = state[b % 2];
        while (s.load(std::memory_order_acquire) != 0) s.wait(1);
        const std::size_t off = b * bucket, len = std::min(bucket, total - off);
        if (hashed)
          (void)rlpt::sync::copy_hash(slots[b % 2].data(), model.data() + off, len); // (sink is thread B's)
        else
          std::memcpy(slots[b % 2].data(), model.data() + off, len);
        s.store(1, std::memory_order_release);
        s.notify_one();
      }
      cpu_a = rlpt::bench::thread_cpu_seconds() - c0;
      done.fetch_add(1);
      done.notify_all();
    }
  };
  auto worker_b = [&] {
    for (int p = 1;; ++p) {
      for (int seen = pass.load(); seen < p; seen = pass.load()) {
        if (stop.load()) return;
        pass.wait(seen);
      }
      if (stop.load()) return;
      const double c0 = rlpt::bench::thread_cpu_seconds();
      for (std::size_t b = 0; b < buckets; ++b) {
        auto& s = state[b % 2];
        while (s.load(std::memory_order_acquire) != 1) s.wait(0);
        const std::size_t off = b * bucket, len = std::min(bucket, total - off);
        if (nstreams == 4 && hashed) {
          sink += rlpt::sync::copy_hash(weights.data() + off, slots[b % 2].data(), len);
        } else if (nstreams == 4) {
          std::memcpy(weights.data() + off, slots[b % 2].data(), len);
        } else { // read every byte (4 independent sums: bound by the reads, not by the adds)
          const auto* w = reinterpret_cast<const std::uint64_t*>(slots[b % 2].data());
          std::uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0;
          for (std::size_t i = 0; i + 4 <= len / 8; i += 4) a0 += w[i], a1 += w[i + 1], a2 += w[i + 2], a3 += w[i + 3];
          sink += a0 + a1 + a2 + a3;
        }
        s.store(0, std::memory_order_release);
        s.notify_one();
      }
      cpu_b = rlpt::bench::thread_cpu_seconds() - c0;
      done.fetch_add(1);
      done.notify_all();
    }
  };
  std::thread ta(worker_a), tb(worker_b);
  int started = 0;
  rlpt::bench::call_times t;
  std::vector<double> ca, cb;
  auto one_pass = [&] {
    ++started;
    const int target = 2 * started;
    const double w0 = rlpt::bench::wall_seconds();
    pass.store(started);
    pass.notify_all();
    for (int d = done.load(); d < target; d = done.load()) done.wait(d);
    return rlpt::bench::wall_seconds() - w0;
  };
  for (int i = 0; i < plan.warmup; ++i) {
    rlpt::bench::flush_caches(plan.flush);
    (void)one_pass();
  }
  for (int i = 0; i < plan.calls; ++i) {
    rlpt::bench::flush_caches(plan.flush);
    t.wall.push_back(one_pass());
    t.cpu.push_back(std::max(cpu_a, cpu_b));
    ca.push_back(cpu_a);
    cb.push_back(cpu_b);
  }
  stop.store(true);
  pass.store(started + 1);
  pass.notify_all();
  ta.join();
  tb.join();
  std::printf("%s\n",
              fmt::format(R"({{"op": "streams", "streams": {}, "hashed": {}, "bytes": {}, "bucket_bytes": {}, {}, )"
                          R"("a_cpu_s": {}, "b_cpu_s": {}, "sink": {}}})",
                          nstreams, hashed, total, bucket, rlpt::bench::json_series(t), rlpt::bench::json_array(ca),
                          rlpt::bench::json_array(cb), sink % 2)
                  .c_str());
  return 0;
}

int usage() {
  std::fprintf(stderr, "usage: bench_limits copy BYTES [timing]\n"
                       "       bench_limits fresh BYTES [timing]\n"
                       "       bench_limits expsum DIR N V f32|bf16 [timing]\n"
                       "       bench_limits streams TOTAL_MB BUCKET_MB 3|4|4+hash [timing]\n");
  return 2;
}

} // namespace

int main(int argc, char** argv) {
  try {
    const timing_plan plan = rlpt::bench::parse_timing(argc, argv);
    if (argc < 2) return usage();
    const std::string op = argv[1];
    if (op == "copy" && argc == 3) return copy(std::strtoull(argv[2], nullptr, 10), plan);
    if (op == "fresh" && argc == 3) return fresh(std::strtoull(argv[2], nullptr, 10), plan);
    if (op == "expsum" && argc == 6) {
      const std::string dtype = argv[5];
      if (dtype == "f32") return expsum_mode<float>(argv[2], std::atoll(argv[3]), std::atoll(argv[4]), plan);
      if (dtype == "bf16") return expsum_mode<rlpt::bf16>(argv[2], std::atoll(argv[3]), std::atoll(argv[4]), plan);
    }
    if (op == "streams" && argc == 5) {
      const std::string n = argv[4];
      if (n == "3" || n == "4" || n == "4+hash")
        return streams(std::strtoull(argv[2], nullptr, 10) << 20, std::strtoull(argv[3], nullptr, 10) << 20,
                       n == "3" ? 3 : 4, n == "4+hash", plan);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_limits: %s\n", e.what());
    return 1;
  }
  return usage();
}
