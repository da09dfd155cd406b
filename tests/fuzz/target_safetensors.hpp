// SPDX-License-Identifier: Apache-2.0
// Fuzz target: a whole safetensors file. The bytes go through parse_safetensors_header (in
// memory) and through the reader API (safetensors_file over an in-memory file, mapped as a
// real file would be). Accepted files must agree on both paths, every tensor must lie inside
// the data, and writing the parsed tensors back gives a file that parses to the same tensors.
#pragma once

#include "fuzz.hpp"

#include <rlpt/sync/safetensors.hpp>

#include <sys/mman.h>
#include <unistd.h>

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
    RLPT_FUZZ_ASSERT(x.name == y.name && x.dtype == y.dtype && x.shape == y.shape && x.begin == y.begin && x.end == y.end,
                     "tensor {}", i);
  }
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
    } catch (const rlpt::error&) {
    }
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
    RLPT_FUZZ_ASSERT(v.bytes.data() >= sf.data().data() && v.bytes.data() + v.bytes.size() <= sf.data().data() + sf.data().size());
    RLPT_FUZZ_ASSERT(same(v.bytes, data.subspan(static_cast<std::size_t>(t.begin), static_cast<std::size_t>(t.end - t.begin))));
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
    RLPT_FUZZ_ASSERT(same(data.subspan(static_cast<std::size_t>(t.begin), static_cast<std::size_t>(t.end - t.begin)),
                          data2.subspan(static_cast<std::size_t>(u->begin), static_cast<std::size_t>(u->end - u->begin))));
  }
  // What rlpt wrote is canonical: writing it again gives the same bytes.
  std::vector<sync::tensor_ref> refs2;
  for (const auto& t : h2.tensors)
    refs2.push_back({t.name, t.dtype, t.shape, t.end > t.begin ? data2.data() + t.begin : nullptr});
  RLPT_FUZZ_ASSERT(same(sync::serialize_safetensors(refs2, h2.metadata), again));
  return outcome::accepted;
}

} // namespace rlpt::fuzz
