// SPDX-License-Identifier: Apache-2.0
//! @file
//! The forwarder's cut-through (sync/forward.hpp): a link the host's receiver reads upstream
//! through, which copies every frame of the update in progress into a bounded queue that a
//! thread of its own passes on to the downstream links as it arrives. A chain of h hosts then
//! takes one update's transfer time plus a bucket per hop instead of h transfer times.
//!
//! Downstream hosts verify everything themselves (per-piece checksums, the COMMIT's tensor
//! checksums) and publish only on COMMIT, exactly as if the trainer had sent the frames; this
//! host passes on bytes before it has verified them, never a COMMIT for a version it refused.
//! A downstream host that refuses (it does not hold the delta's base), fails, falls behind or
//! does not answer the COMMIT is left out of the attempt, and the forwarder sends it the
//! version from its mirror after publishing (store-and-forward).
#pragma once

#include <rlpt/config.hpp>
#include <rlpt/core/error.hpp>
#include <rlpt/sync/frame.hpp>
#include <rlpt/sync/link.hpp>
#include <rlpt/sync/machine.hpp>

#include <fmt/core.h>

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

RLPT_NAMESPACE_BEGIN
namespace sync::detail {

//! One downstream link's part in the attempt being passed on.
struct leg {
  enum class state : std::uint8_t { off, open, refused, failed, acked };
  state st = state::off;
  std::uint64_t messages = 0; //!< BUCKET / DELTA frames passed on
  std::uint64_t bytes = 0;    //!< their payload bytes
  double seconds = 0;         //!< BEGIN passed on to ACK
  std::string error_id{}, reason{};

