// SPDX-License-Identifier: Apache-2.0
// Device payloads over UCX without a host copy (ucx_link.cuh), on one GPU over loopback: frames
// of every shape (meta only, payload only, both, a meta block beyond the headroom) arrive
// intact with one and with two receive slots; then a device sender and a device receiver move
// dense and delta versions into the engine's device targets, every byte checked, without and
// with authentication (integrity::control). Needs a UCX built with CUDA (PyPI's libucx-cu13):
// with another UCX each case says so and checks nothing.
#include "gpu_engine.cuh"
#include "support/errors.hpp"

#include <rlpt/cuda/sync/ucx_link.cuh>
#ifdef RLPT_TEST_UCX_AUTH
#include <rlpt/sync/auth_openssl.hpp>
#endif

#include <doctest/doctest.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <chrono>
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

bool same(std::span<const std::byte> a, std::span<const std::byte> b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin());
}

void fill(std::span<std::byte> b, std::size_t salt) {
  for (std::size_t i = 0; i < b.size(); ++i) b[i] = static_cast<std::byte>((i * 131 + salt) >> 3);
}

void run_shapes(std::size_t slots) {
  ucx_device_link rx({.listen = true}, role::receiver, {.slots = slots});
  CHECK(rx.info().payload_space == rlpt::memory_space::device);
  struct shape {
    std::size_t meta, payload;
  };
  const shape shapes[] = {{0, 0},        {100, 0}, {0, 3 << 20}, {300, 3 << 20}, {200 << 10, 1 << 20},
                          {64 << 10, 5}, {7, 100}};
  std::thread tx_thread([&] {
    ucx_device_link tx({.port = rx.port()}, role::sender);
    for (std::size_t k = 0; k < std::size(shapes); ++k) {
      std::vector<std::byte> meta(shapes[k].meta), payload(shapes[k].payload);
      fill(meta, k);
      fill(payload, k + 100);
      const std::span<std::byte> slot = tx.payload_buffer(payload.size(), after(10s));
      if (!payload.empty())
        RLPT_CUDA_CHECK(
            cudaMemcpyAsync(slot.data(), payload.data(), payload.size(), cudaMemcpyHostToDevice, tx.stream()));
      tx.send(meta, payload.size(), after(10s));
    }
    static_cast<void>(tx.receive(after(10s))); // until the receiver says it has them all
  });
  for (std::size_t k = 0; k < std::size(shapes); ++k) {
    CAPTURE(k);
    const auto m = rx.receive(after(10s));
    REQUIRE(m.has_value());
    std::vector<std::byte> meta(shapes[k].meta), payload(shapes[k].payload), got(m->payload.size());
    fill(meta, k);
    fill(payload, k + 100);
    CHECK(same(m->meta, meta));
    CHECK(reinterpret_cast<std::uintptr_t>(m->payload.data()) % 256 == 0);
    if (!got.empty())
      RLPT_CUDA_CHECK(cudaMemcpyAsync(got.data(), m->payload.data(), got.size(), cudaMemcpyDeviceToHost, rx.stream()));
    RLPT_CUDA_CHECK(cudaStreamSynchronize(rx.stream()));
    CHECK(same(got, payload));
  }
  static_cast<void>(rx.payload_buffer(0, after(10s)));
  rx.send({}, 0, after(10s));
  tx_thread.join();
  rx.drain(after(10s));
}

void run_updates(ucx_options rx_options, ucx_options tx_options) {
  constexpr std::uint64_t bucket = std::uint64_t{1} << 20;
  const manifest m = model::model_manifest(bucket);
  rx_options.listen = true;
  ucx_device_link rx_link(rx_options, role::receiver);
  tx_options.port = rx_link.port();
  model::engine eng(false);
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
  {
    ucx_device_link tx_link(tx_options, role::sender);
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
      CHECK(seen[k].delta == (k > 0));
      CHECK(sent[k].delta == seen[k].delta);
      CHECK(seen[k].digest == sent[k].digest);
    }
    CHECK(sent[0].wire_bytes == m.packed_bytes());
    CHECK(sent[2].wire_bytes < m.payload_bytes() / 4);
  }
  RLPT_CUDA_CHECK(cudaDeviceSynchronize());
  eng.check(3, rx.published_manifest());
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
