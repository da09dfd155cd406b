// SPDX-License-Identifier: Apache-2.0
// Torch tensors -> rlpt views. Inputs are read in place when their memory already has the
// layout rlpt indexes (contiguous, or [B, T] rows with a common row stride); otherwise they are
// copied once and the copy is counted (rlpt.copy_stats()), or, in strict mode
// (rlpt.set_strict(True)), refused with rlpt.python.strides naming the tensor. Dtype casts are
// counted the same way. Errors thrown here and by rlpt surface as ValueError through guard().
#pragma once

#include "spec.hpp"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <rlpt/core/layout.hpp>
#include <rlpt/core/views.hpp>

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace rlpt_py {

using opt_tensor = std::optional<at::Tensor>;
using rlpt::index_t;

//! Copies / casts made for the ops, by tensor name.
void note_copy(std::string_view kind, std::string_view what);
bool strict();
void set_strict(bool on);
std::vector<std::tuple<std::string, std::string, std::int64_t>> copy_stats();
void reset_copy_stats();

//! Runs f, turning rlpt::error into c10::ValueError (Python ValueError) carrying rlpt's message
//! "rlpt::error [<id>]: <message>" (rlpt/__init__.py maps it to rlpt.Error with .id).
template <class F> decltype(auto) guard(F&& f) {
  try {
    return f();
  } catch (const rlpt::error& e) {
    throw c10::ValueError({__func__, __FILE__, static_cast<uint32_t>(__LINE__)}, e.what());
  }
}

std::string dims(at::IntArrayRef d);
std::string dtype_name(at::ScalarType t);

//! `t` made contiguous, a copy counted under `what`; in strict mode rlpt.python.strides with the
//! message `why()` instead (built only then).
template <class Why> at::Tensor counted_contiguous(const at::Tensor& t, std::string_view what, Why&& why) {
  if (strict()) raise(ids::strides, why());
  note_copy("copy", what);
  return t.contiguous();
}

//! The tensor as `want` (a counted cast when it differs) and contiguous (a counted copy when
//! it is not).
at::Tensor contiguous_as(const at::Tensor& t, at::ScalarType want, std::string_view what);

//! A [N, X] or [B, T, X] tensor as [rows, X] rows with a contiguous last dimension and one row
//! stride: read in place when its memory has that layout, else a counted copy (or, in strict
//! mode, rlpt.python.strides naming `what`).
at::Tensor as_rows(const at::Tensor& t, std::string_view what);

//! A one-per-row tensor (`rows` elements) as contiguous float32 [rows] (upstream gradients and
//! saved statistics of the backward ops).
at::Tensor per_row_f32(const at::Tensor& t, index_t rows, std::string_view what);

//! A mask as bytes (bool is reinterpreted; other dtypes become (x != 0), a counted cast).
at::Tensor mask_bytes(const at::Tensor& t, std::string_view what);

void expect_device(const at::Tensor& t, const c10::Device& d, std::string_view what);

//! Per-token tensors of one call: padded [B, T] (row stride S, possibly > T when every input
//! is a row slice of a wider buffer) or packed [N] with cu_seqlens.
struct token_batch {
  bool packed = false;
  index_t B = 0, T = 0, S = 0, N = 0; // N: storage size (B * S padded, offsets[B] packed)
  index_t max_len = 0;
  at::Tensor offsets;         // int64 CPU (packed)
  at::Tensor offsets_dev;     // int64 on the tensors' device (packed)
  std::vector<int64_t> shape; // [B, T] or [N]
  c10::Device device{c10::kCPU};

  [[nodiscard]] rlpt::token_layout host_layout() const;
};

//! Describes the batch from a reference per-token tensor (`ref`), cu_seqlens (packed), and every
//! other per-token input with the dtype it will be read as (the row stride is shared only when no
//! input needs a copy).
token_batch describe(const at::Tensor& ref, std::string_view ref_name, const opt_tensor& cu_seqlens,
                     const std::vector<std::tuple<const opt_tensor*, at::ScalarType, std::string_view>>& inputs);

//! A per-token input laid out for `b` (same indexing: b * S + t, or packed), as `want`.
at::Tensor token_input(const at::Tensor& t, at::ScalarType want, const token_batch& b, std::string_view what);
//! A fresh per-token output buffer (B x S, or N); token_view() gives the user-facing [B, T] view.
at::Tensor token_output(const token_batch& b, const at::TensorOptions& o);
at::Tensor token_view(const at::Tensor& buffer, const token_batch& b);

template <class T, rlpt::memory_space S = rlpt::memory_space::host> rlpt::view<T, S> view_of(const at::Tensor& t) {
  return {static_cast<T*>(t.data_ptr()), static_cast<index_t>(t.numel())};
}
template <class T, rlpt::memory_space S = rlpt::memory_space::host> rlpt::view<T, S> view_of(const opt_tensor& t) {
  return t ? view_of<T, S>(*t) : rlpt::view<T, S>{};
}

} // namespace rlpt_py
