// SPDX-License-Identifier: Apache-2.0
// The strict JSON reader/writer behind manifests and safetensors headers.
#include "sync_support.hpp"

#include <rlpt/sync/detail/json.hpp>

using rlpt::sync::detail::json;
using rlpt::sync::detail::parse_json;
using rlpt::sync::detail::to_json_string;

TEST_CASE("json: parses values and keeps member order and number text") {
  const json j = parse_json(R"( {"b":[1,-2,3.5e-3,true,false,null],"a":{"x":"y"},"big":18446744073709551615} )");
  REQUIRE(j.is_object());
  CHECK(j.keys() == std::vector<std::string>{"b", "a", "big"});
  const json& arr = *j.find("b");
  REQUIRE(arr.size() == 6);
  std::int64_t neg = 0;
  CHECK(arr.items()[1].to_int(neg));
  CHECK(neg == -2);
  CHECK(arr.items()[2].text() == "3.5e-3");
  std::uint64_t u = 0;
  CHECK_FALSE(arr.items()[2].to_uint(u));
  CHECK(arr.items()[3].boolean());
  CHECK(arr.items()[5].is_null());
  CHECK(j.find("big")->to_uint(u));
  CHECK(u == 18446744073709551615ull);
  CHECK(to_json_string(j) == R"({"b":[1,-2,3.5e-3,true,false,null],"a":{"x":"y"},"big":18446744073709551615})");
}

TEST_CASE("json: strings decode escapes and surrogate pairs, and re-encode like serde_json") {
  const json j = parse_json(R"("a\"b\\c\/d\b\f\n\r\t\u00e9\ud83d\ude00\u0001")");
  CHECK(j.text() == "a\"b\\c/d\b\f\n\r\t\xc3\xa9\xf0\x9f\x98\x80\x01");
  // serde_json: no escape for '/', non-ASCII verbatim, lower-case \u00xx for other controls
  CHECK(to_json_string(j) == "\"a\\\"b\\\\c/d\\b\\f\\n\\r\\t\xc3\xa9\xf0\x9f\x98\x80\\u0001\"");
  CHECK(parse_json("\"\xe2\x9c\x93\"").text() == "\xe2\x9c\x93");
}

TEST_CASE("json: strict rejections name the offset and the problem") {
  const std::pair<const char*, const char*> bad[] = {
      {"", "unexpected end of input"},
      {"{\"a\":1,}", "expected a string key"},
      {"[1,]", "unexpected character ']'"},
      {"01", "leading zero"},
      {"1.", "digit after '.'"},
      {"-", "expected a digit"},
      {"1e", "digit in the exponent"},
      {"NaN", "unexpected character 'N'"},
      {"{\"a\":1} x", "trailing characters"},
      {"\"abc", "unterminated string"},
      {"\"a\x01\"", "unescaped control character 0x01"},
      {"\"\\x\"", "invalid escape \\'x'"},
      {"\"\\ud800\"", "lone leading surrogate"},
      {"\"\\udc00\"", "lone trailing surrogate"},
      {"\"\\ud800\\u0041\"", "not followed by a trailing one"},
      {"\"\\u12g4\"", "invalid hex digit"},
      {"\"\xff\"", "invalid UTF-8 lead byte 0xff"},
      {"\"\xc3", "truncated UTF-8 sequence"},
      {"\"\xc3\"", "invalid UTF-8 continuation byte 0x22"},
      {"\"\xe0\x80\x80\"", "overlong UTF-8"},
      {"\"\xed\xa0\x80\"", "surrogate U+D800"},
      {"\"\xf4\x90\x80\x80\"", "beyond U+10FFFF"},
      {"{\"k\":1,\"k\":2}", "duplicate key \"k\""},
      {"tru", "expected 'true'"},
      {"{\"a\" 1}", "expected ':'"},
      {"[1 2]", "expected ',' or ']'"},
      {"{\"a\":1 \"b\":2}", "expected ',' or '}'"},
  };
  for (const auto& [text, why] : bad) {
    CAPTURE(text);
    RLPT_CHECK_ERROR(parse_json(text, "doc"), "rlpt.sync.json", "doc is not valid JSON: at byte", why);
  }
}

TEST_CASE("json: depth and size limits") {
  const std::string deep = std::string(65, '[') + std::string(65, ']');
  RLPT_CHECK_ERROR(parse_json(deep), "rlpt.sync.json", "nesting deeper than 64 levels");
  const std::string ok = std::string(64, '[') + std::string(64, ']');
  CHECK(parse_json(ok).is_array());
  RLPT_CHECK_ERROR(parse_json("[1,2,3]", "doc", {64, 4}), "rlpt.sync.json", "is 7 bytes, more than the limit of 4");
}

TEST_CASE("json: fuzzed documents parse or fail with rlpt.sync.json, and what parses re-parses identically") {
  const std::string seed =
      R"({"format":"x","n":[0,1,-2,3.25e+10],"s":"\u00e9\n","o":{"a":[true,false,null],"b":{}},"e":[]})";
  rlpt::test::rng r(7);
  int parsed = 0;
  const auto rejected =
      rlpt::test::sync::fuzz(rlpt::test::sync::to_bytes(seed), 20000, 11, [&](const std::vector<std::byte>& in) {
        const std::string_view text(reinterpret_cast<const char*>(in.data()), in.size());
        const json j = parse_json(text);
        ++parsed;
        const std::string out = to_json_string(j);
        CHECK(to_json_string(parse_json(out)) == out);
      });
  CHECK(rejected > 10000); // most mutants are invalid
  CHECK(parsed > 100);     // and some stay valid, exercising the writer
}
