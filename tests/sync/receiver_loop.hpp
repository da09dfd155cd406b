// SPDX-License-Identifier: Apache-2.0
// Runs a receiver's poll loop on a thread and records every update it reports.
#pragma once

#include "process.hpp"
#include "sync_support.hpp"

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>

namespace rlpt::test::sync {

class receiver_loop {
public:
  explicit receiver_loop(rlpt::sync::receiver& rx) : rx_(rx), thread_([this] { run(); }) {}
  ~receiver_loop() { stop(); }

  void stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }

  //! Waits until `n` updates (published or failed) were seen; returns them.
  std::vector<rlpt::sync::update> wait(std::size_t n, std::chrono::milliseconds limit = std::chrono::seconds(20)) {
    const auto until = std::chrono::steady_clock::now() + limit;
    for (;;) {
      {
        std::lock_guard lock(mu_);
        if (seen_.size() >= n || std::chrono::steady_clock::now() > until) return seen_;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }

  std::vector<rlpt::sync::update> seen() {
    std::lock_guard lock(mu_);
    return seen_;
  }

private:
  void run() {
    while (!stop_) {
      rlpt::sync::update u = rx_.poll(std::chrono::milliseconds(20));
      if (u.state != rlpt::sync::update::status::idle) {
        std::lock_guard lock(mu_);
        seen_.push_back(std::move(u));
      }
    }
  }

  rlpt::sync::receiver& rx_;
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::vector<rlpt::sync::update> seen_;
  std::thread thread_;
};

//! Polls the receiver until the child process exits; its exit code (-1: killed after 20 s).
inline int serve_until_exit(rlpt::sync::receiver& rx, pid_t child) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (std::chrono::steady_clock::now() < until) {
    int status = 0;
    if (::waitpid(child, &status, WNOHANG) == child)
      return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    static_cast<void>(rx.poll(std::chrono::milliseconds(20)));
  }
  return wait_child(child, std::chrono::milliseconds(0));
}

//! Checks the receiver's mirror against the model's current bytes.
inline void check_mirror(const rlpt::sync::receiver& rx, model& md) {
  for (const auto& t : md.refs) {
    CAPTURE(t.name);
    CHECK(same_bytes(rx.tensor(t.name).bytes, md.bytes(t.name)));
  }
}

} // namespace rlpt::test::sync
