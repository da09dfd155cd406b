// SPDX-License-Identifier: Apache-2.0
// NCCL broadcast transport: a single-rank group (what one GPU allows: the sender's broadcasts
// are local, every protocol step runs) with a communicator the link creates and with the
// user's own; with two or more GPUs, one receiver process per extra GPU (sync_gpu_peer
// nccl-recv) checks every byte of every version.
#include "gpu_model.hpp"
#include "support/errors.hpp"

#include <rlpt/cuda/sync/sync.cuh>
#include <rlpt/sync/inproc.hpp>
#include <rlpt/sync/tcp.hpp>

#include <doctest/doctest.h>

#include <cuda_runtime_api.h>
#include <nccl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

using namespace rlpt::sync;
namespace model = rlpt::test::sync_gpu;

namespace {

constexpr std::uint64_t bucket = std::uint64_t{1} << 20;

struct params {
  std::vector<model::spec> specs = model::model_specs();
  std::vector<void*> ptrs;
  std::vector<device_tensor> tensors;
  params() {
    for (const auto& s : specs) {
      void* p = nullptr;
      RLPT_CUDA_CHECK(cudaMalloc(&p, s.nbytes()));
      ptrs.push_back(p);
      tensors.push_back({s.name, s.dtype, s.shape, p});
    }
  }
  params(const params&) = delete;
  params& operator=(const params&) = delete;
  ~params() {
    for (void* p : ptrs) static_cast<void>(cudaFree(p));
  }
  void upload(std::uint64_t v) {
    for (std::size_t i = 0; i < specs.size(); ++i) {
      const auto b = model::tensor_bytes(specs[i], i, v);
      RLPT_CUDA_CHECK(cudaMemcpy(ptrs[i], b.data(), b.size(), cudaMemcpyHostToDevice));
    }
    // A pageable upload may return before its DMA landed: finish it before anything reads.
    RLPT_CUDA_CHECK(cudaDeviceSynchronize());
  }
  //! Changed elements between two versions, counted on the host.
  [[nodiscard]] std::uint64_t changed(std::uint64_t a, std::uint64_t b) const {
    std::uint64_t n = 0;
    for (std::size_t i = 0; i < specs.size(); ++i) {
      const auto x = model::tensor_bytes(specs[i], i, a), y = model::tensor_bytes(specs[i], i, b);
      const std::size_t eb = size_of(specs[i].dtype);
      for (std::size_t e = 0; e * eb < x.size(); ++e) n += std::memcmp(&x[e * eb], &y[e * eb], eb) != 0 ? 1 : 0;
    }
    return n;
  }
  void check_checksums(const manifest& m, std::uint64_t v) const {
    for (std::size_t i = 0; i < specs.size(); ++i) {
      const auto b = model::tensor_bytes(specs[i], i, v);
      CHECK_MESSAGE(m[*m.find(specs[i].name)].checksum == wsum(b.data(), b.size()), specs[i].name);
    }
  }
};

void publish_three(nccl_link& l) {
  params p;
  const manifest m = model::model_manifest(bucket);
  device_sender tx(l, m, p.tensors, {.delta = true});
  cudaEvent_t uploaded = nullptr;
  RLPT_CUDA_CHECK(cudaEventCreateWithFlags(&uploaded, cudaEventDisableTiming));
  for (std::uint64_t v = 1; v <= 3; ++v) {
    p.upload(v);
    RLPT_CUDA_CHECK(cudaEventRecord(uploaded, cudaStreamLegacy));
    const publish_result r = tx.publish(v, uploaded); // packing waits for the event
    CHECK(r.version == v);
    CHECK(r.delta == (v > 1));
    if (v == 1) {
      CHECK(r.messages == m.bucket_count());
      CHECK(r.wire_bytes == m.packed_bytes()); // dense: every bucket's used bytes
    } else {
      CHECK(r.stats.changed == p.changed(v - 1, v));
      CHECK(r.wire_bytes < m.payload_bytes() / 4);
    }
    p.check_checksums(tx.current_manifest(), v);
  }
  RLPT_CUDA_CHECK(cudaEventDestroy(uploaded));
}

} // namespace

TEST_CASE("sync nccl: a single-rank group created by the link publishes dense then delta versions") {
  nccl_link l(std::vector<rlpt::sync::link*>{}, {.slot_bytes = bucket});
  publish_three(l);
  CHECK(l.epoch() == 1);
  CHECK(l.comm() != nullptr);
  CHECK_FALSE(l.aborted());
}

