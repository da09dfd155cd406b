// SPDX-License-Identifier: Apache-2.0
// What the GPU benchmarks (bench_*_gpu) share: the hardware figure a target is stated against,
// measured in the same run (device-to-device copy bandwidth), CUDA-event timing, counting the
// GPU operations a call enqueues (by capturing it into a CUDA graph), and the printed verdicts
// plus the one JSON line per benchmark that scripts/gpu-check-run's logs are turned into the
// docs table from.
//
// Conventions, printed by every benchmark that uses them:
// - copy bandwidth = (bytes read + bytes written) / s of one cudaMemcpyAsync device-to-device,
//   the fastest of the repeats (the hardest reference);
// - a kernel's bandwidth = the bytes it must move (read + written, counted explicitly) / its
//   median time, so it compares with the copy bandwidth directly;
// - one read of B bytes = B / copy bandwidth (the HBM moves B bytes; a copy of B bytes moves 2B
//   and takes twice as long).
// A missed target is printed "NOT met" and is not an error: a benchmark exits non-zero only when
// something fails (CUDA, cuBLAS or an rlpt error), and 77 when it sees no device.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <exception>
#include <vector>

namespace rlpt::bench::gpu {

//! A failed CUDA call of the benchmark itself: an error (exit 1), never a missed target.
inline void check(cudaError_t e, const char* what, const char* file, int line) {
  if (e == cudaSuccess) return;
  std::fprintf(stderr, "%s:%d: %s: %s\n", file, line, what, cudaGetErrorString(e));
  std::exit(1);
}
#define RLPT_BENCH_CUDA(expr) ::rlpt::bench::gpu::check((expr), #expr, __FILE__, __LINE__)

//! Number of CUDA devices, 0 when the runtime finds none (the sticky status is cleared).
inline int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

//! The benchmark's "no device" exit: 77, reported as skipped by scripts/gpu-check-run.
inline int no_device(const char* bench) {
  std::printf("%s: no CUDA device, nothing measured\n", bench);
  return 77;
}

template <class T> T* device_alloc(std::size_t n) {
  void* p = nullptr;
  RLPT_BENCH_CUDA(cudaMalloc(&p, std::max<std::size_t>(n, 1) * sizeof(T)));
  return static_cast<T*>(p);
}

//! Writes 4 x the L2 size on `stream` so that the next call starts with a cold L2 (inputs of a
//! few hundred MB would otherwise be partly served from the previous repeat's L2 lines).
inline void flush_l2(cudaStream_t stream) {
  static char* buf = nullptr;
  static std::size_t bytes = 0;
  if (buf == nullptr) {
    int dev = 0, l2 = 0;
    RLPT_BENCH_CUDA(cudaGetDevice(&dev));
    RLPT_BENCH_CUDA(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev));
    bytes = std::max<std::size_t>(std::size_t{4} * static_cast<std::size_t>(l2), std::size_t{64} << 20);
    buf = device_alloc<char>(bytes);
  }
  RLPT_BENCH_CUDA(cudaMemsetAsync(buf, static_cast<int>(bytes & 0xff), bytes, stream));
}

struct timing {
  double median_ms = 0, min_ms = 0, max_ms = 0;
  int repeats = 0;
};

//! Times `fn` (which enqueues work on `stream`) with CUDA events around each call: `warmup`
//! untimed calls, then `repeat` timed ones, each after an L2 flush (outside the events) when
//! `cold` is set.
inline timing time_calls(cudaStream_t stream, int repeat, int warmup, const std::function<void()>& fn,
                         bool cold = true) {
  cudaEvent_t a = nullptr, b = nullptr;
  RLPT_BENCH_CUDA(cudaEventCreate(&a));
  RLPT_BENCH_CUDA(cudaEventCreate(&b));
  for (int i = 0; i < warmup; ++i) fn();
  std::vector<double> t;
  for (int i = 0; i < repeat; ++i) {
    if (cold) flush_l2(stream);
    RLPT_BENCH_CUDA(cudaEventRecord(a, stream));
    fn();
    RLPT_BENCH_CUDA(cudaEventRecord(b, stream));
    RLPT_BENCH_CUDA(cudaEventSynchronize(b));
    float ms = 0;
    RLPT_BENCH_CUDA(cudaEventElapsedTime(&ms, a, b));
    t.push_back(static_cast<double>(ms));
  }
  RLPT_BENCH_CUDA(cudaEventDestroy(a));
  RLPT_BENCH_CUDA(cudaEventDestroy(b));
  std::sort(t.begin(), t.end());
  return {t[t.size() / 2], t.front(), t.back(), repeat};
}

