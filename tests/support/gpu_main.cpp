// SPDX-License-Identifier: Apache-2.0
// main() for `gpu`-labelled tests: without a CUDA device the run exits with 77, which CTest
// reports as skipped (SKIP_RETURN_CODE). Listing test cases works everywhere, so
// doctest_discover_tests can register them on a build machine without a GPU.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <rlpt/cuda/device.cuh>

#include <cstdio>
#include <cstring>

int main(int argc, char** argv) {
  bool listing = false;
  for (int i = 1; i < argc; ++i)
    if (std::strstr(argv[i], "list-test") != nullptr || std::strcmp(argv[i], "-ltc") == 0) listing = true;
  if (!listing && rlpt::cuda_device_count() == 0) {
    std::printf("no CUDA device: skipping\n");
    return 77;
  }
  doctest::Context context(argc, argv);
  return context.run();
}
