// SPDX-License-Identifier: Apache-2.0
//! @file
//! Owned CUDA resources for host code that drives the device (device and pinned buffers,
//! events, streams, the current-device guard), the CUDA driver functions resolved at run time
//! with their status check, and the one way to wait: polling an event against a deadline,
//! never a blocking synchronise that could hang forever. The weight-sync transports use them.
#pragma once

#include <rlpt/config.hpp>
#include <rlpt/core/error.hpp>
#include <rlpt/cuda/error.cuh>

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <thread>
#include <utility>

RLPT_NAMESPACE_BEGIN
namespace detail {

//! The CUDA driver functions rlpt calls, resolved through the runtime
//! (cudaGetDriverEntryPointByVersion) instead of linking libcuda: executables that include
//! these headers start (and skip GPU work) on machines without a driver, and users link only
//! the CUDA runtime. Resolved once, on first use.
struct driver_api {
  decltype(&::cuDeviceGetAttribute) cuDeviceGetAttribute = nullptr;
  decltype(&::cuGetErrorName) cuGetErrorName = nullptr;
  decltype(&::cuGetErrorString) cuGetErrorString = nullptr;
  decltype(&::cuMemAddressFree) cuMemAddressFree = nullptr;
  decltype(&::cuMemAddressReserve) cuMemAddressReserve = nullptr;
  decltype(&::cuMemCreate) cuMemCreate = nullptr;
  decltype(&::cuMemExportToShareableHandle) cuMemExportToShareableHandle = nullptr;
  decltype(&::cuMemGetAddressRange) cuMemGetAddressRange = nullptr;
  decltype(&::cuMemGetAllocationGranularity) cuMemGetAllocationGranularity = nullptr;
  decltype(&::cuMemGetAllocationPropertiesFromHandle) cuMemGetAllocationPropertiesFromHandle = nullptr;
  decltype(&::cuMemImportFromShareableHandle) cuMemImportFromShareableHandle = nullptr;
  decltype(&::cuMemMap) cuMemMap = nullptr;
  decltype(&::cuMemRelease) cuMemRelease = nullptr;
  decltype(&::cuMemRetainAllocationHandle) cuMemRetainAllocationHandle = nullptr;
  decltype(&::cuMemSetAccess) cuMemSetAccess = nullptr;
  decltype(&::cuMemUnmap) cuMemUnmap = nullptr;
  decltype(&::cuPointerGetAttribute) cuPointerGetAttribute = nullptr;
};

template <class F> void load_driver_entry(const char* name, F& f) {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
#if CUDART_VERSION >= 12050
  const cudaError_t e = cudaGetDriverEntryPointByVersion(name, &p, 12000, cudaEnableDefault, &found);
#else // CUDA 12.0-12.4 runtimes: the unversioned query (deprecated from 12.5 on)
  const cudaError_t e = cudaGetDriverEntryPoint(name, &p, cudaEnableDefault, &found);
#endif
  RLPT_CHECK(e == cudaSuccess && found == cudaDriverEntryPointSuccess && p != nullptr, errors::cuda::error,
             "the CUDA driver entry point {} is not available ({}): is an NVIDIA driver (12.0 or newer) installed?",
             name, cudaGetErrorString(e));
  f = reinterpret_cast<F>(p);
}

[[nodiscard]] inline const driver_api& driver() {
  static const driver_api api = [] {
    driver_api a;
    load_driver_entry("cuDeviceGetAttribute", a.cuDeviceGetAttribute);
    load_driver_entry("cuGetErrorName", a.cuGetErrorName);
    load_driver_entry("cuGetErrorString", a.cuGetErrorString);
    load_driver_entry("cuMemAddressFree", a.cuMemAddressFree);
    load_driver_entry("cuMemAddressReserve", a.cuMemAddressReserve);
    load_driver_entry("cuMemCreate", a.cuMemCreate);
    load_driver_entry("cuMemExportToShareableHandle", a.cuMemExportToShareableHandle);
    load_driver_entry("cuMemGetAddressRange", a.cuMemGetAddressRange);
    load_driver_entry("cuMemGetAllocationGranularity", a.cuMemGetAllocationGranularity);
    load_driver_entry("cuMemGetAllocationPropertiesFromHandle", a.cuMemGetAllocationPropertiesFromHandle);
    load_driver_entry("cuMemImportFromShareableHandle", a.cuMemImportFromShareableHandle);
    load_driver_entry("cuMemMap", a.cuMemMap);
    load_driver_entry("cuMemRelease", a.cuMemRelease);
    load_driver_entry("cuMemRetainAllocationHandle", a.cuMemRetainAllocationHandle);
    load_driver_entry("cuMemSetAccess", a.cuMemSetAccess);
    load_driver_entry("cuMemUnmap", a.cuMemUnmap);
    load_driver_entry("cuPointerGetAttribute", a.cuPointerGetAttribute);
    return a;
  }();
  return api;
}

inline void check_cu(CUresult status, const char* expr, const char* file, int line) {
  if (RLPT_UNLIKELY(status != CUDA_SUCCESS)) {
    const char* name = nullptr;
    const char* text = nullptr;
    driver().cuGetErrorName(status, &name);
    driver().cuGetErrorString(status, &text);
    RLPT_FAIL(errors::cuda::error, "{} failed with {} ({}) at {}:{}", expr, name ? name : "?", text ? text : "?", file,
              line);
  }
}

} // namespace detail
RLPT_NAMESPACE_END

//! Throws rlpt::error if the CUDA driver call `expr` did not return CUDA_SUCCESS.
#define RLPT_CU_CHECK(expr) ::rlpt::detail::check_cu((expr), #expr, __FILE__, __LINE__)

