// SPDX-License-Identifier: Apache-2.0
//! @file
//! The versioned update protocol over host memory: `sender` and `receiver`, the state machines
//! of machine.hpp (the same ones the device transports run) over a host backend: XXH3 per
//! piece, tensor and delta chunk, a host mirror of the published version, receiver
//! transforms and a load callback.
//!
//! Every blocking step has a timeout. The receiver publishes a version only after all of it
//! arrived, verified and was applied; an aborted, timed-out or corrupted update leaves the
//! previously published version intact and readable, and poll() says why. A delta whose base
//! is not the receiver's published version is refused, and one whose base fails verification
//! is NACKed: the sender sends the version dense instead.
//!
//! Memory (receiver, `apply_mode::staged`, the default): the update is staged before anything
//! is applied, so the previous version survives any failure; a delta stages only its records
//! (a few % of the model), a dense update stages the model's bytes (with the mirror that is
//! the new mirror, swapped in at commit). The replaced mirror (or, without a mirror, the
//! staging area) is kept as the next dense update's staging area, so steady-state updates
//! write into memory that is already mapped; the published mirror is never staged into.
//! `apply_mode::streaming` hands each bucket to the load callback as soon as it is verified:
//! extra memory is the link's slots plus the largest split tensor, but a failure part-way
//! leaves the engine partially loaded (poll() reports `partial` and the receiver accepts only
//! a dense update next). Sender: the link's slots, plus one host snapshot of the last
//! published version when deltas are on.
#pragma once

#include <rlpt/config.hpp>
#include <rlpt/core/copy.hpp>
#include <rlpt/core/error.hpp>
#include <rlpt/core/format.hpp>
#include <rlpt/sync/checksum.hpp>
#include <rlpt/sync/delta.hpp>
#include <rlpt/sync/frame.hpp>
#include <rlpt/sync/link.hpp>
#include <rlpt/sync/machine.hpp>
#include <rlpt/sync/manifest.hpp>
#include <rlpt/sync/transform.hpp>

#include <fmt/core.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

RLPT_NAMESPACE_BEGIN
namespace sync {

//! Where the sender reads tensor i's current bytes (host, nbytes long). Called per bucket, so
//! a trainer can materialise parameters lazily (FSDP full_tensor per bucket).
using source_fn = std::function<std::span<const std::byte>(std::size_t tensor)>;

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
  //! What each published version asks of the engine's prefix cache (update::cache), pending
  //! until acknowledge_cache(version).
  cache_action cache = cache_action::none;
};

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
    if (n <= cap_)
      n_ = n;
    else
      *this = byte_buffer(n);
  }

private:
  std::unique_ptr<std::byte[]> p_;
  std::size_t n_ = 0, cap_ = 0;
};

