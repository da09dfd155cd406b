// SPDX-License-Identifier: Apache-2.0
// The one translation unit that holds doctest's implementation and main().
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>
