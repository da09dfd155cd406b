// SPDX-License-Identifier: Apache-2.0
//! @file
//! The versioned update protocol over device links: `device_sender` packs parameters that
//! live on the GPU into device buckets (or encodes a delta on the GPU), `device_receiver`
//! verifies and applies them into its own GPU parameters, in place. Both are the state
//! machines of sync/machine.hpp (the ones the host `sender` and `receiver` run, and the host
//! fault tests exercise) over a device backend; this file holds only what differs on a GPU.
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
//! the wire), so CUDA graphs that captured them stay valid. Deltas are swapped in place, every
//! bound target is verified afterwards (touched or not), and undone if any checksum disagrees.
//!
//! Streams: the sender reads the parameters on the link's stream, ordered after the work that
//! wrote them (publish(version, producer stream) or publish(version, ready event); plain
//! publish(version) waits for the legacy default stream). A receiver's published update has
//! been applied on the device when poll() returns it.
//!
//! With several receivers (an NCCL group) each one publishes independently: a NACK fails the
//! sender's publish() naming that peer while the others keep the new version; their base
//! versions then differ, so the next delta is refused by the lagging one and sent dense.
#pragma once

#include <rlpt/config.hpp>
#include <rlpt/core/error.hpp>
#include <rlpt/cuda/error.cuh>
#include <rlpt/cuda/resources.cuh>
#include <rlpt/cuda/sync/copy.cuh>
#include <rlpt/cuda/sync/copy_plan.hpp>
#include <rlpt/cuda/sync/delta.cuh>
#include <rlpt/cuda/sync/delta_plan.hpp>
#include <rlpt/cuda/sync/device_link.cuh>
#include <rlpt/cuda/sync/wsum.hpp>
#include <rlpt/sync/delta.hpp>
#include <rlpt/sync/frame.hpp>
#include <rlpt/sync/machine.hpp>
#include <rlpt/sync/manifest.hpp>
#include <rlpt/sync/protocol.hpp>

#include <cuda_runtime_api.h>

#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

RLPT_NAMESPACE_BEGIN
namespace sync {

//! The device sender's options are the host sender's (with deltas, the snapshot of the last
//! published version is one extra copy of the model's bytes in device memory).
using device_sender_options = sender_options;

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
  //! What each published version asks of the engine's prefix cache (update::cache), pending
  //! until acknowledge_cache(version).
  cache_action cache = cache_action::none;
};

namespace detail {

//! A copy plan uploaded to the device.
struct device_copy_plan {
  copy_plan host;
  device_bytes tasks;

  device_copy_plan() = default;
  explicit device_copy_plan(copy_plan p)
      : host(std::move(p)), tasks(std::max<std::size_t>(1, host.tasks.size()) * sizeof(copy_task)) {
    if (!host.tasks.empty())
      RLPT_CUDA_CHECK(
          cudaMemcpy(tasks.get(), host.tasks.data(), host.tasks.size() * sizeof(copy_task), cudaMemcpyHostToDevice));
  }
  void run(std::size_t launch, std::uint64_t src_base, std::uint64_t dst_base, std::uint64_t* sums,
           cudaStream_t s) const {
    run_copy(tasks.get<copy_task>(), host.launches[launch], src_base, dst_base, sums, s);
  }
};

//! The sender's device backend: packs buckets with the gather kernel (casting where a
//! parameter is stored in another dtype) and its wsum64 sums, encodes deltas on the GPU
//! against a device snapshot of the last published version.
class device_send_backend {
public:
  using link_type = device_link;
  static constexpr memory_space space = memory_space::device;
  static std::string wrong_link(std::string_view where) {
    return rlpt::detail::format("{} moves host payloads; use rlpt::sync::sender with it", where);
  }

