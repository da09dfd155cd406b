// SPDX-License-Identifier: Apache-2.0
// Fuzz target: DLPack import. The bytes describe a DLManagedTensor as a producer might hand it
// over (device, dtype, ndim, shape, strides, byte_offset, data pointer), over a real buffer;
// from_dlpack / from_dlpack_2d must reject garbage with rlpt::error. An accepted view must
// describe exactly the tensor (data + byte_offset, extents, strides), span a byte range that
// does not overflow, and, where it lies inside the buffer, be readable end to end.
//
// Input layout (little-endian; missing bytes read as zero):
//   u8 op: bit 0 2-D, bits 1-3 element type, bit 4 device view, bit 5 strides given,
//          bits 6-7 data pointer (buffer, null, buffer + 1, buffer + 8)
//   u8 flags: bit 0 null shape pointer
//   i32 device_type, i32 device_id, u8 code, u8 bits, u16 lanes, i32 ndim, u64 byte_offset,
//   8 x i64 shape, 8 x i64 strides
#pragma once

#include "fuzz.hpp"

#include <rlpt/config.hpp>

#if RLPT_HAS_DLPACK()

#include <rlpt/core/dlpack.hpp>

#include <array>
#include <cstdint>
#include <cstring>

namespace rlpt::fuzz {

namespace detail {

inline constexpr std::size_t dl_buffer_bytes = 4096;

inline std::int32_t device_type_of(const DLTensor& t) {
  std::int32_t v;
  std::memcpy(&v, &t.device.device_type, sizeof(v));
  return v;
}

struct dl_input {
  std::uint8_t op = 0, flags = 0;
  std::array<std::int64_t, 8> shape{}, strides{};
  DLTensor t{};
};

template <class T> void dl_check_1d(const dl_input& d, const view<const T>& v, const std::byte* buf) {
  const DLTensor& t = d.t;
  RLPT_FUZZ_ASSERT(t.ndim == 1 && t.shape != nullptr && v.size() == t.shape[0]);
  RLPT_FUZZ_ASSERT(t.dtype.lanes == 1, "accepted a dtype with {} lanes", t.dtype.lanes);
  if (v.size() == 0) return;
  const auto base = reinterpret_cast<std::uintptr_t>(t.data);
  RLPT_FUZZ_ASSERT(reinterpret_cast<std::uintptr_t>(v.data()) == base + t.byte_offset);
  std::uint64_t bytes = 0, end = 0;
  RLPT_FUZZ_ASSERT(!__builtin_mul_overflow(static_cast<std::uint64_t>(v.size()), sizeof(T), &bytes) &&
                       bytes <= static_cast<std::uint64_t>(INT64_MAX) &&
                       !__builtin_add_overflow(t.byte_offset, bytes, &end) && !__builtin_add_overflow(base, end, &end),
                   "accepted a view whose byte range overflows ({} elements, byte_offset {})", v.size(), t.byte_offset);
  if (t.data == buf && t.byte_offset + bytes <= dl_buffer_bytes && device_type_of(d.t) == kDLCPU) {
    volatile unsigned char sink = 0;
    const auto* p = reinterpret_cast<const unsigned char*>(v.data());
    for (std::uint64_t i = 0; i < bytes; ++i) sink = static_cast<unsigned char>(sink ^ p[i]);
  }
}

template <class T> void dl_check_2d(const dl_input& d, const view2d<const T>& v, const std::byte* buf) {
  const DLTensor& t = d.t;
  RLPT_FUZZ_ASSERT(t.ndim == 2 && t.shape != nullptr && v.rows() == t.shape[0] && v.cols() == t.shape[1]);
  RLPT_FUZZ_ASSERT(t.dtype.lanes == 1, "accepted a dtype with {} lanes", t.dtype.lanes);
  RLPT_FUZZ_ASSERT(v.rows() <= 1 || v.row_stride() >= v.cols());
  if (v.rows() == 0 || v.cols() == 0) return;
  const auto base = reinterpret_cast<std::uintptr_t>(t.data);
  RLPT_FUZZ_ASSERT(reinterpret_cast<std::uintptr_t>(v.data()) == base + t.byte_offset);
  // Elements the view spans: (rows - 1) * row_stride + cols.
  std::int64_t span = 0, bytes = 0;
  std::uint64_t end = 0;
  RLPT_FUZZ_ASSERT(!__builtin_mul_overflow(v.rows() - 1, v.row_stride(), &span) &&
                       !__builtin_add_overflow(span, v.cols(), &span) &&
                       !__builtin_mul_overflow(span, static_cast<std::int64_t>(sizeof(T)), &bytes) &&
                       !__builtin_add_overflow(t.byte_offset, static_cast<std::uint64_t>(bytes), &end) &&
                       !__builtin_add_overflow(base, end, &end),
                   "accepted a [{}, {}] view with row stride {} whose byte range overflows (byte_offset {})", v.rows(),
                   v.cols(), v.row_stride(), t.byte_offset);
  if (t.data == buf && t.byte_offset + static_cast<std::uint64_t>(bytes) <= dl_buffer_bytes &&
      device_type_of(d.t) == kDLCPU) {
    volatile unsigned char sink = 0;
    for (index_t r = 0; r < v.rows(); ++r) {
      const auto* p = reinterpret_cast<const unsigned char*>(v.row(r).data());
      for (std::size_t i = 0; i < static_cast<std::size_t>(v.cols()) * sizeof(T); ++i)
        sink = static_cast<unsigned char>(sink ^ p[i]);
    }
  }
}

template <class T> void dl_import(const dl_input& d, const std::byte* buf) {
  const bool two_d = d.op & 1u;
  const bool device = d.op & 16u;
  if (two_d) {
    if (device)
      static_cast<void>(from_dlpack_2d<const T, memory_space::device>(d.t, "fuzz"));
    else
      dl_check_2d<T>(d, from_dlpack_2d<const T>(d.t, "fuzz"), buf);
  } else {
    if (device)
      static_cast<void>(from_dlpack<const T, memory_space::device>(d.t, "fuzz"));
    else
      dl_check_1d<T>(d, from_dlpack<const T>(d.t, "fuzz"), buf);
  }
}

inline int dl_deleted = 0;

} // namespace detail

inline outcome dlpack(input in) {
  alignas(64) static std::byte buffer[detail::dl_buffer_bytes] = {};
  reader r(in);
  detail::dl_input d;
  d.op = r.get<std::uint8_t>();
  d.flags = r.get<std::uint8_t>();
  DLTensor& t = d.t;
  // Any 32-bit value, as a foreign producer may write it (not only DLDeviceType's enumerators).
  const auto device_type = r.get<std::int32_t>();
  static_assert(sizeof(t.device.device_type) == sizeof(device_type));
  std::memcpy(&t.device.device_type, &device_type, sizeof(device_type));
  t.device.device_id = r.get<std::int32_t>();
  t.dtype.code = r.get<std::uint8_t>();
  t.dtype.bits = r.get<std::uint8_t>();
  t.dtype.lanes = r.get<std::uint16_t>();
  t.ndim = r.get<std::int32_t>();
  t.byte_offset = r.get<std::uint64_t>();
  for (auto& s : d.shape) s = r.get<std::int64_t>();
  for (auto& s : d.strides) s = r.get<std::int64_t>();
  t.shape = (d.flags & 1u) ? nullptr : d.shape.data();
  t.strides = (d.op & 32u) ? d.strides.data() : nullptr;
  switch (d.op >> 6) {
  case 0:
    t.data = buffer;
    break;
  case 1:
    t.data = nullptr;
    break;
  case 2:
    t.data = buffer + 1;
    break;
  default:
    t.data = buffer + 8;
    break;
  }
  // Handed over as a producer would: a managed tensor whose deleter the consumer calls once.
  DLManagedTensor managed{t, nullptr, [](DLManagedTensor*) { ++detail::dl_deleted; }};
  const int deleted = detail::dl_deleted;
  outcome result = outcome::accepted;
  try {
    switch ((d.op >> 1) & 7u) {
    case 0:
      detail::dl_import<float>(d, buffer);
      break;
    case 1:
      detail::dl_import<double>(d, buffer);
      break;
    case 2:
      detail::dl_import<f16>(d, buffer);
      break;
    case 3:
      detail::dl_import<bf16>(d, buffer);
      break;
    case 4:
      detail::dl_import<std::int8_t>(d, buffer);
      break;
    case 5:
      detail::dl_import<std::uint8_t>(d, buffer);
      break;
    case 6:
      detail::dl_import<std::int32_t>(d, buffer);
      break;
    default:
      detail::dl_import<std::int64_t>(d, buffer);
      break;
    }
  } catch (const rlpt::error&) {
    result = outcome::rejected;
  }
  managed.deleter(&managed);
  RLPT_FUZZ_ASSERT(detail::dl_deleted == deleted + 1);
  return result;
}

} // namespace rlpt::fuzz

#else

namespace rlpt::fuzz {
inline outcome dlpack(input) { return outcome::rejected; } // built without <dlpack/dlpack.h>
} // namespace rlpt::fuzz

#endif
