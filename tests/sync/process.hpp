// SPDX-License-Identifier: Apache-2.0
// Child processes for the multi-process transport tests.
#pragma once

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <exception>
#include <thread>

namespace rlpt::test::sync {

//! Runs fn() in a forked child (call before starting threads); the child exits 0 when fn
//! returns, 1 when it throws (printing why), and never returns into the test runner.
template <class F> pid_t spawn(F&& fn) {
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid == 0) {
    int rc = 0;
    try {
      fn();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "child %d: %s\n", static_cast<int>(::getpid()), e.what());
      rc = 1;
    }
    std::fflush(nullptr);
    ::_exit(rc);
  }
  return pid;
}

//! Waits for the child; returns its exit code, 128+signal if killed, or -1 after `limit`
//! (the child is then killed).
inline int wait_child(pid_t pid, std::chrono::milliseconds limit = std::chrono::seconds(30)) {
  const auto until = std::chrono::steady_clock::now() + limit;
  for (;;) {
    int status = 0;
    const pid_t r = ::waitpid(pid, &status, WNOHANG);
    if (r == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (std::chrono::steady_clock::now() > until) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

} // namespace rlpt::test::sync
