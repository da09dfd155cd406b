// SPDX-License-Identifier: Apache-2.0
//! @file
//! Forwarding: an inference host that passes every version it receives on to further hosts, so
//! that a trainer feeding N hosts sends one copy of each update instead of N. Forwarders
//! compose into a chain (each host feeds the next) or a tree (each feeds k), over any host link
//! (TCP across machines, authenticated: sync/auth.hpp).
//!
//! Cut-through (the default): each frame of an update is passed on as it arrives, by a thread
//! of the forwarder's own, so a chain of h hosts takes one update's transfer time plus a bucket
//! per hop (sync/detail/cut_through.hpp). Downstream hosts verify every byte themselves and
//! publish only on the COMMIT, as if the trainer had sent the frames. A downstream host that
//! refuses the update (it does not hold a delta's base), fails it or does not answer gets the
//! version store-and-forward once this host has published it.
//!
//! Store-and-forward (`cut_through = false`, and the fallback): a version is passed on once this
//! host has verified and published it, from its mirror, so each hop adds one update's transfer
//! time (a chain of h hops: h transfers; a tree of fan-out k over N hosts: log_k N levels).
//! Downstream hosts are fed one after the other, each with its own sender, whose deltas are
//! taken against the last version that host acknowledged through it (a host that holds another
//! version, or none, or another layout, gets a dense update). A downstream failure is reported
//! and stops neither the others nor this host.
#pragma once

#include <rlpt/config.hpp>
#include <rlpt/core/error.hpp>
#include <rlpt/sync/detail/cut_through.hpp>
#include <rlpt/sync/link.hpp>
#include <rlpt/sync/protocol.hpp>

#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

