// SPDX-License-Identifier: Apache-2.0
// Device payloads over UCX without a host copy (ucx_link.cuh), on one GPU over loopback: frames
// of every shape (meta only, payload only, both, a meta block beyond the headroom) arrive
// intact with one and with two receive slots; then a device sender and a device receiver move
// dense and delta versions into the engine's device targets, every byte checked, without and
// with authentication (integrity::control). Needs a UCX built with CUDA (PyPI's libucx-cu13):
// with another UCX each case says so and checks nothing.
#include "gpu_engine.cuh"
#include "support/errors.hpp"
#include "ucx_frames.hpp"

#include <rlpt/cuda/sync/ucx_link.cuh>
#ifdef RLPT_TEST_UCX_AUTH
#include <rlpt/sync/auth_openssl.hpp>
#endif

#include <doctest/doctest.h>

#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdint>
#include <thread>
#include <vector>

using namespace rlpt::sync;
namespace model = rlpt::test::sync_gpu;
using namespace std::chrono_literals;

namespace {

bool ucx_moves_cuda() {
  if (ucx_transport({.listen = true}, role::receiver).moves_device_memory()) return true;
  MESSAGE("this UCX does not move CUDA memory (Debian's libucx): nothing checked; run with libucx-cu13's "
          "libraries first on LD_LIBRARY_PATH");
  return false;
}

// every_frame_shape from a device sender to a device receiver, each payload written into the
// sender's slot and read out of the receiver's by copies on the links' streams.
void run_shapes(std::size_t slots) {
  ucx_device_link rx({.listen = true}, role::receiver, {.slots = slots});
  CHECK(rx.info().payload_space == rlpt::memory_space::device);
  const auto& shapes = rlpt::test::sync::every_frame_shape;
  std::thread tx_thread([&] {
    ucx_device_link tx({.port = rx.port()}, role::sender);
    for (std::size_t k = 0; k < std::size(shapes); ++k) {
      const std::vector<std::byte> payload = rlpt::test::sync::frame_bytes(shapes[k].payload, k + 100);
      const std::span<std::byte> slot = tx.payload_buffer(payload.size(), after(10s));
      if (!payload.empty())
        RLPT_CUDA_CHECK(
            cudaMemcpyAsync(slot.data(), payload.data(), payload.size(), cudaMemcpyHostToDevice, tx.stream()));
      tx.send(rlpt::test::sync::frame_bytes(shapes[k].meta, k), payload.size(), after(10s));
    }
    static_cast<void>(tx.receive(after(10s))); // until the receiver says it has them all
  });
  for (std::size_t k = 0; k < std::size(shapes); ++k) {
    CAPTURE(k);
    const auto m = rx.receive(after(10s));
    REQUIRE(m.has_value());
    CHECK(rlpt::test::sync::equal_bytes(m->meta, rlpt::test::sync::frame_bytes(shapes[k].meta, k)));
    CHECK(reinterpret_cast<std::uintptr_t>(m->payload.data()) % 256 == 0);
    std::vector<std::byte> got(m->payload.size());
    if (!got.empty())
      RLPT_CUDA_CHECK(cudaMemcpyAsync(got.data(), m->payload.data(), got.size(), cudaMemcpyDeviceToHost, rx.stream()));
    RLPT_CUDA_CHECK(cudaStreamSynchronize(rx.stream()));
    CHECK(rlpt::test::sync::equal_bytes(got, rlpt::test::sync::frame_bytes(shapes[k].payload, k + 100)));
  }
  static_cast<void>(rx.payload_buffer(0, after(10s)));
  rx.send({}, 0, after(10s));
  tx_thread.join();
  rx.drain(after(10s));
}

void run_updates(ucx_options rx_options, ucx_options tx_options) {
  rx_options.listen = true;
  ucx_device_link rx_link(rx_options, role::receiver);
  tx_options.port = rx_link.port();
  ucx_device_link tx_link(tx_options, role::sender);
  model::publish_three_versions(rx_link, tx_link, false);
}

} // namespace

TEST_CASE("sync ucx: device frames of every shape arrive intact, with one receive slot and with two") {
  if (!ucx_moves_cuda()) return;
  for (const std::size_t slots : {std::size_t{1}, std::size_t{2}}) {
    CAPTURE(slots);
    run_shapes(slots);
  }
}

TEST_CASE("sync ucx: device sender and receiver over UCX, dense then deltas, bit-exact") {
  if (!ucx_moves_cuda()) return;
  run_updates({}, {});
}

#ifdef RLPT_TEST_UCX_AUTH
TEST_CASE("sync ucx: authenticated (integrity::control), dense then deltas, and a wrong secret is refused") {
  if (!ucx_moves_cuda()) return;
  const auto job = openssl_authenticator::from_string("0123456789abcdef0123456789abcdef");
  run_updates({.auth = job, .tags = integrity::control}, {.auth = job, .tags = integrity::control});
  ucx_device_link rx({.listen = true, .auth = job, .tags = integrity::control}, role::receiver);
  RLPT_CHECK_ERROR(
      [&] {
        ucx_device_link tx({.port = rx.port(),
                            .auth = openssl_authenticator::from_string("another job's secret, long enough"),
                            .tags = integrity::control},
                           role::sender);
        std::thread serve([&] { static_cast<void>(rx.receive(after(2s))); });
        try {
          static_cast<void>(tx.payload_buffer(16, after(2s)));
          tx.send({}, 16, after(2s));
        } catch (...) {
          serve.join();
          throw;
        }
        serve.join();
      }(),
      "rlpt.sync.auth", "proof is wrong");
  CHECK(rx.auth_stats().refused_peers >= 1);
}
#endif
