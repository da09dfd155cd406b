// SPDX-License-Identifier: Apache-2.0
// CPU kernels of rlpt::logprob_entropy and its backward for float32, float64, bfloat16 and
// float16 logits (one read of each logits row forward, one backward).
#include "logprob_call.hpp"

#include <torch/library.h>

#include <rlpt/logprob.hpp>

#include <fmt/format.h>

namespace rlpt_py {

logprob_call prepare_logprob(const at::Tensor& logits, const at::Tensor& tokens, const opt_tensor& valid,
                             const opt_tensor& cu_seqlens, bool sequence, double temperature, int64_t top_k,
                             double top_p, int64_t ignore_index, double min_p, bool min_p_first) {
  logprob_call c;
  c.sequence = sequence;
  c.opt = {.temperature = static_cast<float>(temperature),
           .top_k = top_k,
           .top_p = static_cast<float>(top_p),
           .ignore_index = ignore_index,
           .on_dropped = rlpt::dropped_target::neg_inf,
           .min_p = static_cast<float>(min_p),
           .min_p_order = min_p_first ? rlpt::min_p_order::first : rlpt::min_p_order::last};
  const auto st = logits.scalar_type();
  if (st != at::kFloat && st != at::kDouble && st != at::kBFloat16 && st != at::kHalf)
    raise(ids::dtype, fmt::format("logits have dtype {}; rlpt scores float32, float64, bfloat16 and float16 logits",
                                  dtype_name(st)));
  expect_device(tokens, logits.device(), "tokens");
  if (tokens.dim() + 1 != logits.dim() || logits.dim() < 2 || logits.dim() > 3 ||
      tokens.sizes() != logits.sizes().slice(0, logits.dim() - 1))
    raise(ids::shape, fmt::format("logits {} and tokens {} do not match: logits are [..., V] over the tokens' shape "
                                  "([N, V] with [N], or [B, T, V] with [B, T])",
                                  dims(logits.sizes()), dims(tokens.sizes())));
  c.out_shape = tokens.sizes().vec();
  c.vocab = logits.size(-1);
  c.rows = tokens.numel();
  c.logits2d = as_rows(logits, "logits");
  c.row_stride = c.rows > 1 ? c.logits2d.stride(0) : c.vocab;
  c.tokens = contiguous_as(tokens, at::kLong, "tokens");
  if (valid) {
    expect_device(*valid, logits.device(), "valid");
    if (valid->sizes() != tokens.sizes())
      raise(ids::shape, fmt::format("valid has shape {} but tokens {}", dims(valid->sizes()), dims(tokens.sizes())));
    c.valid = contiguous_as(mask_bytes(*valid, "valid"), at::kByte, "valid");
  }
  if (sequence) {
    if (cu_seqlens) {
      if (tokens.dim() != 1) raise(ids::shape, "with cu_seqlens, logits are packed [N, V] and tokens [N]");
      c.b = describe(c.tokens, "tokens", cu_seqlens, {});
    } else {
      if (tokens.dim() != 2) raise(ids::shape, "padded sequences take logits [B, T, V] and tokens [B, T]");
      c.b = describe(c.tokens, "tokens", std::nullopt, {});
    }
  } else if (valid || cu_seqlens) {
    raise(ids::bad_option, "valid and cu_seqlens are for sequences (sequence = True)");
  }
  return c;
}

namespace {

template <class F> decltype(auto) dispatch_logits(at::ScalarType t, F&& f) {
  switch (t) {
  case at::kDouble:
    return f(double{});
  case at::kBFloat16:
    return f(rlpt::bf16{});
  case at::kHalf:
    return f(rlpt::f16{});
  default:
    return f(float{});
  }
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>
logprob_entropy_cpu(const at::Tensor& logits, const at::Tensor& tokens, const opt_tensor& valid,
                    const opt_tensor& cu_seqlens, bool sequence, double temperature, int64_t top_k, double top_p,
                    int64_t ignore_index, double min_p, bool min_p_first) {
  return guard([&] {
    const logprob_call c = prepare_logprob(logits, tokens, valid, cu_seqlens, sequence, temperature, top_k, top_p,
                                           ignore_index, min_p, min_p_first);
    const auto f32 = logits.options().dtype(at::kFloat);
    at::Tensor logp = at::empty(c.out_shape, f32), ent = at::empty(c.out_shape, f32);
    at::Tensor scored = at::empty(c.out_shape, logits.options().dtype(at::kBool));
    const index_t tr = c.opt.truncated() ? c.rows : 0;
    // Zero-filled: with top-k/top-p a row can be left unwritten by the kernel (outputs must be defined).
    at::Tensor lse = at::zeros({c.rows}, f32), thr = at::zeros({tr}, f32);
    at::Tensor tie = at::zeros({tr}, logits.options().dtype(at::kLong));
    const rlpt::logprob_outputs out{
        .logp = view_of<float>(logp),
        .entropy = view_of<float>(ent),
        .saved = {.lse = view_of<float>(lse), .threshold = view_of<float>(thr), .tie_last = view_of<index_t>(tie)},
        .scored = {reinterpret_cast<rlpt::mask_t*>(scored.data_ptr<bool>()), c.rows}};
    const auto y = view_of<const index_t>(c.tokens);
    dispatch_logits(logits.scalar_type(), [&](auto tag) {
      using T = decltype(tag);
      const rlpt::view2d<const T> x(static_cast<const T*>(c.logits2d.data_ptr()), c.rows, c.vocab, c.row_stride);
      if (c.sequence) {
        const rlpt::token_layout layout = c.b.host_layout();
        const auto v = c.valid.defined() ? view_of<const rlpt::mask_t>(c.valid) : rlpt::view<const rlpt::mask_t>{};
        return rlpt::sequence_logprob_entropy(x, y, layout, v, out, c.opt);
      }
      return rlpt::logprob_entropy(x, y, out, c.opt);
    });
    return std::make_tuple(logp, ent, lse, thr, tie, scored);
  });
}

at::Tensor logprob_entropy_backward_cpu(const opt_tensor& dlogp, const opt_tensor& dentropy, const at::Tensor& logits,
                                        const at::Tensor& tokens, const opt_tensor& valid, const opt_tensor& cu_seqlens,
                                        const at::Tensor& logp, const at::Tensor& entropy, const at::Tensor& lse,
                                        const at::Tensor& threshold, const at::Tensor& tie_last, bool sequence,
                                        double temperature, int64_t top_k, double top_p, int64_t ignore_index,
                                        double min_p, bool min_p_first) {
  return guard([&] {
    const logprob_call c = prepare_logprob(logits, tokens, valid, cu_seqlens, sequence, temperature, top_k, top_p,
                                           ignore_index, min_p, min_p_first);
    const opt_tensor gl = dlogp ? opt_tensor(per_row_f32(*dlogp, c.rows, "dlogp")) : std::nullopt;
    const opt_tensor ge = dentropy ? opt_tensor(per_row_f32(*dentropy, c.rows, "dentropy")) : std::nullopt;
    const at::Tensor lp = per_row_f32(logp, c.rows, "logp"), en = per_row_f32(entropy, c.rows, "entropy");
    const at::Tensor ls = contiguous_as(lse, at::kFloat, "lse");
    const at::Tensor th = contiguous_as(threshold, at::kFloat, "threshold");
    const at::Tensor ti = contiguous_as(tie_last, at::kLong, "tie_last");
    at::Tensor dlogits = at::empty({c.rows, c.vocab}, logits.options().memory_format(at::MemoryFormat::Contiguous));
    const rlpt::logprob_backward_inputs in{
        .dlogp = view_of<const float>(gl),
        .dentropy = view_of<const float>(ge),
        .logp = view_of<const float>(lp),
        .entropy = ge ? view_of<const float>(en) : rlpt::view<const float>{},
        .saved = {view_of<const float>(ls), view_of<const float>(th), view_of<const index_t>(ti)}};
    const auto y = view_of<const index_t>(c.tokens);
    dispatch_logits(logits.scalar_type(), [&](auto tag) {
      using T = decltype(tag);
      const rlpt::view2d<const T> x(static_cast<const T*>(c.logits2d.data_ptr()), c.rows, c.vocab, c.row_stride);
      const rlpt::view2d<T> dx(static_cast<T*>(dlogits.data_ptr()), c.rows, c.vocab);
      if (c.sequence) {
        const rlpt::token_layout layout = c.b.host_layout();
        const auto v = c.valid.defined() ? view_of<const rlpt::mask_t>(c.valid) : rlpt::view<const rlpt::mask_t>{};
        rlpt::sequence_logprob_entropy_backward(x, y, layout, v, in, dx, c.opt);
      } else {
        rlpt::logprob_entropy_backward(x, y, in, dx, c.opt);
      }
    });
    return dlogits.view(logits.sizes());
  });
}

} // namespace
} // namespace rlpt_py

TORCH_LIBRARY_IMPL(rlpt, CPU, m) {
  m.impl("logprob_entropy", &rlpt_py::logprob_entropy_cpu);
  m.impl("logprob_entropy_backward", &rlpt_py::logprob_entropy_backward_cpu);
}
