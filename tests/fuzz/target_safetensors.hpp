// SPDX-License-Identifier: Apache-2.0
// Fuzz target: a whole safetensors file. The bytes go through parse_safetensors_header (in
// memory) and through the reader API (safetensors_file over an in-memory file, mapped as a
// real file would be). Accepted files must agree on both paths, every tensor must lie inside
// the data, and writing the parsed tensors back gives a file that parses to the same tensors.
// A file with rlpt's dense metadata (rlpt.kind, rlpt.manifest, rlpt.pieces) is also replayed
// by a receiving safetensors_transport, as a receiver polling the directory would: every
// message it makes must be a well-formed frame of the update the manifest describes.
#pragma once

#include "fuzz.hpp"

#include <rlpt/sync/safetensors.hpp>

#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

namespace rlpt::fuzz {

namespace detail {

//! An anonymous in-memory file with `bytes`, reachable by path (/proc/self/fd/N).
class memory_file {
public:
  explicit memory_file(std::span<const std::byte> bytes) {
    fd_ = ::memfd_create("rlpt-fuzz", MFD_CLOEXEC);
    if (fd_ < 0) throw std::runtime_error("memfd_create failed");
    std::size_t done = 0;
    while (done < bytes.size()) {
      const ssize_t n = ::write(fd_, bytes.data() + done, bytes.size() - done);
      if (n <= 0) {
        ::close(fd_);
        throw std::runtime_error("write to memfd failed");
      }
      done += static_cast<std::size_t>(n);
    }
  }
  memory_file(const memory_file&) = delete;
  memory_file& operator=(const memory_file&) = delete;
  ~memory_file() { ::close(fd_); }
  [[nodiscard]] std::string path() const { return fmt::format("/proc/self/fd/{}", fd_); }

private:
  int fd_ = -1;
};

inline void check_same_header(const sync::safetensors_header& a, const sync::safetensors_header& b) {
  RLPT_FUZZ_ASSERT(a.tensors.size() == b.tensors.size(), "{} vs {} tensors", a.tensors.size(), b.tensors.size());
  RLPT_FUZZ_ASSERT(a.metadata == b.metadata);
  for (std::size_t i = 0; i < a.tensors.size(); ++i) {
    const auto& x = a.tensors[i];
    const auto& y = b.tensors[i];
    RLPT_FUZZ_ASSERT(x.name == y.name && x.dtype == y.dtype && x.shape == y.shape && x.begin == y.begin &&
                         x.end == y.end,
                     "tensor {}", i);
  }
}

//! A directory for the replay, made once per process and removed at exit.
class temp_dir {
public:
  temp_dir() {
    char name[] = "/tmp/rlpt-fuzz-XXXXXX";
    if (::mkdtemp(name) == nullptr) throw std::runtime_error("mkdtemp failed");
    path = name;
  }
  temp_dir(const temp_dir&) = delete;
  temp_dir& operator=(const temp_dir&) = delete;
  ~temp_dir() { ::rmdir(path.c_str()); }
  std::string path;
};

//! Messages replayed so far (the replay test checks that the seeds reach the replay).
inline std::uint64_t replayed_messages = 0;

//! Replays an rlpt dense file through a receiving transport and checks the messages.
inline void replay_dense(std::span<const std::byte> file, const sync::safetensors_header& h) {
  const auto kind = h.meta("rlpt.kind");
  const auto mj = h.meta("rlpt.manifest");
  if (!kind || *kind != "dense" || !mj) return;
  sync::manifest m;
  try {
    m = sync::manifest::from_json(*mj);
  } catch (const rlpt::error&) {
    return; // the transport rejects it the same way (checked by the manifest target)
  }
  static temp_dir dir;
  struct file_guard {
    std::string path;
    ~file_guard() { ::unlink(path.c_str()); }
  } guard{fmt::format("{}/rlpt-v{:020}.safetensors", dir.path, m.version())};
  {
    const int fd = ::open(guard.path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) throw std::runtime_error("cannot create the replay file");
    sync::detail::write_all(fd, file.data(), file.size(), 0, guard.path);
    ::close(fd);
  }
  sync::safetensors_transport in(dir.path, sync::role::receiver, {.scan_interval = std::chrono::milliseconds(1)});
  std::uint64_t messages = 0, buckets = 0;
  while (const auto msg = in.receive(sync::clock::now())) {
    const sync::frame f = sync::decode_frame(msg->meta, "replay"); // rlpt's own frames: never rejected
    RLPT_FUZZ_ASSERT(f.version == m.version() && f.payload_bytes == msg->payload.size());
    switch (f.type) {
    case sync::frame_type::begin: {
      RLPT_FUZZ_ASSERT(messages == 0 && f.count == m.layout_hash());
      RLPT_FUZZ_ASSERT(sync::manifest::from_json(sync::as_chars(f.body)).to_json() == m.to_json());
      break;
    }
    case sync::frame_type::bucket:
      RLPT_FUZZ_ASSERT(f.index == buckets && f.index < m.bucket_count(), "bucket {} of {}", f.index, m.bucket_count());
      RLPT_FUZZ_ASSERT(msg->payload.size() == m.bucket_size(f.index) && f.body.size() == 8 * m.pieces(f.index).size());
      ++buckets;
      break;
    case sync::frame_type::commit:
      RLPT_FUZZ_ASSERT(buckets == m.bucket_count() && f.body.size() == 8 * m.size());
      break;
    default:
      RLPT_FUZZ_ASSERT(false, "the replay made a {} frame", sync::name(f.type));
    }
    in.release();
    ++messages;
    ++replayed_messages;
    RLPT_FUZZ_ASSERT(messages <= 2 + m.bucket_count(), "{} messages for {} buckets", messages, m.bucket_count());
  }
  RLPT_FUZZ_ASSERT(messages == 0 || messages == 2 + m.bucket_count(), "the replay stopped after {} messages", messages);
}

} // namespace detail

inline outcome safetensors(input in) {
  const std::vector<std::byte> file = to_bytes(in);
  sync::safetensors_header h;
  try {
    h = sync::parse_safetensors_header(file, file.size(), "fuzz");
  } catch (const rlpt::error&) {
    // The reader must reject the same file (it parses the same bytes, mapped).
    const detail::memory_file f(file);
    try {
      const sync::safetensors_file sf(f.path());
      RLPT_FUZZ_ASSERT(false, "the reader accepted a file the header parser rejects");
    } catch (const rlpt::error&) {}
    return outcome::rejected;
  }

  // Invariants of an accepted header: the tensors tile the data section exactly.
  RLPT_FUZZ_ASSERT(8 + h.header_bytes + h.data_bytes == file.size(), "{} + {} + 8 != {}", h.header_bytes, h.data_bytes,
                   file.size());
  std::uint64_t at = 0;
  for (const auto& t : h.tensors) {
    RLPT_FUZZ_ASSERT(t.begin == at && t.end >= t.begin && t.end <= h.data_bytes);
    RLPT_FUZZ_ASSERT(t.end - t.begin == sync::detail::tensor_nbytes(t.name, t.dtype, t.shape));
    RLPT_FUZZ_ASSERT(h.find(t.name) == &t, "tensor name \"{}\" is not unique", t.name);
    at = t.end;
  }
  RLPT_FUZZ_ASSERT(at == h.data_bytes);

  // The reader API over the same bytes as a file: same header, views inside the mapping.
  const detail::memory_file f(file);
  const sync::safetensors_file sf(f.path());
  detail::check_same_header(h, sf.header());
  const std::span<const std::byte> data(file.data() + 8 + h.header_bytes, static_cast<std::size_t>(h.data_bytes));
  for (const auto& t : sf.header().tensors) {
    const sync::tensor_view v = sf.tensor(t.name);
    RLPT_FUZZ_ASSERT(v.bytes.data() >= sf.data().data() &&
                     v.bytes.data() + v.bytes.size() <= sf.data().data() + sf.data().size());
    RLPT_FUZZ_ASSERT(
        same(v.bytes, data.subspan(static_cast<std::size_t>(t.begin), static_cast<std::size_t>(t.end - t.begin))));
  }

  // Round trip: write the tensors (and metadata) back, parse again, compare.
  std::vector<sync::tensor_ref> refs;
  for (const auto& t : h.tensors)
    refs.push_back({t.name, t.dtype, t.shape, t.end > t.begin ? data.data() + t.begin : nullptr});
  std::vector<std::byte> again;
  try {
    again = sync::serialize_safetensors(refs, h.metadata);
  } catch (const rlpt::error& e) {
    // The writer refuses a tensor named __metadata__ only; the reader never yields one.
    RLPT_FUZZ_ASSERT(false, "the writer refused what the reader accepted: {}", e.what());
  }
  const sync::safetensors_header h2 = sync::parse_safetensors_header(again, again.size(), "fuzz round trip");
  RLPT_FUZZ_ASSERT(h2.tensors.size() == h.tensors.size());
  auto sorted_meta = [](std::vector<std::pair<std::string, std::string>> m) {
    std::sort(m.begin(), m.end());
    return m;
  };
  RLPT_FUZZ_ASSERT(sorted_meta(h2.metadata) == sorted_meta(h.metadata));
  const std::span<const std::byte> data2(again.data() + 8 + h2.header_bytes, static_cast<std::size_t>(h2.data_bytes));
  for (const auto& t : h.tensors) {
    const sync::safetensors_entry* u = h2.find(t.name);
    RLPT_FUZZ_ASSERT(u != nullptr && u->dtype == t.dtype && u->shape == t.shape, "tensor \"{}\"", t.name);
    RLPT_FUZZ_ASSERT(
        same(data.subspan(static_cast<std::size_t>(t.begin), static_cast<std::size_t>(t.end - t.begin)),
             data2.subspan(static_cast<std::size_t>(u->begin), static_cast<std::size_t>(u->end - u->begin))));
  }
  // What rlpt wrote is canonical: writing it again gives the same bytes.
  std::vector<sync::tensor_ref> refs2;
  for (const auto& t : h2.tensors)
    refs2.push_back({t.name, t.dtype, t.shape, t.end > t.begin ? data2.data() + t.begin : nullptr});
  RLPT_FUZZ_ASSERT(same(sync::serialize_safetensors(refs2, h2.metadata), again));

  detail::replay_dense(file, h);
  return outcome::accepted;
}

} // namespace rlpt::fuzz
