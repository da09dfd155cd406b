// SPDX-License-Identifier: Apache-2.0
// GPU benchmark of rlpt::evaluate at 1M tokens: full configurations in one fused pass plus the
// deterministic reduction, timed with CUDA events, against the device copy bandwidth measured in
// the same run. Prints one line per configuration: time, bytes moved, effective bandwidth, and
// the time relative to reading the inputs once at the measured copy bandwidth (target <= 2x).
#include <rlpt/cuda/device.cuh>
#include <rlpt/cuda/error.cuh>
#include <rlpt/cuda/objective/evaluate.cuh>
#include <rlpt/cuda/workspace.cuh>
#include <rlpt/objective.hpp>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <random>
#include <vector>

namespace {

using namespace rlpt;

template <class T>
T* upload(const std::vector<T>& h) {
  T* p = nullptr;
  RLPT_CUDA_CHECK(cudaMalloc(&p, h.size() * sizeof(T)));
  RLPT_CUDA_CHECK(cudaMemcpy(p, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
  return p;
}

//! Device-to-device copy bandwidth (bytes read + written per second) of a 1 GiB buffer.
double copy_bandwidth(cudaStream_t s) {
  const std::size_t bytes = std::size_t{1} << 30;
  void *a = nullptr, *b = nullptr;
  RLPT_CUDA_CHECK(cudaMalloc(&a, bytes));
  RLPT_CUDA_CHECK(cudaMalloc(&b, bytes));
  RLPT_CUDA_CHECK(cudaMemsetAsync(a, 1, bytes, s));
  cudaEvent_t e0, e1;
  RLPT_CUDA_CHECK(cudaEventCreate(&e0));
  RLPT_CUDA_CHECK(cudaEventCreate(&e1));
  float best = 1e30f;
  for (int r = 0; r < 10; ++r) {
    RLPT_CUDA_CHECK(cudaEventRecord(e0, s));
    RLPT_CUDA_CHECK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, s));
    RLPT_CUDA_CHECK(cudaEventRecord(e1, s));
    RLPT_CUDA_CHECK(cudaEventSynchronize(e1));
    float ms = 0;
    RLPT_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    best = std::min(best, ms);
  }
  RLPT_CUDA_CHECK(cudaFree(a));
  RLPT_CUDA_CHECK(cudaFree(b));
  return 2.0 * static_cast<double>(bytes) / (best * 1e-3);
}

} // namespace

int main() {
  if (cuda_device_count() == 0) {
    std::printf("bench_objective_gpu: no CUDA device\n");
    return 0;
  }
  cudaStream_t s;
  RLPT_CUDA_CHECK(cudaStreamCreate(&s));
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

  const double bw = copy_bandwidth(s);
  std::printf("device copy bandwidth (read + write): %.1f GB/s\n", bw / 1e9);

  struct config {
    const char* name;
    objective obj;
    int arrays;        // float inputs read
    bool entropy_grad; // writes d loss / d entropy too
  };
  const config configs[] = {
      {"ppo+k3, token-mean (global N)", {.policy = ppo_clip{}, .kl = {.coef = 1e-3}, .agg = {.global_tokens = valid}}, 4,
       false},
      {"ppo clip-higher+dual + token TIS + k3 + entropy, token-mean (global N)",
       {.policy = ppo_clip{.eps_high = 0.28}, .correction = token_tis(2.0), .kl = {.coef = 1e-3},
        .entropy = {.coef = 1e-3}, .agg = {.global_tokens = valid}},
       6, true},
      {"same, local denominators (row pass + count)",
       {.policy = ppo_clip{.eps_high = 0.28}, .correction = token_tis(2.0), .kl = {.coef = 1e-3},
        .entropy = {.coef = 1e-3}},
       6, true},
      {"gspo sequence form + seq IS + k3, seq-mean-token-mean",
       {.policy = gspo{.token_level = false}, .correction = seq_is(2.0), .kl = {.coef = 1e-3},
        .agg = {.mode = agg_mode::seq_mean_token_mean}},
       5, false},
  };
  for (const config& c : configs) {
    device_objective_grads<float> gr{.logp = {gl, static_cast<index_t>(n)}};
    if (c.entropy_grad) gr.entropy = {ge, static_cast<index_t>(n)};
    workspace ws;
    evaluate(c.obj, in, gr, d_result, ws, s);
    RLPT_CUDA_CHECK(cudaMalloc(&ws.data, ws.bytes));
    for (int r = 0; r < 5; ++r) evaluate(c.obj, in, gr, d_result, ws, s);
    cudaEvent_t e0, e1;
    RLPT_CUDA_CHECK(cudaEventCreate(&e0));
    RLPT_CUDA_CHECK(cudaEventCreate(&e1));
    const int reps = 50;
    RLPT_CUDA_CHECK(cudaEventRecord(e0, s));
    for (int r = 0; r < reps; ++r) evaluate(c.obj, in, gr, d_result, ws, s);
    RLPT_CUDA_CHECK(cudaEventRecord(e1, s));
    RLPT_CUDA_CHECK(cudaEventSynchronize(e1));
    float ms = 0;
    RLPT_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    const double sec = ms * 1e-3 / reps;
    objective_result h{};
    RLPT_CUDA_CHECK(cudaMemcpy(&h, d_result, sizeof(h), cudaMemcpyDeviceToHost));
    const double read = static_cast<double>(n) * (4.0 * c.arrays + 1.0);
    const double written = static_cast<double>(n) * 4.0 * (c.entropy_grad ? 2.0 : 1.0);
    // Reading the inputs once at the copy rate takes read / (bw / 2) (bw counts read + write).
    const double read_once = read / (bw / 2.0);
    std::printf("%-72s %8.1f us  %6.1f MB moved  %7.1f GB/s = %4.2f of copy bandwidth  %4.2fx the input read time"
                "  (1M tokens, loss %.6g)\n",
                c.name, sec * 1e6, (read + written) / 1e6, (read + written) / sec / 1e9, (read + written) / sec / bw,
                sec / read_once, h.loss);
    RLPT_CUDA_CHECK(cudaFree(ws.data));
  }
  return 0;
}
