// SPDX-License-Identifier: Apache-2.0
// rlpt's side of the staleness comparisons of scripts/bench-peers (bench/peers/blocks/staleness.py):
// one per-token staleness kernel on the shared deterministic inputs (staleness/inputs.hpp; the
// peer builds the same closed forms), timed with the protocol of bench/support/peer_timing.hpp
// (one thread, the output allocated inside every call, process CPU time per call); one JSON line.
//   bench_staleness_runner mask|prox|prox_linear N [--warmup N --calls N --flush BYTES --out DIR]
// --out writes the output (mask.u8 or prox.f32) for the harness's equality check.
#include <rlpt/staleness/proximal.hpp>
#include <rlpt/staleness/token_mask.hpp>

#include "staleness/inputs.hpp"
#include "support/peer_timing.hpp"

#include <fmt/format.h>

#include <cstdlib>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  try {
    const rlpt::bench::timing_plan plan = rlpt::bench::parse_timing(argc, argv);
    if (argc != 3) {
      fmt::print(stderr, "usage: {} mask|prox|prox_linear N [--warmup N --calls N --flush BYTES --out DIR]\n", argv[0]);
      return 2;
    }
    const std::string op = argv[1];
    const auto n = static_cast<rlpt::index_t>(std::strtoll(argv[2], nullptr, 10));
    if (n < 1 || (op != "mask" && op != "prox" && op != "prox_linear")) {
      fmt::print(stderr, "bad arguments\n");
      return 2;
    }
    const auto u = static_cast<std::size_t>(n);
    const auto in = rlpt::bench::make_token_inputs(n);
    const rlpt::token_layout layout = rlpt::token_layout::packed(in.offsets);
    const rlpt::proximal_options po{.method =
                                        op == "prox_linear" ? rlpt::prox_method::linear : rlpt::prox_method::loglinear};
    // bytes one call moves: versions (4) + mask (1) in, mask (1) out; proximal: two logprobs (8),
    // versions (4) and mask (1) in, one logprob (4) out
    const double bytes = static_cast<double>(n) * (op == "mask" ? 6.0 : 17.0);
    if (op == "mask") {
      auto call = [&] {
        auto out = rlpt::bench::output<rlpt::mask_t>(u);
        rlpt::mask_stale_tokens(layout, in.versions, in.mask, in.current, rlpt::view<rlpt::mask_t>(out.get(), n),
                                {.max_age = 3});
        return out;
      };
      const auto t = rlpt::bench::time_calls(plan, call);
      if (!plan.out.empty()) rlpt::bench::write_raw(plan.out + "/mask.u8", call().get(), u);
      fmt::print("{{\"op\": \"{}\", \"n\": {}, \"bytes\": {}, {}}}\n", op, n, bytes, rlpt::bench::json_series(t));
    } else {
      auto call = [&] {
        auto out = rlpt::bench::output<float>(u);
        rlpt::proximal_logprobs(in.behav, in.cur, in.versions, in.mask, in.current, rlpt::view<float>(out.get(), n),
                                po);
        return out;
      };
      const auto t = rlpt::bench::time_calls(plan, call);
      if (!plan.out.empty()) rlpt::bench::write_raw(plan.out + "/prox.f32", call().get(), u);
      fmt::print("{{\"op\": \"{}\", \"n\": {}, \"bytes\": {}, {}}}\n", op, n, bytes, rlpt::bench::json_series(t));
    }
  } catch (const std::exception& e) {
    fmt::print(stderr, "bench_staleness_runner: {}\n", e.what());
    return 1;
  }
  return 0;
}
