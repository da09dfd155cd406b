// SPDX-License-Identifier: Apache-2.0
//! @file
//! Forwarding: an inference host that passes every version it receives on to further hosts, so
//! that a trainer feeding N hosts sends one copy of each update instead of N. Forwarders
//! compose into a chain (each host feeds the next) or a tree (each feeds k), over any host link
//! (TCP across machines, authenticated: sync/auth.hpp).
//!
//! Store-and-forward: a version is passed on once this host has verified and published it, so
//! what a forwarder sends is always a complete, checksummed version, never bytes it has not
//! verified; each hop adds one update's transfer time (a chain of h hops: h transfers; a tree of
//! fan-out k over N hosts: log_k N levels). Downstream hosts are fed one after the other, each
//! with its own sender, whose deltas are taken against the last version that host acknowledged
//! (a host that missed versions catches up with one delta from the version it holds; one that
//! holds none, or another layout, gets a dense update). A downstream failure is reported and
//! stops neither the others nor this host.
#pragma once

#include <rlpt/config.hpp>
#include <rlpt/core/error.hpp>
#include <rlpt/sync/link.hpp>
#include <rlpt/sync/protocol.hpp>

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
  sender_options send{};      //!< each downstream sender (delta, timeouts)
};

//! How one version went to one downstream link.
struct forward_result {
  std::size_t link = 0;  //!< index into the downstream links
  bool ok = false;       //!< the downstream host published the version
  publish_result sent{}; //!< the sender's account (bytes moved, delta or dense) when ok
  std::string error_id;  //!< the failure's id when not ok
  std::string reason;    //!< and its message
};

class forwarder {
public:
  //! Receives from `upstream`, calls `load` for this host's own engine (may be empty), and
  //! forwards every published version to each of `downstream` (links this object borrows).
  forwarder(link& upstream, std::vector<link*> downstream, load_fn load = {}, forwarder_options o = {})
      : down_(std::move(downstream)), o_(std::move(o)),
        rx_(upstream, load ? std::move(load) : load_fn(ignore), mirrored(o_.receive)) {
    for (std::size_t k = 0; k < down_.size(); ++k)
      RLPT_CHECK(down_[k] != nullptr, errors::sync::bad_link, "forwarder: downstream link {} is null", k);
    senders_.resize(down_.size());
  }

  forwarder(const forwarder&) = delete;
  forwarder& operator=(const forwarder&) = delete;

  //! Drives the upstream receiver as receiver::poll does; when it publishes a version, passes
  //! it on to every downstream link before returning (see last_forwarded()).
  update poll(std::chrono::milliseconds wait = std::chrono::milliseconds(0)) {
    update u = rx_.poll(wait);
    if (u.published()) forward(u.version);
    return u;
  }

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

  void forward(std::uint64_t version) {
    const manifest& m = rx_.published_manifest();
    results_.assign(down_.size(), {});
    for (std::size_t k = 0; k < down_.size(); ++k) {
      forward_result& r = results_[k];
      r.link = k;
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
    }
  }

  // Tensor i of the published version, read from the mirror at the time of the send.
  source_fn source() {
    return [this](std::size_t i) {
      const manifest& m = rx_.published_manifest();
      return rx_.tensor(m[i].name).bytes;
    };
  }

  std::vector<link*> down_;
  forwarder_options o_;
  receiver rx_;
  std::vector<std::unique_ptr<sender>> senders_;
  std::vector<forward_result> results_;
};

} // namespace sync
RLPT_NAMESPACE_END
