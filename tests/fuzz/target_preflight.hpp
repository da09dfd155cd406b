// SPDX-License-Identifier: Apache-2.0
// Fuzz target: a peer's preflight (sync::decode_environment), the first bytes a weight-sync link
// reads from the other end. Garbage must be rejected with rlpt::error; an accepted environment
// must re-encode to the same bytes and compare cleanly against itself and a default one.
#pragma once

#include "fuzz.hpp"

#include <rlpt/sync/preflight.hpp>

#include <vector>

namespace rlpt::fuzz {

inline outcome preflight(input in) {
  const std::vector<std::byte> bytes = to_bytes(in);
  sync::environment e;
  try {
    e = sync::decode_environment(bytes, "fuzz");
  } catch (const rlpt::error&) {
    return outcome::rejected;
  }
  RLPT_FUZZ_ASSERT(same(sync::encode_environment(e), bytes), "decode -> encode changed the preflight");
  // every rule runs over the decoded fields (the devices rule finds each shared GPU)
  const auto self = sync::compare_environments(e, e, sync::preflight_rules::nccl());
  std::size_t shared = 0;
  for (const auto& d : e.devices)
    for (const auto& o : e.devices) shared += !d.uuid.empty() && d.uuid == o.uuid ? 1 : 0;
  RLPT_FUZZ_ASSERT(self.size() == shared, "self-comparison found {} mismatches, {} shared devices", self.size(),
                   shared);
  (void)sync::compare_environments(e, sync::environment{}, sync::preflight_rules::nccl());
  return outcome::accepted;
}

} // namespace rlpt::fuzz
