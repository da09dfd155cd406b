// SPDX-License-Identifier: Apache-2.0
#include <rlpt/core/layout.hpp>
#include <rlpt/core/views.hpp>

#include "support/errors.hpp"

#include <array>
#include <vector>

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
  RLPT_CHECK_ERROR(rlpt::token_layout::packed(std::vector<rlpt::index_t>{}), "rlpt.layout.bad_offsets", "B + 1");
}
