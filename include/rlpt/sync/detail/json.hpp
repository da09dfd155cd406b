// SPDX-License-Identifier: Apache-2.0
//! @file
//! A small, strict JSON reader and writer for manifests and safetensors headers.
//!
//! Strict RFC 8259: no comments, trailing commas, NaN/Infinity, leading zeros, unescaped
//! control characters, invalid UTF-8 or lone surrogates; duplicate object keys are rejected
//! (a header that names a tensor twice is ambiguous). Depth and size are bounded. Every
//! rejection is an rlpt::error `rlpt.sync.json` naming the byte offset and what was wrong.
//! The writer emits compact JSON with serde_json's escaping, so safetensors headers come out
//! byte-identical to the ones Hugging Face's writer produces.
#pragma once

#include <rlpt/config.hpp>
#include <rlpt/core/error.hpp>
#include <rlpt/sync/checksum.hpp> // detail::hex_digit

#include <algorithm>
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

RLPT_NAMESPACE_BEGIN
namespace sync::detail {

//! A parsed JSON value. Numbers keep their text so integers beyond 2^53 stay exact.
class json {
public:
  enum class kind : std::uint8_t { null, boolean, number, string, array, object };

  json() = default;
  static json make_bool(bool b) {
    json j;
    j.kind_ = kind::boolean;
    j.bool_ = b;
    return j;
  }
  static json make_string(std::string s) {
    json j;
    j.kind_ = kind::string;
    j.text_ = std::move(s);
    return j;
  }
  static json make_number_text(std::string s) {
    json j;
    j.kind_ = kind::number;
    j.text_ = std::move(s);
    return j;
  }
  static json make_uint(std::uint64_t v) { return make_number_text(std::to_string(v)); }
  static json make_int(std::int64_t v) { return make_number_text(std::to_string(v)); }
  static json make_array() {
    json j;
    j.kind_ = kind::array;
    return j;
  }
  static json make_object() {
    json j;
    j.kind_ = kind::object;
    return j;
  }

  [[nodiscard]] kind type() const noexcept { return kind_; }
  [[nodiscard]] bool is_null() const noexcept { return kind_ == kind::null; }
  [[nodiscard]] bool is_object() const noexcept { return kind_ == kind::object; }
  [[nodiscard]] bool is_array() const noexcept { return kind_ == kind::array; }
  [[nodiscard]] bool is_string() const noexcept { return kind_ == kind::string; }
  [[nodiscard]] bool is_number() const noexcept { return kind_ == kind::number; }

  [[nodiscard]] bool boolean() const noexcept { return bool_; }
  //! String contents, or the literal text of a number.
  [[nodiscard]] const std::string& text() const noexcept { return text_; }
  [[nodiscard]] const std::vector<json>& items() const noexcept { return items_; }
  [[nodiscard]] const std::vector<std::string>& keys() const noexcept { return keys_; }
  [[nodiscard]] std::size_t size() const noexcept { return items_.size(); }

  //! Member `key` of an object, or nullptr.
  [[nodiscard]] const json* find(std::string_view key) const noexcept {
    for (std::size_t i = 0; i < keys_.size(); ++i)
      if (keys_[i] == key) return &items_[i];
    return nullptr;
  }

  //! The number as an unsigned integer, if it is one written without fraction or exponent.
  [[nodiscard]] bool to_uint(std::uint64_t& out) const noexcept {
    if (kind_ != kind::number || text_.empty() || text_[0] == '-') return false;
    for (char c : text_)
      if (c < '0' || c > '9') return false;
    const auto r = std::from_chars(text_.data(), text_.data() + text_.size(), out);
    return r.ec == std::errc{} && r.ptr == text_.data() + text_.size();
  }
  [[nodiscard]] bool to_int(std::int64_t& out) const noexcept {
    if (kind_ != kind::number || text_.empty()) return false;
    for (std::size_t i = text_[0] == '-' ? 1 : 0; i < text_.size(); ++i)
      if (text_[i] < '0' || text_[i] > '9') return false;
    const auto r = std::from_chars(text_.data(), text_.data() + text_.size(), out);
    return r.ec == std::errc{} && r.ptr == text_.data() + text_.size();
  }

