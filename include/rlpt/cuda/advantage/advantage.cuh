// SPDX-License-Identifier: Apache-2.0
//! @file
//! Umbrella for the device advantage estimators: GRPO / RLOO group normalisation, GAE,
//! discounted returns, REINFORCE++, masked whitening and (with NCCL) its distributed merge.
#pragma once

#include <rlpt/cuda/advantage/detail.cuh>
#include <rlpt/cuda/advantage/gae.cuh>
#include <rlpt/cuda/advantage/grpo.cuh>
#include <rlpt/cuda/advantage/nccl.cuh>
#include <rlpt/cuda/advantage/whiten.cuh>
