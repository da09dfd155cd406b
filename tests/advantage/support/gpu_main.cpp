// SPDX-License-Identifier: Apache-2.0
// rlpt_add_gpu_test (tests/CMakeLists.txt) names "support/gpu_main.cpp" relative to the calling
// folder; until it uses ${CMAKE_CURRENT_FUNCTION_LIST_DIR}, this forwards to the shared main.
#include "../../support/gpu_main.cpp"