  void end(state s, std::string_view id, std::string why) {
    st = s;
    error_id = std::string(id);
    reason = std::move(why);
  }
};

//! How the attempt that carried a version went downstream.
struct passed_on {
  std::uint64_t version = 0;
  bool delta = false;
  std::vector<leg> legs;
};

template <class = void> class basic_cut_through final : public link {
public:
  //! `depth` frames may wait between this host's receiving thread and the passing-on thread
  //! (memory: that many buckets); `send` bounds each downstream step (timeout) and the wait for
  //! the answers to COMMIT (commit_timeout). A full queue stalls upstream receiving for at most
  //! `lag`, then the attempt is dropped downstream (those hosts get it store-and-forward).
  basic_cut_through(link& upstream, std::vector<link*> down, const sender_options& send, std::size_t depth,
                    std::chrono::milliseconds lag)
      : up_(upstream), down_(std::move(down)), send_(send), depth_(std::max<std::size_t>(depth, 1)), lag_(lag),
        legs_(down_.size()), thread_([this] { run(); }) {}

  basic_cut_through(const basic_cut_through&) = delete;
  basic_cut_through& operator=(const basic_cut_through&) = delete;

  ~basic_cut_through() override {
    {
      const std::lock_guard<std::mutex> g(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

  [[nodiscard]] link_info info() const override { return up_.info(); }
  std::span<std::byte> payload_buffer(std::uint64_t bytes, deadline until) override {
    return up_.payload_buffer(bytes, until);
  }
  void release() override { up_.release(); }

  //! The receiver's replies go upstream; one that ends the attempt there ends it downstream.
  RLPT_INLINE void send(std::span<const std::byte> meta, std::uint64_t payload_bytes, deadline until) override;

  RLPT_INLINE std::optional<message> receive(deadline until) override;

  //! Waits until the attempt in progress has been passed on and answered downstream, and says
  //! how; legs are `off` when that attempt did not carry `version`.
  passed_on finish(std::uint64_t version) {
    std::unique_lock<std::mutex> g(mu_);
    cv_.wait(g, [&] { return settled_ == attempt_tag_ && q_.empty() && !busy_; });
    passed_on p = result_;
    if (p.version != version) p.legs.assign(down_.size(), leg{});
    return p;
  }

private:
  struct item {
    frame_type type = frame_type::begin;
    std::uint64_t tag = 0, version = 0, kind = 0;
    std::vector<std::byte> meta, payload;
    std::string why; //!< an abort of this host's making (meta empty)
  };

  // Receiving thread: queue a copy of each frame of the current attempt.
  void pass_on(const message& m);

  // Ends attempt `tag` downstream unless it already settled (receiving thread: it owns passing_).
  void abort(std::uint64_t tag, std::string why);

  item spare() {
    if (spare_.empty()) return {};
    item it = std::move(spare_.back());
    spare_.pop_back();
    return it;
  }

  // Passing-on thread.
  void run();

  void handle(const item& it);

  [[nodiscard]] std::uint64_t settled_tag() {
    const std::lock_guard<std::mutex> g(mu_);
    return settled_;
  }

  template <class F> void for_open(F&& f) {
    for (std::size_t k = 0; k < legs_.size(); ++k)
      if (legs_[k].st == leg::state::open) f(k);
  }

  void send_to(std::size_t k, std::span<const std::byte> meta, std::span<const std::byte> payload, deadline until);

  // Reads leg k's answers to this attempt until it ends or `until` (now: what has arrived).
  void answers(std::size_t k, deadline until);

  link& up_;
  std::vector<link*> down_;
  sender_options send_;
  std::size_t depth_;
  std::chrono::milliseconds lag_;

  // Receiving thread only.
  std::uint64_t attempt_tag_ = 0; //!< the last BEGIN passed on
  bool passing_ = false;          //!< frames of attempt_tag_ are still passed on

  // Shared, under mu_.
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<item> q_;
  std::vector<item> spare_; //!< buffers of passed frames, reused
  bool stop_ = false, busy_ = false;
  std::uint64_t settled_ = 0; //!< the last attempt passed on to its end
  passed_on result_{};        //!< and how it went

  // Passing-on thread only.
  std::uint64_t tag_ = 0, version_ = 0;
  bool delta_ = false, settle_ = false;
  clock::time_point t0_{};
  std::vector<leg> legs_;

  std::thread thread_; // last: starts once the members above exist
};
using cut_through = basic_cut_through<>;
RLPT_EXTERN_TEMPLATE(class basic_cut_through<>)

} // namespace sync::detail
RLPT_NAMESPACE_END

#if RLPT_HEADER_IMPL()
RLPT_NAMESPACE_BEGIN
namespace sync::detail {

template <class Tag>
RLPT_INLINE void basic_cut_through<Tag>::send(std::span<const std::byte> meta, std::uint64_t payload_bytes,
                                              deadline until) {
  up_.send(meta, payload_bytes, until);
  try {
    const frame f = decode_frame(meta, "cut-through");
    // After a base mismatch the sender retries dense with a new BEGIN, which supersedes.
    if ((f.type == frame_type::refuse && f.index != static_cast<std::uint64_t>(refusal::base_mismatch)) ||
        f.type == frame_type::nack)
      abort(f.tag, rlpt::detail::format("this host {} version {}", f.type == frame_type::nack ? "failed" : "refused",
                                        f.version));
  } catch (const error&) {}
}

template <class Tag> RLPT_INLINE std::optional<message> basic_cut_through<Tag>::receive(deadline until) {
  std::optional<message> m;
  try {
    m = up_.receive(until);
  } catch (const error& e) {
    abort(attempt_tag_, rlpt::detail::format("upstream: {}", e.message()));
    throw;
  }
  if (m) pass_on(*m);
  return m;
}

template <class Tag> RLPT_INLINE void basic_cut_through<Tag>::pass_on(const message& m) {
  frame f;
  try {
    f = decode_frame(m.meta, "cut-through");
  } catch (const error&) {
    return; // the receiver reports it
  }
  if (f.type == frame_type::begin) {
    attempt_tag_ = f.tag;
    passing_ = true;
  } else if (!passing_ || f.tag != attempt_tag_ ||
             (f.type != frame_type::bucket && f.type != frame_type::delta && f.type != frame_type::commit &&
              f.type != frame_type::abort)) {
    return;
  }
  std::unique_lock<std::mutex> g(mu_);
  if (!cv_.wait_until(g, clock::now() + lag_, [&] { return q_.size() < depth_; })) {
    passing_ = false;
    g.unlock();
    abort(f.tag, rlpt::detail::format("the downstream hosts took no frame for {} ms", lag_.count()));
    return;
  }
  item it = spare();
  g.unlock(); // the copy runs while the other thread passes frames on (this thread alone adds)
  it.type = f.type;
  it.tag = f.tag;
  it.version = f.version;
  it.kind = f.index;
  it.meta.assign(m.meta.begin(), m.meta.end());
  it.payload.assign(m.payload.begin(), m.payload.end());
  it.why.clear();
  g.lock();
  q_.push_back(std::move(it));
  if (f.type == frame_type::commit || f.type == frame_type::abort) passing_ = false;
  g.unlock();
  cv_.notify_all();
}

// NOLINTNEXTLINE(performance-unnecessary-value-param): moved into the queue (tidy misses it in a template)
template <class Tag> RLPT_INLINE void basic_cut_through<Tag>::abort(std::uint64_t tag, std::string why) {
  {
    const std::lock_guard<std::mutex> g(mu_);
    if (tag == 0 || settled_ == tag) return;
    item it;
    it.type = frame_type::abort;
    it.tag = tag;
    it.why = std::move(why);
    q_.push_back(std::move(it)); // past the bound: it must not wait behind a stalled link
  }
  if (tag == attempt_tag_) passing_ = false;
  cv_.notify_all();
}

template <class Tag> RLPT_INLINE void basic_cut_through<Tag>::run() {
  for (;;) {
    item it;
    {
      std::unique_lock<std::mutex> g(mu_);
      cv_.wait(g, [&] { return stop_ || !q_.empty(); });
      if (stop_) return;
      it = std::move(q_.front());
      q_.pop_front();
      busy_ = true;
    }
    cv_.notify_all(); // room in the queue
    handle(it);
    {
      const std::lock_guard<std::mutex> g(mu_);
      busy_ = false;
      if (settle_) {
        settle_ = false;
        settled_ = tag_;
        result_ = passed_on{version_, delta_, legs_};
      }
      if (!it.meta.empty()) spare_.push_back(std::move(it));
    }
    cv_.notify_all();
  }
}

template <class Tag> RLPT_INLINE void basic_cut_through<Tag>::handle(const item& it) {
  if (it.type == frame_type::begin) {
    tag_ = it.tag;
    version_ = it.version;
    delta_ = it.kind == static_cast<std::uint64_t>(update_kind::delta);
    t0_ = clock::now();
    for (leg& l : legs_) l = leg{leg::state::open};
  } else if (it.tag != tag_ || settled_tag() == tag_) {
    return; // an earlier attempt's
  }
  if (it.meta.empty()) { // this host's abort
    std::vector<std::byte> meta;
    encode_frame(meta, frame_type::abort, tag_, version_, 0, 0, 0, 0, as_bytes(it.why));
    for_open([&](std::size_t k) {
      send_to(k, meta, {}, after(std::chrono::milliseconds(100)));
      legs_[k].end(leg::state::failed, errors::sync::aborted,
                   rlpt::detail::format("{}: version {} was aborted: {}", down_[k]->info().name, version_, it.why));
    });
    settle_ = true;
    return;
  }
  const bool payload = it.type == frame_type::bucket || it.type == frame_type::delta;
  for_open([&](std::size_t k) {
    send_to(k, it.meta, it.payload, after(send_.timeout));
    if (payload) {
      ++legs_[k].messages;
      legs_[k].bytes += it.payload.size();
    }
    answers(k, clock::now());
  });
  if (it.type == frame_type::abort) {
    for_open([&](std::size_t k) {
      legs_[k].end(leg::state::failed, errors::sync::aborted,
                   rlpt::detail::format("{}: the sender aborted version {}", down_[k]->info().name, version_));
    });
    settle_ = true;
  } else if (it.type == frame_type::commit) {
    const deadline until = after(send_.commit_timeout);
    for_open([&](std::size_t k) {
      answers(k, until);
      if (legs_[k].st == leg::state::open)
        legs_[k].end(leg::state::failed, errors::sync::timeout,
                     rlpt::detail::format("{}: no answer to the COMMIT of version {} within {} ms",
                                          down_[k]->info().name, version_, send_.commit_timeout.count()));
    });
    settle_ = true;
  }
}

template <class Tag>
RLPT_INLINE void basic_cut_through<Tag>::send_to(std::size_t k, std::span<const std::byte> meta,
                                                 std::span<const std::byte> payload, deadline until) {
  try {
    if (!payload.empty()) {
      const std::span<std::byte> buf = down_[k]->payload_buffer(payload.size(), until);
      std::memcpy(buf.data(), payload.data(), payload.size());
    }
    down_[k]->send(meta, payload.size(), until);
  } catch (const error& e) {
    legs_[k].end(leg::state::failed, e.id(), e.message());
  }
}

template <class Tag> RLPT_INLINE void basic_cut_through<Tag>::answers(std::size_t k, deadline until) {
  leg& l = legs_[k];
  while (l.st == leg::state::open) {
    std::optional<message> m;
    try {
      m = down_[k]->receive(until);
    } catch (const error& e) {
      l.end(leg::state::failed, e.id(), e.message());
      return;
    }
    if (!m) return;
    try {
      const frame f = decode_frame(m->meta, down_[k]->info().name);
      if (f.tag == tag_ && f.version == version_) {
        if (f.type == frame_type::ack) {
          l.st = leg::state::acked;
          l.seconds = seconds_since(t0_);
        } else if (f.type == frame_type::refuse || f.type == frame_type::nack) {
          auto [id, msg] = split_error_body(f.body);
          l.end(f.type == frame_type::refuse ? leg::state::refused : leg::state::failed, id, std::move(msg));
        }
      }
    } catch (const error& e) {
      l.end(leg::state::failed, e.id(), e.message());
    }
    down_[k]->release();
  }
}

} // namespace sync::detail
RLPT_NAMESPACE_END
#endif // RLPT_HEADER_IMPL()
