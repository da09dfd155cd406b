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

//! Inputs of at least this many bytes are hashed (and copied) a page at a time with the next
//! page prefetched: far beyond the caches, where the bytes come from memory.
inline constexpr std::size_t copy_hash_streaming_bytes = std::size_t{4} << 20;

namespace detail {

//! Bytes processed per step of the large paths: one page. The hardware prefetchers stop at
//! page boundaries, so each step prefetches the next page while it hashes this one, a KiB of
//! it before each KiB hashed (all 64 lines at once measured ~5% slower: the prefetches queue
//! behind each other instead of overlapping the hash).
inline constexpr std::size_t prefetch_step = 4096;
inline constexpr std::size_t prefetch_sub = 1024;

//! Prefetches [p, p + bytes) for a read soon (non-temporal hint: used once, then evicted).
inline void prefetch_read(const unsigned char* p, std::size_t bytes) noexcept {
#if defined(__GNUC__) || defined(__clang__)
  for (std::size_t at = 0; at < bytes; at += 64) __builtin_prefetch(p + at, 0, 0);
#else
  static_cast<void>(p);
  static_cast<void>(bytes);
#endif
}

//! Copies with non-temporal (streaming) stores where the target has them (SSE2, baseline on
//! x86-64): the destination is not read first (no read-for-ownership) and does not evict the
//! cache. No store fence: the caller fences before it hands the destination on.
inline void stream_copy_unfenced(unsigned char* d, const unsigned char* s, std::size_t bytes) noexcept {
#if defined(__SSE2__)
  const std::size_t head = std::min(bytes, (16 - (reinterpret_cast<std::uintptr_t>(d) & 15u)) & 15u);
  std::memcpy(d, s, head);
  d += head;
  s += head;
  bytes -= head;
  for (; bytes >= 64; bytes -= 64, d += 64, s += 64) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 32));
    const __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(d), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + 48), e);
  }
#endif
  std::memcpy(d, s, bytes);
}

//! Hashes s[off, off + n) (n at most a page) into h, prefetching the same range one page on
//! (clipped to [0, bytes)) a KiB at a time.
inline void hash_page_prefetch_next(xxh3_stream& h, const unsigned char* s, std::size_t off, std::size_t n,
                                    std::size_t bytes) noexcept {
  for (std::size_t q = 0; q < n; q += prefetch_sub) {
    const std::size_t m = std::min(prefetch_sub, n - q);
    const std::size_t ahead = off + prefetch_step + q;
    if (ahead < bytes) prefetch_read(s + ahead, std::min(m, bytes - ahead));
    h.update(s + off + q, m);
  }
}

//! Copies s[off, off + n) (n at most a page) to `page`, prefetching the same range one page on
//! (clipped to [0, bytes)) a KiB at a time: the one read of the source in copy_hash.
inline void copy_page_prefetch_next(unsigned char* page, const unsigned char* s, std::size_t off, std::size_t n,
                                    std::size_t bytes) noexcept {
  for (std::size_t q = 0; q < n; q += prefetch_sub) {
    const std::size_t m = std::min(prefetch_sub, n - q);
    const std::size_t ahead = off + prefetch_step + q;
    if (ahead < bytes) prefetch_read(s + ahead, std::min(m, bytes - ahead));
    std::memcpy(page + q, s + off + q, m);
  }
#if defined(__GNUC__) || defined(__clang__)
  // The hash and the store read `page`, never the source again (no re-load of s is folded in).
  __asm__ __volatile__("" : : "r"(page) : "memory");
#endif
}

} // namespace detail

//! XXH3-64 (seed 0) of a byte range: the checksum of every bucket piece, tensor and frame.
//! Large inputs go through the streaming state a page at a time with the next page
//! prefetched (1.0-1.2x the one-shot rate from memory on the development machine); XXH3's
//! streaming digest equals its one-shot digest, so the value is the same.
[[nodiscard]] inline std::uint64_t xxh3(const void* data, std::size_t bytes) noexcept {
  if (bytes < copy_hash_streaming_bytes) return RLPT_SYNC_XXH3_64(data, bytes);
  const auto* s = static_cast<const unsigned char*>(data);
  constexpr std::size_t step = detail::prefetch_step;
  xxh3_stream h;
  for (std::size_t off = 0; off < bytes; off += step)
    detail::hash_page_prefetch_next(h, s, off, std::min(step, bytes - off), bytes);
  return h.digest();
}

//! Copies `bytes` from src to dst and returns XXH3-64 of the bytes written to dst (the value
//! xxh3() gives for them), in one pass over memory. Each page of the source is read exactly
//! once, into a page-sized bounce buffer that stays in L1; the page is hashed there and written
//! to dst from there. So the checksum is always that of the bytes dst received, even when the
//! source or the destination is memory another process may write (a shared-memory slot: the
//! receiver's source, the sender's destination): a source that changes during the copy gives
//! a checksum of what was copied, and a destination changed afterwards fails its check at the
//! other end. Up to a page: one-shot XXH3. Up to copy_hash_streaming_bytes the destination is
//! written with regular stores (it stays in cache for what follows). Larger (beyond the caches,
//! where regular stores would read every destination line first and evict useful ones): the
//! next page is prefetched while this one is copied, and dst is written with streaming stores,
//! so memory sees one read and one write per byte and the reads never stall at page
//! boundaries. glibc's memcpy switches to streaming stores only at 3/4 of the shared cache
//! (192 MiB on the development machine), which copies of single tensors rarely reach.
inline std::uint64_t copy_hash(void* dst, const void* src, std::size_t bytes) noexcept {
  constexpr std::size_t step = detail::prefetch_step;
  alignas(64) unsigned char page[step];
  auto* d = static_cast<unsigned char*>(dst);
  const auto* s = static_cast<const unsigned char*>(src);
  if (bytes <= step) {
    if (bytes == 0) return xxh3(dst, 0);
    detail::copy_page_prefetch_next(page, s, 0, bytes, bytes);
    std::memcpy(d, page, bytes);
    return RLPT_SYNC_XXH3_64(page, bytes);
  }
  const bool streaming = bytes >= copy_hash_streaming_bytes;
  xxh3_stream h;
  for (std::size_t off = 0; off < bytes; off += step) {
    const std::size_t n = std::min(step, bytes - off);
    detail::copy_page_prefetch_next(page, s, off, n, bytes);
    h.update(page, n);
    if (streaming)
      detail::stream_copy_unfenced(d + off, page, n);
    else
      std::memcpy(d + off, page, n);
  }
#if defined(__SSE2__)
  if (streaming) _mm_sfence(); // a later release (the slot handed to the receiver) orders after the copy
#endif
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
[[nodiscard]] inline std::optional<std::uint64_t> parse_hex(std::string_view s) noexcept {
  if (s.size() != 16) return std::nullopt;
  std::uint64_t v = 0;
  for (char c : s) {
    unsigned d;
    if (c >= '0' && c <= '9')
      d = static_cast<unsigned>(c - '0');
    else if (c >= 'a' && c <= 'f')
      d = static_cast<unsigned>(c - 'a' + 10);
    else if (c >= 'A' && c <= 'F')
      d = static_cast<unsigned>(c - 'A' + 10);
    else
      return std::nullopt;
    v = (v << 4) | d;
  }
  return v;
}

} // namespace sync
RLPT_NAMESPACE_END
