// SPDX-License-Identifier: Apache-2.0
//! @file
//! UCX transport: rlpt's link over UCX's active messages (UCP), the transfer engine under
//! NIXL, vLLM's and SGLang's KV transfer, MPI and NCCL's net plugins. UCX picks the wire per
//! peer: RDMA (InfiniBand/RoCE verbs, with zero-copy rendezvous) where the hardware has it,
//! shared memory or CMA on one host, TCP otherwise; `ucx_options::transports` (or UCX_TLS)
//! narrows the choice. Component `ucx` (`find_package(rlpt COMPONENTS ucx)`, target rlpt::ucx).
//!
//! Frame: one active message per frame. Its 56-byte header (u32 magic "RLUF", u32 meta bytes,
//! u64 payload bytes, u64 XXH3-64 of the meta block, u64 frame sequence number, u64 XXH3-64 of
//! the first 32 header bytes, 16-byte frame tag) is the message's AM header; the meta block and
//! the payload are its data, sent from the caller's buffers (an iovec) and received straight
//! into the frame's buffer (rendezvous: the receiver pulls it). Sizes are checked before
//! anything is allocated and frames must arrive in sequence; a bad frame drops the connection
//! and raises rlpt.sync.wire.
//!
//! Connections: one end listens (a UCX listener on a socket address), the other connects; each
//! connection starts with a HELLO exchange that says the connection is up and checks the roles,
//! and with `ucx_options::auth` it is the authenticated handshake of auth.hpp (both ends prove
//! they hold the job's secret; every frame then carries a tag under the session key, exactly as
//! over TCP). The listening end takes a new (authenticated) connection in place of the old one;
//! the connecting end reconnects on its next call after a failure. A peer that dies or whose
//! connection breaks is reported by UCX's error handling (`UCP_ERR_HANDLING_MODE_PEER`):
//! rlpt.sync.peer_lost. Without `auth`, only loopback addresses are allowed unless
//! `allow_unauthenticated`.
//!
//! Each transport owns its UCX context and worker and is used by one thread at a time, like
//! every link. Payloads are host memory here; `ucx_device_link` (cuda/sync/ucx_link.cuh) is the
//! same transport with payloads in device memory, which needs a UCX built with CUDA (cuda_copy,
//! cuda_ipc, GPUDirect RDMA): PyPI's libucx-cu13 is, Debian's libucx is not.
#pragma once

#include <rlpt/config.hpp>
#include <rlpt/core/error.hpp>
#include <rlpt/sync/auth.hpp>
#include <rlpt/sync/checksum.hpp>
#include <rlpt/sync/detail/inet.hpp>
#include <rlpt/sync/link.hpp>

#include <ucp/api/ucp.h>

#include <poll.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

RLPT_NAMESPACE_BEGIN
namespace sync {

struct ucx_options {
  std::string host = "127.0.0.1";                     //!< connect: peer address; listen: address to bind
  std::uint16_t port = 0;                             //!< listen: 0 picks a free port (see ucx_transport::port())
  bool listen = false;                                //!< accept connections instead of connecting
  std::uint64_t max_payload = std::uint64_t{1} << 32; //!< largest payload accepted (and sent)
  std::uint64_t max_meta = std::uint64_t{256} << 20;  //!< largest meta block accepted
  //! UCX transports for this link's context (UCX_TLS syntax, e.g. "tcp" or "rc,sm"); empty:
  //! UCX_TLS from the environment, else UCX's own choice.
  std::string transports{};
  //! Authenticates both ends with the job's secret (auth_openssl.hpp); required for a
  //! non-loopback address unless allow_unauthenticated.
  std::shared_ptr<const authenticator> auth{};
  integrity tags = integrity::full; //!< what frame tags cover (with auth; both ends alike)
  //! No authentication on or to a non-loopback address: only where every host is trusted.
  bool allow_unauthenticated = false;
  //! Longest a connecting peer may take to complete the HELLO exchange before it is refused.
  std::chrono::milliseconds handshake_timeout{2000};
};

namespace detail {
inline constexpr std::uint32_t ucx_magic = 0x46554c52u;       // "RLUF"
inline constexpr std::uint32_t ucx_plain_hello = 0x48554c52u; // "RLUH": a HELLO without authentication
inline constexpr std::size_t ucx_header_bytes = 56;
inline constexpr std::size_t ucx_tag_at = 40; // the frame tag: header bytes [40, 56)
inline constexpr unsigned ucx_am_frame = 0x524c;
inline constexpr unsigned ucx_am_hello = 0x524d;

//! A frame's memory: allocated uninitialised (no zeroing pass), reused from frame to frame.
struct ucx_buffer {
  std::unique_ptr<std::byte[]> bytes;
  std::size_t capacity = 0;
  std::size_t size = 0;
};

//! A message the worker delivered: a frame (header + data) or a HELLO, from endpoint `ep`.
struct ucx_inbound {
  ucp_ep_h ep = nullptr;
  std::array<std::byte, ucx_header_bytes> header{};
  ucx_buffer frame;                    //!< a frame's meta block and payload (device payloads: its meta block)
  std::byte* slot = nullptr;           //!< device payloads: the device slot holding the payload
  std::size_t pad = 0;                 //!< where a pulled frame's data starts in its slot
  std::byte* device_payload = nullptr; //!< the payload in the slot, once the meta block is on the host
  bool wants_slot = false;             //!< device payloads: a rendezvous held until a slot is free
  bool in_slot = false;                //!< the whole frame was pulled into the slot (else: eager, on the host)
  std::vector<std::byte> data;         //!< a HELLO
  std::string bad;                     //!< why the frame was refused on arrival (nothing was received)
  bool done = false;                   //!< data complete (eager at once; rendezvous when pulled)
  ucs_status_t status = UCS_OK;        //!< of the rendezvous receive
  ucs_status_ptr_t request = nullptr;  //!< the rendezvous receive in flight
  void* held = nullptr;                //!< a rendezvous not pulled yet (its peer is handshaking, or no slot is free)
};
} // namespace detail

//! Payload slots of a UCX transport in memory it does not own or read, any memory type this UCX
//! moves (`ucx_device_link` hands out CUDA device memory): the transport keeps meta blocks in
//! host memory and has UCX move payloads straight from and into these slots.
class ucx_payload_slots {
public:
  ucx_payload_slots() = default;
  ucx_payload_slots(const ucx_payload_slots&) = delete;
  ucx_payload_slots& operator=(const ucx_payload_slots&) = delete;
  virtual ~ucx_payload_slots() = default;
  //! The slots' memory, as UCX names it (UCS_MEMORY_TYPE_CUDA for device memory).
  [[nodiscard]] virtual ucs_memory_type_t memory_type() const noexcept = 0;
  //! Sender: the slot the next send carries, at least `bytes` (earlier contents need not survive).
  virtual std::byte* send_slot(std::size_t bytes) = 0;
  //! Sender: a second buffer, for a frame whose meta block does not fit in front of its payload.
  virtual std::byte* spill(std::size_t bytes) = 0;
  //! Sender: waits, by `until`, for the work enqueued on the link's stream (the packed payload).
  virtual void ready(deadline until) = 0;
  //! Copies `n` > 0 bytes between host memory and a slot (either way) and waits for it by `until`.
  virtual void copy(void* dst, const void* src, std::size_t n, deadline until) = 0;
  //! Receiver: a free slot of at least `bytes`, or nullptr while every slot is still being read.
  virtual std::byte* take(std::size_t bytes) = 0;
  //! Receiver: the consumer's work on `slot` is enqueued; the slot is free once that work ran.
  //! On an error the slot stays taken (never reused).
  virtual void give_back(std::byte* slot) noexcept = 0;
};

class ucx_transport final : public link {
public:
  ucx_transport(ucx_options o, role r) : ucx_transport(std::move(o), r, nullptr) {}
  //! Payloads in the slots `payloads` hands out (borrowed: it outlives the transport), which
  //! this UCX must move (rlpt.sync.ucx otherwise); frame tags then cover header and meta only
  //! (integrity::control). ucx_device_link is this with CUDA device memory.
  ucx_transport(ucx_options o, role r, ucx_payload_slots& payloads) : ucx_transport(std::move(o), r, &payloads) {}

