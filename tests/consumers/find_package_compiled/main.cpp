// Compiled mode: this TU and transform.cpp see rlpt's declarations only, and the definitions
// come from rlpt::compiled; the core's header-only code works as before.
#include <rlpt/rlpt.hpp>

#include <cstdio>
#include <string>
#include <vector>

static_assert(!RLPT_HEADER_IMPL(), "linking rlpt::compiled defines RLPT_COMPILED_LIB");

std::string renamed_by_transform(); // transform.cpp

int main() {
  std::vector<std::int64_t> ids{7, 3, 7, 3, 9}; // header-only code alongside: the core's groups
  if (rlpt::groups::from_ids(ids).num_groups() != 3) return 3;
  const std::string name = renamed_by_transform();
  try {
    // A pattern with two '*' is refused by the compiled transform_plan, with rlpt's error id.
    const rlpt::sync::manifest m;
    const rlpt::sync::transform_plan bad(m, {rlpt::sync::drop{"*.*"}});
    return 4;
  } catch (const rlpt::error& e) {
    if (e.id() != "rlpt.sync.bad_transform") return 5;
  }
  std::printf("compiled: %s\n", name.c_str());
  return name == "layers.0.query.weight" ? 0 : 6;
}
