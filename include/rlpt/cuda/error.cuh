// SPDX-License-Identifier: Apache-2.0
//! @file
//! CUDA status checking for host code: a failed runtime call becomes an rlpt::error naming the
//! call, the CUDA error and where it happened. Device code never throws.
#pragma once

#include <rlpt/config.hpp>
#include <rlpt/core/error.hpp>

#include <cuda_runtime_api.h>

RLPT_NAMESPACE_BEGIN
namespace detail {

inline void check_cuda(cudaError_t status, const char* expr, const char* file, int line) {
  if (RLPT_UNLIKELY(status != cudaSuccess))
    RLPT_FAIL(errors::cuda::error, "{} failed with {} ({}) at {}:{}", expr, cudaGetErrorName(status),
              cudaGetErrorString(status), file, line);
}

} // namespace detail
RLPT_NAMESPACE_END

//! Throws rlpt::error if the CUDA runtime call `expr` did not return cudaSuccess.
#define RLPT_CUDA_CHECK(expr) ::rlpt::detail::check_cuda((expr), #expr, __FILE__, __LINE__)

//! Checks that the last kernel launch was accepted (configuration errors). Does not synchronise:
//! errors during execution surface at the caller's next synchronisation point.
#define RLPT_CUDA_CHECK_LAUNCH() ::rlpt::detail::check_cuda(cudaGetLastError(), "kernel launch", __FILE__, __LINE__)
