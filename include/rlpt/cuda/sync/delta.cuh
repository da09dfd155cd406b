// SPDX-License-Identifier: Apache-2.0
//! @file
//! Device delta codec: change detection and encoding on the sender, validation and in-place
//! application on the receiver, in the record format of sync/delta.hpp (the bytes equal the
//! host encoder's for the same inputs and record size).
//!
//! Encoding (`device_delta_encoder`): a count kernel compares the current and base bytes of
//! every 8192-element chunk and sums the tensors' wsum64 in the same pass; the host reads the
//! counts, picks each record's encoding and layout (delta_plan.hpp) and uploads where each
//! chunk's first change goes; a write kernel (one warp per chunk, ballots for the bitmap and
//! the sparse indices) fills the records of one message straight into a payload buffer.
//!
//! Applying (`device_delta_applier`): records staged in device memory are validated first
//! (header copy, bitmap tails and counts, sparse block prefix and strictly increasing indices
//! in range: hostile records cannot write out of bounds or race), then swapped into the
//! targets in place. Swapping leaves the replaced values in the records, so applying again
//! undoes the update (a failed result checksum rolls back). Targets never move, so CUDA
//! graphs that captured them stay valid.
#pragma once

#include <rlpt/config.hpp>
#include <rlpt/core/error.hpp>
#include <rlpt/cuda/error.cuh>
#include <rlpt/cuda/resources.cuh>
#include <rlpt/cuda/sync/copy.cuh>
#include <rlpt/cuda/sync/delta_plan.hpp>
#include <rlpt/cuda/sync/device_link.cuh> // the sync names of the CUDA resources
#include <rlpt/sync/delta.hpp>
#include <rlpt/sync/manifest.hpp>

#include <cuda_runtime_api.h>

#include <fmt/core.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <vector>

