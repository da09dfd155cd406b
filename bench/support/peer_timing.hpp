// SPDX-License-Identifier: Apache-2.0
// The timing protocol of scripts/bench-peers, C++ side. The Python side (bench/peers/core.py,
// time_calls) does exactly the same, so rlpt and its peer are measured alike:
//
//   - `warmup` untimed calls, then `calls` timed calls, each timed on its own;
//   - with `flush` > 0 every call (warm-up and timed) is preceded by writing `flush` bytes of a
//     scratch buffer (twice the last-level cache), so each timed call starts cold;
//   - the figure is the process CPU time of the call (CLOCK_PROCESS_CPUTIME_ID, the clock
//     Python's time.process_time reads); wall time is recorded next to it;
//   - whatever the call returns (the outputs it allocated) is destroyed after the clock is read,
//     as a Python peer's result tensors are.
//
// A runner parses the trailing options with parse_timing() and prints the series with
// json_series() inside its one JSON line.
//
// Diagnostics (never used by scripts/bench-peers): `--evict code` replaces the flush by a
// clflush of every line of the process's executable mappings (the call's code is cold, its data
// and the TLB are not); `--evict lines` by a clflush of every readable mapping under 64 MiB
// (every line cold, the TLB not). Set against --flush, they split a cold call's cost.
#pragma once

#include <fmt/format.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace rlpt::bench {

