// SPDX-License-Identifier: Apache-2.0
//! @file
//! Device discovery helpers that never throw: code and tests can ask whether a GPU exists.
#pragma once

#include <rlpt/config.hpp>

#include <cuda_runtime_api.h>

RLPT_NAMESPACE_BEGIN

//! Number of usable CUDA devices; 0 when there is no driver or no device.
[[nodiscard]] inline int cuda_device_count() noexcept {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError(); // clear the sticky "no device" status
    return 0;
  }
  return n;
}

RLPT_NAMESPACE_END
