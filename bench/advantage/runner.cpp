// SPDX-License-Identifier: Apache-2.0
// bench_advantage_runner: times rlpt on inputs written by bench/peers/advantage_verl.py (the
// very arrays the peer gets), writes rlpt's outputs next to them for a correctness cross-check,
// and prints one JSON line: median seconds, effective GB/s and the copy bandwidth measured in the
// same run with the same thread count.
//
//   bench_advantage_runner gae  DIR B T GAMMA LAMBDA THREADS REPEAT   (verl GAE + masked whitening)
//   bench_advantage_runner rpp  DIR B T GAMMA THREADS REPEAT          (verl REINFORCE++)
//   bench_advantage_runner grpo DIR N THREADS REPEAT                  (verl GRPO, groups from ids)
//
// DIR holds raw little-endian arrays: rewards.f32, values.f32, mask.u8 (token ops, [B, T]) or
// rewards.f32, ids.i64 (grpo, [N]). Outputs: rlpt_adv.f32 (and rlpt_ret.f32).
#include <rlpt/advantage.hpp>

#include "support/bandwidth.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace {

template <class T>
std::vector<T> load(const std::string& path, std::size_t n) {
  std::vector<T> v(n);
  std::ifstream in(path, std::ios::binary);
  if (!in.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(n * sizeof(T))))
    throw std::runtime_error("cannot read " + std::to_string(n) + " elements from " + path);
  return v;
}

template <class T>
void save(const std::string& path, const std::vector<T>& v) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(v.size() * sizeof(T)));
}

double process_cpu() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

struct timing {
  double first = 0;  //!< median wall seconds
  double second = 0; //!< minimum wall seconds
  double cpu = 0;    //!< median process CPU seconds (all threads): robust to time-slicing on a shared machine
};

//! Wall and process-CPU time of `repeat` calls (after one warm-up call).
timing time_it(int repeat, const std::function<void()>& fn) {
  fn();
  std::vector<double> t, c;
  for (int i = 0; i < repeat; ++i) {
    const double c0 = process_cpu();
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    c.push_back(process_cpu() - c0);
  }
  std::sort(t.begin(), t.end());
  std::sort(c.begin(), c.end());
  return {t[t.size() / 2], t.front(), c[c.size() / 2]};
}

//! Single-thread copy bandwidth per CPU second (read + write), the CPU-time counterpart of
//! measure_copy_bandwidth for runs on a time-sliced machine.
double copy_gbps_cpu(std::size_t bytes = std::size_t{1} << 29) {
  std::vector<char> src(bytes, 1), dst(bytes, 0);
  double best = 0;
  for (int r = 0; r < 5; ++r) {
    const double c0 = process_cpu();
    std::memcpy(dst.data(), src.data(), bytes);
    best = std::max(best, 2.0 * static_cast<double>(bytes) / (process_cpu() - c0) / 1e9);
  }
  return best;
}

int usage() {
  std::fprintf(stderr, "usage: bench_advantage_runner gae DIR B T GAMMA LAMBDA THREADS REPEAT\n"
                       "       bench_advantage_runner rpp DIR B T GAMMA THREADS REPEAT\n"
                       "       bench_advantage_runner grpo DIR N THREADS REPEAT\n");
  return 2;
}

} // namespace

