// SPDX-License-Identifier: Apache-2.0
// bench_logprob_runner: times rlpt on the logits in DIR (the very arrays torch gets when
// scripts/bench-peers wrote them; this direct mode is for runs by hand, the harness uses the peer
// mode below), writes rlpt's outputs next to them for a correctness cross-check, and prints
// one JSON line: median seconds of the forward (and backward), effective GB/s, the copy bandwidth
// measured in the same run with the same threads, and the peak resident memory beyond the inputs
// and outputs (Linux VmHWM after a clear_refs reset; the gradient buffer counts as an output).
//
//   bench_logprob_runner DIR N V DTYPE TEMPERATURE THREADS REPEAT BACKWARD
//
// scripts/bench-peers (bench/peers/blocks/logprob.py) uses the peer mode: one thread, the outputs
// (and the gradient) allocated inside every call, the timing protocol of
// bench/support/peer_timing.hpp; PASS fwd times the forward, fwdbwd forward + backward (what
// torch's autograd step does); --out writes logp.f32, entropy.f32 and grad_head.f32 (64 rows).
//   bench_logprob_runner peer DIR N V DTYPE TEMPERATURE fwd|fwdbwd [--warmup N --calls N --flush B --out DIR]
//
// DIR holds logits.f32 or logits.bf16 ([N, V] little-endian; bf16 as raw 16-bit words),
// targets.i64, dlogp.f32, dentropy.f32. Outputs: rlpt_logp.f32, rlpt_entropy.f32 and, with
// BACKWARD=1, rlpt_grad.f32 (first 64 rows only, to keep the files small).
#include <rlpt/logprob.hpp>
#include <rlpt/core/thread_pool.hpp>

#include "support/bandwidth.hpp"
#include "support/peer_timing.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace {

template <class T> std::vector<T> load(const std::string& path, std::size_t n) {
  std::vector<T> v(n);
  std::ifstream in(path, std::ios::binary);
  if (!in.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(n * sizeof(T))))
    throw std::runtime_error("cannot read " + std::to_string(n) + " elements from " + path);
  return v;
}

template <class T> void save(const std::string& path, const T* p, std::size_t n) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(p), static_cast<std::streamsize>(n * sizeof(T)));
}

