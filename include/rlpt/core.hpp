// SPDX-License-Identifier: Apache-2.0
//! @file
//! Umbrella for the core vocabulary: errors, dtypes, views, layouts, groups, statistics,
//! executors and DLPack import.
#pragma once

#include <rlpt/config.hpp>
#include <rlpt/core/dlpack.hpp>
#include <rlpt/core/dtype.hpp>
#include <rlpt/core/checked.hpp>
#include <rlpt/core/error.hpp>
#include <rlpt/core/executor.hpp>
#include <rlpt/core/groups.hpp>
#include <rlpt/core/layout.hpp>
#include <rlpt/core/nonfinite.hpp>
#include <rlpt/core/stats.hpp>
#include <rlpt/core/thread_pool.hpp>
#include <rlpt/core/views.hpp>
#include <rlpt/core/workspace.hpp>
#include <rlpt/version.hpp>
