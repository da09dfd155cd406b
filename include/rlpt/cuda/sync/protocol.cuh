// SPDX-License-Identifier: Apache-2.0
//! @file
//! The versioned update protocol over device links: `device_sender` packs parameters that
//! live on the GPU into device buckets (or encodes a delta on the GPU), `device_receiver`
//! verifies and applies them into its own GPU parameters, in place.
//!
//! Same frames, manifest, planner and delta records as the host protocol (protocol.hpp):
//!
//!     BEGIN(version, base, kind, manifest) -> READY from every peer | REFUSE
//!     BUCKET b: body = raw wsum64 of each piece, payload = the device bucket
//!     DELTA k:  body = raw wsum64 of the payload + the 64-byte header of each record in it
//!     COMMIT:   body = wsum64 of every tensor     -> ACK | NACK from every peer
//!
//! Checksums are wsum64 (wsum.hpp), computed by the copy kernels as they move the bytes: XXH3
//! cannot run at GPU memory speed. A receiver publishes a version only after all of it arrived
//! and verified; in the default staged mode nothing touches its parameters before that, so a
//! failed, aborted or timed-out update (a killed sender) leaves the previous version in place.
//! Applying writes into the bound tensors in place (dtype cast where a target differs from
//! the wire), so CUDA graphs that captured them stay valid. Deltas are swapped in place and
//! undone if the result's checksum disagrees.
//!
//! With several receivers (an NCCL group) each one publishes independently: a NACK fails the
//! sender's publish() naming that peer while the others keep the new version; their base
//! versions then differ, so the next delta is refused by the lagging one and sent dense.
#pragma once

#include <rlpt/config.hpp>
#include <rlpt/core/error.hpp>
#include <rlpt/cuda/error.cuh>
#include <rlpt/cuda/sync/copy.cuh>
#include <rlpt/cuda/sync/copy_plan.hpp>
#include <rlpt/cuda/sync/delta.cuh>
#include <rlpt/cuda/sync/delta_plan.hpp>
#include <rlpt/cuda/sync/detail/resources.cuh>
#include <rlpt/cuda/sync/device_link.cuh>
#include <rlpt/cuda/sync/wsum.hpp>
#include <rlpt/sync/delta.hpp>
#include <rlpt/sync/frame.hpp>
#include <rlpt/sync/manifest.hpp>
#include <rlpt/sync/protocol.hpp>

#include <cuda_runtime_api.h>

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <memory>
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

