// SPDX-License-Identifier: Apache-2.0
// Owning device buffer for GPU tests and benchmarks: upload a host vector, hand out device
// views, download after the device finished (get() synchronises: tests compare afterwards).
#pragma once

#include <rlpt/core/views.hpp>
#include <rlpt/cuda/error.cuh>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <vector>

namespace rlpt::test {

template <class T> class device_buffer {
public:
  explicit device_buffer(std::size_t n) : n_(n) {
    RLPT_CUDA_CHECK(cudaMalloc(&p_, std::max<std::size_t>(n, 1) * sizeof(T)));
  }
  explicit device_buffer(const std::vector<T>& host) : device_buffer(host.size()) {
    if (n_ != 0) RLPT_CUDA_CHECK(cudaMemcpy(p_, host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice));
  }
  device_buffer(const device_buffer&) = delete;
  device_buffer& operator=(const device_buffer&) = delete;
  ~device_buffer() { cudaFree(p_); }

  [[nodiscard]] std::vector<T> get() const {
    std::vector<T> h(n_);
    RLPT_CUDA_CHECK(cudaDeviceSynchronize());
    if (n_ != 0) RLPT_CUDA_CHECK(cudaMemcpy(h.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }
  [[nodiscard]] T* data() const { return p_; }
  [[nodiscard]] std::size_t size() const { return n_; }
  [[nodiscard]] device_view<T> view() const { return {p_, static_cast<index_t>(n_)}; }
  [[nodiscard]] device_view<const T> cview() const { return {p_, static_cast<index_t>(n_)}; }

private:
  T* p_ = nullptr;
  std::size_t n_ = 0;
};

} // namespace rlpt::test
