// SPDX-License-Identifier: Apache-2.0
#include <rlpt/core/dlpack.hpp>

#include "support/errors.hpp"

#include <vector>

#if RLPT_HAS_DLPACK()

namespace {

// A DLTensor over a caller buffer, as torch.utils.dlpack would hand it over.
struct fake_tensor {
  std::vector<std::int64_t> shape;
  std::vector<std::int64_t> strides;
  DLTensor t{};

  fake_tensor(void* data, DLDataType dtype, std::vector<std::int64_t> shp, std::vector<std::int64_t> str = {})
      : shape(std::move(shp)), strides(std::move(str)) {
    t.data = data;
    t.device = {kDLCPU, 0};
    t.ndim = static_cast<std::int32_t>(shape.size());
    t.dtype = dtype;
    t.shape = shape.data();
    t.strides = strides.empty() ? nullptr : strides.data();
    t.byte_offset = 0;
  }
};

constexpr DLDataType f32{kDLFloat, 32, 1};

} // namespace

TEST_CASE("dlpack: valid 1-D and 2-D tensors become views over the same memory") {
  std::vector<float> buf(24);
  fake_tensor v(buf.data(), f32, {24});
  const auto a = rlpt::from_dlpack<float>(v.t, "rewards");
  CHECK(a.data() == buf.data());
  CHECK(a.size() == 24);

  fake_tensor m(buf.data(), f32, {3, 5}, {8, 1});
  const auto b = rlpt::from_dlpack_2d<const float>(m.t, "logprobs");
  CHECK(b.rows() == 3);
  CHECK(b.cols() == 5);
  CHECK(b.row_stride() == 8);

  fake_tensor off(buf.data(), f32, {2, 4});
  off.t.byte_offset = 8; // two floats in
  CHECK(rlpt::from_dlpack_2d<float>(off.t).data() == buf.data() + 2);

  fake_tensor empty(nullptr, f32, {0});
  CHECK(rlpt::from_dlpack<float>(empty.t).empty());

  std::vector<std::uint8_t> mask(4);
  fake_tensor boolean(mask.data(), DLDataType{6, 8, 1}, {4}); // kDLBool (DLPack >= 0.8)
  CHECK(rlpt::from_dlpack<std::uint8_t>(boolean.t, "mask").size() == 4);
}

TEST_CASE("dlpack: every producer mistake is rejected with what and why") {
  std::vector<float> buf(64);

  fake_tensor gpu(buf.data(), f32, {4});
  gpu.t.device = {kDLCUDA, 0};
  RLPT_CHECK_ERROR(rlpt::from_dlpack<float>(gpu.t, "rewards"), "rlpt.dlpack.device", "rewards lives on device 'cuda'",
                   "host view");
  fake_tensor cpu(buf.data(), f32, {4});
  RLPT_CHECK_ERROR((rlpt::from_dlpack<float, rlpt::memory_space::device>(cpu.t, "rewards")), "rlpt.dlpack.device",
                   "'cpu'", "CUDA device view");

  fake_tensor f16t(buf.data(), DLDataType{kDLFloat, 16, 1}, {4});
  RLPT_CHECK_ERROR(rlpt::from_dlpack<float>(f16t.t, "values"), "rlpt.dlpack.dtype", "values has dtype float16",
                   "expected f32");
  fake_tensor lanes(buf.data(), DLDataType{kDLFloat, 32, 4}, {4});
  RLPT_CHECK_ERROR(rlpt::from_dlpack<float>(lanes.t), "rlpt.dlpack.dtype", "float32x4");

  fake_tensor rank(buf.data(), f32, {4, 4});
  RLPT_CHECK_ERROR(rlpt::from_dlpack<float>(rank.t, "rewards"), "rlpt.dlpack.ndim",
                   "rewards has 2 dimensions, expected 1");

  fake_tensor strided(buf.data(), f32, {4}, {2});
  RLPT_CHECK_ERROR(rlpt::from_dlpack<float>(strided.t), "rlpt.dlpack.strides", "stride 2, expected 1");

  fake_tensor transposed(buf.data(), f32, {4, 8}, {1, 4});
  RLPT_CHECK_ERROR(rlpt::from_dlpack_2d<float>(transposed.t, "logits"), "rlpt.dlpack.strides",
                   "logits has column stride 4");
  fake_tensor overlap(buf.data(), f32, {4, 8}, {4, 1});
  RLPT_CHECK_ERROR(rlpt::from_dlpack_2d<float>(overlap.t), "rlpt.dlpack.strides", "row stride 4", "8 columns");

  fake_tensor misaligned(buf.data(), f32, {4});
  misaligned.t.byte_offset = 2;
  RLPT_CHECK_ERROR(rlpt::from_dlpack<float>(misaligned.t), "rlpt.dlpack.alignment", "byte_offset 2");
  fake_tensor unaligned_ptr(reinterpret_cast<char*>(buf.data()) + 1, f32, {4});
  RLPT_CHECK_ERROR(rlpt::from_dlpack<float>(unaligned_ptr.t), "rlpt.dlpack.alignment", "not aligned to 4 bytes");

  fake_tensor null(nullptr, f32, {4});
  RLPT_CHECK_ERROR(rlpt::from_dlpack<float>(null.t, "rewards"), "rlpt.dlpack.null", "rewards has 4 elements");

  fake_tensor negative(buf.data(), f32, {-3});
  RLPT_CHECK_ERROR(rlpt::from_dlpack<float>(negative.t), "rlpt.dlpack.shape", "negative extent -3");
}

#else
TEST_CASE("dlpack import is disabled in this build (no <dlpack/dlpack.h>)") { CHECK(!RLPT_HAS_DLPACK()); }
#endif
