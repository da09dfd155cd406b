// SPDX-License-Identifier: Apache-2.0
//! @file
//! On-policy distillation: a per-token advantage from the reverse KL between the student and
//! one or several teachers, A_t += coef * (sum_k w_k teacher_logp_k[t] - student_logp[t]) =
//! -coef * (reverse-KL sample estimate) for a single teacher. It composes with any policy term
//! (policy_gradient for plain distillation, ppo_clip for a clipped update) and adds to the
//! reward advantages when those are given too. The advantage is data: it is not differentiated.
#pragma once

#include <rlpt/config.hpp>

#include <cstdint>
#include <span>

RLPT_NAMESPACE_BEGIN

//! Which log-probs stand for the student in the reverse KL.
enum class student_logp : std::uint8_t {
  behaviour, //!< the sampler's log-probs (behav_logp): the distribution the tokens came from
  proximal,  //!< old_logp
  current    //!< the current logp, detached
};

struct distillation {
  //! 0 (the default) turns distillation off; 1 is the plain reverse-KL advantage.
  double coef = 0.0;
  //! One weight per teacher row of objective_inputs::teacher_logp; empty: 1/K each.
  std::span<const double> teacher_weights{};
  student_logp student = student_logp::behaviour;
};

namespace detail {
inline constexpr int max_teachers = 16;
} // namespace detail

RLPT_NAMESPACE_END
