// SPDX-License-Identifier: Apache-2.0
//! @file
//! Whether another process still runs: what decides that a shared-memory segment's owner or a
//! checkpoint's temporary file's writer is gone (POSIX).
#pragma once

#include <rlpt/config.hpp>

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>

RLPT_NAMESPACE_BEGIN
namespace detail {

//! True while process `pid` runs. A zombie (exited, not yet reaped by its parent) is dead.
[[nodiscard]] inline bool pid_alive(std::int32_t pid) noexcept {
  if (pid <= 0 || (::kill(pid, 0) != 0 && errno != EPERM)) return false;
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/%d/stat", static_cast<int>(pid));
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return true; // no procfs: trust kill()
  char buf[256];
  const ssize_t n = ::read(fd, buf, sizeof(buf) - 1);
  ::close(fd);
  if (n <= 0) return true;
  buf[n] = '\0';
  const char* paren = std::strrchr(buf, ')'); // "pid (comm) S ...": comm may contain spaces
  return paren == nullptr || paren[1] == '\0' || (paren[2] != 'Z' && paren[2] != 'X');
}

} // namespace detail
RLPT_NAMESPACE_END
