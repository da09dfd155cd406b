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
//   CONFIG: ppo_k3_token_mean | ppo_tis_k3_entropy | gspo_seq_is | cispo_local | dppo_kl | ppo_tis_rs_local
// The floor mode (scripts/bench-peers' limit side; docs/performance.md, Objective) times a lower bound for
// cispo_local and dppo_kl: one fused pass with nothing but the configuration's arithmetic (its policy
// term, verl's clamped k3 where it has one, the token-mean gradient and the loss), no non-finite
// check, no metric, no stage arrays, in the CPU's widest build (AVX-512, else AVX2) and timed by the
// same protocol; it checks its loss and gradient against evaluate's.
//   objective_runner floor cispo_local|dppo_kl DIR B T [--warmup N --calls N --flush BYTES]
#include <rlpt/objective.hpp>
#include <rlpt/core/thread_pool.hpp>
#include <rlpt/logprob/detail/simd.hpp>

#include "support/bandwidth.hpp"
#include "support/peer_timing.hpp"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <limits>
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

//! The bench's inputs in DIR (bench/peers/blocks/objective.py writes them), behav and ent on request.
struct bench_inputs {
  rlpt::index_t B, T;
  std::size_t n;
  std::vector<float> lp, old, ref, adv, behav, ent;
  std::vector<rlpt::mask_t> mask;
  double tokens = 0; // valid tokens

  bench_inputs(const std::string& dir, rlpt::index_t B_, rlpt::index_t T_, bool all)
      : B(B_), T(T_), n(static_cast<std::size_t>(B_ * T_)), lp(load<float>(dir + "/lp.bin", n)),
        old(load<float>(dir + "/old.bin", n)), ref(load<float>(dir + "/ref.bin", n)),
        adv(load<float>(dir + "/adv.bin", n)), behav(all ? load<float>(dir + "/behav.bin", n) : std::vector<float>{}),
        ent(all ? load<float>(dir + "/ent.bin", n) : std::vector<float>{}),
        mask(load<rlpt::mask_t>(dir + "/mask.bin", n)) {
    for (auto m : mask) tokens += m;
  }

  //! The padded layout's inputs: logp, old, ref, adv and the mask (add behav and entropy as needed).
  [[nodiscard]] rlpt::objective_inputs inputs() const {
    return {.layout = rlpt::token_layout::padded(B, T),
            .mask = mask,
            .logp = lp,
            .old_logp = old,
            .ref_logp = ref,
            .adv = adv};
  }
};

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
  if (name == "ppo_tis_rs_local") // rejected tokens leave the loss and this call's own token count
    return verl::actor({}, verl::rollout_correction("token", "2.0", "token_k3,seq_mean_k3", "0.01,0.0052"));
  throw std::invalid_argument("unknown configuration " + name);
}

