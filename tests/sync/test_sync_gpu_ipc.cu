// SPDX-License-Identifier: Apache-2.0
// CUDA IPC transport between two processes on one GPU: this process is the engine
// (device_receiver over ipc_link over a listening unix_link), sync_gpu_peer the trainer.
// Every published version is compared byte for byte with gpu_model.hpp and its wsum64
// checksums; mappings, descriptors and device memory are counted over 100 delta updates; a
// sender killed mid-update must leave the previous version in place.
#include "gpu_engine.cuh"
#include "support/errors.hpp"

#include <rlpt/cuda/sync/sync.cuh>

#include <doctest/doctest.h>

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <dirent.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

using namespace rlpt::sync;
namespace model = rlpt::test::sync_gpu;
using model::engine;

namespace {

constexpr std::uint64_t bucket = std::uint64_t{1} << 20;

int count_fds() {
  int n = 0;
  if (DIR* d = ::opendir("/proc/self/fd")) {
    while (::readdir(d) != nullptr) ++n;
    ::closedir(d);
  }
  return n;
}

std::string socket_path(const char* what) { return fmt::format("@rlpt-sync-gpu-{}-{}", what, ::getpid()); }

struct peer {
  pid_t pid = -1;
  int status = 0;
  bool done = false;
  explicit peer(std::vector<std::string> args) {
    args.insert(args.begin(), RLPT_SYNC_GPU_PEER);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    REQUIRE(::posix_spawn(&pid, RLPT_SYNC_GPU_PEER, nullptr, nullptr, argv.data(), environ) == 0);
  }
  peer(const peer&) = delete;
  peer& operator=(const peer&) = delete;
  ~peer() {
    if (!done && pid > 0) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
    }
  }
  bool exited() {
    if (done) return true;
    if (::waitpid(pid, &status, WNOHANG) == pid) done = true;
    return done;
  }
  [[nodiscard]] bool ok() const { return done && WIFEXITED(status) && WEXITSTATUS(status) == 0; }
  [[nodiscard]] bool killed() const { return done && WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL; }
};

struct outcome {
  std::vector<update> published, failed;
};

//! Polls until the peer exited (after its BYE) or `limit` passed, checking every version.
outcome serve(device_receiver& rx, const engine& eng, peer& p, std::chrono::seconds limit = std::chrono::seconds(180)) {
  outcome out;
  const auto until = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < until) {
    const update u = rx.poll(std::chrono::milliseconds(50));
    if (u.published()) {
      eng.check(u.version, rx.published_manifest());
      out.published.push_back(u);
    } else if (u.failed()) {
      out.failed.push_back(u);
    } else if (p.exited()) {
      // Drain what the peer sent before it left (its BYE), then stop.
      for (int k = 0; k < 4; ++k) {
        const update w = rx.poll(std::chrono::milliseconds(20));
        if (w.published()) {
          eng.check(w.version, rx.published_manifest());
          out.published.push_back(w);
        } else if (w.failed()) {
          out.failed.push_back(w);
        }
      }
      return out;
    }
  }
  FAIL("the peer did not finish in time");
  return out;
}

bool vmm_supported() {
  int dev = 0, ok = 0;
  RLPT_CUDA_CHECK(cudaGetDevice(&dev));
  RLPT_CUDA_CHECK(cudaFree(nullptr)); // initialise the primary context for the driver API
  return detail::driver().cuDeviceGetAttribute(&ok, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
                                               dev) == CUDA_SUCCESS &&
         ok != 0;
}

void two_processes(const char* memory) {
  const std::string path = socket_path(memory);
  unix_link host({.path = path, .listen = true}, role::receiver);
  ipc_link link(host, role::receiver);
  engine eng(true);
  device_receiver rx(link, eng.targets, {.cache = cache_action::reset});
  peer p({"ipc-send", path, "1", "3", memory, "0", std::to_string(bucket)});
  const outcome o = serve(rx, eng, p);
  CHECK(p.ok());
  REQUIRE(o.failed.empty());
  REQUIRE(o.published.size() == 3);
  for (std::size_t k = 0; k < 3; ++k) {
    CHECK(o.published[k].version == k + 1);
    CHECK_FALSE(o.published[k].delta);
    // the device receiver runs the same state machine: a reset per version, never acknowledged here
    CHECK(o.published[k].cache.action == cache_action::reset);
    CHECK(o.published[k].cache.version == k + 1);
    CHECK(o.published[k].cache_unacknowledged == k);
  }
  rx.acknowledge_cache(3);
  CHECK_FALSE(rx.pending_cache().has_value());
  CHECK(rx.version() == 3);
  const ipc_stats s = link.stats();
  CHECK(s.opens == 1); // one mapping for the session, however many updates
  CHECK(s.hellos == 3);
  CHECK(s.hits == 2);
  CHECK(s.closes == 1); // the sender's BYE: unmapped
  CHECK(s.mapped == 0);
  CHECK(s.releases >= model::model_manifest(bucket).bucket_count() * 3);
}

} // namespace

