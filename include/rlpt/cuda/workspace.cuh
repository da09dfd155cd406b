// SPDX-License-Identifier: Apache-2.0
//! @file
//! The device entry points' workspace: rlpt/core/workspace.hpp (host code carves with it too).
#pragma once

#include <rlpt/core/workspace.hpp>
