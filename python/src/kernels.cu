// SPDX-License-Identifier: Apache-2.0
// rlpt's device entry points for the package: logprob/entropy forward and backward (four logit
// dtypes), and the fused objective pass. Compiled by nvcc without any torch header.
#include "cuda_api.hpp"

#include <rlpt/cuda/logprob/from_logits.cuh>
#include <rlpt/cuda/objective/evaluate.cuh>

namespace rlpt_py::cuda {

namespace {

template <class F> void by_dtype(logits_dtype t, F&& f) {
  switch (t) {
  case logits_dtype::f64:
    f(double{});
    break;
  case logits_dtype::bf16:
    f(rlpt::bf16{});
    break;
  case logits_dtype::f16:
    f(rlpt::f16{});
    break;
  default:
    f(float{});
    break;
  }
}

template <class T> rlpt::device_view<T> dv(T* p, rlpt::index_t n) {
  return p ? rlpt::device_view<T>(p, n) : rlpt::device_view<T>{};
}

} // namespace

void logprob_forward(const logits_desc& x, const rlpt::index_t* tokens, const sequence_desc& s, const logprob_out& out,
                     const rlpt::logprob_options& opt, void* stream) {
  const rlpt::index_t n = x.rows;
  const rlpt::index_t tr = opt.truncated() ? n : 0;
  const rlpt::device_logprob_outputs o{.logp = dv(out.logp, n),
                                       .entropy = dv(out.entropy, n),
                                       .lse = dv(out.lse, n),
                                       .scored = dv(out.scored, n),
                                       .counters = {},
                                       .threshold = dv(out.threshold, tr),
                                       .tie_last = dv(out.tie_last, tr)};
  const auto st = static_cast<cudaStream_t>(stream);
  by_dtype(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    const rlpt::device_view2d<const T> l(static_cast<const T*>(x.data), x.rows, x.cols, x.stride);
    const rlpt::device_view<const rlpt::index_t> y(tokens, n);
    if (s.sequence)
      rlpt::sequence_logprob_entropy(l, y, s.layout, dv(s.valid, s.valid ? n : 0), o, opt, st);
    else
      rlpt::logprob_entropy(l, y, o, opt, st);
  });
}

void logprob_backward(const logits_desc& x, const rlpt::index_t* tokens, const sequence_desc& s,
                      const logprob_back_in& in, void* dlogits, const rlpt::logprob_options& opt, void* stream) {
  const rlpt::index_t n = x.rows;
  const rlpt::index_t tr = opt.truncated() ? n : 0;
  const rlpt::device_logprob_backward_inputs b{.dlogp = dv(in.dlogp, n),
                                               .dentropy = dv(in.dentropy, n),
                                               .logp = dv(in.logp, n),
                                               .entropy = dv(in.entropy, n),
                                               .saved = {dv(in.lse, n), dv(in.threshold, tr), dv(in.tie_last, tr)}};
  const auto st = static_cast<cudaStream_t>(stream);
  by_dtype(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    const rlpt::device_view2d<const T> l(static_cast<const T*>(x.data), x.rows, x.cols, x.stride);
    const rlpt::device_view2d<T> d(static_cast<T*>(dlogits), x.rows, x.cols);
    const rlpt::device_view<const rlpt::index_t> y(tokens, n);
    if (s.sequence)
      rlpt::sequence_logprob_entropy_backward(l, y, s.layout, dv(s.valid, s.valid ? n : 0), b, d, opt, st);
    else
      rlpt::logprob_entropy_backward(l, y, b, d, opt, st);
  });
}

template <class T>
std::size_t objective_workspace(const rlpt::objective& obj,
                                const rlpt::basic_objective_inputs<T, rlpt::memory_space::device>& in,
                                const rlpt::basic_objective_grads<T, rlpt::memory_space::device>& grads) {
  rlpt::workspace ws{};
  rlpt::evaluate(obj, in, grads, nullptr, ws, nullptr);
  return ws.bytes;
}

template <class T>
void objective(const rlpt::objective& obj, const rlpt::basic_objective_inputs<T, rlpt::memory_space::device>& in,
               const rlpt::basic_objective_grads<T, rlpt::memory_space::device>& grads, rlpt::objective_result* result,
               void* workspace, std::size_t bytes, void* stream) {
  rlpt::workspace ws{workspace, bytes};
  rlpt::evaluate(obj, in, grads, result, ws, static_cast<cudaStream_t>(stream));
}

template std::size_t objective_workspace<float>(const rlpt::objective&,
                                                const rlpt::basic_objective_inputs<float, rlpt::memory_space::device>&,
                                                const rlpt::basic_objective_grads<float, rlpt::memory_space::device>&);
template std::size_t
objective_workspace<double>(const rlpt::objective&,
                            const rlpt::basic_objective_inputs<double, rlpt::memory_space::device>&,
                            const rlpt::basic_objective_grads<double, rlpt::memory_space::device>&);
template void objective<float>(const rlpt::objective&,
                               const rlpt::basic_objective_inputs<float, rlpt::memory_space::device>&,
                               const rlpt::basic_objective_grads<float, rlpt::memory_space::device>&,
                               rlpt::objective_result*, void*, std::size_t, void*);
template void objective<double>(const rlpt::objective&,
                                const rlpt::basic_objective_inputs<double, rlpt::memory_space::device>&,
                                const rlpt::basic_objective_grads<double, rlpt::memory_space::device>&,
                                rlpt::objective_result*, void*, std::size_t, void*);

} // namespace rlpt_py::cuda