  void push(json v) { items_.push_back(std::move(v)); }
  //! Appends a member (callers building objects keep keys unique).
  void set(std::string key, json v) {
    keys_.push_back(std::move(key));
    items_.push_back(std::move(v));
  }

private:
  template <class> friend class basic_json_parser;
  kind kind_ = kind::null;
  bool bool_ = false;
  std::string text_;
  std::vector<json> items_;
  std::vector<std::string> keys_;
};

struct json_limits {
  std::size_t max_depth = 64;
  std::size_t max_bytes = std::size_t{100'000'000}; // safetensors' MAX_HEADER_SIZE
};

template <class = void> class basic_json_parser {
public:
  basic_json_parser(std::string_view text, std::string_view what, json_limits limits)
      : s_(text), what_(what), limits_(limits) {}

  json parse();

private:
  template <class... Args>
  [[noreturn]] void fail_at(std::size_t at, rlpt::detail::message_format<Args...> f, Args&&... args) const {
    RLPT_FAIL(errors::sync::json, "{} is not valid JSON: at byte {}: {}", what_, at,
              rlpt::detail::format<Args...>(f, args...));
  }

  void skip_ws() noexcept {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r')) ++pos_;
  }

  [[nodiscard]] char peek() const noexcept { return pos_ < s_.size() ? s_[pos_] : '\0'; }

  void expect_literal(std::string_view lit) {
    if (s_.substr(pos_, lit.size()) != lit) fail_at(pos_, "expected '{}'", lit);
    pos_ += lit.size();
  }

  json value(std::size_t depth);

  static std::string describe(char c) {
    const auto u = static_cast<unsigned char>(c);
    if (u >= 0x20 && u < 0x7f) return rlpt::detail::format("'{}'", c);
    return rlpt::detail::format("0x{:02x}", u);
  }

  void enter(std::size_t depth) const {
    if (depth > limits_.max_depth) fail_at(pos_, "nesting deeper than {} levels", limits_.max_depth);
  }

  // Objects up to this many keys are checked for duplicates as each key is read; larger ones
  // (a safetensors header has one key per tensor) once complete, by sorting: O(n log n), not
  // O(n^2) (a 100,000-tensor header took 90 s to parse).
  static constexpr std::size_t linear_key_check = 16;

  json object(std::size_t depth);

  // Reports the first key (in document order) that repeats an earlier one.
  void check_duplicates(const json& obj, const std::vector<std::size_t>& key_at) const;

  json array(std::size_t depth);

  json number();

  unsigned hex4();

  static void put_utf8(std::string& out, std::uint32_t cp);

  // One UTF-8 sequence starting at pos_ (validated: shortest form, no surrogates, <= U+10FFFF).
  void utf8_sequence(std::string& out);

  std::string string();

  std::string_view s_;
  std::string_view what_;
  json_limits limits_;
  std::size_t pos_ = 0;
};
using json_parser = basic_json_parser<>;
RLPT_EXTERN_TEMPLATE(class basic_json_parser<>)

//! Parses `text` strictly; `what` names the document in errors ("manifest", "safetensors header").
RLPT_DEFER [[nodiscard]] inline json parse_json(std::string_view text, std::string_view what = "document",
                                                json_limits limits = {}) {
  return json_parser(text, what, limits).parse();
}

//! Appends a JSON string literal with serde_json's escaping (", \\, \b \f \n \r \t, other
//! controls as \u00xx; everything else, including non-ASCII UTF-8, verbatim).
RLPT_DEFER void write_json_string(std::string& out, std::string_view s);

//! Appends compact JSON (no spaces), members in insertion order.
RLPT_DEFER void write_json(std::string& out, const json& v);

RLPT_DEFER [[nodiscard]] inline std::string to_json_string(const json& v) {
  std::string s;
  write_json(s, v);
  return s;
}

} // namespace sync::detail
RLPT_NAMESPACE_END