  //! `params` are matched to the manifest by name (shape must agree; a dtype other than the
  //! wire dtype is cast while packing). Deltas need params stored in the wire dtype.
  device_send_backend(device_link& l, const manifest& m, const sender_options& o, const std::string& where,
                      std::span<const device_tensor> params)
      : link_(l), m_(m), o_(o), where_(where) {
    check_device_manifest(m_, where_);
    const auto src = detail::bind(m_, params, where_, "source", true);
    pack_ = device_copy_plan(plan_pack(m_, src));
    piece_at_ = piece_offsets(m_);
    const std::uint64_t pieces = piece_at_.back();
    d_sums_ = device_bytes(std::max<std::uint64_t>(1, pieces) * 8);
    h_sums_.reserve(std::max<std::uint64_t>(1, pieces) * 8);
    d_msg_sum_ = device_bytes(8);
    h_msg_sum_.reserve(8);
    if (o_.delta) {
      for (std::size_t i = 0; i < m_.size(); ++i)
        RLPT_CHECK(src[i] == nullptr || src[i]->dtype == m_[i].dtype, errors::sync::bad_source,
                   "{}: deltas compare wire bytes, but parameter \"{}\" is stored as {} and travels as {}", where_,
                   m_[i].name, src[i]->dtype, m_[i].dtype);
      snapshot_ = device_bytes(std::max<std::uint64_t>(1, m_.packed_bytes()));
      std::vector<const void*> now(m_.size()), base(m_.size());
      for (std::size_t i = 0; i < m_.size(); ++i) {
        now[i] = src[i] != nullptr ? src[i]->data : nullptr;
        base[i] = snapshot_.get() + m_.packed_offset(i);
        if (m_[i].nbytes != 0) snap_copies_.push_back({snapshot_.get() + m_.packed_offset(i), now[i], m_[i].nbytes});
      }
      max_msg_ = std::min<std::uint64_t>(m_.bucket_bytes(), link_.info().max_payload);
      encoder_ = std::make_unique<device_delta_encoder>(m_, now, base,
                                                        std::max<std::uint64_t>(max_msg_, delta_header_bytes + 64));
    }
  }

  [[nodiscard]] std::size_t peers() const { return link_.peers(); }
  [[nodiscard]] std::size_t last_peer() const { return link_.last_peer(); }
  [[nodiscard]] std::string peer_name(std::size_t p) const { return link_.peer_name(p); }
  void prepare(deadline until) { link_.prepare(until); }
  void drain(deadline until) { link_.drain(until); }
  void failed(std::string_view why) noexcept { link_.fail(why); }

  //! The link's stream waits for `ready` before it reads the parameters (the next publish).
  void wait_for(cudaEvent_t ready) {
    RLPT_CHECK(ready != nullptr, errors::sync::bad_source,
               "{}: publish needs an event recorded after the parameters were written", where_);
    RLPT_CUDA_CHECK(cudaStreamWaitEvent(link_.stream(), ready, 0));
  }
  void wait_for(cudaStream_t producer) {
    RLPT_CUDA_CHECK(cudaEventRecord(ready_.get(), producer));
    wait_for(ready_.get());
  }

  void begin_dense() { raw_.assign(m_.size(), 0); }

  std::span<const std::uint64_t> pack(std::uint64_t b, std::span<std::byte> buf, std::uint64_t version,
                                      deadline until) {
    const cudaStream_t s = link_.stream();
    const std::uint64_t p0 = piece_at_[b], np = piece_at_[b + 1] - p0;
    auto* host = h_sums_.get<std::uint64_t>();
    RLPT_CUDA_CHECK(cudaMemsetAsync(d_sums_.get<std::uint64_t>() + p0, 0, np * 8, s));
    pack_.run(b, 0, reinterpret_cast<std::uintptr_t>(buf.data()), d_sums_.get<std::uint64_t>(), s);
    RLPT_CUDA_CHECK(cudaMemcpyAsync(host + p0, d_sums_.get<std::uint64_t>() + p0, np * 8, cudaMemcpyDeviceToHost, s));
    // The pack of this bucket overlaps the previous bucket's transfer; its sums go in the frame.
    wait_stream(packed_, s, until, where_, rlpt::detail::format("packing bucket {} of version {}", b, version));
    const auto pieces = m_.pieces(b);
    for (std::size_t j = 0; j < pieces.size(); ++j) raw_[pieces[j].tensor] += host[p0 + j];
    return {host + p0, static_cast<std::size_t>(np)};
  }

