// SPDX-License-Identifier: Apache-2.0
//! @file
//! POSIX shared-memory transport between processes on one host: a ring of payload slots
//! (double-buffered by default) from sender to receiver and a small reply ring back.
//!
//! Credits: the sender may fill a slot only when the receiver has released it (released =
//! the receiver finished copying or loading it), so a slot is never overwritten before the
//! consumer is done (the race SGLang's early ack caused for slime's IPC buckets). The ring
//! counters are lock-free atomics in the segment: single producer, single consumer.
//!
//! Lifetime and failure: the sender creates the segment `/dev/shm/<name>` (sized for its
//! slots) and unlinks it when destroyed; the receiver attaches lazily and re-attaches after a
//! sender restart. A peer that dies is noticed within milliseconds (its pid is checked while
//! waiting) and reported as rlpt.sync.peer_lost rather than waited out; a segment left by a
//! killed sender is unlinked by the receiver that notices, or replaced by the next sender.
//! Pids are compared within one pid namespace (processes of one container or host).
#pragma once

#include <rlpt/config.hpp>
#include <rlpt/core/error.hpp>
#include <rlpt/core/process.hpp>
#include <rlpt/sync/link.hpp>

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <new>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

RLPT_NAMESPACE_BEGIN
namespace sync {

struct shm_options {
  //! Payload slots from sender to receiver: 2 = double buffering (vLLM num_buffers = 2,
  //! checkpoint-engine's ping-pong buffer).
  std::uint32_t slots = 2;
  //! Payload capacity of a slot: at least the plan's bucket size (512 MiB, slime's default).
  std::uint64_t slot_bytes = std::uint64_t{512} << 20;
  //! Meta capacity of a slot (a bucket's piece checksums: 8 bytes per tensor piece). Messages
  //! without payload may use the payload area too (a large manifest in BEGIN).
  std::uint64_t meta_bytes = std::uint64_t{1} << 20;
  //! Reply ring (receiver -> sender): READY / ACK / NACK messages.
  std::uint32_t reply_slots = 8;
  std::uint64_t reply_bytes = std::uint64_t{64} << 10;
};

namespace detail {

inline constexpr std::uint64_t shm_magic = 0x314d485354504c52ull; // "RLPTSHM1"
inline constexpr std::uint64_t shm_page = 4096;

[[nodiscard]] constexpr std::uint64_t page_up(std::uint64_t n) noexcept {
  return (n + shm_page - 1) / shm_page * shm_page;
}

using ::rlpt::detail::pid_alive; // core/process.hpp

struct shm_header {
  std::atomic<std::uint64_t> magic; // written last by the creator
  std::uint32_t layout = 0;
  std::uint32_t slots = 0;
  std::uint64_t slot_meta = 0;
  std::uint64_t slot_payload = 0;
  std::uint32_t reply_slots = 0;
  std::uint32_t pad0 = 0;
  std::uint64_t reply_meta = 0;
  std::uint64_t total_bytes = 0;
  std::uint64_t nonce = 0; // random per creation; rlpt does not read it (kept: the layout stays the same)
  alignas(64) std::atomic<std::int32_t> sender_pid;
  std::atomic<std::uint32_t> sender_closed;
  alignas(64) std::atomic<std::int32_t> receiver_pid;
  alignas(64) std::atomic<std::uint64_t> fwd_head;
  alignas(64) std::atomic<std::uint64_t> fwd_tail;
  alignas(64) std::atomic<std::uint64_t> back_head;
  alignas(64) std::atomic<std::uint64_t> back_tail;
};
static_assert(sizeof(shm_header) <= shm_page);
static_assert(std::atomic<std::uint64_t>::is_always_lock_free && std::atomic<std::int32_t>::is_always_lock_free,
              "the shm ring needs address-free lock-free atomics");

struct shm_slot_header {
  std::uint64_t meta_bytes;
  std::uint64_t payload_bytes;
  std::uint64_t meta_in_payload; // a meta-only message larger than the meta area
};

struct shm_geometry {
  std::uint64_t fwd_stride, fwd_meta_at, fwd_payload_at, back_stride, back_at, total;
  static shm_geometry of(std::uint32_t slots, std::uint64_t meta, std::uint64_t payload, std::uint32_t rslots,
                         std::uint64_t rmeta) {
    shm_geometry g{};
    g.fwd_meta_at = 64;
    g.fwd_payload_at = page_up(64 + meta);
    g.fwd_stride = g.fwd_payload_at + page_up(payload);
    g.back_stride = page_up(64 + rmeta);
    g.back_at = shm_page + slots * g.fwd_stride;
    g.total = g.back_at + rslots * g.back_stride;
    return g;
  }
};

class backoff {
public:
  void pause() {
    if (n_ < 32) {
      ++n_;
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(n_ < 256 ? (++n_, 20) : 200));
    }
  }

private:
  int n_ = 0;
};

} // namespace detail