#if RLPT_HEADER_IMPL()
RLPT_NAMESPACE_BEGIN
namespace sync::detail {

template <class Tag> RLPT_INLINE json basic_json_parser<Tag>::parse() {
  if (s_.size() > limits_.max_bytes) fail_at(0, "is {} bytes, more than the limit of {}", s_.size(), limits_.max_bytes);
  skip_ws();
  json v = value(0);
  skip_ws();
  if (pos_ != s_.size()) fail_at(pos_, "has trailing characters after the JSON value");
  return v;
}

template <class Tag> RLPT_INLINE json basic_json_parser<Tag>::value(std::size_t depth) {
  if (pos_ >= s_.size()) fail_at(pos_, "unexpected end of input, expected a value");
  const char c = s_[pos_];
  switch (c) {
  case '{':
    return object(depth + 1);
  case '[':
    return array(depth + 1);
  case '"':
    return json::make_string(string());
  case 't':
    expect_literal("true");
    return json::make_bool(true);
  case 'f':
    expect_literal("false");
    return json::make_bool(false);
  case 'n':
    expect_literal("null");
    return json{};
  default:
    if (c == '-' || (c >= '0' && c <= '9')) return number();
    fail_at(pos_, "unexpected character {}, expected a value", describe(c));
  }
}

template <class Tag> RLPT_INLINE json basic_json_parser<Tag>::object(std::size_t depth) {
  enter(depth);
  ++pos_; // '{'
  json obj = json::make_object();
  std::vector<std::size_t> key_at; // byte offset of each key, for the duplicate error
  skip_ws();
  if (peek() == '}') {
    ++pos_;
    return obj;
  }
  for (;;) {
    skip_ws();
    if (peek() != '"') fail_at(pos_, "expected a string key");
    key_at.push_back(pos_);
    std::string key = string();
    if (obj.size() < linear_key_check && obj.find(key) != nullptr) fail_at(key_at.back(), "duplicate key \"{}\"", key);
    skip_ws();
    if (peek() != ':') fail_at(pos_, "expected ':' after key \"{}\"", key);
    ++pos_;
    skip_ws();
    json v = value(depth);
    obj.set(std::move(key), std::move(v));
    skip_ws();
    if (peek() == ',') {
      ++pos_;
      continue;
    }
    if (peek() == '}') {
      ++pos_;
      if (obj.size() > linear_key_check) check_duplicates(obj, key_at);
      return obj;
    }
    fail_at(pos_, "expected ',' or '}}' in object");
  }
}

template <class Tag>
RLPT_INLINE void basic_json_parser<Tag>::check_duplicates(const json& obj,
                                                          const std::vector<std::size_t>& key_at) const {
  const auto& keys = obj.keys_;
  std::vector<std::size_t> order(keys.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(),
            [&](std::size_t a, std::size_t b) { return keys[a] != keys[b] ? keys[a] < keys[b] : a < b; });
  std::size_t dup = keys.size();
  for (std::size_t k = 1; k < order.size(); ++k)
    if (keys[order[k]] == keys[order[k - 1]]) dup = std::min(dup, order[k]);
  if (dup != keys.size()) fail_at(key_at[dup], "duplicate key \"{}\"", keys[dup]);
}

template <class Tag> RLPT_INLINE json basic_json_parser<Tag>::array(std::size_t depth) {
  enter(depth);
  ++pos_; // '['
  json arr = json::make_array();
  skip_ws();
  if (peek() == ']') {
    ++pos_;
    return arr;
  }
  for (;;) {
    skip_ws();
    arr.push(value(depth));
    skip_ws();
    if (peek() == ',') {
      ++pos_;
      continue;
    }
    if (peek() == ']') {
      ++pos_;
      return arr;
    }
    fail_at(pos_, "expected ',' or ']' in array");
  }
}

template <class Tag> RLPT_INLINE json basic_json_parser<Tag>::number() {
  const std::size_t start = pos_;
  if (peek() == '-') ++pos_;
  if (peek() == '0') {
    ++pos_;
    if (peek() >= '0' && peek() <= '9') fail_at(pos_, "number has a leading zero");
  } else if (peek() >= '1' && peek() <= '9') {
    while (peek() >= '0' && peek() <= '9') ++pos_;
  } else {
    fail_at(pos_, "expected a digit");
  }
  if (peek() == '.') {
    ++pos_;
    if (!(peek() >= '0' && peek() <= '9')) fail_at(pos_, "expected a digit after '.'");
    while (peek() >= '0' && peek() <= '9') ++pos_;
  }
  if (peek() == 'e' || peek() == 'E') {
    ++pos_;
    if (peek() == '+' || peek() == '-') ++pos_;
    if (!(peek() >= '0' && peek() <= '9')) fail_at(pos_, "expected a digit in the exponent");
    while (peek() >= '0' && peek() <= '9') ++pos_;
  }
  return json::make_number_text(std::string(s_.substr(start, pos_ - start)));
}

template <class Tag> RLPT_INLINE unsigned basic_json_parser<Tag>::hex4() {
  if (pos_ + 4 > s_.size()) fail_at(pos_, "truncated \\u escape");
  unsigned v = 0;
  for (int i = 0; i < 4; ++i) {
    const char c = s_[pos_++];
    const int d = hex_digit(c);
    if (d < 0) fail_at(pos_ - 1, "invalid hex digit {} in \\u escape", describe(c));
    v = (v << 4) | static_cast<unsigned>(d);
  }
  return v;
}

template <class Tag> RLPT_INLINE void basic_json_parser<Tag>::put_utf8(std::string& out, std::uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xc0u | (cp >> 6)));
    out.push_back(static_cast<char>(0x80u | (cp & 0x3fu)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xe0u | (cp >> 12)));
    out.push_back(static_cast<char>(0x80u | ((cp >> 6) & 0x3fu)));
    out.push_back(static_cast<char>(0x80u | (cp & 0x3fu)));
  } else {
    out.push_back(static_cast<char>(0xf0u | (cp >> 18)));
    out.push_back(static_cast<char>(0x80u | ((cp >> 12) & 0x3fu)));
    out.push_back(static_cast<char>(0x80u | ((cp >> 6) & 0x3fu)));
    out.push_back(static_cast<char>(0x80u | (cp & 0x3fu)));
  }
}

