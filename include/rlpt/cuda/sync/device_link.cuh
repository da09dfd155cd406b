// SPDX-License-Identifier: Apache-2.0
//! @file
//! The link interface with device payloads: `rlpt::sync::link` (link_info::payload_space ==
//! memory_space::device) plus what a device sender and receiver need from NCCL and CUDA IPC
//! transports. Meta blocks (protocol frames) travel over a host channel; payloads are device
//! memory, ordered with the link's stream:
//!
//! - sender: payload_buffer() returns device memory (a slot) that work enqueued on stream()
//!   may fill; send() publishes the slot to the peers after everything enqueued on stream()
//!   so far has finished.
//! - receiver: a received payload may be read by work enqueued on stream() after receive()
//!   returned; release() says that work is enqueued, and the slot goes back to the sender only
//!   after it has completed on the device (never before the consumer's copy finished).
//!
//! Every wait polls with a deadline (events, NCCL's async error state, the host channel); a
//! transport never blocks in a CUDA or NCCL call that could hang.
#pragma once

#include <rlpt/config.hpp>
#include <rlpt/core/error.hpp>
#include <rlpt/cuda/resources.cuh>
#include <rlpt/sync/link.hpp>

#include <cuda_runtime_api.h>

#include <cstddef>
#include <string>
#include <string_view>
#include <utility>

RLPT_NAMESPACE_BEGIN
namespace sync {

namespace detail {
// The CUDA resources of <rlpt/cuda/resources.cuh>, by their names in the sync internals; every
// device wait of weight sync raises rlpt.sync.timeout at its deadline.
using ::rlpt::detail::device_bytes;
using ::rlpt::detail::device_guard;
using ::rlpt::detail::driver;
using ::rlpt::detail::driver_api;
using ::rlpt::detail::event;
using ::rlpt::detail::pinned_bytes;
using ::rlpt::detail::stream;

template <class Poll>
void wait_event(cudaEvent_t e, deadline until, std::string_view where, std::string_view what, Poll&& poll) {
  ::rlpt::detail::wait_event(e, until, errors::sync::timeout, where, what, std::forward<Poll>(poll));
}
inline void wait_event(cudaEvent_t e, deadline until, std::string_view where, std::string_view what) {
  ::rlpt::detail::wait_event(e, until, errors::sync::timeout, where, what, [] {});
}
inline void wait_stream(event& e, cudaStream_t s, deadline until, std::string_view where, std::string_view what) {
  ::rlpt::detail::wait_stream(e, s, until, errors::sync::timeout, where, what);
}
} // namespace detail

class device_link : public link {
public:
  //! The stream that packs (sender) or consumes (receiver) payloads.
  [[nodiscard]] virtual cudaStream_t stream() const = 0;
  //! Sender: the receivers one send() reaches (0 for a single-rank NCCL group). Receiver: 1.
  [[nodiscard]] virtual std::size_t peers() const = 0;
  //! Sender: which peer the last received message came from.
  [[nodiscard]] virtual std::size_t last_peer() const = 0;
  //! A peer for error messages ("rank 2 (tcp 10.0.0.2:5555)").
  [[nodiscard]] virtual std::string peer_name(std::size_t peer) const = 0;
  //! Before an update: every peer is reachable and knows the payload slots (NCCL: the
  //! communicator exists, IPC: the importer has mapped the exported buffer).
  virtual void prepare(deadline until) = 0;
  //! Waits until every payload sent or received so far has been delivered and every slot is
  //! free again; rlpt.sync.timeout names the message still in flight.
  virtual void drain(deadline until) = 0;
  //! An update failed: make sure nothing in flight can hang (NCCL aborts a communicator with
  //! a pending collective) and forget the slots' state.
  virtual void fail(std::string_view why) noexcept = 0;
};

} // namespace sync
RLPT_NAMESPACE_END