template <class = void> class basic_shm_transport final : public link {
public:
  //! `name` ([A-Za-z0-9._-], at most 200 characters) names the segment /dev/shm/<name>. The
  //! sender creates it now; the receiver attaches on first use.
  basic_shm_transport(std::string name, role r, shm_options o = {});

  basic_shm_transport(const basic_shm_transport&) = delete;
  basic_shm_transport& operator=(const basic_shm_transport&) = delete;

  ~basic_shm_transport() override {
    if (role_ == role::sender) {
      if (h_) h_->sender_closed.store(1, std::memory_order_release);
      unmap();
      unlink_if_ours();
    } else {
      detach();
    }
  }

  [[nodiscard]] link_info info() const override {
    return {where_, true, role_ == role::sender ? o_.slot_bytes : 0, memory_space::host};
  }

  std::span<std::byte> payload_buffer(std::uint64_t bytes, deadline until) override {
    RLPT_CHECK(role_ == role::sender, errors::sync::bad_link, "{}: only the sender sends payloads", where_);
    RLPT_CHECK(bytes <= o_.slot_bytes, errors::sync::too_large, "{}: payload of {} bytes exceeds the slot size {}",
               where_, bytes, o_.slot_bytes);
    wait_credit(until);
    return {slot(h_->fwd_head.load(std::memory_order_relaxed)) + g_.fwd_payload_at, static_cast<std::size_t>(bytes)};
  }

  RLPT_INLINE void send(std::span<const std::byte> meta, std::uint64_t payload_bytes, deadline until) override;

  std::optional<message> receive(deadline until) override {
    release();
    return role_ == role::sender ? receive_reply(until) : receive_forward(until);
  }

  void release() override {
    if (!held_) return;
    held_ = false;
    if (h_ == nullptr) return;
    if (role_ == role::sender)
      h_->back_tail.fetch_add(1, std::memory_order_release);
    else
      h_->fwd_tail.fetch_add(1, std::memory_order_release);
  }

  //! The segment's name under /dev/shm.
  [[nodiscard]] const std::string& name() const noexcept { return name_; }

private:
  // --- sender side ----------------------------------------------------------------------

  void create();

  // A segment of that name exists: take it over only if its sender is gone.
  void replace_stale(const std::string& path);

  void wait_credit(deadline until);

  void check_receiver() {
    std::int32_t rx = h_->receiver_pid.load(std::memory_order_acquire);
    if (rx != 0 && !detail::pid_alive(rx)) {
      h_->receiver_pid.compare_exchange_strong(rx, 0); // let a new receiver attach
      RLPT_FAIL(errors::sync::peer_lost, "{}: receiver pid {} exited", where_, rx);
    }
  }

  std::optional<message> receive_reply(deadline until);

  void unlink_if_ours() {
    if (ino_ == 0) return;
    const std::string path = "/" + name_;
    const int fd = ::shm_open(path.c_str(), O_RDONLY, 0);
    if (fd < 0) return;
    struct stat st {};
    const bool ours = ::fstat(fd, &st) == 0 && st.st_ino == ino_;
    ::close(fd);
    if (ours) ::shm_unlink(path.c_str());
    ino_ = 0;
  }

  // --- receiver side --------------------------------------------------------------------

  bool try_attach();

  void detach() {
    if (h_ != nullptr) {
      std::int32_t me = ::getpid();
      h_->receiver_pid.compare_exchange_strong(me, 0);
    }
    held_ = false;
    unmap();
    ino_ = 0;
  }

  // Throws peer_lost (once) when the sender went away; the next call re-attaches.
  void check_sender() {
    const std::int32_t tx = h_->sender_pid.load(std::memory_order_acquire);
    const bool closed = h_->sender_closed.load(std::memory_order_acquire) != 0;
    if (!closed && detail::pid_alive(tx)) return;
    if (!closed) unlink_if_ours(); // a killed sender cannot clean up after itself
    detach();
    if (closed) RLPT_FAIL(errors::sync::peer_lost, "{}: sender pid {} closed the link", where_, tx);
    RLPT_FAIL(errors::sync::peer_lost, "{}: sender pid {} exited", where_, tx);
  }

  std::optional<message> receive_forward(deadline until);

  void send_reply(std::span<const std::byte> meta, deadline until);

  // --- mapping --------------------------------------------------------------------------

  [[nodiscard]] std::byte* slot(std::uint64_t counter) const noexcept {
    return base_ + detail::shm_page + (counter % o_.slots) * g_.fwd_stride;
  }

  void map(int fd, std::uint64_t size) {
    void* p = ::mmap(nullptr, static_cast<std::size_t>(size), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      RLPT_FAIL(errors::sync::shm, "{}: mmap of {} bytes failed: {}", where_, size, std::strerror(err));
    }
    base_ = static_cast<std::byte*>(p);
    mapped_ = size;
  }

  void unmap() noexcept {
    if (base_ != nullptr) ::munmap(base_, static_cast<std::size_t>(mapped_));
    base_ = nullptr;
    h_ = nullptr;
    mapped_ = 0;
  }

  std::string name_;
  role role_;
  shm_options o_;
  std::string where_;
  detail::shm_geometry g_{};
  std::byte* base_ = nullptr;
  std::uint64_t mapped_ = 0;
  detail::shm_header* h_ = nullptr;
  ino_t ino_ = 0;
  bool held_ = false;
  std::vector<std::byte> rx_meta_; // receiver: the held message's meta block, copied out of the segment
};
using shm_transport = basic_shm_transport<>;
RLPT_EXTERN_TEMPLATE(class basic_shm_transport<>)

} // namespace sync
RLPT_NAMESPACE_END