  ucx_transport(const ucx_transport&) = delete;
  ucx_transport& operator=(const ucx_transport&) = delete;

  ~ucx_transport() override { close(); }

  //! The bound port of a listening transport.
  [[nodiscard]] std::uint16_t port() const noexcept { return port_; }

  //! Whether this UCX moves CUDA device memory (it was built with CUDA: cuda_copy, cuda_ipc,
  //! GPUDirect RDMA), which ucx_device_link needs.
  [[nodiscard]] bool moves_device_memory() const { return moves(UCS_MEMORY_TYPE_CUDA); }

  //! Handshakes and refusals (every connection's HELLO exchange; with auth, the handshake).
  [[nodiscard]] const auth_counters& auth_stats() const noexcept { return counters_; }

  [[nodiscard]] link_info info() const override { return {where_, true, o_.max_payload, memory_space::host}; }

  std::span<std::byte> payload_buffer(std::uint64_t bytes, deadline) override {
    RLPT_CHECK(bytes <= o_.max_payload, errors::sync::too_large, "{}: payload of {} bytes exceeds max_payload {}",
               where_, bytes, o_.max_payload);
    const auto n = static_cast<std::size_t>(headroom + bytes);
    if (dev_ != nullptr) {
      tx_device_ = dev_->send_slot(n);
      tx_device_bytes_ = n;
      return {tx_device_ + headroom, static_cast<std::size_t>(bytes)};
    }
    if (tx_payload_.size() < n) tx_payload_.resize(n);
    return {tx_payload_.data() + headroom, static_cast<std::size_t>(bytes)};
  }

  void send(std::span<const std::byte> meta, std::uint64_t payload_bytes, deadline until) override {
    RLPT_CHECK(meta.size() <= o_.max_meta && meta.size() <= 0xffffffffu, errors::sync::too_large,
               "{}: meta block of {} bytes exceeds max_meta {}", where_, meta.size(), o_.max_meta);
    const bool device = dev_ != nullptr && payload_bytes > 0;
    RLPT_CHECK(payload_bytes == 0 || headroom + payload_bytes <= (device ? tx_device_bytes_ : tx_payload_.size()),
               errors::sync::bad_link, "{}: send of {} payload bytes without a payload_buffer() of that size", where_,
               payload_bytes);
    connect_or_accept(until);
    // A device payload is never read here: its tag (integrity::control) covers header and meta.
    const std::span<const std::byte> payload((device ? tx_device_ : tx_payload_.data()) +
                                                 (payload_bytes > 0 ? headroom : 0),
                                             static_cast<std::size_t>(payload_bytes));
    std::array<std::byte, detail::ucx_header_bytes> hdr{};
    const std::uint32_t magic = detail::ucx_magic, mb = static_cast<std::uint32_t>(meta.size());
    const std::uint64_t mcheck = xxh3(meta.data(), meta.size()), seq = tx_seq_++;
    std::memcpy(hdr.data(), &magic, 4);
    std::memcpy(hdr.data() + 4, &mb, 4);
    std::memcpy(hdr.data() + 8, &payload_bytes, 8);
    std::memcpy(hdr.data() + 16, &mcheck, 8);
    std::memcpy(hdr.data() + 24, &seq, 8);
    const std::uint64_t hcheck = xxh3(hdr.data(), 32);
    std::memcpy(hdr.data() + 32, &hcheck, 8);
    if (auth_.enabled()) {
      const authenticator::tag t = auth_.seal(std::span(hdr).first(detail::ucx_tag_at), meta, payload);
      std::memcpy(hdr.data() + detail::ucx_tag_at, t.data(), t.size());
    }
    // One contiguous block where the meta block fits in the headroom before the payload (a
    // bucket's): UCX moves contiguous memory zero-copy (rendezvous), an iovec it copies.
    ucp_dt_iov_t iov[2];
    std::size_t n = 0;
    if (device) { // one block of device memory: the meta block is copied in front of the payload
      std::byte* at = nullptr;
      if (meta.size() <= headroom) {
        at = tx_device_ + headroom - meta.size();
        if (!meta.empty()) dev_->copy(at, meta.data(), meta.size(), until);
        dev_->ready(until);
      } else { // rare (a delta frame's large meta block): both go to a second buffer
        dev_->ready(until);
        at = dev_->spill(meta.size() + payload.size());
        if (!meta.empty()) dev_->copy(at, meta.data(), meta.size(), until);
        dev_->copy(at + meta.size(), payload.data(), payload.size(), until);
      }
      iov[n++] = {at, meta.size() + payload.size()};
    } else if (!payload.empty() && meta.size() <= headroom) {
      std::byte* at = tx_payload_.data() + headroom - meta.size();
      if (!meta.empty()) std::memcpy(at, meta.data(), meta.size());
      iov[n++] = {at, meta.size() + payload.size()};
    } else {
      for (const auto part : {meta, payload})
        if (!part.empty()) iov[n++] = {const_cast<std::byte*>(part.data()), part.size()};
    }
    send_on(ep_, detail::ucx_am_frame, hdr, std::span<const ucp_dt_iov_t>(iov, n), until, "sending a frame", device);
  }

