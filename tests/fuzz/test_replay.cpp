// SPDX-License-Identifier: Apache-2.0
// The fuzz corpus in the normal test suite (any compiler, no libFuzzer): every committed input
// under tests/fuzz/corpus/<target>/ (seeds and past findings) runs through the same entry point
// as the fuzzer, and every generated seed marked valid must still be accepted, so a writer and
// its parser cannot drift apart. Under the asan preset this is also a sanitizer run.
#include "seeds.hpp"
#include "targets.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;
using rlpt::fuzz::outcome;

const rlpt::fuzz::target& target_named(std::string_view name) {
  for (const auto& t : rlpt::fuzz::targets)
    if (t.name == name) return t;
  FAIL("no fuzz target ", std::string(name));
  return rlpt::fuzz::targets[0];
}

std::vector<std::uint8_t> read(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void replay(std::string_view name) {
  const auto& t = target_named(name);
  const fs::path dir = fs::path(RLPT_FUZZ_CORPUS_DIR) / std::string(name);
  REQUIRE_MESSAGE(fs::is_directory(dir), dir.string());
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.is_regular_file()) files.push_back(e.path());
  std::sort(files.begin(), files.end());
  CHECK(!files.empty());
  int accepted = 0;
  for (const auto& f : files) {
    INFO("corpus file ", f.string());
    const auto bytes = read(f);
    outcome o = outcome::rejected;
    CHECK_NOTHROW(o = t.run(bytes));
    accepted += o == outcome::accepted;
  }
  MESSAGE(name, ": ", files.size(), " corpus files, ", accepted, " accepted");
}

void seeds(std::string_view name) {
  const auto& t = target_named(name);
  for (const auto& set : rlpt::fuzz::seed_sets) {
    if (set.target != name) continue;
    for (const auto& s : set.make()) {
      INFO("seed ", s.name);
      outcome o = outcome::rejected;
      CHECK_NOTHROW(o = t.run(s.bytes));
      CHECK((o == outcome::accepted) == s.valid);
    }
  }
}

} // namespace

TEST_CASE("replay: safetensors") { replay("safetensors"); }
TEST_CASE("replay: manifest") { replay("manifest"); }
TEST_CASE("replay: delta") { replay("delta"); }
TEST_CASE("replay: frame") { replay("frame"); }
TEST_CASE("replay: checkpoint") { replay("checkpoint"); }
TEST_CASE("replay: staleness") { replay("staleness"); }
TEST_CASE("replay: dlpack") { replay("dlpack"); }
TEST_CASE("replay: preflight") { replay("preflight"); }

TEST_CASE("seeds: safetensors") {
  const auto before = rlpt::fuzz::detail::replayed_messages;
  seeds("safetensors");
  CHECK(rlpt::fuzz::detail::replayed_messages > before); // the rlpt-dense seed went through the transport
}
TEST_CASE("seeds: manifest") { seeds("manifest"); }
TEST_CASE("seeds: delta") { seeds("delta"); }
TEST_CASE("seeds: frame") { seeds("frame"); }
TEST_CASE("seeds: checkpoint") { seeds("checkpoint"); }
TEST_CASE("seeds: staleness") { seeds("staleness"); }
TEST_CASE("seeds: dlpack") { seeds("dlpack"); }
TEST_CASE("seeds: preflight") { seeds("preflight"); }
