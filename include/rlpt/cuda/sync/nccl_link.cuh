// SPDX-License-Identifier: Apache-2.0
//! @file
//! NCCL broadcast transport: one sender (the trainer's rank, the root) and any number of
//! receivers (inference workers) in one communicator. Protocol frames go over one host link
//! per receiver (TCP, shared memory, ...); bucket payloads go by ncclBroadcast from the
//! sender's device slots into each receiver's device slots.
//!
//! - Communicator: the user's (`ncclComm_t`, root rank given), or one the link creates: the
//!   sender draws an ncclUniqueId and sends it to every receiver over its host link (INIT,
//!   nccl_wire.hpp); all ranks then initialise a non-blocking communicator, polled against
//!   a deadline. After an abort the sender bootstraps a new one at the next update.
//! - Pipelining: `slots` (>= 2) device buffers per side and two streams: while bucket k is on
//!   the wire (broadcast stream), bucket k+1 is packed (work stream) into the other slot; a
//!   slot is refilled only after its broadcast completed. Receivers consume bucket k on their
//!   work stream while bucket k+1 lands.
//! - Never hangs silently: every wait polls cudaEventQuery and ncclCommGetAsyncError against
//!   a deadline. On a timeout or an NCCL error the communicator is aborted (ncclCommAbort, so
//!   no kernel stays stuck) and the error names the bucket and the peers; the protocol keeps
//!   the previous version published.
//!
//! A single-rank group (no receivers) is valid: the sender's broadcasts are then local, which
//! is what one GPU can test.
#pragma once

#include <rlpt/config.hpp>

#if RLPT_HAS_NCCL()

#include <rlpt/core/error.hpp>
#include <rlpt/cuda/error.cuh>
#include <rlpt/cuda/nccl.cuh>
#include <rlpt/cuda/resources.cuh>
#include <rlpt/cuda/sync/device_link.cuh>
#include <rlpt/cuda/sync/nccl_wire.hpp>
#include <rlpt/sync/frame.hpp>
#include <rlpt/sync/link.hpp>

#include <cuda_runtime_api.h>
#include <nccl.h>
#include <unistd.h>

#include <fmt/core.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

