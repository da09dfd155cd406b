// SPDX-License-Identifier: Apache-2.0
//! @file
//! Import of DLPack tensors (torch, JAX, CuPy, ...) as rlpt views, fully validated.
//!
//! Available when <dlpack/dlpack.h> is on the include path (RLPT_HAS_DLPACK()). Everything a
//! producer can get wrong is checked before a view is made: null data, device, dtype
//! (code, bits, lanes), rank, shape (non-null, no negative or overflowing extent), strides
//! (null = row-major), byte_offset and alignment, and that the byte range the view reaches
//! (byte_offset + extent) overflows neither 2^63 bytes nor the address space.
#pragma once

#include <rlpt/config.hpp>

#if RLPT_HAS_DLPACK()

#include <rlpt/core/dtype.hpp>
#include <rlpt/core/error.hpp>
#include <rlpt/core/views.hpp>

#include <dlpack/dlpack.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

RLPT_NAMESPACE_BEGIN
namespace detail {

template <class T> struct dl_type;
template <> struct dl_type<float> { static constexpr std::uint8_t code = kDLFloat, bits = 32; };
template <> struct dl_type<double> { static constexpr std::uint8_t code = kDLFloat, bits = 64; };
template <> struct dl_type<f16> { static constexpr std::uint8_t code = kDLFloat, bits = 16; };
template <> struct dl_type<bf16> { static constexpr std::uint8_t code = kDLBfloat, bits = 16; };
template <> struct dl_type<std::int8_t> { static constexpr std::uint8_t code = kDLInt, bits = 8; };
template <> struct dl_type<std::uint8_t> { static constexpr std::uint8_t code = kDLUInt, bits = 8; };
template <> struct dl_type<std::int32_t> { static constexpr std::uint8_t code = kDLInt, bits = 32; };
template <> struct dl_type<std::int64_t> { static constexpr std::uint8_t code = kDLInt, bits = 64; };

inline std::string dl_dtype_name(DLDataType t) {
  const char* code = t.code == kDLInt      ? "int"
                     : t.code == kDLUInt   ? "uint"
                     : t.code == kDLFloat  ? "float"
                     : t.code == kDLBfloat ? "bfloat"
                     : t.code == 6         ? "bool" // kDLBool, DLPack >= 0.8
                                           : "code";
  std::string s = rlpt::detail::format("{}{}", code, t.bits);
  if (t.lanes != 1) s += rlpt::detail::format("x{}", t.lanes);
  return s;
}

inline std::string_view dl_device_name(std::int32_t type) {
  switch (type) {
  case kDLCPU:
    return "cpu";
  case kDLCUDA:
    return "cuda";
  case kDLCUDAHost:
    return "cuda_host";
  case kDLCUDAManaged:
    return "cuda_managed";
  case kDLROCM:
    return "rocm";
  default:
    return "other";
  }
}

//! The device type as the producer wrote it: any 32-bit value, read without assuming it is
//! one of DLDeviceType's enumerators (loading an out-of-range enum value is undefined).
inline std::int32_t dl_device_type(const DLTensor& t) noexcept {
  static_assert(sizeof(t.device.device_type) == sizeof(std::int32_t));
  std::int32_t v;
  std::memcpy(&v, &t.device.device_type, sizeof(v));
  return v;
}

//! Checks device, dtype, rank, shape and byte_offset; returns the first element (nullptr for
//! an empty tensor). `numel` receives the element count. Every extent is checked so that
//! `byte_offset + numel * sizeof(T)` and the address it ends at do not overflow.
template <class T, memory_space Space>
T* dl_checked_data(const DLTensor& t, std::string_view what, int ndim, index_t& numel) {
  using E = std::remove_cv_t<T>;
  const std::int32_t dev = dl_device_type(t);
  if constexpr (Space == memory_space::host) {
    RLPT_CHECK(dev == kDLCPU || dev == kDLCUDAHost || dev == kDLCUDAManaged, errors::dlpack::device,
               "{} lives on device '{}' (type {}), but a host view was requested", what, dl_device_name(dev), dev);
  } else {
    RLPT_CHECK(dev == kDLCUDA || dev == kDLCUDAManaged, errors::dlpack::device,
               "{} lives on device '{}' (type {}), but a CUDA device view was requested", what, dl_device_name(dev),
               dev);
  }
  // torch exports bool as uint8 in DLPack < 0.8 and kDLBool after; accept both for masks.
  const bool bool_as_u8 = std::is_same_v<E, std::uint8_t> && t.dtype.code == 6 && t.dtype.bits == 8;
  RLPT_CHECK((bool_as_u8 || (t.dtype.code == dl_type<E>::code && t.dtype.bits == dl_type<E>::bits)) &&
                 t.dtype.lanes == 1,
             errors::dlpack::dtype, "{} has dtype {}, expected {}", what, dl_dtype_name(t.dtype), name(dtype_of<E>));
  RLPT_CHECK(t.ndim == ndim, errors::dlpack::ndim, "{} has {} dimensions, expected {}", what, t.ndim, ndim);
  RLPT_CHECK(t.shape != nullptr, errors::dlpack::shape, "{} has {} dimensions but a null shape pointer", what, t.ndim);
  numel = 1;
  for (int d = 0; d < ndim; ++d) {
    RLPT_CHECK(t.shape[d] >= 0, errors::dlpack::shape, "{} has negative extent {} in dimension {}", what, t.shape[d],
               d);
    RLPT_CHECK(!__builtin_mul_overflow(numel, t.shape[d], &numel), errors::dlpack::shape,
               "{} has {} elements up to dimension {} (extent {}): more than 2^63", what, numel, d, t.shape[d]);
  }
  RLPT_CHECK(t.byte_offset % sizeof(E) == 0, errors::dlpack::alignment,
             "{} has byte_offset {}, not a multiple of its {}-byte elements", what, t.byte_offset, sizeof(E));
  if (numel == 0) return nullptr;
  RLPT_CHECK(t.data != nullptr, errors::dlpack::null, "{} has {} elements but a null data pointer", what, numel);
  // The address of the first element, computed without pointer arithmetic that could wrap.
  std::uintptr_t first = 0;
  RLPT_CHECK(!__builtin_add_overflow(reinterpret_cast<std::uintptr_t>(t.data), t.byte_offset, &first),
             errors::dlpack::shape, "{} has byte_offset {}: data pointer {} plus the offset wraps around", what,
             t.byte_offset, static_cast<const void*>(t.data));
  RLPT_CHECK(first % alignof(E) == 0, errors::dlpack::alignment, "{} data address {:#x} is not aligned to {} bytes",
             what, first, alignof(E));
  return reinterpret_cast<T*>(first);
}

//! Checks that `elements` elements of E starting at `first` lie below the end of the address
//! space and within 2^63 bytes.
template <class T> void dl_check_extent(const T* first, index_t elements, std::string_view what) {
  std::int64_t bytes = 0;
  std::uintptr_t end = 0;
  RLPT_CHECK(
      !__builtin_mul_overflow(elements, static_cast<std::int64_t>(sizeof(T)), &bytes) &&
          !__builtin_add_overflow(reinterpret_cast<std::uintptr_t>(first), static_cast<std::uintptr_t>(bytes), &end),
      errors::dlpack::shape, "{} spans {} elements of {} bytes from address {}: the byte range overflows", what,
      elements, sizeof(T), static_cast<const void*>(first));
}

} // namespace detail

