// SPDX-License-Identifier: Apache-2.0
//! @file
//! Umbrella for the advantage estimators: GRPO family (GRPO, Dr. GRPO, GPG, pass@k), RLOO, OPO,
//! REINFORCE++ (and -baseline), ReMax, GAE, GDPO multi-reward normalisation, masked (distributed)
//! whitening, reward shaping, token helpers and the framework presets in rlpt::compat.
#pragma once

#include <rlpt/advantage/common.hpp>
#include <rlpt/advantage/compat.hpp>
#include <rlpt/advantage/gae.hpp>
#include <rlpt/advantage/gigpo.hpp>
#include <rlpt/advantage/grpo.hpp>
#include <rlpt/advantage/multi_reward.hpp>
#include <rlpt/advantage/opo.hpp>
#include <rlpt/advantage/reinforce.hpp>
#include <rlpt/advantage/remax.hpp>
#include <rlpt/advantage/rloo.hpp>
#include <rlpt/advantage/shaping.hpp>
#include <rlpt/advantage/tokens.hpp>
#include <rlpt/advantage/whiten.hpp>
