// SPDX-License-Identifier: Apache-2.0
// One rlpt::evaluate call prepared from torch tensors (shared by the CPU and CUDA kernels).
#pragma once

#include "tensors.hpp"

#include <rlpt/logprob/mismatch.hpp>
#include <rlpt/objective.hpp>

#include <string>

namespace rlpt_py {

//! Fields of rlpt::objective_result, all doubles, in declaration order (the metrics tensor).
inline constexpr int64_t num_metrics = static_cast<int64_t>(sizeof(rlpt::objective_result) / sizeof(double));
static_assert(sizeof(rlpt::objective_result) % sizeof(double) == 0, "objective_result must be all doubles");
//! Fields of rlpt::mismatch_metrics, all doubles (the mismatch_metrics op's tensor).
inline constexpr std::size_t mismatch_fields = sizeof(rlpt::mismatch_metrics) / sizeof(double);
static_assert(sizeof(rlpt::mismatch_metrics) % sizeof(double) == 0, "mismatch_metrics must be all doubles");

struct objective_call {
  rlpt::objective obj;
  token_batch b;
  at::ScalarType compute = at::kFloat;
  at::ScalarType logp_dtype = at::kFloat, entropy_dtype = at::kFloat, values_dtype = at::kFloat;
  at::Tensor mask;   // bytes, or undefined
  at::Tensor in_den; // seq_in_denominator as bytes [B], or undefined
  opt_tensor logp, old_logp, behav_logp, ref_logp, adv, seq_adv, entropy, values, old_values, returns;
  at::Tensor g_logp, g_entropy, g_values; // output buffers (undefined unless asked)
};

objective_call prepare_objective(c10::string_view spec, const opt_tensor& logp, const opt_tensor& mask,
                                 const opt_tensor& old_logp, const opt_tensor& behav_logp, const opt_tensor& ref_logp,
                                 const opt_tensor& adv, const opt_tensor& seq_adv, const opt_tensor& entropy,
                                 const opt_tensor& values, const opt_tensor& old_values, const opt_tensor& returns,
                                 const opt_tensor& cu_seqlens, bool grad_logp, bool grad_entropy, bool grad_values,
                                 const opt_tensor& seq_in_denominator = std::nullopt);

//! (loss, grad_logp, grad_entropy, grad_values, metrics) from a call whose metrics tensor was
//! filled: gradients in their inputs' dtypes and [B, T] shape (empty [0] when not asked for).
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> finish_objective(const objective_call& c,
                                                                                        const at::Tensor& metrics);

template <class T, rlpt::memory_space S>
rlpt::basic_objective_inputs<T, S> inputs_of(const objective_call& c, const rlpt::basic_token_layout<S>& layout) {
  auto tok = [&](const opt_tensor& t) {
    return t ? rlpt::view<const T, S>(static_cast<const T*>(t->data_ptr()), c.b.N) : rlpt::view<const T, S>{};
  };
  rlpt::basic_objective_inputs<T, S> in;
  in.layout = layout;
  if (c.mask.defined())
    in.mask = rlpt::view<const rlpt::mask_t, S>(static_cast<const rlpt::mask_t*>(c.mask.data_ptr()), c.b.N);
  in.logp = tok(c.logp);
  in.old_logp = tok(c.old_logp);
  in.behav_logp = tok(c.behav_logp);
  in.ref_logp = tok(c.ref_logp);
  in.adv = tok(c.adv);
  if (c.seq_adv) in.seq_adv = rlpt::view<const T, S>(static_cast<const T*>(c.seq_adv->data_ptr()), c.seq_adv->numel());
  in.entropy = tok(c.entropy);
  in.values = tok(c.values);
  in.old_values = tok(c.old_values);
  in.returns = tok(c.returns);
  if (c.in_den.defined())
    in.seq_in_denominator =
        rlpt::view<const rlpt::mask_t, S>(static_cast<const rlpt::mask_t*>(c.in_den.data_ptr()), c.in_den.numel());
  return in;
}

template <class T, rlpt::memory_space S> rlpt::basic_objective_grads<T, S> grads_of(const objective_call& c) {
  auto out = [&](const at::Tensor& t) {
    return t.defined() ? rlpt::view<T, S>(static_cast<T*>(t.data_ptr()), c.b.N) : rlpt::view<T, S>{};
  };
  return {out(c.g_logp), out(c.g_entropy), out(c.g_values)};
}

} // namespace rlpt_py
