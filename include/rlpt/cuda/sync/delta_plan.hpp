// SPDX-License-Identifier: Apache-2.0
//! @file
//! Host side of the device delta codec: the record layout of delta.hpp written once for host
//! and device, the split of tensors into record ranges and warp chunks, the choice of
//! encodings from per-chunk change counts, record headers, and the grouping of records into
//! messages, all exactly as `rlpt::sync::delta_encoder` and the host sender do it, so a device
//! encoder emits the same bytes.
//!
//! Device encoding is two passes: a count kernel compares each chunk of `delta_chunk_elems`
//! elements (record-relative: eight chunks per sparse block) and adds the tensors' wsum64; the
//! host reads the counts, plans records here, and a write kernel fills them (one warp per
//! chunk, each knowing where its first changed element goes). Applying validates every
//! record's arrays on the device before swapping anything.
#pragma once

#include <rlpt/config.hpp>
#include <rlpt/core/error.hpp>
#include <rlpt/cuda/sync/copy_plan.hpp>
#include <rlpt/cuda/sync/wsum.hpp>
#include <rlpt/sync/checksum.hpp>
#include <rlpt/sync/delta.hpp>
#include <rlpt/sync/manifest.hpp>

#include <fmt/core.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string_view>
#include <vector>

RLPT_NAMESPACE_BEGIN
namespace sync::detail {

inline constexpr std::uint64_t delta_chunk_elems = 8192; //!< elements per warp (8 per sparse block)
inline constexpr std::uint64_t delta_chunk_words = delta_chunk_elems / 64;
static_assert(delta_sparse_block % delta_chunk_elems == 0);

[[nodiscard]] RLPT_HD_FORCEINLINE std::uint64_t pad8_hd(std::uint64_t n) noexcept {
  return (n + 7) & ~std::uint64_t{7};
}

//! Byte offsets inside one record (from its header), for any encoding.
struct delta_layout {
  std::uint64_t blocks = 0;       //!< sparse: 65536-element blocks
  std::uint64_t words = 0;        //!< bitmap: 64-bit words
  std::uint64_t lo_at = 0;        //!< sparse: lo[] (block_start[] is at 64)
  std::uint64_t values_at = 0;    //!< values[] (bits[] is at 64 for bitmap)
  std::uint64_t values_bytes = 0; //!< unpadded
  std::uint64_t total = 0;        //!< header + body
};

[[nodiscard]] RLPT_HD_FORCEINLINE delta_layout layout_of(unsigned enc, std::uint64_t n, std::uint64_t changed,
                                                         unsigned eb) noexcept {
  delta_layout l;
  constexpr std::uint64_t h = 64;
  if (enc == 3) { // dense
    l.values_at = h;
    l.values_bytes = n * eb;
  } else if (enc == 2) { // bitmap
    l.words = (n + 63) / 64;
    l.values_at = h + l.words * 8;
    l.values_bytes = changed * eb;
  } else { // sparse
    l.blocks = (n + delta_sparse_block - 1) / delta_sparse_block;
    l.lo_at = h + pad8_hd(4 * (l.blocks + 1));
    l.values_at = l.lo_at + pad8_hd(2 * changed);
    l.values_bytes = changed * eb;
  }
  l.total = l.values_at + pad8_hd(l.values_bytes);
  return l;
}

//! A range of one tensor that becomes at most one record: what delta_encoder calls a range.
struct delta_range {
  std::uint32_t tensor = 0;
  std::uint32_t eb = 0;
  std::uint64_t elem_begin = 0; //!< first element in the tensor
  std::uint64_t elems = 0;
  std::uint64_t chunk_begin = 0; //!< its first chunk among all chunks
  std::uint64_t tensor_bytes = 0;
  std::uint64_t now = 0;  //!< device address of the tensor's element 0 (current values)
  std::uint64_t base = 0; //!< device address of the tensor's element 0 in the base version
};
static_assert(sizeof(delta_range) == 56);

[[nodiscard]] RLPT_HD_FORCEINLINE std::uint64_t chunks_in(std::uint64_t elems) noexcept {
  return (elems + delta_chunk_elems - 1) / delta_chunk_elems;
}

//! Elements per range for records of at most `max_record` bytes (delta_encoder's rule).
[[nodiscard]] inline std::uint64_t range_elems(std::uint64_t max_record, std::size_t eb) noexcept {
  return std::clamp<std::uint64_t>((max_record - delta_header_bytes - 8) / eb, 1, std::uint64_t{1} << 31);
}

//! The ranges of every tensor of `m` in manifest order (device addresses left 0).
[[nodiscard]] inline std::vector<delta_range> plan_delta_ranges(const manifest& m, std::uint64_t max_record,
                                                                std::uint64_t& total_chunks) {
  RLPT_CHECK(max_record >= delta_header_bytes + 64, errors::sync::bad_delta,
             "max_record_bytes {} is too small for a delta record", max_record);
  std::vector<delta_range> out;
  total_chunks = 0;
  for (std::size_t i = 0; i < m.size(); ++i) {
    const std::size_t eb = size_of(m[i].dtype);
    const std::uint64_t n = m[i].numel();
    const std::uint64_t range = range_elems(max_record, eb);
    for (std::uint64_t r0 = 0; r0 < n; r0 += range) {
      delta_range r;
      r.tensor = static_cast<std::uint32_t>(i);
      r.eb = static_cast<std::uint32_t>(eb);
      r.elem_begin = r0;
      r.elems = std::min(range, n - r0);
      r.chunk_begin = total_chunks;
      r.tensor_bytes = m[i].nbytes;
      total_chunks += chunks_in(r.elems);
      out.push_back(r);
    }
  }
  return out;
}

[[nodiscard]] RLPT_HD_FORCEINLINE std::uint64_t popcount_hd(std::uint64_t x) noexcept {
#if RLPT_DEVICE_PASS()
  return static_cast<std::uint64_t>(__popcll(x));
#else
  return popcount64(x);
#endif
}

//! Bytes [lo, hi) of a little-endian word, as a mask (0 <= lo <= hi <= 8).
[[nodiscard]] RLPT_HD_FORCEINLINE std::uint64_t byte_mask(std::uint64_t lo, std::uint64_t hi) noexcept {
  const std::uint64_t upper = hi >= 8 ? ~std::uint64_t{0} : (std::uint64_t{1} << (8 * hi)) - 1;
  const std::uint64_t lower = lo == 0 ? 0 : (std::uint64_t{1} << (8 * lo)) - 1;
  return upper & ~lower;
}

//! Number of nonzero `eb`-byte elements in a word (a XOR of two words: changed elements).
[[nodiscard]] RLPT_HD_FORCEINLINE std::uint64_t nonzero_elements(std::uint64_t x, unsigned eb) noexcept {
  std::uint64_t low = 0; // every bit of an element but its top one
  switch (eb) {
  case 1:
    low = 0x7f7f7f7f7f7f7f7full;
    break;
  case 2:
    low = 0x7fff7fff7fff7fffull;
    break;
  case 4:
    low = 0x7fffffff7fffffffull;
    break;
  default:
    return x != 0 ? 1 : 0;
  }
  // Per element: (x & low) + low carries into the top bit iff the low bits are nonzero, and
  // never out of the element; OR-ing x adds the top bit itself.
  return popcount_hd((((x & low) + low) | x) & ~low);
}

//! Loads the `avail` bytes (a multiple of eb, at most 8) at p as a little-endian word.
[[nodiscard]] RLPT_HD_FORCEINLINE std::uint64_t load_word(const unsigned char* p, std::uint64_t avail, unsigned eb,
                                                          bool aligned8) noexcept {
  if (avail == 8 && aligned8) return load_as<std::uint64_t>(p);
  std::uint64_t v = 0;
  for (std::uint64_t k = 0; k < avail; k += eb) v |= load_bits(p + k, eb) << (8 * k);
  return v;
}

//! One word of the count pass: counts the changed elements of word `w` of range r's tensor
//! inside bytes [b0, b1) (a chunk), and adds the word's wsum64 term to `sum` when the word
//! starts inside [b0, b1) (each word of a tensor belongs to exactly one chunk).
[[nodiscard]] RLPT_HD_FORCEINLINE std::uint64_t delta_count_word(const delta_range& r, std::uint64_t b0,
                                                                 std::uint64_t b1, std::uint64_t w,
                                                                 std::uint64_t& sum) noexcept {
  const std::uint64_t wb = w * 8;
  const std::uint64_t avail = r.tensor_bytes - wb < 8 ? r.tensor_bytes - wb : 8;
  const bool aligned8 = ((r.now | r.base) & 7u) == 0;
  const std::uint64_t nw = load_word(reinterpret_cast<const unsigned char*>(r.now) + wb, avail, r.eb, aligned8);
  const std::uint64_t bw = load_word(reinterpret_cast<const unsigned char*>(r.base) + wb, avail, r.eb, aligned8);
  if (wb >= b0 && wb < b1) sum += wsum_term(nw, w);
  const std::uint64_t lo = wb < b0 ? b0 - wb : 0;
  const std::uint64_t hi = b1 - wb < 8 ? b1 - wb : 8;
  return nonzero_elements((nw ^ bw) & byte_mask(lo, hi), r.eb);
}

//! Byte range [b0, b1) (in the tensor) of chunk c of range r.
RLPT_HD_FORCEINLINE void chunk_bytes(const delta_range& r, std::uint64_t c, std::uint64_t& b0,
                                     std::uint64_t& b1) noexcept {
  const std::uint64_t e0 = r.elem_begin + c * delta_chunk_elems;
  const std::uint64_t end = r.elem_begin + r.elems;
  const std::uint64_t e1 = e0 + delta_chunk_elems < end ? e0 + delta_chunk_elems : end;
  b0 = e0 * r.eb;
  b1 = e1 * r.eb;
}

//! Host reference of the count kernel: per-chunk counts and per-tensor raw wsum64.
inline void delta_count_host(std::span<const delta_range> ranges, std::span<std::uint32_t> counts,
                             std::span<std::uint64_t> tensor_sums) {
  for (const auto& r : ranges)
    for (std::uint64_t c = 0; c < chunks_in(r.elems); ++c) {
      std::uint64_t b0 = 0, b1 = 0, sum = 0, n = 0;
      chunk_bytes(r, c, b0, b1);
      for (std::uint64_t w = b0 / 8; w < (b1 + 7) / 8; ++w) n += delta_count_word(r, b0, b1, w, sum);
      counts[r.chunk_begin + c] = static_cast<std::uint32_t>(n);
      tensor_sums[r.tensor] += sum;
    }
}

//! The 64-byte record header of delta.hpp.
inline std::array<unsigned char, 64> delta_header(delta_encoding enc, std::uint32_t eb, std::uint32_t tensor,
                                                  std::uint64_t first, std::uint64_t n, std::uint64_t changed,
                                                  std::uint64_t body, std::uint64_t base_checksum) {
  std::array<unsigned char, 64> h{};
  const std::uint32_t magic = delta_magic;
  const auto e8 = static_cast<std::uint8_t>(enc);
  const auto eb8 = static_cast<std::uint8_t>(eb);
  const std::uint64_t f[5] = {first, n, changed, body, base_checksum};
  std::memcpy(h.data(), &magic, 4);
  std::memcpy(h.data() + 4, &e8, 1);
  std::memcpy(h.data() + 5, &eb8, 1);
  std::memcpy(h.data() + 8, &tensor, 4);
  std::memcpy(h.data() + 16, f, 40);
  const std::uint64_t check = xxh3(h.data(), 56);
  std::memcpy(h.data() + 56, &check, 8);
  return h;
}

struct delta_plan_record {
  std::uint32_t range = 0;
  delta_encoding encoding = delta_encoding::dense;
  std::uint64_t changed = 0; //!< as written (dense: every element)
  std::uint64_t total = 0;   //!< header + body bytes
  std::uint64_t offset = 0;  //!< within its message
  std::array<unsigned char, 64> header{};
};

struct delta_plan_message {
  std::uint64_t bytes = 0;
  std::size_t record_begin = 0, record_end = 0;
};

struct delta_plan {
  std::vector<delta_plan_record> records;
  std::vector<delta_plan_message> messages;
  std::vector<std::uint32_t> firsts; //!< per chunk: index of its first changed element in its record
  delta_stats stats{};
};

//! Chooses encodings (smallest body; ties keep dense, then bitmap, as delta_encoder), writes
//! headers and groups records into messages of at most `max_msg` bytes (a record never
//! straddles messages; one larger than `max_msg` travels alone), like the host sender.
inline delta_plan plan_delta(std::span<const delta_range> ranges, std::span<const std::uint32_t> counts,
                             std::span<const std::uint64_t> base_checksums, std::uint64_t max_msg) {
  delta_plan p;
  p.firsts.assign(counts.size(), 0);
  std::uint32_t last_tensor = 0xffffffffu;
  for (std::size_t ri = 0; ri < ranges.size(); ++ri) {
    const delta_range& r = ranges[ri];
    if (r.tensor != last_tensor) {
      p.stats.dense_bytes += r.tensor_bytes;
      last_tensor = r.tensor;
    }
    p.stats.elements += r.elems;
    const std::uint64_t nc = chunks_in(r.elems);
    RLPT_CHECK(r.chunk_begin + nc <= counts.size(), errors::sync::bad_delta,
               "delta plan: range {} needs chunks [{}, {}) of {}", ri, r.chunk_begin, r.chunk_begin + nc,
               counts.size());
    std::uint64_t changed = 0;
    for (std::uint64_t c = 0; c < nc; ++c) {
      p.firsts[r.chunk_begin + c] = static_cast<std::uint32_t>(changed);
      changed += counts[r.chunk_begin + c];
    }
    RLPT_CHECK(changed <= r.elems, errors::sync::bad_delta, "delta plan: range {} counts {} changes among {} elements",
               ri, changed, r.elems);
    p.stats.changed += changed;
    if (changed == 0) continue;
    std::uint64_t s_sparse = 0, s_bitmap = 0, s_dense = 0;
    static_cast<void>(delta_body_bytes(delta_encoding::sparse, r.elems, changed, r.eb, s_sparse));
    static_cast<void>(delta_body_bytes(delta_encoding::bitmap, r.elems, changed, r.eb, s_bitmap));
    static_cast<void>(delta_body_bytes(delta_encoding::dense, r.elems, changed, r.eb, s_dense));
    delta_plan_record rec;
    rec.range = static_cast<std::uint32_t>(ri);
    rec.encoding = delta_encoding::dense;
    std::uint64_t body = s_dense;
    if (s_bitmap < body) {
      rec.encoding = delta_encoding::bitmap;
      body = s_bitmap;
    }
    if (s_sparse < body) {
      rec.encoding = delta_encoding::sparse;
      body = s_sparse;
    }
    rec.changed = rec.encoding == delta_encoding::dense ? r.elems : changed;
    rec.total = delta_header_bytes + body;
    RLPT_CHECK(r.tensor < base_checksums.size(), errors::sync::bad_delta, "delta plan: no base checksum for tensor #{}",
               r.tensor);
    rec.header =
        delta_header(rec.encoding, r.eb, r.tensor, r.elem_begin, r.elems, rec.changed, body, base_checksums[r.tensor]);
    p.stats.bytes += rec.total;
    p.stats.records += 1;
    p.stats.by_encoding[static_cast<int>(rec.encoding)] += 1;
    if (p.messages.empty() || (p.messages.back().bytes > 0 && p.messages.back().bytes + rec.total > max_msg))
      p.messages.push_back({0, p.records.size(), p.records.size()});
    rec.offset = p.messages.back().bytes;
    p.messages.back().bytes += rec.total;
    p.messages.back().record_end = p.records.size() + 1;
    p.records.push_back(rec);
  }
  return p;
}

// Record headers are parsed by parse_delta_head (rlpt/sync/delta.hpp), shared with the host parser.

} // namespace sync::detail
RLPT_NAMESPACE_END