  std::optional<message> receive(deadline until) override {
    release();
    for (;;) {
      progress();
      if (o_.listen) accept_new(until);
      check_peer();
      if (ep_ == nullptr && !o_.listen && !try_connect(until)) {
        if (clock::now() >= until) return std::nullopt;
        continue;
      }
      if (dev_ != nullptr) assign_slots();
      if (auto m = front_frame(until)) return m;
      if (clock::now() >= until) return std::nullopt;
      if (waiting_for_slot_)
        std::this_thread::sleep_for(std::chrono::microseconds(20)); // a slot frees when device work ends
      else
        wait(until);
    }
  }

  void release() override {
    if (!held_) return;
    held_ = false;
    detail::ucx_inbound& in = *inbox_.front();
    if (in.slot != nullptr) dev_->give_back(in.slot);
    recycle(std::move(in.frame));
    inbox_.pop_front();
  }

private:
  // `slots`: payloads live in the memory it hands out, else in the transport's host buffers.
  ucx_transport(ucx_options o, role r, ucx_payload_slots* slots)
      : o_(std::move(o)), role_(r), auth_(o_.auth, o_.tags, r), dev_(slots) {
    detail::check_link_security("ucx", o_.host, o_.port, o_.listen, o_.auth.get(), o_.tags, o_.allow_unauthenticated,
                                r);
    where_ = rlpt::detail::format("ucx {}:{}", o_.host, o_.port);
    RLPT_CHECK(dev_ == nullptr || o_.auth == nullptr || o_.tags == integrity::control, errors::sync::bad_link,
               "{}: ucx_options::tags is integrity::full, whose tags cover payload bytes, which a link with device "
               "payloads never reads on the host: use integrity::control (handshake, manifest and commit "
               "authenticated, payload pieces checked by their digests), or staged_link over a host link for full tags",
               where_);
    try {
      open_worker();
      if (dev_ != nullptr && !moves(dev_->memory_type())) {
        RLPT_CHECK(dev_->memory_type() != UCS_MEMORY_TYPE_CUDA, errors::sync::ucx,
                   "{}: device payloads need a UCX built with CUDA (cuda_copy, cuda_ipc, GPUDirect RDMA); this one "
                   "does not move CUDA memory (Debian's libucx has no CUDA transports, PyPI's libucx-cu13 has them; "
                   "staged_link moves device payloads over a host link instead)",
                   where_);
        RLPT_FAIL(errors::sync::ucx, "{}: this UCX does not move the payload slots' memory (ucs_memory_type_t {})",
                  where_, static_cast<int>(dev_->memory_type()));
      }
      if (o_.listen) open_listener();
    } catch (...) {
      close();
      throw;
    }
    where_ = rlpt::detail::format("ucx {}:{} ({}, {})", o_.host, o_.listen ? port_ : o_.port,
                                  r == role::sender ? "sender" : "receiver", o_.listen ? "listening" : "connecting");
  }

  void close() noexcept {
    // Flush what was sent (a last frame may still sit in UCX's buffers), bounded, then force.
    close_ep(ep_, true);
    for (const auto& c : candidates_) close_ep(c, false);
    close_ep(pending_, false);
    discard([](const detail::ucx_inbound&) { return true; });
    const deadline until = clock::now() + std::chrono::seconds(1);
    while (!zombies_.empty() && clock::now() < until) progress();
    for (auto& z : zombies_) static_cast<void>(z.release()); // UCX may still write into it: never freed
    for (ucp_conn_request_h req : requests_) ucp_listener_reject(listener_, req);
    if (listener_ != nullptr) ucp_listener_destroy(listener_);
    if (worker_ != nullptr) ucp_worker_destroy(worker_);
    if (context_ != nullptr) ucp_cleanup(context_);
    listener_ = nullptr;
    worker_ = nullptr;
    context_ = nullptr;
  }

  static constexpr std::chrono::milliseconds reconnect_pause{5};
  static constexpr std::size_t headroom = 64 << 10; // before the payload: room for a bucket's meta block
  static constexpr std::size_t slot_align = 256;    // a device payload starts this aligned in its slot

  // --- UCX objects ----------------------------------------------------------------------

  void open_worker() {
    ucp_config_t* cfg = nullptr;
    check(ucp_config_read(nullptr, nullptr, &cfg), "reading UCX's configuration");
    if (!o_.transports.empty()) {
      const ucs_status_t s = ucp_config_modify(cfg, "TLS", o_.transports.c_str());
      if (s != UCS_OK) ucp_config_release(cfg);
      RLPT_CHECK(s == UCS_OK, errors::sync::bad_link, "{}: ucx_options::transports \"{}\" is not a UCX_TLS list: {}",
                 where_, o_.transports, ucs_status_string(s));
    }
    ucp_params_t p{};
    p.field_mask = UCP_PARAM_FIELD_FEATURES;
    p.features = UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
    const ucs_status_t s = ucp_init(&p, cfg, &context_);
    ucp_config_release(cfg);
    check(s, "creating the UCX context");
    ucp_worker_params_t w{};
    w.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    w.thread_mode = UCS_THREAD_MODE_SINGLE;
    check(ucp_worker_create(context_, &w, &worker_), "creating the UCX worker");
    check(ucp_worker_get_efd(worker_, &efd_), "getting the UCX worker's event fd");
    for (const unsigned id : {detail::ucx_am_frame, detail::ucx_am_hello}) {
      ucp_am_handler_param_t h{};
      h.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG;
      h.id = id;
      h.cb = id == detail::ucx_am_frame ? &ucx_transport::on_frame : &ucx_transport::on_hello;
      h.arg = this;
      check(ucp_worker_set_am_recv_handler(worker_, &h), "registering the active-message handlers");
    }
  }

