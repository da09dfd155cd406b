// SPDX-License-Identifier: Apache-2.0
//! @file
//! Import of DLPack tensors (torch, JAX, CuPy, ...) as rlpt views, fully validated.
//!
//! Available when <dlpack/dlpack.h> is on the include path (RLPT_HAS_DLPACK()). Everything a
//! producer can get wrong is checked before a view is made: null data, device, dtype
//! (code, bits, lanes), rank, shape, strides (null = row-major), byte_offset and alignment.
#pragma once

#include <rlpt/config.hpp>

#if RLPT_HAS_DLPACK()

#include <rlpt/core/dtype.hpp>
#include <rlpt/core/error.hpp>
#include <rlpt/core/views.hpp>

#include <dlpack/dlpack.h>

#include <cstdint>
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
  std::string s = fmt::format("{}{}", code, t.bits);
  if (t.lanes != 1) s += fmt::format("x{}", t.lanes);
  return s;
}

inline std::string_view dl_device_name(std::int32_t type) {
  switch (type) {
  case kDLCPU: return "cpu";
  case kDLCUDA: return "cuda";
  case kDLCUDAHost: return "cuda_host";
  case kDLCUDAManaged: return "cuda_managed";
  case kDLROCM: return "rocm";
  default: return "other";
  }
}

template <class T, memory_space Space>
T* dl_checked_data(const DLTensor& t, std::string_view what, int ndim) {
  using E = std::remove_cv_t<T>;
  const auto dev = static_cast<std::int32_t>(t.device.device_type);
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
  RLPT_CHECK(bool_as_u8 || (t.dtype.code == dl_type<E>::code && t.dtype.bits == dl_type<E>::bits && t.dtype.lanes == 1),
             errors::dlpack::dtype, "{} has dtype {}, expected {}", what, dl_dtype_name(t.dtype), name(dtype_of<E>));
  RLPT_CHECK(t.ndim == ndim, errors::dlpack::ndim, "{} has {} dimensions, expected {}", what, t.ndim, ndim);
  for (int d = 0; d < ndim; ++d)
    RLPT_CHECK(t.shape[d] >= 0, errors::dlpack::shape, "{} has negative extent {} in dimension {}", what, t.shape[d], d);
  RLPT_CHECK(t.byte_offset % sizeof(E) == 0, errors::dlpack::alignment,
             "{} has byte_offset {}, not a multiple of its {}-byte elements", what, t.byte_offset, sizeof(E));
  index_t numel = 1;
  for (int d = 0; d < ndim; ++d) numel *= t.shape[d];
  if (numel == 0) return nullptr;
  RLPT_CHECK(t.data != nullptr, errors::dlpack::null, "{} has {} elements but a null data pointer", what, numel);
  auto* p = static_cast<char*>(t.data) + t.byte_offset;
  RLPT_CHECK(reinterpret_cast<std::uintptr_t>(p) % alignof(E) == 0, errors::dlpack::alignment,
             "{} data address {} is not aligned to {} bytes", what, static_cast<const void*>(p), alignof(E));
  return reinterpret_cast<T*>(p);
}

} // namespace detail

//! A 1-D DLPack tensor as a view. Its stride must be 1 (a 1-element or empty tensor may have any).
template <class T, memory_space Space = memory_space::host>
[[nodiscard]] view<T, Space> from_dlpack(const DLTensor& t, std::string_view what = "tensor") {
  T* p = detail::dl_checked_data<T, Space>(t, what, 1);
  const index_t n = t.shape[0];
  if (t.strides != nullptr && n > 1)
    RLPT_CHECK(t.strides[0] == 1, errors::dlpack::strides, "{} has stride {}, expected 1 (contiguous)", what,
               t.strides[0]);
  return {p, n};
}

//! A 2-D DLPack tensor as a row-strided view: the last dimension must be contiguous and rows
//! must not overlap.
template <class T, memory_space Space = memory_space::host>
[[nodiscard]] view2d<T, Space> from_dlpack_2d(const DLTensor& t, std::string_view what = "tensor") {
  T* p = detail::dl_checked_data<T, Space>(t, what, 2);
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
  return {p, rows, cols, row_stride};
}

RLPT_NAMESPACE_END

#endif // RLPT_HAS_DLPACK()
