// SPDX-License-Identifier: Apache-2.0
//! @file
//! The versioned update protocol: a sender and a receiver state machine over any link.
//!
//!     sender                                    receiver
//!     BEGIN(version, base, kind, manifest) ->
//!                                           <-  READY(published version) | REFUSE(why)
//!     BUCKET 0..n-1 (dense) | DELTA 0..k-1  ->  each verified (XXH3 per piece / per chunk)
//!     COMMIT(tensor checksums)              ->  verify all, apply, load, publish
//!                                           <-  ACK | NACK(id, why)
//!
//! Every blocking step has a timeout. The receiver publishes a version only after all of it
//! arrived, verified and was applied; an aborted, timed-out or corrupted update leaves the
//! previously published version intact and readable, and poll() says why. A delta whose base
//! is not the receiver's published version is refused and the sender falls back to dense.
//!
//! Memory (receiver, `apply_mode::staged`, the default): the update is staged before anything
//! is applied, so the previous version survives any failure; a delta stages only its records
//! (a few % of the model), a dense update stages the model's bytes (with the mirror that is
//! the new mirror, swapped in at commit). The replaced mirror (or, without a mirror, the
//! staging area) is kept as the next dense update's staging area, so steady-state updates
//! write into memory that is already mapped; the published mirror is never staged into. `apply_mode::streaming` hands each bucket to the
//! load callback as soon as it is verified: extra memory is the link's slots plus the largest
//! split tensor, but a failure part-way leaves the engine partially loaded (poll() reports
//! `partial` and the receiver accepts only a dense update next). Sender: the link's slots,
//! plus one host snapshot of the last published version when deltas are on.
#pragma once

#include <rlpt/config.hpp>
#include <rlpt/core/error.hpp>
#include <rlpt/sync/checksum.hpp>
#include <rlpt/sync/delta.hpp>
#include <rlpt/sync/frame.hpp>
#include <rlpt/sync/link.hpp>
#include <rlpt/sync/manifest.hpp>
#include <rlpt/sync/transform.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

