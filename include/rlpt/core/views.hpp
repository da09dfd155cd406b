// SPDX-License-Identifier: Apache-2.0
//! @file
//! Non-owning views over caller memory, tagged with the memory space they live in.
//!
//! rlpt never owns the tensors it works on. A `view<T>` is a pointer and a length; a
//! `view2d<T>` adds a row stride (elements; columns are contiguous). The memory-space tag
//! makes passing device memory to a host function a compile-time error.
//!
//! Borrowing is explicit (as Eigen's `Map`): a view converts from a container the caller keeps
//! (an lvalue vector, array, span) but not from a temporary one, which would be destroyed while
//! the view still points into it:
//!
//!     std::vector<rlpt::index_t> cu{0, 3, 7};
//!     auto ok = rlpt::token_layout::packed(cu);                                  // borrows cu
//!     auto no = rlpt::token_layout::packed(std::vector<rlpt::index_t>{0, 3, 7}); // does not compile
//!
//! Temporaries that are themselves views (std::span, rlpt::view) are fine.
//!
//! Eigen objects convert too, without this header including Eigen: a vector, Map, Ref or
//! row-major matrix (anything with `data()`, `size()` and `innerStride()`) to a `view`, a
//! row-major matrix or map (`rows()`, `cols()`, `outerStride()`, `IsRowMajor`) to a `view2d`.
//! Their elements must be contiguous (unit inner stride; a 1-D view also needs rows without
//! padding), checked at run time (rlpt.view.not_contiguous); a column-major matrix does not
//! compile, since rlpt's [rows, cols] inputs are row-major. Temporary Eigen objects, Maps
//! included, do not convert: keep them in a variable.
#pragma once

#include <rlpt/config.hpp>
#include <rlpt/core/error.hpp>

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <string_view>
#include <type_traits>
#include <utility>

RLPT_NAMESPACE_BEGIN

enum class memory_space : std::uint8_t { host, device };

namespace detail {

//! Whether a view may be made from an `R&&`: an lvalue the caller keeps, or a temporary that
//! is itself a borrowed range (a span, a string_view). A temporary container is not.
template <class R>
inline constexpr bool may_borrow =
    std::is_lvalue_reference_v<R> || std::ranges::enable_borrowed_range<std::remove_cvref_t<R>>;

//! rlpt's own views (and anything else tagged with a memory space) convert only through their
//! own constructors, which keep the space: a device_view is a range too, of device pointers.
template <class R>
concept memory_tagged = requires {
  requires std::is_same_v<std::remove_cv_t<decltype(std::remove_cvref_t<R>::space)>, memory_space>;
};

//! `P` points at elements a view of `T` may refer to (T itself, or T's non-const for a const T).
template <class P, class T>
concept element_pointer = std::is_pointer_v<P> && std::is_convertible_v < std::remove_pointer_t<P>(*)
[], T (*)[] > ;

//! Dense strided storage std::span does not take: Eigen vectors, maps, refs and matrices
//! (duck-typed, Eigen is not included). `innerStride()` is required, not only data() and size():
//! a device buffer class with those two would otherwise pass for host memory.
template <class R, class T>
concept dense_storage = !memory_tagged<R> && !std::is_constructible_v<std::span<T>, R&> && requires(R & r) {
  requires element_pointer<decltype(r.data()), T>;
  { r.size() } -> std::convertible_to<index_t>;
  { r.innerStride() } -> std::convertible_to<index_t>;
};

//! A row-major Eigen-like matrix (static IsRowMajor) with a row stride (outerStride()).
template <class M, class T>
concept dense_matrix = !memory_tagged<M> && requires(M & m) {
  requires element_pointer<decltype(m.data()), T>;
  { m.rows() } -> std::convertible_to<index_t>;
  { m.cols() } -> std::convertible_to<index_t>;
  { m.outerStride() } -> std::convertible_to<index_t>;
  { m.innerStride() } -> std::convertible_to<index_t>;
  { std::remove_cvref_t<M>::IsRowMajor } -> std::convertible_to<bool>;
};

//! Whether reading dense storage in memory order gives rlpt's row-major order: a row-major
//! matrix or a compile-time vector does; a column-major matrix does not (Eigen's default).
template <class E> consteval bool flat_order_is_row_major() {
  if constexpr (requires {
                  E::IsRowMajor;
                  E::IsVectorAtCompileTime;
                })
    return static_cast<bool>(E::IsRowMajor) || static_cast<bool>(E::IsVectorAtCompileTime);
  else
    return true;
}

//! Raised by the view constructors on the host: a negative size, or a 2-D shape that is negative
//! or has more elements than index_t counts, never makes a view. (Device code builds views from
//! values the host validated.)
[[noreturn]] inline void bad_view_size(index_t size);
[[noreturn]] inline void bad_view2d_shape(index_t rows, index_t cols);
[[noreturn]] inline void bad_subview(index_t offset, index_t count, index_t size);
[[noreturn]] inline void not_contiguous_inner(index_t inner_stride, index_t size);
[[noreturn]] inline void not_contiguous_columns(index_t rows, index_t cols, index_t inner_stride);
[[noreturn]] inline void not_contiguous_outer(index_t outer_size, index_t inner_size, index_t outer_stride);

//! The run-time half of the dense-storage conversion to a 1-D view: consecutive elements
//! (unit inner stride, unless there is at most one) and, for a matrix, no padding between its
//! rows (outer stride == inner size, unless there is at most one row).
template <class R> void expect_contiguous_storage(const R& r) {
  const auto size = static_cast<index_t>(r.size());
  const auto inner = static_cast<index_t>(r.innerStride());
  if (RLPT_UNLIKELY(inner != 1 && size > 1)) not_contiguous_inner(inner, size);
  if constexpr (requires {
                  r.outerSize();
                  r.innerSize();
                  r.outerStride();
                }) {
    const auto outer_size = static_cast<index_t>(r.outerSize());
    const auto inner_size = static_cast<index_t>(r.innerSize());
    const auto outer = static_cast<index_t>(r.outerStride());
    if (RLPT_UNLIKELY(outer_size > 1 && outer != inner_size)) not_contiguous_outer(outer_size, inner_size, outer);
  }
}

} // namespace detail