int main(int argc, char** argv) {
  if (argc < 2) return usage();
  const std::string op = argv[1];
  try {
    if ((op == "gae" && argc == 9) || (op == "rpp" && argc == 8)) {
      const std::string dir = argv[2];
      const rlpt::index_t B = std::atoll(argv[3]), T = std::atoll(argv[4]);
      const double gamma = std::atof(argv[5]);
      const double lambda = op == "gae" ? std::atof(argv[6]) : 1.0;
      const int next = op == "gae" ? 7 : 6;
      const unsigned threads = static_cast<unsigned>(std::atoi(argv[next]));
      const int repeat = std::atoi(argv[next + 1]);
      const auto n = static_cast<std::size_t>(B * T);
      const auto rewards = load<float>(dir + "/rewards.f32", n);
      const auto mask = load<std::uint8_t>(dir + "/mask.u8", n);
      const auto values = op == "gae" ? load<float>(dir + "/values.f32", n) : std::vector<float>{};
      std::vector<float> adv(n), ret(n);
      rlpt::thread_pool pool(threads);
      const rlpt::host_executor ex{threads > 1 ? &pool : nullptr};
      const auto layout = rlpt::token_layout::padded(B, T);
      timing t;
      if (op == "gae") {
        const auto o = rlpt::compat::verl::gae(gamma, lambda);
        t = time_it(repeat, [&] {
          (void)rlpt::gae({.layout = layout, .rewards = rewards, .values = values, .mask = mask}, adv, ret, o, ex);
        });
        const auto raw = time_it(repeat, [&] {
          (void)rlpt::gae({.layout = layout, .rewards = rewards, .values = values, .mask = mask}, adv, ret,
                          rlpt::gae_options{.gamma = gamma, .lambda = lambda}, ex);
        });
        (void)rlpt::gae({.layout = layout, .rewards = rewards, .values = values, .mask = mask}, adv, ret, o, ex);
        save(dir + "/rlpt_adv.f32", adv);
        save(dir + "/rlpt_ret.f32", ret);
        const auto bw = rlpt::bench::measure_copy_bandwidth(std::size_t{1} << 29, 5, threads);
        const double bytes = 17.0 * static_cast<double>(n); // r, V, mask in; A, ret out
        std::printf("%s\n", fmt::format("{{\"op\": \"gae\", \"B\": {}, \"T\": {}, \"threads\": {}, \"seconds\": {}, "
                                        "\"seconds_min\": {}, \"seconds_unwhitened\": {}, \"bytes\": {}, "
                                        "\"gbps\": {}, \"gbps_unwhitened\": {}, \"copy_gbps\": {}, "
                                        "\"cpu_seconds\": {}, \"cpu_seconds_unwhitened\": {}, \"copy_gbps_cpu\": {}}}",
                                        B, T, threads, t.first, t.second, raw.first, bytes, bytes / t.first / 1e9,
                                        bytes / raw.first / 1e9, bw.copy_gbps, t.cpu, raw.cpu, copy_gbps_cpu())
                                .c_str());
      } else {
        const auto o = rlpt::compat::verl::reinforce_pp(gamma);
        t = time_it(repeat, [&] { (void)rlpt::reinforce_pp_advantages(layout, rewards, mask, adv, ret, o, ex); });
        save(dir + "/rlpt_adv.f32", adv);
        save(dir + "/rlpt_ret.f32", ret);
        const auto bw = rlpt::bench::measure_copy_bandwidth(std::size_t{1} << 29, 5, threads);
        const double bytes = 13.0 * static_cast<double>(n); // r, mask in; A, G out
        std::printf("%s\n", fmt::format("{{\"op\": \"rpp\", \"B\": {}, \"T\": {}, \"threads\": {}, \"seconds\": {}, "
                                        "\"seconds_min\": {}, \"bytes\": {}, \"gbps\": {}, \"copy_gbps\": {}, "
                                        "\"cpu_seconds\": {}, \"copy_gbps_cpu\": {}}}",
                                        B, T, threads, t.first, t.second, bytes, bytes / t.first / 1e9, bw.copy_gbps,
                                        t.cpu, copy_gbps_cpu())
                                .c_str());
      }
      return 0;
    }
    if (op == "grpo" && argc == 6) {
      const std::string dir = argv[2];
      const rlpt::index_t N = std::atoll(argv[3]);
      const unsigned threads = static_cast<unsigned>(std::atoi(argv[4]));
      const int repeat = std::atoi(argv[5]);
      const auto rewards = load<float>(dir + "/rewards.f32", static_cast<std::size_t>(N));
      const auto ids = load<std::int64_t>(dir + "/ids.i64", static_cast<std::size_t>(N));
      std::vector<float> adv(static_cast<std::size_t>(N));
      rlpt::thread_pool pool(threads);
      const rlpt::host_executor ex{threads > 1 ? &pool : nullptr};
      rlpt::group_stats stats;
      // verl's function takes the ids and groups them itself: time grouping + advantages.
      const auto with_grouping = time_it(repeat, [&] {
        const auto g = rlpt::groups::from_ids(ids);
        rlpt::grpo_advantages(rewards, g, adv, rlpt::compat::verl::grpo(), stats, ex);
      });
      const auto g = rlpt::groups::from_ids(ids);
      const auto advantages_only =
          time_it(repeat, [&] { rlpt::grpo_advantages(rewards, g, adv, rlpt::compat::verl::grpo(), stats, ex); });
      save(dir + "/rlpt_adv.f32", adv);
      std::printf("%s\n", fmt::format("{{\"op\": \"grpo\", \"N\": {}, \"groups\": {}, \"threads\": {}, \"seconds\": {}, "
                                      "\"seconds_advantages_only\": {}, \"cpu_seconds\": {}, "
                                      "\"cpu_seconds_advantages_only\": {}}}",
                                      N, g.num_groups(), threads, with_grouping.first, advantages_only.first,
                                      with_grouping.cpu, advantages_only.cpu)
                              .c_str());
      return 0;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_advantage_runner: %s\n", e.what());
    return 1;
  }
  return usage();
}
