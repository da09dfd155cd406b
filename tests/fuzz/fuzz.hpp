// SPDX-License-Identifier: Apache-2.0
// Shared pieces of the fuzz targets (tests/fuzz/target_*.hpp).
//
// A target takes arbitrary bytes and either accepts them (a valid result whose invariants and
// round trip it checks) or rejects them with rlpt::error. Anything else is a finding: a crash,
// a sanitizer report, a leak, a hang, any other exception, or a broken invariant (which throws
// fuzz::violation: libFuzzer reports it as a crash, the replay test as a failure).
#pragma once

#include <rlpt/core/error.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace rlpt::fuzz {

enum class outcome : std::uint8_t { accepted, rejected };

using input = std::span<const std::uint8_t>;

//! A broken invariant (never an expected rejection).
class violation : public std::logic_error {
public:
  using std::logic_error::logic_error;
};

[[noreturn]] inline void fail_violation(const char* file, int line, const char* cond, const std::string& what) {
  throw violation(fmt::format("{}:{}: fuzz invariant failed: {} {}", file, line, cond, what));
}

#define RLPT_FUZZ_ASSERT(cond, ...)                                                                                    \
  do {                                                                                                                 \
    if (!(cond)) ::rlpt::fuzz::fail_violation(__FILE__, __LINE__, #cond, ::fmt::format("" __VA_ARGS__));               \
  } while (0)

//! Reads fixed-size fields from the front of the input (zero once it runs out), the rest as
//! bytes: structured inputs for the targets whose inputs are not one byte string.
class reader {
public:
  explicit reader(input in) : in_(in) {}

  template <class T> T get() {
    T v{};
    const std::size_t n = std::min(sizeof(T), in_.size() - at_);
    if (n != 0) std::memcpy(&v, in_.data() + at_, n);
    at_ += n;
    return v;
  }
  [[nodiscard]] std::span<const std::uint8_t> rest() const noexcept { return in_.subspan(at_); }
  [[nodiscard]] bool empty() const noexcept { return at_ >= in_.size(); }

private:
  input in_;
  std::size_t at_ = 0;
};

inline std::vector<std::byte> to_bytes(input in) {
  std::vector<std::byte> v(in.size());
  if (!in.empty()) std::memcpy(v.data(), in.data(), in.size());
  return v;
}

inline bool same(std::span<const std::byte> a, std::span<const std::byte> b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size()) == 0);
}

//! Bytes 8-byte aligned (inputs handed to a fuzzer are not, and some parsers require it).
class aligned_bytes {
public:
  explicit aligned_bytes(std::span<const std::uint8_t> in) : words_((in.size() + 7) / 8 + 1), size_(in.size()) {
    if (!in.empty()) std::memcpy(words_.data(), in.data(), in.size());
  }
  [[nodiscard]] std::span<std::byte> span() noexcept { return {reinterpret_cast<std::byte*>(words_.data()), size_}; }

private:
  std::vector<std::uint64_t> words_;
  std::size_t size_;
};

} // namespace rlpt::fuzz
