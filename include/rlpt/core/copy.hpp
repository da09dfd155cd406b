// SPDX-License-Identifier: Apache-2.0
//! @file
//! A bulk copy that stays fast when the destination was just allocated.
//!
//! glibc's memcpy moves a large block with `rep movsb` (or, beyond 3/4 of the shared cache, with
//! streaming stores). Into freshly allocated memory every page's first touch faults in the middle
//! of that copy, and the copy then takes about 1.25x as long as a loop of plain vector stores
//! (1 GiB in 32 MiB tensors: 0.46 against 0.37 CPU seconds on an AVX-512 Xeon); into memory that
//! is already mapped both run at the same speed. Readers that fill buffers their caller has just
//! allocated (a checkpoint loaded into new tensors) copy with `copy_bytes`.
//!
//! Faulting each page in on its first store costs more than the copy of it: on Linux a large copy
//! into pages not mapped yet asks the kernel to map them all first, in one call
//! (`prefault_for_write`). 1 GiB from a file in /dev/shm into 32 MiB buffers just allocated, one
//! thread, CPU time (AMD EPYC with AVX-512): 630-645 ms with the faults among the stores,
//! 475-520 ms with the pages mapped first (docs/performance.md, safetensors read).
#pragma once

#include <rlpt/config.hpp>
#include <rlpt/core/cpu.hpp>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#if defined(__linux__)
#include <sys/mman.h>
#include <unistd.h>
#endif

RLPT_NAMESPACE_BEGIN
namespace detail {

#if defined(__GNUC__) || defined(__clang__)
//! Whether copy_bytes has AVX-512 and AVX2 clones to pick from at run time.
#if RLPT_ISA_DISPATCH() && !defined(__CUDACC__)
#define RLPT_COPY_CLONES() 1
#else
#define RLPT_COPY_CLONES() 0
#endif

//! A W-byte vector of bytes with no alignment (one alias per width: GCC drops vector_size on a
//! dependent alias).
template <int W> struct copy_block;
// NOLINTBEGIN(modernize-use-using): the attribute needs the typedef form
template <> struct copy_block<16> { typedef unsigned char type __attribute__((vector_size(16), aligned(1))); };
template <> struct copy_block<32> { typedef unsigned char type __attribute__((vector_size(32), aligned(1))); };
template <> struct copy_block<64> { typedef unsigned char type __attribute__((vector_size(64), aligned(1))); };
// NOLINTEND(modernize-use-using)

//! 64 bytes a step with plain W-byte loads and stores, W the widest vector of the clone's
//! instruction set: g++ 12 moved a 64-byte vector in a build without AVX-512 as four 16-byte
//! pieces bounced through the stack (seven stores per 64 bytes instead of two).
template <int W>
__attribute__((always_inline)) inline void copy_blocks(unsigned char* d, const unsigned char* s,
                                                       std::size_t n) noexcept {
  using block = typename copy_block<W>::type;
  std::size_t i = 0;
  for (; i + 64 <= n; i += 64)
    for (std::size_t k = 0; k < 64; k += W) {
      block b;
      __builtin_memcpy(&b, s + i + k, W);
      __builtin_memcpy(d + i + k, &b, W);
    }
  if (i < n) std::memcpy(d + i, s + i, n - i); // memcpy with a null pointer is undefined even for 0 bytes
}

#if RLPT_COPY_CLONES()
__attribute__((target("avx512f"))) inline void copy_blocks_avx512(unsigned char* d, const unsigned char* s,
                                                                  std::size_t n) noexcept {
  copy_blocks<64>(d, s, n);
}
__attribute__((target("avx2"))) inline void copy_blocks_avx2(unsigned char* d, const unsigned char* s,
                                                             std::size_t n) noexcept {
  copy_blocks<32>(d, s, n);
}
#endif
#endif

//! Whether RLPT_HUGE_PAGES (its value, or null where unset) leaves the huge-page request on: all
//! but "0" do.
inline bool huge_pages_wanted(const char* env) noexcept { return env == nullptr || std::strcmp(env, "0") != 0; }

#if defined(__linux__) && defined(MADV_POPULATE_WRITE)
//! The whole pages inside [dst, dst + n) when n is at least 1 MiB and its first or its last whole
//! page is not mapped yet (a buffer just allocated); otherwise an empty range.
struct fresh_pages {
  unsigned char* begin = nullptr;
  unsigned char* end = nullptr;