  void open_listener() {
    sockaddr_in a = address(o_.host, o_.port);
    ucp_listener_params_t p{};
    p.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
    p.sockaddr.addr = reinterpret_cast<const sockaddr*>(&a);
    p.sockaddr.addrlen = sizeof(a);
    p.conn_handler.cb = &ucx_transport::on_connection;
    p.conn_handler.arg = this;
    const ucs_status_t s = ucp_listener_create(worker_, &p, &listener_);
    RLPT_CHECK(s == UCS_OK, errors::sync::ucx, "{}: listening on {}:{} failed: {}", where_, o_.host, o_.port,
               ucs_status_string(s));
    ucp_listener_attr_t attr{};
    attr.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR;
    check(ucp_listener_query(listener_, &attr), "querying the listener");
    port_ = ntohs(reinterpret_cast<const sockaddr_in*>(&attr.sockaddr)->sin_port);
  }

  static sockaddr_in address(const std::string& host, std::uint16_t port) {
    return detail::ipv4_address(host, port, errors::sync::ucx, "ucx");
  }

  [[nodiscard]] bool moves(ucs_memory_type_t type) const {
    ucp_context_attr_t a{};
    a.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES;
    check(ucp_context_query(context_, &a), "querying UCX's memory types");
    return (a.memory_types & UCS_BIT(type)) != 0;
  }

  void check(ucs_status_t s, std::string_view what) const {
    RLPT_CHECK(s == UCS_OK, errors::sync::ucx, "{}: {} failed: {}", where_, what, ucs_status_string(s));
  }

  ucp_ep_h create_ep(ucp_ep_params_t p) {
    p.field_mask |= UCP_EP_PARAM_FIELD_ERR_HANDLER | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
    p.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    p.err_handler.cb = &ucx_transport::on_ep_error;
    p.err_handler.arg = this;
    ucp_ep_h ep = nullptr;
    const ucs_status_t s = ucp_ep_create(worker_, &p, &ep);
    return s == UCS_OK ? ep : nullptr;
  }

  // Closes an endpoint: flushes first (bounded) when `flush`, else at once.
  void close_ep(ucp_ep_h ep, bool flush) noexcept {
    if (ep == nullptr) return;
    const bool failed = std::find(failed_.begin(), failed_.end(), ep) != failed_.end();
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = flush && !failed ? 0 : UCP_EP_CLOSE_FLAG_FORCE;
    ucs_status_ptr_t r = ucp_ep_close_nbx(ep, &p);
    const deadline until = clock::now() + std::chrono::seconds(1);
    while (UCS_PTR_IS_PTR(r) && ucp_request_check_status(r) == UCS_INPROGRESS && clock::now() < until)
      ucp_worker_progress(worker_);
    if (UCS_PTR_IS_PTR(r)) {
      if (ucp_request_check_status(r) == UCS_INPROGRESS) ucp_request_cancel(worker_, r);
      ucp_request_free(r);
    }
    std::erase(failed_, ep);
    discard([&](const detail::ucx_inbound& m) { return m.ep == ep; });
    std::erase_if(hellos_, [&](const auto& m) { return m->ep == ep; });
  }

  // Forgets received frames matching `pred`; a rendezvous receive still in flight is cancelled
  // and kept until UCX completes it (its buffer must outlive the transfer).
  template <class Pred> void discard(Pred pred) noexcept {
    for (auto it = inbox_.begin(); it != inbox_.end();) {
      if (!pred(**it)) {
        ++it;
        continue;
      }
      if ((*it)->held != nullptr) {
        ucp_am_data_release(worker_, (*it)->held);
      }
      if ((*it)->request != nullptr) {
        ucp_request_cancel(worker_, (*it)->request);
        zombies_.push_back(std::move(*it));
      } else {
        if ((*it)->slot != nullptr) dev_->give_back((*it)->slot);
        recycle(std::move((*it)->frame));
      }
      it = inbox_.erase(it);
    }
  }

  // A frame buffer of `size` bytes: the smallest pooled one that fits, else a new one.
  detail::ucx_buffer acquire(std::size_t size) {
    auto best = pool_.end();
    for (auto it = pool_.begin(); it != pool_.end(); ++it)
      if (it->capacity >= size && (best == pool_.end() || it->capacity < best->capacity)) best = it;
    detail::ucx_buffer b;
    if (best != pool_.end()) {
      b = std::move(*best);
      pool_.erase(best);
    } else {
      b.bytes.reset(new std::byte[std::max<std::size_t>(size, 1)]);
      b.capacity = size;
    }
    b.size = size;
    return b;
  }

  // Keeps a few buffers for the next frames (a model's buckets are alike in size).
  void recycle(detail::ucx_buffer b) noexcept {
    if (b.bytes == nullptr) return;
    if (pool_.size() == 4)
      pool_.erase(std::min_element(pool_.begin(), pool_.end(),
                                   [](const auto& x, const auto& y) { return x.capacity < y.capacity; }));
    pool_.push_back(std::move(b));
  }

  // --- callbacks (run inside ucp_worker_progress) ---------------------------------------

  static void on_connection(ucp_conn_request_h req, void* arg) {
    static_cast<ucx_transport*>(arg)->requests_.push_back(req);
  }

  static void on_ep_error(void* arg, ucp_ep_h ep, ucs_status_t status) {
    auto* self = static_cast<ucx_transport*>(arg);
    self->failed_.push_back(ep);
    if (ep == self->ep_) self->lost_status_ = status;
  }

