// SPDX-License-Identifier: Apache-2.0
// A simulated tensor-parallel group for host tests: k ranks on k threads, all-reduce through
// shared slots and a barrier, combined in rank order.
#pragma once

#include <rlpt/logprob/vocab_parallel.hpp>

#include <algorithm>
#include <barrier>
#include <vector>

namespace rlpt::test {

// k ranks on k threads; the hook all-reduces through shared slots and a barrier, in rank order.
struct fake_group {
  explicit fake_group(int ranks) : k(ranks), sync(ranks), slots(static_cast<std::size_t>(ranks)) {}
  int k;
  std::barrier<> sync;
  std::vector<rlpt::view<float>> slots;
  void allreduce(int rank, rlpt::view<float> data, rlpt::reduce_op op) {
    slots[static_cast<std::size_t>(rank)] = data;
    sync.arrive_and_wait();
    std::vector<float> acc(slots[0].begin(), slots[0].end()); // rank order: same bits everywhere
    for (int q = 1; q < k; ++q) {
      for (rlpt::index_t i = 0; i < data.size(); ++i) {
        const float v = slots[static_cast<std::size_t>(q)][i];
        acc[static_cast<std::size_t>(i)] = op == rlpt::reduce_op::max ? std::max(acc[static_cast<std::size_t>(i)], v)
                                                                      : acc[static_cast<std::size_t>(i)] + v;
      }
    }
    sync.arrive_and_wait(); // everyone read everyone before anyone writes
    std::copy(acc.begin(), acc.end(), data.begin());
    sync.arrive_and_wait();
  }
};

} // namespace rlpt::test
