// SPDX-License-Identifier: Apache-2.0
#include <rlpt/core/executor.hpp>
#include <rlpt/core/stats.hpp>
#include <rlpt/core/thread_pool.hpp>

#include "support/random.hpp"

#include <doctest/doctest.h>

#include <atomic>
#include <limits>
#include <stdexcept>
#include <utility>
#include <vector>

TEST_CASE("parallel_for visits every index exactly once, on any pool size") {
  for (unsigned threads : {1u, 2u, 3u, 8u}) {
    rlpt::thread_pool pool(threads);
    rlpt::host_executor ex{&pool};
    for (rlpt::index_t n : {0, 1, 17, 1000, 4099}) {
      std::vector<std::atomic<int>> hits(static_cast<std::size_t>(n));
      ex.parallel_for(n, 64, [&](rlpt::index_t b, rlpt::index_t e) {
        for (auto i = b; i < e; ++i) hits[static_cast<std::size_t>(i)].fetch_add(1, std::memory_order_relaxed);
      });
      for (auto& h : hits) REQUIRE(h.load() == 1);
    }
  }
}

TEST_CASE("parallel_reduce gives the same bits whatever the thread count") {
  rlpt::test::rng r(20);
  const auto x = r.normals<float>(100003, 0.0, 1e3);
  auto reduce = [&](const rlpt::host_executor& ex) {
    return ex.parallel_reduce(
        static_cast<rlpt::index_t>(x.size()), 4096, rlpt::moments{},
        [&](rlpt::index_t b, rlpt::index_t e) {
          return rlpt::moments_of(rlpt::view<const float>(x.data() + b, e - b));
        },
        [](rlpt::moments& acc, const rlpt::moments& part) { acc.merge(part); });
  };
  const auto serial = reduce(rlpt::host_executor{});
  for (unsigned threads : {2u, 3u, 7u}) {
    rlpt::thread_pool pool(threads);
    const auto par = reduce(rlpt::host_executor{&pool});
    CHECK(par.mean == serial.mean); // bitwise
    CHECK(par.m2 == serial.m2);
  }
}

TEST_CASE("an exception in a chunk reaches the caller and the pool stays usable") {
  rlpt::thread_pool pool(4);
  rlpt::host_executor ex{&pool};
  CHECK_THROWS_AS(ex.parallel_for(1000, 10,
                                  [](rlpt::index_t b, rlpt::index_t) {
                                    if (b == 500) throw std::runtime_error("boom");
                                  }),
                  std::runtime_error);
  std::atomic<rlpt::index_t> sum{0};
  ex.parallel_for(1000, 10, [&](rlpt::index_t b, rlpt::index_t e) { sum += e - b; });
  CHECK(sum.load() == 1000);
}

TEST_CASE("many short loops back to back do not lose wake-ups" * doctest::timeout(60)) {
  rlpt::thread_pool pool(3);
  rlpt::host_executor ex{&pool};
  for (int loop = 0; loop < 2000; ++loop) {
    std::atomic<int> n{0};
    ex.parallel_for(8, 1, [&](rlpt::index_t, rlpt::index_t) { n.fetch_add(1); });
    REQUIRE(n.load() == 8);
  }
}

TEST_CASE("chunking never overflows: grains and counts near index_t's limit") {
  constexpr rlpt::index_t big = std::numeric_limits<rlpt::index_t>::max();
  const rlpt::host_executor ex;
  // n + grain - 1 used to overflow for a huge grain (a layout of one very long row asks for it).
  std::vector<std::pair<rlpt::index_t, rlpt::index_t>> seen;
  ex.parallel_for(5, big, [&](rlpt::index_t b, rlpt::index_t e) { seen.emplace_back(b, e); });
  CHECK(seen == std::vector<std::pair<rlpt::index_t, rlpt::index_t>>{{0, 5}});
  seen.clear();
  // The last chunk of a range ending at INT64_MAX: (c + 1) * grain used to overflow.
  rlpt::index_t chunks = 0, last_end = 0;
  ex.parallel_for(big, big / 2 + 1, [&](rlpt::index_t, rlpt::index_t e) {
    ++chunks;
    last_end = e;
  });
  CHECK(chunks == 2);
  CHECK(last_end == big);
  CHECK(ex.parallel_reduce(
            7, big, rlpt::index_t{0}, [](rlpt::index_t b, rlpt::index_t e) { return e - b; },
            [](rlpt::index_t& acc, rlpt::index_t part) { acc += part; }) == 7);
}
