// SPDX-License-Identifier: Apache-2.0
// The other process of the device-transport tests (spawned by test_sync_gpu with posix_spawn,
// so CUDA starts fresh in it):
//
//   sync_gpu_peer ipc-send  <unix path> <first> <last> <legacy|vmm> <delta 0|1> <bucket bytes>
//       publishes versions first..last of gpu_model.hpp through CUDA IPC, then closes the link.
//   sync_gpu_peer ipc-die   <unix path> <first> <last> <legacy|vmm> <delta 0|1> <bucket bytes>
//       publishes `first`, then starts `first + 1` by hand (BEGIN, READY, one bucket) and
//       SIGKILLs itself mid-update.
//   sync_gpu_peer nccl-recv <tcp port> <device> <first> <last>
//       NCCL receiver on GPU <device>: waits for versions first..last and checks every byte.
//
// Exit status 0 on success; errors are printed to stderr.
#include "gpu_tensors.cuh"

#include <rlpt/cuda/sync/sync.cuh>
#include <rlpt/sync/tcp.hpp>

#include <cuda_runtime_api.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

using namespace rlpt::sync;
namespace model = rlpt::test::sync_gpu;
using model::device_params;

namespace {

//! A failed check of this process: printed by main(), exit status 1.
template <class... Args> void require(bool ok, fmt::format_string<Args...> f, Args&&... args) {
  if (!ok) throw std::runtime_error(fmt::format(f, std::forward<Args>(args)...));
}

// Starts version v by hand and dies after its first bucket went out.
[[noreturn]] void die_mid_update(ipc_link& l, const manifest& published, std::uint64_t v) {
  manifest a = published;
  a.set_versions(v, 0);
  a.clear_checksums();
  const std::string body = a.to_json();
  const std::uint64_t tag = 0x5eed5eed5eed5eedull;
  std::vector<std::byte> meta;
  encode_frame(meta, frame_type::begin, tag, v, 0, static_cast<std::uint64_t>(update_kind::dense), a.layout_hash(), 0,
               as_bytes(body));
  l.send(meta, 0, after(std::chrono::seconds(20)));
  for (;;) {
    auto msg = l.receive(after(std::chrono::seconds(20)));
    require(msg.has_value(), "no READY for the half update");
    const frame f = decode_frame(msg->meta, "peer");
    const bool ready = f.type == frame_type::ready && f.tag == tag;
    l.release();
    if (ready) break;
  }
  const std::uint64_t size = a.bucket_size(0);
  auto buf = l.payload_buffer(size, after(std::chrono::seconds(20)));
  RLPT_CUDA_CHECK(cudaMemsetAsync(buf.data(), 0x5a, size, l.stream()));
  const std::vector<std::uint64_t> sums(a.pieces(0).size(), 1);
  encode_frame(meta, frame_type::bucket, tag, v, 0, 0, sums.size(), size,
               std::span<const std::byte>(reinterpret_cast<const std::byte*>(sums.data()), sums.size() * 8));
  l.send(meta, size, after(std::chrono::seconds(20)));
  l.drain(after(std::chrono::seconds(20))); // the receiver copied the bucket out (its RELEASE came back)
  std::raise(SIGKILL);
  std::abort();
}

int ipc_send(bool die, const std::string& path, std::uint64_t first, std::uint64_t last, const std::string& memory,
             bool delta, std::uint64_t bucket) {
  const auto specs = model::model_specs();
  const manifest m = model::model_manifest(bucket);
  unix_link host({.path = path}, role::sender);
  ipc_link l(host, role::sender,
             {.slots = 2, .slot_bytes = bucket, .memory = memory == "vmm" ? ipc_memory::vmm : ipc_memory::legacy});
  device_params params(specs);
  device_sender tx(l, m, params.tensors, {.delta = delta});
  for (std::uint64_t v = first; v <= last; ++v) {
    params.upload(specs, v);
    if (die && v == first + 1) die_mid_update(l, tx.current_manifest(), v);
    const publish_result r = tx.publish(v, cudaStreamLegacy); // the stream the upload ran on
    std::printf("{\"version\": %llu, \"delta\": %d, \"fell_back\": %d, \"messages\": %llu, \"wire_bytes\": %llu}\n",
                static_cast<unsigned long long>(r.version), r.delta ? 1 : 0, r.fell_back ? 1 : 0,
                static_cast<unsigned long long>(r.messages), static_cast<unsigned long long>(r.wire_bytes));
  }
  l.close(after(std::chrono::seconds(20)));
  return 0;
}

#if RLPT_HAS_NCCL()
int nccl_recv(std::uint16_t port, int device, std::uint64_t first, std::uint64_t last) {
  RLPT_CUDA_CHECK(cudaSetDevice(device));
  const auto specs = model::model_specs();
  tcp_transport host({.host = "127.0.0.1", .port = port}, role::receiver);
  nccl_link l(host, {.slot_bytes = std::uint64_t{1} << 20, .device = device});
  device_params params(specs);
  device_receiver rx(l, params.tensors);
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (!(rx.has_version() && rx.version() >= last)) {
    require(std::chrono::steady_clock::now() < until, "nccl receiver: timed out at version {}", rx.version());
    const update u = rx.poll(std::chrono::milliseconds(100));
    require(!u.failed(), "nccl receiver: version {} failed: {} ({})", u.version, u.reason, u.error_id);
    if (!u.published()) continue;
    for (std::size_t i = 0; i < specs.size(); ++i) {
      const auto want = model::tensor_bytes(specs[i], i, u.version);
      std::vector<std::byte> got(want.size());
      RLPT_CUDA_CHECK(cudaMemcpy(got.data(), params.ptrs[i], got.size(), cudaMemcpyDeviceToHost));
      require(got == want, "nccl receiver: tensor \"{}\" of version {} differs", specs[i].name, u.version);
    }
    require(u.version >= first, "nccl receiver: unexpected version {}", u.version);
  }
  return 0;
}
#endif

} // namespace

int main(int argc, char** argv) {
  try {
    const std::string mode = argc > 1 ? argv[1] : "";
    if ((mode == "ipc-send" || mode == "ipc-die") && argc == 8)
      return ipc_send(mode == "ipc-die", argv[2], std::strtoull(argv[3], nullptr, 10),
                      std::strtoull(argv[4], nullptr, 10), argv[5], std::strcmp(argv[6], "1") == 0,
                      std::strtoull(argv[7], nullptr, 10));
#if RLPT_HAS_NCCL()
    if (mode == "nccl-recv" && argc == 6)
      return nccl_recv(static_cast<std::uint16_t>(std::strtoul(argv[2], nullptr, 10)), std::atoi(argv[3]),
                       std::strtoull(argv[4], nullptr, 10), std::strtoull(argv[5], nullptr, 10));
#endif
    std::fprintf(stderr, "usage: see the comment at the top of sync_gpu_peer.cu\n");
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "sync_gpu_peer: %s\n", e.what());
    return 1;
  }
}
