// SPDX-License-Identifier: Apache-2.0
// Block-wise FP8 quantize-on-send: the E4M3 conversion against torch's (a sweep of values, every
// code and every midpoint), the quantization against verl's own scaled_fp8_blockwise (bf16 and
// fp32 weights, edge blocks, an all-zero block, tiny values, block sizes 128 and 32), the audit,
// and the errors.
#include <rlpt/sync/fp8.hpp>

#include "support/errors.hpp"
#include "support/golden.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace rs = rlpt::sync;
using rlpt::index_t;

TEST_CASE("fp8: every E4M3 code round-trips, midpoints round to even, and out-of-range values are NaN") {
  for (int c = 0; c < 256; ++c) {
    const auto code = static_cast<std::uint8_t>(c);
    const float v = rs::from_e4m3fn(code);
    CAPTURE(c);
    if ((c & 0x7f) == 0x7f) {
      CHECK(std::isnan(v));
      continue;
    }
    CHECK(rs::to_e4m3fn(v) == code);
  }
  // between two adjacent positive codes: below the midpoint the lower, above it the upper, at it the even one
  for (int c = 0; c < 0x7e; ++c) {
    const float lo = rs::from_e4m3fn(static_cast<std::uint8_t>(c)),
                hi = rs::from_e4m3fn(static_cast<std::uint8_t>(c + 1));
    const float mid = (lo + hi) / 2; // exact: few significant bits
    CAPTURE(c);
    CHECK(rs::to_e4m3fn(std::nextafter(mid, 0.0f)) == c);
    CHECK(rs::to_e4m3fn(std::nextafter(mid, 1000.0f)) == c + 1);
    CHECK(rs::to_e4m3fn(mid) == ((c & 1) == 0 ? c : c + 1));
    CHECK(rs::to_e4m3fn(-mid) == (rs::to_e4m3fn(mid) | 0x80));
  }
  CHECK(rs::from_e4m3fn(0x7e) == 448.0f);
  CHECK(rs::to_e4m3fn(464.0f) == 0x7e);                         // the tie goes to the even code
  CHECK(rs::to_e4m3fn(std::nextafter(464.0f, 500.0f)) == 0x7f); // rounds past 448: NaN
  CHECK(rs::to_e4m3fn(std::numeric_limits<float>::infinity()) == 0x7f);
  CHECK(rs::to_e4m3fn(-std::numeric_limits<float>::infinity()) == 0xff);
  CHECK(rs::to_e4m3fn(std::numeric_limits<float>::quiet_NaN()) == 0x7f);
  CHECK(rs::to_e4m3fn(-0.0f) == 0x80);
}

TEST_CASE("golden: the E4M3 conversion is torch's float8_e4m3fn over a sweep") {
  const rlpt::test::golden_file f(rlpt::test::golden_path("sync", "verl_fp8.bin"));
  const auto x = f.get<float>("sweep.x");
  const auto want = f.get<std::uint8_t>("sweep.code");
  REQUIRE(x.size() == want.size());
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < x.size(); ++i)
    if (rs::to_e4m3fn(x[i]) != want[i]) {
      if (wrong++ < 5) MESSAGE("x ", x[i], ": rlpt ", int(rs::to_e4m3fn(x[i])), ", torch ", int(want[i]));
    }
  CHECK(wrong == 0);
}

