// SPDX-License-Identifier: Apache-2.0
//! @file
//! rlpt::thread_pool: the worker threads a host_executor (core/executor.hpp) can run chunks on.
//!
//! Kept out of executor.hpp so that the blocks, which only take a host_executor, do not pull
//! <thread>, <mutex> and <condition_variable> into every translation unit.
#pragma once

#include <rlpt/config.hpp>
#include <rlpt/core/error.hpp>
#include <rlpt/core/executor.hpp>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <exception>
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
  void run_chunks(index_t chunks, detail::chunk_fn body) {
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
  const detail::chunk_fn* body_ = nullptr;
  index_t chunks_ = 0;
  alignas(cacheline_bytes) std::atomic<index_t> next_{0};
  unsigned active_ = 0;
  std::uint64_t generation_ = 0;
  bool stopping_ = false;
  std::exception_ptr error_;
};

RLPT_NAMESPACE_END
