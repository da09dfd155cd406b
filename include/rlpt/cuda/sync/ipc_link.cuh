// SPDX-License-Identifier: Apache-2.0
//! @file
//! CUDA IPC transport: trainer and inference engine in two processes on the same GPUs (the
//! colocated setup). The sender exports ONE device buffer per session holding `slots` payload
//! slots; the receiver maps it once (cached by GPU UUID and session) and reads buckets in place.
//! Protocol frames and credits travel over a host link (ipc_wire.hpp).
//!
//! - Memory: `ipc_memory::legacy` allocates with cudaMalloc and shares a cudaIpcMemHandle;
//!   `ipc_memory::vmm` allocates with cuMemCreate and shares a POSIX file descriptor
//!   (cuMemExportToShareableHandle, passed with SCM_RIGHTS: the host link must be a
//!   unix_link); `ipc_memory::external` exports the caller's buffer, whichever kind it is:
//!   cudaMalloc memory goes legacy, VMM memory (PyTorch's expandable segments, cuMem*
//!   allocators) created with POSIX-fd export goes by fd, anything else is a clear error
//!   (rlpt.sync.ipc), never a silent fallback to a slow path.
//! - Credits: a slot is refilled only after the receiver RELEASEd it, and the receiver sends
//!   RELEASE only once it has seen the event recorded after its own copy out of the slot
//!   complete: a slot is never overwritten while the consumer's device copy may still read
//!   it (the race SGLang's early ack caused). Both sides watch only their own events, so a
//!   peer that dies cannot leave the other one waiting on a dead process's event; every wait
//!   has a deadline.
//! - Release: close() (or the destructor) says BYE; the receiver unmaps, the sender frees.
//!   The receiver's cache counts opens and closes (stats()): one mapping per session however
//!   many updates pass.
#pragma once

#include <rlpt/config.hpp>
#include <rlpt/core/error.hpp>
#include <rlpt/cuda/error.cuh>
#include <rlpt/cuda/resources.cuh>
#include <rlpt/cuda/sync/device_link.cuh>
#include <rlpt/cuda/sync/ipc_wire.hpp>
#include <rlpt/cuda/sync/unix_link.hpp>
#include <rlpt/sync/frame.hpp>
#include <rlpt/sync/link.hpp>

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <unistd.h>

#include <fmt/core.h>

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