RLPT_NAMESPACE_BEGIN
namespace sync {
namespace detail {

inline constexpr unsigned delta_warps = 8; // warps (chunks) per block

//! One record of a message, as the write kernel needs it.
struct delta_write_rec {
  std::uint64_t now = 0, base = 0; //!< addresses of the record's element 0
  std::uint64_t out = 0;           //!< byte offset in the message
  std::uint64_t elems = 0, changed = 0;
  std::uint64_t chunk_begin = 0; //!< first warp of this record in its launch
  std::uint64_t first_chunk = 0; //!< its chunk 0 among all chunks (index into firsts)
  std::uint32_t eb = 0, enc = 0;
  unsigned char header[64] = {};
};
static_assert(sizeof(delta_write_rec) == 128);

//! One staged record, as validation and application need it.
struct delta_apply_rec {
  std::uint64_t target = 0; //!< address of the record's element 0 in its target
  std::uint64_t at = 0;     //!< byte offset of the record in the arena
  std::uint64_t elems = 0, changed = 0;
  std::uint64_t vunit_begin = 0; //!< first validation warp
  std::uint64_t aunit_begin = 0; //!< first application warp
  std::uint64_t pop_begin = 0;   //!< bitmap: first per-chunk popcount / offset
  std::uint32_t eb = 0, enc = 0;
  unsigned char header[64] = {};
};
static_assert(sizeof(delta_apply_rec) == 128);

enum delta_fault : std::uint32_t {
  fault_header = 1, //!< the staged header differs from the announced one
  fault_tail = 2,   //!< bitmap bits past the element range
  fault_blocks = 4, //!< sparse block_start is not a prefix from 0 to `changed`
  fault_range = 8,  //!< a sparse index past the element range
  fault_order = 16, //!< sparse indices not strictly increasing in a block
  fault_count = 32, //!< bitmap bits do not add up to `changed` (found on the host)
};

//! Last entry of `begin` (a field of T at stride) <= x among [0, n): binary search.
template <class T, class Key>
__device__ __forceinline__ std::uint64_t find_last_le(const T* a, std::uint64_t n, std::uint64_t x, Key key) {
  std::uint64_t lo = 0, hi = n;
  while (lo < hi) {
    const std::uint64_t mid = (lo + hi) / 2;
    if (key(a[mid]) <= x)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo == 0 ? 0 : lo - 1;
}

// A template: kernels defined in a header need vague linkage, or the host-side launch wrappers of two
// translation units that include it collide at link time.
template <int = 0>
RLPT_KERNEL void __launch_bounds__(delta_warps * 32)
    delta_count_kernel(const delta_range* ranges, std::uint64_t n_ranges, std::uint64_t chunks, std::uint32_t* counts,
                       std::uint64_t* tensor_sums) {
  const std::uint64_t g = std::uint64_t{blockIdx.x} * delta_warps + threadIdx.x / 32;
  const unsigned lane = threadIdx.x % 32;
  if (g >= chunks) return;
  const delta_range r = ranges[find_last_le(ranges, n_ranges, g, [](const delta_range& x) { return x.chunk_begin; })];
  std::uint64_t b0 = 0, b1 = 0;
  chunk_bytes(r, g - r.chunk_begin, b0, b1);
  std::uint64_t n = 0, sum = 0;
  const std::uint64_t w_end = (b1 + 7) / 8;
#pragma unroll 4
  for (std::uint64_t w = b0 / 8 + lane; w < w_end; w += 32) n += delta_count_word(r, b0, b1, w, sum);
  for (int o = 16; o > 0; o /= 2) {
    n += __shfl_down_sync(0xffffffffu, n, o);
    sum += __shfl_down_sync(0xffffffffu, sum, o);
  }
  if (lane == 0) {
    counts[g] = static_cast<std::uint32_t>(n);
    if (sum != 0) atomicAdd(reinterpret_cast<unsigned long long*>(tensor_sums + r.tensor), sum);
  }
}

__device__ __forceinline__ void zero_bytes(unsigned char* p, std::uint64_t from, std::uint64_t to) {
  for (std::uint64_t i = from; i < to; ++i) p[i] = 0;
}

template <int = 0>
RLPT_KERNEL void __launch_bounds__(delta_warps * 32)
    delta_write_kernel(const delta_write_rec* recs, std::uint64_t n_recs, std::uint64_t chunks,
                       const std::uint32_t* firsts, unsigned char* out_base) {
  const std::uint64_t g = std::uint64_t{blockIdx.x} * delta_warps + threadIdx.x / 32;
  const unsigned lane = threadIdx.x % 32;
  if (g >= chunks) return;
  const delta_write_rec& r =
      recs[find_last_le(recs, n_recs, g, [](const delta_write_rec& x) { return x.chunk_begin; })];
  const std::uint64_t c = g - r.chunk_begin;
  const unsigned eb = r.eb;
  const delta_layout lay = layout_of(r.enc, r.elems, r.changed, eb);
  unsigned char* rec = out_base + r.out;
  const auto* now = reinterpret_cast<const unsigned char*>(r.now);
  const auto* base = reinterpret_cast<const unsigned char*>(r.base);
  unsigned char* values = rec + lay.values_at;
  if (c == 0) { // header, padding, the sparse prefix's last entry
    if (lane < 8) store_as<std::uint64_t>(rec + 8 * lane, load_as<std::uint64_t>(r.header + 8 * lane));
    if (lane == 0) {
      zero_bytes(values, lay.values_bytes, pad8_hd(lay.values_bytes));
      if (r.enc == 1) {
        store_as<std::uint32_t>(rec + 64 + 4 * lay.blocks, static_cast<std::uint32_t>(r.changed));
        zero_bytes(rec, 64 + 4 * (lay.blocks + 1), lay.lo_at);
        zero_bytes(rec, lay.lo_at + 2 * r.changed, lay.values_at);
      }
    }
  }
  const std::uint64_t e_begin = c * delta_chunk_elems;
  const std::uint64_t e_end = e_begin + delta_chunk_elems < r.elems ? e_begin + delta_chunk_elems : r.elems;
  if (r.enc == 3) { // dense: every element
    for (std::uint64_t i = e_begin + lane; i < e_end; i += 32)
      store_bits(values + i * eb, eb, load_bits(now + i * eb, eb));
    return;
  }
  std::uint64_t k = firsts[r.first_chunk + c];
  if (r.enc == 1 && c % (delta_sparse_block / delta_chunk_elems) == 0 && lane == 0)
    store_as<std::uint32_t>(rec + 64 + 4 * (c / (delta_sparse_block / delta_chunk_elems)),
                            static_cast<std::uint32_t>(k));
  const unsigned below = (1u << lane) - 1u;
  for (std::uint64_t e = e_begin; e < e_end; e += 64) {
    const std::uint64_t i0 = e + lane, i1 = e + 32 + lane;
    const bool d0 = i0 < e_end && load_bits(now + i0 * eb, eb) != load_bits(base + i0 * eb, eb);
    const bool d1 = i1 < e_end && load_bits(now + i1 * eb, eb) != load_bits(base + i1 * eb, eb);
    const unsigned m0 = __ballot_sync(0xffffffffu, d0);
    const unsigned m1 = __ballot_sync(0xffffffffu, d1);
    const std::uint64_t k0 = k + static_cast<std::uint64_t>(__popc(m0 & below));
    const std::uint64_t k1 =
        k + static_cast<std::uint64_t>(__popc(m0)) + static_cast<std::uint64_t>(__popc(m1 & below));
    if (r.enc == 2) {
      if (lane == 0) store_as<std::uint64_t>(rec + 64 + e / 8, (std::uint64_t{m1} << 32) | m0);
    } else {
      auto* lo = rec + lay.lo_at;
      if (d0) store_as<std::uint16_t>(lo + 2 * k0, static_cast<std::uint16_t>(i0 % delta_sparse_block));
      if (d1) store_as<std::uint16_t>(lo + 2 * k1, static_cast<std::uint16_t>(i1 % delta_sparse_block));
    }
    if (d0) store_bits(values + k0 * eb, eb, load_bits(now + i0 * eb, eb));
    if (d1) store_bits(values + k1 * eb, eb, load_bits(now + i1 * eb, eb));
    k += static_cast<std::uint64_t>(__popc(m0) + __popc(m1));
  }
}

__device__ __forceinline__ std::uint64_t validate_units(const delta_apply_rec& r) {
  const delta_layout l = layout_of(r.enc, r.elems, r.changed, r.eb);
  if (r.enc == 2) return chunks_in(r.elems);
  if (r.enc == 1) return (l.blocks + 1 + r.changed + delta_chunk_elems - 1) / delta_chunk_elems;
  return 1;
}

//! Sparse: the block holding entry k (block_start is searched even when invalid: the result
//! stays in [0, blocks) and validation flags the record).
__device__ __forceinline__ std::uint64_t sparse_block_of(const std::uint32_t* block_start, std::uint64_t blocks,
                                                         std::uint64_t k) {
  std::uint64_t lo = 0, hi = blocks + 1; // first index with block_start > k
  while (lo < hi) {
    const std::uint64_t mid = (lo + hi) / 2;
    if (block_start[mid] <= k)
      lo = mid + 1;
    else
      hi = mid;
  }
  const std::uint64_t b = lo == 0 ? 0 : lo - 1;
  return b < blocks ? b : blocks - 1;
}

template <int = 0>
RLPT_KERNEL void __launch_bounds__(delta_warps * 32)
    delta_validate_kernel(const delta_apply_rec* recs, std::uint64_t n_recs, std::uint64_t units,
                          const unsigned char* arena, std::uint32_t* faults, std::uint32_t* pops) {
  const std::uint64_t g = std::uint64_t{blockIdx.x} * delta_warps + threadIdx.x / 32;
  const unsigned lane = threadIdx.x % 32;
  if (g >= units) return;
  const std::uint64_t ri = find_last_le(recs, n_recs, g, [](const delta_apply_rec& x) { return x.vunit_begin; });
  const delta_apply_rec& r = recs[ri];
  const std::uint64_t u = g - r.vunit_begin;
  const unsigned char* rec = arena + r.at;
  const delta_layout lay = layout_of(r.enc, r.elems, r.changed, r.eb);
  std::uint32_t fault = 0;
  if (u == 0 && lane < 8 && load_as<std::uint64_t>(rec + 8 * lane) != load_as<std::uint64_t>(r.header + 8 * lane))
    fault |= fault_header;
  if (r.enc == 2) {
    const auto* bits = reinterpret_cast<const std::uint64_t*>(rec + 64);
    std::uint64_t ones = 0;
    const std::uint64_t w_end = (u + 1) * delta_chunk_words < lay.words ? (u + 1) * delta_chunk_words : lay.words;
    for (std::uint64_t w = u * delta_chunk_words + lane; w < w_end; w += 32) {
      const std::uint64_t x = bits[w];
      ones += static_cast<std::uint64_t>(__popcll(x));
      if (w == lay.words - 1 && r.elems % 64 != 0 && (x >> (r.elems % 64)) != 0) fault |= fault_tail;
    }
    for (int o = 16; o > 0; o /= 2) ones += __shfl_down_sync(0xffffffffu, ones, o);
    if (lane == 0) pops[r.pop_begin + u] = static_cast<std::uint32_t>(ones);
  } else if (r.enc == 1) {
    const auto* bs = reinterpret_cast<const std::uint32_t*>(rec + 64);
    const auto* lo = reinterpret_cast<const std::uint16_t*>(rec + lay.lo_at);
    const std::uint64_t items = lay.blocks + 1 + r.changed;
    const std::uint64_t i_end = (u + 1) * delta_chunk_elems < items ? (u + 1) * delta_chunk_elems : items;
    for (std::uint64_t i = u * delta_chunk_elems + lane; i < i_end; i += 32) {
      if (i <= lay.blocks) {
        const std::uint64_t v = bs[i];
        if ((i == 0 && v != 0) || (i == lay.blocks && v != r.changed) || (i > 0 && bs[i - 1] > v) || v > r.changed)
          fault |= fault_blocks;
      } else {
        const std::uint64_t k = i - (lay.blocks + 1);
        const std::uint64_t b = sparse_block_of(bs, lay.blocks, k);
        if (b * delta_sparse_block + lo[k] >= r.elems) fault |= fault_range;
        if (k > bs[b] && lo[k - 1] >= lo[k]) fault |= fault_order;
      }
    }
  }
  if (fault != 0) atomicOr(faults + ri, fault);
}

__device__ __forceinline__ void swap_elem(unsigned char* a, unsigned char* b, unsigned eb) {
  const std::uint64_t x = load_bits(a, eb), y = load_bits(b, eb);
  store_bits(a, eb, y);
  store_bits(b, eb, x);
}

template <int = 0>
RLPT_KERNEL void __launch_bounds__(delta_warps * 32)
    delta_apply_kernel(const delta_apply_rec* recs, std::uint64_t n_recs, std::uint64_t units, unsigned char* arena,
                       const std::uint32_t* firsts) {
  const std::uint64_t g = std::uint64_t{blockIdx.x} * delta_warps + threadIdx.x / 32;
  const unsigned lane = threadIdx.x % 32;
  if (g >= units) return;
  const delta_apply_rec& r =
      recs[find_last_le(recs, n_recs, g, [](const delta_apply_rec& x) { return x.aunit_begin; })];
  const std::uint64_t u = g - r.aunit_begin;
  unsigned char* rec = arena + r.at;
  const unsigned eb = r.eb;
  const delta_layout lay = layout_of(r.enc, r.elems, r.changed, eb);
  unsigned char* values = rec + lay.values_at;
  auto* target = reinterpret_cast<unsigned char*>(r.target);
  if (r.enc == 3) {
    const std::uint64_t e_end = (u + 1) * delta_chunk_elems < r.elems ? (u + 1) * delta_chunk_elems : r.elems;
    for (std::uint64_t i = u * delta_chunk_elems + lane; i < e_end; i += 32)
      swap_elem(target + i * eb, values + i * eb, eb);
  } else if (r.enc == 2) {
    const auto* bits = reinterpret_cast<const std::uint64_t*>(rec + 64);
    std::uint64_t k = firsts[r.pop_begin + u];
    const std::uint64_t w_end = (u + 1) * delta_chunk_words < lay.words ? (u + 1) * delta_chunk_words : lay.words;
    for (std::uint64_t w0 = u * delta_chunk_words; w0 < w_end; w0 += 32) {
      const std::uint64_t w = w0 + lane;
      std::uint64_t x = w < w_end ? bits[w] : 0;
      const std::uint64_t ones = static_cast<std::uint64_t>(__popcll(x));
      std::uint64_t before = ones; // inclusive scan, then exclusive
      for (int o = 1; o < 32; o *= 2) {
        const std::uint64_t y = __shfl_up_sync(0xffffffffu, before, o);
        if (static_cast<int>(lane) >= o) before += y;
      }
      const std::uint64_t total = __shfl_sync(0xffffffffu, before, 31);
      std::uint64_t j = k + before - ones;
      for (; x != 0; x &= x - 1, ++j) {
        const std::uint64_t i = w * 64 + static_cast<std::uint64_t>(__ffsll(static_cast<long long>(x)) - 1);
        swap_elem(target + i * eb, values + j * eb, eb);
      }
      k += total;
    }
  } else {
    const auto* bs = reinterpret_cast<const std::uint32_t*>(rec + 64);
    const auto* lo = reinterpret_cast<const std::uint16_t*>(rec + lay.lo_at);
    const std::uint64_t k_end = (u + 1) * delta_chunk_elems < r.changed ? (u + 1) * delta_chunk_elems : r.changed;
    for (std::uint64_t k = u * delta_chunk_elems + lane; k < k_end; k += 32) {
      const std::uint64_t i = sparse_block_of(bs, lay.blocks, k) * delta_sparse_block + lo[k];
      swap_elem(target + i * eb, values + k * eb, eb);
    }
  }
}

[[nodiscard]] inline unsigned delta_grid(std::uint64_t warps) {
  const std::uint64_t blocks = (warps + delta_warps - 1) / delta_warps;
  RLPT_CHECK(blocks <= 0x7fffffffu, errors::sync::too_large, "a delta launch of {} warps is more than a grid holds",
             warps);
  return static_cast<unsigned>(blocks);
}

} // namespace detail

//! Encodes the changes between current and base device bytes of a manifest's tensors (both in
//! the wire dtype, same layout) into delta.hpp records. Owns its device tables (sized once);
//! plan() synchronises (it must read the counts), write() does not.
class device_delta_encoder {
public:
  //! `now[i]` and `base[i]`: device addresses of tensor i's current and base-version bytes.
  //! `max_record`: the largest record in bytes (the host sender uses min(bucket, slot) bytes).
  device_delta_encoder(const manifest& m, std::span<const void* const> now, std::span<const void* const> base,
                       std::uint64_t max_record)
      : tensors_(m.size()), max_record_(max_record) {
    RLPT_CHECK(now.size() == m.size() && base.size() == m.size(), errors::sync::bad_delta,
               "device delta encoder: {} current and {} base addresses for {} tensors", now.size(), base.size(),
               m.size());
    ranges_ = detail::plan_delta_ranges(m, max_record, chunks_);
    for (auto& r : ranges_) {
      r.now = reinterpret_cast<std::uintptr_t>(now[r.tensor]);
      r.base = reinterpret_cast<std::uintptr_t>(base[r.tensor]);
      RLPT_CHECK(r.now % r.eb == 0 && r.base % r.eb == 0, errors::sync::bad_source,
                 "device delta encoder: tensor \"{}\" is not aligned to its {}-byte elements", m[r.tensor].name, r.eb);
    }
    d_ranges_ = detail::device_bytes(ranges_.size() * sizeof(detail::delta_range));
    if (!ranges_.empty())
      RLPT_CUDA_CHECK(cudaMemcpy(d_ranges_.get(), ranges_.data(), ranges_.size() * sizeof(detail::delta_range),
                                 cudaMemcpyHostToDevice));
    d_counts_ = detail::device_bytes(std::max<std::size_t>(1, chunks_) * 4);
    d_firsts_ = detail::device_bytes(std::max<std::size_t>(1, chunks_) * 4);
    d_sums_ = detail::device_bytes(std::max<std::size_t>(1, tensors_) * 8);
    h_counts_.reserve(std::max<std::size_t>(1, chunks_) * 4);
    h_firsts_.reserve(std::max<std::size_t>(1, chunks_) * 4);
    h_sums_.reserve(std::max<std::size_t>(1, tensors_) * 8);
  }

