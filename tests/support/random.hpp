// SPDX-License-Identifier: Apache-2.0
// Seeded random inputs for tests. Every test draws from a fixed seed (overridable with
// RLPT_TEST_SEED to explore), so a failure reproduces exactly.
#pragma once

#include <rlpt/config.hpp>

#include <cstdint>
#include <cstdlib>
#include <random>
#include <vector>

namespace rlpt::test {

//! The base seed: RLPT_TEST_SEED if set, else a fixed constant.
inline std::uint64_t base_seed() {
  if (const char* s = std::getenv("RLPT_TEST_SEED")) return std::strtoull(s, nullptr, 10);
  return 20261129;
}

class rng {
public:
  //! `stream` separates independent draws within one test (different inputs, same base seed).
  explicit rng(std::uint64_t stream = 0) : engine_(base_seed() * 0x9E3779B97F4A7C15ull + stream) {}

  double uniform(double lo = 0.0, double hi = 1.0) { return std::uniform_real_distribution<double>(lo, hi)(engine_); }
  double normal(double mean = 0.0, double stddev = 1.0) {
    return std::normal_distribution<double>(mean, stddev)(engine_);
  }
  std::int64_t integer(std::int64_t lo, std::int64_t hi) { // inclusive
    return std::uniform_int_distribution<std::int64_t>(lo, hi)(engine_);
  }
  bool bernoulli(double p) { return std::bernoulli_distribution(p)(engine_); }

  template <class T = float> std::vector<T> normals(std::size_t n, double mean = 0.0, double stddev = 1.0) {
    std::vector<T> v(n);
    for (auto& x : v) x = static_cast<T>(normal(mean, stddev));
    return v;
  }
  template <class T = float> std::vector<T> uniforms(std::size_t n, double lo = 0.0, double hi = 1.0) {
    std::vector<T> v(n);
    for (auto& x : v) x = static_cast<T>(uniform(lo, hi));
    return v;
  }
  //! A 0/1 mask with the given fraction of ones.
  std::vector<std::uint8_t> mask(std::size_t n, double p_valid) {
    std::vector<std::uint8_t> v(n);
    for (auto& x : v) x = bernoulli(p_valid) ? 1 : 0;
    return v;
  }

  std::mt19937_64& engine() { return engine_; }

private:
  std::mt19937_64 engine_;
};

} // namespace rlpt::test
