// SPDX-License-Identifier: Apache-2.0
// Deterministic per-token inputs shared by bench_staleness and the peer runner; the same
// closed-form formulas are used by bench/peers/blocks/staleness.py, so both sides see
// identical data without a file exchange.
#pragma once

#include <rlpt/core/views.hpp>
#include <rlpt/staleness/clock.hpp>

#include <cstdint>
#include <vector>

namespace rlpt::bench {

struct token_inputs {
  policy_version current = 0;
  std::vector<index_t> offsets;         // packed sequences of 1000 tokens
  std::vector<policy_version> versions; // prompt tokens -1, then current - ((i * 7) % 8)
  std::vector<mask_t> mask;             // trained unless a prompt token or i % 13 == 0
  std::vector<float> behav;             // -(i % 1000) / 100
  std::vector<float> cur;               // -((i * 31) % 1000) / 100
};

inline token_inputs make_token_inputs(index_t n, policy_version current = 20) {
  token_inputs in;
  in.current = current;
  const auto u = static_cast<std::size_t>(n);
  in.versions.resize(u);
  in.mask.resize(u);
  in.behav.resize(u);
  in.cur.resize(u);
  for (index_t s = 0; s <= n / 1000; ++s) in.offsets.push_back(s * 1000 < n ? s * 1000 : n);
  if (in.offsets.back() != n) in.offsets.push_back(n);
  for (index_t i = 0; i < n; ++i) {
    const auto k = static_cast<std::size_t>(i);
    const bool prompt = i % 1000 < 100;
    in.versions[k] = prompt ? -1 : static_cast<policy_version>(current - static_cast<policy_version>((i * 7) % 8));
    in.mask[k] = (prompt || i % 13 == 0) ? 0 : 1;
    in.behav[k] = -static_cast<float>(i % 1000) / 100.0f;
    in.cur[k] = -static_cast<float>((i * 31) % 1000) / 100.0f;
  }
  return in;
}

} // namespace rlpt::bench
