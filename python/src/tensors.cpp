// SPDX-License-Identifier: Apache-2.0
#include "tensors.hpp"

#include <fmt/format.h>

#include <atomic>
#include <map>
#include <mutex>

namespace rlpt_py {

namespace {
std::mutex copies_mu;
std::map<std::pair<std::string, std::string>, std::int64_t> copies;
std::atomic<bool> strict_mode{false};
} // namespace

void note_copy(std::string_view kind, std::string_view what) {
  std::lock_guard lock(copies_mu);
  ++copies[{std::string(kind), std::string(what)}];
}
bool strict() { return strict_mode.load(std::memory_order_relaxed); }
void set_strict(bool on) { strict_mode.store(on, std::memory_order_relaxed); }
std::vector<std::tuple<std::string, std::string, std::int64_t>> copy_stats() {
  std::lock_guard lock(copies_mu);
  std::vector<std::tuple<std::string, std::string, std::int64_t>> out;
  for (const auto& [k, n] : copies) out.emplace_back(k.first, k.second, n);
  return out;
}
void reset_copy_stats() {
  std::lock_guard lock(copies_mu);
  copies.clear();
}

std::string dims(at::IntArrayRef d) {
  std::string s = "[";
  for (std::size_t i = 0; i < d.size(); ++i) s += (i ? ", " : "") + std::to_string(d[i]);
  return s + "]";
}

std::string dtype_name(at::ScalarType t) { return std::string(c10::toString(t)); }

at::Tensor contiguous_as(const at::Tensor& t, at::ScalarType want, std::string_view what) {
  at::Tensor x = t;
  if (x.scalar_type() != want) {
    note_copy("cast", what);
    x = x.to(want);
  }
  if (!x.is_contiguous())
    x = counted_contiguous(x, what, [&] {
      return fmt::format("{} (shape {}, strides {}) is not contiguous and strict mode is on; call .contiguous() on it",
                         what, dims(t.sizes()), dims(t.strides()));
    });
  return x;
}

at::Tensor as_rows(const at::Tensor& t, std::string_view what) {
  at::Tensor x = t;
  const bool last_ok = x.size(-1) <= 1 || x.stride(-1) == 1;
  const bool one_stride = x.dim() != 3 || x.size(0) <= 1 || x.stride(0) == x.size(1) * x.stride(1);
  if (!last_ok || !one_stride)
    x = counted_contiguous(x, what, [&] {
      return fmt::format("{} (shape {}, strides {}) cannot be read as rows with a contiguous last dimension and one "
                         "row stride, and strict mode is on; call .contiguous() on it",
                         what, dims(t.sizes()), dims(t.strides()));
    });
  return x.dim() == 3 ? x.view({x.size(0) * x.size(1), x.size(2)}) : x;
}

at::Tensor per_row_f32(const at::Tensor& t, index_t rows, std::string_view what) {
  if (t.numel() != rows)
    raise(ids::shape, fmt::format("{} has {} elements, expected one per token ({})", what, t.numel(), rows));
  return contiguous_as(t, at::kFloat, what).view({rows});
}

at::Tensor mask_bytes(const at::Tensor& t, std::string_view what) {
  at::Tensor m = t;
  if (m.scalar_type() == at::kBool)
    m = m.view(at::kByte);
  else if (m.scalar_type() != at::kByte) {
    note_copy("cast", what);
    m = m.ne(0).to(at::kByte);
  }
  return m;
}

void expect_device(const at::Tensor& t, const c10::Device& d, std::string_view what) {
  if (t.device() != d)
    raise(ids::device, fmt::format("{} is on {} but the other inputs are on {}", what, t.device().str(), d.str()));
}

rlpt::token_layout token_batch::host_layout() const {
  if (packed) return rlpt::token_layout::packed(rlpt::view<const index_t>(offsets.data_ptr<int64_t>(), B + 1));
  return rlpt::token_layout::padded(B, T, S);
}

namespace {
//! Row stride of a [B, T] tensor read in place, or -1 when it cannot be.
int64_t row_stride_of(const at::Tensor& t, int64_t B, int64_t T) {
  if (t.dim() != 2 || t.size(0) != B || t.size(1) != T) return -1;
  if (T > 1 && t.stride(1) != 1) return -1;
  if (B <= 1) return T;
  return t.stride(0) >= T ? t.stride(0) : -1;
}
} // namespace

token_batch describe(const at::Tensor& ref, std::string_view ref_name, const opt_tensor& cu_seqlens,
                     const std::vector<std::tuple<const opt_tensor*, at::ScalarType, std::string_view>>& inputs) {
  token_batch b;
  b.device = ref.device();
  if (cu_seqlens) {
    if (ref.dim() != 1)
      raise(ids::shape, fmt::format("{} has shape {}; with cu_seqlens (packed sequences) per-token tensors are 1-D [N]",
                                    ref_name, dims(ref.sizes())));
    if (cu_seqlens->dim() != 1 || cu_seqlens->numel() < 1)
      raise(ids::shape, fmt::format("cu_seqlens has shape {}; it must be [B + 1]", dims(cu_seqlens->sizes())));
    at::Tensor off = cu_seqlens->to(at::kCPU);
    if (off.scalar_type() != at::kLong) off = off.to(at::kLong);
    b.offsets = off.contiguous();
    if (b.device.is_cpu())
      b.offsets_dev = b.offsets;
    else
      b.offsets_dev =
          cu_seqlens->scalar_type() == at::kLong && cu_seqlens->is_contiguous() && cu_seqlens->device() == b.device
              ? *cu_seqlens
              : b.offsets.to(b.device);
    b.packed = true;
    b.B = b.offsets.numel() - 1;
    const int64_t* o = b.offsets.data_ptr<int64_t>();
    b.N = o[b.B];
    for (index_t i = 0; i < b.B; ++i) b.max_len = std::max<index_t>(b.max_len, o[i + 1] - o[i]);
    if (ref.numel() != b.N)
      raise(ids::shape, fmt::format("{} has {} elements but cu_seqlens ends at {}", ref_name, ref.numel(), b.N));
    b.T = b.max_len;
    b.S = 0;
    b.shape = {b.N};
    return b;
  }
  if (ref.dim() != 2)
    raise(ids::shape, fmt::format("{} has shape {}; padded batches are [B, T] (or pass cu_seqlens for packed [N])",
                                  ref_name, dims(ref.sizes())));
  b.B = ref.size(0);
  b.T = ref.size(1);
  b.max_len = b.T;
  b.shape = {b.B, b.T};
  // A shared row stride when every input can be read in place with it (no cast, no copy).
  int64_t common = -2;
  bool shared = true;
  for (const auto& [t, want, name] : inputs) {
    if (!*t) continue;
    const int64_t s = (*t)->scalar_type() == want ? row_stride_of(**t, b.B, b.T) : -1;
    if (s < 0 || (common != -2 && s != common)) shared = false;
    common = s;
  }
  b.S = shared && common > 0 ? common : b.T;
  b.N = b.B * b.S;
  return b;
}

at::Tensor token_input(const at::Tensor& t, at::ScalarType want, const token_batch& b, std::string_view what) {
  expect_device(t, b.device, what);
  if (b.packed) {
    if (t.dim() != 1 || t.numel() != b.N)
      raise(ids::shape, fmt::format("{} has shape {}; the packed batch has {} tokens", what, dims(t.sizes()), b.N));
    return contiguous_as(t, want, what);
  }
  if (t.dim() != 2 || t.size(0) != b.B || t.size(1) != b.T)
    raise(ids::shape, fmt::format("{} has shape {}; the batch is [{}, {}]", what, dims(t.sizes()), b.B, b.T));
  if (b.S != b.T) return t; // every input shares this row stride (describe checked it)
  return contiguous_as(t, want, what);
}

at::Tensor token_output(const token_batch& b, const at::TensorOptions& o) {
  if (b.packed) return at::empty({b.N}, o);
  return at::empty({b.B, b.S}, o);
}

at::Tensor token_view(const at::Tensor& buffer, const token_batch& b) {
  if (b.packed || b.S == b.T) return buffer;
  return buffer.narrow(1, 0, b.T).contiguous(); // outputs are contiguous, as their fake kernels say
}

} // namespace rlpt_py
