// SPDX-License-Identifier: Apache-2.0
// CUDA kernels of torch.ops.rlpt.logprob_entropy(_backward) and torch.ops.rlpt.objective: the
// same preparation as the CPU kernels, device views, torch's current stream and caching
// allocator for outputs and workspace. Nothing synchronises except packed layouts, whose
// cu_seqlens are read on the host (one small copy when they live on the device).
#include "cuda_api.hpp"
#include "logprob_call.hpp"
#include "objective_call.hpp"

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

namespace rlpt_py {

bool cuda_kernels_built() { return true; }

namespace {

using dev = rlpt::memory_space;

void* current_stream(const at::Tensor& t) { return c10::cuda::getCurrentCUDAStream(t.device().index()).stream(); }

cuda::logits_desc logits_of(const logprob_call& c) {
  cuda::logits_desc d;
  switch (c.logits2d.scalar_type()) {
  case at::kDouble:
    d.dtype = cuda::logits_dtype::f64;
    break;
  case at::kBFloat16:
    d.dtype = cuda::logits_dtype::bf16;
    break;
  case at::kHalf:
    d.dtype = cuda::logits_dtype::f16;
    break;
  default:
    d.dtype = cuda::logits_dtype::f32;
    break;
  }
  d.data = c.logits2d.data_ptr();
  d.rows = c.rows;
  d.cols = c.vocab;
  d.stride = c.row_stride;
  return d;
}

rlpt::device_token_layout device_layout(const token_batch& b) {
  if (b.packed)
    return rlpt::device_token_layout::packed(
        rlpt::device_view<const index_t>(b.offsets_dev.data_ptr<int64_t>(), b.B + 1), b.N, b.max_len);
  return rlpt::device_token_layout::padded(b.B, b.T, b.S);
}

cuda::sequence_desc sequence_of(const logprob_call& c) {
  cuda::sequence_desc s;
  s.sequence = c.sequence;
  if (c.sequence) s.layout = device_layout(c.b);
  if (c.valid.defined()) s.valid = c.valid.data_ptr<uint8_t>();
  return s;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>
logprob_entropy_cuda(const at::Tensor& logits, const at::Tensor& tokens, const opt_tensor& valid,
                     const opt_tensor& cu_seqlens, bool sequence, double temperature, int64_t top_k, double top_p,
                     int64_t ignore_index, double min_p, bool min_p_first) {
  return guard([&] {
    const c10::cuda::CUDAGuard device_guard(logits.device());
    const logprob_call c = prepare_logprob(logits, tokens, valid, cu_seqlens, sequence, temperature, top_k, top_p,
                                           ignore_index, min_p, min_p_first);
    const auto f32 = logits.options().dtype(at::kFloat);
    at::Tensor logp = at::empty(c.out_shape, f32), ent = at::empty(c.out_shape, f32);
    at::Tensor scored = at::empty(c.out_shape, logits.options().dtype(at::kBool));
    const index_t tr = c.opt.truncated() ? c.rows : 0;
    // Zero-filled: with top-k/top-p a row can be left unwritten by the kernel (outputs must be defined).
    at::Tensor lse = at::zeros({c.rows}, f32), thr = at::zeros({tr}, f32);
    at::Tensor tie = at::zeros({tr}, logits.options().dtype(at::kLong));
    const cuda::logprob_out out{logp.data_ptr<float>(),
                                ent.data_ptr<float>(),
                                lse.data_ptr<float>(),
                                reinterpret_cast<rlpt::mask_t*>(scored.data_ptr<bool>()),
                                tr ? thr.data_ptr<float>() : nullptr,
                                tr ? tie.data_ptr<int64_t>() : nullptr};
    cuda::logprob_forward(logits_of(c), c.tokens.data_ptr<int64_t>(), sequence_of(c), out, c.opt,
                          current_stream(logits));
    return std::make_tuple(logp, ent, lse, thr, tie, scored);
  });
}

at::Tensor logprob_entropy_backward_cuda(const opt_tensor& dlogp, const opt_tensor& dentropy, const at::Tensor& logits,
                                         const at::Tensor& tokens, const opt_tensor& valid,
                                         const opt_tensor& cu_seqlens, const at::Tensor& logp,
                                         const at::Tensor& entropy, const at::Tensor& lse, const at::Tensor& threshold,
                                         const at::Tensor& tie_last, bool sequence, double temperature, int64_t top_k,
                                         double top_p, int64_t ignore_index, double min_p, bool min_p_first) {
  return guard([&] {
    const c10::cuda::CUDAGuard device_guard(logits.device());
    const logprob_call c = prepare_logprob(logits, tokens, valid, cu_seqlens, sequence, temperature, top_k, top_p,
                                           ignore_index, min_p, min_p_first);
    const opt_tensor gl = dlogp ? opt_tensor(per_row_f32(*dlogp, c.rows, "dlogp")) : std::nullopt;
    const opt_tensor ge = dentropy ? opt_tensor(per_row_f32(*dentropy, c.rows, "dentropy")) : std::nullopt;
    const at::Tensor lp = per_row_f32(logp, c.rows, "logp"), en = per_row_f32(entropy, c.rows, "entropy");
    const at::Tensor ls = contiguous_as(lse, at::kFloat, "lse");
    const at::Tensor th = contiguous_as(threshold, at::kFloat, "threshold");
    const at::Tensor ti = contiguous_as(tie_last, at::kLong, "tie_last");
    at::Tensor dlogits = at::empty({c.rows, c.vocab}, logits.options().memory_format(at::MemoryFormat::Contiguous));
    const bool tr = c.opt.truncated();
    const cuda::logprob_back_in in{gl ? gl->data_ptr<float>() : nullptr,
                                   ge ? ge->data_ptr<float>() : nullptr,
                                   lp.data_ptr<float>(),
                                   ge ? en.data_ptr<float>() : nullptr,
                                   ls.data_ptr<float>(),
                                   tr ? th.data_ptr<float>() : nullptr,
                                   tr ? ti.data_ptr<int64_t>() : nullptr};
    cuda::logprob_backward(logits_of(c), c.tokens.data_ptr<int64_t>(), sequence_of(c), in, dlogits.data_ptr(), c.opt,
                           current_stream(logits));
    return dlogits.view(logits.sizes());
  });
}

template <class T> void run_objective(const objective_call& c, const at::Tensor& metrics, const at::Tensor& ref) {
  const rlpt::device_token_layout layout = device_layout(c.b);
  const auto in = inputs_of<T, dev::device>(c, layout);
  const auto gr = grads_of<T, dev::device>(c);
  const std::size_t bytes = cuda::objective_workspace<T>(c.obj, in, gr);
  const at::Tensor ws =
      at::empty({static_cast<int64_t>(std::max<std::size_t>(bytes, 1))}, ref.options().dtype(at::kByte));
  cuda::objective<T>(c.obj, in, gr, reinterpret_cast<rlpt::objective_result*>(metrics.data_ptr<double>()),
                     ws.data_ptr(), bytes, current_stream(ref));
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>
objective_cuda(c10::string_view spec, const opt_tensor& logp, const opt_tensor& mask, const opt_tensor& old_logp,
               const opt_tensor& behav_logp, const opt_tensor& ref_logp, const opt_tensor& adv,
               const opt_tensor& seq_adv, const opt_tensor& entropy, const opt_tensor& values,
               const opt_tensor& old_values, const opt_tensor& returns, const opt_tensor& cu_seqlens, bool grad_logp,
               bool grad_entropy, bool grad_values, const opt_tensor& seq_in_denominator) {
  return guard([&] {
    const at::Tensor& ref = logp ? *logp : *values;
    const c10::cuda::CUDAGuard device_guard(ref.device());
    const objective_call c =
        prepare_objective(spec, logp, mask, old_logp, behav_logp, ref_logp, adv, seq_adv, entropy, values, old_values,
                          returns, cu_seqlens, grad_logp, grad_entropy, grad_values, seq_in_denominator);
    at::Tensor metrics = at::empty({num_metrics}, ref.options().dtype(at::kDouble));
    if (c.compute == at::kDouble)
      run_objective<double>(c, metrics, ref);
    else
      run_objective<float>(c, metrics, ref);
    return finish_objective(c, metrics);
  });
}

} // namespace
} // namespace rlpt_py

TORCH_LIBRARY_IMPL(rlpt, CUDA, m) {
  m.impl("logprob_entropy", &rlpt_py::logprob_entropy_cuda);
  m.impl("logprob_entropy_backward", &rlpt_py::logprob_entropy_backward_cuda);
  m.impl("objective", &rlpt_py::objective_cuda);
}