  static ucs_status_t on_hello(void* arg, const void*, size_t, void* data, size_t length,
                               const ucp_am_recv_param_t* param) {
    auto* self = static_cast<ucx_transport*>(arg);
    const bool rndv = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
    if ((param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) == 0 || rndv || length > 256) return UCS_OK; // not ours
    // Only an endpoint in its handshake speaks HELLO, a few times at most.
    const ucp_ep_h from = param->reply_ep;
    if ((from != self->pending_ &&
         std::find(self->candidates_.begin(), self->candidates_.end(), from) == self->candidates_.end()) ||
        self->hellos_.size() >= 16)
      return UCS_OK;
    auto m = std::make_unique<detail::ucx_inbound>();
    m->ep = param->reply_ep;
    m->data.assign(static_cast<const std::byte*>(data), static_cast<const std::byte*>(data) + length);
    m->done = true;
    self->hellos_.push_back(std::move(m));
    return UCS_OK;
  }

  static ucs_status_t on_frame(void* arg, const void* header, size_t header_length, void* data, size_t length,
                               const ucp_am_recv_param_t* param) {
    auto* self = static_cast<ucx_transport*>(arg);
    if ((param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) == 0) return UCS_OK;
    const ucp_ep_h from = param->reply_ep;
    // Only the connected peer (or one completing its handshake) may make this end allocate.
    if (from != self->ep_ &&
        std::find(self->candidates_.begin(), self->candidates_.end(), from) == self->candidates_.end())
      return UCS_OK;
    auto m = std::make_unique<detail::ucx_inbound>();
    m->ep = from;
    m->bad = self->check_header(header, header_length, length);
    m->done = !m->bad.empty(); // refused on arrival: nothing to receive
    if (m->bad.empty()) std::memcpy(m->header.data(), header, detail::ucx_header_bytes);
    detail::ucx_inbound& in = *m;
    self->inbox_.push_back(std::move(m));
    if (!in.bad.empty()) return UCS_OK;
    const bool rndv = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
    std::uint64_t payload_bytes = 0;
    std::memcpy(&payload_bytes, in.header.data() + 8, 8);
    // A device payload is pulled straight into a device slot, once one is free (assign_slots).
    in.wants_slot = rndv && self->dev_ != nullptr && payload_bytes > 0;
    if (rndv && (from != self->ep_ || in.wants_slot)) { // not a byte moves before its sender has authenticated
      in.held = data;
      in.frame.size = length;
      return UCS_INPROGRESS;
    }
    if (!rndv) {
      in.frame = self->acquire(length);
      if (length > 0) std::memcpy(in.frame.bytes.get(), data, length);
      in.done = true;
      return UCS_OK;
    }
    self->pull(in, data, length);
    return UCS_OK;
  }

  // Starts pulling a rendezvous frame into a frame buffer, or (`in.slot` set) into device memory.
  void pull(detail::ucx_inbound& in, void* desc, std::size_t length) {
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    p.cb.recv_am = &ucx_transport::on_pulled;
    p.user_data = &in;
    void* into = nullptr;
    if (in.in_slot) {
      p.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMORY_TYPE;
      p.memory_type = dev_->memory_type();
      in.frame.size = length;
      into = in.slot + in.pad;
    } else {
      in.frame = acquire(length);
      into = in.frame.bytes.get();
    }
    const ucs_status_ptr_t r = ucp_am_recv_data_nbx(worker_, desc, into, length, &p);
    if (r == nullptr) {
      in.done = true;
    } else if (UCS_PTR_IS_ERR(r)) {
      in.done = true;
      in.status = UCS_PTR_STATUS(r);
    } else {
      in.request = r;
    }
  }

  static void on_pulled(void* request, ucs_status_t status, size_t, void* user) {
    auto* in = static_cast<detail::ucx_inbound*>(user);
    in->status = status;
    in->done = true;
    in->request = nullptr;
    ucp_request_free(request);
  }

  // A frame's header, checked before anything is allocated: empty, or what is wrong.
  [[nodiscard]] std::string check_header(const void* h, std::size_t header_length, std::size_t length) const {
    if (header_length != detail::ucx_header_bytes)
      return rlpt::detail::format("a frame header of {} bytes (expected {})", header_length, detail::ucx_header_bytes);
    const auto* b = static_cast<const std::byte*>(h);
    std::uint32_t magic, mb;
    std::uint64_t pb, hcheck;
    std::memcpy(&magic, b, 4);
    std::memcpy(&mb, b + 4, 4);
    std::memcpy(&pb, b + 8, 8);
    std::memcpy(&hcheck, b + 32, 8);
    if (magic != detail::ucx_magic) return rlpt::detail::format("bad magic 0x{:08x}", magic);
    if (xxh3(b, 32) != hcheck) return "header checksum mismatch";
    if (mb > o_.max_meta)
      return rlpt::detail::format("a meta block of {} bytes, larger than max_meta {}", mb, o_.max_meta);
    if (pb > o_.max_payload)
      return rlpt::detail::format("a payload of {} bytes, larger than max_payload {}", pb, o_.max_payload);
    if (length != mb + pb)
      return rlpt::detail::format("{} data bytes where the header announces {} meta + {} payload bytes", length, mb,
                                  pb);
    return {};
  }

  // --- progress and waiting -------------------------------------------------------------

  void progress() {
    while (ucp_worker_progress(worker_) != 0) {}
    std::erase_if(zombies_, [&](const auto& z) {
      if (z->request != nullptr) return false;
      if (z->slot != nullptr) dev_->give_back(z->slot); // UCX is done writing into it
      return true;
    });
  }

  // Sleeps until the worker has an event or `until` (at most 100 ms at a time).
  void wait(deadline until) {
    if (ucp_worker_arm(worker_) == UCS_ERR_BUSY) return; // events pending: progress again
    pollfd p{efd_, POLLIN, 0};
    ::poll(&p, 1, detail::ms_until(until));
  }