//! The sender's host backend: packs buckets from host sources with copy_hash (XXH3 of what
//! was copied), encodes deltas against a host snapshot of the last published version.
template <class = void> class basic_host_send_backend {
public:
  using link_type = link;
  static constexpr memory_space space = memory_space::host;
  static std::string wrong_link(std::string_view where) {
    return rlpt::detail::format("{} moves device payloads; the host sender needs a host link", where);
  }

  basic_host_send_backend(link& l, const manifest& m, const sender_options& o, const std::string&, source_fn src)
      : link_(l), m_(m), o_(o), src_(std::move(src)) {
    RLPT_CHECK(static_cast<bool>(src_), errors::sync::bad_source, "sender needs a source function");
    if (o_.delta) snapshot_ = byte_buffer(static_cast<std::size_t>(m_.packed_bytes()));
  }

  // One receiver per host link.
  [[nodiscard]] std::size_t peers() const noexcept { return 1; }
  [[nodiscard]] std::size_t last_peer() const noexcept { return 0; }
  [[nodiscard]] std::string peer_name(std::size_t) const { return "the receiver"; }
  void prepare(deadline) {}
  void drain(deadline) {}
  void failed(std::string_view) noexcept {}

  void begin_dense() {
    dense_sums_.assign(m_.size(), 0);
    parts_.clear();
  }

  std::span<const std::uint64_t> pack(std::uint64_t b, std::span<std::byte> buf, std::uint64_t, deadline);

  void end_dense(std::span<std::uint64_t> sums) {
    for (std::size_t i = 0; i < sums.size(); ++i) sums[i] = dense_sums_[i];
    for (auto& [t, v] : parts_) sums[t] = combine_piece_checksums(v);
  }

  std::size_t encode_delta(std::span<std::uint64_t> sums, delta_stats& stats, std::uint64_t, deadline);

  [[nodiscard]] std::uint64_t delta_bytes(std::size_t k) const { return msgs_[k].bytes; }

  delta_body write_delta(std::size_t k, std::span<std::byte> buf, std::uint64_t, deadline) {
    const msg& g = msgs_[k];
    // The checksum of what was copied, not of the slot afterwards (another process may write it).
    check_ = copy_hash(buf.data(), records_.data() + g.at, static_cast<std::size_t>(g.bytes));
    return {u64_bytes(std::span<const std::uint64_t>(&check_, 1)), g.records};
  }

  // The receiver holds the version now: it becomes the snapshot the next delta is encoded against.
  void committed(bool delta, deadline);

private:
  struct msg {
    std::uint64_t at = 0, bytes = 0, records = 0;
  };

  std::span<const std::byte> source(std::size_t i) {
    const auto s = src_(i);
    RLPT_CHECK(s.size() == m_[i].nbytes, errors::sync::bad_source,
               "source of tensor \"{}\" has {} bytes, the manifest says {}", m_[i].name, s.size(), m_[i].nbytes);
    return s;
  }

  link& link_;
  const manifest& m_;
  const sender_options& o_;
  source_fn src_;
  byte_buffer snapshot_;
  std::vector<std::uint64_t> piece_sums_, dense_sums_;
  std::unordered_map<std::size_t, std::vector<std::uint64_t>> parts_; // split tensors' piece checksums
  std::vector<std::byte> records_;
  std::vector<msg> msgs_;
  std::uint64_t check_ = 0;
};
using host_send_backend = basic_host_send_backend<>;
RLPT_EXTERN_TEMPLATE(class basic_host_send_backend<>)

//! Checks a delta record against the manifest and the published version it applies to: its
//! tensor exists, its elements have the tensor's width and lie inside it, and it was encoded
//! against the published bytes (if not, the receiver asks for a dense update). Record: the host's
//! delta_record or the device receiver's delta_head, which name these fields alike. Returns the
//! record's tensor.
template <class Record>
const tensor_entry& check_delta_target(const manifest& m, const Record& r, receiver_state& st, std::string_view where,
                                       std::uint64_t version) {
  RLPT_CHECK(r.tensor < m.size(), errors::sync::bad_delta, "{}: delta record names tensor #{} of {}", where, r.tensor,
             m.size());
  const tensor_entry& t = m[r.tensor];
  RLPT_CHECK(r.elem_bytes == size_of(t.dtype), errors::sync::bad_delta,
             "{}: delta record for \"{}\" has {}-byte elements, {} has {}", where, t.name, r.elem_bytes, t.dtype,
             size_of(t.dtype));
  RLPT_CHECK(r.elem_begin <= t.numel() && r.elem_count <= t.numel() - r.elem_begin, errors::sync::bad_delta,
             "{}: delta record for \"{}\" covers elements [{}, {}) of {}", where, t.name, r.elem_begin,
             r.elem_begin + r.elem_count, t.numel());
  if (r.base_checksum != st.pub[r.tensor].checksum) {
    st.require_dense(rlpt::detail::format("delta version {} was encoded against another base", version));
    RLPT_FAIL(errors::sync::base_mismatch,
              "{}: delta for \"{}\" was encoded against checksum {}, the published version {} has {}", where, t.name,
              to_hex(r.base_checksum), st.version, to_hex(st.pub[r.tensor].checksum));
  }
  return t;
}

