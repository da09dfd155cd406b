// SPDX-License-Identifier: Apache-2.0
//! @file
//! NCCL status checking: a failed call becomes an rlpt::error naming the call and NCCL's reason.
#pragma once

#include <rlpt/config.hpp>
#include <rlpt/core/error.hpp>

#include <nccl.h>

RLPT_NAMESPACE_BEGIN
namespace detail {

inline void check_nccl(ncclResult_t status, const char* expr, const char* file, int line) {
  if (RLPT_UNLIKELY(status != ncclSuccess))
    RLPT_FAIL(errors::nccl::error, "{} failed with {} ({}) at {}:{}", expr, static_cast<int>(status),
              ncclGetErrorString(status), file, line);
}

} // namespace detail
RLPT_NAMESPACE_END

//! Throws rlpt::error if the NCCL call `expr` did not return ncclSuccess.
#define RLPT_NCCL_CHECK(expr) ::rlpt::detail::check_nccl((expr), #expr, __FILE__, __LINE__)
