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
#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>
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

//! The /proc/self/smaps fields of the mapping that holds `addr`: its `VmFlags` line (where "hg"
//! says madvise(MADV_HUGEPAGE) covers it) and its AnonHugePages in KiB. Mappings split where an
//! madvise covers part of one, so each range advised differently has its own entry.
struct smaps_entry {
  bool found = false;
  std::uintptr_t begin = 0, end = 0;
  std::string flags;
  std::size_t anon_huge_kb = 0;

  [[nodiscard]] bool has_flag(const std::string& f) const {
    return (" " + flags + " ").find(" " + f + " ") != std::string::npos;
  }
};

inline smaps_entry smaps_of(const void* addr) {
  const auto a = reinterpret_cast<std::uintptr_t>(addr);
  std::ifstream in("/proc/self/smaps");
  smaps_entry e;
  std::string line;
  bool inside = false;
  while (std::getline(in, line)) {
    unsigned long lo = 0, hi = 0;
    char dash = 0;
    std::istringstream head(line);
    if (line.find(':') == std::string::npos || line.find('-') < line.find(':')) {
      if (head >> std::hex >> lo >> dash >> hi && dash == '-') {
        if (inside) break; // the entry after ours
        inside = a >= lo && a < hi;
        if (inside) e.found = true, e.begin = lo, e.end = hi;
        continue;
      }
    }
    if (!inside) continue;
    if (line.rfind("AnonHugePages:", 0) == 0) e.anon_huge_kb = std::stoul(line.substr(14));
    if (line.rfind("VmFlags:", 0) == 0) e.flags = line.substr(9);
  }
  return e;
}

//! The system's transparent-huge-page mode ("always", "madvise", "never"), "" where the kernel has none.
inline std::string thp_mode() {
  std::ifstream in("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string all;
  std::getline(in, all);
  const auto l = all.find('['), r = all.find(']');
  return l == std::string::npos || r == std::string::npos ? std::string{} : all.substr(l + 1, r - l - 1);
}

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