//! The receiver's host backend: verifies with copy_hash into a staging area, the mirror or the
//! bound targets, applies deltas to the mirror, runs the transforms and the load callback.
template <class = void> class basic_host_receive_backend {
public:
  using link_type = link;
  using options = receiver_options;
  static constexpr memory_space space = memory_space::host;
  static constexpr std::string_view options_name = "receiver_options";
  static constexpr refusal setup_refusal = refusal::bad_manifest; // transforms that do not fit
  static std::string wrong_link(std::string_view where) {
    return rlpt::detail::format("{} moves device payloads; the host receiver needs a host link", where);
  }

  struct inflight_state {
    transform_plan plan;
    byte_buffer staging;             // dense staged: packed arena
    std::vector<std::byte> records;  // delta: concatenated records
    std::vector<std::uint64_t> sums; // tensor checksums from pieces
    std::unordered_map<std::size_t, std::vector<std::uint64_t>> parts;
    // streaming
    std::vector<std::uint64_t> pieces_left;                       // per tensor
    std::vector<std::uint64_t> inputs_left;                       // per output
    std::vector<std::uint64_t> outputs_left;                      // per tensor: outputs not yet run
    std::unordered_map<std::size_t, std::vector<std::byte>> held; // tensor bytes kept across buckets
    std::vector<std::span<const std::byte>> avail;
    std::vector<const tensor_target*> bound; // per manifest tensor: its target, or null (load callback)
    [[nodiscard]] std::byte* target(std::size_t t) const noexcept { return static_cast<std::byte*>(bound[t]->data); }
  };
  using inflight = receiver_inflight<inflight_state>;

  basic_host_receive_backend(link&, const receiver_options& o, const std::string& where, load_fn load,
                             std::vector<tensor_target> targets = {})
      : o_(o), where_(where), load_(std::move(load)), targets_(std::move(targets)) {
    RLPT_CHECK(targets_.empty() || o_.transforms.empty(), errors::sync::bad_transform,
               "{}: {} targets and {} transforms: a target takes its tensor as it travels, so the two do not combine "
               "(transform in the load callback instead)",
               where_, targets_.size(), o_.transforms.size());
  }

  void check_manifest(inflight_state& s, const manifest& m);

  [[nodiscard]] std::string delta_refusal(const inflight_state&, const manifest&) const {
    return o_.mirror ? std::string() : std::string("this receiver keeps no mirror to apply deltas to");
  }

  void setup(inflight& c, receiver_state& st);

  void bucket(inflight& c, const frame& f, std::span<const std::byte> payload, receiver_state& st);

  void delta_chunk(inflight& c, const frame& f, std::span<const std::byte> payload, receiver_state&);

  void commit_dense(inflight& c, const frame& f, std::span<const std::uint64_t> want, receiver_state&);

  void commit_delta(inflight& c, const frame& f, std::span<const std::uint64_t> want, receiver_state& st);

  // A staging area the update did not keep is the next dense update's.
  void discard(inflight& c) noexcept {
    if (c.be.staging.capacity() > spare_.capacity()) spare_ = std::move(c.be.staging);
  }

  void failed(inflight& c, receiver_state&, std::string_view) noexcept { discard(c); }

  void published(inflight& c, receiver_state&) {
    pub_plan_ = std::move(c.be.plan);
    if (!o_.mirror) mirror_ = {};
  }

  void held_checksums(const receiver_state& st, std::vector<std::uint64_t>& sums, std::vector<char>& known) const {
    RLPT_CHECK(o_.mirror, errors::sync::no_version, "{}: no bytes of version {} are held to verify (mirror off)",
               where_, st.version);
    for (std::size_t i = 0; i < st.pub.size(); ++i) {
      sums[i] = tensor_checksum(mirror_.data() + st.pub.packed_offset(i), st.pub[i].nbytes, st.pub.bucket_bytes());
      known[i] = 1;
    }
  }

  //! The published bytes of wire tensor `name` from the mirror.
  [[nodiscard]] tensor_view tensor(const receiver_state& st, std::string_view name) const;

private:
  // Streaming: runs every output whose sources are now complete.
  void stream_bucket(inflight& c, std::uint64_t b, std::span<const std::byte> payload);

  void run_output(inflight& c, std::size_t k, bool streaming = false);

  const receiver_options& o_;
  const std::string& where_;
  load_fn load_;
  std::vector<tensor_target> targets_;
  transform_plan pub_plan_;
  byte_buffer mirror_;
  byte_buffer spare_; // staged dense: the next update's staging area (see setup)
};
using host_receive_backend = basic_host_receive_backend<>;
RLPT_EXTERN_TEMPLATE(class basic_host_receive_backend<>)

} // namespace detail