//! Contiguous 1-D view.
template <class T, memory_space Space = memory_space::host> class view {
public:
  using element_type = T;
  using value_type = std::remove_cv_t<T>;
  static constexpr memory_space space = Space;

  constexpr view() noexcept = default;
  //! `size` elements at `data`. A negative size raises rlpt::error (rlpt.view.bad_shape) on the host.
  RLPT_HD constexpr view(T* data, index_t size) : data_(data), size_(size) {
#if !RLPT_DEVICE_PASS()
    if (RLPT_UNLIKELY(size < 0)) detail::bad_view_size(size);
#endif
  }

  //! Host views borrow anything std::span accepts (vectors, arrays, spans) that outlives them.
  template <class R>
    requires(Space == memory_space::host && std::is_constructible_v<std::span<T>, R&> && !detail::memory_tagged<R> &&
             detail::may_borrow<R>)
  constexpr view(R&& r) noexcept // NOLINT(google-explicit-constructor): views convert implicitly
      : view(std::span<T>(r)) {}

  //! A view of a temporary container would dangle as soon as the full expression ends: keep
  //! the container in a variable (or pass a std::span of it to say the borrow is intended).
  template <class R>
    requires(Space == memory_space::host && std::is_constructible_v<std::span<T>, R&> && !detail::memory_tagged<R> &&
             !detail::may_borrow<R>)
  view(R&& r)
  = delete;

  //! Host views borrow dense Eigen storage the caller keeps: a vector, Map, Ref, or a row-major
  //! matrix read row after row. Non-contiguous storage (a strided Map, a column of a row-major
  //! matrix, a padded block) raises rlpt::error (rlpt.view.not_contiguous).
  template <class R>
    requires(Space == memory_space::host && detail::dense_storage<R, T> && detail::may_borrow<R>)
  view(R&& r) // NOLINT(google-explicit-constructor): views convert implicitly
      : view(r.data(), static_cast<index_t>(r.size())) {
    static_assert(detail::flat_order_is_row_major<std::remove_cvref_t<R>>(),
                  "rlpt::view of a column-major Eigen matrix: its memory order is column by column, rlpt's "
                  "[rows, cols] data is row-major. Use Eigen::RowMajor, or map its data() as a vector "
                  "if the column order is what you mean.");
    detail::expect_contiguous_storage(r);
  }

  //! Eigen temporaries do not convert: a temporary matrix dies at the end of the full expression,
  //! and a temporary Map cannot be told apart from it here. Keep the object in a variable.
  template <class R>
    requires(Space == memory_space::host && detail::dense_storage<R, T> && !detail::may_borrow<R>)
  view(R&& r)
  = delete;

  template <std::size_t N>
    requires(Space == memory_space::host)
  // NOLINTNEXTLINE(google-explicit-constructor): a span converts like the container it views
  constexpr view(std::span<T, N> s) noexcept : data_(s.data()), size_(static_cast<index_t>(s.size())) {}

  //! view<T> converts to view<const T>.
  template <class U>
    requires(std::is_convertible_v<U (*)[], T (*)[]> && !std::is_same_v<U, T>)
  // NOLINTNEXTLINE(google-explicit-constructor): view<T> converts to view<const T> as T* to const T*
  RLPT_HD constexpr view(view<U, Space> other) noexcept : data_(other.data()), size_(other.size()) {}

  [[nodiscard]] RLPT_HD constexpr T* data() const noexcept { return data_; }
  [[nodiscard]] RLPT_HD constexpr index_t size() const noexcept { return size_; }
  [[nodiscard]] RLPT_HD constexpr bool empty() const noexcept { return size_ == 0; }
  [[nodiscard]] RLPT_HD constexpr T& operator[](index_t i) const noexcept { return data_[i]; }

  [[nodiscard]] constexpr T* begin() const noexcept { return data_; }
  [[nodiscard]] constexpr T* end() const noexcept { return data_ + size_; }

  //! Elements [offset, offset + count); bounds are validated.
  [[nodiscard]] view subview(index_t offset, index_t count) const {
    if (RLPT_UNLIKELY(!(offset >= 0 && count >= 0 && offset <= size_ && count <= size_ - offset)))
      detail::bad_subview(offset, count, size_);
    return {data_ + offset, count};
  }

  [[nodiscard]] std::span<T> span() const noexcept requires(Space == memory_space::host) {
    return {data_, static_cast<std::size_t>(size_)};
  }

private:
  T* data_ = nullptr;
  index_t size_ = 0;
};

