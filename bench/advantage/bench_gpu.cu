// SPDX-License-Identifier: Apache-2.0
// bench_advantage_gpu: issue 16's advantage targets, each against a figure measured in the same
// run (bench/support/gpu_limits.cuh: conventions, verdicts, the JSON line).
//
//   bench_advantage_gpu        (scripts/gpu-check-run runs it; no arguments)
//
// - GAE with verl's masked whitening at 1024 x 8192 and 8192 x 1024 (also 8192 x 8192 and
//   without whitening, reported): bandwidth >= 50 % of the device-to-device copy bandwidth.
//   Bytes counted: the compulsory traffic only, rewards and values (4 B) and the mask (1 B) read
//   once, advantages and returns (4 B) written once = 17 B per token slot, padded slots included.
//   The whitening's second look at the advantages is not counted, so the figure is a lower bound
//   of the bandwidth the kernels draw.
// - GRPO over 65,536 sequences (groups of 4, 16, 64): one GPU operation per call with the group
//   std (verl), two with the batch std (TRL scale_rewards="batch"). Counted by capturing the call
//   into a CUDA graph and reading its nodes' types (kernels, memsets, memcpys); printed.
// Times: median of 20 CUDA-event-timed calls after 3 warm-ups, L2 flushed before each.
// On an H200 the GPU work is well under a second; building the host inputs (~70 M token slots)
// takes a few seconds of CPU.
#include <rlpt/advantage.hpp>
#include <rlpt/cuda/advantage/advantage.cuh>

#include "advantage/inputs.hpp"
#include "support/gpu_limits.cuh"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