  void end_dense(std::span<std::uint64_t> sums) {
    for (std::size_t i = 0; i < m_.size(); ++i) sums[i] = wsum_finish(raw_[i], m_[i].nbytes);
  }

  std::size_t encode_delta(std::span<std::uint64_t> sums, delta_stats& stats, std::uint64_t, deadline until) {
    std::vector<std::uint64_t> base(m_.size());
    for (std::size_t i = 0; i < m_.size(); ++i) base[i] = m_[i].checksum;
    const delta_plan& p = encoder_->plan(base, max_msg_, link_.stream(), until, where_);
    stats = p.stats;
    const auto raw = encoder_->tensor_raw_sums();
    for (std::size_t i = 0; i < m_.size(); ++i) sums[i] = wsum_finish(raw[i], m_[i].nbytes);
    return p.messages.size();
  }

  [[nodiscard]] std::uint64_t delta_bytes(std::size_t k) const { return encoder_->last_plan().messages[k].bytes; }

  delta_body write_delta(std::size_t k, std::span<std::byte> buf, std::uint64_t version, deadline until) {
    const cudaStream_t s = link_.stream();
    const delta_plan& p = encoder_->last_plan();
    const auto& msg = p.messages[k];
    encoder_->write(k, buf.data(), s);
    RLPT_CUDA_CHECK(cudaMemsetAsync(d_msg_sum_.get(), 0, 8, s));
    run_checksum(buf.data(), msg.bytes, d_msg_sum_.get<std::uint64_t>(), s);
    RLPT_CUDA_CHECK(cudaMemcpyAsync(h_msg_sum_.get(), d_msg_sum_.get(), 8, cudaMemcpyDeviceToHost, s));
    wait_stream(packed_, s, until, where_, rlpt::detail::format("encoding delta chunk {} of version {}", k, version));
    const std::size_t nrec = msg.record_end - msg.record_begin;
    body_.resize(8 + 64 * nrec);
    std::memcpy(body_.data(), h_msg_sum_.get(), 8);
    for (std::size_t j = 0; j < nrec; ++j)
      std::memcpy(body_.data() + 8 + 64 * j, p.records[msg.record_begin + j].header.data(), 64);
    return {body_, nrec};
  }

  // What the receivers now hold becomes the base of the next delta.
  void committed(bool, deadline until) {
    if (!o_.delta) return;
    const cudaStream_t s = link_.stream();
    for (const auto& c : snap_copies_)
      RLPT_CUDA_CHECK(cudaMemcpyAsync(c.dst, c.src, c.bytes, cudaMemcpyDeviceToDevice, s));
    wait_stream(done_, s, until, where_, "updating the delta snapshot");
  }

private:
  struct snap_copy {
    void* dst;
    const void* src;
    std::uint64_t bytes;
  };

  device_link& link_;
  const manifest& m_;
  const sender_options& o_;
  const std::string& where_;
  device_copy_plan pack_;
  std::vector<std::uint64_t> piece_at_, raw_;
  device_bytes d_sums_, d_msg_sum_, snapshot_;
  pinned_bytes h_sums_, h_msg_sum_;
  event packed_, done_, ready_;
  std::vector<snap_copy> snap_copies_;
  std::uint64_t max_msg_ = 0;
  std::unique_ptr<device_delta_encoder> encoder_;
  std::vector<std::byte> body_;
};

//! The receiver's device backend: stages buckets into a device arena (or scatters them into
//! the targets when streaming) with the copy kernels' wsum64 sums, verifies at COMMIT, applies
//! staged buckets and delta records into the bound targets in place.
class device_receive_backend {
public:
  using link_type = device_link;
  using options = device_receiver_options;
  static constexpr memory_space space = memory_space::device;
  static constexpr std::string_view options_name = "device_receiver_options";
  static constexpr refusal setup_refusal = refusal::too_large; // device memory for the plans or the arena
  static std::string wrong_link(std::string_view where) {
    return rlpt::detail::format("{} moves host payloads; use rlpt::sync::receiver with it", where);
  }

