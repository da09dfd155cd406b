// SPDX-License-Identifier: Apache-2.0
//! @file
//! Delta codec: bitwise change detection against the last published version and lossless
//! "overwrite" records (changed positions + their new values), applied in place.
//!
//! In RL post-training only 1-3% of bf16 weights change per step (PULSE, TRL, verl, slime):
//! Adam steps at RL learning rates fall below half a bf16 ulp. An element counts as changed
//! when its bits differ (so -0.0 vs 0.0 and NaN payloads count). Each record covers an element
//! range of one tensor and picks the smallest of three encodings, all plain arrays so a GPU
//! can apply them (index_copy_ style, pointer-stable for captured CUDA graphs):
//!   sparse: block_start[u32, nblocks+1] (65536-element blocks, prefix counts),
//!           lo[u16, changed] (index within its block), values[changed]
//!   bitmap: bits[u64, ceil(n/64)], values[changed] (in index order)
//!   dense:  values[n]
//! For bf16 that is sparse below 6.25% changed (4 bytes per change against 1/8 + 2), bitmap up
//! to 93.75%, dense above.
//!
//! Record layout (little-endian, 8-byte aligned, every array padded to 8 bytes):
//!   u32 magic "RLDR", u8 encoding, u8 element bytes, u16 0, u32 tensor, u32 0,
//!   u64 first element, u64 element count, u64 changed, u64 body bytes,
//!   u64 checksum of the tensor in the base version, u64 XXH3-64 of the preceding 56 bytes,
//!   then the body.
//! Records are overwrite patches, so applying one is idempotent; rlpt applies them by swapping
//! values with the target, which leaves the old values in the record: applying it again undoes
//! it (how a receiver rolls back an update whose result checksum fails).
#pragma once

#include <rlpt/config.hpp>
#include <rlpt/core/error.hpp>
#include <rlpt/sync/checksum.hpp>
#include <rlpt/sync/manifest.hpp>

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string_view>
#include <vector>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

RLPT_NAMESPACE_BEGIN
namespace sync {

enum class delta_encoding : std::uint8_t { sparse = 1, bitmap = 2, dense = 3 };

[[nodiscard]] constexpr std::string_view name(delta_encoding e) noexcept {
  switch (e) {
  case delta_encoding::sparse:
    return "sparse";
  case delta_encoding::bitmap:
    return "bitmap";
  case delta_encoding::dense:
    return "dense";
  }
  return "?";
}

inline constexpr std::uint32_t delta_magic = 0x52444c52u; // "RLDR"
inline constexpr std::size_t delta_header_bytes = 64;
inline constexpr std::uint64_t delta_sparse_block = 65536;

//! Counters of one encode (or one update).
struct delta_stats {
  std::uint64_t elements = 0;    //!< elements compared
  std::uint64_t changed = 0;     //!< elements whose bits differ
  std::uint64_t bytes = 0;       //!< encoded record bytes
  std::uint64_t dense_bytes = 0; //!< bytes a dense update of the same tensors would move
  std::uint64_t records = 0;
  std::uint64_t by_encoding[4] = {0, 0, 0, 0}; //!< records per delta_encoding

