// SPDX-License-Identifier: Apache-2.0
// objective_runner: rlpt's side of the objective comparison of scripts/bench-peers.
// The direct mode (run by hand; no script calls it) evaluates verl's vanilla PPO + low_var_kl (k3)
// + token-mean on inputs in DIR (raw little-endian files), times it and prints one JSON line: wall
// and CPU seconds (best of the repeats), the loss, a gradient checksum, the bytes the call must
// move and the copy bandwidth measured in the same run.
//   objective_runner DIR B T THREADS REPEATS
// scripts/bench-peers (bench/peers/blocks/objective.py) uses the peer mode: one configuration of
// bench_objective in verl's terms, the gradient allocated inside every call, the timing protocol
// of bench/support/peer_timing.hpp (one thread); --out writes grad.f32 (and grad_ent.f32).
//   objective_runner peer CONFIG DIR B T [--warmup N --calls N --flush BYTES --out DIR]
//   CONFIG: ppo_k3_token_mean | ppo_tis_k3_entropy | gspo_seq_is | cispo_local | dppo_kl
#include <rlpt/objective.hpp>
#include <rlpt/core/thread_pool.hpp>

#include "support/bandwidth.hpp"
#include "support/peer_timing.hpp"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

template <class T> std::vector<T> load(const std::string& path, std::size_t n) {
  std::vector<T> v(n);
  std::ifstream f(path, std::ios::binary);
  f.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(n * sizeof(T)));
  if (!f) {
    std::fprintf(stderr, "cannot read %zu elements from %s\n", n, path.c_str());
    std::exit(2);
  }
  return v;
}

double cpu_now() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// The configurations of bench_objective, as verl's actor loss (compat::verl::actor) computes them.
rlpt::objective peer_config(const std::string& name, double tokens) {
  namespace verl = rlpt::compat::verl;
  if (name == "ppo_k3_token_mean")
    return verl::actor(
        {.use_kl_loss = true, .kl_loss_coef = 0.001, .kl_loss_type = "low_var_kl", .batch_num_tokens = tokens});
  if (name == "ppo_tis_k3_entropy")
    return verl::actor({.clip_ratio_high = 0.28,
                        .use_kl_loss = true,
                        .kl_loss_coef = 0.001,
                        .kl_loss_type = "low_var_kl",
                        .entropy_coeff = 0.001,
                        .batch_num_tokens = tokens},
                       verl::rollout_correction("token", "2.0"));
  if (name == "dppo_kl")
    return verl::actor({.loss_mode = "dppo_kl", .clip_ratio_low = 0.01, .clip_ratio_high = 0.02, .clip_ratio_c = 3.0});
  if (name == "gspo_seq_is")
    return verl::actor(
        {.loss_mode = "gspo", .clip_ratio_low = 3e-4, .clip_ratio_high = 4e-4, .loss_agg_mode = "seq-mean-token-mean"},
        verl::rollout_correction("sequence", "2.0"));
  if (name == "cispo_local") // token-mean over this call's own tokens (no global count)
    return verl::actor({.loss_mode = "cispo",
                        .clip_ratio_low = 10.0,
                        .clip_ratio_high = 0.28,
                        .use_kl_loss = true,
                        .kl_loss_coef = 0.001,
                        .kl_loss_type = "low_var_kl"});
  throw std::invalid_argument("unknown configuration " + name);
}