RLPT_NAMESPACE_BEGIN
namespace sync {

//! Where the sender's exported buffer comes from.
enum class ipc_memory : std::uint8_t {
  legacy,  //!< cudaMalloc + cudaIpcGetMemHandle (vLLM's ipc backend, checkpoint-engine)
  vmm,     //!< cuMemCreate with POSIX-fd export (works where expandable segments are on)
  external //!< the caller's buffer (ipc_options::buffer), exported as whatever it is
};

struct ipc_options {
  //! Payload slots: 2 = double buffering (the receiver copies one while the next is packed).
  std::uint32_t slots = 2;
  //! Capacity of a slot: at least the plan's bucket size (512 MiB, slime's default).
  std::uint64_t slot_bytes = std::uint64_t{512} << 20;
  ipc_memory memory = ipc_memory::legacy;
  //! external: device memory for the slots (256-byte aligned, at least slots x slot_bytes
  //! rounded up to 256). Its owner keeps it alive while the link exists.
  void* buffer = nullptr;
  std::uint64_t buffer_bytes = 0;
  //! CUDA device of this side; -1: the current device.
  int device = -1;
  //! Receiver: limit for its own device work to finish before a slot is released.
  std::chrono::milliseconds timeout{30'000};
};

//! Counters of an IPC link (the leak tests read them).
struct ipc_stats {
  std::uint64_t hellos = 0;   //!< sender: HELLOs sent; receiver: HELLOs handled
  std::uint64_t opens = 0;    //!< receiver: mappings opened
  std::uint64_t closes = 0;   //!< receiver: mappings closed
  std::uint64_t hits = 0;     //!< receiver: HELLOs answered from the cache
  std::uint64_t mapped = 0;   //!< receiver: mappings held now
  std::uint64_t releases = 0; //!< RELEASE credits sent (receiver) or received (sender)
};

namespace detail {

[[nodiscard]] inline std::array<unsigned char, 16> device_uuid(int device) {
  cudaDeviceProp p{};
  RLPT_CUDA_CHECK(cudaGetDeviceProperties(&p, device));
  std::array<unsigned char, 16> u{};
  std::memcpy(u.data(), p.uuid.bytes, 16);
  return u;
}

//! Opens exported buffers with the CUDA runtime (legacy) or driver (POSIX fd).
struct cuda_ipc_opener {
  ipc_mapping open(const ipc_hello& h, int fd) {
    int count = 0;
    RLPT_CUDA_CHECK(cudaGetDeviceCount(&count));
    int dev = -1;
    for (int d = 0; d < count && dev < 0; ++d)
      if (device_uuid(d) == h.gpu_uuid) dev = d;
    RLPT_CHECK(dev >= 0, errors::sync::ipc,
               "the exporter's GPU {} is not visible in this process (check CUDA_VISIBLE_DEVICES)",
               uuid_text(h.gpu_uuid));
    device_guard g(dev);
    ipc_mapping m;
    m.session = h.session;
    m.gpu_uuid = h.gpu_uuid;
    m.kind = h.kind;
    m.device = dev;
    m.map_bytes = h.map_bytes;
    if (h.kind == ipc_handle_kind::legacy) {
      cudaIpcMemHandle_t mh;
      static_assert(sizeof(mh) == 64);
      std::memcpy(&mh, h.legacy.data(), 64);
      void* p = nullptr;
      const cudaError_t e = cudaIpcOpenMemHandle(&p, mh, cudaIpcMemLazyEnablePeerAccess);
      RLPT_CHECK(
          e == cudaSuccess, errors::sync::ipc,
          "cudaIpcOpenMemHandle of {} bytes from pid {} on {} failed with {} ({}) (a process cannot open its own "
          "handle; the exporter must be alive)",
          h.map_bytes, h.pid, uuid_text(h.gpu_uuid), cudaGetErrorName(e), cudaGetErrorString(e));
      m.mapped = p;
    } else {
      RLPT_CHECK(fd >= 0, errors::sync::ipc, "a POSIX-fd HELLO from pid {} arrived without its descriptor", h.pid);
      CUmemGenericAllocationHandle handle{};
      RLPT_CU_CHECK(driver().cuMemImportFromShareableHandle(
          &handle, reinterpret_cast<void*>(static_cast<std::uintptr_t>(fd)), CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
      CUdeviceptr ptr = 0;
      const CUresult r1 = driver().cuMemAddressReserve(&ptr, h.map_bytes, 0, 0, 0);
      if (r1 != CUDA_SUCCESS) {
        driver().cuMemRelease(handle);
        RLPT_CU_CHECK(r1);
      }
      const CUresult r2 = driver().cuMemMap(ptr, h.map_bytes, 0, handle, 0);
      driver().cuMemRelease(handle); // the mapping holds its own reference
      if (r2 != CUDA_SUCCESS) {
        driver().cuMemAddressFree(ptr, h.map_bytes);
        RLPT_CU_CHECK(r2);
      }
      CUmemAccessDesc access{};
      access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
      access.location.id = dev;
      access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
      const CUresult r3 = driver().cuMemSetAccess(ptr, h.map_bytes, &access, 1);
      if (r3 != CUDA_SUCCESS) {
        driver().cuMemUnmap(ptr, h.map_bytes);
        driver().cuMemAddressFree(ptr, h.map_bytes);
        RLPT_CU_CHECK(r3);
      }
      m.mapped = reinterpret_cast<void*>(static_cast<std::uintptr_t>(ptr));
    }
    m.base = static_cast<std::byte*>(m.mapped) + h.offset;
    return m;
  }

  void close(ipc_mapping& m) noexcept {
    if (m.mapped == nullptr) return;
    int prev = -1;
    static_cast<void>(cudaGetDevice(&prev));
    static_cast<void>(cudaSetDevice(m.device));
    if (m.kind == ipc_handle_kind::legacy) {
      static_cast<void>(cudaIpcCloseMemHandle(m.mapped));
    } else {
      const auto ptr = static_cast<CUdeviceptr>(reinterpret_cast<std::uintptr_t>(m.mapped));
      driver().cuMemUnmap(ptr, m.map_bytes);
      driver().cuMemAddressFree(ptr, m.map_bytes);
    }
    if (prev >= 0) static_cast<void>(cudaSetDevice(prev));
    m.mapped = nullptr;
  }
};

//! The sender's exported buffer: owned (legacy or VMM) or the caller's.
class ipc_export {
public:
  ipc_export(const ipc_options& o, int device, std::uint64_t bytes, bool fd_channel) : device_(device) {
    device_guard g(device);
    hello_.pid = static_cast<std::int32_t>(::getpid());
    hello_.gpu_uuid = device_uuid(device);
    std::random_device rd;
    hello_.session =
        (std::uint64_t{rd()} << 32 | rd()) ^ static_cast<std::uint64_t>(clock::now().time_since_epoch().count());
    try {
      switch (o.memory) {
      case ipc_memory::legacy:
        alloc_legacy(bytes);
        break;
      case ipc_memory::vmm:
        alloc_vmm(bytes);
        break;
      case ipc_memory::external:
        adopt(o.buffer, o.buffer_bytes, bytes);
        break;
      }
      RLPT_CHECK(
          hello_.kind == ipc_handle_kind::legacy || fd_channel, errors::sync::ipc,
          "this buffer is VMM memory, shared by file descriptor: the host link must be an rlpt::sync::unix_link");
    } catch (...) {
      cleanup();
      throw;
    }
  }
  ipc_export(const ipc_export&) = delete;
  ipc_export& operator=(const ipc_export&) = delete;
  ~ipc_export() { cleanup(); }

  [[nodiscard]] std::byte* base() const noexcept { return base_; }
  [[nodiscard]] const ipc_hello& hello() const noexcept { return hello_; }
  [[nodiscard]] int fd() const noexcept { return fd_; }

private:
  void cleanup() noexcept {
    int prev = -1;
    static_cast<void>(cudaGetDevice(&prev));
    static_cast<void>(cudaSetDevice(device_));
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
    if (owned_legacy_ != nullptr) static_cast<void>(cudaFree(owned_legacy_));
    owned_legacy_ = nullptr;
    if (vmm_ptr_ != 0) {
      driver().cuMemUnmap(vmm_ptr_, vmm_bytes_);
      driver().cuMemAddressFree(vmm_ptr_, vmm_bytes_);
    }
    if (vmm_created_) driver().cuMemRelease(vmm_handle_);
    vmm_ptr_ = 0;
    vmm_created_ = false;
    if (prev >= 0) static_cast<void>(cudaSetDevice(prev));
  }

  void alloc_legacy(std::uint64_t bytes) {
    RLPT_CUDA_CHECK(cudaMalloc(&owned_legacy_, bytes));
    export_legacy(owned_legacy_, bytes, 0);
    base_ = static_cast<std::byte*>(owned_legacy_);
  }

  void export_legacy(void* alloc_base, std::uint64_t alloc_bytes, std::uint64_t offset) {
    cudaIpcMemHandle_t h;
    RLPT_CUDA_CHECK(cudaIpcGetMemHandle(&h, alloc_base));
    hello_.kind = ipc_handle_kind::legacy;
    std::memcpy(hello_.legacy.data(), &h, 64);
    hello_.map_bytes = alloc_bytes;
    hello_.offset = offset;
    hello_.fds = 0;
  }

  static CUmemAllocationProp vmm_prop(int device) {
    CUmemAllocationProp p{};
    p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    p.location.id = device;
    p.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    return p;
  }

  void alloc_vmm(std::uint64_t bytes) {
    int supported = 0;
    RLPT_CU_CHECK(driver().cuDeviceGetAttribute(
        &supported, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, device_));
    RLPT_CHECK(supported != 0, errors::sync::ipc, "device {} cannot export VMM memory as POSIX file descriptors",
               device_);
    const CUmemAllocationProp prop = vmm_prop(device_);
    std::size_t gran = 0;
    RLPT_CU_CHECK(driver().cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    vmm_bytes_ = (bytes + gran - 1) / gran * gran;
    RLPT_CU_CHECK(driver().cuMemCreate(&vmm_handle_, vmm_bytes_, &prop, 0));
    vmm_created_ = true;
    CUdeviceptr va = 0;
    RLPT_CU_CHECK(driver().cuMemAddressReserve(&va, vmm_bytes_, gran, 0, 0));
    const CUresult rm = driver().cuMemMap(va, vmm_bytes_, 0, vmm_handle_, 0);
    if (rm != CUDA_SUCCESS) {
      driver().cuMemAddressFree(va, vmm_bytes_);
      RLPT_CU_CHECK(rm);
    }
    vmm_ptr_ = va; // reserved and mapped: cleanup() unmaps and frees it
    CUmemAccessDesc access{};
    access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access.location.id = device_;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    RLPT_CU_CHECK(driver().cuMemSetAccess(vmm_ptr_, vmm_bytes_, &access, 1));
    RLPT_CU_CHECK(
        driver().cuMemExportToShareableHandle(&fd_, vmm_handle_, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
    hello_.kind = ipc_handle_kind::posix_fd;
    hello_.map_bytes = vmm_bytes_;
    hello_.offset = 0;
    hello_.fds = 1;
    base_ = reinterpret_cast<std::byte*>(static_cast<std::uintptr_t>(vmm_ptr_));
  }

  // The caller's buffer: legacy-capable cudaMalloc memory, or VMM memory exportable as a fd.
  void adopt(void* buffer, std::uint64_t buffer_bytes, std::uint64_t need) {
    RLPT_CHECK(buffer != nullptr && buffer_bytes >= need, errors::sync::ipc,
               "ipc_options::buffer must hold at least {} bytes (slots x slot stride), got {} bytes at {}", need,
               buffer_bytes, buffer);
    RLPT_CHECK(reinterpret_cast<std::uintptr_t>(buffer) % 256 == 0, errors::sync::ipc,
               "ipc_options::buffer at {} is not 256-byte aligned", buffer);
    const auto p = static_cast<CUdeviceptr>(reinterpret_cast<std::uintptr_t>(buffer));
    int legacy = 0;
    const CUresult q = driver().cuPointerGetAttribute(&legacy, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, p);
    RLPT_CHECK(q == CUDA_SUCCESS, errors::sync::ipc,
               "ipc_options::buffer at {} is not device memory this process knows", buffer);
    base_ = static_cast<std::byte*>(buffer);
    if (legacy != 0) {
      CUdeviceptr alloc = 0;
      std::size_t alloc_bytes = 0;
      RLPT_CU_CHECK(driver().cuMemGetAddressRange(&alloc, &alloc_bytes, p));
      export_legacy(reinterpret_cast<void*>(static_cast<std::uintptr_t>(alloc)), alloc_bytes, p - alloc);
      return;
    }
    CUmemGenericAllocationHandle h{};
    const CUresult r = driver().cuMemRetainAllocationHandle(&h, buffer);
    RLPT_CHECK(
        r == CUDA_SUCCESS, errors::sync::ipc,
        "ipc_options::buffer at {} can be shared neither as cudaMalloc memory (cudaIpcGetMemHandle) nor as VMM memory "
        "(cuMemExportToShareableHandle): it is pool (cudaMallocAsync), managed or host memory; use ipc_memory::legacy "
        "or "
        "ipc_memory::vmm to let rlpt allocate the buffer",
        buffer);
    CUmemAllocationProp prop{};
    const CUresult rp = driver().cuMemGetAllocationPropertiesFromHandle(&prop, h);
    const bool fd_ok =
        rp == CUDA_SUCCESS && (prop.requestedHandleTypes & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) != 0;
    CUmemGenericAllocationHandle h_end{};
    const bool same =
        driver().cuMemRetainAllocationHandle(&h_end, static_cast<std::byte*>(buffer) + need - 1) == CUDA_SUCCESS;
    const bool one = same && h_end == h;
    if (same) driver().cuMemRelease(h_end);
    if (!fd_ok || !one) {
      driver().cuMemRelease(h);
      RLPT_CHECK(fd_ok, errors::sync::ipc,
                 "ipc_options::buffer at {} is VMM memory created without CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR in "
                 "requestedHandleTypes, so no other process can map it; allocate it with POSIX-fd export or use "
                 "ipc_memory::vmm",
                 buffer);
      RLPT_FAIL(
          errors::sync::ipc,
          "ipc_options::buffer [{}, +{}) spans several VMM allocations (expandable segments map memory in chunks); "
          "export one allocation, or use ipc_memory::vmm",
          buffer, need);
    }
    CUdeviceptr start = 0;
    const CUresult rs = driver().cuPointerGetAttribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, p);
    if (rs != CUDA_SUCCESS || start > p) {
      driver().cuMemRelease(h);
      RLPT_FAIL(errors::sync::ipc, "cannot tell where the VMM allocation holding ipc_options::buffer at {} starts",
                buffer);
    }
    std::size_t gran = 0;
    const CUmemAllocationProp gp = vmm_prop(device_);
    RLPT_CU_CHECK(driver().cuMemGetAllocationGranularity(&gran, &gp, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    const std::uint64_t offset = p - start;
    const CUresult re = driver().cuMemExportToShareableHandle(&fd_, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
    driver().cuMemRelease(h); // the caller's allocation keeps its own reference
    RLPT_CU_CHECK(re);
    hello_.kind = ipc_handle_kind::posix_fd;
    hello_.map_bytes = (offset + need + gran - 1) / gran * gran;
    hello_.offset = offset;
    hello_.fds = 1;
  }

  int device_ = 0;
  ipc_hello hello_;
  std::byte* base_ = nullptr;
  void* owned_legacy_ = nullptr;
  CUmemGenericAllocationHandle vmm_handle_{};
  bool vmm_created_ = false;
  CUdeviceptr vmm_ptr_ = 0;
  std::uint64_t vmm_bytes_ = 0;
  int fd_ = -1;
};

} // namespace detail

class ipc_link final : public device_link {
public:
  //! `host` carries frames and credits; a VMM export needs it to be a unix_link (fd passing).
  //! The sender allocates (or adopts) and exports its buffer now; the receiver maps it when
  //! the first HELLO arrives.
  ipc_link(link& host, role r, ipc_options o = {})
      : host_(host), role_(r), o_(o), unix_(dynamic_cast<unix_link*>(&host)) {
    RLPT_CHECK(o_.slots >= 1 && o_.slots <= ipc_max_slots, errors::sync::bad_link, "ipc: slots must be 1 to {}, got {}",
               ipc_max_slots, o_.slots);
    if (o_.device < 0) RLPT_CUDA_CHECK(cudaGetDevice(&o_.device));
    detail::device_guard g(o_.device);
    where_ = rlpt::detail::format("cuda ipc {} over {}", r == role::sender ? "sender" : "receiver", host.info().name);
    work_ = std::make_unique<detail::stream>();
    if (role_ == role::sender) {
      stride_ = (o_.slot_bytes + 255) / 256 * 256;
      exp_ = std::make_unique<detail::ipc_export>(o_, o_.device, stride_ * o_.slots, unix_ != nullptr);
      hello_ = exp_->hello();
      hello_.slots = o_.slots;
      hello_.slot_bytes = o_.slot_bytes;
      hello_.slot_stride = stride_;
      busy_.assign(o_.slots, 0);
      labels_.assign(o_.slots, "nothing");
      filled_ = std::make_unique<detail::event>();
    }
  }

  ipc_link(const ipc_link&) = delete;
  ipc_link& operator=(const ipc_link&) = delete;
  ~ipc_link() override {
    try {
      close(after(std::chrono::milliseconds(500)));
    } catch (...) {}
  }

  [[nodiscard]] link_info info() const override {
    return {where_, true, role_ == role::sender ? o_.slot_bytes : mapped_slot_bytes_, memory_space::device};
  }
  [[nodiscard]] cudaStream_t stream() const override { return work_->get(); }
  [[nodiscard]] std::size_t peers() const override { return 1; }
  [[nodiscard]] std::size_t last_peer() const override { return 0; }
  [[nodiscard]] std::string peer_name(std::size_t) const override {
    const std::int32_t pid = role_ == role::sender ? importer_pid_ : exporter_pid_;
    return rlpt::detail::format("the {} (pid {}, {})", role_ == role::sender ? "receiver" : "sender", pid,
                                host_.info().name);
  }

  [[nodiscard]] ipc_stats stats() const noexcept {
    ipc_stats s = stats_;
    s.opens = cache_.opens();
    s.closes = cache_.closes();
    s.hits = cache_.hits();
    s.mapped = cache_.size();
    return s;
  }
  //! Sender: the exported buffer's handle kind (legacy or posix_fd).
  [[nodiscard]] ipc_handle_kind handle_kind() const noexcept { return hello_.kind; }

  //! Sender: announces the buffer (HELLO) and waits until the receiver mapped it; every slot
  //! is free afterwards (the receiver finished its work on them before answering).
  void prepare(deadline until) override {
    if (role_ == role::receiver) return;
    RLPT_CHECK(!closed_, errors::sync::bad_link, "{}: the link was closed", where_);
    attach_state_ = 0;
    const auto body = encode_hello(hello_);
    encode_envelope(scratch_, ipc_kind::hello, ipc_no_slot, 0, body);
    if (hello_.kind == ipc_handle_kind::posix_fd) {
      const int fd = exp_->fd();
      unix_->send_with_fds(scratch_, std::span<const int>(&fd, 1), 0, until);
    } else {
      host_.send(scratch_, 0, until);
    }
    ++stats_.hellos;
    while (attach_state_ == 0) {
      if (!pump(until)) detail::timeout(where_, "waiting for the receiver to map the exported buffer (ATTACHED)");
    }
    RLPT_CHECK(attach_state_ == 1, errors::sync::ipc, "{}: the receiver could not map the exported buffer: {}", where_,
               attach_error_);
    std::fill(busy_.begin(), busy_.end(), 0);
  }

  std::span<std::byte> payload_buffer(std::uint64_t bytes, deadline until) override {
    RLPT_CHECK(role_ == role::sender, errors::sync::bad_link, "{}: only the sender sends payloads", where_);
    RLPT_CHECK(bytes <= o_.slot_bytes, errors::sync::too_large, "{}: payload of {} bytes exceeds the slot size {}",
               where_, bytes, o_.slot_bytes);
    const std::size_t s = next_slot_;
    while (busy_[s]) {
      if (!pump(until))
        detail::timeout(where_,
                        rlpt::detail::format("waiting for {} to release slot {} ({})", peer_name(0), s, labels_[s]));
    }
    reserved_ = static_cast<int>(s);
    return {exp_->base() + s * stride_, static_cast<std::size_t>(bytes)};
  }

  void send(std::span<const std::byte> meta, std::uint64_t payload_bytes, deadline until) override {
    if (role_ == role::receiver) {
      encode_envelope(scratch_, ipc_kind::reply, ipc_no_slot, 0, meta);
      host_.send(scratch_, 0, until);
      return;
    }
    std::uint32_t slot = ipc_no_slot;
    if (payload_bytes > 0) {
      RLPT_CHECK(reserved_ >= 0, errors::sync::bad_link, "{}: send of {} payload bytes without a payload_buffer()",
                 where_, payload_bytes);
      slot = static_cast<std::uint32_t>(reserved_);
      detail::device_guard g(o_.device);
      // The receiver reads the slot as soon as MSG arrives: the fill must be complete first.
      filled_->record(work_->get());
      detail::wait_event(filled_->get(), until, where_, rlpt::detail::format("filling slot {}", slot));
      busy_[slot] = 1;
      labels_[slot] = payload_label(meta);
      reserved_ = -1;
      next_slot_ = (slot + 1) % o_.slots;
    }
    encode_envelope(scratch_, ipc_kind::msg, slot, payload_bytes, meta);
    host_.send(scratch_, 0, until);
  }

  std::optional<message> receive(deadline until) override {
    release();
    return role_ == role::sender ? receive_reply(until) : receive_forward(until);
  }

  void release() override {
    if (role_ == role::sender) {
      if (held_reply_) {
        replies_.pop_front();
        held_reply_ = false;
      }
      return;
    }
    if (!held_) return;
    if (held_slot_ >= 0) {
      const auto s = static_cast<std::size_t>(held_slot_);
      try {
        detail::device_guard g(o_.device);
        consumed_[s].record(work_->get()); // after the consumer's copy out of the slot
        pending_.push_back(s);
      } catch (...) {}
      held_slot_ = -1;
    }
    held_ = false;
    host_.release();
  }

  void drain(deadline until) override {
    if (role_ == role::sender) {
      for (std::size_t s = 0; s < busy_.size(); ++s)
        while (busy_[s])
          if (!pump(until))
            detail::timeout(
                where_, rlpt::detail::format("waiting for {} to release slot {} ({})", peer_name(0), s, labels_[s]));
      return;
    }
    flush_releases(until, true);
  }

  void fail(std::string_view) noexcept override { reserved_ = -1; }

  //! Explicit release. Sender: says BYE, waits (until `until`) for the receiver to unmap, then
  //! frees the buffer. Receiver: waits for its own work on the slots, unmaps, says BYE.
  void close(deadline until) {
    if (closed_) return;
    closed_ = true;
    if (role_ == role::sender) {
      try {
        encode_envelope(scratch_, ipc_kind::bye, ipc_no_slot, 0, as_bytes("closing"));
        host_.send(scratch_, 0, until);
        bye_ = false;
        while (!bye_ && pump(until)) {}
      } catch (...) {}
      exp_.reset();
      return;
    }
    try {
      flush_releases(until, true);
    } catch (...) {}
    unmap();
    try {
      encode_envelope(scratch_, ipc_kind::bye, ipc_no_slot, 0, as_bytes("closing"));
      host_.send(scratch_, 0, until);
    } catch (...) {}
  }

private:
  // --- sender side ---------------------------------------------------------------------

  // Handles one host message (waiting until `until`); false when none arrived.
  bool pump(deadline until) {
    auto msg = host_.receive(until);
    if (!msg) return false;
    try {
      const ipc_envelope e = decode_envelope(msg->meta, where_);
      switch (e.kind) {
      case ipc_kind::attached: {
        RLPT_CHECK(!e.body.empty(), errors::sync::wire, "{}: empty ATTACHED", where_);
        const bool ok = e.body[0] == std::byte{1};
        std::int32_t pid = 0;
        if (e.body.size() >= 5) std::memcpy(&pid, e.body.data() + 1, 4);
        importer_pid_ = pid;
        attach_error_ = std::string(as_chars(e.body.subspan(e.body.size() >= 5 ? 5 : 1)));
        attach_state_ = ok ? 1 : 2;
        break;
      }
      case ipc_kind::release:
        if (e.slot < busy_.size() && busy_[e.slot]) {
          busy_[e.slot] = 0;
          ++stats_.releases;
        }
        break;
      case ipc_kind::reply:
        replies_.emplace_back(e.body.begin(), e.body.end());
        break;
      case ipc_kind::bye:
        bye_ = true;
        std::fill(busy_.begin(), busy_.end(), 0); // the receiver finished with every slot before saying BYE
        break;
      default:
        RLPT_FAIL(errors::sync::wire, "{}: unexpected {} message from the receiver", where_, name(e.kind));
      }
    } catch (...) {
      host_.release();
      throw;
    }
    host_.release();
    return true;
  }

  std::optional<message> receive_reply(deadline until) {
    while (replies_.empty())
      if (!pump(until)) return std::nullopt;
    held_reply_ = true;
    return message{replies_.front(), {}};
  }

  // --- receiver side -------------------------------------------------------------------

  // Sends RELEASE for every slot whose consumer finished; with `all`, waits for all of them.
  void flush_releases(deadline until, bool all) {
    detail::device_guard g(o_.device);
    while (!pending_.empty()) {
      const std::size_t s = pending_.front();
      if (all)
        detail::wait_event(consumed_[s].get(), until, where_,
                           rlpt::detail::format("waiting for the copy out of slot {}", s));
      else if (cudaEventQuery(consumed_[s].get()) != cudaSuccess)
        break;
      pending_.pop_front();
      encode_envelope(scratch_, ipc_kind::release, static_cast<std::uint32_t>(s), 0, {});
      host_.send(scratch_, 0, after(o_.timeout));
      ++stats_.releases;
    }
  }

  std::optional<message> receive_forward(deadline until) {
    for (;;) {
      flush_releases(until, false);
      // Short waits, so credits go back while the caller waits for the next message.
      const deadline step = pending_.empty() ? until : std::min(until, clock::now() + std::chrono::microseconds(200));
      auto msg = host_.receive(step);
      if (!msg) {
        if (clock::now() >= until) return std::nullopt;
        continue;
      }
      ipc_envelope e;
      try {
        e = decode_envelope(msg->meta, where_);
        if (e.kind == ipc_kind::hello) {
          on_hello(e);
          host_.release();
          continue;
        }
        if (e.kind == ipc_kind::bye) {
          flush_releases(after(o_.timeout), true);
          unmap();
          encode_envelope(scratch_, ipc_kind::bye, ipc_no_slot, 0, as_bytes("unmapped"));
          host_.send(scratch_, 0, after(o_.timeout));
          host_.release();
          continue;
        }
        RLPT_CHECK(e.kind == ipc_kind::msg, errors::sync::wire, "{}: unexpected {} message from the sender", where_,
                   name(e.kind));
        if (e.slot != ipc_no_slot) {
          RLPT_CHECK(map_ != nullptr, errors::sync::ipc, "{}: a payload arrived before the exported buffer was mapped",
                     where_);
          RLPT_CHECK(e.slot < slots_ && e.payload_bytes <= mapped_slot_bytes_, errors::sync::wire,
                     "{}: payload of {} bytes in slot {} (the buffer has {} slots of {} bytes)", where_,
                     e.payload_bytes, e.slot, slots_, mapped_slot_bytes_);
        } else {
          RLPT_CHECK(e.payload_bytes == 0, errors::sync::wire, "{}: {} payload bytes without a slot", where_,
                     e.payload_bytes);
        }
      } catch (...) {
        host_.release();
        throw;
      }
      held_ = true;
      if (e.slot == ipc_no_slot) return message{e.body, {}};
      held_slot_ = static_cast<int>(e.slot);
      return message{e.body, {map_->base + e.slot * slot_stride_, static_cast<std::size_t>(e.payload_bytes)}};
    }
  }

  void on_hello(const ipc_envelope& e) {
    ++stats_.hellos;
    std::vector<int> fds = unix_ != nullptr ? unix_->take_fds() : std::vector<int>{};
    std::string problem;
    try {
      const ipc_hello h = decode_hello(e.body, where_);
      RLPT_CHECK(fds.size() == h.fds, errors::sync::ipc, "{}: HELLO announces {} descriptors, {} arrived{}", where_,
                 h.fds, fds.size(),
                 unix_ == nullptr && h.fds != 0 ? " (a POSIX-fd export needs a unix_link host channel)" : "");
      flush_releases(after(o_.timeout), true); // nothing of ours reads the slots any more
      const int fd = fds.empty() ? -1 : fds[0];
      fds.clear(); // the cache owns (and closes) it now
      map_ = &cache_.acquire(h, fd);
      exporter_pid_ = h.pid;
      slots_ = h.slots;
      slot_stride_ = h.slot_stride;
      mapped_slot_bytes_ = h.slot_bytes;
      if (consumed_.size() < slots_) {
        detail::device_guard g(o_.device);
        while (consumed_.size() < slots_) consumed_.emplace_back();
      }
    } catch (const error& err) {
      problem = err.message();
    }
    for (int fd : fds) ::close(fd);
    std::vector<std::byte> body(5 + problem.size());
    body[0] = problem.empty() ? std::byte{1} : std::byte{0};
    const auto pid = static_cast<std::int32_t>(::getpid());
    std::memcpy(body.data() + 1, &pid, 4);
    if (!problem.empty()) std::memcpy(body.data() + 5, problem.data(), problem.size());
    encode_envelope(scratch_, ipc_kind::attached, ipc_no_slot, 0, body);
    host_.send(scratch_, 0, after(o_.timeout));
  }

  void unmap() noexcept {
    if (map_ != nullptr) cache_.release(map_->gpu_uuid);
    map_ = nullptr;
    slots_ = 0;
    mapped_slot_bytes_ = 0;
  }

  link& host_;
  role role_;
  ipc_options o_;
  unix_link* unix_ = nullptr;
  std::string where_;
  std::unique_ptr<detail::stream> work_;
  std::vector<std::byte> scratch_;
  ipc_stats stats_{};
  bool closed_ = false;
  // sender
  std::unique_ptr<detail::ipc_export> exp_;
  ipc_hello hello_{};
  std::uint64_t stride_ = 0;
  std::vector<char> busy_;
  std::vector<std::string> labels_;
  std::unique_ptr<detail::event> filled_;
  std::size_t next_slot_ = 0;
  int reserved_ = -1;
  int attach_state_ = 0; // 0 waiting, 1 mapped, 2 failed
  std::string attach_error_;
  std::int32_t importer_pid_ = 0;
  std::deque<std::vector<std::byte>> replies_;
  bool held_reply_ = false;
  bool bye_ = false;
  // receiver
  ipc_import_cache<detail::cuda_ipc_opener> cache_;
  const ipc_mapping* map_ = nullptr;
  std::uint32_t slots_ = 0;
  std::uint64_t slot_stride_ = 0;
  std::uint64_t mapped_slot_bytes_ = 0;
  std::int32_t exporter_pid_ = 0;
  std::deque<detail::event> consumed_;
  std::deque<std::size_t> pending_;
  bool held_ = false;
  int held_slot_ = -1;
};

} // namespace sync
RLPT_NAMESPACE_END
