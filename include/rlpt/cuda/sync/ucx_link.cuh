// SPDX-License-Identifier: Apache-2.0
//! @file
//! Device payloads over UCX, without a copy through host memory: the UCX transport of
//! <rlpt/sync/ucx.hpp> (its frames, HELLO exchange, authentication, ordering and peer-loss
//! reports, unchanged) with each payload sent from and received into device memory. UCX picks
//! the path per peer: GPUDirect RDMA where the NIC and driver allow it, CUDA IPC between GPUs
//! of one host, cuda_copy staging otherwise. It needs a UCX built with CUDA (PyPI's
//! libucx-cu13; Debian's libucx has no CUDA transports): the constructor checks and refuses
//! with rlpt.sync.ucx. Component `ucx` together with `cuda`.
//!
//! - sender: one device slot. send() waits (by its deadline) for the work enqueued on stream(),
//!   copies the meta block in front of the payload, and sends both as one block of device
//!   memory; it returns once the receiver has pulled it, so the slot is free again.
//! - receiver: `slots` device slots. A frame's data is pulled into a free slot (the payload
//!   after the meta block starts 256-byte aligned) and the meta block is copied back to the
//!   host, where its checksum and tag are checked. A frame waits in UCX (its sender's send
//!   waiting with it) until a slot is free: a slot is free again once the work that release()
//!   followed on stream() has run.
//!
//! Authentication: frame tags under integrity::control only (they cover header and meta block,
//! hence every piece's digest in the manifest, never payload bytes, which the host does not
//! read); integrity::full is refused. Payload bytes are checked by the device protocol's wsum64
//! piece digests, which catch corruption, not a forger: where payloads need a MAC, use
//! staged_link over a host link with integrity::full (docs/sync.md).
#pragma once

#include <rlpt/config.hpp>
#include <rlpt/core/error.hpp>
#include <rlpt/cuda/sync/device_link.cuh>
#include <rlpt/sync/ucx.hpp>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

RLPT_NAMESPACE_BEGIN
namespace sync {

struct ucx_device_options {
  //! CUDA device of this side; -1: the current device.
  int device = -1;
  //! Receiver: device slots frames are pulled into (one being read, one filling).
  std::size_t slots = 2;
};

namespace detail {
//! The device memory of a ucx_device_link: the sender's slot, the receiver's slots and the
//! copies of meta blocks between them and the host.
class ucx_cuda_memory final : public ucx_payload_slots {
public:
  explicit ucx_cuda_memory(std::size_t slots) : max_slots_(slots) {}
  [[nodiscard]] ucs_memory_type_t memory_type() const noexcept override { return UCS_MEMORY_TYPE_CUDA; }
  ~ucx_cuda_memory() override {
    try { // the work reading the slots must end before they are freed
      if (work_ != nullptr) {
        device_guard g(device_);
        static_cast<void>(cudaStreamSynchronize(work_->get()));
      }
    } catch (...) {}
    // Slots still taken by a receive UCX did not finish are left allocated: it may write there.
    for (auto& s : slots_)
      if (s.state == slot::taken) static_cast<void>(s.bytes.release());
  }

  //! CUDA resources, made after the UCX transport checked that UCX moves device memory.
  void open(int device, std::string where) {
    device_ = device;
    where_ = std::move(where);
    device_guard g(device_);
    work_ = std::make_unique<stream>();
    copies_ = std::make_unique<stream>();
    copied_ = std::make_unique<event>();
  }

  [[nodiscard]] cudaStream_t work() const noexcept { return work_->get(); }

  std::byte* send_slot(std::size_t bytes) override {
    device_guard g(device_);
    tx_.reserve(bytes);
    return tx_.get();
  }
  std::byte* spill(std::size_t bytes) override {
    device_guard g(device_);
    spill_.reserve(bytes);
    return spill_.get();
  }
  void ready(deadline until) override {
    device_guard g(device_);
    wait_stream(*copied_, work_->get(), until, where_, "packing a payload");
  }
  void copy(void* dst, const void* src, std::size_t n, deadline until) override {
    if (n == 0) return;
    device_guard g(device_);
    RLPT_CUDA_CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault, copies_->get()));
    wait_stream(*copied_, copies_->get(), until, where_, "copying a frame between host and device memory");
  }

  std::byte* take(std::size_t bytes) override {
    device_guard g(device_);
    slot* pick = nullptr;
    for (auto& s : slots_) {
      if (s.state == slot::reading) {
        const cudaError_t e = cudaEventQuery(s.read->get());
        if (e == cudaErrorNotReady) continue;
        RLPT_CUDA_CHECK(e);
        s.state = slot::free;
      }
      if (s.state == slot::free && s.bytes.size() >= bytes && (pick == nullptr || s.bytes.size() < pick->bytes.size()))
        pick = &s;
    }
    if (pick == nullptr && slots_.size() < max_slots_) pick = &slots_.emplace_back();
    if (pick == nullptr) { // a free slot too small for this frame: it grows
      const auto it = std::find_if(slots_.begin(), slots_.end(), [](const slot& s) { return s.state == slot::free; });
      if (it == slots_.end()) return nullptr;
      pick = &*it;
    }
    pick->bytes.reserve(bytes);
    if (pick->read == nullptr) pick->read = std::make_unique<event>();
    pick->state = slot::taken;
    return pick->bytes.get();
  }

