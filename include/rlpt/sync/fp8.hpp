// SPDX-License-Identifier: Apache-2.0
//! @file
//! Block-wise FP8 quantization of weights for an FP8 rollout engine, from the values the trainer
//! exports (bf16): quantizing from anything else (the fp32 master) made xtuner's step-2 k3-KL
//! 25x larger (xtuner #2044). The scheme is verl's `scaled_fp8_blockwise`, which vLLM's and
//! SGLang's block-FP8 loaders read as DeepSeek-V3's checkpoint format:
//!
//!   per block of b x b elements (the last ones cut at the edges), in fp32:
//!     amax      = max |w|                          (0: scale 1)
//!     scale     = 448 / amax                       (E4M3's largest finite value over amax)
//!     q         = e4m3fn(clamp(w * scale, -448, 448))
//!     scale_inv = 1 / scale                        (what the loader multiplies q by)
//!
//! shipped as `<name>` (F8_E4M3, the weight's shape) and `<name>_scale_inv` (F32,
//! [ceil(rows / b), ceil(cols / b)]): both are ordinary tensors of the manifest, so the
//! protocol checksums, versions and deltas them like any other. `audit_fp8_blockwise` checks
//! on either end that a pair is exactly the quantization of given weights (verl #7519: layers
//! that were silently left in bf16, or quantized twice).
#pragma once

#include <rlpt/config.hpp>
#include <rlpt/core/dtype.hpp>
#include <rlpt/core/error.hpp>
#include <rlpt/core/float_bits.hpp>
#include <rlpt/core/views.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

