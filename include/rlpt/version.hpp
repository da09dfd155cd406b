// SPDX-License-Identifier: Apache-2.0
//! @file
//! rlpt's version: the single source that CMake parses and code can test.
#pragma once

#define RLPT_VERSION_MAJOR (0)
#define RLPT_VERSION_MINOR (2)
#define RLPT_VERSION_PATCH (0)

//! The inline namespace holding every declaration (see RLPT_NAMESPACE_BEGIN in config.hpp).
//! It changes with every version whose ABI changes: the minor version while rlpt is 0.x.
#define RLPT_ABI_NAMESPACE v0_2

//! MMmmpp: 0.1.0 is 100, 1.2.3 is 10203.
#define RLPT_VERSION (RLPT_VERSION_MAJOR * 10000 + RLPT_VERSION_MINOR * 100 + RLPT_VERSION_PATCH)

// Two rlpt versions in one translation unit still clash (macros, include guards); across shared
// libraries they do not (each has its own RLPT_ABI_NAMESPACE).
#if defined(RLPT_SEEN_VERSION) && RLPT_SEEN_VERSION != RLPT_VERSION
#warning "a different version of rlpt was already included in this translation unit"
#endif
#ifndef RLPT_SEEN_VERSION
#define RLPT_SEEN_VERSION RLPT_VERSION
#endif
