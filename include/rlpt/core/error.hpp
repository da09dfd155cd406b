// SPDX-License-Identifier: Apache-2.0
//! @file
//! rlpt::error and the host validation macros.
//!
//! Every error carries a stable id (`rlpt.<block>.<problem>`, named in core/error_ids.hpp) that
//! callers and tests can match on, and a message that names the offending values:
//!
//!     rlpt::error [rlpt.advantage.group_size]: group 17 has 1 sample; RLOO needs at least 2
//!
//! Only fmt's base header is included here: the message is formatted out of line by fmt's
//! compiled `vformat` (the library every consumer links), so headers stay cheap to parse.
#pragma once

#include <rlpt/config.hpp>
#include <rlpt/core/error_ids.hpp>

#include <fmt/core.h>

#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

RLPT_NAMESPACE_BEGIN

//! The one exception type rlpt throws for invalid input or a failed runtime call.
class error : public std::runtime_error {
public:
  error(std::string_view id, std::string_view message)
      : std::runtime_error(what_of(id, message)), id_(id), message_(message) {}

  //! Stable identifier, e.g. "rlpt.view.size_mismatch". Never changes between versions.
  [[nodiscard]] const std::string& id() const noexcept { return id_; }
  //! The message without the id prefix.
  [[nodiscard]] const std::string& message() const noexcept { return message_; }

private:
  static std::string what_of(std::string_view id, std::string_view message) {
    std::string s = "rlpt::error [";
    s.append(id).append("]: ").append(message);
    return s;
  }

  std::string id_;
  std::string message_;
};

namespace detail {

[[noreturn]] inline void raise(std::string_view id, std::string_view message) {
#if defined(RLPT_THROW_USER)
  RLPT_THROW_USER(id, message); // user hook: must not return
#elif RLPT_USE_EXCEPTIONS
  throw error(id, message);
#else
  std::fprintf(stderr, "rlpt::error [%.*s]: %.*s\n", static_cast<int>(id.size()), id.data(),
               static_cast<int>(message.size()), message.data());
  std::abort();
#endif
}

// The format string is checked against the arguments at compile time (fmt::format_string) in
// rlpt's own builds (tests and benchmarks define RLPT_CHECK_FORMAT_STRINGS); users' builds take it
// as a plain string view: the consteval check of ~600 messages is a large part of what including
// rlpt costs, and a string that passed rlpt's CI cannot fail it in a user's build.
#if defined(RLPT_CHECK_FORMAT_STRINGS)
template <class... Args> using message_format = fmt::format_string<Args...>;
#else
template <class... Args> using message_format = fmt::string_view;
#endif

using message_arg = fmt::basic_format_arg<fmt::format_context>;

//! One argument of a message, made for its type alone. `fmt::make_format_args(args...)`
//! instantiates fmt's argument store and type encoding once per list of argument types, and the
//! umbrella's messages have 241 distinct lists (clang -ftime-trace); one argument at a time, they
//! share one instantiation per type (docs/performance.md, compile time).
template <class T> [[nodiscard]] message_arg message_arg_of(const T& value) {
  return fmt::format_args(fmt::make_format_args(value)).get(0);
}

//! `format` with `count` arguments, by fmt's compiled `vformat`.
[[nodiscard]] inline std::string vformat_message(fmt::string_view format, const message_arg* args, int count) {
  return fmt::vformat(format, fmt::format_args(args, count));
}

//! `fmt::format(format, args...)` for rlpt's messages (checked at compile time in rlpt's own
//! builds, RLPT_CHECK_FORMAT_STRINGS).
template <class... Args> [[nodiscard]] std::string format(message_format<Args...> format, const Args&... args) {
  if constexpr (sizeof...(Args) == 0) {
    return vformat_message(format, nullptr, 0);
  } else {
    const message_arg list[] = {message_arg_of(args)...};
    return vformat_message(format, list, static_cast<int>(sizeof...(Args)));
  }
}

template <class... Args> [[noreturn]] void fail(error_id id, message_format<Args...> format, Args&&... args) {
  raise(id, detail::format<Args...>(format, args...));
}

} // namespace detail
RLPT_NAMESPACE_END

//! Throws rlpt::error with the given id and a fmt-formatted message.
#define RLPT_FAIL(id, ...) ::rlpt::detail::fail(id, __VA_ARGS__)

//! Host validation: throws rlpt::error(id, message) unless `cond` holds. Active in every build
//! mode: these checks guard against bad input, not against rlpt's own bugs.
#define RLPT_CHECK(cond, id, ...)                                                                                      \
  do {                                                                                                                 \
    if (RLPT_UNLIKELY(!(cond))) ::rlpt::detail::fail(id, __VA_ARGS__);                                                 \
  } while (0)
