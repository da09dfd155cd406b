// SPDX-License-Identifier: Apache-2.0
// Seeded trajectories for the rollout tests.
#pragma once

#include <rlpt/rollout/record.hpp>

#include "support/random.hpp"

#include <cstdint>
#include <vector>

namespace rlpt::test {

//! A valid record: `prompt` prompt tokens, `response` model tokens of version `version`,
//! random ids, logprobs and a reward; the last response token masked out when `mask_last`.
inline trajectory make_record(rng& r, std::int64_t group, std::int32_t sample, index_t prompt, index_t response,
                              policy_version version = 0, float reward = 0.0f, bool mask_last = false) {
  std::vector<token_id> p(static_cast<std::size_t>(prompt)), t(static_cast<std::size_t>(response));
  for (auto& x : p) x = static_cast<token_id>(r.integer(0, 50000));
  for (auto& x : t) x = static_cast<token_id>(r.integer(0, 50000));
  std::vector<float> lp(static_cast<std::size_t>(response));
  for (auto& x : lp) x = static_cast<float>(-r.uniform(0.0, 5.0));
  std::vector<mask_t> m(static_cast<std::size_t>(response), 1);
  if (mask_last && response > 0) m.back() = 0;
  trajectory_builder b(group, p);
  b.model(t, lp, version, m).reward(reward);
  trajectory out = std::move(b).finish();
  out.sample_index = sample;
  return out;
}

} // namespace rlpt::test