  struct staged_record {
    device_delta_record rec;
    std::uint64_t tensor_first = 0, tensor_end = 0; // element range in the tensor
  };
  struct inflight_state {
    std::vector<const device_tensor*> bound; // the manifest's targets (BEGIN)
    std::vector<std::uint64_t> want_pieces;  // dense: per piece, from BUCKET bodies
    std::vector<std::uint64_t> want_msgs;    // delta: per message, from DELTA bodies
    std::vector<staged_record> records;      // delta
    std::uint64_t arena_used = 0;            // delta
  };
  using inflight = receiver_inflight<inflight_state>;

  //! `targets`: the engine's parameters, by manifest name (shape must match; a dtype other
  //! than the wire dtype is cast while applying). Fused parameters (qkv, gate_up) are bound
  //! as several targets pointing into one buffer at the right offsets.
  device_receive_backend(device_link& l, const device_receiver_options& o, const std::string& where,
                         std::vector<device_tensor> targets)
      : link_(l), o_(o), where_(where), targets_(std::move(targets)) {
    d_msg_sums_ = device_bytes(8 * 64);
    h_msg_sums_.reserve(8 * 64);
  }

  void check_manifest(inflight_state& s, const manifest& m) {
    check_device_manifest(m, where_);
    s.bound = detail::bind(m, targets_, where_, "target", false);
    if (!o_.skip_unbound)
      for (std::size_t i = 0; i < m.size(); ++i)
        RLPT_CHECK(s.bound[i] != nullptr || m[i].nbytes == 0, errors::sync::unknown_tensor,
                   "{}: manifest tensor \"{}\" has no target (bind it, or set skip_unbound)", where_, m[i].name);
  }

  [[nodiscard]] std::string delta_refusal(const inflight_state& s, const manifest& m) const {
    for (std::size_t i = 0; i < m.size(); ++i)
      if (s.bound[i] != nullptr && s.bound[i]->dtype != m[i].dtype)
        return rlpt::detail::format("target \"{}\" is stored as {} but travels as {}: deltas need equal dtypes",
                                    m[i].name, s.bound[i]->dtype, m[i].dtype);
    return {};
  }

  void setup(inflight& c, receiver_state&) {
    const manifest& m = c.m;
    if (!plans_ready_ || plans_hash_ != m.layout_hash() || plans_layout_ != m.layout_json()) build_plans(m, c.be.bound);
    if (!c.delta && o_.mode == apply_mode::staged) arena_.reserve(std::max<std::uint64_t>(1, m.packed_bytes()));
    RLPT_CUDA_CHECK(cudaMemsetAsync(d_sums_.get(), 0, d_sums_.size(), link_.stream()));
    c.be.want_pieces.assign(piece_at_.empty() ? 0 : piece_at_.back(), 0);
  }

  void bucket(inflight& c, const frame& f, std::span<const std::byte> payload, receiver_state& st) {
    const std::uint64_t b = f.index;
    const std::uint64_t p0 = piece_at_[b], np = piece_at_[b + 1] - p0;
    for (std::uint64_t j = 0; j < np; ++j) c.be.want_pieces[p0 + j] = body_u64(f.body, j);
    const auto src = reinterpret_cast<std::uintptr_t>(payload.data());
    if (o_.mode == apply_mode::staged) {
      stage_.run(b, src, reinterpret_cast<std::uintptr_t>(arena_.get()), d_sums_.get<std::uint64_t>(), link_.stream());
    } else {
      st.torn = true; // until the commit succeeds
      c.partial = true;
      unpack_.run(b, src, 0, d_sums_.get<std::uint64_t>(), link_.stream());
    }
  }