  void give_back(std::byte* p) noexcept override {
    for (auto& s : slots_)
      if (s.state == slot::taken && s.bytes.get() == p) {
        try {
          device_guard g(device_);
          s.read->record(work_->get());
          s.state = slot::reading;
        } catch (...) {} // the CUDA context failed: the slot stays taken, never reused
        return;
      }
  }

  //! Every slot's reader has finished (by `until`).
  void drain(deadline until) {
    device_guard g(device_);
    event done;
    wait_stream(done, work_->get(), until, where_, "waiting for the work reading received payloads");
  }

private:
  struct slot {
    enum state_t : std::uint8_t { free, taken, reading };
    device_bytes bytes;
    std::unique_ptr<event> read; // recorded on the work stream by give_back
    state_t state = free;
  };

  std::size_t max_slots_;
  int device_ = 0;
  std::string where_;
  std::unique_ptr<stream> work_, copies_;
  std::unique_ptr<event> copied_;
  device_bytes tx_, spill_;
  std::vector<slot> slots_; // at most max_slots_; a slot's device memory never moves
};
} // namespace detail

class ucx_device_link final : public device_link {
public:
  //! `o` as for ucx_transport; with `o.auth`, `o.tags` must be integrity::control.
  ucx_device_link(ucx_options o, role r, ucx_device_options d = {})
      : memory_(std::max<std::size_t>(d.slots, 1)), device_(d.device) {
    ucx_.emplace(std::move(o), r, memory_); // refuses a UCX without CUDA before any CUDA call
    if (device_ < 0) RLPT_CUDA_CHECK(cudaGetDevice(&device_));
    where_ = rlpt::detail::format("{} (device payloads)", ucx_->info().name);
    memory_.open(device_, where_);
  }
  ucx_device_link(const ucx_device_link&) = delete;
  ucx_device_link& operator=(const ucx_device_link&) = delete;
  ~ucx_device_link() override {
    try { // UCX releases its registrations of the slots: on this side's device
      const on_device g(device_);
      ucx_.reset();
    } catch (...) {
      ucx_.reset();
    }
  }

  //! The bound port of a listening link.
  [[nodiscard]] std::uint16_t port() const noexcept { return ucx_->port(); }
  [[nodiscard]] const auth_counters& auth_stats() const noexcept { return ucx_->auth_stats(); }

  [[nodiscard]] link_info info() const override {
    link_info i = ucx_->info();
    i.name = where_;
    i.payload_space = memory_space::device;
    return i;
  }
  [[nodiscard]] cudaStream_t stream() const override { return memory_.work(); }
  [[nodiscard]] std::size_t peers() const override { return 1; }
  [[nodiscard]] std::size_t last_peer() const override { return 0; }
  [[nodiscard]] std::string peer_name(std::size_t) const override {
    return rlpt::detail::format("the peer of {}", where_);
  }
  void prepare(deadline) override {}
  void fail(std::string_view) noexcept override {} // every wait is bounded: nothing can hang

  std::span<std::byte> payload_buffer(std::uint64_t bytes, deadline until) override {
    const on_device g(device_);
    return ucx_->payload_buffer(bytes, until);
  }
  void send(std::span<const std::byte> meta, std::uint64_t payload_bytes, deadline until) override {
    const on_device g(device_);
    ucx_->send(meta, payload_bytes, until);
  }
  //! The next message; its payload is device memory that work enqueued on stream() after this
  //! returns may read until release().
  std::optional<message> receive(deadline until) override {
    const on_device g(device_);
    return ucx_->receive(until);
  }
  void release() override {
    const on_device g(device_);
    ucx_->release();
  }
  //! Sends are complete when send() returns; this waits for the work reading received payloads.
  void drain(deadline until) override { memory_.drain(until); }

private:
  // UCX's CUDA transports call the driver on the calling thread, in its current context: this
  // side's device, its primary context made current (cudaFree(nullptr) initialises it on a
  // thread that has not used CUDA yet), for the length of a call.
  struct on_device {
    detail::device_guard device;
    explicit on_device(int d) : device(d) { RLPT_CUDA_CHECK(cudaFree(nullptr)); }
  };

  detail::ucx_cuda_memory memory_; // outlives the transport, which hands its slots back
  int device_;
  std::optional<ucx_transport> ucx_;
  std::string where_;
};

} // namespace sync
RLPT_NAMESPACE_END
