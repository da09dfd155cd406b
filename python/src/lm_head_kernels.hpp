// SPDX-License-Identifier: Apache-2.0
// The host fused lm-head's kernels behind a table of plain function pointers, so that one build
// of them can live in a shared library of its own: lm_head_kernels.cpp is compiled into rlpt._C
// for the baseline instruction set and, on x86-64, into rlpt/_lm_head_avx2.so with -mavx2 -mfma
// (Eigen chooses its SIMD width at compile time, so the tiles cannot be cloned per function the
// way the objective's stages are). The library's symbols are hidden, so none of its inline or
// template code (Eigen's, the standard library's, fmt's) can stand in for _C's baseline copies.
#pragma once

#include <cstdint>
#include <string>

namespace rlpt_py {

enum class lm_head_dtype : int { f32, f64, bf16, f16 };

//! hidden [n, d] and weight [v, d] rows (`*_stride` elements apart, last dimension contiguous)
//! of one dtype, targets int64 [n].
struct lm_head_args {
  lm_head_dtype dtype = lm_head_dtype::f32;
  const void* hidden = nullptr;
  std::int64_t n = 0, d = 0, hidden_stride = 0;
  const void* weight = nullptr;
  std::int64_t v = 0, weight_stride = 0;
  const std::int64_t* targets = nullptr;
  float temperature = 1.0f;
  std::int64_t ignore_index = -100;
  int threads = 1; //!< torch's intra-op thread count for this call
};

//! An rlpt::error caught inside the kernels, carried out as text (id and message).
struct lm_head_failure {
  std::string id, message;
};

struct lm_head_kernels {
  const char* isa;
  //! logp, entropy, lse: n floats each. False (with `fail` set) on an rlpt::error.
  bool (*forward)(const lm_head_args& a, float* logp, float* entropy, float* lse, lm_head_failure& fail);
  //! dlogp / dentropy may be null; grad_hidden [n, d] / grad_weight [v, d] (contiguous) may be null.
  bool (*backward)(const lm_head_args& a, const float* dlogp, const float* dentropy, const float* entropy,
                   const float* lse, float* grad_hidden, float* grad_weight, lm_head_failure& fail);
};

//! The baseline build (linked into rlpt._C).
const lm_head_kernels& lm_head_kernels_baseline();

} // namespace rlpt_py

//! The AVX2 + FMA build's entry point, exported by rlpt/_lm_head_avx2.so.
extern "C" const rlpt_py::lm_head_kernels* rlpt_py_lm_head_kernels_avx2();
