// SPDX-License-Identifier: Apache-2.0
// bench_logprob_gpu: issue 16's logprob targets, each stated against a hardware figure measured
// in the same run (bench/support/gpu_limits.cuh: conventions, verdicts, the JSON line).
//
//   bench_logprob_gpu [--quick]        (scripts/gpu-check-run runs it without arguments)
//
// 1. Logits path, 16384 x 152064 bf16 (4.98 GB of logits), against the device-to-device copy
//    bandwidth (read + written) of a 4 GiB cudaMemcpyAsync; one read of the logits = logits
//    bytes / copy bandwidth. Targets: forward (logp + entropy) >= 80 % of the copy bandwidth;
//    forward + backward as separate kernels <= 3.3x one read (3 passes: read, read + write);
//    the fused forward+backward <= 2.7x one read (read + write, the second read from L2).
// 2. Fused lm-head, 16384 tokens x 4096 hidden x 131072 vocab bf16, against one cuBLAS GEMM of
//    exactly that shape (bf16 in, fp32 accumulate and fp32 out, as the fused call's tiles) timed
//    here. Targets: forward time <= 1.25x that GEMM (single stream, and with fold_stream);
//    peak extra memory (workspace + whatever the call itself left allocated, read with
//    cudaMemGetInfo) <= 1/20 of the materialised bf16 logits, forward and backward.
// Also reported (no target): the backward, the GEMM into bf16 logits followed by the logits
// forward (the unfused baseline), TFLOP/s, and checks of the outputs (non-finite rows, fused
// and plain forwards giving the same bits).
//
// On an H200 (~4.3 TB/s copy, ~790 TFLOP/s bf16) this takes a few seconds of GPU time: 4 GiB copies,
// ~90 passes over 5 GB of logits, ~30 lm-head calls of ~25 ms each. --quick shrinks the token
// counts and the lm-head vocabulary 8x (a smoke run; the memory target is not meaningful there).
#include <rlpt/cuda/logprob.cuh>
#include <rlpt/cuda/logprob/lm_head.cuh>

#include "support/gpu_limits.cuh"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

namespace {

using rlpt::index_t;
namespace g = rlpt::bench::gpu;

void check_cublas(cublasStatus_t s, const char* what) {
  if (s == CUBLAS_STATUS_SUCCESS) return;
  std::fprintf(stderr, "%s: cuBLAS status %d\n", what, static_cast<int>(s));
  std::exit(1);
}

__device__ inline std::uint32_t mix(std::uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return static_cast<std::uint32_t>(x);
}

template <class T> __global__ void fill_kernel(T* p, std::size_t n, std::uint64_t seed, float scale) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    float s = 0; // sum of 4 uniforms: roughly normal, sd 1
    for (int k = 0; k < 4; ++k)
      s += static_cast<float>(mix(seed * 0x9e3779b97f4a7c15ull + 4 * i + static_cast<std::size_t>(k))) * 2.3283064e-10f;
    p[i] = T((s - 2.0f) * 1.7320508f * scale);
  }
}

__global__ void targets_kernel(index_t* t, index_t n, index_t v) {
  const index_t i = blockIdx.x * static_cast<index_t>(blockDim.x) + threadIdx.x;
  if (i < n) t[i] = static_cast<index_t>(mix(0x1234u + static_cast<std::uint64_t>(i)) % static_cast<std::uint32_t>(v));
}

template <class T> void fill(T* p, std::size_t n, std::uint64_t seed, float scale, cudaStream_t s) {
  fill_kernel<<<4096, 256, 0, s>>>(p, n, seed, scale);
  RLPT_BENCH_CUDA(cudaGetLastError());
}

std::vector<float> download(const float* d, index_t n) {
  std::vector<float> h(static_cast<std::size_t>(n));
  RLPT_BENCH_CUDA(cudaMemcpy(h.data(), d, h.size() * sizeof(float), cudaMemcpyDeviceToHost));
  return h;
}

index_t nonfinite(const std::vector<float>& v) {
  return static_cast<index_t>(std::count_if(v.begin(), v.end(), [](float x) { return !std::isfinite(x); }));
}

