// SPDX-License-Identifier: Apache-2.0
// bench_advantage_gpu: device GAE (raw and verl-whitened) and GRPO over many groups, timed with
// CUDA events (median of 20 after warm-up), stated against the device-to-device copy bandwidth
// measured in the same run. GAE bytes: rewards, values (4 B), mask (1 B) in; advantages,
// returns (4 B) out = 17 B per token slot. Run by scripts/gpu-check.
#include <rlpt/advantage.hpp>
#include <rlpt/cuda/advantage/advantage.cuh>
#include <rlpt/cuda/device.cuh>

#include "advantage/inputs.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <vector>

namespace {

template <class T>
T* upload(const std::vector<T>& h) {
  T* d = nullptr;
  RLPT_CUDA_CHECK(cudaMalloc(&d, std::max<std::size_t>(1, h.size()) * sizeof(T)));
  RLPT_CUDA_CHECK(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}

template <class T>
T* device_alloc(std::size_t n) {
  T* d = nullptr;
  RLPT_CUDA_CHECK(cudaMalloc(&d, std::max<std::size_t>(1, n) * sizeof(T)));
  return d;
}

//! Median milliseconds of `fn` on `stream` over 20 runs after 3 warm-ups.
double median_ms(cudaStream_t stream, const std::function<void()>& fn) {
  cudaEvent_t a, b;
  RLPT_CUDA_CHECK(cudaEventCreate(&a));
  RLPT_CUDA_CHECK(cudaEventCreate(&b));
  for (int i = 0; i < 3; ++i) fn();
  std::vector<float> t;
  for (int i = 0; i < 20; ++i) {
    RLPT_CUDA_CHECK(cudaEventRecord(a, stream));
    fn();
    RLPT_CUDA_CHECK(cudaEventRecord(b, stream));
    RLPT_CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    RLPT_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms);
  }
  RLPT_CUDA_CHECK(cudaEventDestroy(a));
  RLPT_CUDA_CHECK(cudaEventDestroy(b));
  std::sort(t.begin(), t.end());
  return static_cast<double>(t[t.size() / 2]);
}

//! Device-to-device copy bandwidth (bytes read + written per second), 1 GiB buffers.
double copy_gbps(cudaStream_t stream) {
  const std::size_t bytes = std::size_t{1} << 30;
  char* src = device_alloc<char>(bytes);
  char* dst = device_alloc<char>(bytes);
  RLPT_CUDA_CHECK(cudaMemsetAsync(src, 1, bytes, stream));
  const double ms = median_ms(stream, [&] { RLPT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream)); });
  RLPT_CUDA_CHECK(cudaFree(src));
  RLPT_CUDA_CHECK(cudaFree(dst));
  return 2.0 * static_cast<double>(bytes) / (ms * 1e-3) / 1e9;
}

void bench_gae(rlpt::index_t B, rlpt::index_t T, double copy, cudaStream_t stream) {
  const auto in = rlpt::bench::make_tokens(B, T);
  const auto n = static_cast<rlpt::index_t>(in.rewards.size());
  float* r = upload(in.rewards);
  float* v = upload(in.values);
  rlpt::mask_t* m = upload(in.mask);
  float* adv = device_alloc<float>(static_cast<std::size_t>(n));
  float* ret = device_alloc<float>(static_cast<std::size_t>(n));
  const rlpt::device_gae_inputs din{.layout = rlpt::device_token_layout::padded(B, T), .rewards = {r, n}, .values = {v, n},
                                    .mask = {m, n}};
  for (const bool whiten : {false, true}) {
    const auto o = whiten ? rlpt::device_policies(rlpt::compat::verl::gae(1.0, 0.95))
                          : rlpt::gae_options{.lambda = 0.95, .on_nonfinite = rlpt::nonfinite::mask};
    rlpt::workspace ws;
    rlpt::gae(din, {adv, n}, {ret, n}, o, {}, ws, stream);
    ws.data = device_alloc<char>(ws.bytes);
    const double ms = median_ms(stream, [&] { rlpt::gae(din, {adv, n}, {ret, n}, o, {}, ws, stream); });
    const double gbps = 17.0 * static_cast<double>(n) / (ms * 1e-3) / 1e9;
    std::printf("gae%s B=%lld T=%lld: %.3f ms, %.0f GB/s effective (17 B/token) = %.0f%% of measured copy bandwidth "
                "(%.0f GB/s), %.0f%% of 4800 GB/s H200 nominal\n",
                whiten ? "+verl whitening" : " (no whitening)", static_cast<long long>(B), static_cast<long long>(T), ms,
                gbps, 100.0 * gbps / copy, copy, 100.0 * gbps / 4800.0);
    RLPT_CUDA_CHECK(cudaFree(ws.data));
  }
  for (void* p : {static_cast<void*>(r), static_cast<void*>(v), static_cast<void*>(m), static_cast<void*>(adv),
                  static_cast<void*>(ret)})
    RLPT_CUDA_CHECK(cudaFree(p));
}