int peer_mode(int argc, char** argv) {
  const rlpt::bench::timing_plan plan = rlpt::bench::parse_timing(argc, argv);
  if (argc != 6) {
    std::fprintf(stderr, "usage: %s peer CONFIG DIR B T [--warmup N --calls N --flush BYTES --out DIR]\n", argv[0]);
    return 2;
  }
  const std::string config = argv[2], dir = argv[3];
  const rlpt::index_t B = std::atoll(argv[4]), T = std::atoll(argv[5]);
  const auto n = static_cast<std::size_t>(B * T);
  const auto lp = load<float>(dir + "/lp.bin", n), old = load<float>(dir + "/old.bin", n);
  const auto ref = load<float>(dir + "/ref.bin", n), adv = load<float>(dir + "/adv.bin", n);
  const auto behav = load<float>(dir + "/behav.bin", n), ent = load<float>(dir + "/ent.bin", n);
  const auto mask = load<rlpt::mask_t>(dir + "/mask.bin", n);
  double tokens = 0;
  for (auto m : mask) tokens += m;
  const rlpt::objective obj = peer_config(config, tokens);
  const bool entropy = config == "ppo_tis_k3_entropy";
  const rlpt::objective_inputs in{.layout = rlpt::token_layout::padded(B, T),
                                  .mask = mask,
                                  .logp = lp,
                                  .old_logp = old,
                                  .behav_logp = behav,
                                  .ref_logp = ref,
                                  .adv = adv,
                                  .entropy = entropy ? rlpt::view<const float>(ent) : rlpt::view<const float>{}};
  struct result {
    std::unique_ptr<float[]> grad, grad_ent;
    double loss = 0;
  };
  auto call = [&] {
    result r{rlpt::bench::output<float>(n), entropy ? rlpt::bench::output<float>(n) : nullptr};
    rlpt::objective_grads g{.logp = rlpt::view<float>(r.grad.get(), static_cast<rlpt::index_t>(n))};
    if (entropy) g.entropy = rlpt::view<float>(r.grad_ent.get(), static_cast<rlpt::index_t>(n));
    r.loss = rlpt::evaluate(obj, in, g).loss;
    return r;
  };
  const auto t = rlpt::bench::time_calls(plan, call);
  const result r = call();
  if (!plan.out.empty()) {
    rlpt::bench::write_raw(plan.out + "/grad.f32", r.grad.get(), n);
    if (entropy) rlpt::bench::write_raw(plan.out + "/grad_ent.f32", r.grad_ent.get(), n);
  }
  std::printf("{\"config\": \"%s\", \"loss\": %.17g, \"tokens\": %.17g, %s}\n", config.c_str(), r.loss, tokens,
              rlpt::bench::json_series(t).c_str());
  return 0;
}

} // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "peer") {
    try {
      return peer_mode(argc, argv);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "objective_runner: %s\n", e.what());
      return 1;
    }
  }
  if (argc != 6) {
    std::fprintf(stderr, "usage: %s DIR B T THREADS REPEATS\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  const rlpt::index_t B = std::atoll(argv[2]), T = std::atoll(argv[3]);
  const unsigned threads = static_cast<unsigned>(std::atoi(argv[4]));
  const int repeats = std::atoi(argv[5]);
  const auto n = static_cast<std::size_t>(B * T);
  const auto lp = load<float>(dir + "/lp.bin", n), old = load<float>(dir + "/old.bin", n);
  const auto ref = load<float>(dir + "/ref.bin", n), adv = load<float>(dir + "/adv.bin", n);
  const auto mask = load<rlpt::mask_t>(dir + "/mask.bin", n);
  std::vector<float> grad(n);
  double tokens = 0;
  for (auto m : mask) tokens += m;
  const rlpt::objective obj = rlpt::compat::verl::actor(
      {.use_kl_loss = true, .kl_loss_coef = 0.001, .kl_loss_type = "low_var_kl", .batch_num_tokens = tokens});
  const rlpt::objective_inputs in{.layout = rlpt::token_layout::padded(B, T),
                                  .mask = mask,
                                  .logp = lp,
                                  .old_logp = old,
                                  .ref_logp = ref,
                                  .adv = adv};
  rlpt::thread_pool pool(threads);
  const rlpt::host_executor ex{threads > 1 ? &pool : nullptr};
  double best = 1e30, best_cpu = 1e30, loss = 0;
  for (int r = 0; r < repeats + 2; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    const double c0 = cpu_now();
    loss = rlpt::evaluate(obj, in, {.logp = grad}, ex).loss;
    const double c1 = cpu_now();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (r >= 2) best = std::min(best, s), best_cpu = std::min(best_cpu, c1 - c0);
  }
  double checksum = 0;
  for (float g : grad) checksum += static_cast<double>(g);
  const double bytes = static_cast<double>(n) * (4 * 4 + 1 + 4); // four float inputs + mask read, gradient written
  const auto bw = rlpt::bench::measure_copy_bandwidth(std::size_t{1} << 28, 5, threads);
  // The same copy timed in process CPU time on one thread: on a shared machine this is the
  // limit to hold CPU-time figures against.
  double copy_cpu = 1e30;
  {
    std::vector<char> src(std::size_t{1} << 28, 1), dst(std::size_t{1} << 28, 0);
    for (int r = 0; r < 5; ++r) {
      const double c0 = cpu_now();
      std::memcpy(dst.data(), src.data(), src.size());
      copy_cpu = std::min(copy_cpu, cpu_now() - c0);
    }
  }
  const double copy_cpu_gbps = 2.0 * static_cast<double>(std::size_t{1} << 28) / copy_cpu / 1e9;
  std::printf("{\"seconds\": %.9g, \"cpu_seconds\": %.9g, \"loss\": %.12g, \"grad_sum\": %.12g, \"bytes\": %.9g, "
              "\"copy_gbps\": %.6g, \"copy_cpu_gbps\": %.6g, \"threads\": %u}\n",
              best, best_cpu, loss, checksum, bytes, bw.copy_gbps, copy_cpu_gbps, threads);
  return 0;
}