//! Trainer side: publishes versions of the tensors in a manifest over a host link.
template <class = void> class basic_host_sender : public basic_sender<detail::host_send_backend> {
public:
  //! `params` are matched to the manifest by name (dtype and shape must agree); their memory
  //! must stay valid and unchanged during publish().
  basic_host_sender(link& l, manifest m, std::span<const tensor_ref> params, sender_options o = {});

  //! Tensor i's bytes come from `source(i)`, called per bucket (and per delta).
  basic_host_sender(link& l, manifest m, source_fn source, sender_options o = {});

private:
  struct bound {
    manifest m;
    source_fn src;
  };

  static bound bind(manifest m, std::span<const tensor_ref> params);

  basic_host_sender(link& l, bound b, sender_options o);
};
using sender = basic_host_sender<>;
RLPT_EXTERN_TEMPLATE(class basic_host_sender<>)

//! Engine side: receives updates from a host link, verifies, applies, calls `load` per tensor.
template <class = void> class basic_host_receiver : public basic_receiver<detail::host_receive_backend> {
public:
  // The constructors (the sender's too) are defined in the last section: they instantiate the
  // state machine, which compiled mode keeps out of users' TUs.
  basic_host_receiver(link& l, load_fn load, receiver_options o = {});

  //! Writes each manifest tensor bound in `targets` (the engine's parameters, by manifest name,
  //! with the dtype and shape they travel with; see tensor_target) into its target, and passes
  //! the others to `load` (empty when every tensor has a target; an update with an unbound
  //! tensor is then refused). Staged (the default), a target is written only after COMMIT
  //! verified everything. Streaming without a mirror, each piece is copied from the link into
  //! its target as it is verified, in one pass over memory: a failed check leaves that piece
  //! written too (update::partial, as any failed streaming update). Targets and transforms do
  //! not combine.
  basic_host_receiver(link& l, std::vector<tensor_target> targets, load_fn load = {}, receiver_options o = {});

  //! The published bytes of wire tensor `name` from the mirror.
  [[nodiscard]] tensor_view tensor(std::string_view name) const { return backend().tensor(state(), name); }
};
using receiver = basic_host_receiver<>;
RLPT_EXTERN_TEMPLATE(class basic_host_receiver<>)

} // namespace sync
RLPT_NAMESPACE_END