namespace {

template <class T>
void check_case(const rlpt::test::golden_file& f, int k, const std::vector<T>& w, index_t rows, index_t cols) {
  const std::string p = "case" + std::to_string(k) + ".";
  const rs::fp8_block b{static_cast<index_t>(f.get<std::int64_t>(p + "block")[0])};
  const auto want_q = f.get<std::uint8_t>(p + "q");
  const auto want_s = f.get<float>(p + "scale_inv");
  const index_t sr = rs::fp8_scale_rows(rows, b), sc = rs::fp8_scale_cols(cols, b);
  REQUIRE(want_s.size() == static_cast<std::size_t>(sr * sc));
  std::vector<std::uint8_t> q(static_cast<std::size_t>(rows * cols));
  std::vector<float> s(static_cast<std::size_t>(sr * sc));
  const rlpt::view2d<const T> wv(w.data(), rows, cols);
  rs::quantize_fp8_blockwise(wv, rlpt::view2d<std::uint8_t>(q.data(), rows, cols),
                             rlpt::view2d<float>(s.data(), sr, sc), b);
  CAPTURE(k);
  CHECK(q == want_q);
  for (std::size_t i = 0; i < s.size(); ++i)
    CHECK(rlpt::detail::float_bits(s[i]) == rlpt::detail::float_bits(want_s[i]));
  // verl's own pair passes the audit; a flipped code and a changed scale are found and located
  const rlpt::view2d<const std::uint8_t> qv(want_q.data(), rows, cols);
  const rlpt::view2d<const float> sv(want_s.data(), sr, sc);
  const rs::fp8_audit ok = rs::audit_fp8_blockwise(wv, qv, sv, b);
  CHECK(ok.ok());
  CHECK(ok.blocks == sr * sc);
  auto bad_q = want_q;
  bad_q[static_cast<std::size_t>((rows - 1) * cols + 3)] ^= 1;
  auto bad_s = want_s;
  bad_s[static_cast<std::size_t>(sc - 1)] *= 1.5f;
  const rs::fp8_audit a = rs::audit_fp8_blockwise(wv, rlpt::view2d<const std::uint8_t>(bad_q.data(), rows, cols),
                                                  rlpt::view2d<const float>(bad_s.data(), sr, sc), b);
  CHECK(a.bad_codes == 1);
  CHECK(a.bad_scales == 1);
  CHECK(a.first_row == 0); // the scale's block starts on row 0, before the code's row
  CHECK(a.first_col == (sc - 1) * b.size);
}

} // namespace

TEST_CASE("golden: block-wise FP8 quantization equals verl's scaled_fp8_blockwise, and the audit finds changes") {
  const rlpt::test::golden_file f(rlpt::test::golden_path("sync", "verl_fp8.bin"));
  for (int k = 0; k < 3; ++k) {
    const std::string p = "case" + std::to_string(k) + ".";
    const auto& shape = f[p + "weight"].shape;
    const auto rows = static_cast<index_t>(shape[0]), cols = static_cast<index_t>(shape[1]);
    const auto values = f.get<float>(p + "weight");
    if (f.get<std::uint8_t>(p + "bf16")[0] != 0) {
      std::vector<rlpt::bf16> w;
      for (const float v : values) w.push_back(rlpt::bf16(v)); // exact: the values are bf16's
      check_case(f, k, w, rows, cols);
    } else {
      check_case(f, k, values, rows, cols);
    }
  }
}

TEST_CASE("fp8: shapes that do not fit and non-finite weights are refused, naming them") {
  std::vector<float> w(6 * 5, 0.5f), s(1);
  std::vector<std::uint8_t> q(6 * 5);
  const rlpt::view2d<const float> wv(w.data(), 6, 5);
  RLPT_CHECK_ERROR(rs::quantize_fp8_blockwise(wv, rlpt::view2d<std::uint8_t>(q.data(), 5, 6),
                                              rlpt::view2d<float>(s.data(), 1, 1), {4}),
                   "rlpt.sync.bad_shape", "codes are [5, 6]", "weight is [6, 5]");
  RLPT_CHECK_ERROR(rs::quantize_fp8_blockwise(wv, rlpt::view2d<std::uint8_t>(q.data(), 6, 5),
                                              rlpt::view2d<float>(s.data(), 1, 1), {4}),
                   "rlpt.sync.bad_shape", "scale_inv is [1, 1]", "needs [2, 2]");
  RLPT_CHECK_ERROR(rs::quantize_fp8_blockwise(wv, rlpt::view2d<std::uint8_t>(q.data(), 6, 5),
                                              rlpt::view2d<float>(s.data(), 1, 1), {0}),
                   "rlpt.sync.bad_shape", "block size must be positive");
  std::vector<float> s4(4);
  w[2 * 5 + 3] = std::numeric_limits<float>::quiet_NaN();
  RLPT_CHECK_ERROR(rs::quantize_fp8_blockwise(wv, rlpt::view2d<std::uint8_t>(q.data(), 6, 5),
                                              rlpt::view2d<float>(s4.data(), 2, 2), {4}),
                   "rlpt.sync.nonfinite", "element [2, 3]");
  // an edge block (rows 4-5, cols 4) with a valid weight: quantized on its own cells only
  w[2 * 5 + 3] = 0.5f;
  w[5 * 5 + 4] = -2.0f;
  rs::quantize_fp8_blockwise(wv, rlpt::view2d<std::uint8_t>(q.data(), 6, 5), rlpt::view2d<float>(s4.data(), 2, 2), {4});
  CHECK(s4[3] == 1.0f / (448.0f / 2.0f));
  CHECK(q[5 * 5 + 4] == rs::to_e4m3fn(-448.0f));
  CHECK(q[4 * 5 + 4] == rs::to_e4m3fn(0.5f * 224.0f));
}