  void add(const delta_stats& o) noexcept {
    elements += o.elements;
    changed += o.changed;
    bytes += o.bytes;
    dense_bytes += o.dense_bytes;
    records += o.records;
    for (int i = 0; i < 4; ++i) by_encoding[i] += o.by_encoding[i];
  }
};

namespace detail {

[[nodiscard]] constexpr std::uint64_t pad8(std::uint64_t n) noexcept { return (n + 7) & ~std::uint64_t{7}; }

//! Population count without a libgcc call when the target lacks POPCNT (x86-64 baseline).
[[nodiscard]] RLPT_HD_FORCEINLINE std::uint64_t popcount64(std::uint64_t x) noexcept {
#if defined(__POPCNT__) || !(defined(__x86_64__) || defined(__i386__))
  return static_cast<std::uint64_t>(std::popcount(x));
#else
  x = x - ((x >> 1) & 0x5555555555555555ull);
  x = (x & 0x3333333333333333ull) + ((x >> 2) & 0x3333333333333333ull);
  x = (x + (x >> 4)) & 0x0f0f0f0f0f0f0f0full;
  return (x * 0x0101010101010101ull) >> 56;
#endif
}

//! Body bytes of an encoding; false on overflow.
RLPT_DEFER [[nodiscard]] bool delta_body_bytes(delta_encoding enc, std::uint64_t n, std::uint64_t changed,
                                               std::uint64_t eb, std::uint64_t& out) noexcept;

//! A record header (the first 64 bytes of a record), parsed and checked.
struct delta_head {
  delta_encoding encoding = delta_encoding::dense;
  std::uint32_t elem_bytes = 0;
  std::uint32_t tensor = 0;
  std::uint64_t elem_begin = 0, elem_count = 0, changed = 0, body = 0, base_checksum = 0;
};

//! Parses and checks a record header (magic, header checksum, encoding, element size, counts,
//! the body size its encoding implies); not the body. The host parser (parse_delta_record) and
//! the device receiver (which validates bodies on the GPU) share it. Errors: rlpt.sync.bad_delta
//! naming `where` and the record's byte offset `at`.
RLPT_DEFER [[nodiscard]] delta_head parse_delta_head(std::span<const std::byte> h, std::string_view where,
                                                     std::uint64_t at);

template <class U> inline void swap_elem(std::byte* a, std::byte* b) noexcept {
  U x, y;
  std::memcpy(&x, a, sizeof(U));
  std::memcpy(&y, b, sizeof(U));
  std::memcpy(a, &y, sizeof(U));
  std::memcpy(b, &x, sizeof(U));
}

// Bit i of the result: element i of the 64 at a and b differs (portable version).
template <class U>
inline std::uint64_t diff_word_scalar(const std::byte* a, const std::byte* b, std::uint64_t n) noexcept {
  std::uint64_t bits = 0;
  for (std::uint64_t i = 0; i < n; ++i) {
    U x, y;
    std::memcpy(&x, a + i * sizeof(U), sizeof(U));
    std::memcpy(&y, b + i * sizeof(U), sizeof(U));
    bits |= std::uint64_t{x != y} << i;
  }
  return bits;
}

#if defined(__SSE2__)
// SSE2 (every x86-64): compare 16 elements per step and gather one bit each with movemask.
template <class U> inline std::uint64_t diff_word_sse2(const std::byte* a, const std::byte* b) noexcept {
  std::uint64_t eq = 0;
  for (unsigned k = 0; k < 4; ++k) { // 16 elements per k
    const std::byte* pa = a + std::size_t{k} * 16 * sizeof(U);
    const std::byte* pb = b + std::size_t{k} * 16 * sizeof(U);
    auto load = [](const std::byte* p, unsigned j) {
      return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + std::size_t{16} * j));
    };
    unsigned m;
    if constexpr (sizeof(U) == 1) {
      m = static_cast<unsigned>(_mm_movemask_epi8(_mm_cmpeq_epi8(load(pa, 0), load(pb, 0))));
    } else if constexpr (sizeof(U) == 2) {
      const __m128i e0 = _mm_cmpeq_epi16(load(pa, 0), load(pb, 0));
      const __m128i e1 = _mm_cmpeq_epi16(load(pa, 1), load(pb, 1));
      m = static_cast<unsigned>(_mm_movemask_epi8(_mm_packs_epi16(e0, e1)));
    } else {
      const __m128i e0 = _mm_cmpeq_epi32(load(pa, 0), load(pb, 0));
      const __m128i e1 = _mm_cmpeq_epi32(load(pa, 1), load(pb, 1));
      const __m128i e2 = _mm_cmpeq_epi32(load(pa, 2), load(pb, 2));
      const __m128i e3 = _mm_cmpeq_epi32(load(pa, 3), load(pb, 3));
      m = static_cast<unsigned>(_mm_movemask_epi8(_mm_packs_epi16(_mm_packs_epi32(e0, e1), _mm_packs_epi32(e2, e3))));
    }
    eq |= std::uint64_t{m & 0xffffu} << (16 * k);
  }
  return ~eq;
}
#endif