index_t same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  index_t k = 0;
  for (std::size_t i = 0; i < a.size(); ++i) k += std::memcmp(&a[i], &b[i], sizeof(float)) == 0 ? 1 : 0;
  return k;
}

void free_all(std::initializer_list<void*> ps) {
  for (void* p : ps) RLPT_BENCH_CUDA(cudaFree(p));
}

//! Device memory in use, as the driver sees it (after a synchronisation).
double used_bytes() {
  RLPT_BENCH_CUDA(cudaDeviceSynchronize());
  std::size_t free_b = 0, total = 0;
  RLPT_BENCH_CUDA(cudaMemGetInfo(&free_b, &total));
  return static_cast<double>(total - free_b);
}

} // namespace

namespace rlpt_bench { // external linkage for the fused kernel's functor
struct unit_grad {
  __device__ float2 operator()(index_t, float, float) const { return {1.0f, 0.01f}; }
};
} // namespace rlpt_bench

namespace {

// --- 1. logits path ------------------------------------------------------------------------
void logits_path(index_t n, const g::copy_limit& copy, g::report& rep, cudaStream_t s) {
  const index_t v = 152064;
  const auto nv = static_cast<std::size_t>(n) * static_cast<std::size_t>(v);
  auto* x = g::device_alloc<rlpt::bf16>(nv);
  auto* gx = g::device_alloc<rlpt::bf16>(nv);
  auto* t = g::device_alloc<index_t>(static_cast<std::size_t>(n));
  auto* lp = g::device_alloc<float>(static_cast<std::size_t>(n));
  auto* en = g::device_alloc<float>(static_cast<std::size_t>(n));
  auto* ls = g::device_alloc<float>(static_cast<std::size_t>(n));
  auto* dl = g::device_alloc<float>(static_cast<std::size_t>(n));
  auto* dh = g::device_alloc<float>(static_cast<std::size_t>(n));
  auto* counters = g::device_alloc<index_t>(3);
  fill(x, nv, 1, 3.0f, s);
  fill(dl, static_cast<std::size_t>(n), 2, 1.0f, s);
  fill(dh, static_cast<std::size_t>(n), 3, 0.1f, s);
  targets_kernel<<<static_cast<unsigned>((n + 255) / 256), 256, 0, s>>>(t, n, v);
  RLPT_BENCH_CUDA(cudaGetLastError());
  RLPT_BENCH_CUDA(cudaStreamSynchronize(s));
  const rlpt::device_view2d<const rlpt::bf16> xv(x, n, v);
  const rlpt::device_view2d<rlpt::bf16> gv(gx, n, v);
  const rlpt::device_view<const index_t> tv(t, n);
  const rlpt::device_logprob_outputs out{.logp = {lp, n}, .entropy = {en, n}, .lse = {ls, n}};
  const rlpt::device_logprob_backward_inputs bin{
      .dlogp = {dl, n}, .dentropy = {dh, n}, .logp = {lp, n}, .entropy = {en, n}, .saved = {.lse = {ls, n}}};
  const auto fwd_call = [&] { rlpt::logprob_entropy(xv, tv, out, {}, s); };
  const auto bwd_call = [&] { rlpt::logprob_entropy_backward(xv, tv, bin, gv, {}, s); };
  const auto fused_call = [&] { rlpt::logprob_entropy_fused(xv, tv, out, gv, rlpt_bench::unit_grad{}, {}, s); };

  const double bytes = static_cast<double>(nv) * sizeof(rlpt::bf16);
  const double one_read_ms = bytes / copy.bytes_per_s * 1e3;
  const g::timing fwd = g::time_calls(s, 20, 3, fwd_call);
  const g::timing bwd = g::time_calls(s, 20, 3, bwd_call);
  const g::timing pair = g::time_calls(s, 20, 3, [&] {
    fwd_call();
    bwd_call();
  });
  // outputs of the plain forward, with the counters
  rlpt::logprob_entropy(xv, tv, {.logp = {lp, n}, .entropy = {en, n}, .lse = {ls, n}, .counters = {counters, 3}}, {},
                        s);
  RLPT_BENCH_CUDA(cudaStreamSynchronize(s));
  index_t cnt[3] = {};
  RLPT_BENCH_CUDA(cudaMemcpy(cnt, counters, sizeof cnt, cudaMemcpyDeviceToHost));
  const std::vector<float> lp_plain = download(lp, n), en_plain = download(en, n);
  const g::timing fused = g::time_calls(s, 20, 3, fused_call);
  RLPT_BENCH_CUDA(cudaStreamSynchronize(s));
  const std::vector<float> lp_fused = download(lp, n), en_fused = download(en, n);

  const double fwd_bw = bytes / (fwd.median_ms * 1e-3);
  std::printf("\nlogits path: %lld x %lld bf16, %.3f GB of logits; one read at the copy bandwidth: %.3f ms\n",
              static_cast<long long>(n), static_cast<long long>(v), bytes / 1e9, one_read_ms);
  std::printf("  forward (logp + entropy)   %8.3f ms (min %.3f, max %.3f)  %.1f GB/s read\n", fwd.median_ms, fwd.min_ms,
              fwd.max_ms, fwd_bw / 1e9);
  std::printf("  backward                   %8.3f ms  %.1f GB/s (read + written)\n", bwd.median_ms,
              2 * bytes / (bwd.median_ms * 1e-3) / 1e9);
  std::printf("  forward + backward         %8.3f ms  = %.2fx one read (3 passes at least)\n", pair.median_ms,
              pair.median_ms / one_read_ms);
  std::printf("  fused forward + backward   %8.3f ms  = %.2fx one read (2 passes at least)\n", fused.median_ms,
              fused.median_ms / one_read_ms);
  std::printf("  outputs: %lld unusable rows, %lld bad targets (counters); non-finite logp %lld, entropy %lld; "
              "fused == plain forward: logp %lld / %lld, entropy %lld / %lld bit-equal\n",
              static_cast<long long>(cnt[0]), static_cast<long long>(cnt[1]),
              static_cast<long long>(nonfinite(lp_plain)), static_cast<long long>(nonfinite(en_plain)),
              static_cast<long long>(same_bits(lp_plain, lp_fused)), static_cast<long long>(n),
              static_cast<long long>(same_bits(en_plain, en_fused)), static_cast<long long>(n));
  rep.figure("logits_rows", static_cast<double>(n));
  rep.figure("logits_vocab", static_cast<double>(v));
  rep.figure("logits_bytes", bytes);
  rep.figure("one_read_ms", one_read_ms);
  rep.figure("fwd_ms", fwd.median_ms);
  rep.figure("bwd_ms", bwd.median_ms);
  rep.figure("fwd_bwd_ms", pair.median_ms);
  rep.figure("fused_ms", fused.median_ms);
  rep.figure("fwd_read_bytes_per_s", fwd_bw);
  rep.figure("unusable_rows", static_cast<double>(cnt[0]));
  rep.figure("nonfinite_logp", static_cast<double>(nonfinite(lp_plain)));
  rep.figure("fused_logp_bit_equal", static_cast<double>(same_bits(lp_plain, lp_fused)));
  rep.figure("fused_entropy_bit_equal", static_cast<double>(same_bits(en_plain, en_fused)));
  rep.check({"logits forward bandwidth / copy bandwidth", fwd_bw / copy.bytes_per_s, true, 0.80});
  rep.check({"logits forward + backward (separate kernels) time / one read", pair.median_ms / one_read_ms, false, 3.3});
  rep.check({"logits fused forward+backward time / one read", fused.median_ms / one_read_ms, false, 2.7});
  free_all({x, gx, t, lp, en, ls, dl, dh, counters});
}

// --- 2. fused lm-head ----------------------------------------------------------------------
void lm_head(index_t n, index_t v, g::report& rep, cudaStream_t s) {
  const index_t d = 4096;
  cublasHandle_t cublas = nullptr;
  check_cublas(cublasCreate(&cublas), "cublasCreate");
  cudaStream_t fold = nullptr;
  RLPT_BENCH_CUDA(cudaStreamCreateWithFlags(&fold, cudaStreamNonBlocking));
  const auto nd = static_cast<std::size_t>(n) * static_cast<std::size_t>(d);
  const auto vd = static_cast<std::size_t>(v) * static_cast<std::size_t>(d);
  const auto nv = static_cast<std::size_t>(n) * static_cast<std::size_t>(v);
  auto* h = g::device_alloc<rlpt::bf16>(nd);
  auto* w = g::device_alloc<rlpt::bf16>(vd);
  auto* t = g::device_alloc<index_t>(static_cast<std::size_t>(n));
  auto* lp = g::device_alloc<float>(static_cast<std::size_t>(n));
  auto* en = g::device_alloc<float>(static_cast<std::size_t>(n));
  auto* ls = g::device_alloc<float>(static_cast<std::size_t>(n));
  auto* dl = g::device_alloc<float>(static_cast<std::size_t>(n));
  auto* gh = g::device_alloc<float>(nd);
  auto* gw = g::device_alloc<float>(vd);
  fill(h, nd, 4, 1.0f, s);
  fill(w, vd, 5, 0.02f, s);
  fill(dl, static_cast<std::size_t>(n), 6, 1.0f, s);
  targets_kernel<<<static_cast<unsigned>((n + 255) / 256), 256, 0, s>>>(t, n, v);
  RLPT_BENCH_CUDA(cudaGetLastError());
  RLPT_BENCH_CUDA(cudaStreamSynchronize(s));
  const rlpt::device_view2d<const rlpt::bf16> hv(h, n, d), wv(w, v, d);
  const rlpt::device_view<const index_t> tv(t, n);
  const rlpt::device_logprob_outputs out{.logp = {lp, n}, .entropy = {en, n}, .lse = {ls, n}};
  const rlpt::device_lm_head_options single{};
  const rlpt::device_lm_head_options overlap{.fold_stream = fold};
  const double logits_bytes = static_cast<double>(nv) * sizeof(rlpt::bf16);

  struct variant {
    const char* name;
    rlpt::device_lm_head_options opt;
    rlpt::workspace ws;
    double extra = 0; // bytes the first call left allocated beyond the workspace
    g::timing time;
  };
  variant fwd[2] = {{"single stream", single, {}, 0, {}}, {"fold_stream", overlap, {}, 0, {}}};
  for (variant& f : fwd) {
    rlpt::fused_lm_head_logprob(f.ws, hv, wv, tv, out, cublas, f.opt, s);
    f.ws.data = g::device_alloc<char>(f.ws.bytes);
    const double before = used_bytes();
    rlpt::fused_lm_head_logprob(f.ws, hv, wv, tv, out, cublas, f.opt, s);
    f.extra = std::max(0.0, used_bytes() - before);
    f.time = g::time_calls(s, 5, 1, [&] { rlpt::fused_lm_head_logprob(f.ws, hv, wv, tv, out, cublas, f.opt, s); });
  }
  RLPT_BENCH_CUDA(cudaStreamSynchronize(s));
  const std::vector<float> lp_fused = download(lp, n);
  const auto bwd_call = [&](rlpt::workspace& ws) {
    rlpt::fused_lm_head_backward(ws, hv, wv, tv, {dl, n}, {}, {en, n}, {ls, n}, {gh, n, d}, {gw, v, d}, cublas, single,
                                 s);
  };
  rlpt::workspace bws;
  bwd_call(bws);
  bws.data = g::device_alloc<char>(bws.bytes);
  const double before_bwd = used_bytes();
  bwd_call(bws);
  const double bwd_extra = std::max(0.0, used_bytes() - before_bwd);
  const g::timing bwd = g::time_calls(s, 3, 1, [&] { bwd_call(bws); });

  // The same-shape GEMM alone: logits [n, v] = hidden [n, d] x weight [v, d]^T, bf16 in, fp32
  // accumulate, fp32 out (what the fused call's tiles are), then into bf16 (materialised logits).
  check_cublas(cublasSetStream(cublas, s), "cublasSetStream");
  const float one = 1.0f, zero = 0.0f;
  const auto gemm = [&](void* c, cudaDataType_t type) {
    check_cublas(cublasGemmEx_64(cublas, CUBLAS_OP_T, CUBLAS_OP_N, v, n, d, &one, w, CUDA_R_16BF, d, h, CUDA_R_16BF, d,
                                 &zero, c, type, v, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                 "cublasGemmEx_64");
  };
  auto* full32 = g::device_alloc<float>(nv);
  const g::timing gemm32 = g::time_calls(s, 5, 1, [&] { gemm(full32, CUDA_R_32F); });
  RLPT_BENCH_CUDA(cudaStreamSynchronize(s));
  RLPT_BENCH_CUDA(cudaFree(full32));
  auto* full16 = g::device_alloc<rlpt::bf16>(nv);
  const g::timing gemm16 = g::time_calls(s, 5, 1, [&] { gemm(full16, CUDA_R_16BF); });
  const rlpt::device_view2d<const rlpt::bf16> fv(full16, n, v);
  const g::timing base = g::time_calls(s, 5, 1, [&] {
    gemm(full16, CUDA_R_16BF);
    rlpt::logprob_entropy(fv, tv, out, {}, s);
  });
  RLPT_BENCH_CUDA(cudaStreamSynchronize(s));
  const std::vector<float> lp_base = download(lp, n);
  RLPT_BENCH_CUDA(cudaFree(full16));
  double max_diff = 0;
  for (std::size_t i = 0; i < lp_base.size(); ++i)
    max_diff = std::max(max_diff, static_cast<double>(std::fabs(lp_base[i] - lp_fused[i])));

  const double flop = 2.0 * static_cast<double>(n) * static_cast<double>(d) * static_cast<double>(v);
  std::printf("\nfused lm-head: %lld tokens x %lld hidden x %lld vocab bf16 (tiles %lld x %lld); materialised bf16 "
              "logits would take %.2f GB\n",
              static_cast<long long>(n), static_cast<long long>(d), static_cast<long long>(v),
              static_cast<long long>(single.token_tile), static_cast<long long>(single.vocab_tile), logits_bytes / 1e9);
  std::printf("  cuBLAS GEMM, same shape, fp32 out   %8.3f ms  %.0f TFLOP/s\n", gemm32.median_ms,
              flop / (gemm32.median_ms * 1e-3) / 1e12);
  std::printf("  cuBLAS GEMM, same shape, bf16 out   %8.3f ms  %.0f TFLOP/s\n", gemm16.median_ms,
              flop / (gemm16.median_ms * 1e-3) / 1e12);
  std::printf("  unfused: GEMM to bf16 + forward     %8.3f ms  (%.2f GB of logits)\n", base.median_ms,
              logits_bytes / 1e9);
  for (const variant& f : fwd)
    std::printf("  forward, %-13s              %8.3f ms  %.0f TFLOP/s = %.2fx the fp32-out GEMM; workspace %.1f MB + "
                "%.1f MB left allocated by the call\n",
                f.name, f.time.median_ms, flop / (f.time.median_ms * 1e-3) / 1e12, f.time.median_ms / gemm32.median_ms,
                static_cast<double>(f.ws.bytes) / 1e6, f.extra / 1e6);
  std::printf(
      "  backward (recomputes the logits)    %8.3f ms  %.0f TFLOP/s counted as 6·N·D·V; workspace %.1f MB + %.1f "
      "MB\n",
      bwd.median_ms, 3 * flop / (bwd.median_ms * 1e-3) / 1e12, static_cast<double>(bws.bytes) / 1e6, bwd_extra / 1e6);
  std::printf("  fused vs unfused logp: max |difference| %.3g (bf16 logits round the unfused one)\n", max_diff);
  rep.figure("lm_head_tokens", static_cast<double>(n));
  rep.figure("lm_head_hidden", static_cast<double>(d));
  rep.figure("lm_head_vocab", static_cast<double>(v));
  rep.figure("gemm_fp32_out_ms", gemm32.median_ms);
  rep.figure("gemm_bf16_out_ms", gemm16.median_ms);
  rep.figure("unfused_gemm_fwd_ms", base.median_ms);
  rep.figure("lm_head_fwd_ms", fwd[0].time.median_ms);
  rep.figure("lm_head_fwd_fold_stream_ms", fwd[1].time.median_ms);
  rep.figure("lm_head_bwd_ms", bwd.median_ms);
  rep.figure("lm_head_ws_fwd_bytes", static_cast<double>(fwd[0].ws.bytes));
  rep.figure("lm_head_ws_fwd_fold_stream_bytes", static_cast<double>(fwd[1].ws.bytes));
  rep.figure("lm_head_ws_bwd_bytes", static_cast<double>(bws.bytes));
  rep.figure("lm_head_extra_fwd_bytes", std::max(fwd[0].extra, fwd[1].extra));
  rep.figure("lm_head_extra_bwd_bytes", bwd_extra);
  rep.figure("bf16_logits_bytes", logits_bytes);
  rep.figure("lm_head_vs_unfused_max_abs_diff", max_diff);
  rep.check({"lm-head forward (single stream) time / same-shape cuBLAS GEMM time",
             fwd[0].time.median_ms / gemm32.median_ms, false, 1.25},
            "GEMM: bf16 in, fp32 out");
  rep.check({"lm-head forward (fold_stream) time / same-shape cuBLAS GEMM time",
             fwd[1].time.median_ms / gemm32.median_ms, false, 1.25},
            "GEMM: bf16 in, fp32 out");
  const double fwd_peak = std::max(static_cast<double>(fwd[0].ws.bytes) + fwd[0].extra,
                                   static_cast<double>(fwd[1].ws.bytes) + fwd[1].extra);
  rep.check({"lm-head forward peak extra memory / bf16 logits", fwd_peak / logits_bytes, false, 1.0 / 20},
            "workspace + memory the call left allocated, larger of the two forwards");
  rep.check({"lm-head backward peak extra memory / bf16 logits",
             (static_cast<double>(bws.bytes) + bwd_extra) / logits_bytes, false, 1.0 / 20},
            "workspace + memory the call left allocated");
  free_all({h, w, t, lp, en, ls, dl, gh, gw, fwd[0].ws.data, fwd[1].ws.data, bws.data});
  check_cublas(cublasDestroy(cublas), "cublasDestroy");
  RLPT_BENCH_CUDA(cudaStreamDestroy(fold));
}

int run(bool quick) {
  if (g::device_count() == 0) return g::no_device("bench_logprob_gpu");
  RLPT_BENCH_CUDA(cudaSetDevice(0));
  cudaDeviceProp prop{};
  RLPT_BENCH_CUDA(cudaGetDeviceProperties(&prop, 0));
  cudaStream_t s = nullptr;
  RLPT_BENCH_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  std::printf("bench_logprob_gpu on %s (%d SMs, %.1f GB)%s\n", prop.name, prop.multiProcessorCount,
              static_cast<double>(prop.totalGlobalMem) / 1e9, quick ? ", --quick (shapes / 8: a smoke run)" : "");
  const g::copy_limit copy = g::measure_copy(s);
  g::print_copy(copy);
  g::report rep("bench_logprob_gpu");
  rep.text("device", prop.name);
  rep.figure("quick", quick ? 1 : 0);
  rep.figure("copy_bytes_per_s", copy.bytes_per_s);
  rep.figure("copy_bytes", copy.bytes);
  const index_t shrink = quick ? 8 : 1;
  logits_path(16384 / shrink, copy, rep, s);
  lm_head(16384 / shrink, 131072 / shrink, rep, s);
  RLPT_BENCH_CUDA(cudaStreamDestroy(s));
  rep.print_json();
  return 0;
}

} // namespace

int main(int argc, char** argv) {
  try {
    return run(argc > 1 && std::string(argv[1]) == "--quick");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_logprob_gpu: %s\n", e.what());
    return 1;
  }
}
