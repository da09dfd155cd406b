// SPDX-License-Identifier: Apache-2.0
// Compiled, not run: the objective's instruction-set clones as a user's -O2 build (CMake's
// RelWithDebInfo) gets them, with GCC's inlining of functions that are not force-inlined turned
// off, as the inliner may decide in a large TU. clone_check.cmake then reads the object: no lambda
// of a chunk stage may be left out of line (it would run the baseline target's code inside the
// clone: RLPT_INLINE_LAMBDA), and the AVX-512 clone's stages must be vectorised (RLPT_HOST_LOOP_ATTR).
#include <rlpt/objective.hpp>

rlpt::objective_result clone_check_evaluate(const rlpt::objective& obj, const rlpt::basic_objective_inputs<float>& in,
                                            const rlpt::basic_objective_grads<float>& grads);

rlpt::objective_result clone_check_evaluate(const rlpt::objective& obj, const rlpt::basic_objective_inputs<float>& in,
                                            const rlpt::basic_objective_grads<float>& grads) {
  return rlpt::evaluate(obj, in, grads);
}