void bench_grpo(rlpt::index_t N, rlpt::index_t group, cudaStream_t stream) {
  const auto in = rlpt::bench::make_outcomes(N, group);
  const auto g = rlpt::groups::from_ids(in.ids);
  float* r = upload(in.rewards);
  float* out = device_alloc<float>(static_cast<std::size_t>(N));
  rlpt::index_t* offsets = upload(std::vector<rlpt::index_t>(g.offsets().begin(), g.offsets().end()));
  rlpt::index_t* members = upload(std::vector<rlpt::index_t>(g.members().begin(), g.members().end()));
  const rlpt::device_groups dg{{offsets, g.num_groups() + 1}, {members, N}, rlpt::max_group_size(g)};
  for (const auto& preset : {rlpt::compat::verl::grpo(), rlpt::compat::trl::grpo(rlpt::scale::batch_std)}) {
    const auto o = rlpt::device_policies(preset);
    rlpt::workspace ws;
    rlpt::grpo_advantages({r, N}, dg, {out, N}, o, {}, ws, stream);
    ws.data = device_alloc<char>(ws.bytes);
    const double ms = median_ms(stream, [&] { rlpt::grpo_advantages({r, N}, dg, {out, N}, o, {}, ws, stream); });
    std::printf("grpo%s N=%lld groups of %lld (%lld groups, one launch%s): %.1f us, %.2f G sequences/s\n",
                o.scale == rlpt::scale::batch_std ? " (batch std)" : "", static_cast<long long>(N),
                static_cast<long long>(group), static_cast<long long>(g.num_groups()),
                o.scale == rlpt::scale::batch_std ? " + batch-std block" : "", ms * 1e3,
                static_cast<double>(N) / (ms * 1e-3) / 1e9);
    RLPT_CUDA_CHECK(cudaFree(ws.data));
  }
  for (void* p : {static_cast<void*>(r), static_cast<void*>(out), static_cast<void*>(offsets), static_cast<void*>(members)})
    RLPT_CUDA_CHECK(cudaFree(p));
}

} // namespace

int main() {
  if (rlpt::cuda_device_count() == 0) {
    std::printf("bench_advantage_gpu: no CUDA device\n");
    return 77;
  }
  cudaDeviceProp prop{};
  RLPT_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  cudaStream_t stream;
  RLPT_CUDA_CHECK(cudaStreamCreate(&stream));
  const double copy = copy_gbps(stream);
  std::printf("device %s: measured device-to-device copy %.0f GB/s (read + write)\n", prop.name, copy);
  bench_gae(1024, 8192, copy, stream);
  bench_gae(8192, 1024, copy, stream);
  bench_gae(8192, 8192, copy, stream);
  for (const rlpt::index_t group : {4, 16, 64}) bench_grpo(65536, group, stream);
  RLPT_CUDA_CHECK(cudaStreamDestroy(stream));
  return 0;
}