#if RLPT_HEADER_IMPL()
RLPT_NAMESPACE_BEGIN
namespace sync {

template <class Tag>
RLPT_INLINE basic_shm_transport<Tag>::basic_shm_transport(std::string name, role r, shm_options o)
    : name_(std::move(name)), role_(r), o_(o) {
  RLPT_CHECK(!name_.empty() && name_.size() <= 200 &&
                 name_.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-") ==
                     std::string::npos &&
                 name_ != "." && name_ != "..",
             errors::sync::bad_link, "shm name \"{}\" must be 1-200 characters of [A-Za-z0-9._-]", name_);
  where_ = rlpt::detail::format("shm /dev/shm/{} ({})", name_, r == role::sender ? "sender" : "receiver");
  if (role_ == role::sender) create();
}

template <class Tag>
RLPT_INLINE void basic_shm_transport<Tag>::send(std::span<const std::byte> meta, std::uint64_t payload_bytes,
                                                deadline until) {
  if (role_ == role::receiver) return send_reply(meta, until);
  wait_credit(until);
  const std::uint64_t head = h_->fwd_head.load(std::memory_order_relaxed);
  std::byte* s = slot(head);
  detail::shm_slot_header sh{meta.size(), payload_bytes, 0};
  if (meta.size() > o_.meta_bytes) {
    RLPT_CHECK(payload_bytes == 0 && meta.size() <= o_.slot_bytes, errors::sync::too_large,
               "{}: meta block of {} bytes exceeds the slot's {} bytes of meta space", where_, meta.size(),
               payload_bytes == 0 ? o_.slot_bytes : o_.meta_bytes);
    sh.meta_in_payload = 1;
    std::memcpy(s + g_.fwd_payload_at, meta.data(), meta.size());
  } else if (!meta.empty()) {
    std::memcpy(s + g_.fwd_meta_at, meta.data(), meta.size());
  }
  std::memcpy(s, &sh, sizeof(sh));
  h_->fwd_head.store(head + 1, std::memory_order_release);
}

template <class Tag> RLPT_INLINE void basic_shm_transport<Tag>::create() {
  RLPT_CHECK(o_.slots >= 1 && o_.reply_slots >= 1, errors::sync::bad_link, "{}: needs at least one slot each way",
             where_);
  g_ = detail::shm_geometry::of(o_.slots, o_.meta_bytes, o_.slot_bytes, o_.reply_slots, o_.reply_bytes);
  const std::string path = "/" + name_;
  int fd = ::shm_open(path.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  if (fd < 0 && errno == EEXIST) {
    replace_stale(path);
    fd = ::shm_open(path.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  }
  RLPT_CHECK(fd >= 0, errors::sync::shm, "{}: shm_open failed: {}", where_, std::strerror(errno));
  if (::ftruncate(fd, static_cast<off_t>(g_.total)) != 0) {
    const int err = errno;
    ::close(fd);
    ::shm_unlink(path.c_str());
    RLPT_FAIL(errors::sync::shm, "{}: cannot size the segment to {} bytes: {}", where_, g_.total, std::strerror(err));
  }
  map(fd, g_.total);
  struct stat st {};
  ::fstat(fd, &st);
  ino_ = st.st_ino;
  ::close(fd);
  h_ = std::construct_at(reinterpret_cast<detail::shm_header*>(base_)); // placement new: nvcc finds no aligned form
  h_->layout = 1;
  h_->slots = o_.slots;
  h_->slot_meta = o_.meta_bytes;
  h_->slot_payload = o_.slot_bytes;
  h_->reply_slots = o_.reply_slots;
  h_->reply_meta = o_.reply_bytes;
  h_->total_bytes = g_.total;
  std::uint64_t r = 0; // getrandom, not <random>: that header alone costs a quarter second of every build
  if (::getrandom(&r, sizeof r, 0) != static_cast<::ssize_t>(sizeof r))
    r = static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  h_->nonce = r ^ (static_cast<std::uint64_t>(::getpid()) << 32);
  h_->sender_pid.store(::getpid(), std::memory_order_relaxed);
  h_->magic.store(detail::shm_magic, std::memory_order_release);
}

template <class Tag> RLPT_INLINE void basic_shm_transport<Tag>::replace_stale(const std::string& path) {
  const int fd = ::shm_open(path.c_str(), O_RDONLY, 0);
  if (fd >= 0) {
    struct stat st {};
    std::int32_t owner = 0;
    if (::fstat(fd, &st) == 0 && static_cast<std::uint64_t>(st.st_size) >= sizeof(detail::shm_header)) {
      void* p = ::mmap(nullptr, sizeof(detail::shm_header), PROT_READ, MAP_SHARED, fd, 0);
      if (p != MAP_FAILED) {
        const auto* h = static_cast<const detail::shm_header*>(p);
        if (h->magic.load(std::memory_order_acquire) == detail::shm_magic && h->sender_closed.load() == 0)
          owner = h->sender_pid.load();
        ::munmap(p, sizeof(detail::shm_header));
      }
    }
    ::close(fd);
    RLPT_CHECK(!(detail::pid_alive(owner) && owner != ::getpid()), errors::sync::shm,
               "{}: the segment belongs to a running sender (pid {})", where_, owner);
  }
  ::shm_unlink(path.c_str());
}

template <class Tag> RLPT_INLINE void basic_shm_transport<Tag>::wait_credit(deadline until) {
  if (h_ == nullptr) RLPT_FAIL(errors::sync::shm, "{}: no segment", where_);
  detail::backoff b;
  auto next_check = clock::now();
  for (;;) {
    const std::uint64_t head = h_->fwd_head.load(std::memory_order_relaxed);
    if (head - h_->fwd_tail.load(std::memory_order_acquire) < o_.slots) return;
    const auto now = clock::now();
    if (now >= next_check) {
      check_receiver();
      next_check = now + std::chrono::milliseconds(10);
    }
    if (now >= until) {
      const std::int32_t rx = h_->receiver_pid.load();
      if (rx == 0) detail::timeout(where_, "waiting for a free slot: no receiver is attached");
      detail::timeout(where_, rlpt::detail::format("waiting for receiver pid {} to release a slot", rx));
    }
    b.pause();
  }
}

template <class Tag> RLPT_INLINE std::optional<message> basic_shm_transport<Tag>::receive_reply(deadline until) {
  detail::backoff b;
  auto next_check = clock::now();
  for (;;) {
    const std::uint64_t tail = h_->back_tail.load(std::memory_order_relaxed);
    if (h_->back_head.load(std::memory_order_acquire) != tail) {
      const std::byte* s = base_ + g_.back_at + (tail % o_.reply_slots) * g_.back_stride;
      detail::shm_slot_header sh{};
      std::memcpy(&sh, s, sizeof(sh));
      held_ = true;
      RLPT_CHECK(sh.meta_bytes <= o_.reply_bytes && sh.payload_bytes == 0, errors::sync::wire,
                 "{}: reply slot says {} meta bytes (capacity {})", where_, sh.meta_bytes, o_.reply_bytes);
      return message{{s + 64, static_cast<std::size_t>(sh.meta_bytes)}, {}};
    }
    const auto now = clock::now();
    if (now >= next_check) {
      check_receiver();
      next_check = now + std::chrono::milliseconds(10);
    }
    if (now >= until) return std::nullopt;
    b.pause();
  }
}

template <class Tag> RLPT_INLINE bool basic_shm_transport<Tag>::try_attach() {
  const std::string path = "/" + name_;
  const int fd = ::shm_open(path.c_str(), O_RDWR, 0);
  if (fd < 0) return false;
  struct stat st {};
  if (::fstat(fd, &st) != 0 || static_cast<std::uint64_t>(st.st_size) < detail::shm_page) {
    ::close(fd);
    return false; // being created
  }
  const auto size = static_cast<std::uint64_t>(st.st_size);
  map(fd, size);
  ::close(fd);
  auto* h = reinterpret_cast<detail::shm_header*>(base_);
  if (h->magic.load(std::memory_order_acquire) != detail::shm_magic) {
    unmap();
    return false; // not initialised yet
  }
  const auto g = detail::shm_geometry::of(h->slots, h->slot_meta, h->slot_payload, h->reply_slots, h->reply_meta);
  if (h->layout != 1 || h->slots == 0 || h->reply_slots == 0 || g.total != h->total_bytes || g.total != size) {
    unmap();
    RLPT_FAIL(errors::sync::shm, "{}: the segment's header is inconsistent (layout {}, {} bytes)", where_, h->layout,
              size);
  }
  std::int32_t other = h->receiver_pid.load();
  if (other != 0 && other != ::getpid() && detail::pid_alive(other)) {
    unmap();
    RLPT_FAIL(errors::sync::shm, "{}: receiver pid {} is already attached", where_, other);
  }
  // Messages already in the ring are read: a BEGIN sent before we attached must not be lost.
  // Leftovers of an update a previous receiver was in are ignored by the protocol (their
  // attempt tag is not the current one; a lone COMMIT gets a NACK).
  h->receiver_pid.store(::getpid(), std::memory_order_release);
  h_ = h;
  g_ = g;
  o_.slots = h->slots;
  o_.meta_bytes = h->slot_meta;
  o_.slot_bytes = h->slot_payload;
  o_.reply_slots = h->reply_slots;
  o_.reply_bytes = h->reply_meta;
  ino_ = st.st_ino;
  return true;
}

template <class Tag> RLPT_INLINE std::optional<message> basic_shm_transport<Tag>::receive_forward(deadline until) {
  detail::backoff b;
  auto next_check = clock::now();
  for (;;) {
    if (h_ == nullptr && !try_attach()) {
      if (clock::now() >= until) return std::nullopt;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      continue;
    }
    const std::uint64_t tail = h_->fwd_tail.load(std::memory_order_relaxed);
    if (h_->fwd_head.load(std::memory_order_acquire) != tail) {
      const std::byte* s = slot(tail);
      detail::shm_slot_header sh{};
      std::memcpy(&sh, s, sizeof(sh));
      held_ = true;
      const std::uint64_t meta_cap = sh.meta_in_payload ? o_.slot_bytes : o_.meta_bytes;
      RLPT_CHECK(sh.meta_bytes <= meta_cap && sh.payload_bytes <= o_.slot_bytes &&
                     (sh.meta_in_payload == 0 || sh.payload_bytes == 0),
                 errors::sync::wire, "{}: slot says {} meta and {} payload bytes (capacities {} and {})", where_,
                 sh.meta_bytes, sh.payload_bytes, o_.meta_bytes, o_.slot_bytes);
      // The meta block (a frame: checked, then parsed) is copied out of the segment, so what
      // was checked is what is parsed. Payload bytes are checked by the protocol as it copies them.
      const std::byte* meta = s + (sh.meta_in_payload ? g_.fwd_payload_at : g_.fwd_meta_at);
      rx_meta_.assign(meta, meta + sh.meta_bytes);
      return message{{rx_meta_.data(), rx_meta_.size()},
                     {s + g_.fwd_payload_at, static_cast<std::size_t>(sh.payload_bytes)}};
    }
    const auto now = clock::now();
    if (now >= next_check) {
      check_sender();
      next_check = now + std::chrono::milliseconds(10);
    }
    if (now >= until) return std::nullopt;
    b.pause();
  }
}

template <class Tag>
RLPT_INLINE void basic_shm_transport<Tag>::send_reply(std::span<const std::byte> meta, deadline until) {
  RLPT_CHECK(h_ != nullptr, errors::sync::peer_lost, "{}: not attached to a sender", where_);
  RLPT_CHECK(meta.size() <= o_.reply_bytes, errors::sync::too_large,
             "{}: reply of {} bytes exceeds the reply slot's {}", where_, meta.size(), o_.reply_bytes);
  detail::backoff b;
  for (;;) {
    const std::uint64_t head = h_->back_head.load(std::memory_order_relaxed);
    if (head - h_->back_tail.load(std::memory_order_acquire) < o_.reply_slots) {
      std::byte* s = base_ + g_.back_at + (head % o_.reply_slots) * g_.back_stride;
      const detail::shm_slot_header sh{meta.size(), 0, 0};
      std::memcpy(s, &sh, sizeof(sh));
      if (!meta.empty()) std::memcpy(s + 64, meta.data(), meta.size());
      h_->back_head.store(head + 1, std::memory_order_release);
      return;
    }
    if (clock::now() >= until) detail::timeout(where_, "waiting for the sender to read replies");
    b.pause();
  }
}

} // namespace sync
RLPT_NAMESPACE_END
#endif // RLPT_HEADER_IMPL()
