// SPDX-License-Identifier: Apache-2.0
// rlpt's statistics against torch's own on the same data (tools/golden/gen_core.py).
#include <rlpt/core/stats.hpp>

#include "support/golden.hpp"

#include <doctest/doctest.h>

TEST_CASE("masked moments match torch.mean / torch.var (golden)") {
  const rlpt::test::golden_file g(rlpt::test::golden_path("core", "welford.bin"));
  const auto x = g.get<double>("x");
  const auto mask = g.get<std::uint8_t>("mask");
  const auto m = rlpt::moments_of(x, mask);
  CHECK(m.count == g.get<double>("count")[0]);
  CHECK(m.mean == doctest::Approx(g.get<double>("mean")[0]).epsilon(1e-15));
  CHECK(m.variance(true) == doctest::Approx(g.get<double>("var_unbiased")[0]).epsilon(1e-13));
  CHECK(m.variance(false) == doctest::Approx(g.get<double>("var_biased")[0]).epsilon(1e-13));
  CHECK(g.meta().find("torch") != std::string::npos); // produced by torch, not by rlpt
}