  fresh_pages(void* dst, std::size_t n) noexcept {
    if (n < (std::size_t{1} << 20)) return;
    auto* const d = static_cast<unsigned char*>(dst);
    const auto at = reinterpret_cast<std::uintptr_t>(d);
    unsigned char* const b = d + (page_size() - at % page_size()) % page_size();
    unsigned char* const e = d + n - (at + n) % page_size();
    if (e <= b) return;
    unsigned char first = 0, last = 0;
    if (::mincore(b, 1, &first) != 0 || ::mincore(e - page_size(), 1, &last) != 0) return;
    if ((first & 1u) != 0 && (last & 1u) != 0) return;
    begin = b, end = e;
  }
  [[nodiscard]] bool empty() const noexcept { return begin == end; }
  static std::size_t page_size() noexcept {
    static const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
    return page;
  }
};

//! madvise(MADV_HUGEPAGE) over the huge pages (what one page-table page maps: 2 MiB with 4 KiB
//! pages) that lie whole inside `r`, unless the environment has RLPT_HUGE_PAGES=0.
inline void advise_huge(const fresh_pages& r) noexcept {
#if defined(MADV_HUGEPAGE)
  static const bool wanted = huge_pages_wanted(std::getenv("RLPT_HUGE_PAGES"));
  const std::size_t huge = fresh_pages::page_size() * (fresh_pages::page_size() / sizeof(void*));
  const auto h0 = (reinterpret_cast<std::uintptr_t>(r.begin) + huge - 1) / huge * huge;
  const auto h1 = reinterpret_cast<std::uintptr_t>(r.end) / huge * huge;
  if (wanted && h1 > h0) (void)::madvise(reinterpret_cast<void*>(h0), h1 - h0, MADV_HUGEPAGE);
#else
  (void)r;
#endif
}
#endif

//! Asks the kernel to back [dst, dst + n), a buffer just allocated that the caller is about to
//! write, with transparent huge pages where whole ones fit: only the caller's range, and only
//! where the system's THP mode is `madvise` (a common default) does it change anything. A fresh
//! page's first touch is most of the cost of writing a new output: allocating 64 MiB and writing
//! it took 20.8 ms of CPU time in 4 KiB pages and 13.1 ms with this (`bench_limits fresh
//! 67108864`, Xeon VM, docs/advantage.md). Does nothing where the first and last
//! whole pages are mapped already (the buffer is being reused) or below 1 MiB;
//! `RLPT_HUGE_PAGES=0` in the environment turns it off. prefault_for_write calls it; a writer that
//! maps its output a window at a time calls it once over the whole output first.
inline void advise_huge_pages(void* dst, std::size_t n) noexcept {
#if defined(__linux__) && defined(MADV_POPULATE_WRITE)
  advise_huge(fresh_pages(dst, n));
#else
  (void)dst, (void)n;
#endif
}

//! Maps the pages of [dst, dst + n), which the caller is about to write whole, in one call where
//! they are not mapped yet (a buffer just allocated): madvise(MADV_POPULATE_WRITE) instead of a
//! fault per page among the stores, in huge pages where whole ones fit (advise_huge_pages). Where
//! the first and last whole pages are mapped already it does nothing (populating mapped pages
//! walks the page tables for nothing: +25 ms per GiB). Best effort: where the call fails (a kernel
//! before 5.14, a region it refuses) the stores fault the pages in as before. Below 1 MiB it does
//! nothing: a fault or two cost less than the calls.
inline void prefault_for_write(void* dst, std::size_t n) noexcept {
#if defined(__linux__) && defined(MADV_POPULATE_WRITE)
  const fresh_pages r(dst, n);
  if (r.empty()) return;
  advise_huge(r);
  (void)::madvise(r.begin, static_cast<std::size_t>(r.end - r.begin), MADV_POPULATE_WRITE);
#else
  (void)dst, (void)n;
#endif
}

//! prefault_for_write over the elements of a contiguous output (a view, a span, a vector) that
//! the caller is about to write whole: a writer of a large output calls it before its stores.
template <class Out> void prefault_for_write(const Out& out) noexcept {
  prefault_for_write(out.data(), static_cast<std::size_t>(out.size()) * sizeof(*out.data()));
}

//! Copies n bytes from src to dst (which must not overlap) with plain vector stores, the pages of
//! dst mapped first where they are not (prefault_for_write). With n = 0 either pointer may be null.
inline void copy_bytes(void* dst, const void* src, std::size_t n) noexcept {
  prefault_for_write(dst, n);
  auto* d = static_cast<unsigned char*>(dst);
  const auto* s = static_cast<const unsigned char*>(src);
#if defined(__GNUC__) || defined(__clang__)
#if RLPT_COPY_CLONES()
  if (cpu_has_avx512()) return copy_blocks_avx512(d, s, n);
  if (cpu_has_avx2()) return copy_blocks_avx2(d, s, n);
#endif
  copy_blocks<16>(d, s, n);
#else
  if (n != 0) std::memcpy(d, s, n); // no vector extensions: the library's copy
#endif
}

} // namespace detail
RLPT_NAMESPACE_END
