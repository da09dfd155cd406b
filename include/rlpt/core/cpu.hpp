// SPDX-License-Identifier: Apache-2.0
//! @file
//! What the CPU running this process can execute, for the host loops that are compiled a second
//! time for wider vectors (`__attribute__((target(...)))`) and pick their clone at run time. Each
//! answer is computed once per process, so every call of a process takes the same path.
#pragma once

#include <rlpt/config.hpp>

//! Whether this build can ask the CPU for its features: GCC or clang (nvcc's host pass included)
//! on x86-64.
#if (defined(__GNUC__) || defined(__clang__)) && defined(__x86_64__)
#define RLPT_X86_FEATURES() 1
#else
#define RLPT_X86_FEATURES() 0
#endif

//! Whether rlpt's host loops are compiled a second time for wider vectors and pick their clone
//! at run time (the objective's token pass, the logprob row kernels, the byte copy). Define
//! `RLPT_NO_ISA_DISPATCH` to compile each loop once, for the build's own target flags (for
//! example when every machine has what `-march` says, or a tool cannot take target attributes);
//! results are bit-identical either way.
#if RLPT_X86_FEATURES() && !defined(RLPT_NO_ISA_DISPATCH)
#define RLPT_ISA_DISPATCH() 1
#else
#define RLPT_ISA_DISPATCH() 0
#endif

RLPT_NAMESPACE_BEGIN
namespace detail {

#if RLPT_X86_FEATURES()
[[nodiscard]] inline bool cpu_has_avx2() noexcept {
  static const bool has = __builtin_cpu_supports("avx2");
  return has;
}

[[nodiscard]] inline bool cpu_has_avx2_fma() noexcept {
  static const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return has;
}

//! AVX-512 F, VL, BW and DQ: what GCC's `-mavx512f -mavx512vl -mavx512bw -mavx512dq` clones use.
[[nodiscard]] inline bool cpu_has_avx512() noexcept {
  static const bool has = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
                          __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq");
  return has;
}
#endif

} // namespace detail
RLPT_NAMESPACE_END