struct device_sender_options {
  //! Send changed elements only, encoded on the GPU against a device snapshot of the last
  //! published version (one extra copy of the model's bytes in device memory). Off by
  //! default, like every framework.
  bool delta = false;
  //! With deltas, make every n-th update dense (TRL's periodic anchors); 0: only when needed.
  std::uint32_t anchor_every = 0;
  //! Limit for each blocking step (a free slot, a packed bucket, READY). NeMo-RL's timeout.
  std::chrono::milliseconds timeout{30'000};
  //! Limit for the receivers' answer to COMMIT, which includes applying. TRL's request timeout.
  std::chrono::milliseconds commit_timeout{300'000};
};

namespace detail {

//! A copy plan uploaded to the device.
struct device_copy_plan {
  copy_plan host;
  device_bytes tasks;

  device_copy_plan() = default;
  explicit device_copy_plan(copy_plan p) : host(std::move(p)), tasks(std::max<std::size_t>(1, host.tasks.size()) * sizeof(copy_task)) {
    if (!host.tasks.empty())
      RLPT_CUDA_CHECK(cudaMemcpy(tasks.get(), host.tasks.data(), host.tasks.size() * sizeof(copy_task), cudaMemcpyHostToDevice));
  }
  void run(std::size_t launch, std::uint64_t src_base, std::uint64_t dst_base, std::uint64_t* sums, cudaStream_t s) const {
    run_copy(tasks.get<copy_task>(), host.launches[launch], src_base, dst_base, sums, s);
  }
};

inline std::uint64_t frame_u64(std::span<const std::byte> body, std::size_t i) noexcept {
  std::uint64_t v;
  std::memcpy(&v, body.data() + i * 8, 8);
  return v;
}

} // namespace detail

//! Trainer side over a device link: publishes versions of GPU-resident parameters.
class device_sender {
public:
  //! `params` are matched to the manifest by name (shape must agree; a dtype other than the
  //! wire dtype is cast while packing: fp32 master weights sent as bf16). Their memory must
  //! stay valid, and unchanged during publish(). Deltas need params stored in the wire dtype.
  device_sender(device_link& l, manifest m, std::span<const device_tensor> params, device_sender_options o = {})
      : link_(l), m_(std::move(m)), o_(o) {
    const link_info li = link_.info();
    where_ = li.name;
    RLPT_CHECK(li.payload_space == memory_space::device, errors::sync::bad_link,
               "{} moves host payloads; use rlpt::sync::sender with it", where_);
    detail::check_device_manifest(m_, where_);
    for (std::uint64_t b = 0; b < m_.bucket_count(); ++b)
      RLPT_CHECK(m_.bucket_size(b) <= li.max_payload, errors::sync::bad_link,
                 "bucket {} holds {} bytes but {} carries at most {} per message: plan with a smaller bucket_bytes", b,
                 m_.bucket_size(b), where_, li.max_payload);
    const auto src = detail::bind(m_, params, where_, "source", true);
    pack_ = detail::device_copy_plan(detail::plan_pack(m_, src));
    piece_at_ = detail::piece_offsets(m_);
    const std::uint64_t pieces = piece_at_.back();
    d_sums_ = detail::device_bytes(std::max<std::uint64_t>(1, pieces) * 8);
    h_sums_.reserve(std::max<std::uint64_t>(1, pieces) * 8);
    d_msg_sum_ = detail::device_bytes(8);
    h_msg_sum_.reserve(8);
    if (o_.delta) {
      for (std::size_t i = 0; i < m_.size(); ++i)
        RLPT_CHECK(src[i] == nullptr || src[i]->dtype == m_[i].dtype, errors::sync::bad_source,
                   "{}: deltas compare wire bytes, but parameter \"{}\" is stored as {} and travels as {}", where_, m_[i].name,
                   src[i]->dtype, m_[i].dtype);
      snapshot_ = detail::device_bytes(std::max<std::uint64_t>(1, m_.packed_bytes()));
      std::vector<const void*> now(m_.size()), base(m_.size());
      for (std::size_t i = 0; i < m_.size(); ++i) {
        now[i] = src[i] != nullptr ? src[i]->data : nullptr;
        base[i] = snapshot_.get() + m_.packed_offset(i);
        if (m_[i].nbytes != 0) snap_copies_.push_back({snapshot_.get() + m_.packed_offset(i), now[i], m_[i].nbytes});
      }
      max_msg_ = std::min<std::uint64_t>(m_.bucket_bytes(), li.max_payload);
      encoder_ = std::make_unique<device_delta_encoder>(m_, now, base, std::max<std::uint64_t>(max_msg_, delta_header_bytes + 64));
    }
  }

  device_sender(const device_sender&) = delete;
  device_sender& operator=(const device_sender&) = delete;

  [[nodiscard]] bool has_published() const noexcept { return published_; }
  [[nodiscard]] std::uint64_t published_version() const noexcept { return last_; }
  //! The manifest with the (wsum64) checksums of the last successful publish.
  [[nodiscard]] const manifest& current_manifest() const noexcept { return m_; }

  //! Makes an in-flight publish() (on another thread) stop at its next step and throw
  //! rlpt.sync.aborted; the receivers are told why and keep their versions.
  void abort(std::string reason) {
    std::lock_guard lock(abort_mu_);
    abort_reason_ = std::move(reason);
    abort_.store(true, std::memory_order_release);
  }

  //! Sends version `version` (greater than the last published) and waits until every
  //! receiver published it. Throws on refusal, NACK (naming the peer), timeout, lost peer or
  //! abort; the sender then stays at its previous version and the next publish starts clean.
  //!
  //! The parameters are read on the link's own (non-blocking) stream, ordered after the work
  //! that wrote them: `producer` is the stream the trainer wrote them on (the optimizer step),
  //! or `ready` an event recorded after that work. publish(version) waits for the legacy
  //! default stream, which covers work on it and on every blocking stream (PyTorch's default
  //! stream); parameters written on a non-blocking stream must be named here. The parameters
  //! must not change until publish() returns.
  publish_result publish(std::uint64_t version) { return publish(version, cudaStreamLegacy); }
  publish_result publish(std::uint64_t version, cudaStream_t producer) {
    RLPT_CUDA_CHECK(cudaEventRecord(ready_.get(), producer));
    return publish(version, ready_.get());
  }
  publish_result publish(std::uint64_t version, cudaEvent_t ready) {
    RLPT_CHECK(ready != nullptr, errors::sync::bad_source, "{}: publish({}) needs an event recorded after the parameters were written",
               where_, version);
    RLPT_CUDA_CHECK(cudaStreamWaitEvent(link_.stream(), ready, 0));
    const auto t0 = clock::now();
    RLPT_CHECK(!published_ || version > last_, errors::sync::bad_version, "publish({}) after version {}: versions must increase",
               version, last_);
    abort_.store(false, std::memory_order_release);
    tag_ = next_tag();
    publish_result r;
    r.version = version;
    r.dense_bytes = m_.payload_bytes();
    bool delta = o_.delta && published_ && !(o_.anchor_every != 0 && since_anchor_ + 1 >= o_.anchor_every);
    std::vector<std::uint64_t> sums(m_.size(), 0);
    try {
      link_.prepare(after(o_.timeout));
      for (int attempt = 0;; ++attempt) {
        const reply rep = begin(version, delta);
        if (rep.type == frame_type::ready) break;
        if (rep.code == static_cast<std::uint64_t>(refusal::base_mismatch) && delta && attempt == 0) {
          delta = false;
          r.fell_back = true;
          tag_ = next_tag();
          continue;
        }
        ::rlpt::detail::raise(rep.id, fmt::format("{}: {} refused version {}: {}", where_, link_.peer_name(rep.peer), version,
                                                  rep.message));
      }
      r.delta = delta;
      if (delta) send_delta(version, sums, r);
      else send_dense(version, sums, r);
      check_abort(version);
      link_.drain(after(o_.timeout));
      encode_frame(meta_, frame_type::commit, tag_, version, delta ? last_ : 0, 0, r.messages, 0,
                   std::span<const std::byte>(reinterpret_cast<const std::byte*>(sums.data()), sums.size() * 8));
      link_.send(meta_, 0, after(o_.timeout));
      wait_all(version, after(o_.commit_timeout), "waiting for the receivers to commit", frame_type::ack);
    } catch (...) {
      std::string why;
      {
        std::lock_guard lock(abort_mu_);
        why = abort_reason_.empty() ? "the sender failed" : abort_reason_;
      }
      link_.fail(why);
      try { // best effort: tell the receivers, so they stop waiting
        encode_frame(meta_, frame_type::abort, tag_, version, 0, 0, 0, 0, as_bytes(why));
        link_.send(meta_, 0, after(std::chrono::milliseconds(100)));
      } catch (...) {
      }
      throw;
    }
    if (o_.delta) { // what the receivers now hold becomes the base of the next delta
      const cudaStream_t s = link_.stream();
      for (const auto& c : snap_copies_) RLPT_CUDA_CHECK(cudaMemcpyAsync(c.dst, c.src, c.bytes, cudaMemcpyDeviceToDevice, s));
      detail::wait_stream(done_, s, after(o_.timeout), where_, "updating the delta snapshot");
    }
    for (std::size_t i = 0; i < m_.size(); ++i) m_.set_checksum(i, sums[i]);
    m_.set_versions(version, delta ? last_ : 0);
    since_anchor_ = delta ? since_anchor_ + 1 : 0;
    published_ = true;
    last_ = version;
    r.seconds = detail::seconds_since(t0);
    return r;
  }

private:
  struct reply {
    frame_type type = frame_type::ack;
    std::uint64_t code = 0;
    std::size_t peer = 0;
    std::string id, message;
  };
  struct snap_copy {
    void* dst;
    const void* src;
    std::uint64_t bytes;
  };

  void check_abort(std::uint64_t version) {
    if (!abort_.load(std::memory_order_acquire)) return;
    std::lock_guard lock(abort_mu_);
    RLPT_FAIL(errors::sync::aborted, "{}: publish of version {} aborted: {}", where_, version, abort_reason_);
  }

  reply begin(std::uint64_t version, bool delta) {
    manifest announced = m_;
    announced.set_versions(version, delta ? last_ : 0);
    announced.clear_checksums();
    const std::string body = announced.to_json();
    encode_frame(meta_, frame_type::begin, tag_, version, delta ? last_ : 0,
                 static_cast<std::uint64_t>(delta ? update_kind::delta : update_kind::dense), m_.layout_hash(), 0, as_bytes(body));
    link_.send(meta_, 0, after(o_.timeout));
    return wait_all(version, after(o_.timeout), "waiting for READY", frame_type::ready);
  }

  // Waits until every peer answered `want` for this attempt; returns early with the first
  // REFUSE or NACK.
  reply wait_all(std::uint64_t version, deadline until, std::string_view what, frame_type want) {
    std::vector<char> got(link_.peers(), 0);
    std::size_t left = got.size();
    reply ok{want, 0, 0, {}, {}};
    while (left > 0) {
      check_abort(version);
      const auto step = std::min(until, clock::now() + std::chrono::milliseconds(50)); // wake up for abort()
      auto msg = link_.receive(step);
      if (!msg) {
        if (clock::now() >= until) {
          std::string missing;
          for (std::size_t p = 0; p < got.size(); ++p)
            if (!got[p]) missing += fmt::format("{}{}", missing.empty() ? "" : ", ", link_.peer_name(p));
          RLPT_FAIL(errors::sync::timeout, "{}: timed out {} for version {} (no answer from {})", where_, what, version, missing);
        }
        continue;
      }
      std::optional<reply> r;
      try {
        const frame f = decode_frame(msg->meta, where_);
        if (f.version == version && f.tag == tag_) r = to_reply(f, link_.last_peer());
      } catch (...) {
        link_.release();
        throw;
      }
      link_.release();
      if (!r) continue;
      if (r->type == frame_type::refuse || r->type == frame_type::nack) {
        if (want == frame_type::ack)
          ::rlpt::detail::raise(r->id, fmt::format("{}: {} rejected version {}: {}", where_, link_.peer_name(r->peer), version,
                                                   r->message));
        return *r;
      }
      if (r->type == want && r->peer < got.size() && !got[r->peer]) {
        got[r->peer] = 1;
        --left;
      }
    }
    return ok;
  }

  static std::optional<reply> to_reply(const frame& f, std::size_t peer) {
    switch (f.type) {
    case frame_type::ready:
    case frame_type::ack: return reply{f.type, 0, peer, {}, {}};
    case frame_type::refuse:
    case frame_type::nack: {
      auto [id, msg] = detail::split_error_body(f.body);
      return reply{f.type, f.index, peer, std::move(id), std::move(msg)};
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
          r = to_reply(f, link_.last_peer());
      } catch (...) {
        link_.release();
        throw;
      }
      link_.release();
      if (r)
        ::rlpt::detail::raise(r->id, fmt::format("{}: {} failed version {}: {}", where_, link_.peer_name(r->peer), version,
                                                 r->message));
    }
  }

  void send_dense(std::uint64_t version, std::vector<std::uint64_t>& sums, publish_result& r) {
    const cudaStream_t s = link_.stream();
    const auto* host = h_sums_.get<std::uint64_t>();
    std::vector<std::uint64_t> raw(m_.size(), 0);
    for (std::uint64_t b = 0; b < m_.bucket_count(); ++b) {
      check_abort(version);
      const std::uint64_t size = m_.bucket_size(b);
      const std::span<std::byte> buf = link_.payload_buffer(size, after(o_.timeout));
      const std::uint64_t p0 = piece_at_[b], np = piece_at_[b + 1] - p0;
      RLPT_CUDA_CHECK(cudaMemsetAsync(d_sums_.get<std::uint64_t>() + p0, 0, np * 8, s));
      pack_.run(b, 0, reinterpret_cast<std::uintptr_t>(buf.data()), d_sums_.get<std::uint64_t>(), s);
      RLPT_CUDA_CHECK(cudaMemcpyAsync(h_sums_.get<std::uint64_t>() + p0, d_sums_.get<std::uint64_t>() + p0, np * 8,
                                      cudaMemcpyDeviceToHost, s));
      // The pack of this bucket overlaps the previous bucket's transfer; its sums go in the frame.
      detail::wait_stream(packed_, s, after(o_.timeout), where_, fmt::format("packing bucket {} of version {}", b, version));
      const auto pieces = m_.pieces(b);
      for (std::size_t j = 0; j < pieces.size(); ++j) raw[pieces[j].tensor] += host[p0 + j];
      encode_frame(meta_, frame_type::bucket, tag_, version, 0, b, np, size,
                   std::span<const std::byte>(reinterpret_cast<const std::byte*>(host + p0), np * 8));
      link_.send(meta_, size, after(o_.timeout));
      ++r.messages;
      r.wire_bytes += size;
      poll_nack(version);
    }
    for (std::size_t i = 0; i < m_.size(); ++i) sums[i] = wsum_finish(raw[i], m_[i].nbytes);
  }

  void send_delta(std::uint64_t version, std::vector<std::uint64_t>& sums, publish_result& r) {
    const cudaStream_t s = link_.stream();
    std::vector<std::uint64_t> base(m_.size());
    for (std::size_t i = 0; i < m_.size(); ++i) base[i] = m_[i].checksum;
    const detail::delta_plan& p = encoder_->plan(base, max_msg_, s, after(o_.timeout), where_);
    r.stats = p.stats;
    const auto raw = encoder_->tensor_raw_sums();
    for (std::size_t i = 0; i < m_.size(); ++i) sums[i] = wsum_finish(raw[i], m_[i].nbytes);
    std::vector<std::byte> body;
    for (std::size_t k = 0; k < p.messages.size(); ++k) {
      check_abort(version);
      const auto& msg = p.messages[k];
      const std::span<std::byte> buf = link_.payload_buffer(msg.bytes, after(o_.timeout));
      encoder_->write(k, buf.data(), s);
      RLPT_CUDA_CHECK(cudaMemsetAsync(d_msg_sum_.get(), 0, 8, s));
      run_checksum(buf.data(), msg.bytes, d_msg_sum_.get<std::uint64_t>(), s);
      RLPT_CUDA_CHECK(cudaMemcpyAsync(h_msg_sum_.get(), d_msg_sum_.get(), 8, cudaMemcpyDeviceToHost, s));
      detail::wait_stream(packed_, s, after(o_.timeout), where_, fmt::format("encoding delta chunk {} of version {}", k, version));
      const std::size_t nrec = msg.record_end - msg.record_begin;
      body.resize(8 + 64 * nrec);
      std::memcpy(body.data(), h_msg_sum_.get(), 8);
      for (std::size_t j = 0; j < nrec; ++j) std::memcpy(body.data() + 8 + 64 * j, p.records[msg.record_begin + j].header.data(), 64);
      encode_frame(meta_, frame_type::delta, tag_, version, last_, k, nrec, msg.bytes, body);
      link_.send(meta_, msg.bytes, after(o_.timeout));
      ++r.messages;
      r.wire_bytes += msg.bytes;
      poll_nack(version);
    }
  }

  std::uint64_t next_tag() noexcept {
    tag_seed_ += 0x9e3779b97f4a7c15ull;
    return wsum_mix(tag_seed_);
  }

  device_link& link_;
  manifest m_;
  device_sender_options o_;
  std::string where_;
  detail::device_copy_plan pack_;
  std::vector<std::uint64_t> piece_at_;
  detail::device_bytes d_sums_, d_msg_sum_, snapshot_;
  detail::pinned_bytes h_sums_, h_msg_sum_;
  detail::event packed_, done_, ready_;
  std::vector<snap_copy> snap_copies_;
  std::uint64_t max_msg_ = 0;
  std::unique_ptr<device_delta_encoder> encoder_;
  std::uint64_t tag_ = 0;
  std::uint64_t tag_seed_ = static_cast<std::uint64_t>(clock::now().time_since_epoch().count()) ^
                            reinterpret_cast<std::uintptr_t>(this);
  std::vector<std::byte> meta_;
  bool published_ = false;
  std::uint64_t last_ = 0;
  std::uint64_t since_anchor_ = 0;
  std::atomic<bool> abort_{false};
  std::mutex abort_mu_;
  std::string abort_reason_;
};

struct device_receiver_options {
  //! Limit for each blocking step of an update in progress (the next message, a device wait).
  std::chrono::milliseconds timeout{30'000};
  //! staged (default): buckets are verified into a device arena the size of the model and
  //! applied only after COMMIT verified everything, so any failure leaves the parameters at
  //! the previous version. streaming: each bucket is scattered into the parameters as it
  //! arrives (no arena); a failure part-way leaves them torn (update::partial) and only a
  //! dense update is accepted next.
  apply_mode mode = apply_mode::staged;
  //! Refuse any manifest whose layout hash differs.
  std::optional<std::uint64_t> expect_layout_hash{};
  //! Refuse updates whose packed size exceeds this (bounds the arena a manifest can ask for).
  std::uint64_t max_update_bytes = std::uint64_t{1} << 40;
  //! Manifest tensors without a target are skipped instead of refusing the update.
  bool skip_unbound = false;
};

//! Engine side over a device link: verifies updates and writes them into GPU parameters.
class device_receiver {
public:
  //! `targets`: the engine's parameters, by manifest name (shape must match; a dtype other
  //! than the wire dtype is cast while applying). Fused parameters (qkv, gate_up) are bound
  //! as several targets pointing into one buffer at the right offsets.
  device_receiver(device_link& l, std::vector<device_tensor> targets, device_receiver_options o = {})
      : link_(l), targets_(std::move(targets)), o_(std::move(o)) {
    const link_info li = link_.info();
    where_ = li.name;
    duplex_ = li.duplex;
    RLPT_CHECK(li.payload_space == memory_space::device, errors::sync::bad_link,
               "{} moves host payloads; use rlpt::sync::receiver with it", where_);
    d_msg_sums_ = detail::device_bytes(8 * 64);
    h_msg_sums_.reserve(8 * 64);
  }

  device_receiver(const device_receiver&) = delete;
  device_receiver& operator=(const device_receiver&) = delete;

  [[nodiscard]] bool has_version() const noexcept { return has_; }
  [[nodiscard]] std::uint64_t version() const noexcept { return version_; }
  //! True after a failed streaming update wrote into the parameters: only dense updates are accepted.
  [[nodiscard]] bool torn() const noexcept { return torn_; }
  [[nodiscard]] const manifest& published_manifest() const {
    RLPT_CHECK(has_, errors::sync::no_version, "{}: no version has been published yet", where_);
    return pub_;
  }

  //! Processes messages until an update is published or fails, or until `wait` passes with no
  //! update in progress. An update in progress is always driven to its end (each step bounded
  //! by device_receiver_options::timeout). A published update has been applied on the device
  //! when poll() returns it.
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
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
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
        continue;
      } catch (const std::exception& e) {
        release();
        if (cur_.active) return fail(errors::sync::receive_failed, fmt::format("{}: {}", where_, e.what()));
        continue;
      }
      release();
      if (done) return *done;
      if (!events_.empty()) return pop_event();
      if (!cur_.active && clock::now() >= idle_until) return {};
    }
  }

