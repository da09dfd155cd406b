// SPDX-License-Identifier: Apache-2.0
//! @file
//! Token layouts: where token t of sequence b lives in a per-token array.
//!
//! Two layouts are first-class, and every per-sequence block accepts both through this type:
//! - padded: [B, T] rows (row stride in elements), validity given by a separate mask;
//! - packed: flat tokens with offsets (cu_seqlens, B + 1 entries, offsets[0] == 0).
//! Every per-token array passed with a layout has `storage_size()` elements and shares the
//! layout's indexing.
//!
//! A packed layout borrows its offsets: keep them alive as long as the layout. Passing a
//! temporary container does not compile (see core/views.hpp); host offsets are validated, and
//! every index a host layout computes (b * row_stride, B * T, offsets) fits index_t.
#pragma once

#include <rlpt/config.hpp>
#include <rlpt/core/checked.hpp>
#include <rlpt/core/error.hpp>
#include <rlpt/core/views.hpp>

RLPT_NAMESPACE_BEGIN

enum class layout_kind : std::uint8_t { padded, packed };

template <memory_space Space = memory_space::host> class basic_token_layout {
public:
  constexpr basic_token_layout() noexcept = default;

  //! [batch, seq_len] rows; row b starts at b * row_stride (-1, the default: seq_len).
  //! batch * row_stride must fit index_t.
  static basic_token_layout padded(index_t batch, index_t seq_len, index_t row_stride = -1) {
    RLPT_CHECK(batch >= 0 && seq_len >= 0, errors::layout::bad_shape, "padded layout [{}, {}] has a negative extent",
               batch, seq_len);
    RLPT_CHECK(row_stride >= -1, errors::layout::bad_stride,
               "padded layout row stride {} is negative (-1 means seq_len = {})", row_stride, seq_len);
    if (row_stride == -1) row_stride = seq_len;
    RLPT_CHECK(row_stride >= seq_len, errors::layout::bad_stride,
               "padded layout row stride {} is smaller than seq_len {}", row_stride, seq_len);
    index_t storage = 0;
    RLPT_CHECK(!detail::mul_overflows(batch, row_stride, storage), errors::layout::bad_shape,
               "padded layout [{}, {}] with row stride {} has more than {} token slots ({} * {} overflows a 64-bit "
               "index)",
               batch, seq_len, row_stride, detail::index_max, batch, row_stride);
    basic_token_layout l;
    l.kind_ = layout_kind::padded;
    l.num_seqs_ = batch;
    l.seq_len_ = seq_len;
    l.row_stride_ = row_stride;
    return l;
  }

  //! Packed sequences given by offsets (cu_seqlens): sequence b is [offsets[b], offsets[b+1]).
  //! Host offsets are validated (start at 0, non-decreasing); device offsets are trusted.
  //! The offsets are borrowed, not copied: they must outlive the layout (a temporary container
  //! does not convert to the view).
  static basic_token_layout packed(view<const index_t, Space> offsets) {
    RLPT_CHECK(!offsets.empty(), errors::layout::bad_offsets,
               "packed layout needs B + 1 offsets (cu_seqlens), got an empty array");
    basic_token_layout l;
    l.kind_ = layout_kind::packed;
    l.num_seqs_ = offsets.size() - 1;
    l.offsets_ = offsets.data();
    if constexpr (Space == memory_space::host) {
      detail::check_offsets(errors::layout::bad_offsets, "packed offsets", "sequence", offsets);
      index_t longest = 0;
      for (index_t b = 0; b < l.num_seqs_; ++b)
        longest = offsets[b + 1] - offsets[b] > longest ? offsets[b + 1] - offsets[b] : longest;
      l.seq_len_ = longest;
      l.total_ = offsets[l.num_seqs_];
    }
    return l;
  }

  //! Packed layout over device offsets whose total token count the caller knows.
  static basic_token_layout packed(view<const index_t, Space> offsets, index_t total_tokens,
                                   index_t max_len) requires(Space == memory_space::device) {
    RLPT_CHECK(total_tokens >= 0 && max_len >= 0 && max_len <= total_tokens, errors::layout::bad_offsets,
               "packed device layout of {} sequences has total_tokens = {} and max_len = {}; both must be >= 0 and "
               "max_len <= total_tokens",
               offsets.size() - 1, total_tokens, max_len);
    basic_token_layout l = packed(offsets);
    l.total_ = total_tokens;
    l.seq_len_ = max_len;
    return l;
  }

  [[nodiscard]] RLPT_HD constexpr layout_kind kind() const noexcept { return kind_; }
  [[nodiscard]] RLPT_HD constexpr bool is_packed() const noexcept { return kind_ == layout_kind::packed; }
  [[nodiscard]] RLPT_HD constexpr index_t num_seqs() const noexcept { return num_seqs_; }
  //! Padded: T. Packed: the longest sequence (host) or the caller's bound (device).
  [[nodiscard]] RLPT_HD constexpr index_t max_len() const noexcept { return seq_len_; }
  [[nodiscard]] RLPT_HD constexpr index_t row_stride() const noexcept { return row_stride_; }
  [[nodiscard]] RLPT_HD constexpr const index_t* offsets() const noexcept { return offsets_; }

  //! Index of token 0 of sequence b.
  [[nodiscard]] RLPT_HD constexpr index_t begin(index_t b) const noexcept {
    return kind_ == layout_kind::packed ? offsets_[b] : b * row_stride_;
  }
  //! Number of token slots of sequence b (padded: T, whatever the mask says).
  [[nodiscard]] RLPT_HD constexpr index_t length(index_t b) const noexcept {
    return kind_ == layout_kind::packed ? offsets_[b + 1] - offsets_[b] : seq_len_;
  }
  //! Index of token t of sequence b.
  [[nodiscard]] RLPT_HD constexpr index_t at(index_t b, index_t t) const noexcept { return begin(b) + t; }

  //! Elements a per-token array has: B * row_stride (padded) or offsets[B] (packed).
  [[nodiscard]] RLPT_HD constexpr index_t storage_size() const noexcept {
    return kind_ == layout_kind::packed ? total_ : num_seqs_ * row_stride_;
  }

  //! Token slots that exist (padded: B * T; packed: offsets[B]).
  [[nodiscard]] RLPT_HD constexpr index_t num_slots() const noexcept {
    return kind_ == layout_kind::packed ? total_ : num_seqs_ * seq_len_;
  }

  //! Validates a per-token array against the layout; `what` names it in the error.
  template <class T> void expect_tokens(std::string_view what, view<T, Space> v) const {
    detail::expect_size(what, v.size(), storage_size(),
                        kind_ == layout_kind::packed ? "one per packed token" : "B * row_stride");
  }

private:
  layout_kind kind_ = layout_kind::padded;
  index_t num_seqs_ = 0;
  index_t seq_len_ = 0;
  index_t row_stride_ = 0;
  index_t total_ = 0;
  const index_t* offsets_ = nullptr;
};

using token_layout = basic_token_layout<memory_space::host>;
using device_token_layout = basic_token_layout<memory_space::device>;

RLPT_NAMESPACE_END
