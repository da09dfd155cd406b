// SPDX-License-Identifier: Apache-2.0
//! @file
//! The weight-sync state machines, written once. `basic_sender<Backend>` and
//! `basic_receiver<Backend>` run the versioned protocol over a link:
//!
//!     sender                                    receiver
//!     BEGIN(version, base, kind, manifest) ->
//!                                           <-  READY(published version) | REFUSE(why)
//!     BUCKET 0..n-1 (dense) | DELTA 0..k-1  ->  each checked (per piece / per chunk)
//!     COMMIT(tensor checksums)              ->  verify all, apply, publish
//!                                           <-  ACK | NACK(id, why)
//!     ABORT(reason)                         ->  (sender failure or abort())
//!
//! What they own: attempt tags, deadlines, version order, refusals, the dense resend of a
//! delta whose base the receiver does not hold or cannot verify, abort, publish-on-commit, the
//! receiver's failure reports and the state that survives them (torn, dense-only next). What
//! a backend owns: how bytes are packed, hashed, staged, verified and applied in one memory
//! space. protocol.hpp instantiates them over host memory (`sender`, `receiver`: XXH3, a host
//! mirror, transforms, a load callback); cuda/sync/protocol.cuh over device memory
//! (`device_sender`, `device_receiver`: copy kernels, wsum64, targets written in place). One
//! state machine reused by both, as CUB reuses one agent across kernels: the host fault and
//! fuzz tests exercise the state machine the device transports run.
//!
//! A sender backend `B` provides:
//!
//!     using link_type;                                   // link or device_link
//!     static constexpr memory_space space;               // of the link's payloads
//!     static std::string wrong_link(std::string_view where);
//!     B(link_type&, const manifest&, const sender_options&, const std::string& where, args...);
//!     std::size_t peers() const; std::size_t last_peer() const; std::string peer_name(std::size_t) const;
//!     void prepare(deadline); void drain(deadline); void failed(std::string_view why) noexcept;
//!     void begin_dense();
//!     std::span<const std::uint64_t> pack(std::uint64_t bucket, std::span<std::byte> slot, std::uint64_t version, deadline);
//!     void end_dense(std::span<std::uint64_t> tensor_sums);
//!     std::size_t encode_delta(std::span<std::uint64_t> tensor_sums, delta_stats&, std::uint64_t version, deadline);
//!     std::uint64_t delta_bytes(std::size_t k) const;
//!     delta_body write_delta(std::size_t k, std::span<std::byte> slot, std::uint64_t version, deadline);
//!     void committed(bool delta, deadline);              // the receivers hold the version now
//!
//! A receiver backend `B` provides:
//!
//!     using link_type; using options; struct inflight_state;
//!     static constexpr memory_space space; static constexpr std::string_view options_name;
//!     static constexpr refusal setup_refusal;            // how a setup() error is refused
//!     static std::string wrong_link(std::string_view where);
//!     B(link_type&, const options&, const std::string& where, args...);
//!     void check_manifest(inflight_state&, const manifest&);                    // throws: refused bad_manifest
//!     std::string delta_refusal(const inflight_state&, const manifest&) const;   // a reason to refuse a delta, or ""
//!     void setup(receiver_inflight<inflight_state>&, receiver_state&);           // throws: refused setup_refusal
//!     void bucket(receiver_inflight<...>&, const frame&, std::span<const std::byte> payload, receiver_state&);
//!     void delta_chunk(receiver_inflight<...>&, const frame&, std::span<const std::byte> payload, receiver_state&);
//!     void commit_dense(receiver_inflight<...>&, const frame&, std::span<const std::uint64_t> want, receiver_state&);
//!     void commit_delta(receiver_inflight<...>&, const frame&, std::span<const std::uint64_t> want, receiver_state&);
//!     void discard(receiver_inflight<...>&) noexcept;                           // ends without publishing
//!     void failed(receiver_inflight<...>&, receiver_state&, std::string_view why) noexcept;
//!     void published(receiver_inflight<...>&, receiver_state&);
//!     void held_checksums(const receiver_state&, std::vector<std::uint64_t>& sums, std::vector<char>& known);
//!
//! Every step that can fail throws rlpt::error; the state machine turns it into a failed
//! update (receiver) or a failed publish (sender) and keeps the previous version.
#pragma once

#include <rlpt/config.hpp>
#include <rlpt/core/error.hpp>
#include <rlpt/sync/checksum.hpp>
#include <rlpt/sync/delta.hpp>
#include <rlpt/sync/frame.hpp>
#include <rlpt/sync/link.hpp>
#include <rlpt/sync/manifest.hpp>

#include <fmt/core.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <exception>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

