// SPDX-License-Identifier: Apache-2.0
// The engine's side of the device-transport tests: targets in device memory, zeroed, one of them
// cast, checked against a version of the model of gpu_model.hpp (doctest checks).
#pragma once

#include "gpu_tensors.cuh"

#include <rlpt/cuda/sync/cast.hpp>
#include <rlpt/cuda/sync/wsum.hpp>

#include <doctest/doctest.h>

namespace rlpt::test::sync_gpu {

//! The engine side: targets in device memory (one of them cast: bf16 on the wire, f32 here).
struct engine {
  std::vector<spec> specs = model_specs();
  std::vector<void*> ptrs;
  std::vector<device_tensor> targets;
  explicit engine(bool cast_one) {
    for (std::size_t i = 0; i < specs.size(); ++i) {
      wire_dtype dt = specs[i].dtype;
      if (cast_one && specs[i].name == "layers.0.qkv.weight") dt = wire_dtype::f32;
      void* p = nullptr;
      RLPT_CUDA_CHECK(cudaMalloc(&p, specs[i].numel() * size_of(dt)));
      RLPT_CUDA_CHECK(cudaMemset(p, 0, specs[i].numel() * size_of(dt)));
      ptrs.push_back(p);
      targets.push_back({specs[i].name, dt, specs[i].shape, p});
    }
  }
  engine(const engine&) = delete;
  engine& operator=(const engine&) = delete;
  ~engine() {
    for (void* p : ptrs) static_cast<void>(cudaFree(p));
  }
  //! Every target holds `version` (cast where asked) and the manifest's checksums are wsum64
  //! of the wire bytes.
  void check(std::uint64_t version, const manifest& published) const {
    for (std::size_t i = 0; i < specs.size(); ++i) {
      const auto wire = tensor_bytes(specs[i], i, version);
      std::vector<std::byte> want(specs[i].numel() * size_of(targets[i].dtype));
      for (std::uint64_t e = 0; e < specs[i].numel(); ++e)
        rlpt::sync::detail::cast_element(specs[i].dtype, targets[i].dtype,
                                         reinterpret_cast<const unsigned char*>(wire.data()) +
                                             e * size_of(specs[i].dtype),
                                         reinterpret_cast<unsigned char*>(want.data()) + e * size_of(targets[i].dtype));
      std::vector<std::byte> got(want.size());
      RLPT_CUDA_CHECK(cudaMemcpy(got.data(), ptrs[i], got.size(), cudaMemcpyDeviceToHost));
      CHECK_MESSAGE(got == want, "tensor ", specs[i].name, " of version ", version);
      const auto at = published.find(specs[i].name);
      REQUIRE(at.has_value());
      CHECK_MESSAGE(published[*at].checksum == wsum(wire.data(), wire.size()), "checksum of ", specs[i].name);
    }
  }
};

} // namespace rlpt::test::sync_gpu
