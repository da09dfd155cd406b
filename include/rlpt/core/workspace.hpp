// SPDX-License-Identifier: Apache-2.0
//! @file
//! Caller-owned workspace and the two-phase size query every device entry point uses; host code
//! carves its own temporaries with the same workspace_carver.
//!
//! rlpt allocates nothing behind the caller's back. A device entry point that needs scratch
//! memory takes a `workspace`; called with `ws.data == nullptr` it only writes the bytes it
//! needs into `ws.bytes` and returns, exactly like CUB's d_temp_storage convention:
//!
//!     rlpt::workspace ws;                      // size query
//!     rlpt::some_op(ws, inputs..., stream);
//!     cudaMallocAsync(&ws.data, ws.bytes, stream);
//!     rlpt::some_op(ws, inputs..., stream);    // real run, capturable in a CUDA graph
#pragma once

#include <rlpt/config.hpp>
#include <rlpt/core/error.hpp>

#include <cstddef>
#include <cstdint>

RLPT_NAMESPACE_BEGIN

struct workspace {
  void* data = nullptr;  //!< null: size query
  std::size_t bytes = 0; //!< in: bytes available at data; out (size query): bytes needed

  [[nodiscard]] bool is_size_query() const noexcept { return data == nullptr; }
};

namespace detail {

//! Carves aligned sub-buffers out of a workspace. The same sequence of take() calls gives the
//! required size in a size query and the pointers in a real run.
class workspace_carver {
public:
  explicit workspace_carver(workspace& ws) noexcept : ws_(ws) {}

  template <class T> T* take(std::size_t count, std::size_t align = 256) {
    offset_ = (offset_ + align - 1) / align * align;
    T* p = ws_.data ? reinterpret_cast<T*>(static_cast<char*>(ws_.data) + offset_) : nullptr;
    offset_ += count * sizeof(T);
    return p;
  }

  //! Size query: stores the need and returns true (the caller returns). Real run: checks that
  //! the workspace is large enough and returns false.
  bool finish_size_query() {
    if (ws_.data == nullptr) {
      ws_.bytes = offset_;
      return true;
    }
    RLPT_CHECK(ws_.bytes >= offset_, errors::cuda::workspace_too_small,
               "workspace has {} bytes, this call needs {} (run the size query first)", ws_.bytes, offset_);
    return false;
  }

private:
  workspace& ws_;
  std::size_t offset_ = 0;
};

} // namespace detail
RLPT_NAMESPACE_END
