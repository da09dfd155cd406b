// SPDX-License-Identifier: Apache-2.0
//! @file
//! Umbrella for staleness-aware sampling: the version clock, the admission gate, selection
//! policies and starvation reports, token-level staleness masks, partial rollouts, the
//! proximal-policy approximation, metrics, framework presets, and the rollout-buffer adapter.
#pragma once

#include <rlpt/staleness/buffer.hpp>
#include <rlpt/staleness/checkpoint.hpp>
#include <rlpt/staleness/clock.hpp>
#include <rlpt/staleness/compat.hpp>
#include <rlpt/staleness/gate.hpp>
#include <rlpt/staleness/metrics.hpp>
#include <rlpt/staleness/partial.hpp>
#include <rlpt/staleness/proximal.hpp>
#include <rlpt/staleness/selection.hpp>
#include <rlpt/staleness/token_mask.hpp>
