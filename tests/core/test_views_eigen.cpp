// SPDX-License-Identifier: Apache-2.0
// Views over Eigen objects (issue 19): vectors, Maps and row-major matrices convert to view /
// view2d without rlpt including Eigen; non-contiguous storage raises rlpt.view.not_contiguous;
// temporaries (Maps included) do not convert. Built only where Eigen is found.
#include <rlpt/core/views.hpp>

#include "support/errors.hpp"

#include <Eigen/Core>
#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>
#include <vector>

namespace {

using rlpt::index_t;
using RowMajor = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using ColMajor = Eigen::MatrixXf;
using VecMap = Eigen::Map<Eigen::VectorXf>;
using StridedMap = Eigen::Map<Eigen::VectorXf, Eigen::Unaligned, Eigen::InnerStride<>>;
using PaddedRows = Eigen::Map<RowMajor, Eigen::Unaligned, Eigen::OuterStride<>>;

template <class V, class R>
concept view_from = requires(R&& r) {
  V(std::forward<R>(r));
};

// Lvalues the caller keeps convert, with the element type's constness respected.
static_assert(std::is_convertible_v<Eigen::VectorXf&, rlpt::view<float>>);
static_assert(std::is_convertible_v<Eigen::VectorXf&, rlpt::view<const float>>);
static_assert(std::is_convertible_v<const Eigen::VectorXf&, rlpt::view<const float>>);
static_assert(!view_from<rlpt::view<float>, const Eigen::VectorXf&>, "a const vector gives a const view");
static_assert(!view_from<rlpt::view<const double>, Eigen::VectorXf&>, "no element conversion");
static_assert(std::is_convertible_v<VecMap&, rlpt::view<float>>);
static_assert(std::is_convertible_v<RowMajor&, rlpt::view2d<float>>);
static_assert(std::is_convertible_v<const RowMajor&, rlpt::view2d<const float>>);
static_assert(std::is_convertible_v<PaddedRows&, rlpt::view2d<const float>>);

// Temporaries dangle: an owning matrix dies at the end of the full expression, and a temporary
// Map cannot be told apart from one, so neither converts.
static_assert(!view_from<rlpt::view<const float>, Eigen::VectorXf>, "a view of a temporary vector dangles");
static_assert(!view_from<rlpt::view<const float>, const Eigen::VectorXf>);
static_assert(!view_from<rlpt::view<const float>, VecMap>, "temporary Maps do not convert either");
static_assert(!view_from<rlpt::view2d<const float>, RowMajor>, "a view2d of a temporary matrix dangles");
static_assert(!view_from<rlpt::view2d<const float>, PaddedRows>);
static_assert(!std::is_convertible_v<Eigen::VectorXf, rlpt::view<const float>>);

// Device views are ranges of device pointers: they never become host views (lvalue or not).
static_assert(!std::is_convertible_v<rlpt::device_view<float>&, rlpt::view<float>>);

} // namespace

TEST_CASE("views of Eigen vectors and maps borrow their memory") {
  Eigen::VectorXf v(5);
  v << 1, 2, 3, 4, 5;
  rlpt::view<float> a = v;
  CHECK(a.data() == v.data());
  CHECK(a.size() == 5);
  a[2] = 30;
  CHECK(v(2) == 30);
  const Eigen::VectorXf& cv = v;
  const rlpt::view<const float> c = cv;
  CHECK(c.data() == v.data());
  auto deduced = rlpt::view(cv); // CTAD: view<const float>
  static_assert(std::is_same_v<decltype(deduced), rlpt::view<const float>>);
  CHECK(deduced.size() == 5);

  VecMap m(v.data() + 1, 3);
  const rlpt::view<const float> mv = m;
  CHECK(mv.data() == v.data() + 1);
  CHECK(mv.size() == 3);
  CHECK(mv[0] == 2);

  Eigen::Matrix<std::int64_t, 4, 1> ids; // fixed-size, another element type
  ids << 7, 3, 7, 9;
  const rlpt::view<const std::int64_t> iv = ids;
  CHECK(iv.size() == 4);
  CHECK(iv[3] == 9);

  Eigen::VectorXf empty;
  const rlpt::view<const float> ev = empty;
  CHECK(ev.empty());
}

