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
#include <atomic>
#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

RLPT_NAMESPACE_BEGIN

//! A fixed set of worker threads for fork-join loops. One loop runs at a time per pool;
//! the calling thread takes part in every loop.
class thread_pool {
public:
  //! `threads` counts the caller too: thread_pool(1) runs everything on the calling thread.
  explicit thread_pool(unsigned threads = std::max(1u, std::thread::hardware_concurrency())) {
    RLPT_CHECK(threads >= 1, errors::executor::bad_threads, "a thread pool needs at least 1 thread, got {}", threads);
    workers_.reserve(threads - 1);
    for (unsigned i = 1; i < threads; ++i) workers_.emplace_back([this] { work(); });
  }

  thread_pool(const thread_pool&) = delete;
  thread_pool& operator=(const thread_pool&) = delete;

  ~thread_pool() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    for (auto& w : workers_) w.join();
  }

  [[nodiscard]] unsigned size() const noexcept { return static_cast<unsigned>(workers_.size()) + 1; }

  //! Calls body(chunk) for chunk in [0, chunks) on the pool's threads and waits. The first
  //! exception thrown by a body is rethrown here after every started chunk finished.
  void run_chunks(index_t chunks, const std::function<void(index_t)>& body) {
    if (chunks <= 0) return;
    if (workers_.empty() || chunks == 1) {
      for (index_t c = 0; c < chunks; ++c) body(c);
      return;
    }
    std::lock_guard serial(loop_mutex_); // one loop at a time
    {
      std::lock_guard lock(mutex_);
      body_ = &body;
      chunks_ = chunks;
      next_.store(0, std::memory_order_relaxed);
      active_ = static_cast<unsigned>(workers_.size());
      error_ = nullptr;
      ++generation_;
    }
    wake_.notify_all();
    drain();
    std::unique_lock lock(mutex_);
    done_.wait(lock, [this] { return active_ == 0; });
    body_ = nullptr;
    if (error_) std::rethrow_exception(error_);
  }

private:
  void drain() {
    // relaxed is enough: the chunk index is the only shared datum and each is taken once;
    // the mutex hand-off in run_chunks/work orders everything else.
    for (index_t c = next_.fetch_add(1, std::memory_order_relaxed); c < chunks_;
         c = next_.fetch_add(1, std::memory_order_relaxed)) {
      try {
        (*body_)(c);
      } catch (...) {
        std::lock_guard lock(mutex_);
        if (!error_) error_ = std::current_exception();
        next_.store(chunks_, std::memory_order_relaxed); // stop handing out chunks
      }
    }
  }

  void work() {
    std::uint64_t seen = 0;
    for (;;) {
      {
        std::unique_lock lock(mutex_);
        wake_.wait(lock, [&] { return stopping_ || generation_ != seen; });
        if (stopping_) return;
        seen = generation_;
      }
      drain();
      std::lock_guard lock(mutex_);
      if (--active_ == 0) done_.notify_one();
    }
  }

  std::vector<std::thread> workers_;
  std::mutex loop_mutex_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable done_;
  const std::function<void(index_t)>* body_ = nullptr;
  index_t chunks_ = 0;
  alignas(cacheline_bytes) std::atomic<index_t> next_{0};
  unsigned active_ = 0;
  std::uint64_t generation_ = 0;
  bool stopping_ = false;
  std::exception_ptr error_;
};

//! Where host work runs: serially (default) or on a thread pool the caller owns.
struct host_executor {
  thread_pool* pool = nullptr;

  //! Calls f(begin, end) over [0, n) in chunks of `grain` items (the last may be shorter).
  template <class F>
  void parallel_for(index_t n, index_t grain, F&& f) const {
    if (n <= 0) return;
    grain = std::max<index_t>(grain, 1);
    const index_t chunks = n / grain + (n % grain != 0 ? 1 : 0); // no n + grain - 1 to overflow
    auto body = [&](index_t c) {
      const index_t b = c * grain; // <= n
      f(b, b + std::min(grain, n - b));
    };
    if (pool == nullptr || chunks == 1) {
      for (index_t c = 0; c < chunks; ++c) body(c);
      return;
    }
    pool->run_chunks(chunks, body);
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
};

RLPT_NAMESPACE_END
