// SPDX-License-Identifier: Apache-2.0
#include <rlpt/core/checked.hpp>
#include <rlpt/core/layout.hpp>
#include <rlpt/core/views.hpp>

#include "support/errors.hpp"

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

namespace {

constexpr rlpt::index_t big = std::numeric_limits<rlpt::index_t>::max();

// Explicit borrowing (issue 18/19): a view, and so a packed layout, borrows memory the caller
// keeps. From a temporary container it would dangle, so it must not compile; from an lvalue or
// from a temporary that is itself a view (std::span) it does.
template <class V, class R>
concept view_from = requires(R&& r) {
  V(std::forward<R>(r));
};
template <class R>
concept packs = requires(R&& r) {
  rlpt::token_layout::packed(std::forward<R>(r));
};

static_assert(!view_from<rlpt::view<const float>, std::vector<float>>, "a view of a temporary vector dangles");
static_assert(!view_from<rlpt::view<const float>, const std::vector<float>>, "a view of a temporary vector dangles");
static_assert(!view_from<rlpt::view<const int>, std::array<int, 3>>, "a view of a temporary array dangles");
static_assert(!std::is_convertible_v<std::vector<float>, rlpt::view<const float>>);
static_assert(view_from<rlpt::view<const float>, std::vector<float>&>);
static_assert(view_from<rlpt::view<const float>, const std::vector<float>&>);
static_assert(view_from<rlpt::view<float>, std::vector<float>&>);
static_assert(view_from<rlpt::view<const float>, std::span<const float>>, "a span temporary borrows on");
static_assert(!packs<std::vector<rlpt::index_t>>, "token_layout::packed(std::vector{...}) keeps a dangling pointer");
static_assert(!packs<const std::vector<rlpt::index_t>>);
static_assert(packs<std::vector<rlpt::index_t>&>);
static_assert(packs<std::span<const rlpt::index_t>>);

} // namespace

TEST_CASE("view wraps caller memory without copying") {
  std::vector<float> v{1, 2, 3, 4, 5};
  rlpt::view<float> a = v;
  CHECK(a.data() == v.data());
  CHECK(a.size() == 5);
  a[2] = 30;
  CHECK(v[2] == 30);
  rlpt::view<const float> c = a; // mutable -> const converts
  CHECK(c[2] == 30);
  const std::array<double, 3> arr{1, 2, 3};
  rlpt::view<const double> d = arr;
  CHECK(d.size() == 3);
  auto sub = a.subview(1, 3);
  CHECK(sub[0] == 2);
  CHECK(sub.size() == 3);
  RLPT_CHECK_ERROR(a.subview(3, 4), "rlpt.view.out_of_range", "[3, 7)", "5 elements");
  static_assert(!std::is_convertible_v<rlpt::device_view<float>, rlpt::view<float>>,
                "device memory must not pass where host memory is expected");
  // An lvalue device view is a range too (of device pointers): it must not become a host view.
  static_assert(!std::is_convertible_v<rlpt::device_view<float>&, rlpt::view<float>>);
  static_assert(!std::is_convertible_v<const rlpt::device_view<const float>&, rlpt::view<const float>>);
  // Nor a buffer class with only data() and size(), as device buffers often are: the Eigen
  // conversion asks for innerStride() too.
  struct buffer {
    float* data() const { return nullptr; }
    std::size_t size() const { return 0; }
  };
  static_assert(!std::is_convertible_v<buffer&, rlpt::view<float>>);
}