template <class R> view(R&&) -> view<std::remove_reference_t<decltype(*std::data(std::declval<R&>()))>>;

//! Row-major 2-D view with a row stride in elements and contiguous columns.
template <class T, memory_space Space = memory_space::host> class view2d {
public:
  using element_type = T;
  using value_type = std::remove_cv_t<T>;
  static constexpr memory_space space = Space;

  constexpr view2d() noexcept = default;

  //! Contiguous [rows, cols]. On the host, a negative extent or a rows * cols beyond index_t
  //! raises rlpt::error (rlpt.view.bad_shape).
  RLPT_HD constexpr view2d(T* data, index_t rows, index_t cols)
      : data_(data), rows_(rows), cols_(cols), row_stride_(cols) {
#if !RLPT_DEVICE_PASS()
    index_t elements = 0;
    if (RLPT_UNLIKELY(rows < 0 || cols < 0 || __builtin_mul_overflow(rows, cols, &elements)))
      detail::bad_view2d_shape(rows, cols);
#endif
  }

  //! [rows, cols] whose row r starts at data + r * row_stride. Validated: extents >= 0,
  //! row_stride >= cols (unless there is at most one row), rows * row_stride within index_t.
  view2d(T* data, index_t rows, index_t cols, index_t row_stride)
      : data_(data), rows_(rows), cols_(cols), row_stride_(row_stride) {
    RLPT_CHECK(rows >= 0 && cols >= 0, errors::view::bad_shape, "view2d shape [{}, {}] is negative", rows, cols);
    RLPT_CHECK(row_stride >= cols || rows <= 1, errors::view::bad_stride,
               "view2d row stride {} is smaller than its {} columns: rows would overlap", row_stride, cols);
    index_t span = 0;
    RLPT_CHECK(!__builtin_mul_overflow(rows, row_stride, &span), errors::view::bad_shape,
               "view2d of {} rows with row stride {} overflows a 64-bit index", rows, row_stride);
  }

  //! A row-major Eigen matrix, Map or block the caller keeps, its outerStride() the row stride.
  //! A non-unit inner stride raises rlpt::error (rlpt.view.not_contiguous); a column-major
  //! matrix does not compile.
  template <class M>
    requires(Space == memory_space::host && detail::dense_matrix<M, T> && detail::may_borrow<M>)
  view2d(M&& m) { // NOLINT(google-explicit-constructor): views convert implicitly
    static_assert(std::remove_cvref_t<M>::IsRowMajor,
                  "rlpt::view2d of a column-major Eigen matrix: view2d is row-major (contiguous columns, a row "
                  "stride). Use Eigen::Matrix<T, Rows, Cols, Eigen::RowMajor> or a Map of one.");
    const auto rows = static_cast<index_t>(m.rows());
    const auto cols = static_cast<index_t>(m.cols());
    const auto inner = static_cast<index_t>(m.innerStride());
    if (RLPT_UNLIKELY(inner != 1 && cols > 1)) detail::not_contiguous_columns(rows, cols, inner);
    *this = view2d(m.data(), rows, cols, static_cast<index_t>(m.outerStride()));
  }

  //! Temporaries do not convert (see view): keep the matrix or Map in a variable.
  template <class M>
    requires(Space == memory_space::host && detail::dense_matrix<M, T> && !detail::may_borrow<M>)
  view2d(M&& m)
  = delete;

  template <class U>
    requires(std::is_convertible_v<U (*)[], T (*)[]> && !std::is_same_v<U, T>)
  // NOLINTNEXTLINE(google-explicit-constructor): view2d<T> converts to view2d<const T> as T* to const T*
  RLPT_HD constexpr view2d(view2d<U, Space> o) noexcept
      : data_(o.data()), rows_(o.rows()), cols_(o.cols()), row_stride_(o.row_stride()) {}

  [[nodiscard]] RLPT_HD constexpr T* data() const noexcept { return data_; }
  [[nodiscard]] RLPT_HD constexpr index_t rows() const noexcept { return rows_; }
  [[nodiscard]] RLPT_HD constexpr index_t cols() const noexcept { return cols_; }
  [[nodiscard]] RLPT_HD constexpr index_t row_stride() const noexcept { return row_stride_; }
  [[nodiscard]] RLPT_HD constexpr bool contiguous() const noexcept { return row_stride_ == cols_ || rows_ <= 1; }
  [[nodiscard]] RLPT_HD constexpr T& operator()(index_t r, index_t c) const noexcept {
    return data_[r * row_stride_ + c];
  }
  [[nodiscard]] RLPT_HD constexpr view<T, Space> row(index_t r) const noexcept {
    return {data_ + r * row_stride_, cols_};
  }

private:
  T* data_ = nullptr;
  index_t rows_ = 0;
  index_t cols_ = 0;
  index_t row_stride_ = 0;
};