TEST_CASE("sync nccl: the user's single-rank communicator is used as given and never destroyed by the link") {
  int dev = 0;
  RLPT_CUDA_CHECK(cudaGetDevice(&dev));
  ncclComm_t comm = nullptr;
  RLPT_NCCL_CHECK(ncclCommInitAll(&comm, 1, &dev));
  {
    nccl_link l(comm, 0, {}, {.slot_bytes = bucket});
    CHECK(l.comm() == comm);
    publish_three(l);
    CHECK(l.epoch() == 0);
  }
  int ranks = 0;
  CHECK(ncclCommCount(comm, &ranks) == ncclSuccess); // still alive after the link is gone
  CHECK(ranks == 1);
  RLPT_NCCL_CHECK(ncclCommDestroy(comm));
  RLPT_CHECK_ERROR(nccl_link(static_cast<ncclComm_t>(nullptr), 0, {}), "rlpt.sync.bad_link", "needs a communicator");
}

TEST_CASE("sync nccl: with several GPUs, one receiver process per extra GPU gets every byte of every version") {
  int gpus = 0;
  RLPT_CUDA_CHECK(cudaGetDeviceCount(&gpus));
  if (gpus < 2) {
    MESSAGE("one GPU: the multi-rank case needs two or more (the single-rank cases above ran)");
    return;
  }
  RLPT_CUDA_CHECK(cudaSetDevice(0));
  std::vector<std::unique_ptr<tcp_transport>> hosts;
  std::vector<rlpt::sync::link*> links;
  std::vector<pid_t> pids;
  for (int g = 1; g < gpus && g < 4; ++g) {
    hosts.push_back(
        std::make_unique<tcp_transport>(tcp_options{.host = "127.0.0.1", .port = 0, .listen = true}, role::sender));
    links.push_back(hosts.back().get());
    std::vector<std::string> args = {RLPT_SYNC_GPU_PEER, "nccl-recv", std::to_string(hosts.back()->port()),
                                     std::to_string(g),  "1",         "3"};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_t pid = -1;
    REQUIRE(::posix_spawn(&pid, RLPT_SYNC_GPU_PEER, nullptr, nullptr, argv.data(), environ) == 0);
    pids.push_back(pid);
  }
  {
    nccl_link l(links, {.slot_bytes = bucket, .device = 0});
    publish_three(l);
    CHECK(l.peers() == links.size());
  }
  for (pid_t pid : pids) {
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
  }
}

TEST_CASE("nccl preflight: the device half names this GPU and NCCL, and one GPU on both ends is refused") {
  auto env = rlpt::sync::capture_environment();
  rlpt::sync::add_device(env, 0);
  rlpt::sync::add_nccl_version(env);
  REQUIRE(env.devices.size() == 1);
  CHECK(env.devices[0].uuid.rfind("GPU-", 0) == 0);
  CHECK(env.devices[0].uuid.size() == 40);
  CHECK(env.devices[0].index == 0);
  CHECK(env.nccl == rlpt::detail::format("{}.{}.{}", NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH));
  CHECK_FALSE(env.cuda_runtime.empty());
  // the trainer and the engine on one GPU: both ends raise before any NCCL call
  rlpt::sync::inproc_pipe pipe;
  rlpt::sync::inproc_transport tx(pipe, rlpt::sync::role::sender), rx(pipe, rlpt::sync::role::receiver);
  const auto rules = rlpt::sync::preflight_rules::nccl();
  std::thread peer([&] {
    CHECK_THROWS(
        rlpt::sync::preflight(rx, rlpt::sync::role::receiver, env, rules, rlpt::sync::after(std::chrono::seconds(5))));
  });
  RLPT_CHECK_ERROR(
      rlpt::sync::preflight(tx, rlpt::sync::role::sender, env, rules, rlpt::sync::after(std::chrono::seconds(5))),
      "rlpt.sync.preflight", "Duplicate GPU", env.devices[0].uuid);
  peer.join();
  int n = 0;
  RLPT_CUDA_CHECK(cudaGetDeviceCount(&n));
  if (n > 1) { // two GPUs: the same environments otherwise agree
    auto other = rlpt::sync::capture_environment();
    rlpt::sync::add_device(other, 1);
    rlpt::sync::add_nccl_version(other);
    CHECK(rlpt::sync::compare_environments(env, other, rules).empty());
  }
}
