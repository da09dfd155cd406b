// SPDX-License-Identifier: Apache-2.0
//! @file
//! Host execution: serial, or a small thread pool whose results do not depend on its size.
//!
//! Work is cut into chunks by a grain the *caller* chooses, never by the thread count, and
//! per-chunk partial results are combined in chunk order. The same input therefore gives the
//! same bits on 1 thread or 64.
#pragma once

#include <rlpt/config.hpp>
#include <rlpt/core/error.hpp>

#include <algorithm>
#include <type_traits>
#include <vector>

RLPT_NAMESPACE_BEGIN

class thread_pool; // core/thread_pool.hpp

namespace detail {

//! A borrowed `void(index_t)` callable: two pointers, no allocation, no <functional>. The callable
//! must outlive the chunk_fn (it is only used for the duration of one parallel loop).
class chunk_fn {
public:
  template <class F>
    requires(!std::is_same_v<std::remove_cvref_t<F>, chunk_fn> && std::is_invocable_v<F&, index_t>)
  // NOLINTNEXTLINE(google-explicit-constructor): converts from any callable, as a function_ref does
  chunk_fn(F& f)
  noexcept
      : obj_(const_cast<void*>(static_cast<const void*>(&f))),
        call_([](void* o, index_t c) { (*static_cast<F*>(o))(c); }) {}

  void operator()(index_t chunk) const { call_(obj_, chunk); }

private:
  void* obj_;
  void (*call_)(void*, index_t);
};

} // namespace detail

//! Where host work runs: serially (default) or on a thread pool the caller owns.
//! Built from a `thread_pool*` (`host_executor{&pool}`; nullptr = serial), which needs
//! <rlpt/core/thread_pool.hpp> where the pool is made; the blocks that take an executor do not.
class host_executor {
public:
  constexpr host_executor() noexcept = default;
  template <class Pool>
    requires std::is_same_v<Pool, thread_pool>
  constexpr host_executor(Pool* pool) noexcept // NOLINT(google-explicit-constructor)
      : pool_(pool) {
    if (pool != nullptr)
      run_ = [](void* p, index_t chunks, detail::chunk_fn body) { static_cast<Pool*>(p)->run_chunks(chunks, body); };
  }

  //! The pool this executor runs on, or nullptr (serial).
  [[nodiscard]] thread_pool* pool() const noexcept { return static_cast<thread_pool*>(pool_); }

  //! Calls f(begin, end) over [0, n) in chunks of `grain` items (the last may be shorter).
  template <class F> void parallel_for(index_t n, index_t grain, F&& f) const {
    if (n <= 0) return;
    grain = std::max<index_t>(grain, 1);
    const index_t chunks = n / grain + (n % grain != 0 ? 1 : 0); // no n + grain - 1 to overflow
    auto body = [&](index_t c) {
      const index_t b = c * grain; // <= n
      f(b, b + std::min(grain, n - b));
    };
    if (run_ == nullptr || chunks == 1) {
      for (index_t c = 0; c < chunks; ++c) body(c);
      return;
    }
    run_(pool_, chunks, detail::chunk_fn(body));
  }

  //! Maps each chunk to a partial result and folds the partials in chunk order, so the result
  //! is the same for any pool size. `map(begin, end) -> R`, `fold(R& acc, const R& part)`.
  template <class R, class Map, class Fold>
  [[nodiscard]] R parallel_reduce(index_t n, index_t grain, R init, Map&& map, Fold&& fold) const {
    if (n <= 0) return init;
    grain = std::max<index_t>(grain, 1);
    const index_t chunks = n / grain + (n % grain != 0 ? 1 : 0);
    std::vector<R> parts(static_cast<std::size_t>(chunks));
    parallel_for(n, grain, [&](index_t b, index_t e) { parts[static_cast<std::size_t>(b / grain)] = map(b, e); });
    for (const R& p : parts) fold(init, p);
    return init;
  }

private:
  void* pool_ = nullptr;
  void (*run_)(void*, index_t, detail::chunk_fn) = nullptr;
};

RLPT_NAMESPACE_END
