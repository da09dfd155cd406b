// SPDX-License-Identifier: Apache-2.0
//! @file
//! Copy plans of the device transports: which bytes the gather kernel packs from parameter
//! storage into a bucket, and which bytes the scatter kernel writes back into the receiver's
//! parameters, with a dtype cast where the two sides store different types.
//!
//! A plan is a table of `copy_task`s (one per bucket piece, or per tensor), built once on the
//! host from the manifest and the bound tensors and uploaded once: parameter addresses are
//! stable, so every update replays the same table (this is also what keeps CUDA graphs that
//! captured the parameters valid: nothing is reallocated, everything is written in place).
//! Each task is cut into chunks of `copy_chunk_bytes` wire bytes, one thread block per chunk;
//! the kernel and the host reference below process a chunk word by word through the same
//! `copy_word`, which also returns the word's wsum64 term (checksums come for free with the
//! copy).
#pragma once

#include <rlpt/config.hpp>
#include <rlpt/core/error.hpp>
#include <rlpt/cuda/sync/cast.hpp>
#include <rlpt/cuda/sync/wsum.hpp>
#include <rlpt/sync/dtype.hpp>
#include <rlpt/sync/manifest.hpp>

#include <fmt/core.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

RLPT_NAMESPACE_BEGIN
namespace sync {

//! A tensor in device memory: what a device sender reads (dtype may differ from the wire
//! dtype: it is cast while packing) and what a device receiver writes (cast while applying).
//! `data` is a device pointer in this process, aligned to the element size.
struct device_tensor {
  std::string name{};
  wire_dtype dtype = wire_dtype::bf16;
  std::vector<std::int64_t> shape{};
  void* data = nullptr;
};

namespace detail {

inline constexpr std::uint64_t copy_chunk_bytes = std::uint64_t{64} << 10; //!< wire bytes per thread block
inline constexpr std::uint32_t no_sum = 0xffffffffu;

enum copy_flags : std::uint8_t {
  copy_wire_is_dst = 1,  //!< the checksummed (wire) bytes are the destination: packing
  copy_has_dst = 2,      //!< 0: checksum only
  copy_src_relative = 4, //!< src is an offset from the launch's src_base
  copy_dst_relative = 8, //!< dst is an offset from the launch's dst_base
};

//! One contiguous run of elements: src (dtype `from`) -> dst (dtype `to`).
struct copy_task {
  std::uint64_t src = 0;
  std::uint64_t dst = 0;
  std::uint64_t elements = 0;
  std::uint64_t wire_at = 0;     //!< byte offset of the first wire byte in its tensor (a multiple of 8)
  std::uint64_t chunk_begin = 0; //!< first chunk of this task within its launch
  std::uint32_t sum = no_sum;    //!< index of the raw wsum64 this task adds to
  wire_dtype from = wire_dtype::f32;
  wire_dtype to = wire_dtype::f32;
  std::uint8_t flags = 0;
  std::uint8_t pad = 0;
};
static_assert(sizeof(copy_task) == 48);

//! A launch: tasks [task_begin, task_end) of a table, `chunks` blocks in all.
struct copy_launch {
  std::size_t task_begin = 0;
  std::size_t task_end = 0;
  std::uint64_t chunks = 0;
};

[[nodiscard]] RLPT_HD_FORCEINLINE wire_dtype wire_of(const copy_task& t) noexcept {
  return (t.flags & copy_wire_is_dst) ? t.to : t.from;
}

[[nodiscard]] RLPT_HD_FORCEINLINE std::uint64_t wire_bytes_of(const copy_task& t) noexcept {
  return t.elements * elem_bytes(wire_of(t));
}

[[nodiscard]] RLPT_HD_FORCEINLINE std::uint64_t chunks_of(const copy_task& t) noexcept {
  return (wire_bytes_of(t) + copy_chunk_bytes - 1) / copy_chunk_bytes;
}

[[nodiscard]] RLPT_HD_FORCEINLINE std::uint64_t load_bits(const unsigned char* p, unsigned eb) noexcept {
  switch (eb) {
  case 1:
    return *p;
  case 2:
    return load_as<std::uint16_t>(p);
  case 4:
    return load_as<std::uint32_t>(p);
  default:
    return load_as<std::uint64_t>(p);
  }
}

RLPT_HD_FORCEINLINE void store_bits(unsigned char* p, unsigned eb, std::uint64_t v) noexcept {
  switch (eb) {
  case 1:
    *p = static_cast<unsigned char>(v);
    break;
  case 2:
    store_as<std::uint16_t>(p, static_cast<std::uint16_t>(v));
    break;
  case 4:
    store_as<std::uint32_t>(p, static_cast<std::uint32_t>(v));
    break;
  default:
    store_as<std::uint64_t>(p, v);
    break;
  }
}

//! Copies (and casts) the elements of wire word `w` of task `t` and returns the word's wsum64
//! term. `src` and `dst` are the task's resolved addresses.
[[nodiscard]] RLPT_HD_FORCEINLINE std::uint64_t copy_word(const copy_task& t, const unsigned char* src,
                                                          unsigned char* dst, std::uint64_t w) noexcept {
  const bool pack = (t.flags & copy_wire_is_dst) != 0;
  const unsigned es = elem_bytes(t.from), ed = elem_bytes(t.to);
  const unsigned ew = pack ? ed : es;
  const std::uint64_t epw = 8u / ew;
  const std::uint64_t e0 = w * epw;
  const std::uint64_t left = t.elements - e0;
  const unsigned cnt = static_cast<unsigned>(left < epw ? left : epw);
  const bool whole = cnt == epw;
  std::uint64_t word = 0;
  if (t.from == t.to) {
    const unsigned char* s = src + e0 * es;
    if (whole && (reinterpret_cast<std::uintptr_t>(src) & 7u) == 0)
      word = load_as<std::uint64_t>(s);
    else
      for (unsigned k = 0; k < cnt; ++k) word |= load_bits(s + k * es, es) << (8u * es * k);
    if (dst != nullptr) {
      unsigned char* d = dst + e0 * ed;
      if (whole && (reinterpret_cast<std::uintptr_t>(dst) & 7u) == 0)
        store_as<std::uint64_t>(d, word);
      else
        for (unsigned k = 0; k < cnt; ++k) store_bits(d + k * ed, ed, word >> (8u * ed * k));
    }
  } else if (pack) { // the wire word is made of converted elements
    for (unsigned k = 0; k < cnt; ++k) {
      alignas(8) unsigned char tmp[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      cast_element(t.from, t.to, src + (e0 + k) * es, tmp);
      word |= load_bits(tmp, ed) << (8u * ed * k);
    }
    if (dst != nullptr)
      for (unsigned k = 0; k < cnt; ++k) store_bits(dst + (e0 + k) * ed, ed, word >> (8u * ed * k));
  } else { // the wire word is the source; its elements are converted on the way out
    for (unsigned k = 0; k < cnt; ++k) word |= load_bits(src + (e0 + k) * es, es) << (8u * es * k);
    if (dst != nullptr)
      for (unsigned k = 0; k < cnt; ++k) cast_element(t.from, t.to, src + (e0 + k) * es, dst + (e0 + k) * ed);
  }
  return wsum_term(word, t.wire_at / 8 + w);
}

//! Words of wire bytes [c * copy_chunk_bytes, ...) of task t: [first, last).
RLPT_HD_FORCEINLINE void chunk_words(const copy_task& t, std::uint64_t c, std::uint64_t& first,
                                     std::uint64_t& last) noexcept {
  const std::uint64_t wb = wire_bytes_of(t);
  const std::uint64_t b0 = c * copy_chunk_bytes;
  const std::uint64_t b1 = b0 + copy_chunk_bytes < wb ? b0 + copy_chunk_bytes : wb;
  first = b0 / 8;
  last = (b1 + 7) / 8;
}

//! Host reference of the copy kernel: runs `launch` of `tasks` and adds the raw sums.
inline void run_copy_host(std::span<const copy_task> tasks, const copy_launch& launch, std::uint64_t src_base,
                          std::uint64_t dst_base, std::span<std::uint64_t> sums) {
  for (std::size_t i = launch.task_begin; i < launch.task_end; ++i) {
    const copy_task& t = tasks[i];
    const auto* src = reinterpret_cast<const unsigned char*>(t.src + ((t.flags & copy_src_relative) ? src_base : 0));
    auto* dst = (t.flags & copy_has_dst)
                    ? reinterpret_cast<unsigned char*>(t.dst + ((t.flags & copy_dst_relative) ? dst_base : 0))
                    : nullptr;
    std::uint64_t raw = 0;
    const std::uint64_t words = (wire_bytes_of(t) + 7) / 8;
    for (std::uint64_t w = 0; w < words; ++w) raw += copy_word(t, src, dst, w);
    if (t.sum != no_sum) sums[t.sum] += raw;
  }
}

//! Appends `t` to `out`, setting its chunk_begin; returns the chunks it adds.
inline std::uint64_t push_task(std::vector<copy_task>& out, copy_task t, std::uint64_t chunk_at) {
  t.chunk_begin = chunk_at;
  out.push_back(t);
  return chunks_of(t);
}

inline void check_device_manifest(const manifest& m, std::string_view where) {
  RLPT_CHECK(m.bucket_bytes() % 8 == 0, errors::sync::bad_plan,
             "{}: device transports need bucket_bytes to be a multiple of 8 (checksums work on 8-byte words), got {}",
             where, m.bucket_bytes());
  RLPT_CHECK(m.alignment() >= 8, errors::sync::bad_plan,
             "{}: device transports need an alignment of at least 8 bytes, got {}", where, m.alignment());
}

//! Matches bound tensors to manifest entries by name; returns one pointer (or null) per manifest
//! tensor (sync/manifest.hpp's bind_by_name: shape, castability, data and alignment checked);
//! `what` is "source" or "target".
inline std::vector<const device_tensor*> bind(const manifest& m, std::span<const device_tensor> bound,
                                              std::string_view where, std::string_view what, bool all_required) {
  return bind_by_name(
      m, bound, where, what, all_required,
      [](wire_dtype b, wire_dtype e) { return b == e || (castable(b) && castable(e)); },
      "only F32, F64, F16 and BF16 convert");
}

//! Index of the first piece of bucket b among all pieces of the manifest.
inline std::vector<std::uint64_t> piece_offsets(const manifest& m) {
  std::vector<std::uint64_t> at(static_cast<std::size_t>(m.bucket_count()) + 1, 0);
  for (std::uint64_t b = 0; b < m.bucket_count(); ++b) at[b + 1] = at[b] + m.pieces(b).size();
  return at;
}

//! A whole-manifest copy plan: one launch per bucket (or one launch in all).
struct copy_plan {
  std::vector<copy_task> tasks;
  std::vector<copy_launch> launches;
  std::uint64_t max_chunks = 0;
};

//! One launch per bucket, one task per piece: `piece_task(b, pc, e)` returns the task of piece
//! pc of bucket b; the fields every such plan sets alike (elements, wire offset, and the sum
//! index, which is the global piece index) are set here.
template <class PieceTask> copy_plan plan_per_piece(const manifest& m, PieceTask&& piece_task) {
  copy_plan p;
  std::uint32_t next_sum = 0;
  for (std::uint64_t b = 0; b < m.bucket_count(); ++b) {
    copy_launch l{p.tasks.size(), 0, 0};
    for (const auto& pc : m.pieces(b)) {
      const tensor_entry& e = m[pc.tensor];
      copy_task t = piece_task(b, pc, e);
      t.elements = pc.nbytes / size_of(e.dtype);
      t.wire_at = pc.tensor_offset;
      t.sum = next_sum++;
      l.chunks += push_task(p.tasks, t, l.chunks);
    }
    l.task_end = p.tasks.size();
    p.max_chunks = std::max(p.max_chunks, l.chunks);
    p.launches.push_back(l);
  }
  return p;
}

//! Sender: bucket b's pieces, packed from the sources (cast to the wire dtype) into a bucket
//! at dst_base.
inline copy_plan plan_pack(const manifest& m, const std::vector<const device_tensor*>& src) {
  return plan_per_piece(m, [&](std::uint64_t, const piece& pc, const tensor_entry& e) {
    const device_tensor* s = src[pc.tensor];
    copy_task t;
    t.from = s != nullptr ? s->dtype : e.dtype;
    t.to = e.dtype;
    t.src = reinterpret_cast<std::uintptr_t>(s != nullptr ? s->data : nullptr) +
            pc.tensor_offset / size_of(e.dtype) * size_of(t.from);
    t.dst = pc.bucket_offset;
    t.flags = static_cast<std::uint8_t>(copy_wire_is_dst | copy_has_dst | copy_dst_relative);
    return t;
  });
}

//! Receiver, streaming: bucket b's pieces, read from the slot at src_base, cast into the
//! targets (no target: checksum only).
inline copy_plan plan_unpack(const manifest& m, const std::vector<const device_tensor*>& dst) {
  return plan_per_piece(m, [&](std::uint64_t, const piece& pc, const tensor_entry& e) {
    const device_tensor* d = dst[pc.tensor];
    copy_task t;
    t.from = e.dtype;
    t.to = d != nullptr ? d->dtype : e.dtype;
    t.src = pc.bucket_offset;
    t.dst = d != nullptr
                ? reinterpret_cast<std::uintptr_t>(d->data) + pc.tensor_offset / size_of(e.dtype) * size_of(t.to)
                : 0;
    t.flags = static_cast<std::uint8_t>(copy_src_relative | (d != nullptr ? copy_has_dst : 0));
    return t;
  });
}

//! Receiver, staged: bucket b's pieces copied from the slot (src_base) into the packed arena
//! (dst_base) with their checksums.
inline copy_plan plan_stage(const manifest& m) {
  return plan_per_piece(m, [&](std::uint64_t b, const piece& pc, const tensor_entry& e) {
    copy_task t;
    t.from = t.to = e.dtype;
    t.src = pc.bucket_offset;
    t.dst = m.bucket_packed_offset(b) + pc.bucket_offset;
    t.flags = static_cast<std::uint8_t>(copy_src_relative | copy_dst_relative | copy_has_dst);
    return t;
  });
}

//! Receiver, staged commit: every bound tensor from the packed arena (src_base) into its target,
//! cast where asked; one launch, no sums.
inline copy_plan plan_apply_staged(const manifest& m, const std::vector<const device_tensor*>& dst) {
  copy_plan p;
  copy_launch l{0, 0, 0};
  for (std::size_t i = 0; i < m.size(); ++i) {
    const device_tensor* d = dst[i];
    if (d == nullptr || m[i].nbytes == 0) continue;
    copy_task t;
    t.from = m[i].dtype;
    t.to = d->dtype;
    t.src = m.packed_offset(i);
    t.dst = reinterpret_cast<std::uintptr_t>(d->data);
    t.elements = m[i].numel();
    t.flags = static_cast<std::uint8_t>(copy_src_relative | copy_has_dst);
    l.chunks += push_task(p.tasks, t, l.chunks);
  }
  l.task_end = p.tasks.size();
  p.max_chunks = l.chunks;
  p.launches.push_back(l);
  return p;
}

//! Checksum-only tasks over whole tensors at their own addresses (tensor i adds to sum i).
inline copy_plan plan_checksum(const manifest& m, const std::vector<const device_tensor*>& at) {
  copy_plan p;
  copy_launch l{0, 0, 0};
  for (std::size_t i = 0; i < m.size(); ++i) {
    const device_tensor* d = at[i];
    if (d == nullptr || m[i].nbytes == 0) continue;
    copy_task t;
    t.from = t.to = d->dtype;
    t.src = reinterpret_cast<std::uintptr_t>(d->data);
    t.elements = m[i].numel();
    t.sum = static_cast<std::uint32_t>(i);
    l.chunks += push_task(p.tasks, t, l.chunks);
  }
  l.task_end = p.tasks.size();
  p.max_chunks = l.chunks;
  p.launches.push_back(l);
  return p;
}

} // namespace detail
} // namespace sync
RLPT_NAMESPACE_END
