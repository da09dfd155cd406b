// SPDX-License-Identifier: Apache-2.0
// Device payloads over a host link (staged_link.cuh): a device sender and a device receiver on
// one GPU, each behind a staged_link over the two ends of a loopback TCP connection, move dense
// then delta versions into the engine's device targets, every byte checked. With a cast target
// the receiver refuses deltas (they need equal dtypes) and each one falls back to dense.
#include "gpu_engine.cuh"
#include "support/errors.hpp"

#include <rlpt/cuda/sync/staged_link.cuh>
#include <rlpt/sync/tcp.hpp>

#include <doctest/doctest.h>

#include <cuda_runtime_api.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

using namespace rlpt::sync;
namespace model = rlpt::test::sync_gpu;
using namespace std::chrono_literals;

namespace {

void run_staged(bool cast_one) {
  constexpr std::uint64_t bucket = std::uint64_t{1} << 20;
  const manifest m = model::model_manifest(bucket);
  tcp_transport rx_host({.listen = true}, role::receiver);
  tcp_transport tx_host({.port = rx_host.port()}, role::sender);
  staged_link rx_link(rx_host), tx_link(tx_host);
  CHECK(rx_link.info().payload_space == rlpt::memory_space::device);
  model::engine eng(cast_one);
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
  const auto specs = model::model_specs();
  model::device_params params(specs);
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

} // namespace

TEST_CASE("sync staged: device sender and receiver over loopback TCP, dense then deltas, bit-exact") {
  for (const bool cast_one : {false, true}) {
    CAPTURE(cast_one);
    run_staged(cast_one);
  }
}