  [[nodiscard]] std::uint64_t chunks() const noexcept { return chunks_; }

  //! Pass 1 and planning: counts changes and the current bytes' wsum64 on `s`, waits for them
  //! (rlpt.sync.timeout at `until`), chooses the records (base_checksums[i] goes into tensor
  //! i's headers) and groups them into messages of at most `max_msg` bytes.
  const detail::delta_plan& plan(std::span<const std::uint64_t> base_checksums, std::uint64_t max_msg, cudaStream_t s,
                                 deadline until, std::string_view where) {
    detail::wait_event(uploaded_.get(), until, where,
                       "waiting for the previous delta upload"); // pinned tables are reused
    RLPT_CUDA_CHECK(cudaMemsetAsync(d_sums_.get(), 0, tensors_ * 8, s));
    if (chunks_ != 0) {
      detail::delta_count_kernel<><<<detail::delta_grid(chunks_), detail::delta_warps * 32, 0, s>>>(
          d_ranges_.get<detail::delta_range>(), ranges_.size(), chunks_, d_counts_.get<std::uint32_t>(),
          d_sums_.get<std::uint64_t>());
      RLPT_CUDA_CHECK_LAUNCH();
      RLPT_CUDA_CHECK(cudaMemcpyAsync(h_counts_.get(), d_counts_.get(), chunks_ * 4, cudaMemcpyDeviceToHost, s));
    }
    RLPT_CUDA_CHECK(cudaMemcpyAsync(h_sums_.get(), d_sums_.get(), tensors_ * 8, cudaMemcpyDeviceToHost, s));
    detail::wait_stream(counted_, s, until, where, "counting changed elements");
    plan_ = detail::plan_delta(ranges_, std::span<const std::uint32_t>(h_counts_.get<std::uint32_t>(), chunks_),
                               base_checksums, max_msg);
    // Upload every message's write table and the chunk offsets at once.
    std::vector<detail::delta_write_rec> table;
    table.reserve(plan_.records.size());
    launches_.clear();
    for (const auto& msg : plan_.messages) {
      launch l{table.size(), 0, 0};
      for (std::size_t k = msg.record_begin; k < msg.record_end; ++k) {
        const auto& pr = plan_.records[k];
        const detail::delta_range& r = ranges_[pr.range];
        detail::delta_write_rec w;
        w.now = r.now + r.elem_begin * r.eb;
        w.base = r.base + r.elem_begin * r.eb;
        w.out = pr.offset;
        w.elems = r.elems;
        w.changed = pr.changed;
        w.chunk_begin = l.chunks;
        w.first_chunk = r.chunk_begin;
        w.eb = r.eb;
        w.enc = static_cast<std::uint32_t>(pr.encoding);
        std::memcpy(w.header, pr.header.data(), 64);
        l.chunks += detail::chunks_in(r.elems);
        table.push_back(w);
      }
      l.end = table.size();
      launches_.push_back(l);
    }
    h_table_.reserve(std::max<std::size_t>(1, table.size()) * sizeof(detail::delta_write_rec));
    d_table_.reserve(std::max<std::size_t>(1, table.size()) * sizeof(detail::delta_write_rec));
    if (!table.empty()) {
      std::memcpy(h_table_.get(), table.data(), table.size() * sizeof(detail::delta_write_rec));
      RLPT_CUDA_CHECK(cudaMemcpyAsync(d_table_.get(), h_table_.get(), table.size() * sizeof(detail::delta_write_rec),
                                      cudaMemcpyHostToDevice, s));
      std::memcpy(h_firsts_.get(), plan_.firsts.data(), plan_.firsts.size() * 4);
      RLPT_CUDA_CHECK(
          cudaMemcpyAsync(d_firsts_.get(), h_firsts_.get(), plan_.firsts.size() * 4, cudaMemcpyHostToDevice, s));
    }
    uploaded_.record(s);
    return plan_;
  }

