// SPDX-License-Identifier: Apache-2.0
// rlpt::compiled: the one translation unit that defines, out of line, the functions every header
// declares under RLPT_COMPILED_LIB (include/rlpt/config.hpp, "separate compilation"). The target
// defines RLPT_COMPILED_LIB publicly and RLPT_COMPILED_LIB_SOURCE here, so this TU sees each
// header's definitions section and compiles it once, with no `inline`.
#include <rlpt/rlpt.hpp>

#if !defined(RLPT_COMPILED_LIB) || !RLPT_HEADER_IMPL()
#error "src/compiled.cpp is built by the rlpt_compiled target, with RLPT_COMPILED_LIB and RLPT_COMPILED_LIB_SOURCE"
#endif
