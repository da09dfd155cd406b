// SPDX-License-Identifier: Apache-2.0
// Built instead of ops_lm_head.cpp where Eigen is not found: no fused lm-head ops.
#include <string>

namespace rlpt_py {
bool lm_head_built() { return false; }
std::string lm_head_isa(const std::string&) { return {}; } // never bound: lm_head_built() is false
} // namespace rlpt_py
