// SPDX-License-Identifier: Apache-2.0
// Seeded benchmark inputs shared by the Google Benchmark suite and the JSON runner.
#pragma once

#include <rlpt/config.hpp>

#include <cstdint>
#include <random>
#include <vector>

namespace rlpt::bench {

//! A padded [B, T] batch: prefix masks with length uniform in [T/2, T], KL-like token rewards
//! plus an outcome on the last valid token, critic values.
struct token_inputs {
  index_t B = 0, T = 0;
  std::vector<float> rewards, values;
  std::vector<std::uint8_t> mask;
};

inline token_inputs make_tokens(index_t B, index_t T, std::uint64_t seed = 7) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<index_t> len(T / 2, T);
  token_inputs in{B, T, std::vector<float>(static_cast<std::size_t>(B * T)),
                  std::vector<float>(static_cast<std::size_t>(B * T)),
                  std::vector<std::uint8_t>(static_cast<std::size_t>(B * T), 0)};
  for (index_t b = 0; b < B; ++b) {
    const index_t n = len(rng);
    for (index_t t = 0; t < T; ++t) {
      const auto i = static_cast<std::size_t>(b * T + t);
      in.values[i] = normal(rng);
      in.rewards[i] = 0.01f * normal(rng);
      in.mask[i] = t < n ? 1 : 0;
    }
    in.rewards[static_cast<std::size_t>(b * T + n - 1)] += normal(rng);
  }
  return in;
}

//! One outcome reward per sequence, in groups of `group` consecutive sequences (ids shuffled
//! group-wise so groups are not positional).
struct outcome_inputs {
  std::vector<float> rewards;
  std::vector<std::int64_t> ids;
};

inline outcome_inputs make_outcomes(index_t n, index_t group, std::uint64_t seed = 11) {
  std::mt19937_64 rng(seed);
  std::bernoulli_distribution coin(0.4);
  outcome_inputs in;
  for (index_t i = 0; i < n; ++i) {
    in.rewards.push_back(coin(rng) ? 1.0f : 0.0f);
    in.ids.push_back((i / group) * 7919 % 1000003);
  }
  return in;
}

} // namespace rlpt::bench