// Bits of elements [0, n) that differ between a and b, 64 per word; returns the count.
template <class U>
inline std::uint64_t diff_bits(const std::byte* a, const std::byte* b, std::uint64_t n, std::uint64_t* words) noexcept {
  std::uint64_t total = 0;
  const std::uint64_t full = n / 64;
  for (std::uint64_t w = 0; w < full; ++w) {
    const std::byte* pa = a + w * 64 * sizeof(U);
    const std::byte* pb = b + w * 64 * sizeof(U);
#if defined(__SSE2__)
    std::uint64_t bits;
    if constexpr (sizeof(U) <= 4)
      bits = diff_word_sse2<U>(pa, pb);
    else
      bits = diff_word_scalar<U>(pa, pb, 64);
#else
    const std::uint64_t bits = diff_word_scalar<U>(pa, pb, 64);
#endif
    words[w] = bits;
    total += popcount64(bits);
  }
  if (const std::uint64_t rest = n - full * 64; rest != 0) {
    const std::uint64_t bits = diff_word_scalar<U>(a + full * 64 * sizeof(U), b + full * 64 * sizeof(U), rest);
    words[full] = bits;
    total += popcount64(bits);
  }
  return total;
}

RLPT_DEFER std::uint64_t diff_bits(std::size_t eb, const std::byte* a, const std::byte* b, std::uint64_t n,
                                   std::uint64_t* words) noexcept;

} // namespace detail

//! A parsed, validated record; array pointers point into the caller's (mutable) stream.
struct delta_record {
  delta_encoding encoding = delta_encoding::dense;
  std::uint32_t elem_bytes = 0;
  std::uint32_t tensor = 0;
  std::uint64_t elem_begin = 0;
  std::uint64_t elem_count = 0;
  std::uint64_t changed = 0;
  std::uint64_t base_checksum = 0;
  std::uint64_t total_bytes = 0; //!< header + body
  const std::uint32_t* block_start = nullptr;
  const std::uint16_t* lo = nullptr;
  const std::uint64_t* bits = nullptr;
  std::byte* values = nullptr;
};

//! Parses and fully validates the record at the start of `stream` (8-byte aligned). Errors:
//! rlpt.sync.bad_delta naming `where` and the byte offset `at` of the record in its stream.
RLPT_DEFER [[nodiscard]] delta_record parse_delta_record(std::span<std::byte> stream, std::string_view where,
                                                         std::uint64_t at = 0);

//! Writes a record's values into `range` (the record's elements of the target tensor, i.e.
//! elem_count x elem_bytes bytes starting at element elem_begin) by swapping: afterwards the
//! record holds the values it replaced, so a second call undoes the first.
RLPT_DEFER void swap_apply(const delta_record& r, std::span<std::byte> range);

//! Calls f(delta_record&) for every record of a stream (validated as it goes).
template <class F> void for_each_delta_record(std::span<std::byte> stream, std::string_view where, F&& f) {
  std::uint64_t at = 0;
  while (at < stream.size()) {
    delta_record r = parse_delta_record(stream.subspan(at), where, at);
    f(r);
    at += r.total_bytes;
  }
}

