// SPDX-License-Identifier: Apache-2.0
// The minimal example on the GPU: GRPO advantages and the PPO-clip loss (verl presets) of a
// [64, 128] batch, with the same calls as main.cpp on device views, a caller-owned workspace
// (two-phase size query) and a stream; checked against the host calls. Exits 77 (skipped)
// without a CUDA device.
#include <rlpt/advantage.hpp>
#include <rlpt/cuda/advantage/grpo.cuh>
#include <rlpt/cuda/objective/evaluate.cuh>
#include <rlpt/objective.hpp>

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

using rlpt::index_t;

template <class T> T* to_device(const T* h, std::size_t n) {
  void* d = nullptr;
  RLPT_CUDA_CHECK(cudaMalloc(&d, n * sizeof(T) + 1));
  RLPT_CUDA_CHECK(cudaMemcpy(d, h, n * sizeof(T), cudaMemcpyHostToDevice));
  return static_cast<T*>(d);
}
template <class T> T* to_device(const std::vector<T>& h) { return to_device(h.data(), h.size()); }
template <class T> rlpt::device_view<T> dview(T* p, std::size_t n) { return {p, static_cast<index_t>(n)}; }

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::puts("no CUDA device: skipped");
    return 77;
  }
  constexpr index_t B = 64, T = 128, N = B * T;
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  std::vector<float> rewards(B), logp(N), old_logp(N);
  std::vector<std::int64_t> prompt(B);
  std::vector<rlpt::mask_t> mask(N);
  for (index_t i = 0; i < B; ++i) rewards[i] = u(rng) < 0.5f ? 1.0f : 0.0f, prompt[i] = i / 8;
  for (index_t i = 0; i < N; ++i) {
    old_logp[i] = -3.0f * u(rng);
    logp[i] = old_logp[i] + 0.4f * (u(rng) - 0.5f);
    mask[i] = (i % T) < T - (i / T) % 17; // ragged answer lengths
  }

  // Host reference: the calls of main.cpp.
  const rlpt::groups g = rlpt::groups::from_ids(prompt);
  const rlpt::grpo_options go = rlpt::compat::verl::grpo();
  std::vector<float> adv(B), grad(N);
  (void)rlpt::grpo_advantages(rewards, g, adv, go);
  const rlpt::objective obj = rlpt::compat::verl::actor({.clip_ratio_low = 0.2, .clip_ratio_high = 0.28});
  const rlpt::objective_result host = rlpt::evaluate(
      obj,
      rlpt::objective_inputs{
          .layout = rlpt::token_layout::padded(B, T), .mask = mask, .logp = logp, .old_logp = old_logp, .seq_adv = adv},
      {.logp = grad});

  // Device: same options, device views, one stream, no synchronisation inside rlpt.
  cudaStream_t stream;
  RLPT_CUDA_CHECK(cudaStreamCreate(&stream));
  float *d_rewards = to_device(rewards), *d_logp = to_device(logp), *d_old = to_device(old_logp);
  rlpt::mask_t* d_mask = to_device(mask);
  index_t *d_offsets = to_device(g.offsets().data(), static_cast<std::size_t>(g.offsets().size())),
          *d_members = to_device(g.members().data(), static_cast<std::size_t>(g.members().size()));
  float *d_adv = to_device(adv), *d_grad = to_device(grad);
  rlpt::objective_result* d_result = to_device(&host, 1);
  const rlpt::device_groups dg{dview<const index_t>(d_offsets, static_cast<std::size_t>(g.offsets().size())),
                               dview<const index_t>(d_members, B), rlpt::max_group_size(g)};
  const rlpt::device_objective_inputs<float> in{.layout = rlpt::device_token_layout::padded(B, T),
                                                .mask = dview<const rlpt::mask_t>(d_mask, N),
                                                .logp = dview<const float>(d_logp, N),
                                                .old_logp = dview<const float>(d_old, N),
                                                .seq_adv = dview<const float>(d_adv, B)};
  const rlpt::device_objective_grads<float> grads{.logp = dview(d_grad, N)};
  auto run = [&](rlpt::workspace& ws) {
    rlpt::grpo_advantages(dview<const float>(d_rewards, B), dg, dview(d_adv, B), rlpt::device_policies(go), {}, ws,
                          stream);
    rlpt::evaluate(obj, in, grads, d_result, ws, stream);
  };
  rlpt::workspace query, ws; // size query, then the real call with one buffer serving both
  run(query);
  ws.bytes = query.bytes;
  RLPT_CUDA_CHECK(cudaMalloc(&ws.data, ws.bytes + 1));
  run(ws);
  std::vector<float> dev_adv(B), dev_grad(N);
  rlpt::objective_result dev{};
  RLPT_CUDA_CHECK(cudaMemcpyAsync(dev_adv.data(), d_adv, B * sizeof(float), cudaMemcpyDeviceToHost, stream));
  RLPT_CUDA_CHECK(cudaMemcpyAsync(dev_grad.data(), d_grad, N * sizeof(float), cudaMemcpyDeviceToHost, stream));
  RLPT_CUDA_CHECK(cudaMemcpyAsync(&dev, d_result, sizeof dev, cudaMemcpyDeviceToHost, stream));
  RLPT_CUDA_CHECK(cudaStreamSynchronize(stream));

  bool ok = std::fabs(dev.loss - host.loss) <= 1e-6 * std::fabs(host.loss) + 1e-9;
  for (index_t i = 0; i < B; ++i) ok = ok && dev_adv[i] == adv[i]; // documented bit-identical
  double worst = 0.0, scale = 0.0;                                 // float gradients: the device may contract to FMAs
  for (index_t i = 0; i < N; ++i) {
    worst = std::fmax(worst, std::fabs(double(dev_grad[i]) - grad[i]));
    scale = std::fmax(scale, std::fabs(double(grad[i])));
  }
  ok = ok && worst <= 1e-5 * scale;
  std::printf("device loss %.9f  host loss %.9f  max |grad diff| %.3g  advantages %s -> %s\n", dev.loss, host.loss,
              worst, ok ? "equal" : "DIFFER", ok ? "ok" : "FAILED");
  return ok ? 0 : 1;
}
