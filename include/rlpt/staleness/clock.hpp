// SPDX-License-Identifier: Apache-2.0
//! @file
//! version_clock: the one source of truth for the current policy version.
//!
//! The trainer publishes a new version after each *completed* weight sync (never after a failed
//! one: tokenspeed #672); rollout workers stamp the version at dispatch, not at completion
//! (stamping at completion under-counts staleness, rllm #622), and per token for generations
//! that span weight updates (AReaL). Several admission gates (one per data-parallel consumer)
//! can share one clock; they subscribe to be woken when a version is published.
#pragma once

#include <rlpt/config.hpp>
#include <rlpt/core/error.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <limits>
#include <mutex>
#include <utility>
#include <vector>

RLPT_NAMESPACE_BEGIN

//! Policy version: bumped by one at every weight publish; int32 as AReaL stores them per token.
//! (Declared identically in <rlpt/rollout/record.hpp>; redeclaring an alias is well-formed.)
using policy_version = std::int32_t;

//! "No staleness bound": disables a window (AReaL relies on admission alone).
inline constexpr index_t unbounded_staleness = -1;

class version_clock {
public:
  using listener = std::function<void(policy_version)>;

  //! Unsubscribes on destruction; waits for a notification in progress to finish, so the
  //! subscriber may be destroyed right after.
  class subscription {
  public:
    subscription() = default;
    subscription(subscription&& o) noexcept : clock_(std::exchange(o.clock_, nullptr)), id_(o.id_) {}
    subscription& operator=(subscription&& o) noexcept {
      if (this != &o) {
        reset();
        clock_ = std::exchange(o.clock_, nullptr);
        id_ = o.id_;
      }
      return *this;
    }
    subscription(const subscription&) = delete;
    subscription& operator=(const subscription&) = delete;
    ~subscription() { reset(); }

    void reset() {
      if (clock_ != nullptr) std::exchange(clock_, nullptr)->unsubscribe(id_);
    }

  private:
    friend class version_clock;
    subscription(version_clock* c, std::uint64_t id) : clock_(c), id_(id) {}
    version_clock* clock_ = nullptr;
    std::uint64_t id_ = 0;
  };

  explicit version_clock(policy_version initial = 0) : version_(initial) {
    RLPT_CHECK(initial >= 0, errors::staleness::bad_version, "the initial policy version must be >= 0, got {}",
               initial);
  }
  version_clock(const version_clock&) = delete;
  version_clock& operator=(const version_clock&) = delete;

  //! The current version (what a worker stamps on a request it dispatches now).
  [[nodiscard]] policy_version current() const noexcept { return version_.load(std::memory_order_acquire); }

  //! Publishes the next version (call after the weight sync completed) and returns it.
  //! Listeners run on this thread after the version is visible.
  policy_version publish();

  //! Sets the version when resuming from a checkpoint (any value >= 0). Listeners run.
  void restore(policy_version v);

  //! Waits until the version is at least `v` or `timeout` passes; returns whether it is.
  template <class Rep, class Period> bool wait_for(policy_version v, std::chrono::duration<Rep, Period> timeout) const {
    std::unique_lock lock(mutex_);
    return changed_.wait_for(lock, timeout, [&] { return version_.load(std::memory_order_relaxed) >= v; });
  }

  //! Calls `fn(version)` after every publish/restore until the subscription dies. `fn` must
  //! not subscribe, unsubscribe or publish (it runs under the listener lock).
  [[nodiscard]] subscription subscribe(listener fn) {
    RLPT_CHECK(static_cast<bool>(fn), errors::staleness::bad_option, "version_clock::subscribe needs a callable");
    std::lock_guard lock(listeners_mutex_);
    const std::uint64_t id = ++next_id_;
    listeners_.emplace_back(id, std::move(fn));
    return {this, id};
  }

private:
  void unsubscribe(std::uint64_t id) {
    std::lock_guard lock(listeners_mutex_);
    for (auto it = listeners_.begin(); it != listeners_.end(); ++it)
      if (it->first == id) {
        listeners_.erase(it);
        return;
      }
  }

  void notify(policy_version v) {
    // Held while calling so that unsubscribe (a dying subscriber) waits for us.
    std::lock_guard lock(listeners_mutex_);
    for (const auto& [id, fn] : listeners_) fn(v);
  }

  std::atomic<policy_version> version_;
  mutable std::mutex mutex_;
  mutable std::condition_variable changed_;
  std::mutex listeners_mutex_;
  std::vector<std::pair<std::uint64_t, listener>> listeners_;
  std::uint64_t next_id_ = 0;
};

RLPT_NAMESPACE_END

#if RLPT_HEADER_IMPL()
RLPT_NAMESPACE_BEGIN

RLPT_INLINE policy_version version_clock::publish() {
  policy_version now;
  {
    std::lock_guard lock(mutex_);
    const policy_version v = version_.load(std::memory_order_relaxed);
    RLPT_CHECK(v < std::numeric_limits<policy_version>::max(), errors::staleness::version_overflow,
               "policy version {} cannot be incremented without overflowing int32", v);
    now = v + 1;
    version_.store(now, std::memory_order_release);
  }
  changed_.notify_all();
  notify(now);
  return now;
}

RLPT_INLINE void version_clock::restore(policy_version v) {
  RLPT_CHECK(v >= 0, errors::staleness::bad_version, "a restored policy version must be >= 0, got {}", v);
  {
    std::lock_guard lock(mutex_);
    version_.store(v, std::memory_order_release);
  }
  changed_.notify_all();
  notify(v);
}

RLPT_NAMESPACE_END
#endif // RLPT_HEADER_IMPL()