//! Encodes tensors against their base version into records.
template <class = void> class basic_delta_encoder {
public:
  //! `max_record_bytes` bounds each record (header included) so records fit a bucket.
  explicit basic_delta_encoder(std::uint64_t max_record_bytes) : max_record_(max_record_bytes) {
    RLPT_CHECK(max_record_bytes >= delta_header_bytes + 64, errors::sync::bad_delta,
               "max_record_bytes {} is too small for a delta record", max_record_bytes);
  }

  //! Appends the records of tensor `index` (`now` vs `base`, equal sizes, `elem_bytes` per
  //! element) to `out` (kept 8-byte aligned) and returns the checksum of `now` as the
  //! manifest defines it for `bucket_bytes`. Unchanged tensors append nothing.
  std::uint64_t encode(std::uint32_t index, std::span<const std::byte> now, std::span<const std::byte> base,
                       std::size_t elem_bytes, std::uint64_t base_checksum, std::uint64_t bucket_bytes,
                       std::vector<std::byte>& out, delta_stats& stats);

private:
  static void hash_range(xxh3_stream& h, std::vector<std::uint64_t>& parts, std::uint64_t& fill, const std::byte* p,
                         std::uint64_t bytes, bool split, std::uint64_t bucket_bytes);

  void write_record(std::uint32_t index, const std::byte* now, std::size_t eb, std::uint64_t first, std::uint64_t n,
                    std::uint64_t changed, std::uint64_t base_checksum, std::vector<std::byte>& out,
                    delta_stats& stats);

  // Indices and values in one pass over the change bits.
  template <std::size_t EB>
  void write_sparse(std::uint32_t* block_start, std::uint16_t* lo, std::byte* values, const std::byte* now,
                    std::uint64_t blocks, std::uint64_t words) const {
    constexpr std::uint64_t words_per_block = delta_sparse_block / 64;
    std::uint64_t k = 0;
    for (std::uint64_t blk = 0; blk < blocks; ++blk) {
      block_start[blk] = static_cast<std::uint32_t>(k);
      const std::uint64_t w_end = std::min(words, (blk + 1) * words_per_block);
      for (std::uint64_t w = blk * words_per_block; w < w_end; ++w)
        for (std::uint64_t bits = words_[w]; bits != 0; bits &= bits - 1) {
          const std::uint64_t bit = static_cast<std::uint64_t>(std::countr_zero(bits));
          lo[k] = static_cast<std::uint16_t>((w - blk * words_per_block) * 64 + bit);
          std::memcpy(values + k * EB, now + (w * 64 + bit) * EB, EB);
          ++k;
        }
    }
    block_start[blocks] = static_cast<std::uint32_t>(k);
  }

  template <std::size_t EB> void gather_n(std::byte* dst, const std::byte* now, std::uint64_t words) const {
    for (std::uint64_t w = 0; w < words; ++w)
      for (std::uint64_t bits = words_[w]; bits != 0; bits &= bits - 1) {
        const std::uint64_t i = w * 64 + static_cast<std::uint64_t>(std::countr_zero(bits));
        std::memcpy(dst, now + i * EB, EB); // fixed size: inlined, not a library call
        dst += EB;
      }
  }

  void gather(std::byte* dst, const std::byte* now, std::size_t eb, std::uint64_t words) const;

  std::uint64_t max_record_;
  std::vector<std::uint64_t> words_;
};
using delta_encoder = basic_delta_encoder<>;
RLPT_EXTERN_TEMPLATE(class basic_delta_encoder<>)

} // namespace sync
RLPT_NAMESPACE_END