  void delta_chunk(inflight& c, const frame& f, std::span<const std::byte> payload, receiver_state& st) {
    const manifest& m = c.m;
    RLPT_CHECK(f.count >= 1 && f.count <= (f.body.size() / 64) && f.body.size() == 8 + 64 * f.count,
               errors::sync::protocol, "{}: delta chunk {} of version {} announces {} records in a {}-byte body",
               where_, f.index, f.version, f.count, f.body.size());
    const std::string ctx = rlpt::detail::format("{} version {} delta chunk {}", where_, f.version, f.index);
    std::uint64_t at = 0;
    const std::uint64_t arena_at = c.be.arena_used;
    std::vector<staged_record> recs;
    for (std::uint64_t j = 0; j < f.count; ++j) {
      staged_record s;
      const auto h = f.body.subspan(8 + 64 * j, 64);
      s.rec.head = parse_delta_head(h, ctx, at);
      std::memcpy(s.rec.header.data(), h.data(), 64);
      const delta_head& d = s.rec.head;
      const tensor_entry& t = check_delta_target(m, d, st, ctx, f.version);
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
    RLPT_CHECK(at == payload.size(), errors::sync::truncated, "{}: its records add up to {} bytes, the payload has {}",
               ctx, at, payload.size());
    const cudaStream_t s = link_.stream();
    grow_arena(c, arena_at + payload.size());
    RLPT_CUDA_CHECK(
        cudaMemcpyAsync(arena_.get() + arena_at, payload.data(), payload.size(), cudaMemcpyDeviceToDevice, s));
    const std::size_t k = c.be.want_msgs.size();
    if (k % 64 == 0) { // message sums live in blocks of 64 slots; grow keeping the old ones
      const std::size_t cap = (k + 64) * 8;
      if (d_msg_sums_.size() < cap) {
        device_bytes bigger(cap * 2);
        if (k != 0)
          RLPT_CUDA_CHECK(cudaMemcpyAsync(bigger.get(), d_msg_sums_.get(), k * 8, cudaMemcpyDeviceToDevice, s));
        wait_stream(done_, s, after(o_.timeout), where_, "growing the delta checksums");
        d_msg_sums_ = std::move(bigger);
        h_msg_sums_.reserve(cap * 2);
      }
    }
    // The checksum is of the staged copy (the arena), not of the link's slot.
    RLPT_CUDA_CHECK(cudaMemsetAsync(d_msg_sums_.get<std::uint64_t>() + k, 0, 8, s));
    run_checksum(arena_.get() + arena_at, payload.size(), d_msg_sums_.get<std::uint64_t>() + k, s);
    c.be.want_msgs.push_back(body_u64(f.body, 0));
    c.be.arena_used = arena_at + payload.size();
    c.be.records.insert(c.be.records.end(), recs.begin(), recs.end());
  }

  void commit_dense(inflight& c, const frame& f, std::span<const std::uint64_t> want, receiver_state&) {
    const manifest& m = c.m;
    link_.drain(after(o_.timeout));
    const cudaStream_t s = link_.stream();
    const std::uint64_t np = piece_at_.back();
    if (np != 0) RLPT_CUDA_CHECK(cudaMemcpyAsync(h_sums_.get(), d_sums_.get(), np * 8, cudaMemcpyDeviceToHost, s));
    wait_stream(done_, s, after(o_.timeout), where_, rlpt::detail::format("verifying version {}", f.version));
    const auto* got = h_sums_.get<std::uint64_t>();
    std::vector<std::uint64_t> raw(m.size(), 0);
    for (std::uint64_t b = 0; b < m.bucket_count(); ++b) {
      const auto pieces = m.pieces(b);
      for (std::size_t j = 0; j < pieces.size(); ++j) {
        const std::uint64_t g = piece_at_[b] + j;
        const piece& p = pieces[j];
        RLPT_CHECK(
            got[g] == c.be.want_pieces[g], errors::sync::checksum,
            "{}: bucket {} of version {}: piece {} (tensor \"{}\", bytes [{}, {})) has checksum {}, the sender's is {}",
            where_, b, f.version, j, m[p.tensor].name, p.tensor_offset, p.tensor_offset + p.nbytes, to_hex(got[g]),
            to_hex(c.be.want_pieces[g]));
        raw[p.tensor] += got[g];
      }
    }
    for (std::size_t i = 0; i < m.size(); ++i) {
      const std::uint64_t sum = wsum_finish(raw[i], m[i].nbytes);
      RLPT_CHECK(sum == want[i], errors::sync::checksum,
                 "{}: version {}: tensor \"{}\" arrived with checksum {}, the sender's is {}", where_, f.version,
                 m[i].name, to_hex(sum), to_hex(want[i]));
    }
    if (o_.mode == apply_mode::staged) {
      c.partial = true; // from here on the parameters change
      apply_.run(0, reinterpret_cast<std::uintptr_t>(arena_.get()), 0, nullptr, s);
      wait_stream(done_, s, after(o_.timeout), where_, rlpt::detail::format("applying version {}", f.version));
    }
    c.loaded = m.size();
  }

  void commit_delta(inflight& c, const frame& f, std::span<const std::uint64_t> want, receiver_state& st) {
    const manifest& m = c.m;
    link_.drain(after(o_.timeout));
    const cudaStream_t s = link_.stream();
    const std::size_t nm = c.be.want_msgs.size();
    if (nm != 0)
      RLPT_CUDA_CHECK(cudaMemcpyAsync(h_msg_sums_.get(), d_msg_sums_.get(), nm * 8, cudaMemcpyDeviceToHost, s));
    wait_stream(done_, s, after(o_.timeout), where_, rlpt::detail::format("verifying delta version {}", f.version));
    for (std::size_t k = 0; k < nm; ++k)
      RLPT_CHECK(h_msg_sums_.get<std::uint64_t>()[k] == c.be.want_msgs[k], errors::sync::checksum,
                 "{}: delta chunk {} of version {} has checksum {}, the sender's is {}", where_, k, f.version,
                 to_hex(h_msg_sums_.get<std::uint64_t>()[k]), to_hex(c.be.want_msgs[k]));
    // Records of one tensor must not overlap: the swap runs them in parallel.
    auto sorted = c.be.records;
    std::sort(sorted.begin(), sorted.end(), [](const staged_record& a, const staged_record& b) {
      return a.rec.head.tensor != b.rec.head.tensor ? a.rec.head.tensor < b.rec.head.tensor
                                                    : a.tensor_first < b.tensor_first;
    });
    for (std::size_t i = 1; i < sorted.size(); ++i)
      if (sorted[i].rec.head.tensor == sorted[i - 1].rec.head.tensor)
        RLPT_CHECK(sorted[i].tensor_first >= sorted[i - 1].tensor_end, errors::sync::bad_delta,
                   "{}: delta version {} has overlapping records for \"{}\"", where_, f.version,
                   m[sorted[i].rec.head.tensor].name);
    std::vector<device_delta_record> recs;
    recs.reserve(c.be.records.size());
    for (const auto& r : c.be.records) recs.push_back(r.rec);
    const std::string bad = applier_.apply(recs, arena_.get(), s, after(o_.timeout), where_);
    if (!bad.empty()) RLPT_FAIL(errors::sync::bad_delta, "{}: delta version {}: {}", where_, f.version, bad);
    c.partial = true;
    // Every bound target is verified, touched or not: targets damaged since they were
    // published are never carried into the new version on the strength of a stored checksum.
    const std::vector<std::uint64_t> got =
        target_checksums(m, s, rlpt::detail::format("applying delta version {}", f.version));
    for (std::size_t i = 0; i < m.size(); ++i) {
      if (bound_[i] == nullptr || got[i] == want[i]) continue;
      applier_.undo(s);
      const std::vector<std::uint64_t> base =
          target_checksums(m, s, rlpt::detail::format("rolling back delta version {}", f.version));
      c.partial = false;
      st.require_dense(rlpt::detail::format("delta version {} failed verification here", f.version));
      if (base[i] != st.pub[i].checksum)
        RLPT_FAIL(
            errors::sync::base_mismatch,
            "{}: after applying delta version {}, tensor \"{}\" has checksum {}, the sender's is {}; rolled back to "
            "version {}, whose copy here is damaged (tensor \"{}\" has checksum {}, published as {}): send a dense "
            "update",
            where_, f.version, m[i].name, to_hex(got[i]), to_hex(want[i]), st.version, m[i].name, to_hex(base[i]),
            to_hex(st.pub[i].checksum));
      RLPT_FAIL(errors::sync::checksum,
                "{}: after applying delta version {}, tensor \"{}\" has checksum {}, the sender's is {}; rolled back "
                "to version {}",
                where_, f.version, m[i].name, to_hex(got[i]), to_hex(want[i]), st.version);
    }
    c.loaded = m.size();
  }

  void discard(inflight&) noexcept {}

  // The targets were being written when it failed: they hold a mix. The link forgets its slots
  // (NCCL aborts a communicator with a collective pending).
  void failed(inflight& c, receiver_state& st, std::string_view why) noexcept {
    if (c.partial) st.torn = true;
    link_.fail(why);
  }

  void published(inflight&, receiver_state&) {}

  void held_checksums(const receiver_state& st, std::vector<std::uint64_t>& sums, std::vector<char>& known) {
    // The plans may have been built for a later BEGIN (of another layout) that failed.
    if (!plans_ready_ || plans_hash_ != st.pub.layout_hash() || plans_layout_ != st.pub.layout_json())
      build_plans(st.pub, detail::bind(st.pub, targets_, where_, "target", false));
    const std::vector<std::uint64_t> got =
        target_checksums(st.pub, link_.stream(), rlpt::detail::format("verifying version {}", st.version));
    for (std::size_t i = 0; i < st.pub.size(); ++i) {
      known[i] = bound_[i] != nullptr ? 1 : 0; // skipped tensors have no bytes here
      sums[i] = got[i];
    }
  }

private:
  void build_plans(const manifest& m, const std::vector<const device_tensor*>& bound) {
    plans_ready_ = false;
    bound_ = bound;
    piece_at_ = piece_offsets(m);
    stage_ = device_copy_plan(plan_stage(m));
    unpack_ = device_copy_plan(plan_unpack(m, bound));
    apply_ = device_copy_plan(plan_apply_staged(m, bound));
    check_ = device_copy_plan(plan_checksum(m, bound));
    const std::uint64_t n = std::max<std::uint64_t>({std::uint64_t{1}, piece_at_.back(), m.size()});
    d_sums_ = device_bytes(n * 8);
    h_sums_.reserve(n * 8);
    plans_hash_ = m.layout_hash();
    plans_layout_ = m.layout_json();
    plans_ready_ = true;
  }

  // wsum64 of every bound target's wire bytes (0 for unbound ones), read back and waited for.
  std::vector<std::uint64_t> target_checksums(const manifest& m, cudaStream_t s, std::string_view what) {
    RLPT_CUDA_CHECK(cudaMemsetAsync(d_sums_.get(), 0, m.size() * 8, s));
    check_.run(0, 0, 0, d_sums_.get<std::uint64_t>(), s);
    if (m.size() != 0)
      RLPT_CUDA_CHECK(cudaMemcpyAsync(h_sums_.get(), d_sums_.get(), m.size() * 8, cudaMemcpyDeviceToHost, s));
    wait_stream(done_, s, after(o_.timeout), where_, what);
    std::vector<std::uint64_t> out(m.size());
    for (std::size_t i = 0; i < m.size(); ++i) out[i] = wsum_finish(h_sums_.get<std::uint64_t>()[i], m[i].nbytes);
    return out;
  }

  // Grows the delta arena to `n` bytes, keeping what is staged (stream-ordered copy).
  void grow_arena(const inflight& c, std::uint64_t n) {
    if (n <= arena_.size()) return;
    device_bytes bigger(std::max<std::uint64_t>(n, arena_.size() * 2));
    if (c.be.arena_used != 0)
      RLPT_CUDA_CHECK(
          cudaMemcpyAsync(bigger.get(), arena_.get(), c.be.arena_used, cudaMemcpyDeviceToDevice, link_.stream()));
    // The old arena may still be read by queued copies: free it only once the stream is past them.
    wait_stream(done_, link_.stream(), after(o_.timeout), where_, "growing the delta arena");
    arena_ = std::move(bigger);
  }

  device_link& link_;
  const device_receiver_options& o_;
  const std::string& where_;
  std::vector<device_tensor> targets_;
  // Plans of the current layout.
  bool plans_ready_ = false;
  std::uint64_t plans_hash_ = 0;
  std::string plans_layout_;
  std::vector<const device_tensor*> bound_;
  std::vector<std::uint64_t> piece_at_;
  device_copy_plan stage_, unpack_, apply_, check_;
  device_bytes d_sums_, d_msg_sums_, arena_;
  pinned_bytes h_sums_, h_msg_sums_;
  event done_;
  device_delta_applier applier_;
};

} // namespace detail

//! Trainer side over a device link: publishes versions of GPU-resident parameters.
class device_sender : public basic_sender<detail::device_send_backend> {
public:
  //! `params` are matched to the manifest by name (shape must agree; a dtype other than the
  //! wire dtype is cast while packing: fp32 master weights sent as bf16). Their memory must
  //! stay valid, and unchanged during publish(). Deltas need params stored in the wire dtype.
  device_sender(device_link& l, manifest m, std::span<const device_tensor> params, device_sender_options o = {})
      : basic_sender(l, std::move(m), o, params) {}

