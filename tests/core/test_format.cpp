// SPDX-License-Identifier: Apache-2.0
// rlpt's names and lists format as fmt's own string formatter and fmt::join would, with only
// fmt's base header in the public headers (core/format.hpp).
#include <rlpt/core/dtype.hpp>
#include <rlpt/core/format.hpp>
#include <rlpt/rollout/filters.hpp>
#include <rlpt/rollout/record.hpp>
#include <rlpt/staleness/selection.hpp>
#include <rlpt/sync/dtype.hpp>

#include "support/random.hpp"

#include <doctest/doctest.h>

#include <fmt/format.h> // the references: fmt's own string formatter and join
#include <fmt/ranges.h>

#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

namespace {

// Every spec is held against fmt's own formatting of the same name as a string.
template <class E> void check_specs(E e, std::string_view name) {
  CHECK(fmt::format("{}", e) == name);
  CHECK(fmt::format("[{:>9}]", e) == fmt::format("[{:>9}]", name));
  CHECK(fmt::format("[{:*<9}]", e) == fmt::format("[{:*<9}]", name));
  CHECK(fmt::format("[{:^9}]", e) == fmt::format("[{:^9}]", name));
  CHECK(fmt::format("[{:.2}]", e) == fmt::format("[{:.2}]", name));
  CHECK(fmt::format("[{:-^12.3s}]", e) == fmt::format("[{:-^12.3s}]", name));
  CHECK(fmt::format("{0} {0:>8} {1}", e, 7) == fmt::format("{0} {0:>8} {1}", name, 7));
}

} // namespace

TEST_CASE("enum names format as strings, with fmt's string specs") {
  check_specs(rlpt::dtype::bf16, "bf16");
  check_specs(rlpt::token_source::model, rlpt::name(rlpt::token_source::model));
  check_specs(rlpt::evict_reason::stale, rlpt::name(rlpt::evict_reason::stale));
  check_specs(rlpt::starvation_cause::missing_target, "missing_target");
  check_specs(rlpt::sync::wire_dtype::f32, rlpt::sync::name(rlpt::sync::wire_dtype::f32));
  // into a memory buffer (the same context type) and through a runtime format string
  fmt::memory_buffer buf;
  fmt::format_to(std::back_inserter(buf), "{:>6}|", rlpt::dtype::f64);
  CHECK(fmt::to_string(buf) == "   f64|");
  CHECK(fmt::format(fmt::runtime("{:<5}|"), rlpt::dtype::i8) == "i8   |");
}

TEST_CASE("enum name specs that cannot be forwarded are refused, not misprinted") {
  CHECK_THROWS_AS((void)fmt::format(fmt::runtime("{:{}}"), rlpt::dtype::f32, 5), fmt::format_error);
  CHECK_THROWS_AS((void)fmt::format(fmt::runtime("{:.{}}"), rlpt::dtype::f32, 1), fmt::format_error);
  const std::string spec(40, '>');
  CHECK_THROWS_AS((void)fmt::format(fmt::runtime("{:" + spec + "}"), rlpt::dtype::f32), fmt::format_error);
  CHECK_THROWS_AS((void)fmt::format(fmt::runtime("{:d}"), rlpt::dtype::f32), fmt::format_error); // not a string spec
  CHECK(fmt::format(fmt::runtime("{:*^20.3s}"), rlpt::dtype::bf16) == fmt::format("{:*^20.3s}", "bf16"));
}

TEST_CASE("joined prints what fmt::join prints") {
  const std::vector<std::int64_t> none;
  CHECK(rlpt::detail::joined(none, ", ") == fmt::format("{}", fmt::join(none, ", ")));
  rlpt::test::rng rng(7);
  for (int round = 0; round < 200; ++round) {
    std::vector<std::int64_t> shape(static_cast<std::size_t>(rng.integer(0, 6)));
    for (auto& d : shape) d = rng.integer(-1000000, 1000000) * (round % 3 == 0 ? 1000000007 : 1);
    if (round == 1) shape = {std::numeric_limits<std::int64_t>::min(), std::numeric_limits<std::int64_t>::max(), 0};
    const char* sep = round % 2 == 0 ? ", " : ",";
    CHECK(rlpt::detail::joined(shape, sep) == fmt::format("{}", fmt::join(shape, sep)));
  }
  const std::vector<std::uint64_t> big{std::numeric_limits<std::uint64_t>::max(), 1};
  CHECK(rlpt::detail::joined(big, ", ") == fmt::format("{}", fmt::join(big, ", ")));
  const std::vector<std::string> names{"a.q_proj.weight", "", "b"};
  CHECK(rlpt::detail::joined(names, ", ") == fmt::format("{}", fmt::join(names, ", ")));
}
