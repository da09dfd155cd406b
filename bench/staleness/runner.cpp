// SPDX-License-Identifier: Apache-2.0
// C++ side of bench/peers/staleness_tokens.py: times one per-token staleness kernel on the
// shared deterministic inputs (staleness/inputs.hpp) and prints one JSON line:
//   {"op": ..., "n": ..., "seconds": <median>, "checksum": <sum of the outputs>}
// usage: bench_staleness_runner mask|prox|prox_linear N [repeat]
#include <rlpt/staleness/proximal.hpp>
#include <rlpt/staleness/token_mask.hpp>

#include "staleness/inputs.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  if (argc < 3) {
    fmt::print(stderr, "usage: {} mask|prox|prox_linear N [repeat]\n", argv[0]);
    return 1;
  }
  const std::string op = argv[1];
  const auto n = static_cast<rlpt::index_t>(std::strtoll(argv[2], nullptr, 10));
  const int repeat = argc > 3 ? std::atoi(argv[3]) : 20;
  if (n < 1 || repeat < 1 || (op != "mask" && op != "prox" && op != "prox_linear")) {
    fmt::print(stderr, "bad arguments\n");
    return 1;
  }
  const auto in = rlpt::bench::make_token_inputs(n);
  const rlpt::token_layout layout = rlpt::token_layout::packed(in.offsets);
  std::vector<rlpt::mask_t> mask_out(static_cast<std::size_t>(n));
  std::vector<float> prox_out(static_cast<std::size_t>(n));
  const rlpt::proximal_options po{.method = op == "prox_linear" ? rlpt::prox_method::linear : rlpt::prox_method::loglinear};
  auto run = [&] {
    if (op == "mask")
      rlpt::mask_stale_tokens(layout, in.versions, in.mask, in.current, mask_out, {.max_age = 3});
    else
      rlpt::proximal_logprobs(in.behav, in.cur, in.versions, in.mask, in.current, prox_out, po);
  };
  for (int w = 0; w < 3; ++w) run();
  std::vector<double> times;
  for (int r = 0; r < repeat; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    run();
    times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(times.begin(), times.end());
  double checksum = 0.0;
  if (op == "mask")
    for (const auto m : mask_out) checksum += m;
  else
    for (std::size_t i = 0; i < prox_out.size(); ++i)
      if (in.mask[i] != 0) checksum += static_cast<double>(prox_out[i]);
  fmt::print("{{\"op\": \"{}\", \"n\": {}, \"seconds\": {:.9g}, \"checksum\": {:.17g}}}\n", op, n,
             times[times.size() / 2], checksum);
  return 0;
}
