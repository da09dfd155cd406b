// SPDX-License-Identifier: Apache-2.0
// Host model of how a device kernel folds one logits row (rows.cuh row_state, detail.cuh
// block_merge), running the shared lse2_* arithmetic of <rlpt/logprob/math.hpp> with exp2f in
// place of the MUFU ex2: thread t folds 16-byte vectors t, t + B, t + 2B, ... in order; a warp
// merges in an xor butterfly (lower lane first), warp 0 merges the warps' results the same way.
// The structure is the device's; the last bits of ex2 are not.
#pragma once

#include <rlpt/core/views.hpp>
#include <rlpt/logprob/detail/device_rows.hpp>
#include <rlpt/logprob/math.hpp>

#include <array>
#include <limits>
#include <vector>

namespace rlpt::test {

inline void model_warp_merge(std::array<lse_state2, 32>& lane) {
  for (int o = 16; o > 0; o >>= 1) {
    std::array<lse_state2, 32> next{};
    for (int l = 0; l < 32; ++l) {
      const int p = l ^ o;
      next[static_cast<std::size_t>(l)] =
          (l & o) == 0 ? lse2_merge(lane[static_cast<std::size_t>(l)], lane[static_cast<std::size_t>(p)])
                       : lse2_merge(lane[static_cast<std::size_t>(p)], lane[static_cast<std::size_t>(l)]);
    }
    lane = next;
  }
}

//! The state a BLOCK-thread device kernel computes for row x[0, cols) (tempered by tp).
template <class T> lse_state2 device_row_model(const T* x, index_t cols, int block, tempering tp) {
  constexpr int W = detail::device_vec_width<T>;
  const index_t nvec = (cols + W - 1) / W;
  std::vector<lse_state2> thread(static_cast<std::size_t>(block), lse2_empty());
  for (int t = 0; t < block; ++t)
    for (index_t q = t; q < nvec; q += block) {
      float z[W];
      for (int k = 0; k < W; ++k) {
        const index_t j = q * W + k;
        z[k] = j < cols ? detail::load_logit(x[j]) : -std::numeric_limits<float>::infinity();
        if (!tp.identity()) z[k] = detail::temper(z[k], tp);
      }
      lse2_fold(thread[static_cast<std::size_t>(t)], z);
    }
  const int warps = block / 32;
  std::array<lse_state2, 32> first{};
  for (int w = 0; w < warps; ++w) {
    std::array<lse_state2, 32> lane{};
    for (int l = 0; l < 32; ++l) lane[static_cast<std::size_t>(l)] = thread[static_cast<std::size_t>(w * 32 + l)];
    model_warp_merge(lane);
    first[static_cast<std::size_t>(w)] = lane[0];
  }
  for (int l = warps; l < 32; ++l) first[static_cast<std::size_t>(l)] = lse2_empty();
  model_warp_merge(first);
  return first[0];
}

} // namespace rlpt::test