TEST_CASE("sync ipc: two processes on one GPU exchange versions through a legacy cudaIpc buffer, checksums verified") {
  two_processes("legacy");
}

TEST_CASE("sync ipc: the same through VMM memory exported as a POSIX file descriptor") {
  if (!vmm_supported()) {
    MESSAGE("this device cannot export VMM memory as POSIX file descriptors: skipped");
    return;
  }
  two_processes("vmm");
}

TEST_CASE("sync ipc: 100 delta updates leak no mapping, descriptor or device memory") {
  for (const char* memory : {"legacy", "vmm"}) {
    if (std::string(memory) == "vmm" && !vmm_supported()) continue;
    CAPTURE(memory);
    std::size_t free0 = 0, total = 0, free1 = 0;
    RLPT_CUDA_CHECK(cudaDeviceSynchronize());
    RLPT_CUDA_CHECK(cudaMemGetInfo(&free0, &total));
    const int fds0 = count_fds();
    {
      const std::string path = socket_path(memory) + "-leak";
      unix_link host({.path = path, .listen = true}, role::receiver);
      ipc_link link(host, role::receiver);
      engine eng(false);
      device_receiver rx(link, eng.targets);
      peer p({"ipc-send", path, "1", "100", memory, "1", std::to_string(bucket)});
      const outcome o = serve(rx, eng, p, std::chrono::seconds(400));
      CHECK(p.ok());
      CHECK(o.failed.empty());
      REQUIRE(o.published.size() == 100);
      std::size_t deltas = 0;
      for (const auto& u : o.published) deltas += u.delta ? 1 : 0;
      CHECK(deltas == 99); // everything after the first version went as a delta
      const ipc_stats s = link.stats();
      CHECK(s.hellos == 100);
      CHECK(s.opens == 1);
      CHECK(s.hits == 99);
      CHECK(s.closes == 1);
      CHECK(s.mapped == 0);
    }
    RLPT_CUDA_CHECK(cudaDeviceSynchronize());
    RLPT_CUDA_CHECK(cudaMemGetInfo(&free1, &total));
    CHECK(count_fds() == fds0);
    // The sender process is gone and every buffer of this side was freed: device memory is
    // back where it was (to the allocator's 2 MiB granularity, a few pages of slack).
    const double drift = static_cast<double>(free0) - static_cast<double>(free1);
    CHECK_MESSAGE(drift < 8.0 * (1 << 20), "free device memory dropped by ", drift, " bytes");
  }
}

TEST_CASE(
    "sync ipc: a sender killed mid-update leaves the receiver on its previous version, and the next sender succeeds") {
  const std::string path = socket_path("kill");
  unix_link host({.path = path, .listen = true}, role::receiver);
  ipc_link link(host, role::receiver);
  engine eng(false);
  device_receiver rx(link, eng.targets, {.timeout = std::chrono::seconds(10)});
  {
    peer p({"ipc-die", path, "1", "2", "legacy", "0", std::to_string(bucket)});
    const outcome o = serve(rx, eng, p);
    CHECK(p.killed());
    REQUIRE(o.published.size() == 1);
    CHECK(o.published[0].version == 1);
    REQUIRE(o.failed.size() == 1);
    CHECK(o.failed[0].version == 2);
    CHECK_MESSAGE((o.failed[0].error_id == "rlpt.sync.peer_lost" || o.failed[0].error_id == "rlpt.sync.timeout"),
                  o.failed[0].error_id, ": ", o.failed[0].reason);
    CHECK_FALSE(o.failed[0].partial);
    CHECK(rx.version() == 1);
    CHECK_FALSE(rx.torn());
    eng.check(1, rx.published_manifest()); // the staged half update never touched the parameters
  }
  peer next({"ipc-send", path, "2", "3", "legacy", "1", std::to_string(bucket)});
  const outcome o = serve(rx, eng, next);
  CHECK(next.ok());
  CHECK(o.failed.empty());
  REQUIRE(o.published.size() == 2);
  CHECK(o.published[0].version == 2);
  CHECK(o.published[1].version == 3);
  CHECK(rx.version() == 3);
  CHECK(link.stats().opens == 2); // the new exporter's session replaced the dead one's mapping
}