double median_seconds(int repeat, const std::function<void()>& fn) {
  fn(); // warm-up (page faults of the outputs, thread start)
  std::vector<double> t;
  for (int i = 0; i < repeat; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

//! VmRSS or VmHWM (peak RSS) of this process in kB, from /proc/self/status.
long status_kb(const char* field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(field, 0) == 0) return std::atol(line.c_str() + std::strlen(field) + 1);
  return -1;
}

//! Resets the peak-RSS mark (Linux: writing 5 to clear_refs), so a later VmHWM covers only what
//! follows; returns the current RSS.
long reset_peak_kb() {
  std::ofstream("/proc/self/clear_refs") << "5";
  return status_kb("VmRSS:");
}

template <class T>
int run(const std::string& dir, rlpt::index_t n, rlpt::index_t v, float temp, unsigned threads, int repeat,
        bool backward) {
  const auto nv = static_cast<std::size_t>(n * v);
  const auto x = load<T>(dir + (sizeof(T) == 2 ? "/logits.bf16" : "/logits.f32"), nv);
  const auto t = load<rlpt::index_t>(dir + "/targets.i64", static_cast<std::size_t>(n));
  const auto dl = load<float>(dir + "/dlogp.f32", static_cast<std::size_t>(n));
  const auto dh = load<float>(dir + "/dentropy.f32", static_cast<std::size_t>(n));
  std::vector<float> logp(static_cast<std::size_t>(n)), ent(logp.size()), lse(logp.size());
  std::vector<T> grad(backward ? nv : 0); // out of place (torch's autograd allocates it too), not timed as extra
  if (backward) std::fill(grad.begin(), grad.end(), T(0.0f));
  const long rss_inputs = reset_peak_kb();

  rlpt::thread_pool pool(threads);
  const rlpt::host_executor ex{threads > 1 ? &pool : nullptr};
  const rlpt::view2d<const T> xv(x.data(), n, v);
  const rlpt::logprob_options opt{.temperature = temp};
  const double fwd = median_seconds(
      repeat, [&] { rlpt::logprob_entropy(xv, t, {.logp = logp, .entropy = ent, .saved = {.lse = lse}}, opt, ex); });
  const long rss_fwd = status_kb("VmHWM:");
  save(dir + "/rlpt_logp.f32", logp.data(), logp.size());
  save(dir + "/rlpt_entropy.f32", ent.data(), ent.size());

  double bwd = 0;
  long rss_bwd = rss_fwd;
  if (backward) {
    bwd = median_seconds(repeat, [&] {
      rlpt::logprob_entropy_backward(xv, t, {.dlogp = dl, .dentropy = dh, .entropy = ent, .saved = {.lse = lse}},
                                     rlpt::view2d<T>(grad.data(), n, v), opt, ex);
    });
    rss_bwd = status_kb("VmHWM:");
    std::vector<float> head(static_cast<std::size_t>(std::min<rlpt::index_t>(n, 64) * v));
    for (std::size_t i = 0; i < head.size(); ++i) head[i] = static_cast<float>(grad[i]);
    save(dir + "/rlpt_grad.f32", head.data(), head.size());
  }
  const auto bw = rlpt::bench::measure_copy_bandwidth(std::size_t{1} << 30, 5, threads);
  const double bytes = static_cast<double>(nv * sizeof(T));
  std::printf("%s\n", fmt::format(R"({{"seconds": {}, "backward_seconds": {}, "gbps": {}, "backward_gbps": {}, )"
                                  R"("copy_gbps": {}, "threads": {}, "extra_fwd_bytes": {}, "extra_bwd_bytes": {}}})",
                                  fwd, bwd, bytes / fwd / 1e9, backward ? 2 * bytes / bwd / 1e9 : 0.0, bw.copy_gbps,
                                  threads, (rss_fwd - rss_inputs) * 1024, (rss_bwd - rss_inputs) * 1024)
                          .c_str());
  return 0;
}

template <class T>
int peer(const std::string& dir, rlpt::index_t n, rlpt::index_t v, float temp, bool backward,
         const rlpt::bench::timing_plan& plan) {
  const auto nv = static_cast<std::size_t>(n * v), un = static_cast<std::size_t>(n);
  const auto x = load<T>(dir + (sizeof(T) == 2 ? "/logits.bf16" : "/logits.f32"), nv);
  const auto t = load<rlpt::index_t>(dir + "/targets.i64", un);
  const auto dl = load<float>(dir + "/dlogp.f32", un);
  const auto dh = load<float>(dir + "/dentropy.f32", un);
  const rlpt::view2d<const T> xv(x.data(), n, v);
  const rlpt::logprob_options opt{.temperature = temp};
  struct result {
    std::unique_ptr<float[]> logp, ent, lse;
    std::unique_ptr<T[]> grad;
  };
  auto call = [&] {
    using rlpt::bench::output;
    result r{output<float>(un), output<float>(un), output<float>(un), backward ? output<T>(nv) : nullptr};
    const rlpt::view<float> logp(r.logp.get(), n), ent(r.ent.get(), n), lse(r.lse.get(), n);
    rlpt::logprob_entropy(xv, t, {.logp = logp, .entropy = ent, .saved = {.lse = lse}}, opt);
    if (backward)
      rlpt::logprob_entropy_backward(xv, t, {.dlogp = dl, .dentropy = dh, .entropy = ent, .saved = {.lse = lse}},
                                     rlpt::view2d<T>(r.grad.get(), n, v), opt);
    return r;
  };
  const auto times = rlpt::bench::time_calls(plan, call);
  const long base = reset_peak_kb();
  long peak = 0;
  {
    const result r = call();
    peak = status_kb("VmHWM:") - base;
    if (!plan.out.empty()) {
      save(plan.out + "/logp.f32", r.logp.get(), un);
      save(plan.out + "/entropy.f32", r.ent.get(), un);
      if (backward) {
        std::vector<float> head(static_cast<std::size_t>(std::min<rlpt::index_t>(n, 64) * v));
        for (std::size_t i = 0; i < head.size(); ++i) head[i] = static_cast<float>(r.grad[i]);
        save(plan.out + "/grad_head.f32", head.data(), head.size());
      }
    }
  }
  // peak: resident bytes one call adds (VmHWM after a clear_refs reset), outputs and gradient included
  std::printf("%s\n", fmt::format(R"({{"pass": "{}", "N": {}, "V": {}, "bytes": {}, "peak_extra_bytes": {}, {}}})",
                                  backward ? "fwdbwd" : "fwd", n, v, nv * sizeof(T), peak * 1024,
                                  rlpt::bench::json_series(times))
                          .c_str());
  return 0;
}

int peer_mode(int argc, char** argv) {
  const rlpt::bench::timing_plan plan = rlpt::bench::parse_timing(argc, argv);
  const std::string pass = argc == 8 ? argv[7] : "";
  if (pass != "fwd" && pass != "fwdbwd") {
    std::fprintf(stderr, "usage: bench_logprob_runner peer DIR N V f32|bf16 TEMPERATURE fwd|fwdbwd [timing]\n");
    return 2;
  }
  const std::string dir = argv[2], dtype = argv[5];
  const rlpt::index_t n = std::atoll(argv[3]), v = std::atoll(argv[4]);
  const auto temp = static_cast<float>(std::atof(argv[6]));
  if (dtype == "bf16") return peer<rlpt::bf16>(dir, n, v, temp, pass == "fwdbwd", plan);
  if (dtype == "f32") return peer<float>(dir, n, v, temp, pass == "fwdbwd", plan);
  std::fprintf(stderr, "unknown dtype %s\n", dtype.c_str());
  return 2;
}

} // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "peer") {
    try {
      return peer_mode(argc, argv);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "bench_logprob_runner: %s\n", e.what());
      return 1;
    }
  }
  if (argc != 9) {
    std::fprintf(stderr, "usage: bench_logprob_runner DIR N V f32|bf16 TEMPERATURE THREADS REPEAT BACKWARD\n");
    return 2;
  }
  try {
    const std::string dir = argv[1], dtype = argv[4];
    const rlpt::index_t n = std::atoll(argv[2]), v = std::atoll(argv[3]);
    const auto temp = static_cast<float>(std::atof(argv[5]));
    const auto threads = static_cast<unsigned>(std::atoi(argv[6]));
    const int repeat = std::atoi(argv[7]);
    const bool backward = std::atoi(argv[8]) != 0;
    if (dtype == "bf16") return run<rlpt::bf16>(dir, n, v, temp, threads, repeat, backward);
    if (dtype == "f32") return run<float>(dir, n, v, temp, threads, repeat, backward);
    std::fprintf(stderr, "unknown dtype %s\n", dtype.c_str());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
