// SPDX-License-Identifier: Apache-2.0
// Every fuzz target, by name: the replay test and the seed tool iterate over this table; each
// libFuzzer binary (fuzz_main.cpp) includes only its own target.
#pragma once

#include "target_checkpoint.hpp"
#include "target_delta.hpp"
#include "target_dlpack.hpp"
#include "target_frame.hpp"
#include "target_manifest.hpp"
#include "target_preflight.hpp"
#include "target_safetensors.hpp"
#include "target_staleness.hpp"

#include <string_view>

namespace rlpt::fuzz {

struct target {
  std::string_view name;
  outcome (*run)(input);
};

inline constexpr target targets[] = {
    {"safetensors", safetensors}, {"manifest", manifest},   {"delta", delta},   {"frame", frame},
    {"checkpoint", checkpoint},   {"staleness", staleness}, {"dlpack", dlpack}, {"preflight", preflight},
};

} // namespace rlpt::fuzz