TEST_CASE("sync ipc: an external buffer is exported as what it is, or refused with a clear error") {
  constexpr std::uint64_t slot = 1 << 20;
  auto fds = unix_socketpair();
  unix_link host(fds[0], role::sender);
  unix_link other(fds[1], role::receiver);
  SUBCASE("cudaMalloc memory goes by a legacy handle, at its offset in the allocation") {
    void* p = nullptr;
    RLPT_CUDA_CHECK(cudaMalloc(&p, 4 * slot));
    {
      ipc_link l(host, role::sender,
                 {.slots = 2,
                  .slot_bytes = slot,
                  .memory = ipc_memory::external,
                  .buffer = static_cast<std::byte*>(p) + slot,
                  .buffer_bytes = 2 * slot});
      CHECK(l.handle_kind() == ipc_handle_kind::legacy);
      l.close(after(std::chrono::milliseconds(50))); // nobody answers the BYE: close() still returns
    }
    RLPT_CUDA_CHECK(cudaFree(p)); // the caller's buffer stays the caller's
  }
  SUBCASE("stream-ordered pool memory cannot be shared: an error, not a silent copy") {
    void* p = nullptr;
    RLPT_CUDA_CHECK(cudaMallocAsync(&p, 2 * slot, nullptr));
    RLPT_CUDA_CHECK(cudaStreamSynchronize(nullptr));
    RLPT_CHECK_ERROR(
        ipc_link(
            host, role::sender,
            {.slots = 2, .slot_bytes = slot, .memory = ipc_memory::external, .buffer = p, .buffer_bytes = 2 * slot}),
        "rlpt.sync.ipc", "can be shared neither", "ipc_memory::legacy");
    RLPT_CUDA_CHECK(cudaFreeAsync(p, nullptr));
    RLPT_CUDA_CHECK(cudaStreamSynchronize(nullptr));
  }
  SUBCASE("host memory and undersized buffers are refused") {
    std::vector<std::byte> h(4 * slot + 256);
    void* aligned = reinterpret_cast<void*>((reinterpret_cast<std::uintptr_t>(h.data()) + 255) / 256 * 256);
    RLPT_CHECK_ERROR(ipc_link(host, role::sender,
                              {.slots = 2,
                               .slot_bytes = slot,
                               .memory = ipc_memory::external,
                               .buffer = aligned,
                               .buffer_bytes = 2 * slot}),
                     "rlpt.sync.ipc", "ipc_options::buffer at"); // "not device memory" (or, with HMM, "shared neither")
    void* p = nullptr;
    RLPT_CUDA_CHECK(cudaMalloc(&p, slot));
    RLPT_CHECK_ERROR(
        ipc_link(host, role::sender,
                 {.slots = 2, .slot_bytes = slot, .memory = ipc_memory::external, .buffer = p, .buffer_bytes = slot}),
        "rlpt.sync.ipc", "must hold at least", std::to_string(2 * slot));
    RLPT_CUDA_CHECK(cudaFree(p));
  }
  SUBCASE("VMM memory created without POSIX-fd export cannot be shared: a clear error") {
    if (!vmm_supported()) return;
    int dev = 0;
    RLPT_CUDA_CHECK(cudaGetDevice(&dev));
    const auto& drv = detail::driver();
    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = dev;
    std::size_t gran = 0;
    RLPT_CU_CHECK(drv.cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    const std::size_t bytes = (2 * slot + gran - 1) / gran * gran;
    CUmemGenericAllocationHandle h{};
    RLPT_CU_CHECK(drv.cuMemCreate(&h, bytes, &prop, 0));
    CUdeviceptr va = 0;
    RLPT_CU_CHECK(drv.cuMemAddressReserve(&va, bytes, gran, 0, 0));
    RLPT_CU_CHECK(drv.cuMemMap(va, bytes, 0, h, 0));
    CUmemAccessDesc access{};
    access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access.location.id = dev;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    RLPT_CU_CHECK(drv.cuMemSetAccess(va, bytes, &access, 1));
    RLPT_CHECK_ERROR(ipc_link(host, role::sender,
                              {.slots = 2,
                               .slot_bytes = slot,
                               .memory = ipc_memory::external,
                               .buffer = reinterpret_cast<void*>(static_cast<std::uintptr_t>(va)),
                               .buffer_bytes = bytes}),
                     "rlpt.sync.ipc", "without CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR");
    RLPT_CU_CHECK(drv.cuMemUnmap(va, bytes));
    RLPT_CU_CHECK(drv.cuMemAddressFree(va, bytes));
    RLPT_CU_CHECK(drv.cuMemRelease(h));
  }
}