// The fused floors: one pass over the tokens with nothing but a configuration's arithmetic, on
// 16-float packs with rlpt's SIMD exp (the logprob rows'), the loss summed in float lanes per 256
// tokens, then in double; AVX-512 where the CPU has it, else AVX2. Every compare is a pack compare
// and every choice a blend: written per token, GCC compared DPPO's bounds lane by lane.
namespace floor_simd {
namespace simd = rlpt::detail::simd;
using u32x4 = std::int32_t __attribute__((vector_size(16)));
using i16 = std::int32_t __attribute__((vector_size(64)));
using f16 = float __attribute__((vector_size(64)));

template <int NB> __attribute__((always_inline)) inline simd::vf<NB> lanes_of(const std::uint8_t* m) {
  // Each byte moved into its own int32 lane by a permute of the four words and a shift per lane:
  // GCC 12 widened a vector of bytes to int32 lanes one byte at a time (extract, insert).
  u32x4 w;
  std::memcpy(&w, m, sizeof w);
  const i16 words = __builtin_shufflevector(w, w, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
  const i16 shifts = {0, 8, 16, 24, 0, 8, 16, 24, 0, 8, 16, 24, 0, 8, 16, 24};
  const f16 f = __builtin_convertvector((words >> shifts) & 0xff, f16);
  simd::vf<NB> r;
  std::memcpy(&r, &f, sizeof r);
  return r;
}

template <int NB> __attribute__((always_inline)) inline simd::vf<NB> clamp(const simd::vf<NB>& x0, float lo, float hi) {
  const simd::vf<NB> l = simd::splat<NB>(lo), h = simd::splat<NB>(hi);
  const simd::vf<NB> x = simd::sel<NB>(simd::lt<NB>(x0, l), l, x0);
  return simd::sel<NB>(simd::gt<NB>(x, h), h, x);
}

template <int NB> __attribute__((always_inline)) inline simd::vf<NB> min(const simd::vf<NB>& a, const simd::vf<NB>& b) {
  return simd::sel<NB>(simd::lt<NB>(a, b), a, b);
}

//! log(x) for x positive and normal, or negative (NaN): objective/detail/math.hpp's log_poly without
//! its subnormal, zero and infinity cases, which DPPO's argument (1 - q + 1e-8) / (1 - p + 1e-8)
//! does not reach on the bench's inputs (it is negative where lp > 0).
template <int NB> __attribute__((always_inline)) inline simd::vf<NB> log_normal(const simd::vf<NB>& x) {
  using vf = simd::vf<NB>;
  const simd::vu<NB> bits = simd::as_u(x);
  // the biased exponent as a float: its 8 bits as the low mantissa bits of 2^23
  vf e = simd::as_f((bits >> 23) | 0x4b000000u) - simd::splat<NB>(8388608.0f + 127.0f);
  vf m = simd::as_f((bits & 0x007fffffu) | 0x3f800000u); // the mantissa in [1, 2)
  const simd::vi<NB> high = simd::gt<NB>(m, simd::splat<NB>(1.41421356f));
  m = simd::sel<NB>(high, m * 0.5f, m);
  e = e + simd::sel<NB>(high, simd::splat<NB>(1.0f), simd::splat<NB>(0.0f));
  const vf f = m - 1.0f, z = f * f;
  vf p = simd::fma<NB>(simd::splat<NB>(7.0376836292e-2f), f, -1.1514610310e-1f); // written out: GCC 12 ran a
  p = simd::fma<NB>(p, f, 1.1676998740e-1f);                                     // loop over the coefficients
  p = simd::fma<NB>(p, f, -1.2420140846e-1f);                                    // lane by lane
  p = simd::fma<NB>(p, f, 1.4249322787e-1f);
  p = simd::fma<NB>(p, f, -1.6668057665e-1f);
  p = simd::fma<NB>(p, f, 2.0000714765e-1f);
  p = simd::fma<NB>(p, f, -2.4999993993e-1f);
  p = simd::fma<NB>(p, f, 3.3333331174e-1f);
  vf y = simd::fma<NB>(e, simd::splat<NB>(-2.12194440e-4f), (f * z) * p);
  y = simd::fma<NB>(simd::splat<NB>(-0.5f), z, y);
  const vf r = simd::fma<NB>(e, simd::splat<NB>(0.693359375f), f + y);
  return simd::sel<NB>(simd::lt<NB>(x, simd::splat<NB>(0.0f)), simd::splat<NB>(std::numeric_limits<float>::quiet_NaN()),
                       r);
}

//! The loss terms of 256 tokens summed in float lanes, added to `total` in double. (A loop body
//! passed as a lambda would not inherit the kernels' target attribute.)
template <int NB> __attribute__((always_inline)) inline void add_lanes(const simd::vf<NB>& acc, double& total) {
  float t[simd::lanes];
  simd::to_array<NB>(acc, t);
  float sum = 0.0f;
  for (float v : t) sum += v;
  total += static_cast<double>(sum);
}

// CISPO (verl: w = clamp(exp(lp - old), 1 - 10, 1 + 0.28), detached; the term -A w lp) + k3 (verl
// low_var_kl: d = clamp(ref - lp, -20, 20), kl = clamp(e^d - d - 1, -10, 10), coef 1e-3), token mean
// over n_valid. The log-ratio clamp at 20 is left out: no bench input reaches it.
template <int NB>
__attribute__((always_inline)) inline double cispo_k3(const float* lp, const float* old, const float* ref,
                                                      const float* adv, const std::uint8_t* mask, float* grad,
                                                      std::size_t n, double n_valid) {
  using vf = simd::vf<NB>;
  const vf one = simd::splat<NB>(1.0f), klhi = simd::splat<NB>(10.0f), zero = simd::splat<NB>(0.0f);
  const vf coef = simd::splat<NB>(1e-3f), vinv = simd::splat<NB>(static_cast<float>(1.0 / n_valid));
  double total = 0.0;
  for (std::size_t i = 0; i < n; i += 256) { // n: a multiple of 256 (floor_mode)
    vf acc = simd::splat<NB>(0.0f);
    for (std::size_t k = i; k < i + 256; k += 16) {
      const vf m = lanes_of<NB>(mask + k), x = simd::load<NB>(lp + k), a = simd::load<NB>(adv + k);
      const vf w = clamp<NB>(simd::exp<NB>(x - simd::load<NB>(old + k)), 1.0f - 10.0f, 1.28f);
      const vf d = clamp<NB>(simd::load<NB>(ref + k) - x, -20.0f, 20.0f);
      const vf e = simd::exp<NB>(d);
      const vf kl = e - d - one;
      const auto over = simd::gt<NB>(kl, klhi);
      const vf g = m * vinv * (coef * simd::sel<NB>(over, zero, one - e) - a * w);
      std::memcpy(grad + k, &g, sizeof g);
      acc += m * (coef * simd::sel<NB>(over, klhi, kl) - a * w * x);
    }
    add_lanes<NB>(acc, total);
  }
  return total / n_valid;
}

// DPPO with the binary-KL bound (verl dppo_kl: w = min(exp(clamp(lp - old, -20, 20)), 3), detached;
// the binary KL d = q (old - lp) + (1 - q) log((1 - q + 1e-8) / (1 - p + 1e-8)) with p = e^lp,
// q = e^old; a token with A > 0 is kept where d <= 0.02 or p <= q, with A <= 0 where d <= 0.01 or
// p >= q (a NaN d keeps neither); the term -A w lp), token mean over n_valid.
template <int NB>
__attribute__((always_inline)) inline double dppo_kl(const float* lp, const float* old, const float* adv,
                                                     const std::uint8_t* mask, float* grad, std::size_t n,
                                                     double n_valid) {
  using vf = simd::vf<NB>;
  const vf one = simd::splat<NB>(1.0f), zero = simd::splat<NB>(0.0f), cap = simd::splat<NB>(3.0f);
  const vf eps = simd::splat<NB>(1e-8f), hi = simd::splat<NB>(0.02f), lo = simd::splat<NB>(0.01f);
  const vf inf = simd::splat<NB>(std::numeric_limits<float>::infinity());
  const vf lowest = simd::splat<NB>(-std::numeric_limits<float>::infinity());
  const vf vinv = simd::splat<NB>(static_cast<float>(1.0 / n_valid));
  double total = 0.0;
  for (std::size_t i = 0; i < n; i += 256) { // n: a multiple of 256 (floor_mode)
    vf acc = simd::splat<NB>(0.0f);
    for (std::size_t k = i; k < i + 256; k += 16) {
      const vf m = lanes_of<NB>(mask + k), x = simd::load<NB>(lp + k), o = simd::load<NB>(old + k);
      const vf a = simd::load<NB>(adv + k);
      vf w = simd::exp<NB>(clamp<NB>(x - o, -20.0f, 20.0f));
      w = simd::sel<NB>(simd::gt<NB>(w, cap), cap, w);
      const vf p = simd::exp<NB>(x), q = simd::exp<NB>(o);
      vf d = q * (o - x) + (one - q) * log_normal<NB>((one - q + eps) / (one - p + eps));
      d = simd::sel<NB>(simd::gt<NB>(d, lowest), d, inf); // NaN (lp > 0) fails both bounds, as +inf does
      // Dropped: A > 0 with d > 0.02 and p > q, A <= 0 with d > 0.01 and p < q; each pair of
      // conditions as one min(...) > 0 (the differences of finite floats keep their order's sign):
      // GCC 12 compared an AND of two pack compares lane by lane.
      const vf up = min<NB>(d - hi, p - q), down = min<NB>(d - lo, q - p);
      const auto drop = simd::gt<NB>(simd::sel<NB>(simd::gt<NB>(a, zero), up, down), zero);
      const vf t = simd::sel<NB>(drop, zero, a * w); // A w, 0 for a dropped token
      const vf g = m * vinv * (zero - t);
      std::memcpy(grad + k, &g, sizeof g);
      acc += m * (zero - t * x);
    }
    add_lanes<NB>(acc, total);
  }
  return total / n_valid;
}

struct floor_args {
  const float *lp, *old, *ref, *adv;
  const std::uint8_t* mask;
  float* grad;
  std::size_t n;
  double n_valid;
};

template <int NB> __attribute__((always_inline)) inline double run(int config, const floor_args& f) {
  return config == 0 ? cispo_k3<NB>(f.lp, f.old, f.ref, f.adv, f.mask, f.grad, f.n, f.n_valid)
                     : dppo_kl<NB>(f.lp, f.old, f.adv, f.mask, f.grad, f.n, f.n_valid);
}

__attribute__((target("avx512f,avx512vl,avx512bw,avx512dq,fma,avx2,bmi2"), noinline)) double
run_avx512(int config, const floor_args& f) {
  return run<64>(config, f);
}

__attribute__((target("avx2,fma,bmi2"), noinline)) double run_avx2(int config, const floor_args& f) {
  return run<32>(config, f);
}

//! The widest build this CPU runs (the floor needs AVX2 + FMA at least); RLPT_FLOOR_AVX2=1 asks
//! for the AVX2 build on an AVX-512 CPU (to check it).
inline auto kernel() {
  const char* avx2 = std::getenv("RLPT_FLOOR_AVX2");
  if ((avx2 == nullptr || std::string(avx2) != "1") && __builtin_cpu_supports("avx512f") &&
      __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
    return &run_avx512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return &run_avx2;
  throw std::runtime_error("the floor mode needs AVX2 + FMA");
}
} // namespace floor_simd

int floor_mode(int argc, char** argv) {
  const rlpt::bench::timing_plan plan = rlpt::bench::parse_timing(argc, argv);
  const std::string config = argc == 6 ? argv[2] : "";
  if (config != "cispo_local" && config != "dppo_kl") {
    std::fprintf(stderr, "usage: %s floor cispo_local|dppo_kl DIR B T [--warmup N --calls N --flush BYTES]\n", argv[0]);
    return 2;
  }
  const bench_inputs d(argv[3], std::atoll(argv[4]), std::atoll(argv[5]), false);
  const std::size_t n = d.n;
  struct result {
    std::unique_ptr<float[]> grad;
    double loss = 0;
  };
  const auto floor = floor_simd::kernel();
  if (d.n % 256 != 0) throw std::invalid_argument("the floor mode takes B * T a multiple of 256");
  const int which = config == "cispo_local" ? 0 : 1;
  auto call = [&] {
    result r{rlpt::bench::output<float>(n)};
    r.loss =
        floor(which, {d.lp.data(), d.old.data(), d.ref.data(), d.adv.data(), d.mask.data(), r.grad.get(), n, d.tokens});
    return r;
  };
  const auto t = rlpt::bench::time_calls(plan, call);
  const result r = call();
  // The same quantities from rlpt::evaluate, so the floor is known to compute the configuration.
  std::vector<float> g(n);
  const double loss = rlpt::evaluate(peer_config(config, d.tokens), d.inputs(), {.logp = g}).loss;
  double gmax = 0.0, gdiff = 0.0;
  for (std::size_t i = 0; i < n; ++i)
    gmax = std::max(gmax, std::fabs(static_cast<double>(g[i]))),
    gdiff = std::max(gdiff, std::fabs(static_cast<double>(g[i]) - static_cast<double>(r.grad[i])));
  if (!(std::fabs(r.loss - loss) <= 1e-5 * std::fabs(loss)) || !(gdiff <= 1e-5 * gmax)) {
    std::fprintf(stderr, "objective_runner floor: loss %.9g vs evaluate's %.9g, gradient max diff %.3g of %.3g\n",
                 r.loss, loss, gdiff, gmax);
    return 1;
  }
  std::printf("{\"config\": \"%s floor\", \"loss\": %.17g, \"evaluate_loss\": %.17g, \"grad_max_diff_rel\": "
              "%.3g, %s}\n",
              config.c_str(), r.loss, loss, gdiff / gmax, rlpt::bench::json_series(t).c_str());
  return 0;
}

int peer_mode(int argc, char** argv) {
  const rlpt::bench::timing_plan plan = rlpt::bench::parse_timing(argc, argv);
  if (argc != 6) {
    std::fprintf(stderr, "usage: %s peer CONFIG DIR B T [--warmup N --calls N --flush BYTES --out DIR]\n", argv[0]);
    return 2;
  }
  const std::string config = argv[2];
  const bench_inputs d(argv[3], std::atoll(argv[4]), std::atoll(argv[5]), true);
  const std::size_t n = d.n;
  const rlpt::objective obj = peer_config(config, d.tokens);
  const bool entropy = config == "ppo_tis_k3_entropy";
  rlpt::objective_inputs in = d.inputs();
  in.behav_logp = d.behav;
  if (entropy) in.entropy = d.ent;
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
  std::printf("{\"config\": \"%s\", \"loss\": %.17g, \"tokens\": %.17g, %s}\n", config.c_str(), r.loss, d.tokens,
              rlpt::bench::json_series(t).c_str());
  return 0;
}

} // namespace

int main(int argc, char** argv) {
  if (argc > 1 && (std::string(argv[1]) == "peer" || std::string(argv[1]) == "floor")) {
    try {
      return std::string(argv[1]) == "peer" ? peer_mode(argc, argv) : floor_mode(argc, argv);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "objective_runner: %s\n", e.what());
      return 1;
    }
  }
  if (argc != 6) {
    std::fprintf(stderr, "usage: %s DIR B T THREADS REPEATS\n", argv[0]);
    return 2;
  }
  const bench_inputs d(argv[1], std::atoll(argv[2]), std::atoll(argv[3]), false);
  const unsigned threads = static_cast<unsigned>(std::atoi(argv[4]));
  const int repeats = std::atoi(argv[5]);
  const std::size_t n = d.n;
  std::vector<float> grad(n);
  const rlpt::objective obj = rlpt::compat::verl::actor(
      {.use_kl_loss = true, .kl_loss_coef = 0.001, .kl_loss_type = "low_var_kl", .batch_num_tokens = d.tokens});
  const rlpt::objective_inputs in = d.inputs();
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
