// SPDX-License-Identifier: Apache-2.0
//! @file
//! rlpt's version: the single source that CMake parses and code can test.
#pragma once

#define RLPT_VERSION_MAJOR (0)
#define RLPT_VERSION_MINOR (1)
#define RLPT_VERSION_PATCH (0)

//! MMmmpp: 0.1.0 is 100, 1.2.3 is 10203.
#define RLPT_VERSION (RLPT_VERSION_MAJOR * 10000 + RLPT_VERSION_MINOR * 100 + RLPT_VERSION_PATCH)

// Two different rlpt versions in one program violate the one-definition rule.
#if defined(RLPT_SEEN_VERSION) && RLPT_SEEN_VERSION != RLPT_VERSION
#warning "a different version of rlpt was already included in this translation unit"
#endif
#ifndef RLPT_SEEN_VERSION
#define RLPT_SEEN_VERSION RLPT_VERSION
#endif
