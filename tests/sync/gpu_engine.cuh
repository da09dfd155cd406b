// SPDX-License-Identifier: Apache-2.0
// The engine's side of the device-transport tests: targets in device memory, zeroed, one of them
// cast, checked against a version of the model of gpu_model.hpp (doctest checks).
#pragma once

#include "gpu_tensors.cuh"

#include <rlpt/cuda/sync/cast.hpp>
#include <rlpt/cuda/sync/wsum.hpp>

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

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

//! A device sender and a device receiver over the two ends of a device link pair (one process):
//! versions 1..3 of the model, dense then deltas, into an engine's targets, every byte and
//! checksum checked. With a cast target the receiver refuses deltas (they need equal dtypes)
//! and each falls back to dense.
inline void publish_three_versions(device_link& rx_link, device_link& tx_link, bool cast_one) {
  using namespace std::chrono_literals;
  constexpr std::uint64_t bucket = std::uint64_t{1} << 20;
  const manifest m = model_manifest(bucket);
  CHECK(rx_link.info().payload_space == rlpt::memory_space::device);
  engine eng(cast_one);
  device_receiver rx(rx_link, eng.targets, {.timeout = 20s});
  std::vector<update> seen;
  std::atomic<bool> stop{false};
  std::atomic<std::size_t> reported{0};
  std::thread serve([&] {
    while (!stop) {
      update u = rx.poll(20ms);
      if (u.state == update::status::idle) continue;
      seen.push_back(std::move(u));
      ++reported;
    }
  });
  const auto specs = model_specs();
  device_params params(specs);
  device_sender tx(tx_link, m, params.tensors, {.delta = true, .timeout = 20s});
  cudaEvent_t uploaded = nullptr;
  RLPT_CUDA_CHECK(cudaEventCreateWithFlags(&uploaded, cudaEventDisableTiming));
  std::vector<publish_result> sent;
  for (std::uint64_t v = 1; v <= 3; ++v) {
    params.upload(specs, v);
    RLPT_CUDA_CHECK(cudaEventRecord(uploaded, cudaStreamLegacy));
    sent.push_back(tx.publish(v, uploaded));
  }
  RLPT_CUDA_CHECK(cudaEventDestroy(uploaded));
  const auto until = std::chrono::steady_clock::now() + 20s;
  while (reported < 3 && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(5ms);
  stop = true;
  serve.join();
  REQUIRE(seen.size() == 3);
  for (std::size_t k = 0; k < 3; ++k) {
    CAPTURE(k);
    CHECK(seen[k].published());
    CHECK(seen[k].delta == (k > 0 && !cast_one));
    CHECK(sent[k].delta == seen[k].delta);
    CHECK(sent[k].fell_back == (k > 0 && cast_one));
    CHECK(seen[k].digest == sent[k].digest);
  }
  CHECK(sent[0].wire_bytes == m.packed_bytes());
  if (cast_one)
    CHECK(sent[2].wire_bytes == m.packed_bytes());
  else
    CHECK(sent[2].wire_bytes < m.payload_bytes() / 4);
  RLPT_CUDA_CHECK(cudaDeviceSynchronize());
  eng.check(3, rx.published_manifest());
}

} // namespace rlpt::test::sync_gpu
