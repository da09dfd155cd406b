// SPDX-License-Identifier: Apache-2.0
// bench_advantage_runner: rlpt's side of the advantage comparisons of scripts/bench-peers. It
// reads the arrays the peer gets, times single calls with the protocol of
// bench/support/peer_timing.hpp (one thread, outputs allocated inside every call as torch
// allocates the peer's, process CPU time per call) and prints one JSON line; with --out DIR it
// also writes its outputs there for the harness's equality check.
//
//   bench_advantage_runner gae     DIR B T GAMMA LAMBDA [timing]  verl GAE + masked whitening
//   bench_advantage_runner gae_raw DIR B T GAMMA LAMBDA [timing]  the same GAE without whitening
//   bench_advantage_runner rpp     DIR B T GAMMA [timing]         verl REINFORCE++ (+ whitening)
//   bench_advantage_runner outcome EST DIR N [timing]             EST: grpo dr_grpo rloo opo gpg
//                                                                 rpp_baseline passk; grouping of
//                                                                 the ids is part of every call
//   [timing] = --warmup N --calls N --flush BYTES --out DIR
//
// DIR holds raw little-endian arrays: rewards.f32, values.f32, mask.u8 ([B, T]) for the token
// estimators; rewards.f32 and ids.i64 ([N]) for the outcome estimators (one token per
// sequence: verl's [N, 1] token-level rewards). Outputs: adv.f32 (and ret.f32).
#include <rlpt/advantage.hpp>

#include "support/peer_timing.hpp"

#include <fmt/format.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace {

using rlpt::bench::output;
using rlpt::bench::read_raw;
using rlpt::bench::timing_plan;
using rlpt::bench::write_raw;

struct token_outputs {
  std::unique_ptr<float[]> adv, ret;
};

int token_estimator(const std::string& op, const std::string& dir, rlpt::index_t B, rlpt::index_t T, double gamma,
                    double lambda, const timing_plan& plan) {
  const auto n = static_cast<std::size_t>(B * T);
  const auto rewards = read_raw<float>(dir + "/rewards.f32", n);
  const auto mask = read_raw<std::uint8_t>(dir + "/mask.u8", n);
  const auto values = op == "rpp" ? std::vector<float>{} : read_raw<float>(dir + "/values.f32", n);
  const auto layout = rlpt::token_layout::padded(B, T);
  const rlpt::gae_options whitened = rlpt::compat::verl::gae(gamma, lambda);
  const rlpt::gae_options raw{.gamma = gamma, .lambda = lambda, .masked = whitened.masked};
  const rlpt::reinforce_pp_options rpp = rlpt::compat::verl::reinforce_pp(gamma);
  auto call = [&] {
    token_outputs o{output<float>(n), output<float>(n)};
    const rlpt::view<float> adv(o.adv.get(), static_cast<rlpt::index_t>(n));
    const rlpt::view<float> ret(o.ret.get(), static_cast<rlpt::index_t>(n));
    if (op == "rpp")
      (void)rlpt::reinforce_pp_advantages(layout, rewards, mask, adv, ret, rpp);
    else
      (void)rlpt::gae({.layout = layout, .rewards = rewards, .values = values, .mask = mask}, adv, ret,
                      op == "gae" ? whitened : raw);
    return o;
  };
  const auto t = rlpt::bench::time_calls(plan, call);
  if (!plan.out.empty()) {
    const token_outputs o = call();
    write_raw(plan.out + "/adv.f32", o.adv.get(), n);
    write_raw(plan.out + "/ret.f32", o.ret.get(), n);
  }
  // Bytes one call must move: rewards (4), values (4, GAE), mask (1) in; advantages, returns out.
  const double bytes = static_cast<double>(n) * (op == "rpp" ? 13.0 : 17.0);
  std::printf("%s\n", fmt::format(R"({{"op": "{}", "B": {}, "T": {}, "bytes": {}, {}}})", op, B, T, bytes,
                                  rlpt::bench::json_series(t))
                          .c_str());
  return 0;
}

