// SPDX-License-Identifier: Apache-2.0
//! @file
//! The device half of a sync preflight (rlpt/sync/preflight.hpp): each end adds the GPUs it
//! moves weights with and its CUDA (and NCCL) versions to its environment before the exchange,
//! so that preflight_rules::nccl() can refuse two ends on one GPU and mismatched libraries.
//!
//!     auto env = rlpt::sync::capture_environment();
//!     rlpt::sync::add_device(env, device);
//!     rlpt::sync::add_nccl_version(env);   // NCCL links
//!     rlpt::sync::preflight(link, role, env, rlpt::sync::preflight_rules::nccl(), deadline);
#pragma once

#include <rlpt/config.hpp>
#include <rlpt/core/format.hpp>
#include <rlpt/cuda/error.cuh>
#include <rlpt/cuda/nccl.cuh>
#include <rlpt/cuda/sync/ipc_wire.hpp>
#include <rlpt/sync/preflight.hpp>

#include <cuda_runtime.h>
#include <nccl.h>

#include <array>
#include <cstring>

RLPT_NAMESPACE_BEGIN
namespace sync {

//! Adds `device` (its UUID, as nvidia-smi prints it, and the ordinal) and the CUDA runtime's
//! version to `e`.
inline void add_device(environment& e, int device) {
  cudaDeviceProp p{};
  RLPT_CUDA_CHECK(cudaGetDeviceProperties(&p, device));
  std::array<unsigned char, 16> u{};
  std::memcpy(u.data(), p.uuid.bytes, 16);
  e.devices.push_back({uuid_text(u), device});
  int rt = 0;
  RLPT_CUDA_CHECK(cudaRuntimeGetVersion(&rt));
  e.cuda_runtime = rlpt::detail::format("{}.{}", rt / 1000, rt % 1000 / 10);
}

//! Sets e.nccl to the loaded NCCL's version ("2.21.5"; codes since 2.9 are major·10000 +
//! minor·100 + patch).
inline void add_nccl_version(environment& e) {
  int v = 0;
  RLPT_NCCL_CHECK(ncclGetVersion(&v));
  e.nccl = v >= 10000 ? rlpt::detail::format("{}.{}.{}", v / 10000, v / 100 % 100, v % 100)
                      : rlpt::detail::format("{}.{}.{}", v / 1000, v / 100 % 10, v % 100);
}

} // namespace sync
RLPT_NAMESPACE_END
