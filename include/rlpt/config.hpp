// SPDX-License-Identifier: Apache-2.0
//! @file
//! Compiler and feature detection, and the execution-space macros every header uses.
//!
//! Feature tests are function-like (`RLPT_HAS_CUDA()`), so using one without including this
//! header is a hard error under -Wundef instead of a silent 0.
#pragma once

#include <rlpt/version.hpp>

#include <cstdint>

// --- compilation mode ----------------------------------------------------------------------

#if defined(__CUDACC__)
#define RLPT_CUDA_COMPILATION() 1
#else
#define RLPT_CUDA_COMPILATION() 0
#endif

// True only in the device pass of a CUDA compilation.
#if defined(__CUDA_ARCH__)
#define RLPT_DEVICE_PASS() 1
#else
#define RLPT_DEVICE_PASS() 0
#endif

// --- execution space ----------------------------------------------------------------------
// RLPT_HD marks the per-element math that host and device share. Without nvcc it is plain
// `inline`, so .hpp headers never need a CUDA compiler.

#if RLPT_CUDA_COMPILATION()
#define RLPT_HD __host__ __device__ inline
#define RLPT_HD_FORCEINLINE __host__ __device__ __forceinline__
#define RLPT_DEVICE __device__ inline
#else
#define RLPT_HD inline
#if defined(__GNUC__) || defined(__clang__)
#define RLPT_HD_FORCEINLINE inline __attribute__((always_inline))
#else
#define RLPT_HD_FORCEINLINE inline
#endif
#endif

//! A lambda's call operator force-inlined: `[&](int j) RLPT_INLINE_LAMBDA { ... }`. The loops of
//! the host's instruction-set clones (the objective's chunk stages) must inline every lambda they
//! call: one that the compiler keeps out of line is compiled for the baseline target, not the
//! clone's (no FMA, so each std::fma becomes a libm call): the Python package's k3 KL stage ran 9x
//! slower so (docs/design/objective-host-pass.md).
#if defined(__GNUC__) || defined(__clang__)
#define RLPT_INLINE_LAMBDA __attribute__((always_inline))
#else
#define RLPT_INLINE_LAMBDA
#endif

//! Brackets host code whose a·b + c must stay two roundings in every build, so that the ISA
//! clones of a loop (the AVX2 and AVX-512 ones have FMA) give the bits of the baseline build;
//! explicit std::fma calls still fuse. Clang contracts within an expression by default (and
//! everywhere under -ffp-contract=fast); GCC's clones carry optimize("fp-contract=off") instead.
#if defined(__clang__) && !defined(__CUDACC__)
#define RLPT_NO_CONTRACT_BEGIN _Pragma("float_control(push)") _Pragma("clang fp contract(off)")
#define RLPT_NO_CONTRACT_END _Pragma("float_control(pop)")
#else
#define RLPT_NO_CONTRACT_BEGIN
#define RLPT_NO_CONTRACT_END
#endif
//! The same for GCC, as a function attribute of the host's hot loops and their instruction-set
//! clones: `__attribute__((target("..."), RLPT_HOST_LOOP_ATTR))`. It also gives them -O3's
//! vectoriser cost model: under -O2 (CMake's RelWithDebInfo), GCC 12's "very cheap" model left the
//! objective's chunk loops scalar, 10-14x slower than at -O3; with this, -O2 builds vectorise them.
#if defined(__GNUC__) && !defined(__clang__)
#define RLPT_HOST_LOOP_ATTR optimize("fp-contract=off", "vect-cost-model=dynamic")
//! RLPT_HOST_LOOP_ATTR alone, before a function: `template <...> RLPT_HOST_LOOP void f(...)`.
#define RLPT_HOST_LOOP __attribute__((RLPT_HOST_LOOP_ATTR))
#else
#define RLPT_HOST_LOOP_ATTR
#define RLPT_HOST_LOOP
#endif

// Kernels are hidden so two shared libraries built for different GPU architectures never
// resolve each other's kernels (see NVIDIA/cub#545).
#if RLPT_CUDA_COMPILATION()
#define RLPT_KERNEL __global__ __attribute__((visibility("hidden")))
#endif

// --- optional dependencies ----------------------------------------------------------------

#if defined(RLPT_DISABLE_DLPACK)
#define RLPT_HAS_DLPACK() 0
#elif __has_include(<dlpack/dlpack.h>)
#define RLPT_HAS_DLPACK() 1
#else
#define RLPT_HAS_DLPACK() 0
#endif

#if __has_include(<cuda_runtime_api.h>) && !defined(RLPT_DISABLE_CUDA)
#define RLPT_HAS_CUDA() 1
#else
#define RLPT_HAS_CUDA() 0
#endif