RLPT_NAMESPACE_BEGIN
namespace sync {

//! E4M3 "fn" (no infinities; 0x7f / 0xff are NaN; largest finite 448), as torch.float8_e4m3fn
//! converts: round to nearest, ties to even, subnormals down to 2^-9; a magnitude that rounds
//! past 448 (above 464), infinities and NaN become NaN (0x7f with x's sign).
[[nodiscard]] inline std::uint8_t to_e4m3fn(float x) noexcept {
  std::uint32_t bits = rlpt::detail::float_bits(x);
  const std::uint32_t sign = bits & 0x80000000u;
  bits ^= sign;
  std::uint32_t r = 0;
  if (bits >= 0x43f00000u) { // 480, inf, NaN
    r = 0x7fu;
  } else if (bits < 0x3c800000u) { // below 2^-6: subnormal codes m * 2^-9, m in [0, 8]
    const float a = rlpt::detail::bits_float(bits);
    const float scaled = a * 512.0f; // exact: a power of two
    // round half to even
    auto m = static_cast<std::uint32_t>(scaled);
    const float frac = scaled - static_cast<float>(m);
    if (frac > 0.5f || (frac == 0.5f && (m & 1u) != 0)) ++m;
    r = m; // m == 8 is the smallest normal, code 0x08
  } else {
    // rebias the exponent (127 -> 7) and round the mantissa to 3 bits, ties to even
    const std::uint32_t odd = (bits >> 20) & 1u;
    bits = bits - (std::uint32_t{120} << 23) + 0x7ffffu + odd;
    r = bits >> 20;
  }
  return static_cast<std::uint8_t>(r | (sign >> 24));
}

//! The value of an E4M3 "fn" code.
[[nodiscard]] inline float from_e4m3fn(std::uint8_t c) noexcept {
  const float sign = (c & 0x80u) != 0 ? -1.0f : 1.0f;
  const unsigned e = (c >> 3) & 0xfu, m = c & 0x7u;
  if (e == 0xfu && m == 0x7u) return std::numeric_limits<float>::quiet_NaN();
  if (e == 0) return sign * std::ldexp(static_cast<float>(m), -9);
  return sign * std::ldexp(1.0f + static_cast<float>(m) / 8.0f, static_cast<int>(e) - 7);
}

//! The square block the scales cover (verl's weight_block_size; DeepSeek-V3 and Qwen3 FP8: 128).
struct fp8_block {
  index_t size = 128;
};

//! The scale_inv shape of a [rows, cols] weight: [ceil(rows / b), ceil(cols / b)].
[[nodiscard]] inline index_t fp8_scale_rows(index_t rows, fp8_block b) { return (rows + b.size - 1) / b.size; }
[[nodiscard]] inline index_t fp8_scale_cols(index_t cols, fp8_block b) { return (cols + b.size - 1) / b.size; }

//! What audit_fp8_blockwise found: blocks whose scale or codes are not w's quantization.
struct fp8_audit {
  index_t blocks = 0;     //!< blocks checked
  index_t bad_scales = 0; //!< scale_inv differs from w's
  index_t bad_codes = 0;  //!< codes that differ
  index_t first_row = -1; //!< the first differing element (or block's first element), -1: none
  index_t first_col = -1;
  [[nodiscard]] bool ok() const noexcept { return bad_scales == 0 && bad_codes == 0; }
};

namespace detail {

template <class T> float fp8_load(T v) noexcept {
  if constexpr (std::is_same_v<T, float>)
    return v;
  else
    return static_cast<float>(v);
}

inline void check_fp8_shapes(index_t rows, index_t cols, index_t q_rows, index_t q_cols, index_t s_rows, index_t s_cols,
                             fp8_block b) {
  RLPT_CHECK(b.size > 0, errors::sync::bad_shape, "fp8 block size must be positive, got {}", b.size);
  RLPT_CHECK(q_rows == rows && q_cols == cols, errors::sync::bad_shape,
             "fp8 codes are [{}, {}], the weight is [{}, {}]", q_rows, q_cols, rows, cols);
  RLPT_CHECK(s_rows == fp8_scale_rows(rows, b) && s_cols == fp8_scale_cols(cols, b), errors::sync::bad_shape,
             "fp8 scale_inv is [{}, {}]; a [{}, {}] weight in blocks of {} needs [{}, {}]", s_rows, s_cols, rows, cols,
             b.size, fp8_scale_rows(rows, b), fp8_scale_cols(cols, b));
}

//! The block's scale (448 / amax, 1 for an all-zero block); raises for a non-finite weight.
template <class T> float fp8_block_scale(view2d<const T> w, index_t r0, index_t r1, index_t c0, index_t c1) {
  float amax = 0.0f;
  for (index_t r = r0; r < r1; ++r)
    for (index_t c = c0; c < c1; ++c) {
      const float a = std::fabs(fp8_load(w(r, c)));
      if (RLPT_UNLIKELY(!(a <= 3.4028234663852886e38f)))
        RLPT_FAIL(errors::sync::nonfinite, "fp8 quantization: weight element [{}, {}] is {}: not finite", r, c,
                  fp8_load(w(r, c)));
      amax = a > amax ? a : amax;
    }
  return amax == 0.0f ? 1.0f : 448.0f / amax;
}

inline std::uint8_t fp8_code(float x, float scale) noexcept {
  float y = x * scale;
  y = y < -448.0f ? -448.0f : (y > 448.0f ? 448.0f : y);
  return to_e4m3fn(y);
}

} // namespace detail

//! Quantizes `w` [rows, cols] (bf16, f16 or float) into `q` (E4M3 codes, [rows, cols]) and
//! `scale_inv` (fp32, [ceil(rows / b), ceil(cols / b)]) as described above. Raises
//! rlpt.sync.bad_shape for shapes that do not fit and rlpt.sync.nonfinite for a NaN or infinite
//! weight (naming its position).
template <class T>
void quantize_fp8_blockwise(view2d<const T> w, view2d<std::uint8_t> q, view2d<float> scale_inv, fp8_block b = {}) {
  detail::check_fp8_shapes(w.rows(), w.cols(), q.rows(), q.cols(), scale_inv.rows(), scale_inv.cols(), b);
  for (index_t br = 0; br < scale_inv.rows(); ++br)
    for (index_t bc = 0; bc < scale_inv.cols(); ++bc) {
      const index_t r0 = br * b.size, c0 = bc * b.size;
      const index_t r1 = std::min(r0 + b.size, w.rows()), c1 = std::min(c0 + b.size, w.cols());
      const float scale = detail::fp8_block_scale(w, r0, r1, c0, c1);
      scale_inv(br, bc) = 1.0f / scale;
      for (index_t r = r0; r < r1; ++r)
        for (index_t c = c0; c < c1; ++c) q(r, c) = detail::fp8_code(detail::fp8_load(w(r, c)), scale);
    }
}

//! Whether (`q`, `scale_inv`) is exactly quantize_fp8_blockwise(`w`): counts the blocks whose
//! scale differs and the codes that differ, and names the first. Shapes as for quantization.
template <class T>
[[nodiscard]] fp8_audit audit_fp8_blockwise(view2d<const T> w, view2d<const std::uint8_t> q,
                                            view2d<const float> scale_inv, fp8_block b = {}) {
  detail::check_fp8_shapes(w.rows(), w.cols(), q.rows(), q.cols(), scale_inv.rows(), scale_inv.cols(), b);
  fp8_audit a;
  const auto note = [&](index_t r, index_t c) {
    if (a.first_row < 0 || r < a.first_row || (r == a.first_row && c < a.first_col)) {
      a.first_row = r;
      a.first_col = c;
    }
  };
  for (index_t br = 0; br < scale_inv.rows(); ++br)
    for (index_t bc = 0; bc < scale_inv.cols(); ++bc) {
      const index_t r0 = br * b.size, c0 = bc * b.size;
      const index_t r1 = std::min(r0 + b.size, w.rows()), c1 = std::min(c0 + b.size, w.cols());
      const float scale = detail::fp8_block_scale(w, r0, r1, c0, c1);
      ++a.blocks;
      if (rlpt::detail::float_bits(scale_inv(br, bc)) != rlpt::detail::float_bits(1.0f / scale)) {
        ++a.bad_scales;
        note(r0, c0);
      }
      for (index_t r = r0; r < r1; ++r)
        for (index_t c = c0; c < c1; ++c)
          if (q(r, c) != detail::fp8_code(detail::fp8_load(w(r, c)), scale)) {
            ++a.bad_codes;
            note(r, c);
          }
    }
  return a;
}

} // namespace sync
RLPT_NAMESPACE_END
