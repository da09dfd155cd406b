// SPDX-License-Identifier: Apache-2.0
// rlpt's host fused lm-head (logprob/lm_head.hpp) behind lm_head_kernels.hpp's table. Compiled
// twice: into rlpt._C (baseline ISA) and, with RLPT_PY_LM_HEAD_AVX2_BUILD and -mavx2 -mfma, into
// rlpt/_lm_head_avx2.so (hidden visibility, one exported entry point). No torch here.
#include "lm_head_kernels.hpp"

#include <rlpt/core/thread_pool.hpp>
#include <rlpt/logprob/lm_head.hpp>

#include <unistd.h>

#include <mutex>

namespace rlpt_py {
namespace {

//! One rlpt::thread_pool of the caller's thread count, rebuilt when that count changes. A call
//! that finds it in use by another thread runs serially instead of waiting, so concurrent Python
//! threads never block each other. The pool is never destroyed at exit, and a forked child (a
//! DataLoader worker) inherits it without its threads: joining threads a process does not have
//! would hang, so the child leaves the parent's pool alone and builds its own.
class pool_lease {
public:
  explicit pool_lease(int threads) : lock_(mutex(), std::try_to_lock) {
    if (!lock_.owns_lock() || threads <= 1) return;
    auto& p = pool();
    auto& owner = owner_pid();
    if (p != nullptr && owner != ::getpid()) p = nullptr; // the parent's: its workers are not in this process
    if (p == nullptr || static_cast<int>(p->size()) != threads) {
      delete p; // NOLINT(cppcoreguidelines-owning-memory): ours, so its workers are ours to join
      p = new rlpt::thread_pool(static_cast<unsigned>(threads)); // NOLINT(cppcoreguidelines-owning-memory)
      owner = ::getpid();
    }
    ex_ = rlpt::host_executor(p);
  }
  [[nodiscard]] const rlpt::host_executor& executor() const noexcept { return ex_; }

private:
  static std::mutex& mutex() {
    static std::mutex m;
    return m;
  }
  static rlpt::thread_pool*& pool() {
    static rlpt::thread_pool* p = nullptr;
    return p;
  }
  static pid_t& owner_pid() {
    static pid_t pid = 0;
    return pid;
  }
  std::unique_lock<std::mutex> lock_;
  rlpt::host_executor ex_{};
};

template <class F> bool catching(lm_head_failure& fail, F&& f) {
  try {
    f();
    return true;
  } catch (const rlpt::error& e) {
    fail.id = e.id();
    fail.message = e.message();
    return false;
  }
}

template <class F> void dispatch(lm_head_dtype t, F&& f) {
  switch (t) {
  case lm_head_dtype::f64:
    return f(double{});
  case lm_head_dtype::bf16:
    return f(rlpt::bf16{});
  case lm_head_dtype::f16:
    return f(rlpt::f16{});
  default:
    return f(float{});
  }
}

template <class T> rlpt::view2d<const T> rows(const void* p, std::int64_t r, std::int64_t c, std::int64_t stride) {
  return {static_cast<const T*>(p), r, c, r > 1 ? stride : c};
}

rlpt::lm_head_options options(const lm_head_args& a) {
  rlpt::lm_head_options o;
  o.temperature = a.temperature;
  o.ignore_index = a.ignore_index;
  return o;
}

bool forward(const lm_head_args& a, float* logp, float* entropy, float* lse, lm_head_failure& fail) {
  return catching(fail, [&] {
    const rlpt::logprob_outputs out{.logp = {logp, a.n}, .entropy = {entropy, a.n}, .saved = {.lse = {lse, a.n}}};
    const pool_lease lease(a.threads);
    dispatch(a.dtype, [&](auto tag) {
      using T = decltype(tag);
      (void)rlpt::fused_lm_head_logprob(rows<T>(a.hidden, a.n, a.d, a.hidden_stride),
                                        rows<T>(a.weight, a.v, a.d, a.weight_stride), {a.targets, a.n}, out, options(a),
                                        lease.executor());
    });
  });
}

bool backward(const lm_head_args& a, const float* dlogp, const float* dentropy, const float* entropy, const float* lse,
              float* grad_hidden, float* grad_weight, lm_head_failure& fail) {
  return catching(fail, [&] {
    const auto opt_rows = [](const float* p, std::int64_t n) { return rlpt::view<const float>(p, p ? n : 0); };
    const auto grad = [](float* p, std::int64_t r, std::int64_t c) {
      return p ? rlpt::view2d<float>(p, r, c) : rlpt::view2d<float>{};
    };
    const pool_lease lease(a.threads);
    dispatch(a.dtype, [&](auto tag) {
      using T = decltype(tag);
      rlpt::fused_lm_head_backward(rows<T>(a.hidden, a.n, a.d, a.hidden_stride),
                                   rows<T>(a.weight, a.v, a.d, a.weight_stride), {a.targets, a.n}, opt_rows(dlogp, a.n),
                                   opt_rows(dentropy, a.n), {entropy, a.n}, {lse, a.n}, grad(grad_hidden, a.n, a.d),
                                   grad(grad_weight, a.v, a.d), options(a), lease.executor());
    });
  });
}

} // namespace

#if defined(RLPT_PY_LM_HEAD_AVX2_BUILD)
} // namespace rlpt_py

extern "C" __attribute__((visibility("default"))) const rlpt_py::lm_head_kernels* rlpt_py_lm_head_kernels_avx2() {
  static const rlpt_py::lm_head_kernels k{"avx2", &rlpt_py::forward, &rlpt_py::backward};
  return &k;
}
#else
const lm_head_kernels& lm_head_kernels_baseline() {
  static const lm_head_kernels k{"baseline", &forward, &backward};
  return k;
}

} // namespace rlpt_py
#endif
