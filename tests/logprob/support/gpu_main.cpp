// SPDX-License-Identifier: Apache-2.0
// rlpt_add_gpu_test (tests/CMakeLists.txt) names support/gpu_main.cpp relative to the calling
// family's directory; this forwards to the shared tests/support/gpu_main.cpp until the helper
// uses an absolute path.
#include "support/gpu_main.cpp" // NOLINT(bugprone-suspicious-include)
