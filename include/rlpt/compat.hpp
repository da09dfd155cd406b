// SPDX-License-Identifier: Apache-2.0
//! @file
//! Every framework preset in one include: rlpt::compat::{verl, trl, openrlhf, areal, slime}
//! for advantages, objectives, logprob scoring, the rollout data path, staleness control and
//! weight sync. Each preset takes the framework's own option names and returns plain rlpt
//! option structs; options a preset cannot reproduce are errors, never approximations.
#pragma once

#include <rlpt/advantage/compat.hpp>
#include <rlpt/logprob/compat.hpp>
#include <rlpt/objective/compat.hpp>
#include <rlpt/rollout/compat.hpp>
#include <rlpt/staleness/compat.hpp>
#include <rlpt/sync/compat.hpp>