  [[nodiscard]] const std::string& last_link_error() const noexcept { return last_link_error_; }

private:
  struct staged_record {
    device_delta_record rec;
    std::uint64_t tensor_first = 0, tensor_end = 0; // element range in the tensor
  };
  struct inflight {
    bool active = false;
    std::uint64_t tag = 0, version = 0, base = 0;
    bool delta = false;
    manifest m;
    std::uint64_t next = 0, bytes = 0;
    bool partial = false;
    clock::time_point t0{};
    std::vector<std::uint64_t> want_pieces;   // dense: per piece, from BUCKET bodies
    std::vector<std::uint64_t> want_msgs;     // delta: per message, from DELTA bodies
    std::vector<staged_record> records;       // delta
    std::uint64_t arena_used = 0;             // delta
  };

  update pop_event() {
    update u = std::move(events_.front());
    events_.pop_front();
    return u;
  }

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
      link_.send(meta, 0, after(type == frame_type::nack ? std::min<std::chrono::nanoseconds>(o_.timeout, std::chrono::milliseconds(100))
                                                         : std::chrono::nanoseconds(o_.timeout)));
    } catch (const error& e) {
      last_link_error_ = e.message();
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
    u.partial = cur_.partial;
    u.error_id = std::string(id);
    u.reason = std::move(msg);
    u.seconds = cur_.active ? detail::seconds_since(cur_.t0) : 0.0;
    if (cur_.partial) torn_ = true; // the parameters were being written when it failed
    link_.fail(u.reason);
    if (cur_.active) reply(frame_type::nack, cur_.tag, cur_.version, 0, 0, detail::error_body(u.error_id, u.reason));
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
              detail::error_body(errors::sync::no_update, fmt::format("{}: COMMIT of version {} without a BEGIN (the receiver "
                                                                    "restarted or already failed this update)", where_, f.version)));
        return std::nullopt;
      }
      return on_commit(f);
    case frame_type::abort:
      if (!current(f)) return std::nullopt;
      return fail(errors::sync::aborted, fmt::format("{}: the sender aborted version {}: {}", where_, f.version, as_chars(f.body)));
    default: RLPT_FAIL(errors::sync::protocol, "{}: unexpected {} frame on the receiving side", where_, name(f.type));
    }
  }

  void on_begin(const frame& f) {
    if (cur_.active) {
      // A BEGIN that replaces an attempt which received nothing yet is the sender's retry
      // (a delta refused elsewhere in the group, now sent dense): not a failure.
      if (cur_.next == 0) cur_ = inflight{};
      else events_.push_back(fail(errors::sync::superseded, fmt::format("{}: version {} was superseded by a BEGIN of version {}",
                                                                     where_, cur_.version, f.version)));
    }
    const bool delta = f.index == static_cast<std::uint64_t>(update_kind::delta);
    RLPT_CHECK(f.index <= 1, errors::sync::protocol, "{}: BEGIN of version {} has unknown kind {}", where_, f.version, f.index);
    manifest m;
    std::vector<const device_tensor*> bound;
    try {
      m = manifest::from_json(as_chars(f.body));
      detail::check_device_manifest(m, where_);
      bound = bind_targets(m);
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
                    fmt::format("{}: version {} packs {} bytes, more than device_receiver_options::max_update_bytes = {}",
                                where_, f.version, m.packed_bytes(), o_.max_update_bytes));
    const bool same = has_ && pub_.layout_hash() == m.layout_hash() && pub_.same_layout(m);
    if (delta) {
      std::string why;
      if (!has_) why = "this receiver has no published version yet";
      else if (torn_) why = "the parameters were torn by a failed streaming update";
      else if (dense_next_) why = "a delta failed its checksum since the last dense update";
      else if (f.base_version != version_)
        why = fmt::format("its base is version {}, this receiver holds version {}", f.base_version, version_);
      else if (!same) why = "the layout changed since the published version";
      else
        for (std::size_t i = 0; i < m.size() && why.empty(); ++i)
          if (bound[i] != nullptr && bound[i]->dtype != m[i].dtype)
            why = fmt::format("target \"{}\" is stored as {} but travels as {}: deltas need equal dtypes", m[i].name,
                              bound[i]->dtype, m[i].dtype);
      if (!why.empty())
        return refuse(f, refusal::base_mismatch, errors::sync::base_mismatch,
                      fmt::format("{}: delta version {}: {}; send a dense update", where_, f.version, why));
    }
    try {
      if (!plans_ready_ || plans_hash_ != m.layout_hash() || plans_layout_ != m.layout_json()) build_plans(m, bound);
      if (!delta && o_.mode == apply_mode::staged) arena_.reserve(std::max<std::uint64_t>(1, m.packed_bytes()));
      RLPT_CUDA_CHECK(cudaMemsetAsync(d_sums_.get(), 0, d_sums_.size(), link_.stream()));
    } catch (const error& e) {
      return refuse(f, refusal::too_large, e.id(), fmt::format("{}: version {}: {}", where_, f.version, e.message()));
    }
    inflight c;
    c.active = true;
    c.tag = f.tag;
    c.version = f.version;
    c.base = f.base_version;
    c.delta = delta;
    c.t0 = clock::now();
    c.want_pieces.assign(piece_at_.empty() ? 0 : piece_at_.back(), 0);
    c.m = std::move(m);
    cur_ = std::move(c);
    reply(frame_type::ready, f.tag, f.version, has_ ? 1 : 0, has_ ? pub_.layout_hash() : 0, {});
  }

  std::vector<const device_tensor*> bind_targets(const manifest& m) {
    auto bound = detail::bind(m, targets_, where_, "target", false);
    if (!o_.skip_unbound)
      for (std::size_t i = 0; i < m.size(); ++i)
        RLPT_CHECK(bound[i] != nullptr || m[i].nbytes == 0, errors::sync::unknown_tensor,
                   "{}: manifest tensor \"{}\" has no target (bind it, or set skip_unbound)", where_, m[i].name);
    return bound;
  }

  void build_plans(const manifest& m, const std::vector<const device_tensor*>& bound) {
    plans_ready_ = false;
    bound_ = bound;
    piece_at_ = detail::piece_offsets(m);
    stage_ = detail::device_copy_plan(detail::plan_stage(m));
    unpack_ = detail::device_copy_plan(detail::plan_unpack(m, bound));
    apply_ = detail::device_copy_plan(detail::plan_apply_staged(m, bound));
    check_ = detail::device_copy_plan(detail::plan_checksum(m, bound));
    const std::uint64_t n = std::max<std::uint64_t>({std::uint64_t{1}, piece_at_.back(), m.size()});
    d_sums_ = detail::device_bytes(n * 8);
    h_sums_.reserve(n * 8);
    plans_hash_ = m.layout_hash();
    plans_layout_ = m.layout_json();
    plans_ready_ = true;
  }

  void on_bucket(const frame& f, std::span<const std::byte> payload) {
    const manifest& m = cur_.m;
    RLPT_CHECK(!cur_.delta, errors::sync::protocol, "{}: BUCKET frame in delta version {}", where_, f.version);
    RLPT_CHECK(f.index == cur_.next && f.index < m.bucket_count(), errors::sync::protocol, "{}: got bucket {} of version {}, expected {}",
               where_, f.index, f.version, expecting());
    const std::uint64_t b = f.index;
    const std::uint64_t p0 = piece_at_[b], np = piece_at_[b + 1] - p0;
    RLPT_CHECK(f.count == np && f.body.size() == np * 8, errors::sync::protocol,
               "{}: bucket {} of version {} lists {} piece checksums, the manifest has {} pieces", where_, b, f.version, f.count, np);
    RLPT_CHECK(payload.size() == m.bucket_size(b), errors::sync::truncated, "{}: bucket {} of version {} has {} bytes, expected {}",
               where_, b, f.version, payload.size(), m.bucket_size(b));
    for (std::uint64_t j = 0; j < np; ++j) cur_.want_pieces[p0 + j] = detail::frame_u64(f.body, j);
    const auto src = reinterpret_cast<std::uintptr_t>(payload.data());
    if (o_.mode == apply_mode::staged) {
      stage_.run(b, src, reinterpret_cast<std::uintptr_t>(arena_.get()), d_sums_.get<std::uint64_t>(), link_.stream());
    } else {
      torn_ = true; // until the commit succeeds
      cur_.partial = true;
      unpack_.run(b, src, 0, d_sums_.get<std::uint64_t>(), link_.stream());
    }
    cur_.bytes += payload.size();
    ++cur_.next;
  }

  void on_delta(const frame& f, std::span<const std::byte> payload) {
    const manifest& m = cur_.m;
    RLPT_CHECK(cur_.delta, errors::sync::protocol, "{}: DELTA frame in dense version {}", where_, f.version);
    RLPT_CHECK(f.index == cur_.next, errors::sync::protocol, "{}: got delta chunk {} of version {}, expected {}", where_, f.index,
               f.version, cur_.next);
    RLPT_CHECK(f.count >= 1 && f.count <= (f.body.size() / 64) && f.body.size() == 8 + 64 * f.count, errors::sync::protocol,
               "{}: delta chunk {} of version {} announces {} records in a {}-byte body", where_, f.index, f.version, f.count,
               f.body.size());
    const std::string ctx = fmt::format("{} version {} delta chunk {}", where_, f.version, f.index);
    std::uint64_t at = 0;
    const std::uint64_t arena_at = cur_.arena_used;
    std::vector<staged_record> recs;
    for (std::uint64_t j = 0; j < f.count; ++j) {
      staged_record s;
      const auto h = f.body.subspan(8 + 64 * j, 64);
      s.rec.head = detail::parse_delta_head(h, ctx, at);
      std::memcpy(s.rec.header.data(), h.data(), 64);
      const detail::delta_head& d = s.rec.head;
      RLPT_CHECK(d.tensor < m.size(), errors::sync::bad_delta, "{}: delta record names tensor #{} of {}", ctx, d.tensor, m.size());
      const tensor_entry& t = m[d.tensor];
      RLPT_CHECK(d.elem_bytes == size_of(t.dtype), errors::sync::bad_delta, "{}: delta record for \"{}\" has {}-byte elements, {} has {}",
                 ctx, t.name, d.elem_bytes, t.dtype, size_of(t.dtype));
      RLPT_CHECK(d.elem_begin <= t.numel() && d.elem_count <= t.numel() - d.elem_begin, errors::sync::bad_delta,
                 "{}: delta record for \"{}\" covers elements [{}, {}) of {}", ctx, t.name, d.elem_begin,
                 d.elem_begin + d.elem_count, t.numel());
      RLPT_CHECK(d.base_checksum == pub_[d.tensor].checksum, errors::sync::base_mismatch,
                 "{}: delta for \"{}\" was encoded against checksum {}, the published version {} has {}", ctx, t.name,
                 to_hex(d.base_checksum), version_, to_hex(pub_[d.tensor].checksum));
      if (bound_[d.tensor] == nullptr) { // skipped tensor: nothing to apply it to
        at += delta_header_bytes + d.body;
        continue;
      }
      s.rec.at = arena_at + at;
      s.rec.target = bound_[d.tensor]->data;
      s.tensor_first = d.elem_begin;
      s.tensor_end = d.elem_begin + d.elem_count;
      at += delta_header_bytes + d.body;
      recs.push_back(s);
    }
    RLPT_CHECK(at == payload.size(), errors::sync::truncated, "{}: its records add up to {} bytes, the payload has {}", ctx, at,
               payload.size());
    const cudaStream_t s = link_.stream();
    grow_arena(arena_at + payload.size());
    RLPT_CUDA_CHECK(cudaMemcpyAsync(arena_.get() + arena_at, payload.data(), payload.size(), cudaMemcpyDeviceToDevice, s));
    const std::size_t k = cur_.want_msgs.size();
    if (k % 64 == 0) { // message sums live in blocks of 64 slots; grow keeping the old ones
      const std::size_t cap = (k + 64) * 8;
      if (d_msg_sums_.size() < cap) {
        detail::device_bytes bigger(cap * 2);
        if (k != 0) RLPT_CUDA_CHECK(cudaMemcpyAsync(bigger.get(), d_msg_sums_.get(), k * 8, cudaMemcpyDeviceToDevice, s));
        detail::wait_stream(done_, s, after(o_.timeout), where_, "growing the delta checksums");
        d_msg_sums_ = std::move(bigger);
        h_msg_sums_.reserve(cap * 2);
      }
    }
    RLPT_CUDA_CHECK(cudaMemsetAsync(d_msg_sums_.get<std::uint64_t>() + k, 0, 8, s));
    run_checksum(payload.data(), payload.size(), d_msg_sums_.get<std::uint64_t>() + k, s);
    cur_.want_msgs.push_back(detail::frame_u64(f.body, 0));
    cur_.arena_used = arena_at + payload.size();
    cur_.records.insert(cur_.records.end(), recs.begin(), recs.end());
    cur_.bytes += payload.size();
    ++cur_.next;
  }

  // Grows the delta arena to `n` bytes, keeping what is staged (stream-ordered copy).
  void grow_arena(std::uint64_t n) {
    if (n <= arena_.size()) return;
    detail::device_bytes bigger(std::max<std::uint64_t>(n, arena_.size() * 2));
    if (cur_.arena_used != 0)
      RLPT_CUDA_CHECK(cudaMemcpyAsync(bigger.get(), arena_.get(), cur_.arena_used, cudaMemcpyDeviceToDevice, link_.stream()));
    // The old arena may still be read by queued copies: free it only once the stream is past them.
    detail::wait_stream(done_, link_.stream(), after(o_.timeout), where_, "growing the delta arena");
    arena_ = std::move(bigger);
  }

  std::optional<update> on_commit(const frame& f) {
    const manifest& m = cur_.m;
    RLPT_CHECK(f.count == cur_.next, errors::sync::truncated, "{}: COMMIT of version {} counts {} messages, {} arrived", where_,
               f.version, f.count, cur_.next);
    RLPT_CHECK(cur_.delta || cur_.next == m.bucket_count(), errors::sync::truncated, "{}: COMMIT of version {} after {} of {} buckets",
               where_, f.version, cur_.next, m.bucket_count());
    RLPT_CHECK(f.body.size() == m.size() * 8, errors::sync::protocol, "{}: COMMIT of version {} carries {} checksum bytes for {} tensors",
               where_, f.version, f.body.size(), m.size());
    std::vector<std::uint64_t> want(m.size());
    std::memcpy(want.data(), f.body.data(), f.body.size());
    link_.drain(after(o_.timeout));
    if (cur_.delta) return commit_delta(f, want);
    const cudaStream_t s = link_.stream();
    const std::uint64_t np = piece_at_.back();
    if (np != 0) RLPT_CUDA_CHECK(cudaMemcpyAsync(h_sums_.get(), d_sums_.get(), np * 8, cudaMemcpyDeviceToHost, s));
    detail::wait_stream(done_, s, after(o_.timeout), where_, fmt::format("verifying version {}", f.version));
    const auto* got = h_sums_.get<std::uint64_t>();
    std::vector<std::uint64_t> raw(m.size(), 0);
    for (std::uint64_t b = 0; b < m.bucket_count(); ++b) {
      const auto pieces = m.pieces(b);
      for (std::size_t j = 0; j < pieces.size(); ++j) {
        const std::uint64_t g = piece_at_[b] + j;
        const piece& p = pieces[j];
        RLPT_CHECK(got[g] == cur_.want_pieces[g], errors::sync::checksum,
                   "{}: bucket {} of version {}: piece {} (tensor \"{}\", bytes [{}, {})) has checksum {}, the sender's is {}",
                   where_, b, f.version, j, m[p.tensor].name, p.tensor_offset, p.tensor_offset + p.nbytes, to_hex(got[g]),
                   to_hex(cur_.want_pieces[g]));
        raw[p.tensor] += got[g];
      }
    }
    for (std::size_t i = 0; i < m.size(); ++i) {
      const std::uint64_t c = wsum_finish(raw[i], m[i].nbytes);
      RLPT_CHECK(c == want[i], errors::sync::checksum, "{}: version {}: tensor \"{}\" arrived with checksum {}, the sender's is {}",
                 where_, f.version, m[i].name, to_hex(c), to_hex(want[i]));
    }
    if (o_.mode == apply_mode::staged) {
      cur_.partial = true; // from here on the parameters change
      apply_.run(0, reinterpret_cast<std::uintptr_t>(arena_.get()), 0, nullptr, s);
      detail::wait_stream(done_, s, after(o_.timeout), where_, fmt::format("applying version {}", f.version));
    }
    return publish(want);
  }

  std::optional<update> commit_delta(const frame& f, const std::vector<std::uint64_t>& want) {
    const manifest& m = cur_.m;
    const cudaStream_t s = link_.stream();
    const std::size_t nm = cur_.want_msgs.size();
    if (nm != 0) RLPT_CUDA_CHECK(cudaMemcpyAsync(h_msg_sums_.get(), d_msg_sums_.get(), nm * 8, cudaMemcpyDeviceToHost, s));
    detail::wait_stream(done_, s, after(o_.timeout), where_, fmt::format("verifying delta version {}", f.version));
    for (std::size_t k = 0; k < nm; ++k)
      RLPT_CHECK(h_msg_sums_.get<std::uint64_t>()[k] == cur_.want_msgs[k], errors::sync::checksum,
                 "{}: delta chunk {} of version {} has checksum {}, the sender's is {}", where_, k, f.version,
                 to_hex(h_msg_sums_.get<std::uint64_t>()[k]), to_hex(cur_.want_msgs[k]));
    // Records of one tensor must not overlap: the swap runs them in parallel.
    auto sorted = cur_.records;
    std::sort(sorted.begin(), sorted.end(), [](const staged_record& a, const staged_record& b) {
      return a.rec.head.tensor != b.rec.head.tensor ? a.rec.head.tensor < b.rec.head.tensor : a.tensor_first < b.tensor_first;
    });
    std::vector<char> touched(m.size(), 0);
    for (std::size_t i = 0; i < sorted.size(); ++i) {
      if (i > 0 && sorted[i].rec.head.tensor == sorted[i - 1].rec.head.tensor)
        RLPT_CHECK(sorted[i].tensor_first >= sorted[i - 1].tensor_end, errors::sync::bad_delta,
                   "{}: delta version {} has overlapping records for \"{}\"", where_, f.version, m[sorted[i].rec.head.tensor].name);
      touched[sorted[i].rec.head.tensor] = 1;
    }
    std::vector<device_delta_record> recs;
    recs.reserve(cur_.records.size());
    for (const auto& r : cur_.records) recs.push_back(r.rec);
    const std::string bad = applier_.apply(recs, arena_.get(), s, after(o_.timeout), where_);
    if (!bad.empty()) RLPT_FAIL(errors::sync::bad_delta, "{}: delta version {}: {}", where_, f.version, bad);
    cur_.partial = true;
    // Result checksums of the touched tensors, read back from the targets.
    RLPT_CUDA_CHECK(cudaMemsetAsync(d_sums_.get(), 0, m.size() * 8, s));
    check_.run(0, 0, 0, d_sums_.get<std::uint64_t>(), s);
    RLPT_CUDA_CHECK(cudaMemcpyAsync(h_sums_.get(), d_sums_.get(), m.size() * 8, cudaMemcpyDeviceToHost, s));
    detail::wait_stream(done_, s, after(o_.timeout), where_, fmt::format("applying delta version {}", f.version));
    for (std::size_t i = 0; i < m.size(); ++i) {
      const bool checked = bound_[i] != nullptr;
      const std::uint64_t got = touched[i] || checked ? wsum_finish(h_sums_.get<std::uint64_t>()[i], m[i].nbytes) : pub_[i].checksum;
      if (checked && got != want[i]) {
        applier_.undo(s);
        detail::wait_stream(done_, s, after(o_.timeout), where_, fmt::format("rolling back delta version {}", f.version));
        cur_.partial = false;
        dense_next_ = true;
        RLPT_FAIL(errors::sync::checksum,
                  "{}: after applying delta version {}, tensor \"{}\" has checksum {}, the sender's is {}; rolled back to version {}",
                  where_, f.version, m[i].name, to_hex(got), to_hex(want[i]), version_);
      }
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
    u.tensors_loaded = cur_.m.size();
    u.seconds = detail::seconds_since(cur_.t0);
    pub_ = std::move(cur_.m);
    for (std::size_t i = 0; i < sums.size(); ++i) pub_.set_checksum(i, sums[i]);
    pub_.set_versions(cur_.version, cur_.base);
    version_ = cur_.version;
    has_ = true;
    torn_ = false;
    if (!cur_.delta) dense_next_ = false;
    const std::uint64_t v = cur_.version, tag = cur_.tag;
    cur_ = inflight{};
    reply(frame_type::ack, tag, v, 0, 0, {});
    return u;
  }

  device_link& link_;
  std::vector<device_tensor> targets_;
  device_receiver_options o_;
  std::string where_;
  bool duplex_ = true;
  bool has_ = false;
  bool torn_ = false;
  bool dense_next_ = false;
  std::uint64_t version_ = 0;
  manifest pub_;
  inflight cur_;
  std::deque<update> events_;
  std::string last_link_error_;
  // Plans of the current layout.
  bool plans_ready_ = false;
  std::uint64_t plans_hash_ = 0;
  std::string plans_layout_;
  std::vector<const device_tensor*> bound_;
  std::vector<std::uint64_t> piece_at_;
  detail::device_copy_plan stage_, unpack_, apply_, check_;
  detail::device_bytes d_sums_, d_msg_sums_, arena_;
  detail::pinned_bytes h_sums_, h_msg_sums_;
  detail::event done_;
  device_delta_applier applier_;
};

} // namespace sync
RLPT_NAMESPACE_END