#if RLPT_HEADER_IMPL()
RLPT_NAMESPACE_BEGIN
namespace sync::detail {

RLPT_DEFER RLPT_INLINE bool delta_body_bytes(delta_encoding enc, std::uint64_t n, std::uint64_t changed,
                                             std::uint64_t eb, std::uint64_t& out) noexcept {
  std::uint64_t vals = 0;
  switch (enc) {
  case delta_encoding::dense:
    if (mul_overflows(n, eb, vals) || vals > (std::uint64_t{1} << 62)) return false;
    out = pad8(vals);
    return true;
  case delta_encoding::bitmap:
    if (mul_overflows(changed, eb, vals) || vals > (std::uint64_t{1} << 62)) return false;
    out = ((n + 63) / 64) * 8 + pad8(vals);
    return true;
  case delta_encoding::sparse: {
    if (mul_overflows(changed, eb, vals) || vals > (std::uint64_t{1} << 60)) return false;
    const std::uint64_t blocks = (n + delta_sparse_block - 1) / delta_sparse_block;
    out = pad8(4 * (blocks + 1)) + pad8(2 * changed) + pad8(vals);
    return true;
  }
  }
  return false;
}

RLPT_DEFER RLPT_INLINE delta_head parse_delta_head(std::span<const std::byte> h, std::string_view where,
                                                   std::uint64_t at) {
  auto bad = [&](std::string_view what) -> void {
    RLPT_FAIL(errors::sync::bad_delta, "{}: delta record at byte {}: {}", where, at, what);
  };
  if (h.size() < delta_header_bytes) bad(rlpt::detail::format("only {} header bytes, a header needs 64", h.size()));
  const std::byte* p = h.data();
  std::uint32_t magic, tensor;
  std::uint8_t enc, eb;
  std::uint64_t f[6];
  std::memcpy(&magic, p, 4);
  std::memcpy(&enc, p + 4, 1);
  std::memcpy(&eb, p + 5, 1);
  std::memcpy(&tensor, p + 8, 4);
  std::memcpy(f, p + 16, 48);
  if (magic != delta_magic) bad(rlpt::detail::format("bad magic 0x{:08x}", magic));
  if (xxh3(p, 56) != f[5]) bad("header checksum mismatch");
  if (enc < 1 || enc > 3) bad(rlpt::detail::format("unknown encoding {}", enc));
  if (eb != 1 && eb != 2 && eb != 4 && eb != 8) bad(rlpt::detail::format("element size {} is not 1, 2, 4 or 8", eb));
  delta_head d;
  d.encoding = static_cast<delta_encoding>(enc);
  d.elem_bytes = eb;
  d.tensor = tensor;
  d.elem_begin = f[0];
  d.elem_count = f[1];
  d.changed = f[2];
  d.body = f[3];
  d.base_checksum = f[4];
  if (d.changed > d.elem_count) bad(rlpt::detail::format("{} changed elements of {}", d.changed, d.elem_count));
  if (d.encoding == delta_encoding::dense && d.changed != d.elem_count)
    bad(rlpt::detail::format("dense record of {} elements says {} changed", d.elem_count, d.changed));
  // The encoder writes 1 to 2^31 elements per record; 2^40 bounds what a device kernel indexes.
  if (d.elem_count == 0 || d.elem_count > (std::uint64_t{1} << 40))
    bad(rlpt::detail::format("{} elements: a record covers 1 to 2^40 elements", d.elem_count));
  std::uint64_t want = 0;
  if (!delta_body_bytes(d.encoding, d.elem_count, d.changed, eb, want) || d.body != want)
    bad(rlpt::detail::format("{} body of {} bytes, expected {} for {} of {} elements of {} bytes", name(d.encoding),
                             d.body, want, d.changed, d.elem_count, eb));
  return d;
}

RLPT_DEFER RLPT_INLINE std::uint64_t diff_bits(std::size_t eb, const std::byte* a, const std::byte* b, std::uint64_t n,
                                               std::uint64_t* words) noexcept {
  switch (eb) {
  case 1:
    return diff_bits<std::uint8_t>(a, b, n, words);
  case 2:
    return diff_bits<std::uint16_t>(a, b, n, words);
  case 4:
    return diff_bits<std::uint32_t>(a, b, n, words);
  default:
    return diff_bits<std::uint64_t>(a, b, n, words);
  }
}

} // namespace sync::detail

