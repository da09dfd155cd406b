// SPDX-License-Identifier: Apache-2.0
#include <rlpt/core/error.hpp>

#include "support/errors.hpp"

TEST_CASE("rlpt::error carries a stable id and a formatted message") {
  const rlpt::error e("rlpt.test.example", "group 17 has 1 sample");
  CHECK(e.id() == "rlpt.test.example");
  CHECK(e.message() == "group 17 has 1 sample");
  CHECK(std::string(e.what()) == "rlpt::error [rlpt.test.example]: group 17 has 1 sample");
  const std::runtime_error& base = e; // catchable as a standard exception
  CHECK(std::string(base.what()).find("group 17") != std::string::npos);
}

namespace {
// Ids are error_id constants (string literals do not compile as ids); tests may declare their own.
constexpr rlpt::error_id group_size_id{"rlpt.test.group_size"};
constexpr rlpt::error_id lazy_id{"rlpt.test.lazy"};
} // namespace

TEST_CASE("RLPT_CHECK throws only when the condition fails and formats the values") {
  auto validate = [](int n) { RLPT_CHECK(n >= 2, group_size_id, "group {} has {} sample(s)", 17, n); };
  CHECK_NOTHROW(validate(2));
  RLPT_CHECK_ERROR(validate(1), "rlpt.test.group_size", "group 17 has 1 sample(s)");
}

TEST_CASE("RLPT_CHECK evaluates its message arguments only on failure") {
  int evaluated = 0;
  auto arg = [&] { return ++evaluated; };
  RLPT_CHECK(true, lazy_id, "{}", arg());
  CHECK(evaluated == 0);
}