namespace {

namespace g = rlpt::bench::gpu;

template <class T> T* upload(const std::vector<T>& h, cudaStream_t s) {
  T* d = g::device_alloc<T>(h.size());
  RLPT_BENCH_CUDA(cudaMemcpyAsync(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice, s));
  RLPT_BENCH_CUDA(cudaStreamSynchronize(s));
  return d;
}

std::string shape(rlpt::index_t a, rlpt::index_t b) { return std::to_string(a) + "x" + std::to_string(b); }

std::string nodes(const g::launch_count& c) {
  if (!c.captured) return "capture failed: " + c.error;
  return std::to_string(c.operations()) + " (" + std::to_string(c.kernels) + " kernels, " + std::to_string(c.memsets) +
         " memsets, " + std::to_string(c.memcpys) + " memcpys, " + std::to_string(c.other) + " other)";
}

double operations(const g::launch_count& c) { return c.captured ? c.operations() : NAN; }

void bench_gae(rlpt::index_t B, rlpt::index_t T, const g::copy_limit& copy, bool target, g::report& rep,
               cudaStream_t stream) {
  const auto in = rlpt::bench::make_tokens(B, T);
  const auto n = static_cast<rlpt::index_t>(in.rewards.size());
  float* r = upload(in.rewards, stream);
  float* v = upload(in.values, stream);
  rlpt::mask_t* m = upload(in.mask, stream);
  float* adv = g::device_alloc<float>(static_cast<std::size_t>(n));
  float* ret = g::device_alloc<float>(static_cast<std::size_t>(n));
  const rlpt::device_gae_inputs din{
      .layout = rlpt::device_token_layout::padded(B, T), .rewards = {r, n}, .values = {v, n}, .mask = {m, n}};
  const double bytes = 17.0 * static_cast<double>(n);
  for (const bool whiten : {false, true}) {
    const auto o = whiten ? rlpt::device_policies(rlpt::compat::verl::gae(1.0, 0.95))
                          : rlpt::gae_options{.lambda = 0.95, .on_nonfinite = rlpt::nonfinite::mask};
    rlpt::workspace ws;
    rlpt::gae(din, {adv, n}, {ret, n}, o, {}, ws, stream);
    ws.data = g::device_alloc<char>(ws.bytes);
    const auto call = [&](cudaStream_t s) { rlpt::gae(din, {adv, n}, {ret, n}, o, {}, ws, s); };
    const g::timing t = g::time_calls(stream, 20, 3, [&] { call(stream); });
    const g::launch_count c = g::count_launches(call);
    const double bw = bytes / (t.median_ms * 1e-3);
    const std::string key = std::string(whiten ? "gae_whiten_" : "gae_") + shape(B, T);
    std::printf("%-26s B=%lld T=%lld: %8.1f us (min %.1f, max %.1f)  %7.1f GB/s (17 B/token) = %.3f of copy; GPU "
                "operations per call: %s\n",
                whiten ? "gae + verl whitening" : "gae (no whitening)", static_cast<long long>(B),
                static_cast<long long>(T), t.median_ms * 1e3, t.min_ms * 1e3, t.max_ms * 1e3, bw / 1e9,
                bw / copy.bytes_per_s, nodes(c).c_str());
    rep.figure(key + "_us", t.median_ms * 1e3);
    rep.figure(key + "_bytes_per_s", bw);
    rep.figure(key + "_gpu_operations", operations(c));
    if (whiten && target)
      rep.check(
          {"GAE + masked whitening " + shape(B, T) + " bandwidth / copy bandwidth", bw / copy.bytes_per_s, true, 0.5},
          "17 B per token slot: inputs read once, outputs written once");
    RLPT_BENCH_CUDA(cudaFree(ws.data));
  }
  for (void* p : {static_cast<void*>(r), static_cast<void*>(v), static_cast<void*>(m), static_cast<void*>(adv),
                  static_cast<void*>(ret)})
    RLPT_BENCH_CUDA(cudaFree(p));
}

struct grpo_counts {
  double group_std = 0, batch_std = 0; // most GPU operations seen per call over the group sizes
};

void bench_grpo(rlpt::index_t N, rlpt::index_t group, grpo_counts& worst, g::report& rep, cudaStream_t stream) {
  const auto in = rlpt::bench::make_outcomes(N, group);
  const auto gr = rlpt::groups::from_ids(in.ids);
  float* r = upload(in.rewards, stream);
  float* out = g::device_alloc<float>(static_cast<std::size_t>(N));
  rlpt::index_t* counters = g::device_alloc<rlpt::index_t>(3);
  rlpt::index_t* offsets = upload(std::vector<rlpt::index_t>(gr.offsets().begin(), gr.offsets().end()), stream);
  rlpt::index_t* members = upload(std::vector<rlpt::index_t>(gr.members().begin(), gr.members().end()), stream);
  const rlpt::device_groups dg{{offsets, gr.num_groups() + 1}, {members, N}, rlpt::max_group_size(gr)};
  for (const auto& preset : {rlpt::compat::verl::grpo(), rlpt::compat::trl::grpo("batch")}) {
    const auto o = rlpt::device_policies(preset);
    const bool batch = o.scale == rlpt::scale::batch_std;
    rlpt::workspace ws;
    rlpt::grpo_advantages({r, N}, dg, {out, N}, o, {}, ws, stream);
    ws.data = g::device_alloc<char>(ws.bytes);
    const auto call = [&](cudaStream_t s) { rlpt::grpo_advantages({r, N}, dg, {out, N}, o, {}, ws, s); };
    const g::timing t = g::time_calls(stream, 20, 3, [&] { call(stream); });
    const g::launch_count c = g::count_launches(call);
    rlpt::device_group_stats with_counters{};
    with_counters.counters = {counters, 3};
    const g::launch_count cc = g::count_launches([&](cudaStream_t s) {
      rlpt::grpo_advantages({r, N}, dg, {out, N}, o, with_counters, ws, s);
    });
    std::printf(
        "grpo%-12s N=%lld, %lld groups of %lld: %7.1f us (min %.1f, max %.1f), %.2f G sequences/s; GPU operations "
        "per call: %s; with stats.counters: %s\n",
        batch ? " (batch std)" : "", static_cast<long long>(N), static_cast<long long>(gr.num_groups()),
        static_cast<long long>(group), t.median_ms * 1e3, t.min_ms * 1e3, t.max_ms * 1e3,
        static_cast<double>(N) / (t.median_ms * 1e-3) / 1e9, nodes(c).c_str(), nodes(cc).c_str());
    const std::string key =
        std::string(batch ? "grpo_batch_std_" : "grpo_") + std::to_string(N) + "_g" + std::to_string(group);
    rep.figure(key + "_us", t.median_ms * 1e3);
    rep.figure(key + "_gpu_operations", operations(c));
    rep.figure(key + "_gpu_operations_with_counters", operations(cc));
    double& w = batch ? worst.batch_std : worst.group_std;
    const double ops = operations(c);
    w = std::isfinite(w) && std::isfinite(ops) ? std::max(w, ops) : NAN; // a failed capture: not measured
    RLPT_BENCH_CUDA(cudaFree(ws.data));
  }
  for (void* p : {static_cast<void*>(r), static_cast<void*>(out), static_cast<void*>(counters),
                  static_cast<void*>(offsets), static_cast<void*>(members)})
    RLPT_BENCH_CUDA(cudaFree(p));
}

int run() {
  if (g::device_count() == 0) return g::no_device("bench_advantage_gpu");
  RLPT_BENCH_CUDA(cudaSetDevice(0));
  cudaDeviceProp prop{};
  RLPT_BENCH_CUDA(cudaGetDeviceProperties(&prop, 0));
  cudaStream_t stream = nullptr;
  RLPT_BENCH_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  std::printf("bench_advantage_gpu on %s (%d SMs)\n", prop.name, prop.multiProcessorCount);
  const g::copy_limit copy = g::measure_copy(stream);
  g::print_copy(copy);
  g::report rep("bench_advantage_gpu");
  rep.text("device", prop.name);
  rep.figure("copy_bytes_per_s", copy.bytes_per_s);
  rep.figure("copy_bytes", copy.bytes);
  bench_gae(1024, 8192, copy, true, rep, stream);
  bench_gae(8192, 1024, copy, true, rep, stream);
  bench_gae(8192, 8192, copy, false, rep, stream);
  grpo_counts worst;
  for (const rlpt::index_t group : {4, 16, 64}) bench_grpo(65536, group, worst, rep, stream);
  rep.check({"GRPO (group std) over 65536 sequences: GPU operations per call", worst.group_std, false, 1},
            "CUDA graph nodes, most over groups of 4, 16, 64");
  rep.check({"GRPO (batch std) over 65536 sequences: GPU operations per call", worst.batch_std, false, 2},
            "CUDA graph nodes, most over groups of 4, 16, 64");
  RLPT_BENCH_CUDA(cudaStreamDestroy(stream));
  rep.print_json();
  return 0;
}

} // namespace

int main() {
  try {
    return run();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_advantage_gpu: %s\n", e.what());
    return 1;
  }
}