namespace sync {

RLPT_DEFER RLPT_INLINE delta_record parse_delta_record(std::span<std::byte> stream, std::string_view where,
                                                       std::uint64_t at) {
  auto bad = [&](std::string_view what) -> void {
    RLPT_FAIL(errors::sync::bad_delta, "{}: delta record at byte {}: {}", where, at, what);
  };
  if (stream.size() < delta_header_bytes)
    bad(rlpt::detail::format("only {} bytes left, a header needs 64", stream.size()));
  if (reinterpret_cast<std::uintptr_t>(stream.data()) % 8 != 0) bad("stream is not 8-byte aligned");
  const detail::delta_head d =
      detail::parse_delta_head(std::span<const std::byte>(stream).first(delta_header_bytes), where, at);
  delta_record r;
  r.encoding = d.encoding;
  r.elem_bytes = d.elem_bytes;
  r.tensor = d.tensor;
  r.elem_begin = d.elem_begin;
  r.elem_count = d.elem_count;
  r.changed = d.changed;
  r.base_checksum = d.base_checksum;
  const std::uint64_t body = d.body;
  if (body > stream.size() - delta_header_bytes)
    bad(rlpt::detail::format("body of {} bytes runs past the stream's {} remaining bytes", body,
                             stream.size() - delta_header_bytes));
  r.total_bytes = delta_header_bytes + body;
  std::byte* b = stream.data() + delta_header_bytes;
  switch (r.encoding) {
  case delta_encoding::dense:
    r.values = b;
    break;
  case delta_encoding::bitmap: {
    const std::uint64_t words = (r.elem_count + 63) / 64;
    r.bits = reinterpret_cast<const std::uint64_t*>(b);
    r.values = b + words * 8;
    std::uint64_t ones = 0;
    for (std::uint64_t w = 0; w < words; ++w) ones += detail::popcount64(r.bits[w]);
    if (ones != r.changed)
      bad(rlpt::detail::format("bitmap has {} bits set but the header says {} changed", ones, r.changed));
    if (const std::uint64_t tail = r.elem_count % 64; tail != 0 && (r.bits[words - 1] >> tail) != 0)
      bad("bitmap has bits set past the element range");
    break;
  }
  case delta_encoding::sparse: {
    const std::uint64_t blocks = (r.elem_count + delta_sparse_block - 1) / delta_sparse_block;
    r.block_start = reinterpret_cast<const std::uint32_t*>(b);
    r.lo = reinterpret_cast<const std::uint16_t*>(b + detail::pad8(4 * (blocks + 1)));
    r.values = b + detail::pad8(4 * (blocks + 1)) + detail::pad8(2 * r.changed);
    if (r.block_start[0] != 0 || r.block_start[blocks] != r.changed)
      bad(rlpt::detail::format("block_start runs from {} to {}, expected 0 to {}", r.block_start[0],
                               r.block_start[blocks], r.changed));
    for (std::uint64_t k = 0; k < blocks; ++k) {
      const std::uint64_t s = r.block_start[k], e = r.block_start[k + 1];
      if (e < s || e > r.changed) bad(rlpt::detail::format("block_start decreases at block {}", k));
      for (std::uint64_t j = s; j < e; ++j) {
        if (j > s && r.lo[j] <= r.lo[j - 1])
          bad(rlpt::detail::format("indices in block {} are not strictly increasing", k));
        if (k * delta_sparse_block + r.lo[j] >= r.elem_count)
          bad(rlpt::detail::format("index {} is outside the record's {} elements", k * delta_sparse_block + r.lo[j],
                                   r.elem_count));
      }
    }
    break;
  }
  }
  return r;
}

RLPT_DEFER RLPT_INLINE void swap_apply(const delta_record& r, std::span<std::byte> range) {
  RLPT_CHECK(range.size() == r.elem_count * r.elem_bytes, errors::sync::bad_delta,
             "delta target range has {} bytes, the record covers {} x {} bytes", range.size(), r.elem_count,
             r.elem_bytes);
  const std::size_t eb = r.elem_bytes;
  std::byte* dst = range.data();
  auto swap_at = [&](std::uint64_t idx, std::uint64_t k) {
    switch (eb) {
    case 1:
      detail::swap_elem<std::uint8_t>(dst + idx, r.values + k);
      break;
    case 2:
      detail::swap_elem<std::uint16_t>(dst + idx * 2, r.values + k * 2);
      break;
    case 4:
      detail::swap_elem<std::uint32_t>(dst + idx * 4, r.values + k * 4);
      break;
    default:
      detail::swap_elem<std::uint64_t>(dst + idx * 8, r.values + k * 8);
      break;
    }
  };
  switch (r.encoding) {
  case delta_encoding::dense:
    std::swap_ranges(dst, dst + range.size(), r.values);
    break;
  case delta_encoding::bitmap: {
    std::uint64_t k = 0;
    const std::uint64_t words = (r.elem_count + 63) / 64;
    for (std::uint64_t w = 0; w < words; ++w)
      for (std::uint64_t bits = r.bits[w]; bits != 0; bits &= bits - 1)
        swap_at(w * 64 + static_cast<std::uint64_t>(std::countr_zero(bits)), k++);
    break;
  }
  case delta_encoding::sparse: {
    const std::uint64_t blocks = (r.elem_count + delta_sparse_block - 1) / delta_sparse_block;
    for (std::uint64_t b = 0; b < blocks; ++b)
      for (std::uint64_t j = r.block_start[b]; j < r.block_start[b + 1]; ++j)
        swap_at(b * delta_sparse_block + r.lo[j], j);
    break;
  }
  }
}

template <class Tag>
RLPT_INLINE std::uint64_t basic_delta_encoder<Tag>::encode(std::uint32_t index, std::span<const std::byte> now,
                                                           std::span<const std::byte> base, std::size_t elem_bytes,
                                                           std::uint64_t base_checksum, std::uint64_t bucket_bytes,
                                                           std::vector<std::byte>& out, delta_stats& stats) {
  RLPT_CHECK(now.size() == base.size(), errors::sync::bad_delta, "tensor #{} has {} bytes but its base has {}", index,
             now.size(), base.size());
  RLPT_CHECK(elem_bytes == 1 || elem_bytes == 2 || elem_bytes == 4 || elem_bytes == 8, errors::sync::bad_delta,
             "element size {} is not 1, 2, 4 or 8", elem_bytes);
  RLPT_CHECK(now.size() % elem_bytes == 0, errors::sync::bad_delta, "tensor #{} has {} bytes, not a multiple of {}",
             index, now.size(), elem_bytes);
  const std::uint64_t n = now.size() / elem_bytes;
  // Range length: a dense record of it fits max_record_ bytes.
  // Capped at 2^31 elements so sparse block prefix counts fit u32.
  const std::uint64_t range =
      std::clamp<std::uint64_t>((max_record_ - delta_header_bytes - 8) / elem_bytes, 1, std::uint64_t{1} << 31);
  stats.elements += n;
  stats.dense_bytes += now.size();
  // Checksum pieces follow the bucket split, hashed while the bytes are in cache.
  const bool split = now.size() > bucket_bytes;
  std::vector<std::uint64_t> parts;
  xxh3_stream h;
  std::uint64_t piece_fill = 0;
  constexpr std::uint64_t chunk_elems = 8192;
  for (std::uint64_t r0 = 0; r0 < n; r0 += range) {
    const std::uint64_t rn = std::min(range, n - r0);
    words_.resize(static_cast<std::size_t>((rn + 63) / 64));
    std::uint64_t changed = 0;
    for (std::uint64_t c0 = 0; c0 < rn; c0 += chunk_elems) {
      const std::uint64_t cn = std::min(chunk_elems, rn - c0); // a multiple of 64 except at the end
      const std::byte* a = now.data() + (r0 + c0) * elem_bytes;
      changed += detail::diff_bits(elem_bytes, a, base.data() + (r0 + c0) * elem_bytes, cn, words_.data() + c0 / 64);
      hash_range(h, parts, piece_fill, a, cn * elem_bytes, split, bucket_bytes);
    }
    stats.changed += changed;
    if (changed != 0)
      write_record(index, now.data() + r0 * elem_bytes, elem_bytes, r0, rn, changed, base_checksum, out, stats);
  }
  if (!split) return h.digest();
  if (piece_fill != 0) parts.push_back(h.digest());
  return combine_piece_checksums(parts);
}

template <class Tag>
RLPT_INLINE void basic_delta_encoder<Tag>::hash_range(xxh3_stream& h, std::vector<std::uint64_t>& parts,
                                                      std::uint64_t& fill, const std::byte* p, std::uint64_t bytes,
                                                      bool split, std::uint64_t bucket_bytes) {
  if (!split) {
    h.update(p, static_cast<std::size_t>(bytes));
    return;
  }
  while (bytes != 0) {
    const std::uint64_t take = std::min(bytes, bucket_bytes - fill);
    h.update(p, static_cast<std::size_t>(take));
    fill += take;
    p += take;
    bytes -= take;
    if (fill == bucket_bytes) {
      parts.push_back(h.digest());
      h.reset();
      fill = 0;
    }
  }
}

template <class Tag>
RLPT_INLINE void basic_delta_encoder<Tag>::write_record(std::uint32_t index, const std::byte* now, std::size_t eb,
                                                        std::uint64_t first, std::uint64_t n, std::uint64_t changed,
                                                        std::uint64_t base_checksum, std::vector<std::byte>& out,
                                                        delta_stats& stats) {
  std::uint64_t s_sparse = 0, s_bitmap = 0, s_dense = 0;
  // n < 2^31 elements of at most 8 bytes: none of these overflow.
  static_cast<void>(detail::delta_body_bytes(delta_encoding::sparse, n, changed, eb, s_sparse));
  static_cast<void>(detail::delta_body_bytes(delta_encoding::bitmap, n, changed, eb, s_bitmap));
  static_cast<void>(detail::delta_body_bytes(delta_encoding::dense, n, changed, eb, s_dense));
  delta_encoding enc = delta_encoding::dense;
  std::uint64_t body = s_dense;
  if (s_bitmap < body) {
    enc = delta_encoding::bitmap;
    body = s_bitmap;
  }
  if (s_sparse < body) {
    enc = delta_encoding::sparse;
    body = s_sparse;
  }
  if (enc == delta_encoding::dense) changed = n;
  const std::size_t at = out.size();
  out.resize(at + delta_header_bytes + static_cast<std::size_t>(body), std::byte{0});
  std::byte* p = out.data() + at;
  const std::uint32_t magic = delta_magic;
  const auto e8 = static_cast<std::uint8_t>(enc);
  const auto eb8 = static_cast<std::uint8_t>(eb);
  const std::uint64_t f[5] = {first, n, changed, body, base_checksum};
  std::memcpy(p, &magic, 4);
  std::memcpy(p + 4, &e8, 1);
  std::memcpy(p + 5, &eb8, 1);
  std::memcpy(p + 8, &index, 4);
  std::memcpy(p + 16, f, 40);
  const std::uint64_t check = xxh3(p, 56);
  std::memcpy(p + 56, &check, 8);
  std::byte* b = p + delta_header_bytes;
  const std::uint64_t words = (n + 63) / 64;
  switch (enc) {
  case delta_encoding::dense:
    std::memcpy(b, now, static_cast<std::size_t>(n * eb));
    break;
  case delta_encoding::bitmap: {
    std::memcpy(b, words_.data(), static_cast<std::size_t>(words * 8));
    gather(b + words * 8, now, eb, words);
    break;
  }
  case delta_encoding::sparse: {
    const std::uint64_t blocks = (n + delta_sparse_block - 1) / delta_sparse_block;
    auto* block_start = reinterpret_cast<std::uint32_t*>(b);
    auto* lo = reinterpret_cast<std::uint16_t*>(b + detail::pad8(4 * (blocks + 1)));
    std::byte* values = b + detail::pad8(4 * (blocks + 1)) + detail::pad8(2 * changed);
    switch (eb) {
    case 1:
      write_sparse<1>(block_start, lo, values, now, blocks, words);
      break;
    case 2:
      write_sparse<2>(block_start, lo, values, now, blocks, words);
      break;
    case 4:
      write_sparse<4>(block_start, lo, values, now, blocks, words);
      break;
    default:
      write_sparse<8>(block_start, lo, values, now, blocks, words);
      break;
    }
    break;
  }
  }
  stats.bytes += delta_header_bytes + body;
  stats.records += 1;
  stats.by_encoding[static_cast<int>(enc)] += 1;
}

template <class Tag>
RLPT_INLINE void basic_delta_encoder<Tag>::gather(std::byte* dst, const std::byte* now, std::size_t eb,
                                                  std::uint64_t words) const {
  switch (eb) {
  case 1:
    gather_n<1>(dst, now, words);
    break;
  case 2:
    gather_n<2>(dst, now, words);
    break;
  case 4:
    gather_n<4>(dst, now, words);
    break;
  default:
    gather_n<8>(dst, now, words);
    break;
  }
}

} // namespace sync
RLPT_NAMESPACE_END
#endif // RLPT_HEADER_IMPL()
