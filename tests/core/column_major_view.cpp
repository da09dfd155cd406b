// SPDX-License-Identifier: Apache-2.0
// Must not compile (tests/core/CMakeLists.txt checks the message): a column-major Eigen matrix
// read as rlpt's row-major data, as a 1-D view or (RLPT_VIEW2D) as a view2d.
#include <rlpt/core/views.hpp>

#include <Eigen/Core>

int main() {
  Eigen::MatrixXf x(3, 4);
#ifdef RLPT_VIEW2D
  const rlpt::view2d<const float> v = x;
#else
  const rlpt::view<const float> v = x;
#endif
  return v.data() == nullptr;
}
