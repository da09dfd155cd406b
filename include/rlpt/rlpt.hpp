// SPDX-License-Identifier: Apache-2.0
//! @file
//! Umbrella for every rlpt block that builds without CUDA. Device blocks: <rlpt/cuda/rlpt.cuh>.
#pragma once

#include <rlpt/advantage.hpp>
#include <rlpt/core.hpp>
#include <rlpt/logprob.hpp>
#include <rlpt/objective.hpp>
#include <rlpt/rollout.hpp>
#include <rlpt/staleness.hpp>
#include <rlpt/sync.hpp>