  // Waits for a send request; a failure or the deadline drops the connection.
  void finish(ucs_status_ptr_t r, ucp_ep_h ep, deadline until, std::string_view what) {
    if (r == nullptr) return;
    if (UCS_PTR_IS_ERR(r)) lost(ep, UCS_PTR_STATUS(r), what);
    for (;;) {
      progress();
      const ucs_status_t s = ucp_request_check_status(r);
      if (s != UCS_INPROGRESS) {
        ucp_request_free(r);
        if (s != UCS_OK) lost(ep, s, what);
        return;
      }
      if (clock::now() >= until) {
        ucp_request_cancel(worker_, r);
        ucp_request_free(r);
        drop(ep);
        detail::timeout(where_, rlpt::detail::format("{} (the peer stopped taking data)", what));
      }
      wait(until);
    }
  }

  void send_on(ucp_ep_h ep, unsigned id, std::span<const std::byte> header, std::span<const ucp_dt_iov_t> iov,
               deadline until, std::string_view what, bool device = false) {
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = UCP_AM_SEND_FLAG_REPLY;
    if (device) {
      p.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMORY_TYPE;
      p.memory_type = dev_->memory_type();
    }
    const void* buffer = nullptr;
    std::size_t count = 0;
    if (iov.size() == 1) {
      buffer = iov[0].buffer;
      count = iov[0].length;
    } else if (iov.size() > 1) {
      p.op_attr_mask |= UCP_OP_ATTR_FIELD_DATATYPE;
      p.datatype = ucp_dt_make_iov();
      buffer = iov.data();
      count = iov.size();
    }
    finish(ucp_am_send_nbx(ep, id, header.data(), header.size(), buffer, count, &p), ep, until, what);
  }

  void send_hello(ucp_ep_h ep, std::span<const std::byte> bytes, deadline until) {
    const ucp_dt_iov_t part{const_cast<std::byte*>(bytes.data()), bytes.size()};
    send_on(ep, detail::ucx_am_hello, {}, std::span(&part, 1), until, "sending the handshake");
  }

  // The next HELLO from `ep` by `until`; empty when none came or the endpoint failed.
  std::optional<std::vector<std::byte>> await_hello(ucp_ep_h ep, deadline until) {
    for (;;) {
      progress();
      for (auto it = hellos_.begin(); it != hellos_.end(); ++it)
        if ((*it)->ep == ep) {
          std::vector<std::byte> got = std::move((*it)->data);
          hellos_.erase(it);
          return got;
        }
      if (is_failed(ep) || clock::now() >= until) return std::nullopt;
      wait(until);
    }
  }

  [[nodiscard]] bool is_failed(ucp_ep_h ep) const {
    return std::find(failed_.begin(), failed_.end(), ep) != failed_.end();
  }

  // --- connections ----------------------------------------------------------------------

  [[noreturn]] void lost(ucp_ep_h ep, ucs_status_t s, std::string_view what) {
    drop(ep);
    RLPT_FAIL(errors::sync::peer_lost, "{}: {} failed: the peer is gone ({})", where_, what, ucs_status_string(s));
  }

  void drop(ucp_ep_h ep) {
    if (ep == ep_) {
      close_ep(ep_, false);
      ep_ = nullptr;
      lost_status_ = UCS_OK;
      held_ = false;
      discard([](const detail::ucx_inbound&) { return true; });
    } else {
      close_ep(ep, false);
    }
  }

  // The current peer failed (its error callback ran): rlpt.sync.peer_lost, once.
  void check_peer() {
    if (ep_ == nullptr || lost_status_ == UCS_OK) return;
    lost(ep_, lost_status_, "the connection");
  }

  void adopt(ucp_ep_h ep) {
    if (ep_ != nullptr) drop(ep_);
    std::erase(candidates_, ep);
    ep_ = ep;
    tx_seq_ = rx_seq_ = 0;
    ++counters_.handshakes;
    for (auto& in : inbox_) // frames it sent right after its proof: now they may move
      if (in->ep == ep && in->held != nullptr && !in->wants_slot) {
        void* desc = std::exchange(in->held, nullptr);
        pull(*in, desc, in->frame.size);
      }
  }

  void refused(ucp_ep_h ep, const std::string& why) {
    ++counters_.refused_peers;
    counters_.refused(why);
    std::erase(candidates_, ep);
    close_ep(ep, true);
  }

  void connect_or_accept(deadline until) {
    for (;;) {
      progress();
      if (o_.listen) accept_new(until);
      check_peer();
      if (ep_ != nullptr) return;
      if (!o_.listen && try_connect(until)) return;
      if (clock::now() >= until)
        detail::timeout(where_, o_.listen ? "waiting for the peer to connect" : "connecting to the peer");
      if (o_.listen) wait(until);
    }
  }

  // Listening: takes each waiting connection request in turn; one that completes its HELLO
  // exchange replaces the current connection, one that does not is refused and counted.
  void accept_new(deadline) {
    while (!requests_.empty()) {
      ucp_conn_request_h req = requests_.front();
      requests_.pop_front();
      ucp_ep_params_t p{};
      p.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST;
      p.conn_request = req;
      ucp_ep_h ep = create_ep(p);
      if (ep == nullptr) continue; // the request went stale (the client is gone)
      candidates_.push_back(ep);
      const std::string why = accept_handshake(ep);
      if (why.empty())
        adopt(ep);
      else
        refused(ep, why);
    }
  }

  // The plain HELLO: magic and role.
  [[nodiscard]] std::array<std::byte, 8> plain_hello() const {
    std::array<std::byte, 8> h{};
    std::memcpy(h.data(), &detail::ucx_plain_hello, 4);
    h[4] = static_cast<std::byte>(role_);
    return h;
  }

  [[nodiscard]] std::string check_plain_hello(std::span<const std::byte> h) const {
    std::uint32_t magic = 0;
    if (h.size() >= 4) std::memcpy(&magic, h.data(), 4);
    if (h.size() == detail::hello_bytes && magic == detail::hello_magic)
      return "the peer started an authenticated handshake and this end has no authenticator: configure both ends "
             "with the job's secret";
    if (h.size() != 8 || magic != detail::ucx_plain_hello) return "the peer's HELLO is not an rlpt UCX HELLO";
    if (static_cast<std::uint8_t>(h[4]) == static_cast<std::uint8_t>(role_))
      return rlpt::detail::format("both ends are {}s", role_ == role::sender ? "sender" : "receiver");
    return {};
  }

