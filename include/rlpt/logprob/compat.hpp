// SPDX-License-Identifier: Apache-2.0
//! @file
//! Framework presets for the logprob family (placeholder replaced below).
#pragma once
#include <rlpt/logprob/options.hpp>
