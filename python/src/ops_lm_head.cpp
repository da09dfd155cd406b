// SPDX-License-Identifier: Apache-2.0
// CPU kernels of torch.ops.rlpt.lm_head_logprob_entropy and its backward: rlpt's fused lm-head
// (logprob/lm_head.hpp), hidden [N, D] x weight [V, D]^T -> chosen-token logprob and entropy
// without the [N, V] logits, fp32 accumulation whatever the input dtype. Built only where Eigen
// 3.4 is found (CMakeLists.txt); the ops are defined by this translation unit, so a package built
// without it has neither the ops nor rlpt.lm_head_logprob_entropy. The kernels come from
// lm_head_kernels.cpp: the AVX2 + FMA build (rlpt/_lm_head_avx2.so, loaded on first use) where the
// CPU has both, else the baseline build in this module.
#include "lm_head_kernels.hpp"
#include "tensors.hpp"

#include <torch/library.h>

#include <ATen/Parallel.h>

#include <rlpt/core/error.hpp>

#include <fmt/format.h>

#include <dlfcn.h>

#include <atomic>
#include <string>

namespace rlpt_py {

bool lm_head_built() { return true; }

namespace {

//! rlpt/_lm_head_avx2.so next to this module, or nullptr (not built, not found, or not loadable).
const lm_head_kernels* load_avx2() {
#if defined(RLPT_PY_LM_HEAD_AVX2_LIB)
  Dl_info self{};
  if (dladdr(reinterpret_cast<const void*>(&load_avx2), &self) == 0 || self.dli_fname == nullptr) return nullptr;
  std::string path = self.dli_fname;
  path = path.substr(0, path.rfind('/') + 1) + RLPT_PY_LM_HEAD_AVX2_LIB;
  void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) return nullptr;
  using entry = const lm_head_kernels* (*)();
  const auto get = reinterpret_cast<entry>(dlsym(lib, "rlpt_py_lm_head_kernels_avx2"));
  return get != nullptr ? get() : nullptr;
#else
  return nullptr;
#endif
}

bool cpu_has_avx2_fma() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
  return false;
#endif
}

const lm_head_kernels* avx2_kernels() {
  static const lm_head_kernels* k = cpu_has_avx2_fma() ? load_avx2() : nullptr;
  return k;
}

std::atomic<const lm_head_kernels*>& chosen() {
  static std::atomic<const lm_head_kernels*> k{nullptr};
  return k;
}

const lm_head_kernels& kernels() {
  const lm_head_kernels* k = chosen().load();
  if (k == nullptr) {
    const lm_head_kernels* best = avx2_kernels();
    k = best != nullptr ? best : &lm_head_kernels_baseline();
    chosen().store(k);
  }
  return *k;
}

//! The inputs of one call, checked and laid out as rlpt reads them: hidden [N, D] and weight
//! [V, D] with a contiguous last dimension and evenly spaced rows, targets int64 [N].
struct lm_head_call {
  at::Tensor hidden2d, weight, targets;
  std::vector<int64_t> out_shape;
  float temperature = 1.0f;
  int64_t ignore_index = -100;
};

lm_head_call prepare(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& targets, double temperature,
                     int64_t ignore_index) {
  const auto st = hidden.scalar_type();
  if (st != at::kFloat && st != at::kDouble && st != at::kBFloat16 && st != at::kHalf)
    raise(ids::dtype, fmt::format("hidden has dtype {}; the fused lm-head takes float32, float64, bfloat16 and "
                                  "float16 hidden states",
                                  dtype_name(st)));
  if (weight.scalar_type() != st)
    raise(ids::dtype, fmt::format("hidden is {} but weight is {}: give both the same dtype (the product is "
                                  "accumulated in float32 either way)",
                                  dtype_name(st), dtype_name(weight.scalar_type())));
  for (const auto* t : {&weight, &targets})
    if (t->device() != hidden.device() || !hidden.device().is_cpu())
      raise(ids::device, fmt::format("the fused lm-head runs on CPU tensors: hidden is on {}, weight on {}, "
                                     "targets on {}",
                                     hidden.device().str(), weight.device().str(), targets.device().str()));
  if (hidden.dim() < 2 || hidden.dim() > 3 || weight.dim() != 2 || targets.dim() + 1 != hidden.dim() ||
      targets.sizes() != hidden.sizes().slice(0, hidden.dim() - 1) || weight.size(1) != hidden.size(-1))
    raise(ids::shape, fmt::format("hidden {}, weight {} and targets {} do not match: hidden is [N, D] with targets "
                                  "[N] (or [B, T, D] with [B, T]) and weight is the head's [V, D]",
                                  dims(hidden.sizes()), dims(weight.sizes()), dims(targets.sizes())));
  if (targets.is_floating_point() || targets.is_complex() || targets.scalar_type() == at::kBool)
    raise(ids::dtype, fmt::format("targets must be integer token ids, got {}", dtype_name(targets.scalar_type())));
  lm_head_call c;
  c.out_shape = targets.sizes().vec();
  c.hidden2d = as_rows(hidden, "hidden");
  c.weight = as_rows(weight, "weight");
  c.targets = contiguous_as(targets, at::kLong, "targets").view({-1});
  c.temperature = static_cast<float>(temperature);
  c.ignore_index = ignore_index;
  return c;
}

