// SPDX-License-Identifier: Apache-2.0
//! @file
//! In-process transport: two link endpoints over a shared queue with a bounded pool of payload
//! buffers (the credits), for tests and for trainer and engine living in one process.
//!
//!     rlpt::sync::inproc_pipe pipe({.slots = 2});
//!     rlpt::sync::inproc_transport tx(pipe, rlpt::sync::role::sender);
//!     rlpt::sync::inproc_transport rx(pipe, rlpt::sync::role::receiver);
#pragma once

#include <rlpt/config.hpp>
#include <rlpt/core/error.hpp>
#include <rlpt/sync/link.hpp>

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

RLPT_NAMESPACE_BEGIN
namespace sync {

struct inproc_options {
  //! Payload buffers per direction: 2 = double buffering (vLLM weight_transfer num_buffers).
  std::size_t slots = 2;
  //! Largest payload of one message.
  std::uint64_t max_payload = std::uint64_t{1} << 34;
};

//! The shared state of an in-process link pair. Outlives both endpoints.
class inproc_pipe {
public:
  explicit inproc_pipe(inproc_options o = {}) : o_(o) {
    RLPT_CHECK(o.slots >= 1, errors::sync::bad_link, "inproc_options::slots must be at least 1, got {}", o.slots);
    for (auto& d : dir_) {
      d.buffers.resize(o.slots);
      for (std::size_t i = 0; i < o.slots; ++i) d.free.push_back(static_cast<int>(i));
    }
  }
  inproc_pipe(const inproc_pipe&) = delete;
  inproc_pipe& operator=(const inproc_pipe&) = delete;

private:
  template <class> friend class basic_inproc_transport;
  struct msg {
    std::vector<std::byte> meta;
    int buffer = -1;
    std::uint64_t payload = 0;
  };
  struct direction {
    std::deque<msg> queue;
    std::vector<std::vector<std::byte>> buffers;
    std::vector<int> free;
  };
  inproc_options o_;
  std::mutex mu_;
  std::condition_variable cv_;
  direction dir_[2];              // [0]: sender -> receiver, [1]: receiver -> sender
  bool open_[2] = {false, false}; // endpoint attached: [0] sender, [1] receiver
};

template <class = void> class basic_inproc_transport final : public link {
public:
  //! Attaching drops whatever a previous endpoint of this role left unread (a restart).
  basic_inproc_transport(inproc_pipe& p, role r);

  ~basic_inproc_transport() override {
    std::lock_guard lock(p_.mu_);
    if (held_) {
      if (held_->buffer >= 0) p_.dir_[1 - me_].free.push_back(held_->buffer);
      held_.reset();
    }
    if (reserved_ >= 0) p_.dir_[me_].free.push_back(reserved_);
    p_.open_[me_] = false;
    p_.cv_.notify_all();
  }

  [[nodiscard]] link_info info() const override {
    return {me_ == 0 ? "inproc (sender)" : "inproc (receiver)", true, p_.o_.max_payload, memory_space::host};
  }

  RLPT_INLINE std::span<std::byte> payload_buffer(std::uint64_t bytes, deadline until) override;

  RLPT_INLINE void send(std::span<const std::byte> meta, std::uint64_t payload_bytes, deadline) override;

  RLPT_INLINE std::optional<message> receive(deadline until) override;

  void release() override {
    if (!held_) return;
    std::lock_guard lock(p_.mu_);
    if (held_->buffer >= 0) p_.dir_[1 - me_].free.push_back(held_->buffer);
    held_.reset();
    p_.cv_.notify_all();
  }

private:
  void check_peer() const {
    RLPT_CHECK(p_.open_[1 - me_], errors::sync::peer_lost, "inproc: the {} endpoint is gone",
               me_ == 0 ? "receiver" : "sender");
  }

  inproc_pipe& p_;
  int me_;
  int reserved_ = -1;
  std::optional<inproc_pipe::msg> held_;
};
using inproc_transport = basic_inproc_transport<>;
RLPT_EXTERN_TEMPLATE(class basic_inproc_transport<>)

} // namespace sync
RLPT_NAMESPACE_END

#if RLPT_HEADER_IMPL()
RLPT_NAMESPACE_BEGIN
namespace sync {

template <class Tag>
RLPT_INLINE basic_inproc_transport<Tag>::basic_inproc_transport(inproc_pipe& p, role r)
    : p_(p), me_(r == role::sender ? 0 : 1) {
  std::lock_guard lock(p_.mu_);
  RLPT_CHECK(!p_.open_[me_], errors::sync::bad_link, "inproc pipe already has a {} endpoint",
             me_ == 0 ? "sender" : "receiver");
  p_.open_[me_] = true;
  auto& in = p_.dir_[1 - me_];
  for (auto& m : in.queue)
    if (m.buffer >= 0) in.free.push_back(m.buffer);
  in.queue.clear();
  p_.cv_.notify_all();
}

template <class Tag>
RLPT_INLINE std::span<std::byte> basic_inproc_transport<Tag>::payload_buffer(std::uint64_t bytes, deadline until) {
  RLPT_CHECK(bytes <= p_.o_.max_payload, errors::sync::too_large, "inproc: payload of {} bytes exceeds max_payload {}",
             bytes, p_.o_.max_payload);
  std::unique_lock lock(p_.mu_);
  auto& out = p_.dir_[me_];
  if (reserved_ < 0) {
    if (!p_.cv_.wait_until(lock, until, [&] { return !out.free.empty() || !p_.open_[1 - me_]; }))
      detail::timeout(info().name, "waiting for a free payload buffer (the receiver holds all of them)");
    check_peer();
    reserved_ = out.free.back();
    out.free.pop_back();
  }
  auto& buf = out.buffers[static_cast<std::size_t>(reserved_)];
  if (buf.size() < bytes) buf.resize(static_cast<std::size_t>(bytes));
  return {buf.data(), static_cast<std::size_t>(bytes)};
}

template <class Tag>
RLPT_INLINE void basic_inproc_transport<Tag>::send(std::span<const std::byte> meta, std::uint64_t payload_bytes,
                                                   deadline) {
  std::lock_guard lock(p_.mu_);
  check_peer();
  auto& out = p_.dir_[me_];
  inproc_pipe::msg m;
  m.meta.assign(meta.begin(), meta.end());
  if (payload_bytes > 0) {
    RLPT_CHECK(reserved_ >= 0 && out.buffers[static_cast<std::size_t>(reserved_)].size() >= payload_bytes,
               errors::sync::bad_link, "inproc: send of {} payload bytes without a payload_buffer() of that size",
               payload_bytes);
    m.buffer = reserved_;
    m.payload = payload_bytes;
    reserved_ = -1;
  }
  out.queue.push_back(std::move(m));
  p_.cv_.notify_all();
}

template <class Tag> RLPT_INLINE std::optional<message> basic_inproc_transport<Tag>::receive(deadline until) {
  release();
  std::unique_lock lock(p_.mu_);
  auto& in = p_.dir_[1 - me_];
  if (!p_.cv_.wait_until(lock, until, [&] { return !in.queue.empty() || !p_.open_[1 - me_]; })) return std::nullopt;
  if (in.queue.empty()) check_peer();
  held_ = std::move(in.queue.front());
  in.queue.pop_front();
  message m;
  m.meta = held_->meta;
  if (held_->buffer >= 0)
    m.payload = {in.buffers[static_cast<std::size_t>(held_->buffer)].data(), static_cast<std::size_t>(held_->payload)};
  return m;
}

} // namespace sync
RLPT_NAMESPACE_END
#endif // RLPT_HEADER_IMPL()
