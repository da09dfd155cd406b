// SPDX-License-Identifier: Apache-2.0
//! @file
//! Distributed whitening over an NCCL communicator: every rank all-gathers its (count, mean, M2)
//! and merges the gathered moments on the device in rank order, so every rank gets the same
//! statistics bit for bit and nothing synchronises with the host. A rank without valid tokens
//! contributes count 0 (the identity of the merge) and still joins the collective.
//!
//!     rlpt::whiten_moments(layout, adv, mask, local, ws, stream);          // this rank
//!     rlpt::allgather_moments(local, gathered, merged, comm, stream);      // gathered: one per rank
//!     rlpt::whiten_apply(merged, layout, adv, mask, adv, opts, {}, stream);
//!
//! Available when NCCL is (RLPT_HAS_NCCL()); link rlpt::nccl.
#pragma once

#include <rlpt/config.hpp>

#if RLPT_HAS_NCCL()

#include <rlpt/core/error.hpp>
#include <rlpt/core/stats.hpp>
#include <rlpt/core/views.hpp>
#include <rlpt/cuda/advantage/whiten.cuh>
#include <rlpt/cuda/error.cuh>
#include <rlpt/cuda/nccl.cuh>

#include <cuda_runtime_api.h>
#include <nccl.h>

RLPT_NAMESPACE_BEGIN

//! All-gathers this rank's moments (local[0]) into gathered[r] for every rank r, then merges
//! them in rank order into merged[0]. All three live in device memory.
inline void allgather_moments(device_view<const moments> local, device_view<moments> gathered,
                              device_view<moments> merged, ncclComm_t comm, cudaStream_t stream) {
  int ranks = 0;
  RLPT_NCCL_CHECK(ncclCommCount(comm, &ranks));
  detail::expect_size("local", local.size(), 1, "one moments struct");
  detail::expect_size("gathered", gathered.size(), ranks, "one moments struct per rank");
  detail::expect_size("merged", merged.size(), 1, "one moments struct");
  static_assert(sizeof(moments) == 3 * sizeof(double), "moments travels as 3 doubles");
  RLPT_NCCL_CHECK(ncclAllGather(local.data(), gathered.data(), 3, ncclDouble, comm, stream));
  merge_moments(gathered, merged, stream);
}

RLPT_NAMESPACE_END

#endif