int outcome(const std::string& est, const std::string& dir, rlpt::index_t N, const timing_plan& plan) {
  const auto u = static_cast<std::size_t>(N);
  const auto rewards = read_raw<float>(dir + "/rewards.f32", u);
  const auto ids = read_raw<std::int64_t>(dir + "/ids.i64", u);
  const std::vector<rlpt::mask_t> mask(u, 1); // verl's response_mask of the [N, 1] rewards
  const auto layout = rlpt::token_layout::padded(N, 1);
  namespace verl = rlpt::compat::verl;
  if (est != "grpo" && est != "dr_grpo" && est != "rloo" && est != "opo" && est != "gpg" && est != "rpp_baseline" &&
      est != "passk") {
    std::fprintf(stderr, "unknown estimator %s\n", est.c_str());
    return 2;
  }
  auto call = [&] {
    auto adv = output<float>(u);
    const rlpt::view<float> out(adv.get(), N);
    const rlpt::groups g = rlpt::groups::from_ids(ids); // verl groups the ids inside its call too
    rlpt::group_stats st;
    if (est == "grpo")
      rlpt::grpo_advantages(rewards, g, out, verl::grpo(), st);
    else if (est == "dr_grpo")
      rlpt::grpo_advantages(rewards, g, out, verl::dr_grpo(), st);
    else if (est == "rloo")
      rlpt::rloo_advantages(rewards, g, out, verl::rloo_vectorized(), st);
    else if (est == "gpg")
      rlpt::gpg_advantages(rewards, g, out, verl::gpg(), st);
    else if (est == "passk")
      rlpt::passk_advantages(rewards, g, out, verl::grpo_passk(), st);
    else if (est == "rpp_baseline")
      (void)rlpt::reinforce_pp_baseline_advantages(rewards, g, layout, mask, out, verl::reinforce_pp_baseline());
    else { // opo: verl takes response_mask.sum(-1) as the lengths inside its call
      std::vector<rlpt::index_t> lengths(u);
      rlpt::valid_lengths(layout, mask, lengths);
      rlpt::opo_advantages(rewards, lengths, g, out, verl::opo(), st);
    }
    return adv;
  };
  const auto t = rlpt::bench::time_calls(plan, call);
  if (!plan.out.empty()) {
    const auto adv = call();
    write_raw(plan.out + "/adv.f32", adv.get(), u);
  }
  std::printf("%s\n",
              fmt::format(R"({{"op": "outcome", "estimator": "{}", "N": {}, {}}})", est, N, rlpt::bench::json_series(t))
                  .c_str());
  return 0;
}

int usage() {
  std::fprintf(stderr, "usage: bench_advantage_runner gae|gae_raw DIR B T GAMMA LAMBDA [timing]\n"
                       "       bench_advantage_runner rpp DIR B T GAMMA [timing]\n"
                       "       bench_advantage_runner outcome EST DIR N [timing]\n"
                       "timing: --warmup N --calls N --flush BYTES --out DIR\n");
  return 2;
}

} // namespace

int main(int argc, char** argv) {
  try {
    const timing_plan plan = rlpt::bench::parse_timing(argc, argv);
    if (argc < 2) return usage();
    const std::string op = argv[1];
    if ((op == "gae" || op == "gae_raw") && argc == 7)
      return token_estimator(op, argv[2], std::atoll(argv[3]), std::atoll(argv[4]), std::atof(argv[5]),
                             std::atof(argv[6]), plan);
    if (op == "rpp" && argc == 6)
      return token_estimator(op, argv[2], std::atoll(argv[3]), std::atoll(argv[4]), std::atof(argv[5]), 1.0, plan);
    if (op == "outcome" && argc == 5) return outcome(argv[2], argv[3], std::atoll(argv[4]), plan);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_advantage_runner: %s\n", e.what());
    return 1;
  }
  return usage();
}