template <class M>
  requires requires(M& m) {
    m.rows();
    m.cols();
    m.outerStride();
    *m.data();
  }
view2d(M&&)->view2d<std::remove_reference_t<decltype(*std::declval<M&>().data())>>;

template <class T> using device_view = view<T, memory_space::device>;
template <class T> using device_view2d = view2d<T, memory_space::device>;

//! Masks are one byte per element, nonzero = valid (torch.bool and uint8 tensors as they are).
using mask_t = std::uint8_t;

namespace detail {

//! Valid slots among m[0..n) (all n when m is null). Blocks of 32-bit counts keep the byte loop
//! vectorised; a 64-bit count per slot did not.
inline index_t count_valid(const mask_t* m, index_t n) noexcept {
  if (m == nullptr) return n;
  constexpr index_t block = index_t{1} << 16;
  index_t total = 0;
  for (index_t t0 = 0; t0 < n; t0 += block) {
    const index_t t1 = n - t0 < block ? n : t0 + block;
    std::uint32_t c = 0;
    for (index_t t = t0; t < t1; ++t) c += m[t] != 0 ? 1u : 0u;
    total += static_cast<index_t>(c);
  }
  return total;
}

//! Whether the eight mask bytes at m are all zero (one 64-bit load).
inline bool mask_word_zero(const mask_t* m) noexcept {
  std::uint64_t w = 0;
  std::memcpy(&w, m, sizeof w);
  return w == 0;
}

//! The first valid slot among m[0..n) (n when none), eight bytes at a time.
inline index_t first_valid(const mask_t* m, index_t n) noexcept {
  index_t t = 0;
  while (t + 8 <= n && mask_word_zero(m + t)) t += 8;
  while (t < n && m[t] == 0) ++t;
  return t;
}

//! One past the last valid slot among m[0..n) (0 when none), eight bytes at a time: a padded
//! row's valid part ends there.
inline index_t end_of_valid(const mask_t* m, index_t n) noexcept {
  index_t t = n;
  while (t >= 8 && mask_word_zero(m + t - 8)) t -= 8;
  while (t > 0 && m[t - 1] == 0) --t;
  return t;
}

inline void bad_view_size(index_t size) { RLPT_FAIL(errors::view::bad_shape, "view size {} is negative", size); }

inline void bad_subview(index_t offset, index_t count, index_t size) {
  index_t end = 0;
  if (__builtin_add_overflow(offset, count, &end))
    RLPT_FAIL(errors::view::out_of_range, "subview of {} elements at offset {} is outside a view of {} elements", count,
              offset, size);
  RLPT_FAIL(errors::view::out_of_range, "subview [{}, {}) is outside a view of {} elements", offset, end, size);
}

inline void not_contiguous_inner(index_t inner_stride, index_t size) {
  RLPT_FAIL(errors::view::not_contiguous,
            "view of {} elements that are {} apart (inner stride {}): a view needs contiguous elements; copy them, or "
            "map them with a unit inner stride",
            size, inner_stride, inner_stride);
}

inline void not_contiguous_columns(index_t rows, index_t cols, index_t inner_stride) {
  RLPT_FAIL(errors::view::not_contiguous,
            "view2d of a [{}, {}] matrix whose columns are {} elements apart (inner stride {}): a view2d needs "
            "contiguous columns; copy it, or map it with a unit inner stride",
            rows, cols, inner_stride, inner_stride);
}

inline void not_contiguous_outer(index_t outer_size, index_t inner_size, index_t outer_stride) {
  RLPT_FAIL(errors::view::not_contiguous,
            "view of a matrix whose {} rows of {} elements are {} apart (outer stride {}): a 1-D view needs them "
            "back to back; pass it as a view2d (row stride) or copy it",
            outer_size, inner_size, outer_stride, outer_stride);
}

inline void bad_view2d_shape(index_t rows, index_t cols) {
  RLPT_FAIL(errors::view::bad_shape, "view2d shape [{}, {}] is negative or has more than {} elements", rows, cols,
            std::numeric_limits<index_t>::max());
}

//! Validates that a view has exactly `expected` elements; `what` names the argument.
inline void expect_size(std::string_view what, index_t got, index_t expected, std::string_view why = {}) {
  if (RLPT_UNLIKELY(got != expected)) {
    if (why.empty()) RLPT_FAIL(errors::view::size_mismatch, "{} has {} elements, expected {}", what, got, expected);
    RLPT_FAIL(errors::view::size_mismatch, "{} has {} elements, expected {} ({})", what, got, expected, why);
  }
}

//! Validates that an optional input (empty = absent) has `expected` elements when present.
inline void expect_size_or_empty(std::string_view what, index_t got, index_t expected, std::string_view why = {}) {
  if (got != 0) expect_size(what, got, expected, why);
}

} // namespace detail
RLPT_NAMESPACE_END
