// SPDX-License-Identifier: Apache-2.0
//! @file
//! XXH3-64 checksums (Debian's libxxhash-dev) for buckets, tensors and frames, and a fused
//! copy-and-hash that reads the source once.
//!
//! By default xxHash is compiled inline (XXH_INLINE_ALL: nothing to link, SSE2 on x86-64).
//! Define RLPT_SYNC_XXHASH_DISPATCH and link `xxhash` to use the library's runtime dispatch
//! (AVX2 / AVX-512 where the CPU has them): the same hashes, 2-3x faster on large buffers.
#pragma once

#include <rlpt/config.hpp>
#include <rlpt/core/cpu.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif
#include <optional>
#include <string>
#include <string_view>

#if defined(RLPT_SYNC_XXHASH_DISPATCH)
#if !defined(XXH_DISPATCH_DISABLE_REPLACE)
#define XXH_DISPATCH_DISABLE_REPLACE
#endif
#if !defined(XXH_STATIC_LINKING_ONLY)
#define XXH_STATIC_LINKING_ONLY // XXH3_state_t by value
#endif
#include <xxh_x86dispatch.h>
#define RLPT_SYNC_XXH3_64 XXH3_64bits_dispatch
#define RLPT_SYNC_XXH3_UPDATE XXH3_64bits_update_dispatch
#else
#if !defined(XXH_INLINE_ALL)
#define XXH_INLINE_ALL
#define RLPT_SYNC_UNDEF_XXH_INLINE_ALL
#endif
#include <xxhash.h>
#if defined(RLPT_SYNC_UNDEF_XXH_INLINE_ALL)
#undef XXH_INLINE_ALL
#undef RLPT_SYNC_UNDEF_XXH_INLINE_ALL
#endif
#define RLPT_SYNC_XXH3_64 XXH3_64bits
#define RLPT_SYNC_XXH3_UPDATE XXH3_64bits_update
#endif

