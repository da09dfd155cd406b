// SPDX-License-Identifier: Apache-2.0
// Compiled (syntax only) by CTest with and without -DRLPT_NO_ISA_DISPATCH: the one opt-out
// turns off every host loop's run-time ISA clones, and without it every clone is built on x86-64.
#include <rlpt/core/copy.hpp>
#include <rlpt/logprob/detail/row_kernels.hpp>
#include <rlpt/objective/detail/host_row.hpp>

#if defined(RLPT_NO_ISA_DISPATCH)
static_assert(RLPT_ISA_DISPATCH() == 0);
static_assert(RLPT_COPY_CLONES() == 0);
static_assert(RLPT_LOGPROB_X86_DISPATCH() == 0 && RLPT_LOGPROB_AVX512_CLONE() == 0);
static_assert(RLPT_OBJECTIVE_AVX2_CLONE() == 0 && RLPT_OBJECTIVE_AVX512_CLONE() == 0);
#elif defined(__x86_64__) && !defined(__AVX2__)
static_assert(RLPT_ISA_DISPATCH() == 1);
static_assert(RLPT_COPY_CLONES() == 1);
static_assert(RLPT_LOGPROB_X86_DISPATCH() == 1 && RLPT_LOGPROB_AVX512_CLONE() == 1);
static_assert(RLPT_OBJECTIVE_AVX2_CLONE() == 1);
#endif

int main() { return 0; }
