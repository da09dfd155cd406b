// SPDX-License-Identifier: Apache-2.0
//! @file
//! The one transport interface: an ordered, duplex message pipe whose messages are a small
//! host `meta` block plus an optional bulk `payload` byte range that the transport owns.
//!
//! The protocol (protocol.hpp) never allocates payload memory itself: it asks the link for a
//! payload buffer (blocking until a slot is free: that is the credit), packs a bucket into it,
//! then sends. On the other side the payload is a view into the link's slot, valid until
//! release(), which returns the credit, so a slot is never reused before the consumer is done
//! with it. Shared memory, TCP, in-process queues and safetensors files implement it; device
//! transports (NCCL, CUDA IPC) implement the same calls with device payload buffers and a
//! host channel for the meta blocks.
#pragma once

#include <rlpt/config.hpp>
#include <rlpt/core/error.hpp>
#include <rlpt/core/views.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>

RLPT_NAMESPACE_BEGIN
namespace sync {

//! Which end of a link this is.
enum class role : std::uint8_t { sender, receiver };

using clock = std::chrono::steady_clock;
//! Every blocking call takes an absolute deadline.
using deadline = clock::time_point;

[[nodiscard]] inline deadline after(std::chrono::nanoseconds d) { return clock::now() + d; }

//! A received message: views into the link's memory, valid until link::release().
struct message {
  std::span<const std::byte> meta;
  std::span<const std::byte> payload;
};

struct link_info {
  std::string name;                                //!< for error messages ("shm /rlpt-policy", "tcp 127.0.0.1:5555")
  bool duplex = true;                              //!< false: the peer never answers (the link answers for it)
  std::uint64_t max_payload = 0;                   //!< largest payload one message can carry
  memory_space payload_space = memory_space::host; //!< where payload buffers live
};

class link {
public:
  link() = default;
  link(const link&) = delete;
  link& operator=(const link&) = delete;
  virtual ~link() = default;

  [[nodiscard]] virtual link_info info() const = 0;

  //! A writable buffer of at least `bytes` for the next send(). Blocks until a slot is free;
  //! throws rlpt.sync.timeout at `until` and rlpt.sync.peer_lost if the peer is gone.
  virtual std::span<std::byte> payload_buffer(std::uint64_t bytes, deadline until) = 0;

  //! Sends `meta` and the first `payload_bytes` of the last payload_buffer() (0: no payload).
  //! Same errors as payload_buffer().
  virtual void send(std::span<const std::byte> meta, std::uint64_t payload_bytes, deadline until) = 0;

  //! The next message, or nullopt when none arrived by `until`. Throws rlpt.sync.peer_lost if
  //! the peer is gone and rlpt.sync.wire for a corrupt frame. Calls release() implicitly for
  //! a message still held.
  virtual std::optional<message> receive(deadline until) = 0;

  //! Done with the last received message: its slot goes back to the sender.
  virtual void release() = 0;
};

namespace detail {
//! Milliseconds to `until` for one poll(): at most 100, so that waits recheck their state.
[[nodiscard]] inline int ms_until(deadline until) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - clock::now()).count();
  return static_cast<int>(std::clamp<long long>(left, 0, 100));
}

[[noreturn]] inline void timeout(std::string_view where, std::string_view what) {
  RLPT_FAIL(errors::sync::timeout, "{}: timed out {}", where, what);
}
} // namespace detail

} // namespace sync
RLPT_NAMESPACE_END