  //! Raw wsum64 of each tensor's current bytes (after plan()); finish with wsum_finish.
  [[nodiscard]] std::span<const std::uint64_t> tensor_raw_sums() const noexcept {
    return {h_sums_.get<std::uint64_t>(), tensors_};
  }

  [[nodiscard]] const detail::delta_plan& last_plan() const noexcept { return plan_; }

  //! Pass 2: writes message k of the last plan into `out` (device, 8-byte aligned, at least
  //! the message's bytes), on `s` (which must be ordered after plan()'s stream).
  void write(std::size_t k, void* out, cudaStream_t s) const {
    RLPT_CHECK(k < launches_.size(), errors::sync::bad_delta, "delta message {} of {}", k, launches_.size());
    RLPT_CHECK(reinterpret_cast<std::uintptr_t>(out) % 8 == 0, errors::sync::bad_delta,
               "delta output is not 8-byte aligned");
    const launch& l = launches_[k];
    if (l.chunks == 0) return;
    detail::delta_write_kernel<><<<detail::delta_grid(l.chunks), detail::delta_warps * 32, 0, s>>>(
        d_table_.get<detail::delta_write_rec>() + l.begin, l.end - l.begin, l.chunks, d_firsts_.get<std::uint32_t>(),
        static_cast<unsigned char*>(out));
    RLPT_CUDA_CHECK_LAUNCH();
  }

private:
  struct launch {
    std::size_t begin = 0, end = 0;
    std::uint64_t chunks = 0;
  };