RLPT_NAMESPACE_BEGIN
namespace sync {

namespace detail {

inline std::span<const std::byte> u64_bytes(std::span<const std::uint64_t> v) noexcept {
  return {reinterpret_cast<const std::byte*>(v.data()), v.size() * 8};
}

inline std::uint64_t body_u64(std::span<const std::byte> body, std::size_t i) noexcept {
  std::uint64_t v;
  std::memcpy(&v, body.data() + i * 8, 8);
  return v;
}

//! "<id>\n<message>" bodies of REFUSE / NACK.
inline std::string error_body(std::string_view id, std::string_view msg) {
  return rlpt::detail::format("{}\n{}", id, msg);
}
inline std::pair<std::string, std::string> split_error_body(std::span<const std::byte> body) {
  const std::string_view s = as_chars(body);
  const auto nl = s.find('\n');
  if (nl == std::string_view::npos) return {std::string(errors::sync::remote.str()), std::string(s)};
  return {std::string(s.substr(0, nl)), std::string(s.substr(nl + 1))};
}

//! NACK.index: refusal::base_mismatch when the receiver's base failed (the sender then resends
//! the version dense), 0 otherwise.
inline std::uint64_t nack_code(std::string_view id) noexcept {
  return id == errors::sync::base_mismatch ? static_cast<std::uint64_t>(refusal::base_mismatch) : 0;
}

inline double seconds_since(clock::time_point t0) { return std::chrono::duration<double>(clock::now() - t0).count(); }

} // namespace detail

//! The whole-model digest of a version: XXH3-64 of its tensor checksums as little-endian u64
//! in manifest order (the checksums a COMMIT carries). Sender and receiver compute it from the
//! same checksums, so equal digests mean equal versions (to the strength of the checksums);
//! a receiver's verify() recomputes it from the bytes it holds.
[[nodiscard]] inline std::uint64_t model_digest(const manifest& m) {
  std::vector<std::uint64_t> sums(m.size());
  for (std::size_t i = 0; i < m.size(); ++i) sums[i] = m[i].checksum;
  return xxh3(sums.data(), sums.size() * 8);
}

//! How a receiver applies an update.
enum class apply_mode : std::uint8_t {
  staged,   //!< verify everything, then apply: the previous version survives any failure
  streaming //!< apply each verified bucket at once: least memory, failures leave partial loads
};

struct sender_options {
  //! Send changed elements only (verl delta_sharded, TRL delta sync, slime disk-delta). Off by
  //! default like every framework; needs one snapshot of the model on the sender (host memory
  //! for the host sender, device memory for the device sender).
  bool delta = false;
  //! With deltas, make every n-th update dense (TRL's periodic anchors). 0: only when needed
  //! (first update, or the receiver refuses a delta): records are lossless and checksummed.
  std::uint32_t anchor_every = 0;
  //! Limit for each blocking step (a free slot, a packed bucket, a reply). NeMo-RL's
  //! per-transfer ZMQ timeout.
  std::chrono::milliseconds timeout{30'000};
  //! Limit for the receivers' answer to COMMIT, which includes their loading. TRL's request timeout.
  std::chrono::milliseconds commit_timeout{300'000};
};

struct publish_result {
  std::uint64_t version = 0;
  bool delta = false;            //!< sent as a delta
  bool fell_back = false;        //!< a delta was refused or NACKed (base mismatch) and sent dense instead
  std::uint64_t messages = 0;    //!< BUCKET or DELTA messages (of every attempt)
  std::uint64_t wire_bytes = 0;  //!< payload bytes moved (of every attempt)
  std::uint64_t dense_bytes = 0; //!< the model's bytes (what a dense update moves, less padding)
  delta_stats stats{};           //!< change counts (delta updates)
  std::uint64_t digest = 0;      //!< model_digest() of the published version (the receiver's update::digest)
  //! The receiver already held this version: an earlier attempt's COMMIT went through but its
  //! ACK was lost (a connection reset). Nothing was sent again; the next update is dense.
  bool confirmed = false;
  double seconds = 0;
};

//! What a newly published version asks of the engine's prefix (KV) cache: blocks computed under
//! the previous weights must not serve requests under the new ones (lmdeploy #4917, prime-rl
//! #2270). Which one an engine wants is its choice (vLLM reverted its automatic reset, #46125),
//! so the receiver says it per update and keeps it pending until the engine acknowledges it.
enum class cache_action : std::uint8_t {
  none,  //!< nothing asked (the engine manages its cache itself)
  reset, //!< drop every cached prefix before serving under the new weights (vLLM reset_prefix_cache, SGLang flush_cache)
  salt,  //!< key requests by `salt` from now on (vLLM cache_salt, SGLang extra_key): older prefixes never match
};

[[nodiscard]] constexpr std::string_view name(cache_action a) noexcept {
  switch (a) {
  case cache_action::none:
    return "none";
  case cache_action::reset:
    return "reset";
  case cache_action::salt:
    return "salt";
  }
  return "?";
}

//! The cache directive of one published version.
struct cache_directive {
  cache_action action = cache_action::none;
  std::uint64_t version = 0; //!< the version it belongs to (what acknowledge_cache takes)
  std::string salt{};        //!< salt: "rlpt-v<version>-<digest, 16 hex digits>": one per version and content
};

//! What poll() saw: nothing, a published version, or a failed update and why.
struct update {
  enum class status : std::uint8_t { idle, published, failed };
  status state = status::idle;
  std::uint64_t version = 0;
  std::uint64_t base_version = 0;
  bool delta = false;
  std::uint64_t bytes = 0;          //!< payload bytes received
  std::uint64_t tensors_loaded = 0; //!< tensors loaded (host: load callbacks made; device: targets written)
  bool partial = false;             //!< failed after loading began: the engine holds a mix (dense next)
  std::string error_id{};           //!< failed: the stable id (rlpt.sync.checksum, rlpt.sync.timeout, ...)
  std::string reason{};             //!< failed: what happened, with the values
  std::uint64_t digest = 0;         //!< published: model_digest() of the version (the sender's publish_result::digest)
  double seconds = 0;
  //! published, with a cache action in the options: what the engine must do to its prefix cache
  //! before serving under this version, then acknowledge (basic_receiver::acknowledge_cache).
  cache_directive cache{};
  //! published: the version of an earlier directive the engine never acknowledged (0: none), a
  //! sign that prefixes computed under old weights may have served requests.
  std::uint64_t cache_unacknowledged = 0;

  [[nodiscard]] bool published() const noexcept { return state == status::published; }
  [[nodiscard]] bool failed() const noexcept { return state == status::failed; }
};

//! The message body of a DELTA frame and how many records its payload holds.
struct delta_body {
  std::span<const std::byte> body;
  std::uint64_t records = 0;
};

//! What a receiver holds: shared by the state machine and its backend.
struct receiver_state {
  std::string where;       //!< the link, for messages
  bool has = false;        //!< a version is published
  bool torn = false;       //!< the held bytes (mirror or targets) were partly overwritten by a failed update
  bool dense_next = false; //!< accept only a dense update next
  std::string dense_why{}; //!< why (said in the refusal)
  std::uint64_t version = 0;
  manifest pub{}; //!< the published version, with its checksums

  //! From now until the next dense update, deltas are refused (`why` says so in the refusal).
  void require_dense(std::string why) {
    dense_next = true;
    dense_why = std::move(why);
  }
};

//! An update in progress: what every backend shares, and the backend's own `be`.
template <class BackendState> struct receiver_inflight {
  bool active = false;
  std::uint64_t tag = 0, version = 0, base = 0;
  bool delta = false;
  bool same_layout = false; //!< the layout of the published version
  manifest m{};
  std::uint64_t next = 0; //!< next bucket / delta chunk expected
  std::uint64_t bytes = 0, loaded = 0;
  bool partial = false; //!< loading (or writing targets) has begun
  clock::time_point t0{};
  BackendState be{};
};

//! Trainer side: publishes versions of the tensors in a manifest over a link (see the file
//! comment; `sender` and `device_sender` are this over host and device backends).
template <class Backend> class basic_sender {
public:
  using backend_type = Backend;
  using link_type = typename Backend::link_type;

  template <class... Args>
  basic_sender(link_type& l, manifest m, sender_options o, Args&&... backend_args)
      : link_(l), m_(std::move(m)), o_(o), where_(checked_name(l, m_)),
        be_(l, m_, o_, where_, std::forward<Args>(backend_args)...) {}

  basic_sender(const basic_sender&) = delete;
  basic_sender& operator=(const basic_sender&) = delete;

  [[nodiscard]] bool has_published() const noexcept { return published_; }
  [[nodiscard]] std::uint64_t published_version() const noexcept { return last_; }
  //! The manifest with the checksums of the last successful publish.
  [[nodiscard]] const manifest& current_manifest() const noexcept { return m_; }
  //! model_digest() of the last published version: what the receivers' digest() must equal.
  [[nodiscard]] std::uint64_t digest() const {
    RLPT_CHECK(published_, errors::sync::no_version, "{}: no version has been published yet", where_);
    return model_digest(m_);
  }

  //! Makes an in-flight publish() (on another thread) stop at its next step and throw
  //! rlpt.sync.aborted; the receivers are told why and keep their versions.
  void abort(std::string reason) {
    std::lock_guard lock(abort_mu_);
    abort_reason_ = std::move(reason);
    abort_.store(true, std::memory_order_release);
  }

  //! Sends version `version` (greater than the last published) and waits until every
  //! receiver published it. Throws rlpt::error on refusal, NACK (naming the peer), timeout,
  //! lost peer or abort; the sender then stays at its previous version and the next publish()
  //! starts clean. A delta that a receiver refuses at BEGIN (its base is not the delta's) or
  //! NACKs with base_mismatch (its base failed verification) is sent again, dense, once; on a
  //! NACK only over single-receiver links (in a group the others may have published already).
  //! Publishing a version again after a failure is how to retry it: if the failed attempt's
  //! COMMIT reached a single receiver whose ACK was lost, the receiver refuses the retry as
  //! stale with the digest of what it holds, and when that is the failed attempt's digest the
  //! publish completes without sending (publish_result::confirmed; its digest is what the
  //! receiver holds: the earlier attempt's bytes).
  publish_result publish(std::uint64_t version) {
    const auto t0 = clock::now();
    RLPT_CHECK(!published_ || version > last_, errors::sync::bad_version,
               "publish({}) after version {}: versions must increase", version, last_);
    abort_.store(false, std::memory_order_release);
    tag_ = next_tag();
    publish_result r;
    r.version = version;
    r.dense_bytes = m_.payload_bytes();
    bool delta =
        o_.delta && published_ && !dense_next_ && !(o_.anchor_every != 0 && since_anchor_ + 1 >= o_.anchor_every);
    std::vector<std::uint64_t> sums(m_.size(), 0);
    auto fall_back = [&](const reply& rep, bool nack) {
      if (!delta || r.fell_back || rep.code != static_cast<std::uint64_t>(refusal::base_mismatch)) return false;
      if (nack && be_.peers() > 1) return false;
      delta = false;
      r.fell_back = true;
      tag_ = next_tag();
      std::fill(sums.begin(), sums.end(), 0);
      return true;
    };
    try {
      be_.prepare(after(o_.timeout));
      for (;;) {
        const reply rep = begin(version, delta);
        if (rep.type != frame_type::ready) {
          if (confirms_lost_ack(rep, version)) return confirmed(version, r, t0);
          if (fall_back(rep, false)) continue;
          ::rlpt::detail::raise(rep.id, rlpt::detail::format("{}: {} refused version {}: {}", where_,
                                                             be_.peer_name(rep.peer), version, rep.message));
        }
        r.delta = delta;
        const std::uint64_t first = r.messages;
        reply no;
        std::string_view verb = "rejected";
        try {
          if (delta)
            send_delta(version, sums, r);
          else
            send_dense(version, sums, r);
          check_abort(version);
          be_.drain(after(o_.timeout));
          encode_frame(meta_, frame_type::commit, tag_, version, delta ? last_ : 0, 0, r.messages - first, 0,
                       detail::u64_bytes(sums));
          committing_ = {version, delta, sums, true};
          link_.send(meta_, 0, after(o_.timeout));
          no = wait_all(version, after(o_.commit_timeout), "waiting for the receivers to commit", frame_type::ack);
          if (no.type == frame_type::ack) break;
        } catch (const nacked& n) { // a receiver failed the attempt while it was being sent
          no = n.rep;
          verb = "failed";
          if (fall_back(no, true)) {
            be_.drain(after(o_.timeout)); // what is in flight of the failed attempt is consumed (and ignored)
            continue;
          }
        }
        if (verb == "rejected" && fall_back(no, true)) continue;
        ::rlpt::detail::raise(no.id, rlpt::detail::format("{}: {} {} version {}: {}", where_, be_.peer_name(no.peer),
                                                          verb, version, no.message));
      }
    } catch (...) {
      std::string why;
      {
        std::lock_guard lock(abort_mu_);
        why = abort_reason_.empty() ? "the sender failed" : abort_reason_;
      }
      be_.failed(why);
      try { // best effort: tell the receivers, so they stop waiting
        encode_frame(meta_, frame_type::abort, tag_, version, 0, 0, 0, 0, as_bytes(why));
        link_.send(meta_, 0, after(std::chrono::milliseconds(100)));
      } catch (...) {}
      throw;
    }
    be_.committed(delta, after(o_.timeout)); // what the receivers now hold is the next delta's base
    return done(version, delta, sums, r, t0);
  }

protected:
  [[nodiscard]] Backend& backend() noexcept { return be_; }
  [[nodiscard]] const std::string& where() const noexcept { return where_; }

private:
  struct reply {
    frame_type type = frame_type::ack;
    std::uint64_t code = 0;
    std::size_t peer = 0;
    std::string id, message;
    std::uint64_t value =
        0; //!< REFUSE (stale_version): the digest of the version the receiver holds, if it is this one
  };
  struct commit_sent { // the last attempt whose COMMIT went out (valid until a publish completes)
    std::uint64_t version = 0;
    bool delta = false;
    std::vector<std::uint64_t> sums;
    bool valid = false;
  };
  struct nacked { // a REFUSE or NACK for the attempt in flight, seen while sending
    reply rep;
  };

  static std::string checked_name(link_type& l, const manifest& m) {
    const link_info li = l.info();
    RLPT_CHECK(li.payload_space == Backend::space, errors::sync::bad_link, "{}", Backend::wrong_link(li.name));
    for (std::uint64_t b = 0; b < m.bucket_count(); ++b)
      RLPT_CHECK(m.bucket_size(b) <= li.max_payload, errors::sync::bad_link,
                 "bucket {} holds {} bytes but {} carries at most {} per message: plan with a smaller bucket_bytes", b,
                 m.bucket_size(b), li.name, li.max_payload);
    return li.name;
  }

  void check_abort(std::uint64_t version) {
    if (!abort_.load(std::memory_order_acquire)) return;
    std::lock_guard lock(abort_mu_);
    RLPT_FAIL(errors::sync::aborted, "{}: publish of version {} aborted: {}", where_, version, abort_reason_);
  }

  publish_result done(std::uint64_t version, bool delta, std::span<const std::uint64_t> sums, publish_result& r,
                      clock::time_point t0) {
    for (std::size_t i = 0; i < m_.size(); ++i) m_.set_checksum(i, sums[i]);
    m_.set_versions(version, delta ? last_ : 0);
    since_anchor_ = delta ? since_anchor_ + 1 : 0;
    published_ = true;
    last_ = version;
    committing_.valid = false;
    dense_next_ = dense_next_ && delta; // a dense update reset the delta base
    r.digest = model_digest(m_);
    r.seconds = detail::seconds_since(t0);
    return r;
  }

  // A stale refusal of a retry whose digest is that of the attempt we committed before (the
  // receiver published it; its ACK was lost). Single receivers only: in a group, one refusal
  // says nothing about the others.
  [[nodiscard]] bool confirms_lost_ack(const reply& rep, std::uint64_t version) const {
    return rep.type == frame_type::refuse && rep.code == static_cast<std::uint64_t>(refusal::stale_version) &&
           be_.peers() == 1 && committing_.valid && committing_.version == version && rep.value != 0 &&
           rep.value == xxh3(committing_.sums.data(), committing_.sums.size() * 8);
  }

  // The receiver holds `version` as committed: finish as if it had ACKed. The backend's delta
  // base was not advanced by the failed attempt, so the next update is dense (which resets it).
  publish_result confirmed(std::uint64_t version, publish_result& r, clock::time_point t0) {
    const std::vector<std::uint64_t> sums = committing_.sums;
    r.confirmed = true;
    r.delta = committing_.delta;
    dense_next_ = true;
    return done(version, committing_.delta, sums, r, t0);
  }

  reply begin(std::uint64_t version, bool delta) {
    manifest announced = m_;
    announced.set_versions(version, delta ? last_ : 0);
    announced.clear_checksums(); // the new checksums travel with COMMIT
    const std::string body = announced.to_json();
    encode_frame(meta_, frame_type::begin, tag_, version, delta ? last_ : 0,
                 static_cast<std::uint64_t>(delta ? update_kind::delta : update_kind::dense), m_.layout_hash(), 0,
                 as_bytes(body));
    link_.send(meta_, 0, after(o_.timeout));
    return wait_all(version, after(o_.timeout), "waiting for READY", frame_type::ready);
  }

  // Waits until every peer answered `want` for this attempt; returns early with the first
  // REFUSE or NACK. Replies about other versions or attempts (a failed earlier publish) are skipped.
  reply wait_all(std::uint64_t version, deadline until, std::string_view what, frame_type want) {
    std::vector<char> got(be_.peers(), 0);
    std::size_t left = got.size();
    while (left > 0) {
      check_abort(version);
      const auto step = std::min(until, clock::now() + std::chrono::milliseconds(50)); // wake up for abort()
      auto msg = link_.receive(step);
      if (!msg) {
        if (clock::now() >= until) {
          std::string missing;
          for (std::size_t p = 0; p < got.size(); ++p)
            if (!got[p]) missing += rlpt::detail::format("{}{}", missing.empty() ? "" : ", ", be_.peer_name(p));
          RLPT_FAIL(errors::sync::timeout, "{}: timed out {} for version {} (no answer from {})", where_, what, version,
                    missing);
        }
        continue;
      }
      std::optional<reply> r;
      try {
        const frame f = decode_frame(msg->meta, where_);
        if (f.version == version && f.tag == tag_) r = to_reply(f, be_.last_peer());
      } catch (...) {
        link_.release();
        throw;
      }
      link_.release();
      if (!r) continue;
      if (r->type == frame_type::refuse || r->type == frame_type::nack) return *r;
      if (r->type == want && r->peer < got.size() && !got[r->peer]) {
        got[r->peer] = 1;
        --left;
      }
    }
    return reply{want, 0, 0, {}, {}};
  }

  static std::optional<reply> to_reply(const frame& f, std::size_t peer) {
    switch (f.type) {
    case frame_type::ready:
    case frame_type::ack:
      return reply{f.type, 0, peer, {}, {}};
    case frame_type::refuse:
    case frame_type::nack: {
      auto [id, msg] = detail::split_error_body(f.body);
      return reply{f.type, f.index, peer, std::move(id), std::move(msg), f.count};
    }
    default:
      return std::nullopt;
    }
  }

  // Non-blocking: a REFUSE or NACK for this attempt ends the sending early (throws nacked).
  void poll_nack(std::uint64_t version) {
    check_abort(version);
    for (;;) {
      auto msg = link_.receive(clock::now());
      if (!msg) return;
      std::optional<reply> r;
      try {
        const frame f = decode_frame(msg->meta, where_);
        if (f.version == version && f.tag == tag_ && (f.type == frame_type::nack || f.type == frame_type::refuse))
          r = to_reply(f, be_.last_peer());
      } catch (...) {
        link_.release();
        throw;
      }
      link_.release();
      if (r) throw nacked{std::move(*r)};
    }
  }

  void send_dense(std::uint64_t version, std::vector<std::uint64_t>& sums, publish_result& r) {
    be_.begin_dense();
    for (std::uint64_t b = 0; b < m_.bucket_count(); ++b) {
      check_abort(version);
      const std::uint64_t size = m_.bucket_size(b);
      const std::span<std::byte> buf = link_.payload_buffer(size, after(o_.timeout));
      const std::span<const std::uint64_t> pieces = be_.pack(b, buf, version, after(o_.timeout));
      encode_frame(meta_, frame_type::bucket, tag_, version, 0, b, pieces.size(), size, detail::u64_bytes(pieces));
      link_.send(meta_, size, after(o_.timeout));
      ++r.messages;
      r.wire_bytes += size;
      poll_nack(version);
    }
    be_.end_dense(sums);
  }

  void send_delta(std::uint64_t version, std::vector<std::uint64_t>& sums, publish_result& r) {
    const std::size_t n = be_.encode_delta(sums, r.stats, version, after(o_.timeout));
    for (std::size_t k = 0; k < n; ++k) {
      check_abort(version);
      const std::uint64_t size = be_.delta_bytes(k);
      const std::span<std::byte> buf = link_.payload_buffer(size, after(o_.timeout));
      const delta_body d = be_.write_delta(k, buf, version, after(o_.timeout));
      encode_frame(meta_, frame_type::delta, tag_, version, last_, k, d.records, size, d.body);
      link_.send(meta_, size, after(o_.timeout));
      ++r.messages;
      r.wire_bytes += size;
      poll_nack(version);
    }
  }

  std::uint64_t next_tag() noexcept {
    // Distinct across attempts and across sender restarts (a restarted trainer re-sends a version).
    tag_seed_ += 0x9e3779b97f4a7c15ull;
    std::uint64_t z = tag_seed_;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }

  link_type& link_;
  manifest m_;
  sender_options o_;
  std::string where_;
  Backend be_;
  std::uint64_t tag_ = 0;
  std::uint64_t tag_seed_ =
      static_cast<std::uint64_t>(clock::now().time_since_epoch().count()) ^ reinterpret_cast<std::uintptr_t>(this);
  std::vector<std::byte> meta_;
  bool published_ = false;
  std::uint64_t last_ = 0;
  std::uint64_t since_anchor_ = 0;
  commit_sent committing_;
  bool dense_next_ = false; //!< after a confirmed lost ACK: the backend's delta base is stale
  std::atomic<bool> abort_{false};
  std::mutex abort_mu_;
  std::string abort_reason_;
};

//! Engine side: receives updates from a link, verifies them, applies them and publishes each
//! version only once all of it verified (see the file comment; `receiver` and
//! `device_receiver` are this over host and device backends).
template <class Backend> class basic_receiver {
public:
  using backend_type = Backend;
  using link_type = typename Backend::link_type;
  using options = typename Backend::options;

  template <class... Args>
  basic_receiver(link_type& l, options o, Args&&... backend_args)
      : link_(l), o_(std::move(o)), st_(initial_state(l)), duplex_(l.info().duplex),
        be_(l, o_, st_.where, std::forward<Args>(backend_args)...) {}

  basic_receiver(const basic_receiver&) = delete;
  basic_receiver& operator=(const basic_receiver&) = delete;

  [[nodiscard]] bool has_version() const noexcept { return st_.has; }
  //! The published version (meaningful when has_version()).
  [[nodiscard]] std::uint64_t version() const noexcept { return st_.version; }
  //! True after a failed update wrote into the held bytes (the mirror, or the device targets):
  //! only dense updates are accepted until one succeeds.
  [[nodiscard]] bool torn() const noexcept { return st_.torn; }
  //! True while only a dense update is accepted next (torn, a failed delta, or a failure after
  //! loading began: the engine may hold a mix), with the reason.
  [[nodiscard]] bool dense_only() const noexcept { return st_.dense_next || st_.torn; }
  //! Manifest of the published version, with its checksums.
  [[nodiscard]] const manifest& published_manifest() const {
    RLPT_CHECK(st_.has, errors::sync::no_version, "{}: no version has been published yet", st_.where);
    return st_.pub;
  }

  //! model_digest() of the published version (from the checksums it was verified against).
  [[nodiscard]] std::uint64_t digest() const { return model_digest(published_manifest()); }

  //! The cache directive of the latest published version while the engine has not acknowledged
  //! it (the options' cache action; nullopt when none is pending).
  [[nodiscard]] const std::optional<cache_directive>& pending_cache() const noexcept { return cache_pending_; }

  //! The engine applied the cache directive of `version` (reset its prefix cache, or keys requests
  //! by its salt). rlpt.sync.bad_version unless that is the pending directive's version.
  void acknowledge_cache(std::uint64_t version) {
    RLPT_CHECK(cache_pending_.has_value(), errors::sync::bad_version,
               "{}: acknowledging the cache directive of version {}, but none is pending (cache action {}{})",
               st_.where, version, name(o_.cache),
               cache_acked_ != 0 ? rlpt::detail::format("; version {} was acknowledged", cache_acked_) : std::string());
    RLPT_CHECK(cache_pending_->version == version, errors::sync::bad_version,
               "{}: acknowledging the cache directive of version {}, but the pending one is version {}'s", st_.where,
               version, cache_pending_->version);
    cache_acked_ = version;
    cache_pending_.reset();
  }

  //! Re-hashes the bytes this receiver holds (the host mirror; the device targets) and checks
  //! every tensor against the published version's checksums: returns digest() when every byte
  //! is still the sender's, throws rlpt.sync.checksum naming the first tensor that differs
  //! (damaged since it was published). A delta update checks the same before it publishes.
  //! Call it from the thread that polls.
  std::uint64_t verify() {
    RLPT_CHECK(st_.has, errors::sync::no_version, "{}: no version has been published yet", st_.where);
    RLPT_CHECK(!st_.torn, errors::sync::torn, "{}: the held bytes were partly overwritten by a failed update",
               st_.where);
    std::vector<std::uint64_t> sums(st_.pub.size(), 0);
    std::vector<char> known(st_.pub.size(), 0);
    be_.held_checksums(st_, sums, known);
    for (std::size_t i = 0; i < st_.pub.size(); ++i)
      RLPT_CHECK(!known[i] || sums[i] == st_.pub[i].checksum, errors::sync::checksum,
                 "{}: version {}: tensor \"{}\" now has checksum {}, it was published with {}", st_.where, st_.version,
                 st_.pub[i].name, to_hex(sums[i]), to_hex(st_.pub[i].checksum));
    return digest();
  }

  //! Processes messages until an update is published or fails, or until `wait` passes with
  //! no update in progress. An update in progress is always driven to its end (each step
  //! bounded by the options' timeout).
  update poll(std::chrono::milliseconds wait = std::chrono::milliseconds(0)) {
    if (!events_.empty()) return pop_event();
    const deadline idle_until = clock::now() + wait;
    for (;;) {
      const deadline until = cur_.active ? clock::now() + o_.timeout : idle_until;
      std::optional<message> msg;
      try {
        msg = link_.receive(until);
      } catch (const error& e) {
        if (cur_.active) return fail(e.id(), e.message());
        last_link_error_ = e.message();
        if (clock::now() >= idle_until) return {};
        std::this_thread::sleep_for(std::chrono::milliseconds(5)); // the link reconnects on its next call
        continue;
      }
      if (!msg) {
        if (cur_.active)
          return fail(errors::sync::timeout,
                      rlpt::detail::format("{}: timed out after {} ms waiting for {} of version {}", st_.where,
                                           o_.timeout.count(), expecting(), cur_.version));
        return {};
      }
      std::optional<update> done;
      try {
        done = handle(*msg);
      } catch (const error& e) {
        release();
        if (cur_.active) return fail(e.id(), e.message());
        continue; // garbage between updates: dropped
      } catch (const std::exception& e) {
        release();
        if (cur_.active) return fail(errors::sync::receive_failed, rlpt::detail::format("{}: {}", st_.where, e.what()));
        continue;
      }
      release();
      if (done) return *done;
      if (!events_.empty()) return pop_event();
      if (!cur_.active && clock::now() >= idle_until) return {};
    }
  }

  //! Text of the last link error seen while idle (a peer that went away between updates).
  [[nodiscard]] const std::string& last_link_error() const noexcept { return last_link_error_; }

protected:
  using inflight = receiver_inflight<typename Backend::inflight_state>;

  [[nodiscard]] Backend& backend() noexcept { return be_; }
  [[nodiscard]] const Backend& backend() const noexcept { return be_; }
  [[nodiscard]] const receiver_state& state() const noexcept { return st_; }
  [[nodiscard]] const options& opts() const noexcept { return o_; }

private:
  static receiver_state initial_state(link_type& l) {
    const link_info li = l.info();
    RLPT_CHECK(li.payload_space == Backend::space, errors::sync::bad_link, "{}", Backend::wrong_link(li.name));
    receiver_state s;
    s.where = li.name;
    return s;
  }

  update pop_event() {
    update u = std::move(events_.front());
    events_.pop_front();
    return u;
  }

  void release() {
    try {
      link_.release();
    } catch (...) {}
  }

  [[nodiscard]] std::string expecting() const {
    if (cur_.delta) return rlpt::detail::format("delta chunk {} or COMMIT", cur_.next);
    if (cur_.next < cur_.m.bucket_count())
      return rlpt::detail::format("bucket {} of {}", cur_.next, cur_.m.bucket_count());
    return "COMMIT";
  }

  void reply(frame_type type, std::uint64_t tag, std::uint64_t version, std::uint64_t index, std::uint64_t count,
             std::string_view body) {
    if (!duplex_) return;
    std::vector<std::byte> meta;
    encode_frame(meta, type, tag, version, 0, index, count, 0, as_bytes(body));
    try {
      // A NACK is best effort: its peer may be the one that just went away.
      link_.send(meta, 0,
                 after(type == frame_type::nack
                           ? std::min<std::chrono::nanoseconds>(o_.timeout, std::chrono::milliseconds(100))
                           : std::chrono::nanoseconds(o_.timeout)));
    } catch (const error& e) {
      last_link_error_ = e.message();
      // The sender cannot hear us: an update in progress cannot complete.
      if (cur_.active && type == frame_type::ready) throw;
    }
  }

  update fail(std::string_view id, std::string msg) {
    update u;
    u.state = update::status::failed;
    u.version = cur_.version;
    u.base_version = cur_.base;
    u.delta = cur_.delta;
    u.bytes = cur_.bytes;
    u.tensors_loaded = cur_.loaded;
    u.partial = cur_.partial;
    u.error_id = std::string(id);
    u.reason = std::move(msg);
    u.seconds = cur_.active ? detail::seconds_since(cur_.t0) : 0.0;
    if (cur_.active) {
      // Loading had begun: the engine (or the targets) may hold a mix of versions, which a
      // delta (loading only what changed) would not repair.
      if (cur_.partial)
        st_.require_dense(rlpt::detail::format("version {} failed after loading had begun", cur_.version));
      be_.failed(cur_, st_, u.reason);
      // No NACK to a sender the link saw go away: nobody would read it (a restarted sender
      // runs another attempt), and waiting to send it would only delay this report.
      if (id != errors::sync::peer_lost)
        reply(frame_type::nack, cur_.tag, cur_.version, detail::nack_code(id), 0,
              detail::error_body(u.error_id, u.reason));
    }
    cur_ = inflight{};
    return u;
  }

  void refuse(const frame& f, refusal why, std::string_view id, std::string msg, std::uint64_t value = 0) {
    reply(frame_type::refuse, f.tag, f.version, static_cast<std::uint64_t>(why), value, detail::error_body(id, msg));
    if (why == refusal::base_mismatch && duplex_) return; // the sender resends dense: not a failure
    update u;
    u.state = update::status::failed;
    u.version = f.version;
    u.base_version = f.base_version;
    u.delta = f.index == static_cast<std::uint64_t>(update_kind::delta);
    u.error_id = std::string(id);
    u.reason = std::move(msg);
    events_.push_back(std::move(u));
  }

  [[nodiscard]] bool current(const frame& f) const noexcept {
    return cur_.active && f.version == cur_.version && f.tag == cur_.tag;
  }

  std::optional<update> handle(const message& msg) {
    const frame f = decode_frame(msg.meta, st_.where);
    switch (f.type) {
    case frame_type::begin:
      on_begin(f);
      return std::nullopt;
    case frame_type::bucket:
      if (!current(f)) return std::nullopt; // a failed attempt's leftovers
      on_bucket(f, msg.payload);
      return std::nullopt;
    case frame_type::delta:
      if (!current(f)) return std::nullopt;
      on_delta(f, msg.payload);
      return std::nullopt;
    case frame_type::commit:
      if (!current(f)) {
        reply(frame_type::nack, f.tag, f.version, 0, 0,
              detail::error_body(
                  errors::sync::no_update,
                  rlpt::detail::format("{}: COMMIT of version {} without a BEGIN (the receiver restarted or already "
                                       "failed this update)",
                                       st_.where, f.version)));
        return std::nullopt;
      }
      return on_commit(f);
    case frame_type::abort:
      if (!current(f)) return std::nullopt;
      return fail(errors::sync::aborted, rlpt::detail::format("{}: the sender aborted version {}: {}", st_.where,
                                                              f.version, as_chars(f.body)));
    default:
      RLPT_FAIL(errors::sync::protocol, "{}: unexpected {} frame on the receiving side", st_.where, name(f.type));
    }
  }

  void on_begin(const frame& f) {
    if (cur_.active) {
      // A BEGIN of the same version before any of it arrived is the sender's retry (a delta
      // refused by another receiver of the group, now sent dense): not a failure. Anything
      // else replaces an update that will never complete.
      if (cur_.next == 0 && f.version == cur_.version) {
        be_.discard(cur_);
        cur_ = inflight{};
      } else {
        events_.push_back(fail(errors::sync::superseded,
                               rlpt::detail::format("{}: version {} was superseded by a BEGIN of version {}", st_.where,
                                                    cur_.version, f.version)));
      }
    }
    const bool delta = f.index == static_cast<std::uint64_t>(update_kind::delta);
    RLPT_CHECK(f.index <= 1, errors::sync::protocol, "{}: BEGIN of version {} has unknown kind {}", st_.where,
               f.version, f.index);
    inflight c;
    try {
      c.m = manifest::from_json(as_chars(f.body));
      be_.check_manifest(c.be, c.m);
    } catch (const error& e) {
      return refuse(f, refusal::bad_manifest, e.id(),
                    rlpt::detail::format("{}: BEGIN of version {}: {}", st_.where, f.version, e.message()));
    }
    const manifest& m = c.m;
    if (m.layout_hash() != f.count)
      return refuse(
          f, refusal::bad_manifest, errors::sync::manifest_hash,
          rlpt::detail::format("{}: BEGIN of version {} announces layout hash {} but its manifest hashes to {}",
                               st_.where, f.version, to_hex(f.count), to_hex(m.layout_hash())));
    if (o_.expect_layout_hash && m.layout_hash() != *o_.expect_layout_hash)
      return refuse(f, refusal::layout_mismatch, errors::sync::manifest_hash,
                    rlpt::detail::format("{}: version {} has layout hash {}, this receiver expects {}", st_.where,
                                         f.version, to_hex(m.layout_hash()), to_hex(*o_.expect_layout_hash)));
    if (st_.has && f.version <= st_.version) // holding exactly that version: say which bytes (a lost ACK)
      return refuse(f, refusal::stale_version, errors::sync::stale_version,
                    rlpt::detail::format("{}: version {} is not newer than the published version {}", st_.where,
                                         f.version, st_.version),
                    f.version == st_.version && !st_.torn ? model_digest(st_.pub) : 0);
    if (m.packed_bytes() > o_.max_update_bytes)
      return refuse(f, refusal::too_large, errors::sync::too_large,
                    rlpt::detail::format("{}: version {} packs {} bytes, more than {}::max_update_bytes = {}",
                                         st_.where, f.version, m.packed_bytes(), Backend::options_name,
                                         o_.max_update_bytes));
    const bool same = st_.has && st_.pub.layout_hash() == m.layout_hash() && st_.pub.same_layout(m);
    if (delta) {
      std::string why = be_.delta_refusal(c.be, m);
      if (!why.empty()) {
      } else if (!st_.has) {
        why = "this receiver has no published version yet";
      } else if (st_.torn) {
        why = "the held bytes were torn by a failed update";
      } else if (st_.dense_next) {
        why = st_.dense_why;
      } else if (f.base_version != st_.version) {
        why =
            rlpt::detail::format("its base is version {}, this receiver holds version {}", f.base_version, st_.version);
      } else if (!same) {
        why = "the layout changed since the published version";
      }
      if (!why.empty())
        return refuse(f, refusal::base_mismatch, errors::sync::base_mismatch,
                      rlpt::detail::format("{}: delta version {}: {}; send a dense update", st_.where, f.version, why));
    }
    c.active = true;
    c.tag = f.tag;
    c.version = f.version;
    c.base = f.base_version;
    c.delta = delta;
    c.same_layout = same;
    c.t0 = clock::now();
    try {
      be_.setup(c, st_);
    } catch (const error& e) {
      be_.discard(c);
      return refuse(f, Backend::setup_refusal, e.id(),
                    rlpt::detail::format("{}: version {}: {}", st_.where, f.version, e.message()));
    }
    cur_ = std::move(c);
    reply(frame_type::ready, f.tag, f.version, st_.has ? 1 : 0, st_.has ? st_.pub.layout_hash() : 0, {});
  }

  void on_bucket(const frame& f, std::span<const std::byte> payload) {
    const manifest& m = cur_.m;
    RLPT_CHECK(!cur_.delta, errors::sync::protocol, "{}: BUCKET frame in delta version {}", st_.where, f.version);
    RLPT_CHECK(f.index == cur_.next && f.index < m.bucket_count(), errors::sync::protocol,
               "{}: got bucket {} of version {}, expected {}", st_.where, f.index, f.version, expecting());
    const std::size_t pieces = m.pieces(f.index).size();
    RLPT_CHECK(f.count == pieces && f.body.size() == pieces * 8, errors::sync::protocol,
               "{}: bucket {} of version {} lists {} piece checksums, the manifest has {} pieces", st_.where, f.index,
               f.version, f.count, pieces);
    RLPT_CHECK(payload.size() == m.bucket_size(f.index), errors::sync::truncated,
               "{}: bucket {} of version {} has {} bytes, expected {}", st_.where, f.index, f.version, payload.size(),
               m.bucket_size(f.index));
    be_.bucket(cur_, f, payload, st_);
    cur_.bytes += payload.size();
    ++cur_.next;
  }

  void on_delta(const frame& f, std::span<const std::byte> payload) {
    RLPT_CHECK(cur_.delta, errors::sync::protocol, "{}: DELTA frame in dense version {}", st_.where, f.version);
    RLPT_CHECK(f.index == cur_.next, errors::sync::protocol, "{}: got delta chunk {} of version {}, expected {}",
               st_.where, f.index, f.version, cur_.next);
    be_.delta_chunk(cur_, f, payload, st_);
    cur_.bytes += payload.size();
    ++cur_.next;
  }

  std::optional<update> on_commit(const frame& f) {
    const manifest& m = cur_.m;
    RLPT_CHECK(f.count == cur_.next, errors::sync::truncated, "{}: COMMIT of version {} counts {} messages, {} arrived",
               st_.where, f.version, f.count, cur_.next);
    RLPT_CHECK(cur_.delta || cur_.next == m.bucket_count(), errors::sync::truncated,
               "{}: COMMIT of version {} after {} of {} buckets", st_.where, f.version, cur_.next, m.bucket_count());
    RLPT_CHECK(f.body.size() == m.size() * 8, errors::sync::protocol,
               "{}: COMMIT of version {} carries {} checksum bytes for {} tensors", st_.where, f.version, f.body.size(),
               m.size());
    std::vector<std::uint64_t> want(m.size());
    if (!want.empty()) std::memcpy(want.data(), f.body.data(), f.body.size());
    if (cur_.delta)
      be_.commit_delta(cur_, f, want, st_);
    else
      be_.commit_dense(cur_, f, want, st_);
    return publish(want);
  }

  std::optional<update> publish(const std::vector<std::uint64_t>& sums) {
    update u;
    u.state = update::status::published;
    u.version = cur_.version;
    u.base_version = cur_.base;
    u.delta = cur_.delta;
    u.bytes = cur_.bytes;
    u.tensors_loaded = cur_.loaded;
    u.seconds = detail::seconds_since(cur_.t0);
    st_.pub = std::move(cur_.m);
    for (std::size_t i = 0; i < sums.size(); ++i) st_.pub.set_checksum(i, sums[i]);
    st_.pub.set_versions(cur_.version, cur_.base);
    u.digest = model_digest(st_.pub);
    if (o_.cache != cache_action::none) {
      u.cache = {o_.cache, cur_.version,
                 o_.cache == cache_action::salt ? rlpt::detail::format("rlpt-v{}-{}", cur_.version, to_hex(u.digest))
                                                : std::string()};
      if (cache_pending_) u.cache_unacknowledged = cache_pending_->version;
      cache_pending_ = u.cache;
    }
    st_.version = cur_.version;
    st_.has = true;
    st_.torn = false;
    if (!cur_.delta) {
      st_.dense_next = false;
      st_.dense_why.clear();
    }
    be_.published(cur_, st_);
    const std::uint64_t v = cur_.version, tag = cur_.tag;
    cur_ = inflight{};
    reply(frame_type::ack, tag, v, 0, 0, {});
    return u;
  }

  link_type& link_;
  options o_;
  receiver_state st_;
  bool duplex_ = true;
  Backend be_;
  inflight cur_;
  std::deque<update> events_;
  std::string last_link_error_;
  std::optional<cache_directive> cache_pending_{};
  std::uint64_t cache_acked_ = 0;
};

} // namespace sync
RLPT_NAMESPACE_END