RLPT_NAMESPACE_BEGIN
namespace sync {

namespace detail {

//! Heap bytes without zero-filling (a 100 GB staging area should not be memset first). Its
//! size can shrink and grow again within the capacity it was allocated with, so a staging
//! area is reused across updates instead of page-faulting fresh memory each time.
class byte_buffer {
public:
  byte_buffer() = default;
  explicit byte_buffer(std::size_t n) : p_(n ? new std::byte[n] : nullptr), n_(n), cap_(n) {}
  byte_buffer(byte_buffer&& o) noexcept
      : p_(std::move(o.p_)), n_(std::exchange(o.n_, std::size_t{0})), cap_(std::exchange(o.cap_, std::size_t{0})) {}
  byte_buffer& operator=(byte_buffer&& o) noexcept {
    p_ = std::move(o.p_);
    n_ = std::exchange(o.n_, std::size_t{0});
    cap_ = std::exchange(o.cap_, std::size_t{0});
    return *this;
  }
  [[nodiscard]] std::byte* data() const noexcept { return p_.get(); }
  [[nodiscard]] std::size_t size() const noexcept { return n_; }
  [[nodiscard]] std::size_t capacity() const noexcept { return cap_; }
  [[nodiscard]] std::span<std::byte> span() const noexcept { return {p_.get(), n_}; }
  //! Size `n` with the old bytes kept when `n` fits the capacity, else a fresh allocation.
  void resize(std::size_t n) {
    if (n <= cap_) n_ = n;
    else *this = byte_buffer(n);
  }

private:
  std::unique_ptr<std::byte[]> p_;
  std::size_t n_ = 0, cap_ = 0;
};

inline std::span<const std::byte> u64_bytes(std::span<const std::uint64_t> v) noexcept {
  return {reinterpret_cast<const std::byte*>(v.data()), v.size() * 8};
}

inline std::uint64_t body_u64(std::span<const std::byte> body, std::size_t i) noexcept {
  std::uint64_t v;
  std::memcpy(&v, body.data() + i * 8, 8);
  return v;
}

//! "<id>\n<message>" bodies of REFUSE / NACK.
inline std::string error_body(std::string_view id, std::string_view msg) { return fmt::format("{}\n{}", id, msg); }
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

inline double seconds_since(clock::time_point t0) {
  return std::chrono::duration<double>(clock::now() - t0).count();
}

} // namespace detail

//! The whole-model digest of a version: XXH3-64 of its tensor checksums as little-endian u64
//! in manifest order (the checksums a COMMIT carries). Sender and receiver compute it from the
//! same checksums, so equal digests mean equal versions (to the strength of the checksums);
//! receiver::verify() recomputes it from the bytes the receiver holds.
[[nodiscard]] inline std::uint64_t model_digest(const manifest& m) {
  std::vector<std::uint64_t> sums(m.size());
  for (std::size_t i = 0; i < m.size(); ++i) sums[i] = m[i].checksum;
  return xxh3(sums.data(), sums.size() * 8);
}

//! How a receiver applies an update (see the file comment).
enum class apply_mode : std::uint8_t {
  staged,   //!< verify everything, then apply: the previous version survives any failure
  streaming //!< load each verified bucket at once: least memory, failures leave partial loads
};

struct sender_options {
  //! Send changed elements only (verl delta_sharded, TRL delta sync, slime disk-delta). Off by
  //! default like every framework; needs one host snapshot of the model on the sender.
  bool delta = false;
  //! With deltas, make every n-th update dense (TRL's periodic anchors). 0: only when needed
  //! (first update, or the receiver refuses a delta): records are lossless and checksummed.
  std::uint32_t anchor_every = 0;
  //! Limit for each blocking step (a free slot, a reply). NeMo-RL's per-transfer ZMQ timeout.
  std::chrono::milliseconds timeout{30'000};
  //! Limit for the receiver's answer to COMMIT, which includes its loading. TRL's request timeout.
  std::chrono::milliseconds commit_timeout{300'000};
};

struct publish_result {
  std::uint64_t version = 0;
  bool delta = false;            //!< sent as a delta
  bool fell_back = false;        //!< a delta was refused (base mismatch) and sent dense instead
  std::uint64_t messages = 0;    //!< BUCKET or DELTA messages
  std::uint64_t wire_bytes = 0;  //!< payload bytes moved
  std::uint64_t dense_bytes = 0; //!< the model's bytes (what a dense update moves, less padding)
  delta_stats stats{};           //!< change counts (delta updates)
  std::uint64_t digest = 0;      //!< model_digest() of the published version (the receiver's update::digest)
  double seconds = 0;
};

//! Where the sender reads tensor i's current bytes (host, nbytes long). Called per bucket, so
//! a trainer can materialise parameters lazily (FSDP full_tensor per bucket).
using source_fn = std::function<std::span<const std::byte>(std::size_t tensor)>;

//! Trainer side: publishes versions of the tensors in a manifest over a link.
class sender {
public:
  //! `params` are matched to the manifest by name (dtype and shape must agree); their memory
  //! must stay valid and unchanged during publish().
  sender(link& l, manifest m, std::span<const tensor_ref> params, sender_options o = {})
      : link_(l), m_(std::move(m)), o_(o) {
    std::vector<const void*> ptrs(m_.size(), nullptr);
    for (const auto& p : params) {
      const auto i = m_.find(p.name);
      RLPT_CHECK(i.has_value(), errors::sync::bad_source, "parameter \"{}\" is not in the manifest", p.name);
      const tensor_entry& e = m_[*i];
      RLPT_CHECK(p.dtype == e.dtype && p.shape == e.shape, errors::sync::bad_source,
                 "parameter \"{}\" is {} [{}] but the manifest says {} [{}]", p.name, p.dtype, fmt::join(p.shape, ", "),
                 e.dtype, fmt::join(e.shape, ", "));
      RLPT_CHECK(p.data != nullptr || e.nbytes == 0, errors::sync::bad_source, "parameter \"{}\" has no data", p.name);
      ptrs[*i] = p.data;
    }
    for (std::size_t i = 0; i < m_.size(); ++i)
      RLPT_CHECK(ptrs[i] != nullptr || m_[i].nbytes == 0, errors::sync::bad_source,
                 "manifest tensor \"{}\" has no parameter", m_[i].name);
    src_ = [ptrs = std::move(ptrs), this](std::size_t i) {
      return std::span<const std::byte>(static_cast<const std::byte*>(ptrs[i]), m_[i].nbytes);
    };
    init();
  }

  sender(link& l, manifest m, source_fn source, sender_options o = {})
      : link_(l), m_(std::move(m)), src_(std::move(source)), o_(o) {
    RLPT_CHECK(static_cast<bool>(src_), errors::sync::bad_source, "sender needs a source function");
    init();
  }

  sender(const sender&) = delete;
  sender& operator=(const sender&) = delete;

  [[nodiscard]] bool has_published() const noexcept { return published_; }
  [[nodiscard]] std::uint64_t published_version() const noexcept { return last_; }
  //! The manifest with the checksums of the last successful publish.
  [[nodiscard]] const manifest& current_manifest() const noexcept { return m_; }
  //! model_digest() of the last published version: what the receiver's digest() must equal.
  [[nodiscard]] std::uint64_t digest() const {
    RLPT_CHECK(published_, errors::sync::no_version, "{}: no version has been published yet", where_);
    return model_digest(m_);
  }

  //! Makes an in-flight publish() (on another thread) stop at its next step and throw
  //! rlpt.sync.aborted; the receiver is told why and keeps its version.
  void abort(std::string reason) {
    std::lock_guard lock(abort_mu_);
    abort_reason_ = std::move(reason);
    abort_.store(true, std::memory_order_release);
  }

  //! Sends version `version` (greater than the last published) and waits for the receiver to
  //! publish it. Throws rlpt::error on refusal, NACK, timeout, lost peer or abort; the sender
  //! then stays at its previous version and the next publish() starts clean.
  publish_result publish(std::uint64_t version) {
    const auto t0 = clock::now();
    RLPT_CHECK(!published_ || version > last_, errors::sync::bad_version,
               "publish({}) after version {}: versions must increase", version, last_);
    abort_.store(false, std::memory_order_release);
    tag_ = next_tag();
    publish_result r;
    r.version = version;
    r.dense_bytes = m_.payload_bytes();
    bool delta = o_.delta && published_ && !(o_.anchor_every != 0 && since_anchor_ + 1 >= o_.anchor_every);
    std::vector<std::uint64_t> sums(m_.size(), 0);
    std::vector<std::byte> records;
    // A delta whose base the receiver does not hold (REFUSE at BEGIN) or whose base failed
    // verification there (NACK) is sent again, dense, once.
    auto fall_back = [&](const reply& rep) {
      if (!delta || r.fell_back || rep.code != static_cast<std::uint64_t>(refusal::base_mismatch)) return false;
      delta = false;
      r.fell_back = true;
      tag_ = next_tag();
      std::fill(sums.begin(), sums.end(), 0);
      return true;
    };
    try {
      for (;;) {
        const reply rep = begin(version, delta);
        if (rep.type != frame_type::ready) {
          if (fall_back(rep)) continue;
          ::rlpt::detail::raise(rep.id, fmt::format("{}: the receiver refused version {}: {}", where_, version, rep.message));
        }
        r.delta = delta;
        const std::uint64_t first = r.messages;
        reply no;
        std::string_view verb = "rejected";
        try {
          if (delta) send_delta(version, sums, records, r);
          else send_dense(version, sums, r);
          check_abort(version);
          encode_frame(meta_, frame_type::commit, tag_, version, delta ? last_ : 0, 0, r.messages - first, 0,
                       detail::u64_bytes(sums));
          link_.send(meta_, 0, after(o_.timeout));
          no = wait_reply(version, after(o_.commit_timeout), "waiting for the receiver to commit");
          if (no.type == frame_type::ack) break;
        } catch (const nacked& n) { // the receiver failed the attempt before COMMIT
          no = n.rep;
          verb = "failed";
        }
        if (fall_back(no)) continue;
        ::rlpt::detail::raise(no.id, fmt::format("{}: the receiver {} version {}: {}", where_, verb, version, no.message));
      }
    } catch (...) {
      try { // best effort: tell the receiver, so it stops waiting
        std::string why;
        {
          std::lock_guard lock(abort_mu_);
          why = abort_reason_.empty() ? "the sender failed" : abort_reason_;
        }
        encode_frame(meta_, frame_type::abort, tag_, version, 0, 0, 0, 0, as_bytes(why));
        link_.send(meta_, 0, after(std::chrono::milliseconds(100)));
      } catch (...) {
      }
      throw;
    }
    // Committed: remember what the receiver now holds.
    if (o_.delta) {
      if (delta) {
        for_each_delta_record(std::span<std::byte>(records), "sender snapshot", [&](delta_record& rec) {
          const tensor_entry& t = m_[rec.tensor];
          swap_apply(rec, snapshot_.span().subspan(m_.packed_offset(rec.tensor) + rec.elem_begin * size_of(t.dtype),
                                                   rec.elem_count * size_of(t.dtype)));
        });
      } else {
        for (std::size_t i = 0; i < m_.size(); ++i) {
          const auto src = src_(i);
          if (!src.empty()) std::memcpy(snapshot_.data() + m_.packed_offset(i), src.data(), src.size());
        }
      }
    }
    for (std::size_t i = 0; i < m_.size(); ++i) m_.set_checksum(i, sums[i]);
    m_.set_versions(version, delta ? last_ : 0);
    since_anchor_ = delta ? since_anchor_ + 1 : 0;
    published_ = true;
    last_ = version;
    r.digest = model_digest(m_);
    r.seconds = detail::seconds_since(t0);
    return r;
  }

private:
  struct reply {
    frame_type type = frame_type::ack;
    std::uint64_t code = 0;
    std::string id, message;
  };
  struct nacked { // a REFUSE or NACK for the attempt in flight, seen while sending
    reply rep;
  };

  void init() {
    const link_info li = link_.info();
    where_ = li.name;
    RLPT_CHECK(li.payload_space == memory_space::host, errors::sync::bad_link,
               "{} moves device payloads; the host sender needs a host link", where_);
    for (std::uint64_t b = 0; b < m_.bucket_count(); ++b)
      RLPT_CHECK(m_.bucket_size(b) <= li.max_payload, errors::sync::bad_link,
                 "bucket {} holds {} bytes but {} carries at most {} per message: plan with a smaller bucket_bytes", b,
                 m_.bucket_size(b), where_, li.max_payload);
    if (o_.delta) snapshot_ = detail::byte_buffer(static_cast<std::size_t>(m_.packed_bytes()));
  }

  void check_abort(std::uint64_t version) {
    if (!abort_.load(std::memory_order_acquire)) return;
    std::lock_guard lock(abort_mu_);
    RLPT_FAIL(errors::sync::aborted, "{}: publish of version {} aborted: {}", where_, version, abort_reason_);
  }

  std::span<const std::byte> source(std::size_t i) {
    const auto s = src_(i);
    RLPT_CHECK(s.size() == m_[i].nbytes, errors::sync::bad_source, "source of tensor \"{}\" has {} bytes, the manifest says {}",
               m_[i].name, s.size(), m_[i].nbytes);
    return s;
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
    return wait_reply(version, after(o_.timeout), "waiting for READY");
  }

  // The next reply about `version`; replies about other versions (a failed earlier publish)
  // are skipped.
  reply wait_reply(std::uint64_t version, deadline until, std::string_view what) {
    for (;;) {
      check_abort(version);
      const auto step = std::min(until, clock::now() + std::chrono::milliseconds(50)); // wake up for abort()
      auto msg = link_.receive(step);
      if (!msg) {
        if (clock::now() >= until)
          RLPT_FAIL(errors::sync::timeout, "{}: timed out {} for version {}", where_, what, version);
        continue;
      }
      std::optional<reply> r;
      try {
        const frame f = decode_frame(msg->meta, where_);
        if (f.version == version && f.tag == tag_) r = to_reply(f);
      } catch (...) {
        link_.release();
        throw;
      }
      link_.release();
      if (r) return *r;
    }
  }

  static std::optional<reply> to_reply(const frame& f) {
    switch (f.type) {
    case frame_type::ready:
    case frame_type::ack: return reply{f.type, 0, {}, {}};
    case frame_type::refuse:
    case frame_type::nack: {
      auto [id, msg] = detail::split_error_body(f.body);
      return reply{f.type, f.index, std::move(id), std::move(msg)};
    }
    default: return std::nullopt;
    }
  }

  // Non-blocking: a NACK for this version ends the publish early.
  void poll_nack(std::uint64_t version) {
    check_abort(version);
    for (;;) {
      auto msg = link_.receive(clock::now());
      if (!msg) return;
      std::optional<reply> r;
      try {
        const frame f = decode_frame(msg->meta, where_);
        if (f.version == version && f.tag == tag_ && (f.type == frame_type::nack || f.type == frame_type::refuse))
          r = to_reply(f);
      } catch (...) {
        link_.release();
        throw;
      }
      link_.release();
      if (r) throw nacked{std::move(*r)};
    }
  }

  void send_dense(std::uint64_t version, std::vector<std::uint64_t>& sums, publish_result& r) {
    std::vector<std::uint64_t> piece_sums;
    std::unordered_map<std::size_t, std::vector<std::uint64_t>> parts; // split tensors
    for (std::uint64_t b = 0; b < m_.bucket_count(); ++b) {
      check_abort(version);
      const std::uint64_t size = m_.bucket_size(b);
      const std::span<std::byte> buf = link_.payload_buffer(size, after(o_.timeout));
      const auto pieces = m_.pieces(b);
      piece_sums.assign(pieces.size(), 0);
      std::uint64_t end = 0;
      for (std::size_t j = 0; j < pieces.size(); ++j) {
        const piece& p = pieces[j];
        if (p.bucket_offset > end) std::memset(buf.data() + end, 0, static_cast<std::size_t>(p.bucket_offset - end));
        const auto src = source(p.tensor);
        piece_sums[j] = copy_hash(buf.data() + p.bucket_offset, src.data() + p.tensor_offset, static_cast<std::size_t>(p.nbytes));
        end = p.bucket_offset + p.nbytes;
        if (m_.piece_count(p.tensor) == 1) sums[p.tensor] = piece_sums[j];
        else parts[p.tensor].push_back(piece_sums[j]);
      }
      encode_frame(meta_, frame_type::bucket, tag_, version, 0, b, pieces.size(), size, detail::u64_bytes(piece_sums));
      link_.send(meta_, size, after(o_.timeout));
      ++r.messages;
      r.wire_bytes += size;
      poll_nack(version);
    }
    for (auto& [t, v] : parts) sums[t] = combine_piece_checksums(v);
  }

  void send_delta(std::uint64_t version, std::vector<std::uint64_t>& sums, std::vector<std::byte>& records,
                  publish_result& r) {
    const std::uint64_t max_msg = std::min<std::uint64_t>(m_.bucket_bytes(), link_.info().max_payload);
    delta_encoder enc(std::max<std::uint64_t>(max_msg, delta_header_bytes + 64));
    records.clear();
    for (std::size_t i = 0; i < m_.size(); ++i) {
      check_abort(version);
      const tensor_entry& t = m_[i];
      const auto now = source(i);
      const std::span<const std::byte> base(snapshot_.data() + m_.packed_offset(i), static_cast<std::size_t>(t.nbytes));
      sums[i] = enc.encode(static_cast<std::uint32_t>(i), now, base, size_of(t.dtype), t.checksum, m_.bucket_bytes(),
                           records, r.stats);
    }
    // Records never straddle messages.
    std::uint64_t at = 0, chunk = 0;
    while (at < records.size()) {
      check_abort(version);
      std::uint64_t end = at, count = 0;
      while (end < records.size()) {
        std::uint64_t body;
        std::memcpy(&body, records.data() + end + 40, 8);
        const std::uint64_t rec = delta_header_bytes + body;
        if (end > at && end + rec - at > max_msg) break;
        end += rec;
        ++count;
      }
      const std::uint64_t size = end - at;
      const std::span<std::byte> buf = link_.payload_buffer(size, after(o_.timeout));
      // The checksum of what was copied, not of the slot afterwards (another process may write it).
      const std::uint64_t check = copy_hash(buf.data(), records.data() + at, static_cast<std::size_t>(size));
      encode_frame(meta_, frame_type::delta, tag_, version, last_, chunk++, count, size,
                   detail::u64_bytes(std::span<const std::uint64_t>(&check, 1)));
      link_.send(meta_, size, after(o_.timeout));
      ++r.messages;
      r.wire_bytes += size;
      at = end;
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

  link& link_;
  manifest m_;
  source_fn src_;
  sender_options o_;
  std::uint64_t tag_ = 0;
  std::uint64_t tag_seed_ = static_cast<std::uint64_t>(clock::now().time_since_epoch().count()) ^
                            reinterpret_cast<std::uintptr_t>(this);
  std::string where_;
  std::vector<std::byte> meta_;
  detail::byte_buffer snapshot_;
  bool published_ = false;
  std::uint64_t last_ = 0;
  std::uint64_t since_anchor_ = 0;
  std::atomic<bool> abort_{false};
  std::mutex abort_mu_;
  std::string abort_reason_;
};

struct receiver_options {
  //! Limit for each blocking step of an update in progress (the next message).
  std::chrono::milliseconds timeout{30'000};
  apply_mode mode = apply_mode::staged;
  //! Keep a host copy of the published version: readable through tensor(), and the base that
  //! deltas apply to (slime keeps such a host-local checkpoint). Without it deltas are refused.
  bool mirror = true;
  //! Rename / concat / slice / cast / drop on the way to the load callback.
  std::vector<transform> transforms{};
  //! Refuse any manifest whose layout hash differs (both sides planned the same model).
  std::optional<std::uint64_t> expect_layout_hash{};
  //! Refuse updates whose packed size exceeds this (a corrupt manifest cannot make the
  //! receiver allocate without bound).
  std::uint64_t max_update_bytes = std::uint64_t{1} << 40;
};

//! What poll() saw: nothing, a published version, or a failed update and why.
struct update {
  enum class status : std::uint8_t { idle, published, failed };
  status state = status::idle;
  std::uint64_t version = 0;
  std::uint64_t base_version = 0;
  bool delta = false;
  std::uint64_t bytes = 0;          //!< payload bytes received
  std::uint64_t tensors_loaded = 0; //!< load callbacks made
  bool partial = false;             //!< failed after load callbacks ran: the engine holds a mix
  std::string error_id{};           //!< failed: the stable id (rlpt.sync.checksum, rlpt.sync.timeout, ...)
  std::string reason{};             //!< failed: what happened, with the values
  std::uint64_t digest = 0;         //!< published: model_digest() of the version (the sender's publish_result::digest)
  double seconds = 0;

  [[nodiscard]] bool published() const noexcept { return state == status::published; }
  [[nodiscard]] bool failed() const noexcept { return state == status::failed; }
};

//! Engine side: receives updates from a link, verifies, applies, calls `load` per tensor.
class receiver {
public:
  receiver(link& l, load_fn load, receiver_options o = {}) : link_(l), load_(std::move(load)), o_(std::move(o)) {
    const link_info li = link_.info();
    where_ = li.name;
    duplex_ = li.duplex;
    RLPT_CHECK(li.payload_space == memory_space::host, errors::sync::bad_link,
               "{} moves device payloads; the host receiver needs a host link", where_);
  }

  receiver(const receiver&) = delete;
  receiver& operator=(const receiver&) = delete;

  [[nodiscard]] bool has_version() const noexcept { return has_; }
  //! The published version (meaningful when has_version()).
  [[nodiscard]] std::uint64_t version() const noexcept { return version_; }
  //! True after a failed streaming update wrote into the mirror: only dense updates are accepted.
  [[nodiscard]] bool torn() const noexcept { return torn_; }
  //! Manifest of the published version, with its checksums.
  [[nodiscard]] const manifest& published_manifest() const {
    RLPT_CHECK(has_, errors::sync::no_version, "{}: no version has been published yet", where_);
    return pub_;
  }

  //! model_digest() of the published version (from the checksums it was verified against).
  [[nodiscard]] std::uint64_t digest() const { return model_digest(published_manifest()); }

  //! Re-hashes the mirror and checks every tensor against the published version's checksums:
  //! returns digest() when every byte is still the sender's, throws rlpt.sync.checksum naming
  //! the first tensor that differs (the mirror was damaged since it was published). A delta
  //! update checks the same before it publishes.
  std::uint64_t verify() const {
    RLPT_CHECK(has_ && o_.mirror, errors::sync::no_version, "{}: no published version to verify (mirror {})", where_,
               o_.mirror ? "on" : "off");
    RLPT_CHECK(!torn_, errors::sync::torn, "{}: the mirror was partly overwritten by a failed streaming update", where_);
    for (std::size_t i = 0; i < pub_.size(); ++i) {
      const std::uint64_t got = tensor_checksum(mirror_.data() + pub_.packed_offset(i), pub_[i].nbytes, pub_.bucket_bytes());
      RLPT_CHECK(got == pub_[i].checksum, errors::sync::checksum,
                 "{}: version {}: tensor \"{}\" now has checksum {}, it was published with {}", where_, version_, pub_[i].name,
                 to_hex(got), to_hex(pub_[i].checksum));
    }
    return digest();
  }

  //! The published bytes of wire tensor `name` from the mirror.
  [[nodiscard]] tensor_view tensor(std::string_view name) const {
    RLPT_CHECK(has_ && o_.mirror, errors::sync::no_version, "{}: no published version to read (mirror {})", where_,
               o_.mirror ? "on" : "off");
    RLPT_CHECK(!torn_, errors::sync::torn, "{}: the mirror was partly overwritten by a failed streaming update", where_);
    const auto i = pub_.find(name);
    RLPT_CHECK(i.has_value(), errors::sync::unknown_tensor, "{}: version {} has no tensor \"{}\"", where_, version_, name);
    const tensor_entry& t = pub_[*i];
    return {t.name, t.dtype, t.shape, {mirror_.data() + pub_.packed_offset(*i), static_cast<std::size_t>(t.nbytes)}};
  }

  //! Processes messages until an update is published or fails, or until `wait` passes with
  //! no update in progress. An update in progress is always driven to its end (each step
  //! bounded by receiver_options::timeout).
  update poll(std::chrono::milliseconds wait = std::chrono::milliseconds(0)) {
    if (!events_.empty()) {
      update u = std::move(events_.front());
      events_.pop_front();
      return u;
    }
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
          return fail(errors::sync::timeout, fmt::format("{}: timed out after {} ms waiting for {} of version {}", where_,
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
        if (cur_.active) return fail(errors::sync::receive_failed, fmt::format("{}: {}", where_, e.what()));
        continue;
      }
      release();
      if (done) return *done;
      if (!events_.empty()) {
        update u = std::move(events_.front());
        events_.pop_front();
        return u;
      }
      if (!cur_.active && clock::now() >= idle_until) return {};
    }
  }

  //! Text of the last link error seen while idle (a peer that went away between updates).
  [[nodiscard]] const std::string& last_link_error() const noexcept { return last_link_error_; }

private:
  struct inflight {
    bool active = false;
    std::uint64_t tag = 0;
    std::uint64_t version = 0, base = 0;
    bool delta = false;
    manifest m;
    transform_plan plan;
    bool same_layout = false;
    std::uint64_t next = 0;     // next bucket / delta chunk expected
    std::uint64_t bytes = 0;
    std::uint64_t loaded = 0;
    bool partial = false;
    clock::time_point t0;
    detail::byte_buffer staging;           // dense staged: packed arena
    std::vector<std::byte> records;         // delta: concatenated records
    std::vector<std::uint64_t> sums;        // tensor checksums from pieces
    std::unordered_map<std::size_t, std::vector<std::uint64_t>> parts;
    // streaming
    std::vector<std::uint64_t> pieces_left; // per tensor
    std::vector<std::uint64_t> inputs_left; // per output
    std::vector<std::uint64_t> outputs_left; // per tensor: outputs not yet run
    std::unordered_map<std::size_t, std::vector<std::byte>> held; // tensor bytes kept across buckets
    std::vector<std::span<const std::byte>> avail;
  };

  void release() {
    try {
      link_.release();
    } catch (...) {
    }
  }

  [[nodiscard]] std::string expecting() const {
    if (cur_.delta) return fmt::format("delta chunk {} or COMMIT", cur_.next);
    if (cur_.next < cur_.m.bucket_count()) return fmt::format("bucket {} of {}", cur_.next, cur_.m.bucket_count());
    return "COMMIT";
  }

  void reply(frame_type type, std::uint64_t tag, std::uint64_t version, std::uint64_t index, std::uint64_t count,
             std::string_view body) {
    if (!duplex_) return;
    std::vector<std::byte> meta;
    encode_frame(meta, type, tag, version, 0, index, count, 0, as_bytes(body));
    try {
      // A NACK is best effort: its peer may be the one that just went away (waiting for a
      // reconnect would only delay the failure report).
      link_.send(meta, 0, after(type == frame_type::nack ? std::min<std::chrono::nanoseconds>(o_.timeout, std::chrono::milliseconds(100))
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
    // No NACK to a sender the link saw go away: nobody would read it (a restarted sender runs
    // another attempt), and waiting to send it would only delay this report.
    if (cur_.active && id != errors::sync::peer_lost)
      reply(frame_type::nack, cur_.tag, cur_.version, detail::nack_code(id), 0, detail::error_body(u.error_id, u.reason));
    if (cur_.staging.capacity() > spare_.capacity()) spare_ = std::move(cur_.staging); // failed bytes, reused as scratch
    cur_ = inflight{};
    return u;
  }

  void refuse(const frame& f, refusal why, std::string_view id, std::string msg) {
    reply(frame_type::refuse, f.tag, f.version, static_cast<std::uint64_t>(why), 0, detail::error_body(id, msg));
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
    const frame f = decode_frame(msg.meta, where_);
    switch (f.type) {
    case frame_type::begin: on_begin(f); return std::nullopt;
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
              detail::error_body(errors::sync::no_update,
                                 fmt::format("{}: COMMIT of version {} without a BEGIN (the receiver restarted or already "
                                             "failed this update)", where_, f.version)));
        return std::nullopt;
      }
      return on_commit(f);
    case frame_type::abort:
      if (!current(f)) return std::nullopt;
      return fail(errors::sync::aborted, fmt::format("{}: the sender aborted version {}: {}", where_, f.version, as_chars(f.body)));
    default:
      RLPT_FAIL(errors::sync::protocol, "{}: unexpected {} frame on the receiving side", where_, name(f.type));
    }
  }

  void on_begin(const frame& f) {
    if (cur_.active)
      events_.push_back(fail(errors::sync::superseded,
                             fmt::format("{}: version {} was superseded by a BEGIN of version {}", where_, cur_.version, f.version)));
    const bool delta = f.index == static_cast<std::uint64_t>(update_kind::delta);
    RLPT_CHECK(f.index <= 1, errors::sync::protocol, "{}: BEGIN of version {} has unknown kind {}", where_, f.version, f.index);
    manifest m;
    try {
      m = manifest::from_json(as_chars(f.body));
    } catch (const error& e) {
      return refuse(f, refusal::bad_manifest, e.id(), fmt::format("{}: BEGIN of version {}: {}", where_, f.version, e.message()));
    }
    if (m.layout_hash() != f.count)
      return refuse(f, refusal::bad_manifest, errors::sync::manifest_hash,
                    fmt::format("{}: BEGIN of version {} announces layout hash {} but its manifest hashes to {}", where_,
                                f.version, to_hex(f.count), to_hex(m.layout_hash())));
    if (o_.expect_layout_hash && m.layout_hash() != *o_.expect_layout_hash)
      return refuse(f, refusal::layout_mismatch, errors::sync::manifest_hash,
                    fmt::format("{}: version {} has layout hash {}, this receiver expects {}", where_, f.version,
                                to_hex(m.layout_hash()), to_hex(*o_.expect_layout_hash)));
    if (has_ && f.version <= version_)
      return refuse(f, refusal::stale_version, errors::sync::stale_version,
                    fmt::format("{}: version {} is not newer than the published version {}", where_, f.version, version_));
    if (m.packed_bytes() > o_.max_update_bytes)
      return refuse(f, refusal::too_large, errors::sync::too_large,
                    fmt::format("{}: version {} packs {} bytes, more than receiver_options::max_update_bytes = {}", where_,
                                f.version, m.packed_bytes(), o_.max_update_bytes));
    const bool same = has_ && pub_.layout_hash() == m.layout_hash() && pub_.same_layout(m);
    if (delta) {
      std::string why;
      if (!o_.mirror) why = "this receiver keeps no mirror to apply deltas to";
      else if (!has_) why = "this receiver has no published version yet";
      else if (torn_) why = "the mirror was torn by a failed streaming update";
      else if (dense_next_) why = "a delta failed verification here since the last dense update";
      else if (f.base_version != version_) why = fmt::format("its base is version {}, this receiver holds version {}", f.base_version, version_);
      else if (!same) why = "the layout changed since the published version";
      if (!why.empty())
        return refuse(f, refusal::base_mismatch, errors::sync::base_mismatch,
                      fmt::format("{}: delta version {}: {}; send a dense update", where_, f.version, why));
    }
    transform_plan plan;
    if (same) {
      plan = pub_plan_;
    } else {
      try {
        plan = transform_plan(m, o_.transforms);
      } catch (const error& e) {
        return refuse(f, refusal::bad_manifest, e.id(), fmt::format("{}: version {}: {}", where_, f.version, e.message()));
      }
    }
    inflight c;
    c.active = true;
    c.tag = f.tag;
    c.version = f.version;
    c.base = f.base_version;
    c.delta = delta;
    c.same_layout = same;
    c.t0 = clock::now();
    c.sums.assign(m.size(), 0);
    if (!delta) {
      if (o_.mode == apply_mode::staged) {
        // The area of the last finished update (the mirror before the last commit, or the
        // staging area of a failed one): never the published mirror, which stays readable.
        c.staging = std::move(spare_);
        c.staging.resize(static_cast<std::size_t>(m.packed_bytes()));
      } else {
        if (o_.mirror && (!same || mirror_.size() != m.packed_bytes())) {
          mirror_ = detail::byte_buffer(static_cast<std::size_t>(m.packed_bytes()));
          has_ = false; // the old version's bytes are gone
        }
        c.pieces_left.resize(m.size());
        for (std::size_t i = 0; i < m.size(); ++i) c.pieces_left[i] = m.piece_count(i);
        c.inputs_left.resize(plan.outputs().size());
        for (std::size_t k = 0; k < plan.outputs().size(); ++k) c.inputs_left[k] = plan.outputs()[k].sources.size();
        c.outputs_left.resize(m.size());
        for (std::size_t i = 0; i < m.size(); ++i) c.outputs_left[i] = plan.outputs_of(i).size();
        c.avail.assign(m.size(), {});
      }
    }
    c.m = std::move(m);
    c.plan = std::move(plan);
    cur_ = std::move(c);
    reply(frame_type::ready, f.tag, f.version, has_ ? 1 : 0, has_ ? pub_.layout_hash() : 0, {});
  }

  void on_bucket(const frame& f, std::span<const std::byte> payload) {
    const manifest& m = cur_.m;
    RLPT_CHECK(!cur_.delta, errors::sync::protocol, "{}: BUCKET frame in delta version {}", where_, f.version);
    RLPT_CHECK(f.index == cur_.next && f.index < m.bucket_count(), errors::sync::protocol,
               "{}: got bucket {} of version {}, expected {}", where_, f.index, f.version, expecting());
    const std::uint64_t b = f.index;
    const auto pieces = m.pieces(b);
    RLPT_CHECK(f.count == pieces.size() && f.body.size() == pieces.size() * 8, errors::sync::protocol,
               "{}: bucket {} of version {} lists {} piece checksums, the manifest has {} pieces", where_, b, f.version,
               f.count, pieces.size());
    RLPT_CHECK(payload.size() == m.bucket_size(b), errors::sync::truncated, "{}: bucket {} of version {} has {} bytes, expected {}",
               where_, b, f.version, payload.size(), m.bucket_size(b));
    const bool streaming = o_.mode == apply_mode::streaming;
    std::byte* arena = streaming ? (o_.mirror ? mirror_.data() : nullptr) : cur_.staging.data();
    // Verify (and copy) every piece before anything of this bucket is used.
    for (std::size_t j = 0; j < pieces.size(); ++j) {
      const piece& p = pieces[j];
      const std::byte* src = payload.data() + p.bucket_offset;
      const std::uint64_t got =
          arena ? copy_hash(arena + m.bucket_packed_offset(b) + p.bucket_offset, src, static_cast<std::size_t>(p.nbytes))
                : xxh3(src, static_cast<std::size_t>(p.nbytes));
      const std::uint64_t want = detail::body_u64(f.body, j);
      if (got != want) {
        if (streaming && o_.mirror) torn_ = true;
        RLPT_FAIL(errors::sync::checksum,
                  "{}: bucket {} of version {}: piece {} (tensor \"{}\", bytes [{}, {})) has checksum {}, the sender's is {}",
                  where_, b, f.version, j, m[p.tensor].name, p.tensor_offset, p.tensor_offset + p.nbytes, to_hex(got),
                  to_hex(want));
      }
      if (m.piece_count(p.tensor) == 1) cur_.sums[p.tensor] = got;
      else cur_.parts[p.tensor].push_back(got);
    }
    if (streaming && o_.mirror) torn_ = true; // until the commit succeeds
    cur_.bytes += payload.size();
    ++cur_.next;
    if (streaming) stream_bucket(b, payload);
  }

  // Streaming: runs every output whose sources are now complete.
  void stream_bucket(std::uint64_t b, std::span<const std::byte> payload) {
    const manifest& m = cur_.m;
    std::vector<std::size_t> completed;
    for (const piece& p : m.pieces(b)) {
      const std::size_t t = p.tensor;
      if (o_.mirror) {
        if (--cur_.pieces_left[t] == 0) {
          cur_.avail[t] = {mirror_.data() + m.packed_offset(t), static_cast<std::size_t>(m[t].nbytes)};
          completed.push_back(t);
        }
      } else if (m.piece_count(t) == 1) {
        cur_.pieces_left[t] = 0;
        cur_.avail[t] = payload.subspan(p.bucket_offset, static_cast<std::size_t>(p.nbytes));
        completed.push_back(t);
      } else {
        auto& buf = cur_.held[t];
        if (buf.empty()) buf.resize(static_cast<std::size_t>(m[t].nbytes));
        std::memcpy(buf.data() + p.tensor_offset, payload.data() + p.bucket_offset, static_cast<std::size_t>(p.nbytes));
        if (--cur_.pieces_left[t] == 0) {
          cur_.avail[t] = buf;
          completed.push_back(t);
        }
      }
    }
    for (std::size_t t : completed)
      for (std::size_t k : cur_.plan.outputs_of(t))
        if (--cur_.inputs_left[k] == 0) run_output(k, true);
    // Sources still needed by later outputs must outlive this bucket's slot.
    for (std::size_t t : completed) {
      if (cur_.outputs_left[t] == 0) {
        cur_.held.erase(t);
        cur_.avail[t] = {};
      } else if (!o_.mirror && m.piece_count(t) == 1) {
        auto& buf = cur_.held[t];
        buf.assign(cur_.avail[t].begin(), cur_.avail[t].end());
        cur_.avail[t] = buf;
      }
    }
  }

  void run_output(std::size_t k, bool streaming = false) {
    const auto& out = cur_.plan.outputs()[k];
    cur_.partial = true;
    try {
      cur_.plan.run(k, [&](std::size_t t) { return cur_.avail[t]; }, load_);
    } catch (const error&) {
      throw;
    } catch (const std::exception& e) {
      RLPT_FAIL(errors::sync::load_failed, "{}: the load callback threw for \"{}\" of version {}: {}", where_, out.name,
                cur_.version, e.what());
    }
    ++cur_.loaded;
    if (streaming)
      for (std::size_t t : out.sources) --cur_.outputs_left[t];
  }

  void on_delta(const frame& f, std::span<const std::byte> payload) {
    RLPT_CHECK(cur_.delta, errors::sync::protocol, "{}: DELTA frame in dense version {}", where_, f.version);
    RLPT_CHECK(f.index == cur_.next, errors::sync::protocol, "{}: got delta chunk {} of version {}, expected {}", where_,
               f.index, f.version, cur_.next);
    RLPT_CHECK(f.body.size() == 8 && payload.size() % 8 == 0, errors::sync::protocol,
               "{}: delta chunk {} of version {} is malformed ({} body bytes, {} payload bytes)", where_, f.index,
               f.version, f.body.size(), payload.size());
    // Copy first, then check the copy: the records kept are the bytes verified, whatever the
    // link's slot holds afterwards (a shared-memory slot another process may write into).
    const std::size_t at = cur_.records.size();
    cur_.records.resize(at + payload.size());
    const std::uint64_t got = copy_hash(cur_.records.data() + at, payload.data(), payload.size());
    const std::uint64_t want = detail::body_u64(f.body, 0);
    if (got != want) {
      cur_.records.resize(at);
      RLPT_FAIL(errors::sync::checksum, "{}: delta chunk {} of version {} has checksum {}, the sender's is {}", where_, f.index,
                f.version, to_hex(got), to_hex(want));
    }
    cur_.bytes += payload.size();
    ++cur_.next;
  }

  std::optional<update> on_commit(const frame& f) {
    const manifest& m = cur_.m;
    RLPT_CHECK(f.count == cur_.next, errors::sync::truncated, "{}: COMMIT of version {} counts {} messages, {} arrived", where_,
               f.version, f.count, cur_.next);
    RLPT_CHECK(cur_.delta || cur_.next == m.bucket_count(), errors::sync::truncated,
               "{}: COMMIT of version {} after {} of {} buckets", where_, f.version, cur_.next, m.bucket_count());
    RLPT_CHECK(f.body.size() == m.size() * 8, errors::sync::protocol,
               "{}: COMMIT of version {} carries {} checksum bytes for {} tensors", where_, f.version, f.body.size(), m.size());
    std::vector<std::uint64_t> want(m.size());
    std::memcpy(want.data(), f.body.data(), f.body.size());
    if (cur_.delta) return commit_delta(f, want);
    for (auto& [t, v] : cur_.parts) cur_.sums[t] = combine_piece_checksums(v);
    for (std::size_t i = 0; i < m.size(); ++i)
      RLPT_CHECK(cur_.sums[i] == want[i], errors::sync::checksum,
                 "{}: version {}: tensor \"{}\" arrived with checksum {}, the sender's is {}", where_, f.version, m[i].name,
                 to_hex(cur_.sums[i]), to_hex(want[i]));
    if (o_.mode == apply_mode::staged) {
      const std::byte* arena = cur_.staging.data();
      for (std::size_t k = 0; k < cur_.plan.outputs().size(); ++k) {
        cur_.avail.assign(m.size(), {});
        for (std::size_t t : cur_.plan.outputs()[k].sources)
          cur_.avail[t] = {arena + m.packed_offset(t), static_cast<std::size_t>(m[t].nbytes)};
        run_output(k);
      }
      if (o_.mirror) std::swap(mirror_, cur_.staging); // the old mirror is the next staging area
      spare_ = std::move(cur_.staging);
    }
    return publish(want);
  }

  std::optional<update> commit_delta(const frame& f, const std::vector<std::uint64_t>& want) {
    const manifest& m = cur_.m;
    struct applied {
      delta_record rec;
      std::span<std::byte> range;
    };
    std::vector<applied> recs;
    std::vector<char> touched(m.size(), 0);
    for_each_delta_record(std::span<std::byte>(cur_.records), fmt::format("{} version {}", where_, f.version),
                          [&](delta_record& r) {
                            RLPT_CHECK(r.tensor < m.size(), errors::sync::bad_delta,
                                       "{}: delta record names tensor #{} of {}", where_, r.tensor, m.size());
                            const tensor_entry& t = m[r.tensor];
                            RLPT_CHECK(r.elem_bytes == size_of(t.dtype), errors::sync::bad_delta,
                                       "{}: delta record for \"{}\" has {}-byte elements, {} has {}", where_, t.name,
                                       r.elem_bytes, t.dtype, size_of(t.dtype));
                            RLPT_CHECK(r.elem_begin <= t.numel() && r.elem_count <= t.numel() - r.elem_begin,
                                       errors::sync::bad_delta, "{}: delta record for \"{}\" covers elements [{}, {}) of {}",
                                       where_, t.name, r.elem_begin, r.elem_begin + r.elem_count, t.numel());
                            RLPT_CHECK(r.base_checksum == pub_[r.tensor].checksum, errors::sync::base_mismatch,
                                       "{}: delta for \"{}\" was encoded against checksum {}, the published version {} "
                                       "has {}", where_, t.name, to_hex(r.base_checksum), version_,
                                       to_hex(pub_[r.tensor].checksum));
                            const std::size_t eb = size_of(t.dtype);
                            recs.push_back({r, mirror_.span().subspan(static_cast<std::size_t>(m.packed_offset(r.tensor) +
                                                                                               r.elem_begin * eb),
                                                                      static_cast<std::size_t>(r.elem_count * eb))});
                            touched[r.tensor] = 1;
                          });
    for (const auto& a : recs) swap_apply(a.rec, a.range);
    auto undo = [&] {
      for (auto it = recs.rbegin(); it != recs.rend(); ++it) swap_apply(it->rec, it->range);
    };
    // Every tensor's bytes are checked, touched or not: a mirror damaged behind the receiver's
    // back (a stray write, a bad DIMM) is never carried into a new version on the strength of
    // a checksum stored when it was published.
    for (std::size_t i = 0; i < m.size(); ++i) {
      const std::byte* bytes = mirror_.data() + m.packed_offset(i);
      const std::uint64_t got = tensor_checksum(bytes, m[i].nbytes, m.bucket_bytes());
      if (got != want[i]) {
        undo();
        dense_next_ = true; // until a dense update replaces every byte
        const std::uint64_t base = tensor_checksum(bytes, m[i].nbytes, m.bucket_bytes());
        if (base != pub_[i].checksum)
          RLPT_FAIL(errors::sync::base_mismatch,
                    "{}: after applying delta version {}, tensor \"{}\" has checksum {}, the sender's is {}; rolled back to "
                    "version {}, whose copy here is damaged (tensor \"{}\" has checksum {}, published as {}): send a dense "
                    "update", where_, f.version, m[i].name, to_hex(got), to_hex(want[i]), version_, m[i].name, to_hex(base),
                    to_hex(pub_[i].checksum));
        RLPT_FAIL(errors::sync::checksum,
                  "{}: after applying delta version {}, tensor \"{}\" has checksum {}, the sender's is {}; rolled back to "
                  "version {}", where_, f.version, m[i].name, to_hex(got), to_hex(want[i]), version_);
      }
      cur_.sums[i] = got;
    }
    std::vector<char> out_needed(cur_.plan.outputs().size(), 0);
    for (std::size_t i = 0; i < m.size(); ++i)
      if (touched[i])
        for (std::size_t k : cur_.plan.outputs_of(i)) out_needed[k] = 1;
    cur_.avail.resize(m.size());
    for (std::size_t i = 0; i < m.size(); ++i)
      cur_.avail[i] = {mirror_.data() + m.packed_offset(i), static_cast<std::size_t>(m[i].nbytes)};
    try {
      for (std::size_t k = 0; k < out_needed.size(); ++k)
        if (out_needed[k]) run_output(k);
    } catch (...) {
      undo(); // the mirror stays at the published version; the engine may hold a mix (partial)
      throw;
    }
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
    pub_ = std::move(cur_.m);
    for (std::size_t i = 0; i < sums.size(); ++i) pub_.set_checksum(i, sums[i]);
    pub_.set_versions(cur_.version, cur_.base);
    u.digest = model_digest(pub_);
    pub_plan_ = std::move(cur_.plan);
    version_ = cur_.version;
    has_ = true;
    torn_ = false;
    if (!cur_.delta) dense_next_ = false;
    if (!o_.mirror) mirror_ = {};
    const std::uint64_t v = cur_.version, tag = cur_.tag;
    cur_ = inflight{};
    reply(frame_type::ack, tag, v, 0, 0, {});
    return u;
  }

  link& link_;
  load_fn load_;
  receiver_options o_;
  std::string where_;
  bool duplex_ = true;
  bool has_ = false;
  bool torn_ = false;
  bool dense_next_ = false; // a delta failed verification: accept only a dense update next
  std::uint64_t version_ = 0;
  manifest pub_;
  transform_plan pub_plan_;
  detail::byte_buffer mirror_;
  detail::byte_buffer spare_; // staged dense: the next update's staging area (see on_begin)
  inflight cur_;
  std::deque<update> events_;
  std::string last_link_error_;
};

} // namespace sync
RLPT_NAMESPACE_END
