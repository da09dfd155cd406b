// SPDX-License-Identifier: Apache-2.0
// bench_logprob_gpu: the issue's GPU targets, measured with CUDA events (median of repeats) and
// stated against the hardware limits read or measured in the same run.
//
//   bench_logprob_gpu [--quick]
//
// 1. Logits path, 16384 x 152064 bf16 (4.98 GB): forward GB/s as a fraction of the HBM peak
//    (from the device's memory clock and bus width; 4.8 TB/s on an H200) and of a device copy
//    measured here; forward + backward (separate kernels) and the fused forward+backward, each
//    as a multiple of the ideal one-read time (bytes / peak). Targets: forward >= 80 % of peak,
//    forward + backward <= 2.5x one read.
// 2. Fused lm-head, 16384 tokens x 4096 hidden x 131072 vocab bf16: forward TFLOP/s (2·N·D·V)
//    and forward + backward (8·N·D·V) against the dense bf16 tensor-core peak (989 TFLOP/s on
//    H100/H200) and against a large cuBLAS GEMM timed here; peak extra memory (the workspace)
//    against materialising the bf16 logits (target <= 1/20). Baseline in the same run: cuBLAS
//    GEMM into materialised bf16 logits followed by the logits-path forward.
// torch is not installed on the GPU machine, so the torch-eager comparison of the issue is not
// part of this executable (the CPU comparison is bench/peers/logprob_torch.py).
// --quick shrinks every shape 8x (a smoke run).
#include <rlpt/cuda/logprob.cuh>

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

namespace {

using rlpt::index_t;

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

template <class T>
T* dalloc(std::size_t n) {
  void* p = nullptr;
  check(cudaMalloc(&p, std::max<std::size_t>(n, 1) * sizeof(T)), "cudaMalloc");
  return static_cast<T*>(p);
}

__device__ inline std::uint32_t mix(std::uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return static_cast<std::uint32_t>(x);
}

template <class T>
__global__ void fill_kernel(T* p, std::size_t n, std::uint64_t seed, float scale) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    float s = 0; // sum of 4 uniforms: roughly normal, sd 1
    for (int k = 0; k < 4; ++k) s += static_cast<float>(mix(seed * 0x9e3779b97f4a7c15ull + 4 * i + k)) * 2.3283064e-10f;
    p[i] = T((s - 2.0f) * 1.7320508f * scale);
  }
}

__global__ void targets_kernel(index_t* t, index_t n, index_t v) {
  const index_t i = blockIdx.x * static_cast<index_t>(blockDim.x) + threadIdx.x;
  if (i < n) t[i] = static_cast<index_t>(mix(0x1234u + static_cast<std::uint64_t>(i)) % static_cast<std::uint32_t>(v));
}

template <class T>
void fill(T* p, std::size_t n, std::uint64_t seed, float scale) {
  fill_kernel<<<4096, 256>>>(p, n, seed, scale);
  check(cudaGetLastError(), "fill");
}

//! Median milliseconds of `repeat` timed calls after `warmup` untimed ones.
double median_ms(int repeat, int warmup, const std::function<void()>& fn) {
  cudaEvent_t a, b;
  check(cudaEventCreate(&a), "event");
  check(cudaEventCreate(&b), "event");
  for (int i = 0; i < warmup; ++i) fn();
  std::vector<double> t;
  for (int i = 0; i < repeat; ++i) {
    check(cudaEventRecord(a), "record");
    fn();
    check(cudaEventRecord(b), "record");
    check(cudaEventSynchronize(b), "sync");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, a, b), "elapsed");
    t.push_back(ms);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

} // namespace

