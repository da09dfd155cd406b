// SPDX-License-Identifier: Apache-2.0
// Built when the package is compiled without CUDA kernels.
namespace rlpt_py {
bool cuda_kernels_built() { return false; }
} // namespace rlpt_py
