// SPDX-License-Identifier: Apache-2.0
//! @file
//! Path and directory helpers on POSIX calls, shared by the blocks that write files atomically
//! (rollout checkpoints, the safetensors transport). No `<filesystem>`: it costs a third of a
//! second of every build that includes it.
#pragma once

#include <rlpt/config.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <string>
#include <string_view>

RLPT_NAMESPACE_BEGIN
namespace detail {

//! The directory part of `path`: "." when it has none, "/" for a file at the root.
[[nodiscard]] inline std::string parent_dir(std::string_view path) {
  const auto slash = path.rfind('/');
  if (slash == std::string_view::npos) return ".";
  return slash == 0 ? std::string("/") : std::string(path.substr(0, slash));
}

//! The file name part of `path` (all of it when it has no '/').
[[nodiscard]] inline std::string_view file_name(std::string_view path) noexcept {
  const auto slash = path.rfind('/');
  return slash == std::string_view::npos ? path : path.substr(slash + 1);
}

//! fsyncs directory `dir`, so that a rename into it survives a crash. Returns 0, or the errno of
//! the call that failed.
[[nodiscard]] inline int fsync_dir(const std::string& dir) noexcept {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return errno;
  const int err = ::fsync(fd) == 0 ? 0 : errno;
  ::close(fd);
  return err;
}

} // namespace detail
RLPT_NAMESPACE_END