#if RLPT_HEADER_IMPL()
RLPT_NAMESPACE_BEGIN
namespace sync {
namespace detail {

template <class Tag>
RLPT_INLINE std::span<const std::uint64_t> basic_host_send_backend<Tag>::pack(std::uint64_t b, std::span<std::byte> buf,
                                                                              std::uint64_t, deadline) {
  const auto pieces = m_.pieces(b);
  piece_sums_.assign(pieces.size(), 0);
  std::uint64_t end = 0;
  for (std::size_t j = 0; j < pieces.size(); ++j) {
    const piece& p = pieces[j];
    if (p.bucket_offset > end) std::memset(buf.data() + end, 0, static_cast<std::size_t>(p.bucket_offset - end));
    const auto src = source(p.tensor);
    piece_sums_[j] =
        copy_hash(buf.data() + p.bucket_offset, src.data() + p.tensor_offset, static_cast<std::size_t>(p.nbytes));
    end = p.bucket_offset + p.nbytes;
    if (m_.piece_count(p.tensor) == 1)
      dense_sums_[p.tensor] = piece_sums_[j];
    else
      parts_[p.tensor].push_back(piece_sums_[j]);
  }
  return piece_sums_;
}

template <class Tag>
RLPT_INLINE std::size_t basic_host_send_backend<Tag>::encode_delta(std::span<std::uint64_t> sums, delta_stats& stats,
                                                                   std::uint64_t, deadline) {
  const std::uint64_t max_msg = std::min<std::uint64_t>(m_.bucket_bytes(), link_.info().max_payload);
  delta_encoder enc(std::max<std::uint64_t>(max_msg, delta_header_bytes + 64));
  records_.clear();
  for (std::size_t i = 0; i < m_.size(); ++i) {
    const tensor_entry& t = m_[i];
    const auto now = source(i);
    const std::span<const std::byte> base(snapshot_.data() + m_.packed_offset(i), static_cast<std::size_t>(t.nbytes));
    sums[i] = enc.encode(static_cast<std::uint32_t>(i), now, base, size_of(t.dtype), t.checksum, m_.bucket_bytes(),
                         records_, stats);
  }
  // Messages of whole records (records never straddle messages).
  msgs_.clear();
  std::uint64_t at = 0;
  while (at < records_.size()) {
    std::uint64_t end = at, count = 0;
    while (end < records_.size()) {
      std::uint64_t body;
      std::memcpy(&body, records_.data() + end + 40, 8);
      const std::uint64_t rec = delta_header_bytes + body;
      if (end > at && end + rec - at > max_msg) break;
      end += rec;
      ++count;
    }
    msgs_.push_back({at, end - at, count});
    at = end;
  }
  return msgs_.size();
}

template <class Tag> RLPT_INLINE void basic_host_send_backend<Tag>::committed(bool delta, deadline) {
  if (!o_.delta) return;
  if (delta) {
    for_each_delta_record(std::span<std::byte>(records_), "sender snapshot", [&](delta_record& rec) {
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

template <class Tag>
RLPT_INLINE void basic_host_receive_backend<Tag>::check_manifest(inflight_state& s, const manifest& m) {
  s.bound.assign(m.size(), nullptr);
  if (targets_.empty()) return;
  s.bound = bind_by_name(
      m, std::span<const tensor_target>(targets_), where_, "target", false,
      [](wire_dtype b, wire_dtype e) { return b == e; }, "a host target takes the wire dtype");
  for (std::size_t i = 0; i < m.size(); ++i) {
    RLPT_CHECK(s.bound[i] != nullptr || load_, errors::sync::unknown_tensor,
               "{}: manifest tensor \"{}\" has no target and this receiver has no load callback", where_, m[i].name);
  }
}

template <class Tag> RLPT_INLINE void basic_host_receive_backend<Tag>::setup(inflight& c, receiver_state& st) {
  const manifest& m = c.m;
  c.be.plan = c.same_layout ? pub_plan_ : transform_plan(m, o_.transforms);
  c.be.sums.assign(m.size(), 0);
  if (c.delta) return;
  if (o_.mode == apply_mode::staged) {
    // The area of the last finished update (the mirror before the last commit, or the
    // staging area of a failed one): never the published mirror, which stays readable.
    c.be.staging = std::move(spare_);
    c.be.staging.resize(static_cast<std::size_t>(m.packed_bytes()));
    return;
  }
  if (o_.mirror && (!c.same_layout || mirror_.size() != m.packed_bytes())) {
    mirror_ = byte_buffer(static_cast<std::size_t>(m.packed_bytes()));
    st.has = false; // the old version's bytes are gone
  }
  c.be.pieces_left.resize(m.size());
  for (std::size_t i = 0; i < m.size(); ++i) c.be.pieces_left[i] = m.piece_count(i);
  c.be.inputs_left.resize(c.be.plan.outputs().size());
  for (std::size_t k = 0; k < c.be.plan.outputs().size(); ++k)
    c.be.inputs_left[k] = c.be.plan.outputs()[k].sources.size();
  c.be.outputs_left.resize(m.size());
  for (std::size_t i = 0; i < m.size(); ++i) c.be.outputs_left[i] = c.be.plan.outputs_of(i).size();
  c.be.avail.assign(m.size(), {});
}

template <class Tag>
RLPT_INLINE void basic_host_receive_backend<Tag>::bucket(inflight& c, const frame& f,
                                                         std::span<const std::byte> payload, receiver_state& st) {
  const manifest& m = c.m;
  const std::uint64_t b = f.index;
  const auto pieces = m.pieces(b);
  const bool streaming = o_.mode == apply_mode::streaming;
  std::byte* arena = streaming ? (o_.mirror ? mirror_.data() : nullptr) : c.be.staging.data();
  // Verify (and copy) every piece before anything of this bucket is used. Without an arena
  // (streaming, no mirror) a bound target is written as its pieces are verified, in one pass
  // (the update is partial from then on), and the load callback reads the link's slot: see
  // docs/sync.md.
  for (std::size_t j = 0; j < pieces.size(); ++j) {
    const piece& p = pieces[j];
    const std::byte* src = payload.data() + p.bucket_offset;
    const auto n = static_cast<std::size_t>(p.nbytes);
    std::byte* into = arena ? arena + m.bucket_packed_offset(b) + p.bucket_offset : nullptr;
    if (!arena && c.be.bound[p.tensor] != nullptr) {
      into = c.be.target(p.tensor) + p.tensor_offset;
      c.partial = true;
    }
    const std::uint64_t got = into ? copy_hash(into, src, n) : xxh3(src, n);
    const std::uint64_t want = body_u64(f.body, j);
    if (got != want) {
      if (streaming && o_.mirror) st.torn = true;
      RLPT_FAIL(
          errors::sync::checksum,
          "{}: bucket {} of version {}: piece {} (tensor \"{}\", bytes [{}, {})) has checksum {}, the sender's is {}",
          where_, b, f.version, j, m[p.tensor].name, p.tensor_offset, p.tensor_offset + p.nbytes, to_hex(got),
          to_hex(want));
    }
    if (m.piece_count(p.tensor) == 1)
      c.be.sums[p.tensor] = got;
    else
      c.be.parts[p.tensor].push_back(got);
  }
  if (streaming && o_.mirror) st.torn = true; // until the commit succeeds
  if (streaming) stream_bucket(c, b, payload);
}

template <class Tag>
RLPT_INLINE void basic_host_receive_backend<Tag>::delta_chunk(inflight& c, const frame& f,
                                                              std::span<const std::byte> payload, receiver_state&) {
  RLPT_CHECK(f.body.size() == 8 && payload.size() % 8 == 0, errors::sync::protocol,
             "{}: delta chunk {} of version {} is malformed ({} body bytes, {} payload bytes)", where_, f.index,
             f.version, f.body.size(), payload.size());
  // Copy first, then check the copy: the records kept are the bytes verified, whatever the
  // link's slot holds afterwards (a shared-memory slot another process may write into).
  auto& records = c.be.records;
  const std::size_t at = records.size();
  records.resize(at + payload.size());
  const std::uint64_t got = copy_hash(records.data() + at, payload.data(), payload.size());
  const std::uint64_t want = body_u64(f.body, 0);
  if (got != want) {
    records.resize(at);
    RLPT_FAIL(errors::sync::checksum, "{}: delta chunk {} of version {} has checksum {}, the sender's is {}", where_,
              f.index, f.version, to_hex(got), to_hex(want));
  }
}

template <class Tag>
RLPT_INLINE void basic_host_receive_backend<Tag>::commit_dense(inflight& c, const frame& f,
                                                               std::span<const std::uint64_t> want, receiver_state&) {
  const manifest& m = c.m;
  for (auto& [t, v] : c.be.parts) c.be.sums[t] = combine_piece_checksums(v);
  for (std::size_t i = 0; i < m.size(); ++i)
    RLPT_CHECK(c.be.sums[i] == want[i], errors::sync::checksum,
               "{}: version {}: tensor \"{}\" arrived with checksum {}, the sender's is {}", where_, f.version,
               m[i].name, to_hex(c.be.sums[i]), to_hex(want[i]));
  if (o_.mode != apply_mode::staged) return;
  const std::byte* arena = c.be.staging.data();
  for (std::size_t k = 0; k < c.be.plan.outputs().size(); ++k) {
    c.be.avail.assign(m.size(), {});
    for (std::size_t t : c.be.plan.outputs()[k].sources)
      c.be.avail[t] = {arena + m.packed_offset(t), static_cast<std::size_t>(m[t].nbytes)};
    run_output(c, k);
  }
  if (o_.mirror) std::swap(mirror_, c.be.staging); // the old mirror is the next staging area
  spare_ = std::move(c.be.staging);
}

template <class Tag>
RLPT_INLINE void basic_host_receive_backend<Tag>::commit_delta(inflight& c, const frame& f,
                                                               std::span<const std::uint64_t> want,
                                                               receiver_state& st) {
  const manifest& m = c.m;
  struct applied {
    delta_record rec;
    std::span<std::byte> range;
  };
  std::vector<applied> recs;
  std::vector<char> touched(m.size(), 0);
  for_each_delta_record(std::span<std::byte>(c.be.records), rlpt::detail::format("{} version {}", where_, f.version),
                        [&](delta_record& r) {
                          const tensor_entry& t = check_delta_target(m, r, st, where_, f.version);
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
      st.require_dense(rlpt::detail::format("delta version {} failed verification here", f.version));
      const std::uint64_t base = tensor_checksum(bytes, m[i].nbytes, m.bucket_bytes());
      if (base != st.pub[i].checksum)
        RLPT_FAIL(
            errors::sync::base_mismatch,
            "{}: after applying delta version {}, tensor \"{}\" has checksum {}, the sender's is {}; rolled back to "
            "version {}, whose copy here is damaged (tensor \"{}\" has checksum {}, published as {}): send a dense "
            "update",
            where_, f.version, m[i].name, to_hex(got), to_hex(want[i]), st.version, m[i].name, to_hex(base),
            to_hex(st.pub[i].checksum));
      RLPT_FAIL(
          errors::sync::checksum,
          "{}: after applying delta version {}, tensor \"{}\" has checksum {}, the sender's is {}; rolled back to "
          "version {}",
          where_, f.version, m[i].name, to_hex(got), to_hex(want[i]), st.version);
    }
  }
  std::vector<char> out_needed(c.be.plan.outputs().size(), 0);
  for (std::size_t i = 0; i < m.size(); ++i)
    if (touched[i])
      for (std::size_t k : c.be.plan.outputs_of(i)) out_needed[k] = 1;
  c.be.avail.resize(m.size());
  for (std::size_t i = 0; i < m.size(); ++i)
    c.be.avail[i] = {mirror_.data() + m.packed_offset(i), static_cast<std::size_t>(m[i].nbytes)};
  try {
    for (std::size_t k = 0; k < out_needed.size(); ++k)
      if (out_needed[k]) run_output(c, k);
  } catch (...) {
    undo(); // the mirror stays at the published version; the engine may hold a mix (partial)
    throw;
  }
}

template <class Tag>
RLPT_INLINE tensor_view basic_host_receive_backend<Tag>::tensor(const receiver_state& st, std::string_view name) const {
  RLPT_CHECK(st.has && o_.mirror, errors::sync::no_version, "{}: no published version to read (mirror {})", where_,
             o_.mirror ? "on" : "off");
  RLPT_CHECK(!st.torn, errors::sync::torn, "{}: the mirror was partly overwritten by a failed streaming update",
             where_);
  const auto i = st.pub.find(name);
  RLPT_CHECK(i.has_value(), errors::sync::unknown_tensor, "{}: version {} has no tensor \"{}\"", where_, st.version,
             name);
  const tensor_entry& t = st.pub[*i];
  return {t.name, t.dtype, t.shape, {mirror_.data() + st.pub.packed_offset(*i), static_cast<std::size_t>(t.nbytes)}};
}

template <class Tag>
RLPT_INLINE void basic_host_receive_backend<Tag>::stream_bucket(inflight& c, std::uint64_t b,
                                                                std::span<const std::byte> payload) {
  const manifest& m = c.m;
  auto& s = c.be;
  std::vector<std::size_t> completed;
  for (const piece& p : m.pieces(b)) {
    const std::size_t t = p.tensor;
    if (o_.mirror || s.bound[t] != nullptr) { // the bytes are in the mirror, or already in place
      if (--s.pieces_left[t] == 0) {
        std::byte* at = o_.mirror ? mirror_.data() + m.packed_offset(t) : s.target(t);
        s.avail[t] = {at, static_cast<std::size_t>(m[t].nbytes)};
        completed.push_back(t);
      }
    } else if (m.piece_count(t) == 1) {
      s.pieces_left[t] = 0;
      s.avail[t] = payload.subspan(p.bucket_offset, static_cast<std::size_t>(p.nbytes));
      completed.push_back(t);
    } else {
      auto& buf = s.held[t];
      if (buf.empty()) buf.resize(static_cast<std::size_t>(m[t].nbytes));
      std::memcpy(buf.data() + p.tensor_offset, payload.data() + p.bucket_offset, static_cast<std::size_t>(p.nbytes));
      if (--s.pieces_left[t] == 0) {
        s.avail[t] = buf;
        completed.push_back(t);
      }
    }
  }
  for (std::size_t t : completed)
    for (std::size_t k : s.plan.outputs_of(t))
      if (--s.inputs_left[k] == 0) run_output(c, k, true);
  // Sources still needed by later outputs must outlive this bucket's slot.
  for (std::size_t t : completed) {
    if (s.outputs_left[t] == 0) {
      s.held.erase(t);
      s.avail[t] = {};
    } else if (!o_.mirror && m.piece_count(t) == 1) {
      auto& buf = s.held[t];
      buf.assign(s.avail[t].begin(), s.avail[t].end());
      s.avail[t] = buf;
    }
  }
}

template <class Tag>
RLPT_INLINE void basic_host_receive_backend<Tag>::run_output(inflight& c, std::size_t k, bool streaming) {
  const auto& out = c.be.plan.outputs()[k];
  c.partial = true;
  if (out.sources.size() == 1 && c.be.bound[out.sources[0]] != nullptr) { // no transforms: the wire bytes
    const std::span<const std::byte> from = c.be.avail[out.sources[0]];
    std::byte* to = c.be.target(out.sources[0]);
    if (from.data() != to && !from.empty()) rlpt::detail::copy_bytes(to, from.data(), from.size());
    ++c.loaded;
    if (streaming) --c.be.outputs_left[out.sources[0]];
    return;
  }
  try {
    c.be.plan.run(
        k, [&](std::size_t t) { return c.be.avail[t]; }, load_);
  } catch (const error&) {
    throw;
  } catch (const std::exception& e) {
    RLPT_FAIL(errors::sync::load_failed, "{}: the load callback threw for \"{}\" of version {}: {}", where_, out.name,
              c.version, e.what());
  }
  ++c.loaded;
  if (streaming)
    for (std::size_t t : out.sources) --c.be.outputs_left[t];
}

} // namespace detail

template <class Tag>
RLPT_INLINE basic_host_sender<Tag>::basic_host_sender(link& l, manifest m, std::span<const tensor_ref> params,
                                                      sender_options o)
    : basic_host_sender(l, bind(std::move(m), params), o) {}

template <class Tag>
RLPT_INLINE basic_host_sender<Tag>::basic_host_sender(link& l, manifest m, source_fn source, sender_options o)
    : basic_sender(l, std::move(m), o, std::move(source)) {}

template <class Tag>
RLPT_INLINE basic_host_sender<Tag>::basic_host_sender(link& l, bound b, sender_options o)
    : basic_sender(l, std::move(b.m), o, std::move(b.src)) {}

template <class Tag>
RLPT_INLINE typename basic_host_sender<Tag>::bound basic_host_sender<Tag>::bind(manifest m,
                                                                                std::span<const tensor_ref> params) {
  std::vector<const void*> ptrs(m.size(), nullptr);
  std::vector<std::uint64_t> sizes(m.size());
  for (const auto& p : params) {
    const auto i = m.find(p.name);
    RLPT_CHECK(i.has_value(), errors::sync::bad_source, "parameter \"{}\" is not in the manifest", p.name);
    const tensor_entry& e = m[*i];
    RLPT_CHECK(p.dtype == e.dtype && p.shape == e.shape, errors::sync::bad_source,
               "parameter \"{}\" is {} [{}] but the manifest says {} [{}]", p.name, p.dtype,
               rlpt::detail::joined(p.shape, ", "), e.dtype, rlpt::detail::joined(e.shape, ", "));
    RLPT_CHECK(p.data != nullptr || e.nbytes == 0, errors::sync::bad_source, "parameter \"{}\" has no data", p.name);
    ptrs[*i] = p.data;
  }
  for (std::size_t i = 0; i < m.size(); ++i) {
    RLPT_CHECK(ptrs[i] != nullptr || m[i].nbytes == 0, errors::sync::bad_source,
               "manifest tensor \"{}\" has no parameter", m[i].name);
    sizes[i] = m[i].nbytes;
  }
  source_fn src = [ptrs = std::move(ptrs), sizes = std::move(sizes)](std::size_t i) {
    return std::span<const std::byte>(static_cast<const std::byte*>(ptrs[i]), static_cast<std::size_t>(sizes[i]));
  };
  return {std::move(m), std::move(src)};
}

template <class Tag>
RLPT_INLINE basic_host_receiver<Tag>::basic_host_receiver(link& l, load_fn load, receiver_options o)
    : basic_receiver(l, std::move(o), std::move(load)) {}

template <class Tag>
RLPT_INLINE basic_host_receiver<Tag>::basic_host_receiver(link& l, std::vector<tensor_target> targets, load_fn load,
                                                          receiver_options o)
    : basic_receiver(l, std::move(o), std::move(load), std::move(targets)) {}

} // namespace sync
RLPT_NAMESPACE_END
#endif // RLPT_HEADER_IMPL()