inline double process_cpu_seconds() {
  timespec ts{};
  ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

inline double thread_cpu_seconds() {
  timespec ts{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

inline double wall_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

//! Writes `bytes` of a scratch buffer, evicting the caches before a cold call.
inline void flush_caches(std::size_t bytes) {
  static std::vector<unsigned char> scratch;
  static unsigned char value = 0;
  if (bytes == 0) return;
  if (scratch.size() < bytes) scratch.resize(bytes);
  std::memset(scratch.data(), ++value, bytes);
  asm volatile("" : : "r"(scratch.data()) : "memory"); // the writes are not dead
}

//! Uninitialised storage for `n` values, what torch.empty gives a peer: allocated inside a
//! timed call, released when the call's result is destroyed.
template <class T> std::unique_ptr<T[]> output(std::size_t n) { return std::unique_ptr<T[]>(new T[n]); }

//! The address ranges `--evict` flushes: the executable mappings (code) or every readable
//! mapping under 64 MiB (lines), read from /proc/self/maps once.
inline std::vector<std::pair<std::uintptr_t, std::uintptr_t>> evict_ranges(std::string_view what) {
  std::vector<std::pair<std::uintptr_t, std::uintptr_t>> out;
  std::FILE* f = std::fopen("/proc/self/maps", "r");
  if (f == nullptr) throw std::runtime_error("--evict needs /proc/self/maps");
  char line[512];
  while (std::fgets(line, sizeof line, f) != nullptr) {
    unsigned long lo = 0, hi = 0;
    char perm[8] = {};
    if (std::sscanf(line, "%lx-%lx %7s", &lo, &hi, perm) != 3 || perm[0] != 'r') continue;
    const std::string_view l = line;
    if (l.find("[v") != l.npos) continue; // [vdso], [vvar], [vvar_vclock], [vsyscall]: the kernel's
    if (what == "code" ? perm[2] == 'x' : hi - lo < (std::size_t{64} << 20)) out.emplace_back(lo, hi);
  }
  std::fclose(f);
  return out;
}

inline void evict_lines(const std::vector<std::pair<std::uintptr_t, std::uintptr_t>>& ranges) {
#if defined(__x86_64__)
  for (const auto& [lo, hi] : ranges)
    for (std::uintptr_t p = lo; p < hi; p += 64) __builtin_ia32_clflush(reinterpret_cast<const void*>(p));
  __builtin_ia32_mfence();
#else
  (void)ranges;
  throw std::runtime_error("--evict is x86-64 only");
#endif
}

struct timing_plan {
  int warmup = 1;
  int calls = 1;
  std::size_t flush = 0;
  std::string evict; //!< diagnostics: "code" or "lines" instead of the flush (see the file comment)
  std::string out;   //!< where a check run writes its outputs ("" = nowhere)
};

//! Makes the next call cold as the plan says: the flush, or an --evict diagnostic.
inline void before_call(const timing_plan& plan) {
  if (plan.evict.empty()) return flush_caches(plan.flush);
  static const auto ranges = evict_ranges(plan.evict);
  evict_lines(ranges);
}

//! Removes trailing `--warmup N --calls N --flush BYTES --out DIR` from argv (any order) and
//! returns them; argc is updated.
inline timing_plan parse_timing(int& argc, char** argv) {
  timing_plan p;
  int w = 1;
  for (int r = 1; r < argc; ++r) {
    const std::string_view a = argv[r];
    const bool flag = a == "--warmup" || a == "--calls" || a == "--flush" || a == "--evict" || a == "--out";
    if (!flag) {
      argv[w++] = argv[r];
      continue;
    }
    if (r + 1 >= argc) throw std::invalid_argument(fmt::format("{} needs a value", a));
    const char* v = argv[++r];
    if (a == "--warmup")
      p.warmup = std::atoi(v);
    else if (a == "--calls")
      p.calls = std::atoi(v);
    else if (a == "--flush")
      p.flush = static_cast<std::size_t>(std::strtoull(v, nullptr, 10));
    else if (a == "--evict")
      p.evict = v;
    else
      p.out = v;
  }
  argc = w;
  if (p.warmup < 0 || p.calls < 1) throw std::invalid_argument("--warmup must be >= 0 and --calls >= 1");
  if (!p.evict.empty() && p.evict != "code" && p.evict != "lines")
    throw std::invalid_argument(fmt::format("--evict takes code or lines, not {}", p.evict));
  return p;
}

struct call_times {
  std::vector<double> cpu;  //!< process CPU seconds of each timed call
  std::vector<double> wall; //!< wall seconds of each timed call
};

//! Times plan.calls single calls of f() after plan.warmup untimed ones (see the file comment).
template <class F> call_times time_calls(const timing_plan& plan, F&& f) {
  using R = std::invoke_result_t<F&>;
  for (int i = 0; i < plan.warmup; ++i) {
    before_call(plan);
    if constexpr (std::is_void_v<R>)
      f();
    else
      (void)f();
  }
  call_times t;
  for (int i = 0; i < plan.calls; ++i) {
    before_call(plan);
    const double w0 = wall_seconds();
    const double c0 = process_cpu_seconds();
    if constexpr (std::is_void_v<R>) {
      f();
      const double c1 = process_cpu_seconds();
      t.cpu.push_back(c1 - c0);
      t.wall.push_back(wall_seconds() - w0);
    } else {
      R kept = f(); // destroyed after the clocks are read
      const double c1 = process_cpu_seconds();
      t.cpu.push_back(c1 - c0);
      t.wall.push_back(wall_seconds() - w0);
    }
  }
  return t;
}

inline std::string json_array(const std::vector<double>& v) {
  std::string s = "[";
  for (std::size_t i = 0; i < v.size(); ++i) s += fmt::format("{}{:.9g}", i ? ", " : "", v[i]);
  return s + "]";
}

//! `"cpu_s": [...], "wall_s": [...]`, to splice into a runner's JSON line.
inline std::string json_series(const call_times& t, std::string_view prefix = "") {
  return fmt::format(R"("{}cpu_s": {}, "{}wall_s": {})", prefix, json_array(t.cpu), prefix, json_array(t.wall));
}

//! Writes n values raw (little-endian) to `path`; throws when it cannot.
template <class T> void write_raw(const std::string& path, const T* p, std::size_t n) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) throw std::runtime_error("cannot write " + path);
  const std::size_t put = n == 0 ? 0 : std::fwrite(p, sizeof(T), n, f);
  std::fclose(f);
  if (put != n) throw std::runtime_error("short write to " + path);
}

//! Reads exactly n values raw from `path`; throws when the file is shorter.
template <class T> std::vector<T> read_raw(const std::string& path, std::size_t n) {
  std::vector<T> v(n);
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) throw std::runtime_error("cannot read " + path);
  const std::size_t got = n == 0 ? 0 : std::fread(v.data(), sizeof(T), n, f);
  std::fclose(f);
  if (got != n) throw std::runtime_error(fmt::format("{}: {} of {} values", path, got, n));
  return v;
}

} // namespace rlpt::bench