namespace rlpt_bench { // external linkage for the fused kernel's functor
struct unit_grad {
  __device__ float2 operator()(index_t, float, float) const { return {1.0f, 0.01f}; }
};
} // namespace rlpt_bench

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::string(argv[1]) == "--quick";
  const index_t shrink = quick ? 8 : 1;
  int dev = 0;
  check(cudaSetDevice(dev), "cudaSetDevice");
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, dev), "props");
  int mem_khz = 0, bus_bits = 0;
  cudaDeviceGetAttribute(&mem_khz, cudaDevAttrMemoryClockRate, dev);
  cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, dev);
  const double peak_bw = 2.0 * mem_khz * 1e3 * bus_bits / 8; // bytes/s, DDR
  const double spec_bw = 4.8e12, spec_tflops = 989.0;
  std::printf("device: %s, %d SMs, HBM peak from clock x bus: %.2f TB/s (H200 spec %.1f TB/s)\n", prop.name,
              prop.multiProcessorCount, peak_bw / 1e12, spec_bw / 1e12);
  const double bw = peak_bw > 1e12 ? peak_bw : spec_bw;

  // device copy bandwidth measured here (read + write)
  {
    const std::size_t bytes = std::size_t{2} << 30;
    auto* a = dalloc<char>(bytes);
    auto* b = dalloc<char>(bytes);
    check(cudaMemset(a, 1, bytes), "memset");
    const double ms = median_ms(10, 2, [&] { cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice); });
    std::printf("device copy: %.2f TB/s (read + write) = %.1f %% of peak\n", 2.0 * bytes / (ms * 1e-3) / 1e12,
                100.0 * 2.0 * bytes / (ms * 1e-3) / bw);
    cudaFree(a);
    cudaFree(b);
  }

  // --- 1. logits path ---------------------------------------------------------------------
  {
    const index_t n = 16384 / shrink, v = 152064;
    const auto nv = static_cast<std::size_t>(n * v);
    auto* x = dalloc<rlpt::bf16>(nv);
    auto* g = dalloc<rlpt::bf16>(nv);
    auto* t = dalloc<index_t>(static_cast<std::size_t>(n));
    auto* lp = dalloc<float>(static_cast<std::size_t>(n));
    auto* en = dalloc<float>(static_cast<std::size_t>(n));
    auto* ls = dalloc<float>(static_cast<std::size_t>(n));
    auto* dl = dalloc<float>(static_cast<std::size_t>(n));
    auto* dh = dalloc<float>(static_cast<std::size_t>(n));
    fill(x, nv, 1, 3.0f);
    fill(dl, static_cast<std::size_t>(n), 2, 1.0f);
    fill(dh, static_cast<std::size_t>(n), 3, 0.1f);
    targets_kernel<<<static_cast<unsigned>((n + 255) / 256), 256>>>(t, n, v);
    check(cudaDeviceSynchronize(), "init");
    const rlpt::device_view2d<const rlpt::bf16> xv(x, n, v);
    const rlpt::device_view<const index_t> tv(t, n);
    const rlpt::device_logprob_outputs out{.logp = {lp, n}, .entropy = {en, n}, .lse = {ls, n}};
    const double bytes = static_cast<double>(nv) * 2;
    const double ideal_ms = bytes / bw * 1e3;
    const double fwd = median_ms(20, 3, [&] { rlpt::logprob_entropy(xv, tv, out, {}, nullptr); });
    const double bwd = median_ms(20, 3, [&] {
      rlpt::logprob_entropy_backward(
          xv, tv, {.dlogp = {dl, n}, .dentropy = {dh, n}, .logp = {lp, n}, .entropy = {en, n}, .saved = {.lse = {ls, n}}},
          rlpt::device_view2d<rlpt::bf16>(g, n, v), {}, nullptr);
    });
    const double fused = median_ms(20, 3, [&] {
      rlpt::logprob_entropy_fused(xv, tv, out, rlpt::device_view2d<rlpt::bf16>(g, n, v), rlpt_bench::unit_grad{}, {},
                                  nullptr);
    });
    check(cudaDeviceSynchronize(), "logits path");
    std::printf("\nlogits path %lld x %lld bf16 (%.2f GB), ideal one read at peak %.3f ms\n",
                static_cast<long long>(n), static_cast<long long>(v), bytes / 1e9, ideal_ms);
    std::printf("  forward            %.3f ms  %.2f TB/s = %.1f %% of HBM peak (target >= 80 %%)\n", fwd,
                bytes / (fwd * 1e-3) / 1e12, 100.0 * bytes / (fwd * 1e-3) / bw);
    std::printf("  backward           %.3f ms  %.2f TB/s (read + write)\n", bwd, 2 * bytes / (bwd * 1e-3) / 1e12);
    std::printf("  forward + backward %.3f ms = %.2fx one read (target <= 2.5x)\n", fwd + bwd, (fwd + bwd) / ideal_ms);
    std::printf("  fused fwd+bwd      %.3f ms = %.2fx one read (target <= 2.5x)\n", fused, fused / ideal_ms);
    std::printf("JSON {\"bench\": \"logprob_logits\", \"n\": %lld, \"v\": %lld, \"fwd_ms\": %.4f, \"bwd_ms\": %.4f, "
                "\"fused_ms\": %.4f, \"fwd_frac_peak\": %.4f, \"fwd_bwd_over_one_read\": %.3f, "
                "\"fused_over_one_read\": %.3f}\n",
                static_cast<long long>(n), static_cast<long long>(v), fwd, bwd, fused, bytes / (fwd * 1e-3) / bw,
                (fwd + bwd) / ideal_ms, fused / ideal_ms);
    for (void* p : {static_cast<void*>(x), static_cast<void*>(g), static_cast<void*>(t), static_cast<void*>(lp),
                    static_cast<void*>(en), static_cast<void*>(ls), static_cast<void*>(dl), static_cast<void*>(dh)})
      cudaFree(p);
  }

  // --- 2. fused lm-head ----------------------------------------------------------------------
  {
    const index_t n = 16384 / shrink, d = 4096, v = 131072 / shrink;
    cublasHandle_t cublas = nullptr;
    if (cublasCreate(&cublas) != CUBLAS_STATUS_SUCCESS) {
      std::fprintf(stderr, "cublasCreate failed\n");
      return 1;
    }
    auto* h = dalloc<rlpt::bf16>(static_cast<std::size_t>(n * d));
    auto* w = dalloc<rlpt::bf16>(static_cast<std::size_t>(v * d));
    auto* t = dalloc<index_t>(static_cast<std::size_t>(n));
    auto* lp = dalloc<float>(static_cast<std::size_t>(n));
    auto* en = dalloc<float>(static_cast<std::size_t>(n));
    auto* ls = dalloc<float>(static_cast<std::size_t>(n));
    auto* dl = dalloc<float>(static_cast<std::size_t>(n));
    auto* gh = dalloc<float>(static_cast<std::size_t>(n * d));
    auto* gw = dalloc<float>(static_cast<std::size_t>(v * d));
    fill(h, static_cast<std::size_t>(n * d), 4, 1.0f);
    fill(w, static_cast<std::size_t>(v * d), 5, 0.02f);
    fill(dl, static_cast<std::size_t>(n), 6, 1.0f);
    targets_kernel<<<static_cast<unsigned>((n + 255) / 256), 256>>>(t, n, v);
    check(cudaDeviceSynchronize(), "init");
    const rlpt::device_view2d<const rlpt::bf16> hv(h, n, d), wv(w, v, d);
    const rlpt::device_view<const index_t> tv(t, n);
    const rlpt::device_logprob_outputs out{.logp = {lp, n}, .entropy = {en, n}, .lse = {ls, n}};
    const rlpt::device_lm_head_options o{};
    rlpt::workspace fws, bws;
    rlpt::fused_lm_head_logprob(fws, hv, wv, tv, out, cublas, o, nullptr);
    rlpt::fused_lm_head_backward(bws, hv, wv, tv, {dl, n}, {}, {en, n}, {ls, n}, {gh, n, d}, {gw, v, d}, cublas, o,
                                 nullptr);
    fws.data = dalloc<char>(fws.bytes);
    bws.data = dalloc<char>(bws.bytes);
    const double flop = 2.0 * static_cast<double>(n) * static_cast<double>(d) * static_cast<double>(v);
    const double fwd = median_ms(5, 1, [&] { rlpt::fused_lm_head_logprob(fws, hv, wv, tv, out, cublas, o, nullptr); });
    const double bwd = median_ms(3, 1, [&] {
      rlpt::fused_lm_head_backward(bws, hv, wv, tv, {dl, n}, {}, {en, n}, {ls, n}, {gh, n, d}, {gw, v, d}, cublas, o,
                                   nullptr);
    });
    // dense GEMM reference: what cuBLAS reaches on one big bf16 GEMM here
    auto* big = dalloc<float>(static_cast<std::size_t>(16384 / shrink) * 16384);
    const float one = 1.0f, zero = 0.0f;
    const int gm = static_cast<int>(16384 / shrink), gn = 16384, gk = static_cast<int>(d);
    const double gemm = median_ms(5, 1, [&] {
      cublasGemmEx(cublas, CUBLAS_OP_T, CUBLAS_OP_N, gn, gm, gk, &one, w, CUDA_R_16BF, gk, h, CUDA_R_16BF, gk, &zero, big,
                   CUDA_R_32F, gn, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    });
    const double gemm_tflops = 2.0 * gm * static_cast<double>(gn) * gk / (gemm * 1e-3) / 1e12;
    cudaFree(big);
    // baseline: materialise bf16 logits with cuBLAS, then the logits-path forward
    double base = -1;
    const std::size_t logits_bytes = static_cast<std::size_t>(n * v) * 2;
    rlpt::bf16* full = nullptr;
    if (cudaMalloc(&full, logits_bytes) == cudaSuccess) {
      base = median_ms(5, 1, [&] {
        cublasGemmEx(cublas, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(v), static_cast<int>(n), static_cast<int>(d), &one,
                     w, CUDA_R_16BF, static_cast<int>(d), h, CUDA_R_16BF, static_cast<int>(d), &zero, full, CUDA_R_16BF,
                     static_cast<int>(v), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        rlpt::logprob_entropy(rlpt::device_view2d<const rlpt::bf16>(full, n, v), tv, out, {}, nullptr);
      });
      cudaFree(full);
    } else {
      (void)cudaGetLastError();
    }
    check(cudaDeviceSynchronize(), "lm-head");
    std::printf("\nfused lm-head %lld tokens x %lld hidden x %lld vocab bf16 (tiles %lld x %lld)\n",
                static_cast<long long>(n), static_cast<long long>(d), static_cast<long long>(v),
                static_cast<long long>(o.token_tile), static_cast<long long>(o.vocab_tile));
    std::printf("  dense cuBLAS bf16 GEMM here: %.0f TFLOP/s = %.1f %% of the %.0f TFLOP/s dense peak\n", gemm_tflops,
                100.0 * gemm_tflops / spec_tflops, spec_tflops);
    std::printf("  forward   %.2f ms  %.0f TFLOP/s = %.1f %% of dense peak (target >= 60 %%), %.1f %% of the GEMM here\n",
                fwd, flop / (fwd * 1e-3) / 1e12, 100.0 * flop / (fwd * 1e-3) / 1e12 / spec_tflops,
                100.0 * flop / (fwd * 1e-3) / 1e12 / gemm_tflops);
    std::printf("  fwd + bwd %.2f ms  %.0f TFLOP/s counted as 8·N·D·V = %.1f %% of dense peak\n", fwd + bwd,
                4 * flop / ((fwd + bwd) * 1e-3) / 1e12, 100.0 * 4 * flop / ((fwd + bwd) * 1e-3) / 1e12 / spec_tflops);
    std::printf("  workspace fwd %.1f MB, bwd %.1f MB vs %.1f MB of bf16 logits: 1/%.0f and 1/%.0f (target <= 1/20)\n",
                static_cast<double>(fws.bytes) / 1e6, static_cast<double>(bws.bytes) / 1e6,
                static_cast<double>(logits_bytes) / 1e6, static_cast<double>(logits_bytes) / static_cast<double>(fws.bytes),
                static_cast<double>(logits_bytes) / static_cast<double>(bws.bytes));
    if (base > 0)
      std::printf("  baseline (cuBLAS into bf16 logits + logits-path forward): %.2f ms, %.1f MB extra; fused / baseline "
                  "time %.2f\n",
                  base, static_cast<double>(logits_bytes) / 1e6, fwd / base);
    std::printf("JSON {\"bench\": \"logprob_lm_head\", \"fwd_ms\": %.3f, \"bwd_ms\": %.3f, \"fwd_tflops\": %.1f, "
                "\"full_tflops\": %.1f, \"gemm_tflops\": %.1f, \"ws_fwd_bytes\": %zu, \"ws_bwd_bytes\": %zu, "
                "\"logits_bytes\": %zu, \"baseline_ms\": %.3f}\n",
                fwd, bwd, flop / (fwd * 1e-3) / 1e12, 4 * flop / ((fwd + bwd) * 1e-3) / 1e12, gemm_tflops, fws.bytes,
                bws.bytes, logits_bytes, base);
    cublasDestroy(cublas);
  }
  return 0;
}
