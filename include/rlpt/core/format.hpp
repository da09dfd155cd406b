// SPDX-License-Identifier: Apache-2.0
//! @file
//! What rlpt's messages need from fmt beyond its base header: a formatter for named enums and
//! a joined list. fmt 9 defines `formatter<string_view>::format` and `fmt::join` in format.h and
//! ranges.h (0.3-0.6 CPU s more per including translation unit than core.h alone, g++ 12 -O2 on
//! a 2-vCPU EPYC), so the public headers format names through the compiled `vformat` and join
//! lists by hand instead.
#pragma once

#include <rlpt/config.hpp>

#include <fmt/core.h>

#include <cstddef>
#include <string>
#include <string_view>
#include <type_traits>

RLPT_NAMESPACE_BEGIN
namespace detail {

//! Base of `fmt::formatter<E>` for an enum with a `name(E)`: formats the name as a string, with
//! fmt's string specs (fill, alignment, width, precision: `{:>8}`), checked by fmt's own parser
//! (at compile time where the format string is). Dynamic widths (`{:{}}`) are refused: the spec
//! is forwarded to a format string of its own.
class name_formatter {
public:
  template <class ParseContext> constexpr auto parse(ParseContext& ctx) -> decltype(ctx.begin()) {
    const auto begin = ctx.begin();
    fmt::formatter<fmt::string_view> strings;
    const auto end = strings.parse(ctx);
    size_ = 0;
    for (auto it = begin; it != end; ++it) {
      if (*it == '{') bad_spec("rlpt names take no dynamic width or precision");
      if (size_ == sizeof spec_) bad_spec("format spec too long for an rlpt name");
      spec_[size_++] = *it;
    }
    return end;
  }

  template <class Context> auto format_name(std::string_view name, Context& ctx) const -> decltype(ctx.out()) {
    auto out = ctx.out();
    if (size_ == 0) {
      for (char c : name) *out++ = c;
      return out;
    }
    for (char c : with_spec(name, std::string_view(spec_, size_))) *out++ = c;
    return out;
  }

private:
  // Not a template, so that nvcc's device pass, which follows fmt's constexpr argument machinery
  // from the formatter into its long double overloads (warning 20208), never instantiates it.
  static std::string with_spec(std::string_view name, std::string_view spec) {
    char f[sizeof spec_ + 3] = {'{', ':'};
    spec.copy(f + 2, spec.size());
    f[2 + spec.size()] = '}';
    return fmt::vformat(fmt::string_view(f, spec.size() + 3), fmt::make_format_args(name));
  }

  // fmt::format_error: a compile-time error where the format string is checked (neither
  // function is constexpr): fmt 9 and 10 name it detail::throw_format_error, fmt 11 and later
  // report_error.
  static void bad_spec(const char* why) {
#if FMT_VERSION >= 110000
    fmt::report_error(why);
#else
    fmt::detail::throw_format_error(why);
#endif
  }

  char spec_[32] = {};
  std::size_t size_ = 0;
};

//! The elements of `r` (integers or strings) separated by `sep`: what `fmt::join(r, sep)`
//! prints for them.
template <class Range> [[nodiscard]] std::string joined(const Range& r, std::string_view sep) {
  std::string s;
  bool first = true;
  for (const auto& e : r) {
    if (!first) s += sep;
    first = false;
    if constexpr (std::is_integral_v<std::remove_cvref_t<decltype(e)>>) {
      s += std::to_string(e); // the digits fmt prints for an integer
    } else {
      s += std::string_view(e);
    }
  }
  return s;
}

} // namespace detail
RLPT_NAMESPACE_END
