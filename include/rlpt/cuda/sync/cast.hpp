// SPDX-License-Identifier: Apache-2.0
//! @file
//! Element casts of the device transports (F32, F64, F16, BF16), bit-identical to the host
//! receiver's `rlpt::sync::cast` transform, written once for host and device.
//!
//! The host transform goes through double: load as double, store rounded to nearest even
//! (through float for F16/BF16). For finite values and infinities the float path used here is
//! the same number; NaNs are where hardware differs (x86 keeps a NaN's payload and sets its
//! quiet bit when converting between float and double, CUDA returns a canonical NaN), so NaN
//! conversions are spelled out in bits as x86 does them. Same inputs, same output bits, host
//! or device.
#pragma once

#include <rlpt/config.hpp>
#include <rlpt/core/dtype.hpp>
#include <rlpt/sync/dtype.hpp>

#include <cstdint>
#include <cstring>

RLPT_NAMESPACE_BEGIN
namespace sync::detail {

//! Unaligned-safe load of a little-endian T on the host; a plain load on the device, where
//! the transports require every element to be naturally aligned (checked on the host).
template <class T> [[nodiscard]] RLPT_HD_FORCEINLINE T load_as(const unsigned char* p) noexcept {
#if RLPT_DEVICE_PASS()
  return *reinterpret_cast<const T*>(p);
#else
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
#endif
}

template <class T> RLPT_HD_FORCEINLINE void store_as(unsigned char* p, T v) noexcept {
#if RLPT_DEVICE_PASS()
  *reinterpret_cast<T*>(p) = v;
#else
  std::memcpy(p, &v, sizeof(T));
#endif
}

[[nodiscard]] RLPT_HD_FORCEINLINE std::uint64_t double_bits(double d) noexcept {
#if RLPT_DEVICE_PASS()
  return static_cast<std::uint64_t>(__double_as_longlong(d));
#else
  std::uint64_t u;
  std::memcpy(&u, &d, 8);
  return u;
#endif
}

[[nodiscard]] RLPT_HD_FORCEINLINE double bits_double(std::uint64_t u) noexcept {
#if RLPT_DEVICE_PASS()
  return __longlong_as_double(static_cast<long long>(u));
#else
  double d;
  std::memcpy(&d, &u, 8);
  return d;
#endif
}

//! float -> double as x86 does it (a NaN keeps its payload and becomes quiet).
[[nodiscard]] RLPT_HD_FORCEINLINE double widen(float f) noexcept {
  const std::uint32_t u = ::rlpt::detail::float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u)
    return bits_double((std::uint64_t{u >> 31} << 63) | 0x7ff0000000000000ull | (std::uint64_t{u & 0x7fffffu} << 29) |
                       (std::uint64_t{1} << 51));
  return static_cast<double>(f);
}

//! double -> float rounded to nearest even; a NaN keeps the top of its payload and becomes quiet.
[[nodiscard]] RLPT_HD_FORCEINLINE float narrow(double d) noexcept {
  const std::uint64_t u = double_bits(d);
  if ((u & 0x7fffffffffffffffull) > 0x7ff0000000000000ull)
    return ::rlpt::detail::bits_float(static_cast<std::uint32_t>((u >> 63) << 31) | 0x7f800000u |
                                      static_cast<std::uint32_t>((u >> 29) & 0x7fffffu) | 0x400000u);
  return static_cast<float>(d);
}

//! Bytes per element (usable in device code, unlike the table behind size_of).
[[nodiscard]] RLPT_HD_FORCEINLINE unsigned elem_bytes(wire_dtype t) noexcept {
  switch (t) {
  case wire_dtype::i16:
  case wire_dtype::u16:
  case wire_dtype::f16:
  case wire_dtype::bf16:
    return 2;
  case wire_dtype::i32:
  case wire_dtype::u32:
  case wire_dtype::f32:
    return 4;
  case wire_dtype::c64:
  case wire_dtype::f64:
  case wire_dtype::i64:
  case wire_dtype::u64:
    return 8;
  default:
    return 1;
  }
}

//! Element types a device cast handles.
[[nodiscard]] constexpr bool castable(wire_dtype t) noexcept {
  return t == wire_dtype::f32 || t == wire_dtype::f64 || t == wire_dtype::f16 || t == wire_dtype::bf16;
}

[[nodiscard]] RLPT_HD_FORCEINLINE float load_narrow(wire_dtype t, const unsigned char* p) noexcept {
  switch (t) {
  case wire_dtype::f32:
    return load_as<float>(p);
  case wire_dtype::f16:
    return static_cast<float>(f16::from_bits(load_as<std::uint16_t>(p)));
  default:
    return static_cast<float>(bf16::from_bits(load_as<std::uint16_t>(p)));
  }
}

RLPT_HD_FORCEINLINE void store_narrow(wire_dtype t, unsigned char* p, float f) noexcept {
  switch (t) {
  case wire_dtype::f32: {
    std::uint32_t u = ::rlpt::detail::float_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) u |= 0x400000u; // the host's trip through double quiets it
    store_as<std::uint32_t>(p, u);
    break;
  }
  case wire_dtype::f16:
    store_as<std::uint16_t>(p, f16(f).bits);
    break;
  default:
    store_as<std::uint16_t>(p, bf16(f).bits);
    break;
  }
}

//! Converts one element of dtype `from` at `src` into dtype `to` at `dst` (both castable or
//! equal; equal dtypes copy the bytes).
RLPT_HD_FORCEINLINE void cast_element(wire_dtype from, wire_dtype to, const unsigned char* src,
                                      unsigned char* dst) noexcept {
  if (from == to) {
    switch (elem_bytes(from)) {
    case 1:
      *dst = *src;
      break;
    case 2:
      store_as<std::uint16_t>(dst, load_as<std::uint16_t>(src));
      break;
    case 4:
      store_as<std::uint32_t>(dst, load_as<std::uint32_t>(src));
      break;
    default:
      store_as<std::uint64_t>(dst, load_as<std::uint64_t>(src));
      break;
    }
    return;
  }
  if (from == wire_dtype::f64 || to == wire_dtype::f64) {
    const double d = from == wire_dtype::f64 ? load_as<double>(src) : widen(load_narrow(from, src));
    if (to == wire_dtype::f64)
      store_as<double>(dst, d);
    else
      store_narrow(to, dst, narrow(d));
    return;
  }
  store_narrow(to, dst, load_narrow(from, src));
}

} // namespace sync::detail
RLPT_NAMESPACE_END