lm_head_args args_of(const lm_head_call& c, at::ScalarType st) {
  lm_head_args a;
  a.dtype = st == at::kDouble     ? lm_head_dtype::f64
            : st == at::kBFloat16 ? lm_head_dtype::bf16
            : st == at::kHalf     ? lm_head_dtype::f16
                                  : lm_head_dtype::f32;
  a.hidden = c.hidden2d.data_ptr();
  a.n = c.hidden2d.size(0);
  a.d = c.hidden2d.size(1);
  a.hidden_stride = c.hidden2d.stride(0);
  a.weight = c.weight.data_ptr();
  a.v = c.weight.size(0);
  a.weight_stride = c.weight.stride(0);
  a.targets = c.targets.data_ptr<int64_t>();
  a.temperature = c.temperature;
  a.ignore_index = c.ignore_index;
  a.threads = at::get_num_threads();
  return a;
}

[[noreturn]] void rethrow(const lm_head_failure& f) { throw rlpt::error(f.id, f.message); }

std::tuple<at::Tensor, at::Tensor, at::Tensor> lm_head_cpu(const at::Tensor& hidden, const at::Tensor& weight,
                                                           const at::Tensor& targets, double temperature,
                                                           int64_t ignore_index) {
  return guard([&] {
    const lm_head_call c = prepare(hidden, weight, targets, temperature, ignore_index);
    const auto f32 = hidden.options().dtype(at::kFloat);
    const index_t n = c.hidden2d.size(0);
    at::Tensor logp = at::empty(c.out_shape, f32), ent = at::empty(c.out_shape, f32), lse = at::empty({n}, f32);
    lm_head_failure fail;
    if (!kernels().forward(args_of(c, hidden.scalar_type()), logp.data_ptr<float>(), ent.data_ptr<float>(),
                           lse.data_ptr<float>(), fail))
      rethrow(fail);
    return std::make_tuple(logp, ent, lse);
  });
}

std::tuple<at::Tensor, at::Tensor> lm_head_backward_cpu(const std::optional<at::Tensor>& dlogp,
                                                        const std::optional<at::Tensor>& dentropy,
                                                        const at::Tensor& hidden, const at::Tensor& weight,
                                                        const at::Tensor& targets, const at::Tensor& entropy,
                                                        const at::Tensor& lse, double temperature, int64_t ignore_index,
                                                        bool grad_hidden, bool grad_weight) {
  return guard([&] {
    const lm_head_call c = prepare(hidden, weight, targets, temperature, ignore_index);
    const index_t n = c.hidden2d.size(0), d = c.hidden2d.size(1), v = c.weight.size(0);
    const opt_tensor gl = dlogp ? opt_tensor(per_row_f32(*dlogp, n, "dlogp")) : std::nullopt;
    const opt_tensor ge = dentropy ? opt_tensor(per_row_f32(*dentropy, n, "dentropy")) : std::nullopt;
    const at::Tensor en = per_row_f32(entropy, n, "entropy"), ls = per_row_f32(lse, n, "lse");
    const auto f32 = hidden.options().dtype(at::kFloat);
    // rlpt writes float32 gradients; autograd wants the inputs' dtype (a cast for the others). A
    // gradient not asked for comes back empty ([0]): op schemas have no optional returns.
    at::Tensor gh = at::empty({grad_hidden ? n : 0, d}, f32), gw = at::empty({grad_weight ? v : 0, d}, f32);
    lm_head_failure fail;
    if (!kernels().backward(args_of(c, hidden.scalar_type()), gl ? gl->data_ptr<float>() : nullptr,
                            ge ? ge->data_ptr<float>() : nullptr, en.data_ptr<float>(), ls.data_ptr<float>(),
                            grad_hidden ? gh.data_ptr<float>() : nullptr, grad_weight ? gw.data_ptr<float>() : nullptr,
                            fail))
      rethrow(fail);
    gh = gh.to(hidden.scalar_type());
    if (grad_hidden) gh = gh.view(hidden.sizes());
    return std::make_tuple(gh, gw.to(weight.scalar_type()));
  });
}

} // namespace

//! Which build the fused lm-head runs ("avx2" or "baseline"); `want` = "baseline" forces the
//! baseline build, "avx2" asks for the AVX2 one (an error where this CPU or package has none),
//! "auto" (or "") returns to the default.
std::string lm_head_isa(const std::string& want) {
  if (want == "baseline") {
    chosen().store(&lm_head_kernels_baseline());
  } else if (want == "avx2") {
    if (avx2_kernels() == nullptr)
      raise(ids::bad_option, "the AVX2 build of the fused lm-head is not available (no AVX2 + FMA on this CPU, "
                             "or the package was built without rlpt/_lm_head_avx2.so)");
    chosen().store(avx2_kernels());
  } else if (want == "auto") {
    chosen().store(nullptr);
  } else if (!want.empty()) {
    raise(ids::bad_option, fmt::format("lm-head ISA \"{}\" is not one of auto, avx2, baseline", want));
  }
  return kernels().isa;
}

} // namespace rlpt_py

TORCH_LIBRARY_FRAGMENT(rlpt, m) {
  m.def("lm_head_logprob_entropy(Tensor hidden, Tensor weight, Tensor targets, float temperature, int ignore_index) "
        "-> (Tensor logp, Tensor entropy, Tensor lse)");
  m.def("lm_head_logprob_entropy_backward(Tensor? dlogp, Tensor? dentropy, Tensor hidden, Tensor weight, "
        "Tensor targets, Tensor entropy, Tensor lse, float temperature, int ignore_index, bool grad_hidden, "
        "bool grad_weight) -> (Tensor grad_hidden, Tensor grad_weight)");
}

TORCH_LIBRARY_IMPL(rlpt, CPU, m) {
  m.impl("lm_head_logprob_entropy", &rlpt_py::lm_head_cpu);
  m.impl("lm_head_logprob_entropy_backward", &rlpt_py::lm_head_backward_cpu);
}