struct copy_limit {
  double bytes_per_s = 0; //!< (bytes read + bytes written) / s of the fastest copy
  double bytes = 0;       //!< bytes copied per call (each read once and written once)
  double ms = 0;          //!< the fastest copy
};

//! Device-to-device copy bandwidth: cudaMemcpyAsync of `bytes` between two fresh buffers,
//! fastest of `repeat` after 2 warm-ups, counting bytes read plus bytes written.
inline copy_limit measure_copy(cudaStream_t stream, std::size_t bytes = std::size_t{4} << 30, int repeat = 10) {
  char* src = device_alloc<char>(bytes);
  char* dst = device_alloc<char>(bytes);
  RLPT_BENCH_CUDA(cudaMemsetAsync(src, 1, bytes, stream));
  RLPT_BENCH_CUDA(cudaMemsetAsync(dst, 0, bytes, stream));
  const timing t = time_calls(
      stream, repeat, 2, [&] { RLPT_BENCH_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream)); },
      false);
  RLPT_BENCH_CUDA(cudaStreamSynchronize(stream));
  RLPT_BENCH_CUDA(cudaFree(src));
  RLPT_BENCH_CUDA(cudaFree(dst));
  const auto b = static_cast<double>(bytes);
  return {2.0 * b / (t.min_ms * 1e-3), b, t.min_ms};
}

inline void print_copy(const copy_limit& c) {
  std::printf(
      "device copy bandwidth: %.1f GB/s (read + written) = cudaMemcpyAsync D2D of %.2f GB in %.3f ms, fastest of "
      "10\n  convention: a kernel's bandwidth counts the bytes it must read and write; one read of B bytes "
      "takes B / copy bandwidth (half the time a D2D copy of B bytes takes)\n",
      c.bytes_per_s / 1e9, c.bytes / 1e9, c.ms);
}

//! The GPU operations one call enqueues, counted from a CUDA graph it was captured into.
struct launch_count {
  bool captured = false;
  std::string error; //!< why capture failed (the call used something a graph cannot hold)
  int kernels = 0, memsets = 0, memcpys = 0, other = 0;
  [[nodiscard]] int operations() const { return kernels + memsets + memcpys + other; }
};

