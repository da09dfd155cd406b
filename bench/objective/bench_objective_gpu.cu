// SPDX-License-Identifier: Apache-2.0
// bench_objective_gpu: rlpt::evaluate at 1M tokens (1024 x 1024, ragged masks) on the device,
// full configurations in one fused pass plus the deterministic reduction, against the
// device-to-device copy bandwidth measured in the same run (bench/support/gpu_limits.cuh:
// conventions, verdicts, the JSON line). Per configuration: median time of 20 CUDA-event-timed
// calls after 5 warm-ups (L2 flushed before each), the bytes it must move (float inputs and the
// mask read once, the gradients written once), the bandwidth as a fraction of the copy's, and the
// time as a multiple of a D2D copy of its input bytes (the bench's own target: <= 2x; issue 16
// states no objective target). A few seconds on an H200, mostly building the inputs on the host.
#include <rlpt/cuda/device.cuh>
#include <rlpt/cuda/error.cuh>
#include <rlpt/cuda/objective/evaluate.cuh>
#include <rlpt/cuda/workspace.cuh>
#include <rlpt/objective.hpp>

#include "support/gpu_limits.cuh"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <random>
#include <string>
#include <vector>

namespace {

using namespace rlpt;

template <class T> T* upload(const std::vector<T>& h) {
  T* p = nullptr;
  RLPT_CUDA_CHECK(cudaMalloc(&p, h.size() * sizeof(T)));
  RLPT_CUDA_CHECK(cudaMemcpy(p, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
  return p;
}

int run() {
  namespace gb = rlpt::bench::gpu;
  if (gb::device_count() == 0) return gb::no_device("bench_objective_gpu");
  RLPT_BENCH_CUDA(cudaSetDevice(0));
  cudaDeviceProp prop{};
  RLPT_BENCH_CUDA(cudaGetDeviceProperties(&prop, 0));
  cudaStream_t s = nullptr;
  RLPT_BENCH_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  std::printf("bench_objective_gpu on %s (%d SMs)\n", prop.name, prop.multiProcessorCount);
  const index_t B = 1024, T = 1024;
  const auto n = static_cast<std::size_t>(B * T);
  std::mt19937 g(7);
  std::normal_distribution<float> nd;
  std::vector<float> lp(n), old(n), behav(n), ref(n), adv(n), ent(n);
  std::vector<mask_t> mask(n);
  std::uniform_int_distribution<index_t> len(T / 4, T);
  for (index_t b = 0; b < B; ++b) {
    const index_t l = len(g);
    for (index_t t = 0; t < T; ++t) {
      const auto i = static_cast<std::size_t>(b * T + t);
      lp[i] = -1.0f + 0.5f * nd(g);
      old[i] = lp[i] + 0.1f * nd(g);
      behav[i] = old[i] + 0.1f * nd(g);
      ref[i] = lp[i] + 0.2f * nd(g);
      adv[i] = nd(g);
      ent[i] = 1.0f + 0.5f * nd(g);
      mask[i] = t < l ? 1 : 0;
    }
  }
  double valid = 0;
  for (mask_t m : mask) valid += m;
  device_objective_inputs<float> in;
  in.layout = device_token_layout::padded(B, T);
  in.mask = {upload(mask), static_cast<index_t>(n)};
  in.logp = {upload(lp), static_cast<index_t>(n)};
  in.old_logp = {upload(old), static_cast<index_t>(n)};
  in.behav_logp = {upload(behav), static_cast<index_t>(n)};
  in.ref_logp = {upload(ref), static_cast<index_t>(n)};
  in.adv = {upload(adv), static_cast<index_t>(n)};
  in.entropy = {upload(ent), static_cast<index_t>(n)};
  float *gl = nullptr, *ge = nullptr;
  RLPT_CUDA_CHECK(cudaMalloc(&gl, n * sizeof(float)));
  RLPT_CUDA_CHECK(cudaMalloc(&ge, n * sizeof(float)));
  objective_result* d_result = nullptr;
  RLPT_CUDA_CHECK(cudaMalloc(&d_result, sizeof(objective_result)));

  const gb::copy_limit copy = gb::measure_copy(s);
  gb::print_copy(copy);
  const double bw = copy.bytes_per_s;
  gb::report rep("bench_objective_gpu");
  rep.text("device", prop.name);
  rep.figure("copy_bytes_per_s", bw);
  rep.figure("copy_bytes", copy.bytes);
  rep.figure("tokens", static_cast<double>(n));

  struct config {
    const char* name;
    const char* key;
    objective obj;
    int arrays;        // float inputs read
    bool entropy_grad; // writes d loss / d entropy too
  };
  const config configs[] = {
      {"ppo+k3, token-mean (global N)",
       "ppo_k3",
       {.policy = ppo_clip{}, .kl = {.coef = 1e-3}, .agg = {.global_tokens = valid}},
       4,
       false},
      {"ppo clip-higher+dual + token TIS + k3 + entropy, token-mean (global N)",
       "ppo_tis_k3_entropy",
       {.policy = ppo_clip{.eps_high = 0.28},
        .correction = token_tis(2.0),
        .kl = {.coef = 1e-3},
        .entropy = {.coef = 1e-3},
        .agg = {.global_tokens = valid}},
       6,
       true},
      {"same, local denominators (row pass + count)",
       "ppo_tis_k3_entropy_local",
       {.policy = ppo_clip{.eps_high = 0.28},
        .correction = token_tis(2.0),
        .kl = {.coef = 1e-3},
        .entropy = {.coef = 1e-3}},
       6,
       true},
      {"gspo sequence form + seq IS + k3, seq-mean-token-mean",
       "gspo_seq_is_k3",
       {.policy = gspo{.token_level = false},
        .correction = seq_is(2.0),
        .kl = {.coef = 1e-3},
        .agg = {.mode = agg_mode::seq_mean_token_mean}},
       5,
       false},
  };
  for (const config& c : configs) {
    device_objective_grads<float> gr{.logp = {gl, static_cast<index_t>(n)}};
    if (c.entropy_grad) gr.entropy = {ge, static_cast<index_t>(n)};
    workspace ws;
    evaluate(c.obj, in, gr, d_result, ws, s);
    RLPT_CUDA_CHECK(cudaMalloc(&ws.data, ws.bytes));
    const gb::timing t = gb::time_calls(s, 20, 5, [&] { evaluate(c.obj, in, gr, d_result, ws, s); });
    const double sec = t.median_ms * 1e-3;
    objective_result h{};
    RLPT_CUDA_CHECK(cudaMemcpy(&h, d_result, sizeof(h), cudaMemcpyDeviceToHost));
    const double read = static_cast<double>(n) * (4.0 * c.arrays + 1.0);
    const double written = static_cast<double>(n) * 4.0 * (c.entropy_grad ? 2.0 : 1.0);
    // A D2D copy of the input bytes moves 2 x read bytes: it takes 2 * read / bw.
    const double copy_inputs = 2.0 * read / bw;
    std::printf("%-72s %8.1f us  %6.1f MB moved  %7.1f GB/s = %4.2f of copy bandwidth  %4.2fx a D2D copy of its inputs"
                "  (loss %.6g)\n",
                c.name, sec * 1e6, (read + written) / 1e6, (read + written) / sec / 1e9, (read + written) / sec / bw,
                sec / copy_inputs, h.loss);
    const std::string key = c.key;
    rep.figure(key + "_us", sec * 1e6);
    rep.figure(key + "_bytes_moved", read + written);
    rep.figure(key + "_bytes_per_s", (read + written) / sec);
    rep.check({std::string(c.name) + ": time / D2D copy of its input bytes", sec / copy_inputs, false, 2.0},
              "the bench's own target, not issue 16's");
    RLPT_CUDA_CHECK(cudaFree(ws.data));
  }
  RLPT_BENCH_CUDA(cudaStreamDestroy(s));
  rep.print_json();
  return 0;
}

} // namespace

int main() {
  try {
    return run();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_objective_gpu: %s\n", e.what());
    return 1;
  }
}
