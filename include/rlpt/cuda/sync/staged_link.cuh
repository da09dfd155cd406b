// SPDX-License-Identifier: Apache-2.0
//! @file
//! Device payloads over any host link (TCP, UCX, shared memory): the device sender and receiver
//! (protocol.cuh) across machines whose transport moves host memory. The sender copies each
//! packed bucket from its device slot into pinned host memory and sends it over the host link;
//! the receiver copies each arriving payload into its device slot on the link's stream. Frames,
//! checksums (computed on the device by the sender's pack and verified there by the receiver),
//! authentication and timeouts are the host link's and the protocol's, unchanged.
//!
//! The cost is two PCIe copies per bucket (device to host, host to device) on the link's
//! stream, serialised with the send: a transport that reads device memory itself (UCX or NIXL
//! built with CUDA, GPUDirect RDMA) avoids both.
#pragma once

#include <rlpt/config.hpp>
#include <rlpt/core/error.hpp>
#include <rlpt/cuda/sync/device_link.cuh>
#include <rlpt/sync/link.hpp>

#include <cuda_runtime_api.h>
#include <fmt/core.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <string>

RLPT_NAMESPACE_BEGIN
namespace sync {

struct staged_options {
  //! CUDA device of this side; -1: the current device.
  int device = -1;
};

class staged_link final : public device_link {
public:
  //! Borrows `host` (one end of a host link: the sender's or the receiver's) for its lifetime.
  explicit staged_link(link& host, staged_options o = {}) : host_(host), o_(o) {
    const link_info hi = host_.info();
    RLPT_CHECK(hi.payload_space == memory_space::host, errors::sync::bad_link,
               "staged link: {} already moves device payloads", hi.name);
    if (o_.device < 0) RLPT_CUDA_CHECK(cudaGetDevice(&o_.device));
    detail::device_guard g(o_.device);
    where_ = rlpt::detail::format("{} (device payloads staged through host memory)", hi.name);
    work_ = std::make_unique<detail::stream>();
    copied_ = std::make_unique<detail::event>();
  }

  staged_link(const staged_link&) = delete;
  staged_link& operator=(const staged_link&) = delete;
  ~staged_link() override {
    try { // the pinned and device buffers must outlive the copies in flight
      detail::device_guard g(o_.device);
      static_cast<void>(cudaStreamSynchronize(work_->get()));
    } catch (...) {}
  }

  [[nodiscard]] link_info info() const override {
    link_info i = host_.info();
    i.name = where_;
    i.payload_space = memory_space::device;
    return i;
  }
  [[nodiscard]] cudaStream_t stream() const override { return work_->get(); }
  [[nodiscard]] std::size_t peers() const override { return 1; }
  [[nodiscard]] std::size_t last_peer() const override { return 0; }
  [[nodiscard]] std::string peer_name(std::size_t) const override {
    return rlpt::detail::format("the peer of {}", host_.info().name);
  }
  void prepare(deadline) override {}
  void fail(std::string_view) noexcept override {}

  //! Sender: the device slot the next send() carries (filled by work on stream()). send() has
  //! copied the previous payload out before it returned, so one slot is enough.
  std::span<std::byte> payload_buffer(std::uint64_t bytes, deadline) override {
    const std::uint64_t most = host_.info().max_payload;
    RLPT_CHECK(bytes <= most, errors::sync::too_large, "{}: payload of {} bytes exceeds the host link's {}", where_,
               bytes, most);
    detail::device_guard g(o_.device);
    slot_.reserve(static_cast<std::size_t>(bytes));
    return {slot_.get(), static_cast<std::size_t>(bytes)};
  }

  //! Sender: copies the slot out (after everything enqueued on stream()) and sends it; a
  //! receiver's replies carry no payload and go straight through.
  void send(std::span<const std::byte> meta, std::uint64_t payload_bytes, deadline until) override {
    if (payload_bytes > 0) {
      RLPT_CHECK(payload_bytes <= slot_.size(), errors::sync::bad_link,
                 "{}: send of {} payload bytes without a payload_buffer() of that size", where_, payload_bytes);
      const auto n = static_cast<std::size_t>(payload_bytes);
      {
        detail::device_guard g(o_.device);
        staging_.reserve(n);
        RLPT_CUDA_CHECK(cudaMemcpyAsync(staging_.get(), slot_.get(), n, cudaMemcpyDeviceToHost, work_->get()));
        copied_->record(work_->get());
        detail::wait_event(copied_->get(), until, where_, "copying a payload out of device memory");
      }
      const std::span<std::byte> out = host_.payload_buffer(payload_bytes, until);
      std::memcpy(out.data(), staging_.get(), n);
    }
    host_.send(meta, payload_bytes, until);
  }

  //! Receiver: the next message; its payload is copied into the device slot on stream(), so
  //! work enqueued there after this returns reads it. Sender: the next reply.
  std::optional<message> receive(deadline until) override {
    release();
    std::optional<message> m = host_.receive(until);
    if (!m || m->payload.empty()) return m;
    const std::size_t n = m->payload.size();
    detail::device_guard g(o_.device);
    // The previous payload's copy has left the pinned buffer before it is overwritten; the
    // slot itself is overwritten in stream order, after the work that read it.
    detail::wait_event(copied_->get(), until, where_, "copying the previous payload into device memory");
    staging_.reserve(n);
    slot_.reserve(n);
    std::memcpy(staging_.get(), m->payload.data(), n);
    RLPT_CUDA_CHECK(cudaMemcpyAsync(slot_.get(), staging_.get(), n, cudaMemcpyHostToDevice, work_->get()));
    copied_->record(work_->get());
    return message{m->meta, {slot_.get(), n}};
  }

  void release() override { host_.release(); }

  //! Every copy enqueued so far (and the work before it on stream()) has finished.
  void drain(deadline until) override {
    detail::device_guard g(o_.device);
    detail::event done;
    done.record(work_->get());
    detail::wait_event(done.get(), until, where_, "waiting for the payload copies");
  }

private:
  link& host_;
  staged_options o_;
  std::string where_;
  std::unique_ptr<detail::stream> work_;
  std::unique_ptr<detail::event> copied_; //!< the last copy between the slot and the pinned buffer
  detail::device_bytes slot_;
  detail::pinned_bytes staging_;
};

} // namespace sync
RLPT_NAMESPACE_END
