// SPDX-License-Identifier: Apache-2.0
//! @file
//! Umbrella for rlpt's device blocks (needs nvcc). Includes the host umbrella too.
#pragma once

#include <rlpt/cuda/advantage/advantage.cuh>
#include <rlpt/cuda/device.cuh>
#include <rlpt/cuda/error.cuh>
#include <rlpt/cuda/logprob.cuh>
#include <rlpt/cuda/objective/evaluate.cuh>
#include <rlpt/cuda/sync/sync.cuh>
#include <rlpt/cuda/workspace.cuh>
#include <rlpt/rlpt.hpp>
