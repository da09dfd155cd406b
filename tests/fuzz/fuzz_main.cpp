// SPDX-License-Identifier: Apache-2.0
// The libFuzzer entry point of one target: built once per target (tests/fuzz/CMakeLists.txt
// defines RLPT_FUZZ_TARGET and RLPT_FUZZ_HEADER), with -fsanitize=fuzzer,address,undefined.
#include RLPT_FUZZ_HEADER

#include <cstddef>
#include <cstdint>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static_cast<void>(rlpt::fuzz::RLPT_FUZZ_TARGET(rlpt::fuzz::input(data, size)));
  return 0;
}
