// SPDX-License-Identifier: Apache-2.0
//! @file
//! The one policy every block takes for NaN or infinite inputs where it would use them: raise an
//! error naming them, or leave them out and count them. A NaN never reaches a result silently.
#pragma once

#include <rlpt/config.hpp>

#include <cstdint>

RLPT_NAMESPACE_BEGIN

//! What a call does with a non-finite input where it would be used (a reward, a value, an input
//! of a valid token).
enum class nonfinite : std::uint8_t {
  //! throw rlpt::error naming the offending values (verl, OpenRLHF, AReaL: NaN propagates there);
  //! the device entry points, which cannot throw, report through their result instead
  raise,
  //! leave the item out, as if masked (of every statistic, term and local denominator; its
  //! outputs are 0), and count it (TRL's unscorable completions)
  mask,
};

RLPT_NAMESPACE_END
