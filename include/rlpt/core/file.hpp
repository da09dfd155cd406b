// SPDX-License-Identifier: Apache-2.0
//! @file
//! Durable file writing and its path helpers on POSIX calls, shared by the blocks that write
//! files (rollout checkpoints, the safetensors transport). No `<filesystem>`: it costs a third
//! of a second of every build that includes it.
#pragma once

#include <rlpt/config.hpp>
#include <rlpt/core/process.hpp>

#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>

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

//! Writes `n` bytes at offset `at`, retrying short writes and EINTR. Returns 0, or the errno of
//! the write that failed (EIO for a write that made no progress).
[[nodiscard]] inline int pwrite_all(int fd, const void* data, std::size_t n, std::uint64_t at) noexcept {
  const auto* p = static_cast<const char*>(data);
  while (n > 0) {
    // At most 1 GiB per call: Linux moves at most 0x7ffff000 bytes per write anyway.
    const ::ssize_t w = ::pwrite(fd, p, std::min<std::size_t>(n, std::size_t{1} << 30), static_cast<::off_t>(at));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return w < 0 ? errno : EIO;
    p += w;
    n -= static_cast<std::size_t>(w);
    at += static_cast<std::uint64_t>(w);
  }
  return 0;
}

//! The writer's pid if `file` (a name in the target's directory) is a temporary file of
//! write_durable for the target named `target` (`<target>.tmp.<pid>.<n>`, decimal), else -1.
[[nodiscard]] inline std::int64_t temporary_writer(std::string_view file, std::string_view target) noexcept {
  if (file.size() <= target.size() + 5 || file.substr(0, target.size()) != target ||
      file.substr(target.size(), 5) != ".tmp.")
    return -1;
  const std::string_view rest = file.substr(target.size() + 5);
  const std::size_t dot = rest.find('.');
  if (dot == std::string_view::npos || dot == 0 || dot + 1 == rest.size()) return -1;
  std::int32_t pid = 0;
  const auto [end, ec] = std::from_chars(rest.data(), rest.data() + dot, pid);
  if (ec != std::errc{} || end != rest.data() + dot || pid <= 0) return -1;
  for (const char c : rest.substr(dot + 1))
    if (c < '0' || c > '9') return -1;
  return pid;
}

//! Removes the temporary files that writers of `path` killed mid-write left behind (those of
//! processes that no longer run; never this process's, nor a running writer's). Returns how
//! many it removed. Best effort: a file that cannot be removed is skipped.
inline std::int64_t remove_stale_temporaries(const std::string& path) {
  const std::string dir = parent_dir(path);
  const std::string_view target = file_name(path);
  const auto self = static_cast<std::int64_t>(::getpid());
  std::int64_t removed = 0;
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return 0;
  while (const dirent* e = ::readdir(d)) {
    const std::int64_t pid = temporary_writer(e->d_name, target);
    if (pid < 0 || pid == self || pid_alive(static_cast<std::int32_t>(pid))) continue;
    if (::unlink((dir + '/' + e->d_name).c_str()) == 0) ++removed;
  }
  ::closedir(d);
  return removed;
}

//! A file being written so that a crash leaves either the old `path` or the whole new file,
//! never a mix: writes go to a temporary file `<path>.tmp.<pid>.<n>` in the same directory
//! (unique per object, so concurrent writers of one path never share it); publish() fsyncs it,
//! renames it over `path` and fsyncs the directory. Destroyed or abandoned unpublished, it
//! removes the temporary file and leaves `path` untouched. I/O failures call
//! `fail(what, where, errno)`, which must throw: each block raises its own error id.
class durable_file {
public:
  durable_file() = default;
  //! Removes the stale temporaries of killed writers of `path`, then creates this one's.
  template <class Fail> durable_file(std::string path, Fail&& fail) : path_(std::move(path)) {
    static_cast<void>(remove_stale_temporaries(path_));
    static std::atomic<std::uint64_t> counter{0};
    tmp_ = path_ + ".tmp." + std::to_string(::getpid()) + '.' +
           std::to_string(counter.fetch_add(1, std::memory_order_relaxed));
    fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) fail("cannot create", tmp_, errno);
  }
  durable_file(durable_file&& o) noexcept
      : path_(std::move(o.path_)), tmp_(std::move(o.tmp_)), fd_(std::exchange(o.fd_, -1)) {
    o.tmp_.clear();
  }
  durable_file& operator=(durable_file&& o) noexcept {
    if (this != &o) {
      abandon();
      path_ = std::move(o.path_);
      tmp_ = std::move(o.tmp_);
      o.tmp_.clear();
      fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
  }
  durable_file(const durable_file&) = delete;
  durable_file& operator=(const durable_file&) = delete;
  ~durable_file() { abandon(); }

  //! The temporary file's descriptor (write with pwrite_all) and name (for messages).
  [[nodiscard]] int fd() const noexcept { return fd_; }
  [[nodiscard]] const std::string& temporary() const noexcept { return tmp_; }

  //! Sizes the temporary file to `bytes` (zero-filled, sparse where the file system allows), so
  //! that its parts can be written in any order.
  template <class Fail> void resize(std::uint64_t bytes, Fail&& fail) {
    if (::ftruncate(fd_, static_cast<off_t>(bytes)) != 0)
      fail_abandoning(fail, "cannot size (to " + std::to_string(bytes) + " bytes)", tmp_, errno);
  }

  //! fsync, rename over the target, fsync of its directory. A failure before the rename
  //! abandons the file; a failed directory fsync is reported with the new file in place.
  template <class Fail> void publish(Fail&& fail) {
    if (::fsync(fd_) != 0) fail_abandoning(fail, "cannot fsync", tmp_, errno);
    const int fd = std::exchange(fd_, -1);
    if (::close(fd) != 0) fail_abandoning(fail, "cannot close", tmp_, errno);
    if (::rename(tmp_.c_str(), path_.c_str()) != 0)
      fail_abandoning(fail, "cannot rename the temporary file onto", path_, errno);
    tmp_.clear();
    const std::string dir = parent_dir(path_);
    if (const int err = fsync_dir(dir); err != 0) fail("cannot fsync directory", dir, err);
  }

  //! Closes and removes the temporary file (no-op once published or abandoned).
  void abandon() noexcept {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
    if (!tmp_.empty()) ::unlink(tmp_.c_str());
    tmp_.clear();
  }

private:
  template <class Fail> void fail_abandoning(Fail& fail, std::string_view what, std::string where, int err) {
    abandon();
    fail(what, where, err);
  }

  std::string path_;
  std::string tmp_;
  int fd_ = -1;
};

//! Creates or replaces `path` durably (see durable_file): `fill(fd, temporary_name)` writes the
//! content and may throw, which removes the temporary file and leaves `path` untouched.
template <class Fill, class Fail> void write_durable(const std::string& path, Fill&& fill, Fail&& fail) {
  durable_file f(path, fail);
  fill(f.fd(), f.temporary());
  f.publish(fail);
}

} // namespace detail
RLPT_NAMESPACE_END