TEST_CASE("view2d: row stride, contiguity and rejected overlapping rows") {
  std::vector<int> buf(3 * 8);
  for (std::size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<int>(i);
  rlpt::view2d<int> m(buf.data(), 3, 5, 8);
  CHECK(m(2, 4) == 20);
  CHECK(m.row(1)[0] == 8);
  CHECK_FALSE(m.contiguous());
  CHECK(rlpt::view2d<int>(buf.data(), 3, 8).contiguous());
  RLPT_CHECK_ERROR(rlpt::view2d<int>(buf.data(), 3, 5, 4), "rlpt.view.bad_stride", "row stride 4", "5 columns");
}

TEST_CASE("expect_size names the argument, the sizes and why") {
  RLPT_CHECK_ERROR(rlpt::detail::expect_size("rewards", 10, 12, "one per sequence"), "rlpt.view.size_mismatch",
                   "rewards has 10 elements, expected 12 (one per sequence)");
  CHECK_NOTHROW(rlpt::detail::expect_size_or_empty("values", 0, 12));
}

TEST_CASE("padded layout indexes rows with a stride") {
  const auto l = rlpt::token_layout::padded(4, 6, 8);
  CHECK(l.num_seqs() == 4);
  CHECK(l.length(3) == 6);
  CHECK(l.at(2, 5) == 21);
  CHECK(l.storage_size() == 32);
  CHECK(l.num_slots() == 24);
  std::vector<float> ok(32), bad(24);
  CHECK_NOTHROW(l.expect_tokens("logprobs", rlpt::view<const float>(ok)));
  RLPT_CHECK_ERROR(l.expect_tokens("logprobs", rlpt::view<const float>(bad)), "rlpt.view.size_mismatch",
                   "logprobs has 24 elements, expected 32");
  RLPT_CHECK_ERROR(rlpt::token_layout::padded(4, 6, 5), "rlpt.layout.bad_stride", "row stride 5", "seq_len 6");
}

TEST_CASE("packed layout: offsets are cu_seqlens, validated") {
  std::vector<rlpt::index_t> off{0, 3, 3, 10};
  const auto l = rlpt::token_layout::packed(off);
  CHECK(l.is_packed());
  CHECK(l.num_seqs() == 3);
  CHECK(l.length(1) == 0);
  CHECK(l.length(2) == 7);
  CHECK(l.at(2, 1) == 4);
  CHECK(l.max_len() == 7);
  CHECK(l.storage_size() == 10);
  std::vector<rlpt::index_t> nonzero{1, 3};
  RLPT_CHECK_ERROR(rlpt::token_layout::packed(nonzero), "rlpt.layout.bad_offsets", "start at 0, got 1");
  std::vector<rlpt::index_t> decreasing{0, 5, 4};
  RLPT_CHECK_ERROR(rlpt::token_layout::packed(decreasing), "rlpt.layout.bad_offsets", "decrease at sequence 1",
                   "offsets[1] = 5 > offsets[2] = 4");
  std::vector<rlpt::index_t> none;
  RLPT_CHECK_ERROR(rlpt::token_layout::packed(none), "rlpt.layout.bad_offsets", "B + 1");
  std::vector<rlpt::index_t> negative{-6, 4};
  RLPT_CHECK_ERROR(rlpt::token_layout::packed(negative), "rlpt.layout.bad_offsets", "start at 0, got -6");
}

TEST_CASE("a packed layout borrows its offsets: they stay the caller's") {
  std::vector<rlpt::index_t> off{0, 2, 5};
  const auto l = rlpt::token_layout::packed(off);
  CHECK(l.offsets() == off.data());
  const auto s = rlpt::token_layout::packed(std::span<const rlpt::index_t>(off)); // a span says "borrowed"
  CHECK(s.offsets() == off.data());
  CHECK(s.storage_size() == 5);
}

TEST_CASE("padded layouts whose size overflows index_t are errors, not wrapped indices") {
  // B * row_stride beyond 2^63 - 1 used to wrap (signed overflow, reached from gae and evaluate).
  RLPT_CHECK_ERROR(rlpt::token_layout::padded(big, 2), "rlpt.layout.bad_shape", std::to_string(big), "overflows");
  RLPT_CHECK_ERROR(rlpt::token_layout::padded(3, big / 2), "rlpt.layout.bad_shape", "[3, 4611686018427387903]",
                   "overflows");
  RLPT_CHECK_ERROR(rlpt::token_layout::padded(2, 4, big), "rlpt.layout.bad_shape", "row stride 9223372036854775807");
  RLPT_CHECK_ERROR(rlpt::token_layout::padded(2, 4, -2), "rlpt.layout.bad_stride", "row stride -2", "negative");
  const auto one = rlpt::token_layout::padded(1, big); // one row of 2^63 - 1 slots is representable
  CHECK(one.storage_size() == big);
  CHECK(rlpt::token_layout::padded(0, big, big).storage_size() == 0);
  CHECK(rlpt::token_layout::padded(4, 6).row_stride() == 6); // -1: seq_len
}

TEST_CASE("views reject negative and overflowing extents on the host") {
  std::vector<int> buf(8);
  RLPT_CHECK_ERROR(rlpt::view<int>(buf.data(), -1), "rlpt.view.bad_shape", "view size -1");
  RLPT_CHECK_ERROR(rlpt::view2d<int>(buf.data(), -1, 4), "rlpt.view.bad_shape", "[-1, 4]");
  RLPT_CHECK_ERROR(rlpt::view2d<int>(buf.data(), 4, -1), "rlpt.view.bad_shape", "[4, -1]");
  RLPT_CHECK_ERROR(rlpt::view2d<int>(buf.data(), big, 2), "rlpt.view.bad_shape", "[9223372036854775807, 2]");
  RLPT_CHECK_ERROR(rlpt::view2d<int>(buf.data(), 3, 4, big), "rlpt.view.bad_shape", "row stride 9223372036854775807");
  rlpt::view<int> v = buf;
  RLPT_CHECK_ERROR(v.subview(big, big), "rlpt.view.out_of_range", "at offset 9223372036854775807");
  RLPT_CHECK_ERROR(v.subview(2, big), "rlpt.view.out_of_range", "8 elements");
  RLPT_CHECK_ERROR(v.subview(-1, 2), "rlpt.view.out_of_range", "[-1, 1)");
  CHECK(v.subview(8, 0).empty());
}

TEST_CASE("checked arithmetic and offsets validation name the values") {
  rlpt::index_t out = 0;
  CHECK(rlpt::detail::add_overflows(big, 1, out));
  CHECK_FALSE(rlpt::detail::add_overflows(big - 1, 1, out));
  CHECK(out == big);
  CHECK(rlpt::detail::mul_overflows(big / 2 + 1, 2, out));
  CHECK(rlpt::detail::ceil_div(big, big) == 1);
  CHECK(rlpt::detail::ceil_div(big - 1, big) == 1);
  CHECK(rlpt::detail::ceil_div(0, big) == 0);
  CHECK(rlpt::detail::ceil_div(7, 2) == 4);
  CHECK(rlpt::detail::round_up_overflows(big, 2, out));
  CHECK_FALSE(rlpt::detail::round_up_overflows(big - 1, 2, out));
  CHECK_FALSE(rlpt::detail::round_up_overflows(5, big, out));
  CHECK(out == big);
  constexpr rlpt::error_id id{"rlpt.test.checked"};
  RLPT_CHECK_ERROR(rlpt::detail::checked_add(id, "the total", big, 3), "rlpt.test.checked", "the total",
                   "9223372036854775807 + 3");
  RLPT_CHECK_ERROR(rlpt::detail::checked_mul(id, "B * T", 1 << 20, big), "rlpt.test.checked", "B * T", "1048576 * ");
  std::vector<rlpt::index_t> dec{0, 10, 4};
  RLPT_CHECK_ERROR(rlpt::detail::check_offsets(id, "cu", "sequence", dec), "rlpt.test.checked",
                   "decrease at sequence 1", "offsets[1] = 10 > offsets[2] = 4");
  std::vector<rlpt::index_t> flat{0, 3, 3};
  CHECK_NOTHROW(rlpt::detail::check_offsets(id, "cu", "sequence", flat));
  RLPT_CHECK_ERROR(rlpt::detail::check_offsets(id, "offsets", "group", flat, true), "rlpt.test.checked",
                   "group 1 is empty", "offsets[1] = 3, offsets[2] = 3");
}

TEST_CASE("first_valid and end_of_valid agree with a byte-by-byte scan") {
  // Every single valid slot and every pair in masks of up to 100 bytes, at every length: the
  // eight-byte stride must not step over a valid byte nor stop short of one.
  for (rlpt::index_t n = 0; n <= 100; ++n)
    for (rlpt::index_t a = -1; a < n; ++a)
      for (rlpt::index_t b = a; b < n; b += 7) {
        std::vector<rlpt::mask_t> m(static_cast<std::size_t>(n) + 1, 0); // +1: never read past n
        m[static_cast<std::size_t>(n)] = 1;
        if (a >= 0) m[static_cast<std::size_t>(a)] = 1, m[static_cast<std::size_t>(b)] = 1;
        rlpt::index_t first = n, end = 0;
        for (rlpt::index_t t = 0; t < n; ++t)
          if (m[static_cast<std::size_t>(t)] != 0) first = std::min(first, t), end = t + 1;
        INFO("n = " << n << ", valid at " << a << " and " << b);
        CHECK(rlpt::detail::first_valid(m.data(), n) == first);
        CHECK(rlpt::detail::end_of_valid(m.data(), n) == end);
        if (a < 0) break;
      }
}
