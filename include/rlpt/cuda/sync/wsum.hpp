// SPDX-License-Identifier: Apache-2.0
//! @file
//! wsum64: the checksum of the device transports, computable in parallel on a GPU and the same
//! on the host.
//!
//! XXH3 (the host transports' checksum) folds its input sequentially, so a GPU cannot hash a
//! 512 MiB bucket at memory speed. wsum64 is a sum, modulo 2^64, of one mixed term per 8-byte
//! little-endian word; each term mixes the word with its position, so reordered, changed or
//! shifted words change the sum, and any subset of words can be summed in any order (atomics
//! in any block order give the same bits):
//!
//!     term(w, i) = mix(w + (i + 1) * 0x9e3779b97f4a7c15)      i = byte offset / 8 in the tensor
//!     raw        = sum of term over the words (the last one zero-padded)
//!     wsum64     = mix(raw ^ mix(nbytes + 0x5851f42d4c957f2d))
//!
//! `mix` is the splitmix64 finaliser (a bijection), so one changed word always changes its term.
//! Raw sums of consecutive 8-byte-aligned pieces of a tensor add up to the raw sum of the tensor:
//! a bucket piece is checked on its own and the tensor checksum follows from its pieces.
//! Not a cryptographic hash: it detects corruption and races (a slot overwritten while being
//! read), not forgery.
#pragma once

#include <rlpt/config.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>

RLPT_NAMESPACE_BEGIN
namespace sync {

//! splitmix64's finaliser.
[[nodiscard]] RLPT_HD_FORCEINLINE std::uint64_t wsum_mix(std::uint64_t x) noexcept {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return x;
}

//! The term of little-endian word `word` at word index `index` of its tensor.
[[nodiscard]] RLPT_HD_FORCEINLINE std::uint64_t wsum_term(std::uint64_t word, std::uint64_t index) noexcept {
  return wsum_mix(word + (index + 1) * 0x9e3779b97f4a7c15ull);
}

//! The checksum of a tensor of `nbytes` bytes whose terms sum to `raw`.
[[nodiscard]] RLPT_HD_FORCEINLINE std::uint64_t wsum_finish(std::uint64_t raw, std::uint64_t nbytes) noexcept {
  return wsum_mix(raw ^ wsum_mix(nbytes + 0x5851f42d4c957f2dull));
}

//! Raw sum of `n` bytes that start at byte `at` (a multiple of 8) of their tensor; the bytes
//! past `n` in the last word count as zero (`n` is where the tensor, or this piece, ends).
[[nodiscard]] inline std::uint64_t wsum_raw(const void* data, std::uint64_t n, std::uint64_t at = 0) noexcept {
  const auto* p = static_cast<const unsigned char*>(data);
  const std::uint64_t first = at / 8;
  std::uint64_t raw = 0;
  const std::uint64_t full = n / 8;
  for (std::uint64_t w = 0; w < full; ++w) {
    std::uint64_t v;
    std::memcpy(&v, p + w * 8, 8);
    raw += wsum_term(v, first + w);
  }
  if (const std::uint64_t rest = n % 8; rest != 0) {
    std::uint64_t v = 0;
    std::memcpy(&v, p + full * 8, static_cast<std::size_t>(rest));
    raw += wsum_term(v, first + full);
  }
  return raw;
}

//! wsum64 of a whole tensor held contiguously in host memory.
[[nodiscard]] inline std::uint64_t wsum(const void* data, std::uint64_t n) noexcept {
  return wsum_finish(wsum_raw(data, n, 0), n);
}

} // namespace sync
RLPT_NAMESPACE_END
