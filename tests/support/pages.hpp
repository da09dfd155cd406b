// SPDX-License-Identifier: Apache-2.0
// Fresh anonymous mappings and a count of their resident pages: how the tests check that a writer
// maps a fresh output's pages in one call before it stores (core/copy.hpp, prefault_for_write).
// Linux only.
#pragma once

#if defined(__linux__)
#include <doctest/doctest.h>

#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <vector>

namespace rlpt::test {

inline std::size_t page_size() { return static_cast<std::size_t>(::sysconf(_SC_PAGESIZE)); }

//! `bytes` of fresh anonymous memory (no page mapped yet), unmapped when it goes out of scope.
class fresh_mapping {
public:
  explicit fresh_mapping(std::size_t bytes) : bytes_(bytes) {
    void* m = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    REQUIRE(m != MAP_FAILED);
    data_ = static_cast<unsigned char*>(m);
  }
  fresh_mapping(const fresh_mapping&) = delete;
  fresh_mapping& operator=(const fresh_mapping&) = delete;
  ~fresh_mapping() { ::munmap(data_, bytes_); }

  template <class T> [[nodiscard]] T* as() const noexcept { return reinterpret_cast<T*>(data_); }
  [[nodiscard]] std::size_t bytes() const noexcept { return bytes_; }
  [[nodiscard]] std::size_t pages() const noexcept { return bytes_ / page_size(); }

  //! Pages of [from, to) (byte offsets, page-aligned `from`) that are mapped.
  [[nodiscard]] std::size_t resident(std::size_t from, std::size_t to) const {
    std::vector<unsigned char> v((to - from + page_size() - 1) / page_size());
    REQUIRE(::mincore(data_ + from, to - from, v.data()) == 0);
    std::size_t k = 0;
    for (const unsigned char c : v) k += c & 1u;
    return k;
  }
  [[nodiscard]] std::size_t resident() const { return resident(0, bytes_); }

private:
  unsigned char* data_ = nullptr;
  std::size_t bytes_ = 0;
};

//! Whether this kernel has MADV_POPULATE_WRITE (Linux 5.14 and later): without it the writers'
//! mapping is a no-op and the stores fault the pages in as before.
inline bool kernel_populates() {
#ifdef MADV_POPULATE_WRITE
  const fresh_mapping probe(page_size());
  return ::madvise(probe.as<unsigned char>(), page_size(), MADV_POPULATE_WRITE) == 0;
#else
  return false;
#endif
}

} // namespace rlpt::test
#endif