  //! Sends version `version` and waits until every receiver published it (see
  //! basic_sender::publish). The parameters are read on the link's own (non-blocking) stream,
  //! ordered after the work that wrote them: `producer` is the stream the trainer wrote them
  //! on (the optimizer step), or `ready` an event recorded after that work. publish(version)
  //! waits for the legacy default stream, which covers work on it and on every blocking stream
  //! (PyTorch's default stream); parameters written on a non-blocking stream must be named.
  //! The parameters must not change until publish() returns.
  publish_result publish(std::uint64_t version) { return publish(version, cudaStreamLegacy); }
  publish_result publish(std::uint64_t version, cudaStream_t producer) {
    backend().wait_for(producer);
    return basic_sender::publish(version);
  }
  publish_result publish(std::uint64_t version, cudaEvent_t ready) {
    backend().wait_for(ready);
    return basic_sender::publish(version);
  }
};

//! Engine side over a device link: verifies updates and writes them into GPU parameters.
class device_receiver : public basic_receiver<detail::device_receive_backend> {
public:
  //! `targets`: the engine's parameters, by manifest name (shape must match; a dtype other
  //! than the wire dtype is cast while applying). Fused parameters (qkv, gate_up) are bound
  //! as several targets pointing into one buffer at the right offsets. poll() returns a
  //! published update once it has been applied on the device.
  device_receiver(device_link& l, std::vector<device_tensor> targets, device_receiver_options o = {})
      : basic_receiver(l, std::move(o), std::move(targets)) {}
};

} // namespace sync
RLPT_NAMESPACE_END
