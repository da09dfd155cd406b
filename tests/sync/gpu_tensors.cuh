// SPDX-License-Identifier: Apache-2.0
// The trainer's parameters in device memory for the device-transport tests (device_params: the
// model of gpu_model.hpp uploaded at a version); the engine's side is gpu_engine.cuh.
#pragma once

#include "gpu_model.hpp"

#include <rlpt/cuda/sync/protocol.cuh>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace rlpt::test::sync_gpu {

using namespace rlpt::sync;

struct device_params {
  std::vector<void*> ptrs;
  std::vector<device_tensor> tensors;
  explicit device_params(const std::vector<spec>& specs) {
    for (const auto& s : specs) {
      void* p = nullptr;
      RLPT_CUDA_CHECK(cudaMalloc(&p, std::max<std::uint64_t>(1, s.nbytes())));
      ptrs.push_back(p);
      tensors.push_back({s.name, s.dtype, s.shape, p});
    }
  }
  ~device_params() {
    for (void* p : ptrs) static_cast<void>(cudaFree(p));
  }
  void upload(const std::vector<spec>& specs, std::uint64_t version) {
    for (std::size_t i = 0; i < specs.size(); ++i) {
      const auto bytes = tensor_bytes(specs[i], i, version);
      RLPT_CUDA_CHECK(cudaMemcpy(ptrs[i], bytes.data(), bytes.size(), cudaMemcpyHostToDevice));
    }
    // A pageable upload may return before its DMA landed: finish it before anything reads.
    RLPT_CUDA_CHECK(cudaDeviceSynchronize());
  }
};

} // namespace rlpt::test::sync_gpu
