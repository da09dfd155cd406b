// SPDX-License-Identifier: Apache-2.0
// The CUDA kernels of the package (kernels.cu, compiled by nvcc without torch's headers) as
// plain functions over device pointers and a stream; ops_cuda.cpp calls them with torch tensors.
#pragma once

#include <rlpt/core/layout.hpp>
#include <rlpt/logprob/options.hpp>
#include <rlpt/objective/evaluate.hpp>

#include <cstddef>

namespace rlpt_py::cuda {

enum class logits_dtype : int { f32, f64, bf16, f16 };

struct logits_desc {
  logits_dtype dtype = logits_dtype::f32;
  const void* data = nullptr;
  rlpt::index_t rows = 0, cols = 0, stride = 0;
};

struct sequence_desc {
  bool sequence = false;
  rlpt::device_token_layout layout{};
  const rlpt::mask_t* valid = nullptr;
};

struct logprob_out {
  float* logp = nullptr;
  float* entropy = nullptr;
  float* lse = nullptr;
  rlpt::mask_t* scored = nullptr;
  float* threshold = nullptr;
  rlpt::index_t* tie_last = nullptr;
};

void logprob_forward(const logits_desc& x, const rlpt::index_t* tokens, const sequence_desc& s, const logprob_out& out,
                     const rlpt::logprob_options& opt, void* stream);

struct logprob_back_in {
  const float* dlogp = nullptr;
  const float* dentropy = nullptr;
  const float* logp = nullptr;
  const float* entropy = nullptr;
  const float* lse = nullptr;
  const float* threshold = nullptr;
  const rlpt::index_t* tie_last = nullptr;
};

void logprob_backward(const logits_desc& x, const rlpt::index_t* tokens, const sequence_desc& s,
                      const logprob_back_in& in, void* dlogits, const rlpt::logprob_options& opt, void* stream);

//! rlpt::evaluate on the device: workspace bytes (size query) and the call.
template <class T>
std::size_t objective_workspace(const rlpt::objective& obj,
                                const rlpt::basic_objective_inputs<T, rlpt::memory_space::device>& in,
                                const rlpt::basic_objective_grads<T, rlpt::memory_space::device>& grads);
template <class T>
void objective(const rlpt::objective& obj, const rlpt::basic_objective_inputs<T, rlpt::memory_space::device>& in,
               const rlpt::basic_objective_grads<T, rlpt::memory_space::device>& grads, rlpt::objective_result* result,
               void* workspace, std::size_t bytes, void* stream);

} // namespace rlpt_py::cuda