  // The listener's side of the HELLO exchange (with auth, the handshake of auth.hpp): empty, or
  // why the peer is refused. Bounded by handshake_timeout.
  std::string accept_handshake(ucp_ep_h ep) {
    const deadline until = clock::now() + o_.handshake_timeout;
    auto hello_c = await_hello(ep, until);
    if (!hello_c) return "the connecting peer sent no HELLO in time";
    try {
      if (!auth_.enabled()) {
        std::string why = check_plain_hello(*hello_c);
        send_hello(ep, plain_hello(), until); // an rlpt peer then says why too
        return why;
      }
      if (hello_c->size() != detail::hello_bytes) {
        send_hello(ep, plain_hello(), until);
        return "the peer did not start an authenticated handshake (is it configured without an authenticator?)";
      }
      const auto hc = std::span<const std::byte, detail::hello_bytes>(hello_c->data(), detail::hello_bytes);
      std::string mismatch = auth_.check_hello(hc);
      const std::array<std::byte, detail::hello_bytes> hello_a = auth_.hello();
      const authenticator::mac mine = auth_.proof(true, hc, hello_a);
      std::array<std::byte, detail::hello_bytes + authenticator::mac_bytes> out{};
      std::memcpy(out.data(), hello_a.data(), hello_a.size());
      std::memcpy(out.data() + hello_a.size(), mine.data(), mine.size());
      send_hello(ep, out, until);
      if (!mismatch.empty()) return mismatch;
      auto proof = await_hello(ep, until);
      if (!proof) return "the connecting peer sent no proof in time";
      if (!detail::peer_auth::constant_time_equal(*proof, auth_.proof(false, hc, hello_a)))
        return "the connecting peer's proof is wrong: it does not hold the job's secret, or it replayed a recorded "
               "handshake";
      auth_.establish(true, hc, hello_a);
      return {};
    } catch (const error& e) { // the candidate broke off mid-handshake
      return rlpt::detail::format("the handshake failed: {}", e.what());
    }
  }

  // Connecting: a new endpoint and the connector's side of the HELLO exchange. The wait for
  // the listener's answer ends at `until` and resumes on the next call (a listener that is not
  // accepting yet must not block a short poll); an attempt older than handshake_timeout, or
  // whose endpoint failed (nobody listening, unreachable), starts over. False: not connected
  // (yet); a refusal throws rlpt.sync.auth.
  bool try_connect(deadline until) {
    if (pending_ != nullptr && (is_failed(pending_) || clock::now() >= pending_since_ + o_.handshake_timeout)) {
      close_ep(pending_, false);
      pending_ = nullptr;
      std::this_thread::sleep_for(reconnect_pause);
    }
    if (pending_ == nullptr) {
      sockaddr_in a = address(o_.host, o_.port);
      ucp_ep_params_t p{};
      p.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR;
      p.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
      p.sockaddr.addr = reinterpret_cast<const sockaddr*>(&a);
      p.sockaddr.addrlen = sizeof(a);
      pending_ = create_ep(p);
      if (pending_ == nullptr) return false;
      pending_since_ = clock::now();
      if (auth_.enabled()) {
        hello_c_ = auth_.hello();
      } else {
        const auto h = plain_hello();
        std::copy(h.begin(), h.end(), hello_c_.begin());
      }
      ucp_request_param_t q{};
      q.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
      q.flags = UCP_AM_SEND_FLAG_REPLY;
      // Not waited for: it completes once UCX has wired the endpoint up; a failure shows as the
      // endpoint's error. hello_c_ outlives it (a member, rewritten only on a new attempt).
      const std::size_t n = auth_.enabled() ? detail::hello_bytes : 8;
      const ucs_status_ptr_t r = ucp_am_send_nbx(pending_, detail::ucx_am_hello, nullptr, 0, hello_c_.data(), n, &q);
      if (UCS_PTR_IS_PTR(r)) ucp_request_free(r);
    }
    const deadline limit = std::min(until, pending_since_ + o_.handshake_timeout);
    auto in = await_hello(pending_, limit);
    if (!in) return false; // resumes on the next call
    ucp_ep_h ep = pending_;
    pending_ = nullptr;
    candidates_.push_back(ep); // until adopted, frames from it are not accepted either
    std::string why;
    try {
      if (!auth_.enabled()) {
        why = check_plain_hello(*in);
      } else if (in->size() != detail::hello_bytes + authenticator::mac_bytes) {
        why = "the listener answered without authentication (is it configured without ucx_options::auth?)";
      } else {
        const auto hc = std::span<const std::byte, detail::hello_bytes>(hello_c_);
        const auto ha = std::span<const std::byte, detail::hello_bytes>(in->data(), detail::hello_bytes);
        why = auth_.check_hello(ha);
        if (why.empty() && !detail::peer_auth::constant_time_equal(std::span(*in).subspan(detail::hello_bytes),
                                                                   auth_.proof(true, hc, ha)))
          why = "the listening peer's proof is wrong: it does not hold the job's secret (or this end has the wrong "
                "one)";
        // Sent even when refusing (it proves nothing beyond this transcript): the listener then
        // reports a wrong secret as such instead of a silent peer.
        send_hello(ep, auth_.proof(false, hc, ha), clock::now() + o_.handshake_timeout);
        if (why.empty()) auth_.establish(false, hc, ha);
      }
    } catch (const error&) { // the endpoint broke during the exchange: try again later
      std::erase(candidates_, ep);
      close_ep(ep, false);
      return false;
    }
    if (why.empty()) {
      adopt(ep);
      return true;
    }
    refused(ep, why);
    RLPT_FAIL(auth_.enabled() ? errors::sync::auth : errors::sync::bad_link, "{}: peer refused: {}", where_, why);
  }