TEST_CASE("a row-major Eigen matrix is a view2d, and a 1-D view in row order") {
  RowMajor x(3, 4);
  for (index_t r = 0; r < 3; ++r)
    for (index_t col = 0; col < 4; ++col) x(r, col) = static_cast<float>(10 * r + col);
  const rlpt::view2d<const float> v = x;
  CHECK(v.data() == x.data());
  CHECK(v.rows() == 3);
  CHECK(v.cols() == 4);
  CHECK(v.row_stride() == 4);
  CHECK(v(2, 1) == 21);
  auto deduced = rlpt::view2d(x); // CTAD: view2d<float>
  static_assert(std::is_same_v<decltype(deduced), rlpt::view2d<float>>);
  deduced(1, 3) = -1;
  CHECK(x(1, 3) == -1);

  // Padded [B, T] tokens as one flat view, as token_layout::padded reads them.
  Eigen::Matrix<rlpt::mask_t, 2, 3, Eigen::RowMajor> mask;
  mask << 1, 1, 0, 1, 0, 0;
  const rlpt::view<const rlpt::mask_t> flat = mask;
  CHECK(flat.size() == 6);
  CHECK(flat[2] == 0);
  CHECK(flat[3] == 1);
}

TEST_CASE("a Map with an outer stride is a view2d with that row stride") {
  std::vector<float> storage(3 * 8);
  for (std::size_t i = 0; i < storage.size(); ++i) storage[i] = static_cast<float>(i);
  PaddedRows p(storage.data(), 3, 5, Eigen::OuterStride<>(8)); // [3, 5] in rows of 8
  const rlpt::view2d<const float> v = p;
  CHECK(v.rows() == 3);
  CHECK(v.cols() == 5);
  CHECK(v.row_stride() == 8);
  CHECK(v(2, 4) == 20);
  CHECK_FALSE(v.contiguous());
  // A block of a row-major matrix keeps the parent's row stride.
  RowMajor x = RowMajor::Zero(4, 6);
  auto block = x.block(1, 2, 2, 3);
  const rlpt::view2d<const float> b = block;
  CHECK(b.data() == x.data() + 6 + 2);
  CHECK(b.row_stride() == 6);
  CHECK(b.cols() == 3);
}

TEST_CASE("non-contiguous Eigen storage raises rlpt.view.not_contiguous") {
  Eigen::VectorXf v = Eigen::VectorXf::LinSpaced(8, 0, 7);
  StridedMap every_other(v.data(), 4, Eigen::InnerStride<>(2));
  RLPT_CHECK_ERROR(rlpt::view<const float>(every_other), "rlpt.view.not_contiguous", "4 elements", "2 apart",
                   "inner stride 2");
  StridedMap one(v.data(), 1, Eigen::InnerStride<>(2)); // a single element is contiguous
  CHECK(rlpt::view<const float>(one).size() == 1);

  // A column of a row-major matrix is strided; padded rows are not one contiguous run.
  RowMajor x = RowMajor::Zero(3, 4);
  auto column = x.col(1);
  RLPT_CHECK_ERROR(rlpt::view<const float>(column), "rlpt.view.not_contiguous", "3 elements", "inner stride 4");
  std::vector<float> storage(3 * 8);
  PaddedRows p(storage.data(), 3, 5, Eigen::OuterStride<>(8));
  RLPT_CHECK_ERROR(rlpt::view<const float>(p), "rlpt.view.not_contiguous", "3 rows of 5 elements", "outer stride 8",
                   "view2d");

  // view2d: the columns must be contiguous.
  using StridedRows = Eigen::Map<RowMajor, Eigen::Unaligned, Eigen::Stride<Eigen::Dynamic, Eigen::Dynamic>>;
  StridedRows s(storage.data(), 2, 3, Eigen::Stride<Eigen::Dynamic, Eigen::Dynamic>(12, 2));
  RLPT_CHECK_ERROR(rlpt::view2d<const float>(s), "rlpt.view.not_contiguous", "[2, 3]", "inner stride 2");
}