RLPT_NAMESPACE_BEGIN
namespace sync {

//! Incremental XXH3-64: the same value as xxh3() over the concatenated updates.
class xxh3_stream {
public:
  // NOLINTNEXTLINE(cppcoreguidelines-pro-type-member-init): reset() initializes state_
  xxh3_stream() noexcept { reset(); }
  void reset() noexcept { XXH3_64bits_reset(&state_); }
  void update(const void* data, std::size_t bytes) noexcept {
    if (bytes != 0) RLPT_SYNC_XXH3_UPDATE(&state_, data, bytes);
  }
  [[nodiscard]] std::uint64_t digest() const noexcept { return XXH3_64bits_digest(&state_); }

private:
  XXH3_state_t state_;
};

//! Copies of at least this many bytes write the destination with streaming stores, reading four
//! pages of the source side by side (below it, regular stores: the destination stays in cache
//! for what follows).
inline constexpr std::size_t copy_hash_streaming_bytes = std::size_t{4} << 20;

namespace detail {

inline constexpr std::size_t page_bytes = 4096;
//! Pages the large copy reads side by side. The hardware prefetchers stop at page boundaries, so
//! one sequential stream stalls at every page; four streams keep enough lines in flight (glibc's
//! large memcpy reads four pages at once for the same reason). Measured on the development
//! machine (AVX-512 Xeon, 2 GiB from memory): 1 page 7.3, 2 pages 9.8, 4 pages 10.1, 8 pages
//! 8.2 GB/s copied and hashed, memcpy 12.7.
inline constexpr std::size_t interleaved_pages = 4;
//! The bounce buffer of the large path: the block is hashed there, in L1.
inline constexpr std::size_t block_bytes = page_bytes * interleaved_pages;

#if defined(__SSE2__) && (defined(__GNUC__) || defined(__clang__))
#define RLPT_SYNC_STREAMING_COPY() 1
//! W-byte vectors (GCC/clang vector extensions: no <immintrin.h>, which costs 0.3 s of compile
//! time in every TU).
using vec16 = long long __attribute__((vector_size(16)));
using vec32 = long long __attribute__((vector_size(32)));
using vec64 = long long __attribute__((vector_size(64)));
template <std::size_t W> struct vector_of; // (GCC drops vector_size on a dependent alias, hence one alias per width)
template <> struct vector_of<16> { using type = vec16; };
template <> struct vector_of<32> { using type = vec32; };
template <> struct vector_of<64> { using type = vec64; };
template <std::size_t W> using line_vector = typename vector_of<W>::type;

//! A streaming store of one aligned vector: no read-for-ownership, no cache pollution.
__attribute__((always_inline)) inline void stream_store(unsigned char* d, vec16 v) noexcept {
#if defined(__clang__)
  __builtin_nontemporal_store(v, reinterpret_cast<vec16*>(d));
#else
  __builtin_ia32_movntdq(reinterpret_cast<vec16*>(d), v);
#endif
}

//! One 64-byte line in W-byte vectors: loaded from the source, stored into the bounce buffer and
//! streamed into the 64-byte aligned destination.
template <std::size_t W> struct line { line_vector<W> v[64 / W]; };

//! Copies one block: the four pages of s side by side, a line of each at a time, into `bounce`
//! and `d`. `store` streams one vector (per instruction set; by pointer, as a vector argument
//! wider than the caller's target would change the ABI).
template <std::size_t W, class Store>
__attribute__((always_inline)) inline void copy_block(unsigned char* bounce, unsigned char* d, const unsigned char* s,
                                                      Store store) noexcept {
  for (std::size_t i = 0; i < page_bytes; i += 64) {
    line<W> l[interleaved_pages];
    for (std::size_t k = 0; k < interleaved_pages; ++k) __builtin_memcpy(&l[k], s + k * page_bytes + i, 64);
    for (std::size_t k = 0; k < interleaved_pages; ++k)
      for (std::size_t q = 0; q < 64 / W; ++q) {
        unsigned char* at = bounce + k * page_bytes + i + q * W;
        *reinterpret_cast<line_vector<W>*>(at) = l[k].v[q];
        store(d + k * page_bytes + i + q * W, &l[k].v[q]);
      }
  }
}

inline void copy_block_sse2(unsigned char* bounce, unsigned char* d, const unsigned char* s) noexcept {
  copy_block<16>(bounce, d, s, [](unsigned char* at, const vec16* v) { stream_store(at, *v); });
}

#if RLPT_ISA_DISPATCH() && !defined(__CUDACC__)
#define RLPT_SYNC_COPY_CLONES() 1
__attribute__((target("avx2"), always_inline)) inline void stream_store(unsigned char* d, vec32 v) noexcept {
#if defined(__clang__)
  __builtin_nontemporal_store(v, reinterpret_cast<vec32*>(d));
#else
  __builtin_ia32_movntdq256(reinterpret_cast<vec32*>(d), v);
#endif
}
__attribute__((target("avx512f"), always_inline)) inline void stream_store(unsigned char* d, vec64 v) noexcept {
#if defined(__clang__)
  __builtin_nontemporal_store(v, reinterpret_cast<vec64*>(d));
#else
  __builtin_ia32_movntdq512(reinterpret_cast<vec64*>(d), v);
#endif
}
__attribute__((target("avx2"))) inline void copy_block_avx2(unsigned char* bounce, unsigned char* d,
                                                            const unsigned char* s) noexcept {
  copy_block<32>(
      bounce, d, s, [](unsigned char* at, const vec32* v) __attribute__((target("avx2"))) { stream_store(at, *v); });
}
__attribute__((target("avx512f"))) inline void copy_block_avx512(unsigned char* bounce, unsigned char* d,
                                                                 const unsigned char* s) noexcept {
  copy_block<64>(
      bounce, d, s, [](unsigned char* at, const vec64* v) __attribute__((target("avx512f"))) { stream_store(at, *v); });
}
#else
#define RLPT_SYNC_COPY_CLONES() 0
#endif

using copy_block_fn = void (*)(unsigned char*, unsigned char*, const unsigned char*) noexcept;

//! The widest block copy this CPU runs (chosen once per call of copy_hash, not per block).
[[nodiscard]] inline copy_block_fn best_copy_block() noexcept {
#if RLPT_SYNC_COPY_CLONES()
  if (rlpt::detail::cpu_has_avx512()) return copy_block_avx512;
  if (rlpt::detail::cpu_has_avx2()) return copy_block_avx2;
#endif
  return copy_block_sse2;
}
#else
#define RLPT_SYNC_STREAMING_COPY() 0
#endif

} // namespace detail

//! XXH3-64 (seed 0) of a byte range: the checksum of every bucket piece, tensor and frame.
//! One-shot: the library's own loop already prefetches what it needs (a paged loop with
//! non-temporal prefetches ran at half its rate from memory on the development machine).
[[nodiscard]] inline std::uint64_t xxh3(const void* data, std::size_t bytes) noexcept {
  return RLPT_SYNC_XXH3_64(data, bytes);
}

//! Copies `bytes` from src to dst and returns XXH3-64 of the bytes written to dst (the value
//! xxh3() gives for them), in one pass over memory. Each byte of the source is read exactly
//! once, into a bounce buffer that stays in L1; it is hashed there and written to dst from
//! there. So the checksum is always that of the bytes dst received, even when the source or
//! the destination is memory another process may write (a shared-memory slot: the receiver's
//! source, the sender's destination): a source that changes during the copy gives a checksum
//! of what was copied, and a destination changed afterwards fails its check at the other end.
//! Up to a page: one-shot XXH3. Below copy_hash_streaming_bytes, a page at a time with regular
//! stores. Larger (beyond the caches, where regular stores would read every destination line
//! first and evict useful ones): blocks of four pages read side by side, written with streaming
//! stores, so memory sees one read and one write per byte (glibc's memcpy switches to streaming
//! stores only at 3/4 of the shared cache, which copies of single tensors rarely reach).
inline std::uint64_t copy_hash(void* dst, const void* src, std::size_t bytes) noexcept {
  constexpr std::size_t page = detail::page_bytes;
  alignas(64) unsigned char bounce[detail::block_bytes];
  auto* d = static_cast<unsigned char*>(dst);
  const auto* s = static_cast<const unsigned char*>(src);
  if (bytes <= page) {
    if (bytes == 0) return xxh3(dst, 0);
    std::memcpy(bounce, s, bytes);
    std::memcpy(d, bounce, bytes);
    return RLPT_SYNC_XXH3_64(bounce, bytes);
  }
  xxh3_stream h;
  // A page at a time through the bounce buffer, with regular stores.
  auto paged = [&](std::size_t from, std::size_t to) {
    for (std::size_t off = from; off < to; off += page) {
      const std::size_t n = std::min(page, to - off);
      std::memcpy(bounce, s + off, n);
#if defined(__GNUC__) || defined(__clang__)
      // The hash and the store read `bounce`, never the source again (no re-load of s is folded in).
      __asm__ __volatile__("" : : "r"(bounce) : "memory");
#endif
      h.update(bounce, n);
      std::memcpy(d + off, bounce, n);
    }
  };
#if RLPT_SYNC_STREAMING_COPY()
  if (bytes >= copy_hash_streaming_bytes) {
    // The head up to a 64-byte aligned destination, whole blocks with streaming stores, the tail.
    const std::size_t head = (64 - (reinterpret_cast<std::uintptr_t>(d) & 63u)) & 63u;
    const std::size_t body = (bytes - head) / detail::block_bytes * detail::block_bytes;
    paged(0, head);
    const detail::copy_block_fn copy_block = detail::best_copy_block();
    for (std::size_t off = head; off < head + body; off += detail::block_bytes) {
      copy_block(bounce, d + off, s + off);
      h.update(bounce, detail::block_bytes);
    }
    _mm_sfence(); // the tail's regular stores and a later release order after the streaming ones
    paged(head + body, bytes);
    return h.digest();
  }
#endif
  paged(0, bytes);
  return h.digest();
}

//! 16 lower-case hex digits, the spelling of checksums in JSON (exact beyond 2^53).
[[nodiscard]] inline std::string to_hex(std::uint64_t v) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string s(16, '0');
  for (int i = 15; i >= 0; --i, v >>= 4) s[static_cast<std::size_t>(i)] = digits[v & 0xfu];
  return s;
}

//! Parses exactly 16 hex digits (either case); nullopt otherwise.
RLPT_DEFER [[nodiscard]] std::optional<std::uint64_t> parse_hex(std::string_view s) noexcept;

namespace detail {
//! The value of one hex digit (either case), or -1: shared by parse_hex and JSON's \u escapes.
[[nodiscard]] constexpr int hex_digit(char c) noexcept {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}
} // namespace detail

} // namespace sync
RLPT_NAMESPACE_END

#if RLPT_HEADER_IMPL()
RLPT_NAMESPACE_BEGIN
namespace sync {

RLPT_DEFER RLPT_INLINE std::optional<std::uint64_t> parse_hex(std::string_view s) noexcept {
  if (s.size() != 16) return std::nullopt;
  std::uint64_t v = 0;
  for (char c : s) {
    const int d = detail::hex_digit(c);
    if (d < 0) return std::nullopt;
    v = (v << 4) | static_cast<unsigned>(d);
  }
  return v;
}

} // namespace sync
RLPT_NAMESPACE_END
#endif // RLPT_HEADER_IMPL()
