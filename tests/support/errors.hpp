// SPDX-License-Identifier: Apache-2.0
// Asserting on rlpt errors: the stable id and the words of the message, not just "it threw".
#pragma once

#include <rlpt/core/error.hpp>

#include <doctest/doctest.h>

#include <initializer_list>
#include <string>

//! CHECK that `expr` throws rlpt::error with id `want_id` and a message containing each of the
//! following strings (the offending values the message must name).
#define RLPT_CHECK_ERROR(expr, want_id, ...)                                                                           \
  do {                                                                                                                 \
    bool rlpt_threw_ = false;                                                                                          \
    try {                                                                                                              \
      static_cast<void>(expr);                                                                                         \
    } catch (const ::rlpt::error& rlpt_e_) {                                                                           \
      rlpt_threw_ = true;                                                                                              \
      CHECK_MESSAGE(rlpt_e_.id() == std::string(want_id), "id was ", rlpt_e_.id(), ": ", rlpt_e_.what());              \
      for (const std::string& rlpt_part_ : std::initializer_list<std::string>{"", __VA_ARGS__})                        \
        CHECK_MESSAGE(rlpt_e_.message().find(rlpt_part_) != std::string::npos, "message lacks \"", rlpt_part_,         \
                      "\": ", rlpt_e_.message());                                                                      \
    }                                                                                                                  \
    CHECK_MESSAGE(rlpt_threw_, #expr " did not throw rlpt::error");                                                    \
  } while (0)
