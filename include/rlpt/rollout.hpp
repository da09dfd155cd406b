// SPDX-License-Identifier: Apache-2.0
//! @file
//! Umbrella for the rollout family: trajectory records, columnar batches, the group-aware
//! buffer and its filters, checkpoints, rank balancing, micro-batch packing, presets.
#pragma once

#include <rlpt/config.hpp>
#include <rlpt/rollout/balance.hpp>
#include <rlpt/rollout/batch.hpp>
#include <rlpt/rollout/buffer.hpp>
#include <rlpt/rollout/compat.hpp>
#include <rlpt/rollout/filters.hpp>
#include <rlpt/rollout/packing.hpp>
#include <rlpt/rollout/record.hpp>
#if __has_include(<xxhash.h>)
#include <rlpt/rollout/checkpoint.hpp> // needs libxxhash headers (scripts/deps)
#endif