#if __has_include(<nccl.h>) && RLPT_HAS_CUDA() && !defined(RLPT_DISABLE_NCCL)
#define RLPT_HAS_NCCL() 1
#else
#define RLPT_HAS_NCCL() 0
#endif

// --- exceptions ---------------------------------------------------------------------------

#if !defined(RLPT_USE_EXCEPTIONS)
#if defined(__cpp_exceptions) || defined(__EXCEPTIONS)
#define RLPT_USE_EXCEPTIONS 1
#else
#define RLPT_USE_EXCEPTIONS 0
#endif
#endif

// --- ABI namespace -------------------------------------------------------------------------
// Every declaration lives in an inline namespace named after the version whose ABI it has
// (fmt's `inline namespace v11`, CUB's namespace macros): two shared libraries built against
// different rlpt versions then define different symbols instead of breaking the
// one-definition rule. Users write `rlpt::` as always.

#define RLPT_NAMESPACE_BEGIN                                                                                           \
  namespace rlpt {                                                                                                     \
  inline namespace RLPT_ABI_NAMESPACE {
#define RLPT_NAMESPACE_END                                                                                             \
  }                                                                                                                    \
  }

// --- separate compilation (opt-in) ------------------------------------------------------------
// rlpt is header-only by default. The large non-template functions of the rollout, staleness
// and sync blocks (the buffers, checkpoints, transports, protocol, transforms) are declared in
// their headers and defined in each header's last section, `#if RLPT_HEADER_IMPL()`.
// Define RLPT_COMPILED_LIB in every TU of a program (CMake: link rlpt::compiled, which does it)
// and those definitions are compiled once, into that library (src/compiled.cpp), instead of in
// every TU that includes rlpt: what their bodies instantiate (containers, sorting, messages) is
// what most of a TU's compile time goes to (docs/performance.md, "Compile time"). spdlog's
// SPDLOG_COMPILED_LIB and Asio's separate compilation are the same model.
//
// RLPT_INLINE marks those out-of-class definitions: `inline` header-only, nothing in the library.
// A virtual function among them carries it on its declaration in the class too: declared there
// without `inline`, it would be its class's key function, and every TU that then reads its inline
// definition would emit the vtable and each virtual function with it (what they call, compiled).
#if defined(RLPT_COMPILED_LIB) && !defined(RLPT_COMPILED_LIB_SOURCE)
#define RLPT_HEADER_IMPL() 0
#else
#define RLPT_HEADER_IMPL() 1
#endif
#if defined(RLPT_COMPILED_LIB)
#define RLPT_INLINE
#else
#define RLPT_INLINE inline
#endif

// Header-only, those definitions are templates, so that a TU instantiates only the ones it calls.
// What a non-template inline body names (vector growth, hash tables, sorting, message arguments)
// GCC instantiates at the end of every TU that reads the body, called or not; a template's body
// waits for its own instantiation. So each class among them is a class template of one unused
// parameter, `template <class = void> class basic_X` with `using X = basic_X<>;` (its members
// defined out of line as `template <class Tag> ... basic_X<Tag>::f`), and each free function
// among them carries RLPT_DEFER on its declaration and definition: a parameter pack that calls
// deduce as empty (take its address as `&f<>`, header-only). With RLPT_COMPILED_LIB the free
// functions are plain functions again and each class's one specialisation is declared
// `extern template` (RLPT_EXTERN_TEMPLATE) and instantiated in src/compiled.cpp.
#if defined(RLPT_COMPILED_LIB)
#define RLPT_DEFER
#else
#define RLPT_DEFER template <class...>
#endif
#if RLPT_HEADER_IMPL()
#define RLPT_EXTERN_TEMPLATE(...)
#else
#define RLPT_EXTERN_TEMPLATE(...) extern template __VA_ARGS__;
#endif

// --- misc ---------------------------------------------------------------------------------

#if defined(__GNUC__) || defined(__clang__)
#define RLPT_LIKELY(x) __builtin_expect(!!(x), 1)
#define RLPT_UNLIKELY(x) __builtin_expect(!!(x), 0)
#define RLPT_RESTRICT __restrict__
#else
#define RLPT_LIKELY(x) (x)
#define RLPT_UNLIKELY(x) (x)
#define RLPT_RESTRICT
#endif

RLPT_NAMESPACE_BEGIN

//! Signed index type for sizes and offsets throughout rlpt: the same type as torch's int64
//! tensors, so offsets and ids pass without copies.
using index_t = std::int64_t;

//! Destructive-interference size for padding concurrent state (64 on x86, 128 on some ARM).
inline constexpr unsigned cacheline_bytes = 64;

RLPT_NAMESPACE_END