  // Device payloads: gives each payload frame of the connection a slot, in arrival order (so a
  // frame never waits for a slot a later frame holds), and pulls a held rendezvous frame into
  // its slot, laid out so that the payload after the meta block starts slot-aligned.
  void assign_slots() {
    waiting_for_slot_ = false;
    for (auto& in : inbox_) {
      if (in->ep != ep_ || in->slot != nullptr || !in->bad.empty() || (!in->wants_slot && !in->done)) continue;
      std::uint32_t mb;
      std::uint64_t pb;
      std::memcpy(&mb, in->header.data() + 4, 4);
      std::memcpy(&pb, in->header.data() + 8, 8);
      if (pb == 0) continue;
      const std::size_t pad = in->wants_slot ? (slot_align - mb % slot_align) % slot_align : 0;
      std::byte* slot = dev_->take(in->wants_slot ? pad + in->frame.size : static_cast<std::size_t>(pb));
      if (slot == nullptr) {
        waiting_for_slot_ = true;
        return;
      }
      in->slot = slot;
      in->pad = pad;
      if (in->wants_slot) {
        in->wants_slot = false;
        in->in_slot = true;
        pull(*in, std::exchange(in->held, nullptr), in->frame.size);
      }
    }
  }

  // Device payloads: the frame's meta block in host memory and its payload in its slot (copying
  // whichever arrived in the other memory); false while it has no slot yet.
  bool place_device_frame(detail::ucx_inbound& in, std::size_t mb, std::size_t pb, deadline until) {
    if (in.device_payload != nullptr) return true;
    if (in.slot == nullptr) {
      waiting_for_slot_ = true;
      return false;
    }
    try {
      if (in.in_slot) { // pulled: [pad][meta][payload] in the slot
        std::byte* at = in.slot + in.pad;
        in.frame = acquire(mb);
        if (mb > 0) dev_->copy(in.frame.bytes.get(), at, mb, until);
        in.device_payload = at + mb;
      } else { // eager: both arrived in host memory
        dev_->copy(in.slot, in.frame.bytes.get() + mb, pb, until);
        in.device_payload = in.slot;
      }
    } catch (...) { // a copy that failed or hung: this connection's frames are not trusted
      drop(ep_);
      throw;
    }
    return true;
  }

  // The next frame from the current peer, checked, or nullopt if none is complete yet.
  std::optional<message> front_frame(deadline until) {
    const ucp_ep_h current = ep_;
    discard([&](const detail::ucx_inbound& m) { return m.ep != current; }); // a replaced or refused connection's
    if (inbox_.empty() || inbox_.front()->ep != ep_ || !inbox_.front()->done) return std::nullopt;
    detail::ucx_inbound& in = *inbox_.front();
    if (!in.bad.empty()) {
      const std::string bad = std::move(in.bad);
      drop(ep_);
      RLPT_FAIL(errors::sync::wire, "{}: bad frame ({}); connection dropped", where_, bad);
    }
    if (in.status != UCS_OK) lost(ep_, in.status, "receiving a frame");
    std::uint32_t mb;
    std::uint64_t pb, mcheck, seq;
    std::memcpy(&mb, in.header.data() + 4, 4);
    std::memcpy(&pb, in.header.data() + 8, 8);
    std::memcpy(&mcheck, in.header.data() + 16, 8);
    std::memcpy(&seq, in.header.data() + 24, 8);
    const bool device = dev_ != nullptr && pb > 0;
    if (device && !place_device_frame(in, mb, static_cast<std::size_t>(pb), until)) return std::nullopt;
    const std::span<const std::byte> meta(in.frame.bytes.get(), mb);
    const std::span<const std::byte> payload(device ? in.device_payload : in.frame.bytes.get() + mb,
                                             static_cast<std::size_t>(pb));
    if (seq != rx_seq_) {
      const std::uint64_t want = rx_seq_;
      drop(ep_);
      RLPT_FAIL(errors::sync::wire, "{}: frame {} arrived where frame {} was due; connection dropped", where_, seq,
                want);
    }
    ++rx_seq_;
    if (xxh3(meta.data(), meta.size()) != mcheck) {
      drop(ep_);
      RLPT_FAIL(errors::sync::wire, "{}: frame meta block of {} bytes fails its checksum", where_, meta.size());
    }
    if (auth_.enabled() &&
        !auth_.open(std::span<const std::byte>(in.header).first(detail::ucx_tag_at), meta, payload,
                    std::span<const std::byte>(in.header).subspan<detail::ucx_tag_at, authenticator::tag_bytes>())) {
      drop(ep_);
      ++counters_.refused_frames;
      counters_.refused(rlpt::detail::format(
          "a frame ({} meta bytes, {} payload bytes) failed its {} tag: altered, replayed or reordered "
          "in flight, or not from the authenticated peer",
          meta.size(), payload.size(), name(o_.tags)));
      RLPT_FAIL(errors::sync::auth, "{}: {}; connection dropped", where_, counters_.last_refusal);
    }
    held_ = true;
    return message{meta, payload};
  }

  ucx_options o_;
  role role_;
  detail::peer_auth auth_;
  auth_counters counters_;
  std::string where_;
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  ucp_listener_h listener_ = nullptr;
  int efd_ = -1;
  std::uint16_t port_ = 0;
  ucp_ep_h ep_ = nullptr;             // the connection
  ucs_status_t lost_status_ = UCS_OK; // set by the connection's error callback
  std::vector<ucp_ep_h> candidates_;  // handshake under way
  ucp_ep_h pending_ = nullptr;        // connecting: the attempt waiting for the listener's HELLO
  clock::time_point pending_since_{};
  std::array<std::byte, detail::hello_bytes> hello_c_{};
  std::vector<ucp_ep_h> failed_; // endpoints whose error callback ran
  std::deque<ucp_conn_request_h> requests_;
  std::deque<std::unique_ptr<detail::ucx_inbound>> inbox_; // frames, in arrival order
  std::deque<std::unique_ptr<detail::ucx_inbound>> hellos_;
  std::vector<std::unique_ptr<detail::ucx_inbound>> zombies_; // discarded, their receive still in flight
  std::vector<detail::ucx_buffer> pool_;                      // frame buffers for reuse
  bool held_ = false;
  std::uint64_t tx_seq_ = 0, rx_seq_ = 0;
  std::vector<std::byte> tx_payload_;
  ucx_payload_slots* dev_ = nullptr; // payload slots (device memory: ucx_device_link), else host buffers
  std::byte* tx_device_ = nullptr;   // the device slot of the last payload_buffer()
  std::size_t tx_device_bytes_ = 0;
  bool waiting_for_slot_ = false; // a complete frame waits for a device slot to free
};

} // namespace sync
RLPT_NAMESPACE_END