template <class Tag> RLPT_INLINE void basic_json_parser<Tag>::utf8_sequence(std::string& out) {
  const std::size_t at = pos_;
  const auto b0 = static_cast<unsigned char>(s_[pos_]);
  std::size_t len;
  std::uint32_t cp;
  if (b0 >= 0xc2 && b0 <= 0xdf) {
    len = 2;
    cp = b0 & 0x1fu;
  } else if (b0 >= 0xe0 && b0 <= 0xef) {
    len = 3;
    cp = b0 & 0x0fu;
  } else if (b0 >= 0xf0 && b0 <= 0xf4) {
    len = 4;
    cp = b0 & 0x07u;
  } else {
    fail_at(at, "invalid UTF-8 lead byte 0x{:02x}", b0);
  }
  if (pos_ + len > s_.size()) fail_at(at, "truncated UTF-8 sequence");
  for (std::size_t i = 1; i < len; ++i) {
    const auto b = static_cast<unsigned char>(s_[pos_ + i]);
    if ((b & 0xc0u) != 0x80u) fail_at(at + i, "invalid UTF-8 continuation byte 0x{:02x}", b);
    cp = (cp << 6) | (b & 0x3fu);
  }
  if ((len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000)) fail_at(at, "overlong UTF-8 sequence");
  if (cp >= 0xd800 && cp <= 0xdfff) fail_at(at, "UTF-8 encodes a surrogate U+{:04X}", cp);
  if (cp > 0x10ffff) fail_at(at, "UTF-8 code point beyond U+10FFFF");
  out.append(s_.substr(pos_, len));
  pos_ += len;
}