RLPT_NAMESPACE_BEGIN
namespace detail {

//! Makes `device` current for a scope and restores the previous one.
class device_guard {
public:
  explicit device_guard(int device) {
    RLPT_CUDA_CHECK(cudaGetDevice(&prev_));
    if (device >= 0 && device != prev_)
      RLPT_CUDA_CHECK(cudaSetDevice(device));
    else
      prev_ = -1;
  }
  device_guard(const device_guard&) = delete;
  device_guard& operator=(const device_guard&) = delete;
  ~device_guard() {
    if (prev_ >= 0) static_cast<void>(cudaSetDevice(prev_));
  }

private:
  int prev_ = -1;
};

//! How a byte buffer is allocated: device memory (cudaMalloc) or pinned host memory
//! (cudaMallocHost, the only host memory an async copy may use).
struct device_alloc {
  static void* allocate(std::size_t n) {
    void* p = nullptr;
    RLPT_CUDA_CHECK(cudaMalloc(&p, n));
    return p;
  }
  static void release(void* p) noexcept { static_cast<void>(cudaFree(p)); }
};
struct pinned_alloc {
  static void* allocate(std::size_t n) {
    void* p = nullptr;
    RLPT_CUDA_CHECK(cudaMallocHost(&p, n));
    return p;
  }
  static void release(void* p) noexcept { static_cast<void>(cudaFreeHost(p)); }
};

//! Owned bytes from `Alloc`; empty until the first non-zero reserve.
template <class Alloc> class basic_bytes {
public:
  basic_bytes() = default;
  explicit basic_bytes(std::size_t n) { reserve(n); }
  basic_bytes(basic_bytes&& o) noexcept : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)) {}
  basic_bytes& operator=(basic_bytes&& o) noexcept {
    if (this != &o) {
      reset();
      p_ = std::exchange(o.p_, nullptr);
      n_ = std::exchange(o.n_, 0);
    }
    return *this;
  }
  ~basic_bytes() { reset(); }
  void reset() noexcept {
    if (p_ != nullptr) Alloc::release(p_);
    p_ = nullptr;
    n_ = 0;
  }
  //! Gives the memory up without freeing it (memory a transfer may still write into).
  [[nodiscard]] void* release() noexcept {
    n_ = 0;
    return std::exchange(p_, nullptr);
  }
  //! Grows to at least n bytes (contents are not kept).
  void reserve(std::size_t n) {
    if (n <= n_) return;
    reset();
    p_ = Alloc::allocate(n);
    n_ = n;
  }
  template <class T = std::byte> [[nodiscard]] T* get() const noexcept { return static_cast<T*>(p_); }
  [[nodiscard]] std::size_t size() const noexcept { return n_; }

private:
  void* p_ = nullptr;
  std::size_t n_ = 0;
};

//! cudaMalloc'd bytes.
using device_bytes = basic_bytes<device_alloc>;
//! cudaMallocHost'd (pinned) bytes: the only host memory an async copy may use.
using pinned_bytes = basic_bytes<pinned_alloc>;

class event {
public:
  event() { RLPT_CUDA_CHECK(cudaEventCreateWithFlags(&e_, cudaEventDisableTiming)); }
  event(const event&) = delete;
  event& operator=(const event&) = delete;
  event(event&& o) noexcept : e_(std::exchange(o.e_, nullptr)) {}
  ~event() {
    if (e_ != nullptr) static_cast<void>(cudaEventDestroy(e_));
  }
  [[nodiscard]] cudaEvent_t get() const noexcept { return e_; }
  void record(cudaStream_t s) { RLPT_CUDA_CHECK(cudaEventRecord(e_, s)); }

private:
  cudaEvent_t e_ = nullptr;
};

class stream {
public:
  stream() { RLPT_CUDA_CHECK(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking)); }
  stream(const stream&) = delete;
  stream& operator=(const stream&) = delete;
  ~stream() {
    if (s_ != nullptr) static_cast<void>(cudaStreamDestroy(s_));
  }
  [[nodiscard]] cudaStream_t get() const noexcept { return s_; }

private:
  cudaStream_t s_ = nullptr;
};

//! Polls `e` until it completes. `poll()` runs between queries (it may throw: a peer failed);
//! at `until` throws `timeout_id` "<where>: timed out <what>". Never blocks in CUDA.
template <class Poll>
void wait_event(cudaEvent_t e, std::chrono::steady_clock::time_point until, error_id timeout_id, std::string_view where,
                std::string_view what, Poll&& poll) {
  int spins = 0;
  for (;;) {
    const cudaError_t s = cudaEventQuery(e);
    if (s == cudaSuccess) return;
    if (s != cudaErrorNotReady)
      RLPT_FAIL(errors::cuda::error, "{}: {}: {} ({})", where, what, cudaGetErrorName(s), cudaGetErrorString(s));
    poll();
    if (std::chrono::steady_clock::now() >= until) RLPT_FAIL(timeout_id, "{}: timed out {}", where, what);
    if (++spins < 64)
      std::this_thread::yield();
    else
      std::this_thread::sleep_for(std::chrono::microseconds(spins < 1024 ? 20 : 200));
  }
}

//! Records `e` on `s` and waits for it (the stream's work so far is done), as wait_event.
inline void wait_stream(event& e, cudaStream_t s, std::chrono::steady_clock::time_point until, error_id timeout_id,
                        std::string_view where, std::string_view what) {
  e.record(s);
  wait_event(e.get(), until, timeout_id, where, what, [] {});
}

} // namespace detail
RLPT_NAMESPACE_END