  std::size_t tensors_ = 0;
  std::uint64_t max_record_ = 0;
  std::uint64_t chunks_ = 0;
  std::vector<detail::delta_range> ranges_;
  detail::device_bytes d_ranges_, d_counts_, d_firsts_, d_sums_, d_table_;
  detail::pinned_bytes h_counts_, h_firsts_, h_sums_, h_table_;
  detail::event counted_, uploaded_;
  detail::delta_plan plan_;
  std::vector<launch> launches_;
};

//! A staged record to apply: its header (as announced; the staged copy must match), where it
//! lies in the arena, and the device address of its target tensor's element 0.
struct device_delta_record {
  detail::delta_head head{};
  std::array<unsigned char, 64> header{};
  std::uint64_t at = 0;
  void* target = nullptr;
};

//! Validates staged delta records on the device and swaps them into their targets.
class device_delta_applier {
public:
  //! Validates `recs` (in `arena`, device) and, if every record is sound, enqueues the swap
  //! into the targets on `s`. Returns an empty string, or why nothing was applied. Waits for
  //! the validation (rlpt.sync.timeout at `until`), not for the swap.
  std::string apply(std::span<const device_delta_record> recs, std::byte* arena, cudaStream_t s, deadline until,
                    std::string_view where) {
    arena_ = arena;
    table_.clear();
    vunits_ = aunits_ = pops_ = 0;
    for (const auto& x : recs) {
      detail::delta_apply_rec r;
      r.target = reinterpret_cast<std::uintptr_t>(x.target) + x.head.elem_begin * x.head.elem_bytes;
      r.at = x.at;
      r.elems = x.head.elem_count;
      r.changed = x.head.changed;
      r.eb = x.head.elem_bytes;
      r.enc = static_cast<std::uint32_t>(x.head.encoding);
      std::memcpy(r.header, x.header.data(), 64);
      RLPT_CHECK(r.at % 8 == 0 && r.target % r.eb == 0, errors::sync::bad_delta, "{}: delta record {} is misaligned",
                 where, table_.size());
      const detail::delta_layout lay = detail::layout_of(r.enc, r.elems, r.changed, r.eb);
      r.vunit_begin = vunits_;
      r.aunit_begin = aunits_;
      r.pop_begin = pops_;
      if (r.enc == 2) {
        vunits_ += detail::chunks_in(r.elems);
        aunits_ += detail::chunks_in(r.elems);
        pops_ += detail::chunks_in(r.elems);
      } else if (r.enc == 1) {
        vunits_ += (lay.blocks + 1 + r.changed + detail::delta_chunk_elems - 1) / detail::delta_chunk_elems;
        aunits_ += (r.changed + detail::delta_chunk_elems - 1) / detail::delta_chunk_elems;
      } else {
        vunits_ += 1;
        aunits_ += detail::chunks_in(r.elems);
      }
      table_.push_back(r);
    }
    if (table_.empty()) return {};
    detail::wait_event(uploaded_.get(), until, where, "waiting for the previous delta upload");
    const std::size_t tb = table_.size() * sizeof(detail::delta_apply_rec);
    h_table_.reserve(tb);
    d_table_.reserve(tb);
    std::memcpy(h_table_.get(), table_.data(), tb);
    d_faults_.reserve(table_.size() * 4);
    h_faults_.reserve(table_.size() * 4);
    d_pops_.reserve(std::max<std::uint64_t>(1, pops_) * 4);
    h_pops_.reserve(std::max<std::uint64_t>(1, pops_) * 4);
    RLPT_CUDA_CHECK(cudaMemcpyAsync(d_table_.get(), h_table_.get(), tb, cudaMemcpyHostToDevice, s));
    RLPT_CUDA_CHECK(cudaMemsetAsync(d_faults_.get(), 0, table_.size() * 4, s));
    detail::delta_validate_kernel<><<<detail::delta_grid(vunits_), detail::delta_warps * 32, 0, s>>>(
        d_table_.get<detail::delta_apply_rec>(), table_.size(), vunits_, reinterpret_cast<const unsigned char*>(arena),
        d_faults_.get<std::uint32_t>(), d_pops_.get<std::uint32_t>());
    RLPT_CUDA_CHECK_LAUNCH();
    RLPT_CUDA_CHECK(cudaMemcpyAsync(h_faults_.get(), d_faults_.get(), table_.size() * 4, cudaMemcpyDeviceToHost, s));
    if (pops_ != 0)
      RLPT_CUDA_CHECK(cudaMemcpyAsync(h_pops_.get(), d_pops_.get(), pops_ * 4, cudaMemcpyDeviceToHost, s));
    detail::wait_stream(validated_, s, until, where, "validating delta records");
    const auto* faults = h_faults_.get<std::uint32_t>();
    auto* pops = h_pops_.get<std::uint32_t>();
    for (std::size_t i = 0; i < table_.size(); ++i) {
      std::uint32_t f = faults[i];
      const auto& r = table_[i];
      if (r.enc == 2 && f == 0) { // popcounts become each chunk's first value index
        std::uint64_t run = 0;
        for (std::uint64_t c = 0; c < detail::chunks_in(r.elems); ++c) {
          const std::uint32_t n = pops[r.pop_begin + c];
          pops[r.pop_begin + c] = static_cast<std::uint32_t>(run);
          run += n;
        }
        if (run != r.changed) f |= detail::fault_count;
      }
      if (f != 0)
        return rlpt::detail::format(
            "delta record {} (tensor #{}, elements [{}, {}), {}) is malformed:{}{}{}{}{}{}", i, recs[i].head.tensor,
            recs[i].head.elem_begin, recs[i].head.elem_begin + r.elems, name(recs[i].head.encoding),
            (f & detail::fault_header) ? " its staged header differs from the announced one;" : "",
            (f & detail::fault_tail) ? " bitmap bits past its elements;" : "",
            (f & detail::fault_blocks) ? " block_start is not a prefix from 0 to the change count;" : "",
            (f & detail::fault_range) ? " an index past its elements;" : "",
            (f & detail::fault_order) ? " indices not strictly increasing;" : "",
            (f & detail::fault_count) ? " bitmap bits do not add up to the change count;" : "");
    }
    if (pops_ != 0)
      RLPT_CUDA_CHECK(cudaMemcpyAsync(d_pops_.get(), h_pops_.get(), pops_ * 4, cudaMemcpyHostToDevice, s));
    uploaded_.record(s);
    swap(s);
    return {};
  }

  //! Applies the last applied records again: restores the targets' previous values.
  void undo(cudaStream_t s) const {
    if (!table_.empty()) swap(s);
  }

private:
  void swap(cudaStream_t s) const {
    if (aunits_ == 0) return;
    detail::delta_apply_kernel<><<<detail::delta_grid(aunits_), detail::delta_warps * 32, 0, s>>>(
        d_table_.get<detail::delta_apply_rec>(), table_.size(), aunits_, reinterpret_cast<unsigned char*>(arena_),
        d_pops_.get<std::uint32_t>());
    RLPT_CUDA_CHECK_LAUNCH();
  }

  std::byte* arena_ = nullptr;
  std::vector<detail::delta_apply_rec> table_;
  std::uint64_t vunits_ = 0, aunits_ = 0, pops_ = 0;
  detail::device_bytes d_table_, d_faults_, d_pops_;
  detail::pinned_bytes h_table_, h_faults_, h_pops_;
  detail::event validated_, uploaded_;
};

} // namespace sync
RLPT_NAMESPACE_END