template <class Tag> RLPT_INLINE std::string basic_json_parser<Tag>::string() {
  const std::size_t start = pos_;
  ++pos_; // '"'
  std::string out;
  for (;;) {
    if (pos_ >= s_.size()) fail_at(start, "unterminated string");
    const auto c = static_cast<unsigned char>(s_[pos_]);
    if (c == '"') {
      ++pos_;
      return out;
    }
    if (c < 0x20) fail_at(pos_, "unescaped control character 0x{:02x} in string", c);
    if (c == '\\') {
      ++pos_;
      if (pos_ >= s_.size()) fail_at(pos_, "truncated escape");
      const char e = s_[pos_++];
      switch (e) {
      case '"':
        out.push_back('"');
        break;
      case '\\':
        out.push_back('\\');
        break;
      case '/':
        out.push_back('/');
        break;
      case 'b':
        out.push_back('\b');
        break;
      case 'f':
        out.push_back('\f');
        break;
      case 'n':
        out.push_back('\n');
        break;
      case 'r':
        out.push_back('\r');
        break;
      case 't':
        out.push_back('\t');
        break;
      case 'u': {
        const std::size_t at = pos_ - 2;
        std::uint32_t cp = hex4();
        if (cp >= 0xdc00 && cp <= 0xdfff) fail_at(at, "lone trailing surrogate \\u{:04x}", cp);
        if (cp >= 0xd800 && cp <= 0xdbff) {
          if (s_.substr(pos_, 2) != "\\u") fail_at(at, "lone leading surrogate \\u{:04x}", cp);
          pos_ += 2;
          const std::uint32_t lo = hex4();
          if (lo < 0xdc00 || lo > 0xdfff) fail_at(at, "leading surrogate \\u{:04x} not followed by a trailing one", cp);
          cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
        }
        put_utf8(out, cp);
        break;
      }
      default:
        fail_at(pos_ - 1, "invalid escape \\{}", describe(e));
      }
      continue;
    }
    if (c < 0x80) {
      out.push_back(static_cast<char>(c));
      ++pos_;
    } else {
      utf8_sequence(out);
    }
  }
}

RLPT_DEFER RLPT_INLINE void write_json_string(std::string& out, std::string_view s) {
  static constexpr char hex[] = "0123456789abcdef";
  out.push_back('"');
  for (char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    switch (c) {
    case '"':
      out += "\\\"";
      break;
    case '\\':
      out += "\\\\";
      break;
    case '\b':
      out += "\\b";
      break;
    case '\f':
      out += "\\f";
      break;
    case '\n':
      out += "\\n";
      break;
    case '\r':
      out += "\\r";
      break;
    case '\t':
      out += "\\t";
      break;
    default:
      if (c < 0x20) {
        out += "\\u00";
        out.push_back(hex[c >> 4]);
        out.push_back(hex[c & 0xfu]);
      } else {
        out.push_back(ch);
      }
    }
  }
  out.push_back('"');
}

RLPT_DEFER RLPT_INLINE void write_json(std::string& out, const json& v) {
  switch (v.type()) {
  case json::kind::null:
    out += "null";
    break;
  case json::kind::boolean:
    out += v.boolean() ? "true" : "false";
    break;
  case json::kind::number:
    out += v.text();
    break;
  case json::kind::string:
    write_json_string(out, v.text());
    break;
  case json::kind::array:
    out.push_back('[');
    for (std::size_t i = 0; i < v.size(); ++i) {
      if (i) out.push_back(',');
      write_json(out, v.items()[i]);
    }
    out.push_back(']');
    break;
  case json::kind::object:
    out.push_back('{');
    for (std::size_t i = 0; i < v.size(); ++i) {
      if (i) out.push_back(',');
      write_json_string(out, v.keys()[i]);
      out.push_back(':');
      write_json(out, v.items()[i]);
    }
    out.push_back('}');
    break;
  }
}

} // namespace sync::detail
RLPT_NAMESPACE_END
#endif // RLPT_HEADER_IMPL()
