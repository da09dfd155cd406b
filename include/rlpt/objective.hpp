// SPDX-License-Identifier: Apache-2.0
//! @file
//! Umbrella for the objective family: policy terms, off-policy corrections, KL, entropy and
//! value terms, distillation, aggregation, the composable rlpt::objective with rlpt::evaluate,
//! and the framework presets in rlpt::compat.
#pragma once

#include <rlpt/objective/aggregate.hpp>
#include <rlpt/objective/compat.hpp>
#include <rlpt/objective/correction.hpp>
#include <rlpt/objective/distill.hpp>
#include <rlpt/objective/entropy.hpp>
#include <rlpt/objective/evaluate.hpp>
#include <rlpt/objective/inputs.hpp>
#include <rlpt/objective/kl.hpp>
#include <rlpt/objective/m2po.hpp>
#include <rlpt/objective/policy.hpp>
#include <rlpt/objective/value.hpp>