//! Captures `fn(stream)` on a fresh non-blocking stream (thread-local mode) and counts the
//! graph's nodes by type (cudaGraphGetNodes + cudaGraphNodeGetType). Nothing is executed.
inline launch_count count_launches(const std::function<void(cudaStream_t)>& fn) {
  launch_count r;
  cudaStream_t s = nullptr;
  RLPT_BENCH_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  RLPT_BENCH_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  std::string thrown;
  try {
    fn(s);
  } catch (const std::exception& e) {
    thrown = e.what();
  }
  cudaGraph_t g = nullptr;
  const cudaError_t end = cudaStreamEndCapture(s, &g);
  if (!thrown.empty() || end != cudaSuccess || g == nullptr) {
    r.error = !thrown.empty() ? thrown : std::string(cudaGetErrorString(end));
    (void)cudaGetLastError();
    if (g != nullptr) (void)cudaGraphDestroy(g);
    (void)cudaStreamDestroy(s);
    return r;
  }
  std::size_t n = 0;
  RLPT_BENCH_CUDA(cudaGraphGetNodes(g, nullptr, &n));
  std::vector<cudaGraphNode_t> nodes(n);
  if (n > 0) RLPT_BENCH_CUDA(cudaGraphGetNodes(g, nodes.data(), &n));
  for (cudaGraphNode_t node : nodes) {
    cudaGraphNodeType t{};
    RLPT_BENCH_CUDA(cudaGraphNodeGetType(node, &t));
    switch (t) {
    case cudaGraphNodeTypeKernel:
      ++r.kernels;
      break;
    case cudaGraphNodeTypeMemset:
      ++r.memsets;
      break;
    case cudaGraphNodeTypeMemcpy:
      ++r.memcpys;
      break;
    case cudaGraphNodeTypeEmpty:
      break; // dependency joins, no GPU work
    default:
      ++r.other;
      break;
    }
  }
  r.captured = true;
  RLPT_BENCH_CUDA(cudaGraphDestroy(g));
  RLPT_BENCH_CUDA(cudaStreamDestroy(s));
  return r;
}

//! One target: `value` (a ratio or a count) compared with `bound`.
struct target {
  std::string name; //!< what is compared, in words
  double value = NAN;
  bool at_least = true; //!< value >= bound (else value <= bound)
  double bound = 0;
  [[nodiscard]] bool measured() const { return std::isfinite(value); }
  [[nodiscard]] bool met() const { return measured() && (at_least ? value >= bound : value <= bound); }
};

//! Prints "TARGET name: value >= bound: met" (or NOT met / not measured) and keeps it for the
//! JSON line.
class report {
public:
  explicit report(std::string bench) : bench_(std::move(bench)) {}

  void figure(std::string_view key, double v) { fields_.push_back(quote(key) + ": " + number(v)); }
  void text(std::string_view key, std::string_view v) { fields_.push_back(quote(key) + ": " + quote(v)); }

  void check(target t, std::string_view note = {}) {
    std::printf("TARGET %s: %.4g %s %.4g: %s", t.name.c_str(), t.value, t.at_least ? ">=" : "<=", t.bound,
                !t.measured() ? "not measured"
                : t.met()     ? "met"
                              : "NOT met");
    if (!note.empty()) std::printf(" (%.*s)", static_cast<int>(note.size()), note.data());
    std::printf("\n");
    std::fflush(stdout);
    targets_.push_back(std::move(t));
  }

  //! The benchmark's last line: `JSON {"bench": ..., figures..., "targets": [...]}`.
  void print_json() const {
    std::string s = "JSON {" + quote("bench") + ": " + quote(bench_);
    for (const std::string& f : fields_) s += ", " + f;
    s += ", " + quote("targets") + ": [";
    for (std::size_t i = 0; i < targets_.size(); ++i) {
      const target& t = targets_[i];
      s += std::string(i ? ", " : "") + "{" + quote("name") + ": " + quote(t.name) + ", " + quote("value") + ": " +
           number(t.value) + ", " + quote("op") + ": " + quote(t.at_least ? ">=" : "<=") + ", " + quote("bound") +
           ": " + number(t.bound) + ", " + quote("met") + ": " +
           (t.measured() ? (t.met() ? "true" : "false") : "null") + "}";
    }
    s += "]}";
    std::printf("%s\n", s.c_str());
    std::fflush(stdout);
  }

private:
  static std::string quote(std::string_view v) {
    std::string s = "\"";
    for (char c : v) {
      if (c == '"' || c == '\\') s += '\\';
      if (static_cast<unsigned char>(c) >= 0x20) s += c;
    }
    return s + "\"";
  }
  static std::string number(double v) {
    if (!std::isfinite(v)) return "null";
    char b[64];
    std::snprintf(b, sizeof b, "%.6g", v);
    return b;
  }

  std::string bench_;
  std::vector<std::string> fields_;
  std::vector<target> targets_;
};

} // namespace rlpt::bench::gpu