RLPT_NAMESPACE_BEGIN
namespace sync {

struct nccl_options {
  //! Device payload buffers per side: 2 = double buffering (verl's send/recv buffers, vLLM's
  //! num_buffers = 2, checkpoint-engine's ping-pong).
  std::uint32_t slots = 2;
  //! Capacity of a slot: at least the plan's bucket size (512 MiB, slime's default).
  std::uint64_t slot_bytes = std::uint64_t{512} << 20;
  //! CUDA device of the link; -1: the current device (or the user communicator's).
  int device = -1;
  //! Limit for creating a communicator (every rank must join).
  std::chrono::milliseconds init_timeout{120'000};
  //! Limit for a receiver's broadcast to land (the link must take part in every broadcast,
  //! whatever its caller's deadline).
  std::chrono::milliseconds timeout{30'000};
};

class nccl_link final : public device_link {
public:
  //! Sender (rank 0, the root) of a group the link creates: one host link per receiver.
  nccl_link(std::vector<link*> receivers, nccl_options o = {})
      : o_(o), role_(role::sender), own_(true), hosts_(std::move(receivers)) {
    where_ = rlpt::detail::format("nccl sender ({} receivers)", hosts_.size());
    init_common(o_.device);
  }

  //! Receiver of a group the sender creates: the host link to the sender. Joins when the
  //! sender's INIT arrives (inside receive()).
  explicit nccl_link(link& sender, nccl_options o = {}) : o_(o), role_(role::receiver), own_(true), hosts_{&sender} {
    where_ = rlpt::detail::format("nccl receiver (sender at {})", sender.info().name);
    init_common(o_.device);
  }

  //! With the user's communicator: `root` is the sender's rank. Sender: `hosts` holds one host
  //! link per receiver (the communicator must have exactly hosts.size() + 1 ranks); receiver:
  //! `hosts` holds the link to the sender. The link never destroys the communicator, but
  //! aborts it on a timeout or an error (nothing else unblocks a stuck collective).
  nccl_link(ncclComm_t comm, int root, std::vector<link*> hosts, nccl_options o = {})
      : o_(o), own_(false), hosts_(std::move(hosts)), comm_(comm) {
    RLPT_CHECK(comm != nullptr, errors::sync::bad_link, "nccl_link needs a communicator");
    int ranks = 0, rank = 0, dev = 0;
    RLPT_NCCL_CHECK(ncclCommCount(comm, &ranks));
    RLPT_NCCL_CHECK(ncclCommUserRank(comm, &rank));
    RLPT_NCCL_CHECK(ncclCommCuDevice(comm, &dev));
    RLPT_CHECK(root >= 0 && root < ranks, errors::sync::bad_link,
               "nccl_link: root {} is not a rank of a {}-rank communicator", root, ranks);
    role_ = rank == root ? role::sender : role::receiver;
    ranks_ = ranks;
    rank_ = rank;
    root_ = root;
    if (role_ == role::sender)
      RLPT_CHECK(static_cast<std::size_t>(ranks) == hosts_.size() + 1, errors::sync::bad_link,
                 "nccl_link: the communicator has {} ranks but the sender was given {} host links (one per receiver)",
                 ranks, hosts_.size());
    else
      RLPT_CHECK(hosts_.size() == 1, errors::sync::bad_link,
                 "nccl_link: a receiver needs exactly one host link, got {}", hosts_.size());
    where_ = rlpt::detail::format("nccl rank {} of {} ({}, root {})", rank, ranks,
                                  role_ == role::sender ? "sender" : "receiver", root);
    init_common(dev);
  }

  nccl_link(const nccl_link&) = delete;
  nccl_link& operator=(const nccl_link&) = delete;

  ~nccl_link() override {
    try {
      detail::device_guard g(device_);
      if (comm_ != nullptr && own_) static_cast<void>(ncclCommAbort(comm_)); // local teardown, never waits on peers
      comm_ = nullptr;
    } catch (...) {}
  }

  [[nodiscard]] link_info info() const override { return {where_, true, o_.slot_bytes, memory_space::device}; }
  [[nodiscard]] cudaStream_t stream() const override { return work_->get(); }
  [[nodiscard]] std::size_t peers() const override { return role_ == role::sender ? hosts_.size() : 1; }
  [[nodiscard]] std::size_t last_peer() const override { return last_peer_; }
  [[nodiscard]] std::string peer_name(std::size_t p) const override {
    if (p >= hosts_.size()) return rlpt::detail::format("peer {}", p);
    if (role_ == role::receiver) return rlpt::detail::format("the sender (rank {}, {})", root_, hosts_[p]->info().name);
    if (own_) return rlpt::detail::format("rank {} ({})", p + 1, hosts_[p]->info().name);
    return rlpt::detail::format("receiver {} ({})", p, hosts_[p]->info().name);
  }

  //! The communicator (null before the first bootstrap).
  [[nodiscard]] ncclComm_t comm() const noexcept { return comm_; }
  //! Communicators created so far (a new one after every abort).
  [[nodiscard]] std::uint64_t epoch() const noexcept { return epoch_; }
  [[nodiscard]] bool aborted() const noexcept { return broken_; }

  void prepare(deadline until) override {
    if (role_ == role::receiver) return; // the sender drives the bootstrap
    if (comm_ != nullptr && !broken_) return;
    RLPT_CHECK(own_, errors::sync::peer_lost,
               "{}: the user's communicator was aborted after an error; create a new one", where_);
    bootstrap(until);
  }

  std::span<std::byte> payload_buffer(std::uint64_t bytes, deadline until) override {
    RLPT_CHECK(role_ == role::sender, errors::sync::bad_link, "{}: only the sender sends payloads", where_);
    RLPT_CHECK(bytes <= o_.slot_bytes, errors::sync::too_large, "{}: payload of {} bytes exceeds the slot size {}",
               where_, bytes, o_.slot_bytes);
    ready();
    if (reserved_ < 0) {
      const auto s = static_cast<std::size_t>(next_slot_);
      detail::device_guard g(device_);
      wait_slot(slots_[s].sent.get(), until,
                rlpt::detail::format("waiting for the broadcast of {} to finish (slot {})", slots_[s].label, s));
      reserved_ = next_slot_;
    }
    return {slot_ptr(static_cast<std::size_t>(reserved_)), static_cast<std::size_t>(bytes)};
  }

  void send(std::span<const std::byte> meta, std::uint64_t payload_bytes, deadline until) override {
    if (role_ == role::receiver) {
      hosts_[0]->send(meta, 0, until);
      return;
    }
    if (payload_bytes > 0) {
      RLPT_CHECK(reserved_ >= 0, errors::sync::bad_link, "{}: send of {} payload bytes without a payload_buffer()",
                 where_, payload_bytes);
      ready();
    }
    for (auto* h : hosts_) h->send(meta, 0, until);
    if (payload_bytes == 0) return;
    const auto s = static_cast<std::size_t>(reserved_);
    reserved_ = -1;
    detail::device_guard g(device_);
    packed_->record(work_->get());
    RLPT_CUDA_CHECK(cudaStreamWaitEvent(net_->get(), packed_->get(), 0));
    slots_[s].label = payload_label(meta);
    broadcast(s, payload_bytes, until);
    next_slot_ = static_cast<int>((s + 1) % slots_.size());
  }

  std::optional<message> receive(deadline until) override {
    release();
    return role_ == role::sender ? receive_reply(until) : receive_forward(until);
  }

  void release() override {
    if (held_host_ < 0) return;
    if (held_slot_ >= 0) {
      try {
        detail::device_guard g(device_);
        slots_[static_cast<std::size_t>(held_slot_)].used.record(work_->get()); // the consumer's work is enqueued
      } catch (...) {}
      held_slot_ = -1;
    }
    hosts_[static_cast<std::size_t>(held_host_)]->release();
    held_host_ = -1;
  }

  void drain(deadline until) override {
    if (comm_ == nullptr && slots_busy() == 0) return;
    detail::device_guard g(device_);
    for (std::size_t s = 0; s < slots_.size(); ++s) {
      if (role_ == role::sender)
        wait_slot(slots_[s].sent.get(), until,
                  rlpt::detail::format("waiting for the broadcast of {}", slots_[s].label));
      else
        wait_slot(slots_[s].used.get(), until, rlpt::detail::format("waiting for {} to be consumed", slots_[s].label));
    }
  }

  void fail(std::string_view why) noexcept override {
    try {
      detail::device_guard g(device_);
      reserved_ = -1;
      if (comm_ != nullptr && !broken_ && broadcasts_pending()) abort_comm(why);
    } catch (...) {}
  }

private:
  struct slot_state {
    detail::event sent; // sender: its broadcast finished; receiver: the data landed
    detail::event used; // receiver: the consumer's work finished
    std::string label = "nothing";
  };

  void init_common(int device) {
    RLPT_CHECK(o_.slots >= 2, errors::sync::bad_link,
               "{}: needs at least 2 slots (pack one while the other is on the wire), got {}", where_, o_.slots);
    RLPT_CHECK(o_.slot_bytes >= 256, errors::sync::bad_link, "{}: slot_bytes {} is too small", where_, o_.slot_bytes);
    if (device < 0) RLPT_CUDA_CHECK(cudaGetDevice(&device));
    device_ = device;
    detail::device_guard g(device_);
    stride_ = (o_.slot_bytes + 255) / 256 * 256;
    buffer_ = detail::device_bytes(static_cast<std::size_t>(stride_ * o_.slots));
    work_ = std::make_unique<detail::stream>();
    net_ = std::make_unique<detail::stream>();
    packed_ = std::make_unique<detail::event>();
    slots_.resize(o_.slots);
  }

  [[nodiscard]] std::byte* slot_ptr(std::size_t s) const noexcept { return buffer_.get() + s * stride_; }

  // Slots whose last broadcast (sender) or consumer (receiver) has not completed.
  [[nodiscard]] std::size_t slots_busy() const noexcept {
    std::size_t n = 0;
    for (const auto& s : slots_) {
      const cudaError_t e = cudaEventQuery(role_ == role::sender ? s.sent.get() : s.used.get());
      if (e == cudaErrorNotReady)
        ++n;
      else if (e != cudaSuccess)
        static_cast<void>(cudaGetLastError());
    }
    return n;
  }

  // A collective this rank enqueued has not completed (only an abort can end it if a peer is gone).
  [[nodiscard]] bool broadcasts_pending() const noexcept {
    for (const auto& s : slots_)
      if (cudaEventQuery(s.sent.get()) == cudaErrorNotReady) return true;
    return false;
  }

  void ready() const {
    RLPT_CHECK(comm_ != nullptr, errors::sync::peer_lost,
               "{}: no communicator yet (the sender creates it at its first update)", where_);
    RLPT_CHECK(!broken_, errors::sync::peer_lost, "{}: the communicator was aborted ({}){}", where_, last_abort_,
               own_ ? "; the sender creates a new one at its next update" : "; create a new one");
  }

  [[nodiscard]] std::string peers_text() const {
    std::string s;
    for (std::size_t p = 0; p < hosts_.size(); ++p) s += rlpt::detail::format("{}{}", p ? ", " : "", peer_name(p));
    return s.empty() ? "no peers" : s;
  }

  void abort_comm(std::string_view why) {
    if (comm_ == nullptr || broken_) return;
    static_cast<void>(ncclCommAbort(comm_));
    broken_ = true;
    if (own_) comm_ = nullptr; // a fresh one at the next bootstrap
    last_abort_ = std::string(why);
  }

  // Errors the communicator reported asynchronously (a peer's failure, a network error).
  void check_async(std::string_view what) {
    if (comm_ == nullptr || broken_) return;
    ncclResult_t st = ncclSuccess;
    const ncclResult_t rc = ncclCommGetAsyncError(comm_, &st);
    if (rc == ncclSuccess && (st == ncclSuccess || st == ncclInProgress)) return;
    const ncclResult_t bad = rc != ncclSuccess ? rc : st;
    const std::string msg =
        rlpt::detail::format("{}: {}: NCCL reported {} ({}); the communicator was aborted (peers: {})", where_, what,
                             static_cast<int>(bad), ncclGetErrorString(bad), peers_text());
    abort_comm(msg);
    RLPT_FAIL(errors::nccl::error, "{}", msg);
  }

  // Polls a non-blocking communicator until its last call finished enqueueing.
  void settle(deadline until, std::string_view what) {
    for (int spins = 0;; ++spins) {
      ncclResult_t st = ncclSuccess;
      const ncclResult_t rc = ncclCommGetAsyncError(comm_, &st);
      if (rc == ncclSuccess && st == ncclSuccess) return;
      if (rc != ncclSuccess || st != ncclInProgress) {
        const ncclResult_t bad = rc != ncclSuccess ? rc : st;
        const std::string msg =
            rlpt::detail::format("{}: {}: NCCL reported {} ({}); the communicator was aborted (peers: {})", where_,
                                 what, static_cast<int>(bad), ncclGetErrorString(bad), peers_text());
        abort_comm(msg);
        RLPT_FAIL(errors::nccl::error, "{}", msg);
      }
      if (clock::now() >= until) {
        const std::string msg = rlpt::detail::format("{}: timed out {}; the communicator was aborted (peers: {})",
                                                     where_, what, peers_text());
        abort_comm(msg);
        RLPT_FAIL(errors::sync::timeout, "{}", msg);
      }
      if (spins < 64)
        std::this_thread::yield();
      else
        std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  void wait_slot(cudaEvent_t e, deadline until, const std::string& what) {
    try {
      detail::wait_event(e, until, where_, what, [&] { check_async(what); });
    } catch (const error& err) {
      if (err.id() == errors::sync::timeout) {
        const std::string msg = rlpt::detail::format("{}: timed out {}; the communicator was aborted (peers: {})",
                                                     where_, what, peers_text());
        abort_comm(msg);
        RLPT_FAIL(errors::sync::timeout, "{}", msg);
      }
      throw;
    }
  }

  void broadcast(std::size_t s, std::uint64_t bytes, deadline until) {
    const std::string what = rlpt::detail::format("broadcasting {} (slot {}, {} bytes)", slots_[s].label, s, bytes);
    const ncclResult_t rc = ncclBroadcast(slot_ptr(s), slot_ptr(s), bytes, ncclUint8, root_, comm_, net_->get());
    if (rc == ncclInProgress)
      settle(until, what);
    else if (rc != ncclSuccess) {
      const std::string msg =
          rlpt::detail::format("{}: {}: ncclBroadcast failed with {} ({}); the communicator was aborted (peers: {})",
                               where_, what, static_cast<int>(rc), ncclGetErrorString(rc), peers_text());
      abort_comm(msg);
      RLPT_FAIL(errors::nccl::error, "{}", msg);
    }
    slots_[s].sent.record(net_->get());
  }

  // --- bootstrap ---------------------------------------------------------------------------

  ncclConfig_t config() const {
    ncclConfig_t c = NCCL_CONFIG_INITIALIZER;
    c.blocking = 0; // every call returns at once; progress is polled against deadlines
    return c;
  }

  void bootstrap(deadline until) {
    detail::device_guard g(device_);
    if (comm_ != nullptr) abort_comm("replaced"); // a healthy-but-old one is dropped too
    ++epoch_;
    ncclUniqueId id;
    RLPT_NCCL_CHECK(ncclGetUniqueId(&id));
    static_assert(sizeof(ncclUniqueId) == nccl_unique_id_bytes);
    const auto ranks = static_cast<std::uint32_t>(hosts_.size() + 1);
    for (std::size_t i = 0; i < hosts_.size(); ++i) {
      nccl_init_msg m;
      m.epoch = epoch_;
      m.ranks = ranks;
      m.rank = static_cast<std::uint32_t>(i + 1);
      m.root = 0;
      std::memcpy(m.id.data(), &id, nccl_unique_id_bytes);
      hosts_[i]->send(encode_nccl_init(m), 0, until);
    }
    joined_.assign(hosts_.size(), 0);
    std::size_t left = hosts_.size();
    while (left > 0) {
      bool any = false;
      for (std::size_t i = 0; i < hosts_.size(); ++i) {
        auto msg = hosts_[i]->receive(clock::now());
        if (!msg) continue;
        any = true;
        if (nccl_boot_kind(msg->meta) == 2) {
          const nccl_join_msg j = decode_nccl_join(msg->meta, hosts_[i]->info().name);
          if (j.epoch == epoch_ && j.rank == i + 1 && !joined_[i]) {
            joined_[i] = 1;
            --left;
          }
        }
        hosts_[i]->release(); // replies of an earlier update are stale now
      }
      if (left == 0) break;
      if (clock::now() >= until) {
        std::string missing;
        for (std::size_t i = 0; i < hosts_.size(); ++i)
          if (!joined_[i]) missing += rlpt::detail::format("{}{}", missing.empty() ? "" : ", ", peer_name(i));
        RLPT_FAIL(errors::sync::timeout, "{}: timed out waiting for {} to join communicator {}", where_, missing,
                  epoch_);
      }
      if (!any) std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    init_comm(id, static_cast<int>(ranks), 0, 0);
  }

  void init_comm(const ncclUniqueId& id, int ranks, int rank, int root) {
    ncclConfig_t c = config();
    ncclComm_t comm = nullptr;
    const ncclResult_t rc = ncclCommInitRankConfig(&comm, ranks, id, rank, &c);
    if (rc != ncclSuccess && rc != ncclInProgress)
      RLPT_FAIL(errors::nccl::error, "{}: ncclCommInitRankConfig (rank {} of {}) failed with {} ({})", where_, rank,
                ranks, static_cast<int>(rc), ncclGetErrorString(rc));
    comm_ = comm;
    broken_ = false;
    ranks_ = ranks;
    rank_ = rank;
    root_ = root;
    settle(after(o_.init_timeout),
           rlpt::detail::format("creating communicator {} (rank {} of {})", epoch_, rank, ranks));
    for (auto& s : slots_) s.label = "nothing";
    next_slot_ = 0;
  }

  void on_init(std::span<const std::byte> meta) {
    const nccl_init_msg m = decode_nccl_init(meta, hosts_[0]->info().name);
    detail::device_guard g(device_);
    RLPT_CHECK(own_, errors::sync::bad_link, "{}: got an NCCL INIT but this link uses the user's communicator", where_);
    if (comm_ != nullptr) {
      static_cast<void>(ncclCommAbort(comm_));
      comm_ = nullptr;
    }
    epoch_ = m.epoch;
    nccl_join_msg j;
    j.epoch = m.epoch;
    j.rank = m.rank;
    j.pid = static_cast<std::int32_t>(::getpid());
    hosts_[0]->send(encode_nccl_join(j), 0, after(o_.timeout));
    ncclUniqueId id;
    std::memcpy(&id, m.id.data(), nccl_unique_id_bytes);
    init_comm(id, static_cast<int>(m.ranks), static_cast<int>(m.rank), static_cast<int>(m.root));
  }

  // --- receiving ---------------------------------------------------------------------------

  std::optional<message> receive_reply(deadline until) {
    int spins = 0;
    for (;;) {
      for (std::size_t k = 0; k < hosts_.size(); ++k) {
        const std::size_t i = (rr_ + k) % hosts_.size();
        auto msg = hosts_[i]->receive(clock::now());
        if (!msg) continue;
        if (nccl_boot_kind(msg->meta) != 0) { // a late JOIN
          hosts_[i]->release();
          continue;
        }
        rr_ = i + 1;
        held_host_ = static_cast<int>(i);
        last_peer_ = i;
        return msg;
      }
      if (hosts_.empty() || clock::now() >= until) return std::nullopt;
      if (++spins < 32)
        std::this_thread::yield();
      else
        std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  std::optional<message> receive_forward(deadline until) {
    for (;;) {
      auto msg = hosts_[0]->receive(until);
      if (!msg) return std::nullopt;
      if (nccl_boot_kind(msg->meta) == 1) {
        try {
          on_init(msg->meta);
        } catch (...) {
          hosts_[0]->release();
          throw;
        }
        hosts_[0]->release();
        continue;
      }
      held_host_ = 0;
      last_peer_ = 0;
      const std::uint64_t payload = peek_frame(msg->meta).payload_bytes;
      if (payload == 0) return msg;
      // Every payload the sender announces is a broadcast this rank must join, whatever the
      // protocol makes of the frame: otherwise the whole group stalls.
      ready();
      RLPT_CHECK(payload <= o_.slot_bytes, errors::sync::too_large, "{}: payload of {} bytes exceeds the slot size {}",
                 where_, payload, o_.slot_bytes);
      const auto s = static_cast<std::size_t>(next_slot_);
      detail::device_guard g(device_);
      const deadline limit = after(o_.timeout);
      wait_slot(slots_[s].used.get(), limit,
                rlpt::detail::format("waiting for {} to be consumed (slot {})", slots_[s].label, s));
      slots_[s].label = payload_label(msg->meta);
      broadcast(s, payload, limit);
      wait_slot(slots_[s].sent.get(), limit,
                rlpt::detail::format("receiving {} from {}", slots_[s].label, peer_name(0)));
      next_slot_ = static_cast<int>((s + 1) % slots_.size());
      held_slot_ = static_cast<int>(s);
      return message{msg->meta, {slot_ptr(s), static_cast<std::size_t>(payload)}};
    }
  }

  nccl_options o_;
  role role_ = role::sender;
  bool own_ = true;
  std::vector<link*> hosts_;
  std::string where_;
  int device_ = 0;
  ncclComm_t comm_ = nullptr;
  bool broken_ = false;
  std::string last_abort_;
  int ranks_ = 1, rank_ = 0, root_ = 0;
  std::uint64_t epoch_ = 0;
  std::vector<char> joined_;
  std::uint64_t stride_ = 0;
  detail::device_bytes buffer_;
  std::unique_ptr<detail::stream> work_, net_;
  std::vector<slot_state> slots_;
  std::unique_ptr<detail::event> packed_;
  int next_slot_ = 0;
  int reserved_ = -1;
  int held_host_ = -1;
  int held_slot_ = -1;
  std::size_t rr_ = 0;
  std::size_t last_peer_ = 0;
};

} // namespace sync
RLPT_NAMESPACE_END

#endif // RLPT_HAS_NCCL()