RLPT_NAMESPACE_BEGIN
namespace sync {

struct forwarder_options {
  receiver_options receive{}; //!< this host's receiver (its mirror is kept: it is what is forwarded)
  sender_options send{};      //!< each downstream sender (delta, timeouts; cut-through: its timeouts)
  //! Pass frames on as they arrive; false: only after this host published the version.
  bool cut_through = true;
  //! Cut-through: frames held between receiving and passing on (memory: that many buckets).
  std::size_t cut_through_frames = 4;
  //! Cut-through: how long a full queue may hold up receiving before the downstream hosts are
  //! dropped from the update (they get it store-and-forward); at most a quarter of
  //! receive.timeout, so that the upstream sender (whose timeouts are usually the same) does not
  //! time out on this host.
  std::chrono::milliseconds cut_through_lag{5'000};
};

//! How one version went to one downstream link.
struct forward_result {
  std::size_t link = 0;     //!< index into the downstream links
  bool ok = false;          //!< the downstream host published the version
  bool cut_through = false; //!< it took the frames as they arrived (else from this host's mirror)
  //! What moved, as a sender accounts it (version, delta, messages, wire_bytes of every try,
  //! digest; a cut-through has no stats).
  publish_result sent{};
  std::string error_id; //!< the failure's id when not ok
  std::string reason;   //!< and its message
  //! Why a cut-through did not reach the host (empty if it did or none was tried): it then got
  //! the version store-and-forward.
  std::string cut_through_failure{};
};

template <class = void> class basic_forwarder {
public:
  //! Receives from `upstream`, calls `load` for this host's own engine (may be empty), and
  //! forwards every published version to each of `downstream` (links this object borrows).
  basic_forwarder(link& upstream, std::vector<link*> downstream, load_fn load = {}, forwarder_options o = {});

  basic_forwarder(const basic_forwarder&) = delete;
  basic_forwarder& operator=(const basic_forwarder&) = delete;

  //! Drives the upstream receiver as receiver::poll does; when it publishes a version, passes
  //! it on to every downstream link before returning (see last_forwarded()).
  update poll(std::chrono::milliseconds wait = std::chrono::milliseconds(0));

  //! Per downstream link, how the last published version went.
  [[nodiscard]] const std::vector<forward_result>& last_forwarded() const noexcept { return results_; }

  //! This host's receiver (its version, mirror, digest).
  [[nodiscard]] const receiver& upstream() const noexcept { return rx_; }

private:
  static void ignore(const tensor_view&) {}
  static receiver_options mirrored(receiver_options o) {
    o.mirror = true;
    return o;
  }
  static std::vector<link*> checked(std::vector<link*> down) {
    for (std::size_t k = 0; k < down.size(); ++k)
      RLPT_CHECK(down[k] != nullptr, errors::sync::bad_link, "forwarder: downstream link {} is null", k);
    return down;
  }
  static std::unique_ptr<detail::cut_through> tee(const std::vector<link*>& down, const forwarder_options& o,
                                                  link& upstream) {
    if (!o.cut_through || down.empty()) return nullptr;
    return std::make_unique<detail::cut_through>(upstream, down, o.send, o.cut_through_frames,
                                                 std::min(o.cut_through_lag, o.receive.timeout / 4));
  }

  void forward(std::uint64_t version);

  // Tensor i of the published version, read from the mirror at the time of the send.
  source_fn source() {
    return [this](std::size_t i) {
      const manifest& m = rx_.published_manifest();
      return rx_.tensor(m[i].name).bytes;
    };
  }

  std::vector<link*> down_;
  forwarder_options o_;
  std::unique_ptr<detail::cut_through> tee_; // before rx_: the receiver reads through it
  receiver rx_;
  std::vector<std::unique_ptr<sender>> senders_;
  std::vector<forward_result> results_;
};
using forwarder = basic_forwarder<>;
RLPT_EXTERN_TEMPLATE(class basic_forwarder<>)

} // namespace sync
RLPT_NAMESPACE_END

#if RLPT_HEADER_IMPL()
RLPT_NAMESPACE_BEGIN
namespace sync {

template <class Tag>
RLPT_INLINE basic_forwarder<Tag>::basic_forwarder(link& upstream, std::vector<link*> downstream, load_fn load,
                                                  forwarder_options o)
    : down_(checked(std::move(downstream))), o_(std::move(o)), tee_(tee(down_, o_, upstream)),
      rx_(tee_ ? *tee_ : upstream, load ? std::move(load) : load_fn(ignore), mirrored(o_.receive)) {
  senders_.resize(down_.size());
}

template <class Tag> RLPT_INLINE update basic_forwarder<Tag>::poll(std::chrono::milliseconds wait) {
  update u = rx_.poll(wait);
  if (u.published()) forward(u.version);
  return u;
}

template <class Tag> RLPT_INLINE void basic_forwarder<Tag>::forward(std::uint64_t version) {
  const manifest& m = rx_.published_manifest();
  const detail::passed_on passed = tee_ ? tee_->finish(version) : detail::passed_on{};
  results_.assign(down_.size(), {});
  for (std::size_t k = 0; k < down_.size(); ++k) {
    forward_result& r = results_[k];
    r.link = k;
    const detail::leg leg = k < passed.legs.size() ? passed.legs[k] : detail::leg{};
    if (leg.st == detail::leg::state::acked) {
      r.ok = r.cut_through = true;
      r.sent.version = version;
      r.sent.delta = passed.delta;
      r.sent.messages = leg.messages;
      r.sent.wire_bytes = leg.bytes;
      r.sent.dense_bytes = m.payload_bytes();
      r.sent.digest = rx_.digest();
      r.sent.seconds = leg.seconds;
      continue;
    }
    if (leg.st != detail::leg::state::off)
      r.cut_through_failure = rlpt::detail::format("{}: {}", leg.error_id, leg.reason);
    try {
      // A new layout needs a new sender (the old one's snapshot no longer applies).
      if (!senders_[k] || senders_[k]->current_manifest().layout_hash() != m.layout_hash())
        senders_[k] = std::make_unique<sender>(*down_[k], m, source(), o_.send);
      r.sent = senders_[k]->publish(version);
      r.ok = true;
    } catch (const error& e) {
      r.error_id = std::string(e.id());
      r.reason = e.message();
    }
    r.sent.messages += leg.messages;
    r.sent.wire_bytes += leg.bytes;
  }
}

} // namespace sync
RLPT_NAMESPACE_END
#endif // RLPT_HEADER_IMPL()
