// SPDX-License-Identifier: Apache-2.0
//! @file
//! Deterministic bucket planner: packs tensors, in the order given, into aligned buckets.
//!
//! Both ends of a weight sync must agree on the packing (vLLM's packed NCCL path rebuilds it
//! from metadata; SGLang broadcasts in list order), so the plan is a pure function of the
//! tensor list and the options: same inputs, same plan, same manifest hash. Rules:
//! - a tensor that fits the rest of the current bucket goes there, at the next aligned offset;
//! - one that fits a bucket but not the rest starts the next bucket;
//! - one larger than a bucket starts a fresh bucket at offset 0 and fills consecutive buckets;
//!   the next tensor follows its tail in the last one. The receiver reassembles it.
#pragma once

#include <rlpt/config.hpp>
#include <rlpt/core/error.hpp>
#include <rlpt/sync/manifest.hpp>

#include <cstdint>
#include <span>
#include <string>
#include <vector>

RLPT_NAMESPACE_BEGIN
namespace sync {

struct plan_options {
  //! Bucket capacity in bytes. 512 MiB = slime's --update-weight-buffer-size (vLLM's
  //! weight_transfer uses 1 GiB, TRL 256 MB).
  std::uint64_t bucket_bytes = std::uint64_t{512} << 20;
  //! Offset alignment of every tensor in a bucket: 256 B = checkpoint-engine's _ALIGN_SIZE
  //! and CUDA's allocation granularity, so device views of a bucket are aligned for any dtype.
  std::uint64_t alignment = 256;
};

//! Plans the buckets for `tensors` (order preserved). Data pointers are not read.
RLPT_DEFER [[nodiscard]] manifest plan(std::span<const tensor_ref> tensors, plan_options opts = {});

//! Same, for tensors given as {name, dtype, shape} without data.
RLPT_DEFER [[nodiscard]] inline manifest plan(std::span<const tensor_entry> tensors, plan_options opts = {}) {
  std::vector<tensor_ref> refs;
  refs.reserve(tensors.size());
  for (const auto& t : tensors) refs.push_back({t.name, t.dtype, t.shape, nullptr});
  return plan(std::span<const tensor_ref>(refs), opts);
}

} // namespace sync
RLPT_NAMESPACE_END

#if RLPT_HEADER_IMPL()
RLPT_NAMESPACE_BEGIN
namespace sync {

RLPT_DEFER RLPT_INLINE manifest plan(std::span<const tensor_ref> tensors, plan_options opts) {
  const std::uint64_t B = opts.bucket_bytes;
  const std::uint64_t A = opts.alignment;
  RLPT_CHECK(B > 0, errors::sync::bad_plan, "plan_options::bucket_bytes must be positive, got {}", B);
  RLPT_CHECK(A > 0 && (A & (A - 1)) == 0, errors::sync::bad_plan,
             "plan_options::alignment must be a power of two, got {}", A);
  RLPT_CHECK(B % A == 0, errors::sync::bad_plan, "plan_options::bucket_bytes {} is not a multiple of the alignment {}",
             B, A);
  std::vector<tensor_entry> entries;
  entries.reserve(tensors.size());
  std::uint64_t bucket = 0;
  std::uint64_t used = 0; // bytes used in `bucket` (0 = empty)
  bool open = false;      // `bucket` holds at least one tensor
  for (const auto& t : tensors) {
    tensor_entry e{t.name, t.dtype, t.shape, 0, 0, detail::tensor_nbytes(t.name, t.dtype, t.shape), 0};
    const std::uint64_t n = e.nbytes;
    if (n > B) {
      if (open) ++bucket;
      e.bucket = bucket;
      e.offset = 0;
      const std::uint64_t full = n / B;
      const std::uint64_t rest = n % B;
      bucket += full;
      if (rest == 0) { // ends exactly on a bucket boundary: the next tensor starts a new one
        used = 0;
        open = false;
      } else {
        used = rest;
        open = true;
      }
    } else {
      std::uint64_t at = (used + A - 1) / A * A;
      if (open && (at >= B || n > B - at)) {
        ++bucket;
        at = 0;
      }
      e.bucket = bucket;
      e.offset = at;
      used = at + n;
      open = true;
    }
    entries.push_back(std::move(e));
  }
  return manifest(std::move(entries), B, A);
}

} // namespace sync
RLPT_NAMESPACE_END
#endif // RLPT_HEADER_IMPL()