//! A 1-D DLPack tensor as a view. Its stride must be 1 (a 1-element or empty tensor may have any).
template <class T, memory_space Space = memory_space::host>
[[nodiscard]] view<T, Space> from_dlpack(const DLTensor& t, std::string_view what = "tensor") {
  index_t n = 0;
  T* p = detail::dl_checked_data<T, Space>(t, what, 1, n);
  if (t.strides != nullptr && n > 1)
    RLPT_CHECK(t.strides[0] == 1, errors::dlpack::strides, "{} has stride {}, expected 1 (contiguous)", what,
               t.strides[0]);
  if (n != 0) detail::dl_check_extent(p, n, what);
  return {p, n};
}

//! A 2-D DLPack tensor as a row-strided view: the last dimension must be contiguous and rows
//! must not overlap.
template <class T, memory_space Space = memory_space::host>
[[nodiscard]] view2d<T, Space> from_dlpack_2d(const DLTensor& t, std::string_view what = "tensor") {
  index_t numel = 0;
  T* p = detail::dl_checked_data<T, Space>(t, what, 2, numel);
  const index_t rows = t.shape[0];
  const index_t cols = t.shape[1];
  index_t row_stride = cols;
  if (t.strides != nullptr) {
    if (cols > 1)
      RLPT_CHECK(t.strides[1] == 1, errors::dlpack::strides,
                 "{} has column stride {}, expected 1 (the last dimension must be contiguous)", what, t.strides[1]);
    if (rows > 1) {
      row_stride = t.strides[0];
      RLPT_CHECK(row_stride >= cols, errors::dlpack::strides,
                 "{} has row stride {} smaller than its {} columns (overlapping or transposed rows)", what, row_stride,
                 cols);
    }
  }
  if (numel != 0) {
    // Elements from the first to the last one the view reaches: (rows - 1) * row_stride + cols.
    index_t span = 0;
    RLPT_CHECK(!__builtin_mul_overflow(rows - 1, row_stride, &span) && !__builtin_add_overflow(span, cols, &span),
               errors::dlpack::strides, "{} has {} rows of stride {}: the rows span more than 2^63 elements", what,
               rows, row_stride);
    detail::dl_check_extent(p, span, what);
  }
  return {p, rows, cols, row_stride};
}

RLPT_NAMESPACE_END

#endif // RLPT_HAS_DLPACK()
