// SPDX-License-Identifier: Apache-2.0
// The machine's memory-bandwidth limit, measured in the same run as a benchmark, so results
// can be stated as a fraction of what the hardware allows.
#pragma once

#include <rlpt/core/executor.hpp>
#include <rlpt/core/thread_pool.hpp>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <vector>

namespace rlpt::bench {

struct bandwidth {
  double copy_gbps = 0; //!< best copy rate, counting bytes read plus bytes written
  unsigned threads = 1;
};

//! Copies a buffer far larger than the caches `repeats` times (split over `threads` threads,
//! as the measured code is) and keeps the best rate.
inline bandwidth measure_copy_bandwidth(std::size_t bytes = std::size_t{1} << 30, int repeats = 5,
                                        unsigned threads = 1) {
  std::vector<char> src(bytes, 1), dst(bytes, 0);
  thread_pool pool(threads);
  const host_executor ex{&pool};
  const index_t chunk = static_cast<index_t>(bytes / threads + 1);
  double best = 0;
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    ex.parallel_for(static_cast<index_t>(bytes), chunk, [&](index_t b, index_t e) {
      std::memcpy(dst.data() + b, src.data() + b, static_cast<std::size_t>(e - b));
    });
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, 2.0 * static_cast<double>(bytes) / s / 1e9);
  }
  return {best, threads};
}

} // namespace rlpt::bench
