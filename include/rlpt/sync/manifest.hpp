// SPDX-License-Identifier: Apache-2.0
//! @file
//! The manifest: which tensors an update carries and where each one lies in the buckets.
//!
//! Every tensor has `{name, dtype, shape, bucket, offset, nbytes, checksum}`. A tensor that
//! fits a bucket lies in bucket `bucket` at byte `offset`; a tensor larger than a bucket starts
//! at offset 0 of bucket `bucket` and fills consecutive buckets (piece k holds bytes
//! [k*B, min((k+1)*B, nbytes))). The layout (everything but the checksums and versions) has a
//! hash: XXH3-64 of its canonical JSON, so both sides can check they agree on the packing
//! before a byte moves (the nccl-m2n `manifest_hash` idea). The manifest also carries the
//! update's version, base version and per-tensor checksums, and serialises to strict JSON.
//!
//! Checksum of a tensor: XXH3-64 of its bytes; for a tensor split over k buckets, XXH3-64 of
//! the k little-endian XXH3-64 piece checksums (each piece is verified as its bucket arrives).
#pragma once

#include <rlpt/config.hpp>
#include <rlpt/core/error.hpp>
#include <rlpt/core/format.hpp>
#include <rlpt/sync/checksum.hpp>
#include <rlpt/sync/detail/json.hpp>
#include <rlpt/sync/dtype.hpp>

#include <fmt/core.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <numeric>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

RLPT_NAMESPACE_BEGIN
namespace sync {

//! A named tensor in caller memory (host): what the trainer hands to plan() and sender.
struct tensor_ref {
  std::string name{};
  wire_dtype dtype = wire_dtype::f32;
  std::vector<std::int64_t> shape{};
  const void* data = nullptr; //!< host bytes, row-major; not read by plan()
};

//! A tensor a host receiver writes into: the engine's parameter, by manifest name, with the
//! dtype and shape it travels with. Its memory must stay valid while the receiver lives.
struct tensor_target {
  std::string name{};
  wire_dtype dtype = wire_dtype::f32;
  std::vector<std::int64_t> shape{};
  void* data = nullptr; //!< host bytes, row-major, writable
};

//! One tensor of a manifest.
struct tensor_entry {
  std::string name{};
  wire_dtype dtype = wire_dtype::f32;
  std::vector<std::int64_t> shape{};
  std::uint64_t bucket = 0;   //!< first bucket holding the tensor
  std::uint64_t offset = 0;   //!< byte offset in that bucket (0 for split tensors)
  std::uint64_t nbytes = 0;   //!< numel x element size
  std::uint64_t checksum = 0; //!< see the file comment; 0 until the sender fills it

  [[nodiscard]] std::uint64_t numel() const noexcept {
    std::uint64_t n = 1;
    for (auto d : shape) n *= static_cast<std::uint64_t>(d);
    return n;
  }
};

//! A contiguous run of one tensor's bytes inside one bucket.
struct piece {
  std::uint32_t tensor = 0;        //!< index into manifest::tensors()
  std::uint64_t tensor_offset = 0; //!< byte offset within the tensor
  std::uint64_t bucket_offset = 0; //!< byte offset within the bucket
  std::uint64_t nbytes = 0;
};

//! Upper bounds applied when a manifest is built or parsed (hostile input cannot make rlpt
//! allocate per-bucket tables without limit). The tables take about 80 bytes per piece, and a
//! few hundred bytes of JSON can claim one tensor split into max_pieces pieces: 2^22 pieces
//! (about 340 MB) is far above real models (a 1T-parameter MoE checkpoint has ~10^5 tensors;
//! with 64 MiB buckets, ~10^5 pieces) and keeps what a hostile manifest can make a receiver
//! allocate bounded.
struct manifest_limits {
  std::uint64_t max_tensors = std::uint64_t{1} << 22;
  std::uint64_t max_pieces = std::uint64_t{1} << 22;
  std::uint64_t max_rank = 16;
};

namespace detail {

inline bool mul_overflows(std::uint64_t a, std::uint64_t b, std::uint64_t& out) noexcept {
  return __builtin_mul_overflow(a, b, &out);
}
inline bool add_overflows(std::uint64_t a, std::uint64_t b, std::uint64_t& out) noexcept {
  return __builtin_add_overflow(a, b, &out);
}

//! Bytes of a tensor of `shape` and `dt`, validated (no negative dims, no overflow).
RLPT_DEFER std::uint64_t tensor_nbytes(std::string_view name, wire_dtype dt, std::span<const std::int64_t> shape,
                                       std::uint64_t max_rank = 16);

inline std::uint64_t le64(const std::byte* p) noexcept {
  std::uint64_t v;
  std::memcpy(&v, p, 8);
  return v; // rlpt's wire formats are little-endian; x86-64 and aarch64 Linux are too
}
inline void put_le64(std::byte* p, std::uint64_t v) noexcept { std::memcpy(p, &v, 8); }

} // namespace detail

//! Checksum of a whole tensor held contiguously (see the file comment for split tensors).
[[nodiscard]] inline std::uint64_t tensor_checksum(const void* bytes, std::uint64_t nbytes,
                                                   std::uint64_t bucket_bytes) {
  if (nbytes <= bucket_bytes) return xxh3(bytes, static_cast<std::size_t>(nbytes));
  std::vector<std::uint64_t> parts;
  const auto* p = static_cast<const unsigned char*>(bytes);
  for (std::uint64_t off = 0; off < nbytes; off += bucket_bytes)
    parts.push_back(xxh3(p + off, static_cast<std::size_t>(std::min(bucket_bytes, nbytes - off))));
  return xxh3(parts.data(), parts.size() * 8);
}

//! Combines the piece checksums of a split tensor into its checksum.
[[nodiscard]] inline std::uint64_t combine_piece_checksums(std::span<const std::uint64_t> parts) noexcept {
  return xxh3(parts.data(), parts.size() * 8);
}

template <class = void> class basic_manifest {
public:
  basic_manifest() = default;

  //! Builds and validates a manifest from explicit entries.
  basic_manifest(std::vector<tensor_entry> tensors, std::uint64_t bucket_bytes, std::uint64_t alignment,
                 manifest_limits limits = {})
      : bucket_bytes_(bucket_bytes), alignment_(alignment), tensors_(std::move(tensors)) {
    index(limits);
  }

  [[nodiscard]] std::uint64_t version() const noexcept { return version_; }
  [[nodiscard]] std::uint64_t base_version() const noexcept { return base_version_; }
  void set_versions(std::uint64_t version, std::uint64_t base_version) noexcept {
    version_ = version;
    base_version_ = base_version;
  }

  [[nodiscard]] std::uint64_t bucket_bytes() const noexcept { return bucket_bytes_; }
  [[nodiscard]] std::uint64_t alignment() const noexcept { return alignment_; }
  [[nodiscard]] std::span<const tensor_entry> tensors() const noexcept { return tensors_; }
  [[nodiscard]] std::size_t size() const noexcept { return tensors_.size(); }
  [[nodiscard]] const tensor_entry& operator[](std::size_t i) const noexcept { return tensors_[i]; }

  void set_checksum(std::size_t i, std::uint64_t c) noexcept { tensors_[i].checksum = c; }
  void clear_checksums() noexcept {
    for (auto& t : tensors_) t.checksum = 0;
  }

  //! Index of the tensor called `name`.
  [[nodiscard]] std::optional<std::size_t> find(std::string_view name) const {
    const auto it = by_name_.find(std::string(name));
    if (it == by_name_.end()) return std::nullopt;
    return it->second;
  }

  [[nodiscard]] std::uint64_t bucket_count() const noexcept { return bucket_used_.size(); }
  //! Bytes of bucket b that carry data (its last piece's end).
  [[nodiscard]] std::uint64_t bucket_size(std::uint64_t b) const noexcept { return bucket_used_[b]; }
  //! Pieces of bucket b in offset order.
  [[nodiscard]] std::span<const piece> pieces(std::uint64_t b) const noexcept {
    return std::span<const piece>(pieces_).subspan(piece_begin_[b], piece_begin_[b + 1] - piece_begin_[b]);
  }
  //! Number of pieces tensor i has (1 unless split).
  [[nodiscard]] std::uint64_t piece_count(std::size_t i) const noexcept {
    const auto& t = tensors_[i];
    return t.nbytes <= bucket_bytes_ ? 1 : (t.nbytes + bucket_bytes_ - 1) / bucket_bytes_;
  }

  //! Packed layout: the buckets' used bytes back to back. Split tensors are contiguous in it
  //! (all their buckets but the last are full), so every tensor is one range.
  [[nodiscard]] std::uint64_t packed_bytes() const noexcept { return packed_total_; }
  [[nodiscard]] std::uint64_t bucket_packed_offset(std::uint64_t b) const noexcept { return bucket_start_[b]; }
  [[nodiscard]] std::uint64_t packed_offset(std::size_t i) const noexcept {
    return bucket_start_[tensors_[i].bucket] + tensors_[i].offset;
  }
  //! Sum of the tensors' bytes (without alignment padding).
  [[nodiscard]] std::uint64_t payload_bytes() const noexcept { return payload_total_; }

  //! XXH3-64 of the canonical layout JSON (no versions, no checksums): equal layouts, equal hash.
  [[nodiscard]] std::uint64_t layout_hash() const noexcept { return layout_hash_; }

  //! True when both describe the same packing.
  [[nodiscard]] bool same_layout(const basic_manifest& o) const noexcept {
    return layout_hash_ == o.layout_hash_ && layout_json() == o.layout_json();
  }

  //! Canonical JSON of the layout alone (the input of layout_hash()).
  [[nodiscard]] std::string layout_json() const { return detail::to_json_string(to_json_value(false)); }

  //! Full JSON: format tag, versions, layout, layout hash and checksums.
  [[nodiscard]] std::string to_json() const { return detail::to_json_string(to_json_value(true)); }

  [[nodiscard]] detail::json to_json_value(bool with_state) const;

  //! Parses and validates JSON written by to_json(). The layout hash must match the layout.
  [[nodiscard]] static basic_manifest from_json(std::string_view text, manifest_limits limits = {}) {
    return from_json_value(detail::parse_json(text, "manifest"), limits);
  }

  [[nodiscard]] static basic_manifest from_json_value(const detail::json& root, manifest_limits limits = {});

private:
  void index(const manifest_limits& limits);

  std::uint64_t version_ = 0;
  std::uint64_t base_version_ = 0;
  std::uint64_t bucket_bytes_ = 0;
  std::uint64_t alignment_ = 1;
  std::vector<tensor_entry> tensors_;
  std::unordered_map<std::string, std::size_t> by_name_;
  std::vector<piece> pieces_;
  std::vector<std::size_t> piece_begin_;
  std::vector<std::uint64_t> bucket_used_;
  std::vector<std::uint64_t> bucket_start_;
  std::uint64_t packed_total_ = 0;
  std::uint64_t payload_total_ = 0;
  std::uint64_t layout_hash_ = 0;
};
using manifest = basic_manifest<>;
RLPT_EXTERN_TEMPLATE(class basic_manifest<>)

namespace detail {

//! Matches tensors bound by name (sources or targets: any type with name, dtype, shape and data)
//! to the entries of `m`; one pointer (or null) per manifest tensor. Checks that each is in the
//! manifest once, its shape, its dtype (`converts(bound, wire)`; `no_convert` says what does),
//! its data and the alignment of its elements; `what` names them in errors.
template <class T, class Converts>
std::vector<const T*> bind_by_name(const manifest& m, std::span<const T> bound, std::string_view where,
                                   std::string_view what, bool all_required, Converts converts,
                                   std::string_view no_convert) {
  std::vector<const T*> by(m.size(), nullptr);
  for (const auto& b : bound) {
    const auto i = m.find(b.name);
    RLPT_CHECK(i.has_value(), errors::sync::unknown_tensor, "{}: {} \"{}\" is not in the manifest", where, what,
               b.name);
    RLPT_CHECK(by[*i] == nullptr, errors::sync::bad_source, "{}: {} \"{}\" is bound twice", where, what, b.name);
    const tensor_entry& e = m[*i];
    RLPT_CHECK(b.shape == e.shape, errors::sync::bad_source, "{}: {} \"{}\" has shape [{}], the manifest says [{}]",
               where, what, b.name, rlpt::detail::joined(b.shape, ", "), rlpt::detail::joined(e.shape, ", "));
    RLPT_CHECK(converts(b.dtype, e.dtype), errors::sync::bad_source, "{}: {} \"{}\" is {} but travels as {}; {}", where,
               what, b.name, b.dtype, e.dtype, no_convert);
    RLPT_CHECK(b.data != nullptr || e.nbytes == 0, errors::sync::bad_source, "{}: {} \"{}\" has no data", where, what,
               b.name);
    RLPT_CHECK(reinterpret_cast<std::uintptr_t>(b.data) % size_of(b.dtype) == 0, errors::sync::bad_source,
               "{}: {} \"{}\" at {} is not aligned to its {}-byte elements", where, what, b.name,
               static_cast<const void*>(b.data), size_of(b.dtype));
    by[*i] = &b;
  }
  if (all_required)
    for (std::size_t i = 0; i < m.size(); ++i)
      RLPT_CHECK(by[i] != nullptr || m[i].nbytes == 0, errors::sync::bad_source, "{}: manifest tensor \"{}\" has no {}",
                 where, m[i].name, what);
  return by;
}

} // namespace detail

} // namespace sync
RLPT_NAMESPACE_END

#if RLPT_HEADER_IMPL()
RLPT_NAMESPACE_BEGIN
namespace sync::detail {

RLPT_DEFER RLPT_INLINE std::uint64_t tensor_nbytes(std::string_view name, wire_dtype dt,
                                                   std::span<const std::int64_t> shape, std::uint64_t max_rank) {
  RLPT_CHECK(shape.size() <= max_rank, errors::sync::bad_shape, "tensor \"{}\" has rank {}, more than the limit {}",
             name, shape.size(), max_rank);
  std::uint64_t n = size_of(dt);
  for (auto d : shape) {
    RLPT_CHECK(d >= 0, errors::sync::bad_shape, "tensor \"{}\" has a negative dimension {} in shape [{}]", name, d,
               rlpt::detail::joined(shape, ", "));
    RLPT_CHECK(!mul_overflows(n, static_cast<std::uint64_t>(d), n), errors::sync::bad_shape,
               "tensor \"{}\" of shape [{}] has more bytes than 2^64", name, rlpt::detail::joined(shape, ", "));
  }
  return n;
}

} // namespace sync::detail

namespace sync {

template <class Tag> RLPT_INLINE detail::json basic_manifest<Tag>::to_json_value(bool with_state) const {
  using detail::json;
  json root = json::make_object();
  if (with_state) {
    root.set("format", json::make_string("rlpt.sync.manifest/1"));
    root.set("version", json::make_uint(version_));
    root.set("base_version", json::make_uint(base_version_));
  }
  root.set("bucket_bytes", json::make_uint(bucket_bytes_));
  root.set("alignment", json::make_uint(alignment_));
  if (with_state) root.set("layout_hash", json::make_string(to_hex(layout_hash_)));
  json arr = json::make_array();
  for (const auto& t : tensors_) {
    json e = json::make_object();
    e.set("name", json::make_string(t.name));
    e.set("dtype", json::make_string(std::string(name(t.dtype))));
    json shape = json::make_array();
    for (auto d : t.shape) shape.push(json::make_int(d));
    e.set("shape", std::move(shape));
    e.set("bucket", json::make_uint(t.bucket));
    e.set("offset", json::make_uint(t.offset));
    e.set("nbytes", json::make_uint(t.nbytes));
    if (with_state) e.set("checksum", json::make_string(to_hex(t.checksum)));
    arr.push(std::move(e));
  }
  root.set("tensors", std::move(arr));
  return root;
}

template <class Tag>
RLPT_INLINE basic_manifest<Tag> basic_manifest<Tag>::from_json_value(const detail::json& root, manifest_limits limits) {
  using detail::json;
  auto fail = [](std::string_view what) -> void { RLPT_FAIL(errors::sync::bad_manifest, "manifest JSON: {}", what); };
  if (!root.is_object()) fail("the document is not an object");
  static constexpr std::string_view top_keys[] = {"format",    "version",     "base_version", "bucket_bytes",
                                                  "alignment", "layout_hash", "tensors"};
  for (const auto& k : root.keys())
    RLPT_CHECK(std::find(std::begin(top_keys), std::end(top_keys), k) != std::end(top_keys), errors::sync::bad_manifest,
               "manifest JSON: unknown key \"{}\"", k);
  auto member = [&](const json& obj, std::string_view key, std::string_view where) -> const json& {
    const json* v = obj.find(key);
    RLPT_CHECK(v != nullptr, errors::sync::bad_manifest, "manifest JSON: {} lacks \"{}\"", where, key);
    return *v;
  };
  auto uint_of = [&](const json& obj, std::string_view key, std::string_view where) {
    std::uint64_t v = 0;
    RLPT_CHECK(member(obj, key, where).to_uint(v), errors::sync::bad_manifest,
               "manifest JSON: \"{}\" of {} is not an unsigned integer", key, where);
    return v;
  };
  const json& format = member(root, "format", "the document");
  RLPT_CHECK(format.is_string() && format.text() == "rlpt.sync.manifest/1", errors::sync::bad_manifest,
             "manifest JSON: format is not \"rlpt.sync.manifest/1\"");
  const std::uint64_t version = uint_of(root, "version", "the document");
  const std::uint64_t base = uint_of(root, "base_version", "the document");
  const std::uint64_t bucket_bytes = uint_of(root, "bucket_bytes", "the document");
  const std::uint64_t alignment = uint_of(root, "alignment", "the document");
  const json& hash = member(root, "layout_hash", "the document");
  const auto want_hash = hash.is_string() ? parse_hex(hash.text()) : std::nullopt;
  RLPT_CHECK(want_hash.has_value(), errors::sync::bad_manifest, "manifest JSON: layout_hash is not 16 hex digits");
  const json& arr = member(root, "tensors", "the document");
  if (!arr.is_array()) fail("\"tensors\" is not an array");
  RLPT_CHECK(arr.size() <= limits.max_tensors, errors::sync::bad_manifest,
             "manifest JSON lists {} tensors, more than the limit {}", arr.size(), limits.max_tensors);
  std::vector<tensor_entry> entries;
  entries.reserve(arr.size());
  static constexpr std::string_view entry_keys[] = {"name", "dtype", "shape", "bucket", "offset", "nbytes", "checksum"};
  for (std::size_t i = 0; i < arr.size(); ++i) {
    const json& e = arr.items()[i];
    const std::string where = rlpt::detail::format("tensor #{}", i);
    RLPT_CHECK(e.is_object(), errors::sync::bad_manifest, "manifest JSON: {} is not an object", where);
    for (const auto& k : e.keys())
      RLPT_CHECK(std::find(std::begin(entry_keys), std::end(entry_keys), k) != std::end(entry_keys),
                 errors::sync::bad_manifest, "manifest JSON: {} has an unknown key \"{}\"", where, k);
    tensor_entry t;
    const json& nm = member(e, "name", where);
    RLPT_CHECK(nm.is_string(), errors::sync::bad_manifest, "manifest JSON: the name of {} is not a string", where);
    t.name = nm.text();
    const json& dt = member(e, "dtype", where);
    const auto parsed = dt.is_string() ? parse_wire_dtype(dt.text()) : std::nullopt;
    RLPT_CHECK(parsed.has_value(), errors::sync::bad_manifest, "manifest JSON: {} (\"{}\") has an unsupported dtype {}",
               where, t.name, dt.is_string() ? dt.text() : std::string("(not a string)"));
    t.dtype = *parsed;
    const json& shape = member(e, "shape", where);
    RLPT_CHECK(shape.is_array() && shape.size() <= limits.max_rank, errors::sync::bad_manifest,
               "manifest JSON: the shape of {} (\"{}\") is not an array of at most {} dimensions", where, t.name,
               limits.max_rank);
    for (const auto& d : shape.items()) {
      std::int64_t v = 0;
      RLPT_CHECK(d.to_int(v), errors::sync::bad_manifest, "manifest JSON: the shape of {} (\"{}\") has a non-integer",
                 where, t.name);
      t.shape.push_back(v);
    }
    t.bucket = uint_of(e, "bucket", where);
    t.offset = uint_of(e, "offset", where);
    t.nbytes = uint_of(e, "nbytes", where);
    const json& ck = member(e, "checksum", where);
    const auto c = ck.is_string() ? parse_hex(ck.text()) : std::nullopt;
    RLPT_CHECK(c.has_value(), errors::sync::bad_manifest,
               "manifest JSON: the checksum of {} (\"{}\") is not 16 hex digits", where, t.name);
    t.checksum = *c;
    entries.push_back(std::move(t));
  }
  basic_manifest m(std::move(entries), bucket_bytes, alignment, limits);
  m.set_versions(version, base);
  RLPT_CHECK(m.layout_hash() == *want_hash, errors::sync::manifest_hash,
             "manifest layout_hash {} does not match its layout, which hashes to {}", to_hex(*want_hash),
             to_hex(m.layout_hash()));
  return m;
}

template <class Tag> RLPT_INLINE void basic_manifest<Tag>::index(const manifest_limits& limits) {
  const std::uint64_t B = bucket_bytes_;
  RLPT_CHECK(B > 0, errors::sync::bad_manifest, "bucket_bytes must be positive, got {}", B);
  RLPT_CHECK(alignment_ > 0 && (alignment_ & (alignment_ - 1)) == 0, errors::sync::bad_manifest,
             "alignment must be a power of two, got {}", alignment_);
  RLPT_CHECK(B % alignment_ == 0, errors::sync::bad_manifest, "bucket_bytes {} is not a multiple of the alignment {}",
             B, alignment_);
  RLPT_CHECK(tensors_.size() <= limits.max_tensors && tensors_.size() < std::numeric_limits<std::uint32_t>::max(),
             errors::sync::bad_manifest, "{} tensors, more than the limit {}", tensors_.size(), limits.max_tensors);
  by_name_.clear();
  by_name_.reserve(tensors_.size());
  std::uint64_t total_pieces = 0;
  std::uint64_t last_bucket = 0;
  payload_total_ = 0;
  struct span_t {
    std::uint64_t start, end;
    std::size_t tensor;
  };
  std::vector<span_t> spans;
  spans.reserve(tensors_.size());
  for (std::size_t i = 0; i < tensors_.size(); ++i) {
    const auto& t = tensors_[i];
    RLPT_CHECK(!t.name.empty(), errors::sync::bad_manifest, "tensor #{} has an empty name", i);
    RLPT_CHECK(by_name_.emplace(t.name, i).second, errors::sync::bad_manifest, "tensor name \"{}\" appears twice",
               t.name);
    const std::uint64_t want = detail::tensor_nbytes(t.name, t.dtype, t.shape, limits.max_rank);
    RLPT_CHECK(t.nbytes == want, errors::sync::bad_manifest, "tensor \"{}\" says nbytes {} but {} [{}] has {} bytes",
               t.name, t.nbytes, name(t.dtype), rlpt::detail::joined(t.shape, ", "), want);
    const std::uint64_t pieces = t.nbytes <= B ? 1 : (t.nbytes + B - 1) / B;
    if (t.nbytes <= B) {
      RLPT_CHECK(t.offset % alignment_ == 0 && t.offset < B && t.nbytes <= B - t.offset, errors::sync::bad_manifest,
                 "tensor \"{}\" at offset {} with {} bytes does not fit an aligned slot of a {}-byte bucket", t.name,
                 t.offset, t.nbytes, B);
    } else {
      RLPT_CHECK(t.offset == 0, errors::sync::bad_manifest,
                 "tensor \"{}\" is split over buckets ({} bytes > {}) and must start at offset 0, not {}", t.name,
                 t.nbytes, B, t.offset);
    }
    std::uint64_t end_bucket = 0, start = 0, end = 0;
    RLPT_CHECK(!detail::add_overflows(t.bucket, pieces - 1, end_bucket) && !detail::mul_overflows(t.bucket, B, start) &&
                   !detail::add_overflows(start, t.offset, start) && !detail::add_overflows(start, t.nbytes, end),
               errors::sync::bad_manifest, "tensor \"{}\" lies beyond 2^64 bytes (bucket {})", t.name, t.bucket);
    RLPT_CHECK(!detail::add_overflows(total_pieces, pieces, total_pieces) && total_pieces <= limits.max_pieces,
               errors::sync::bad_manifest, "the manifest has more than {} bucket pieces", limits.max_pieces);
    last_bucket = std::max(last_bucket, end_bucket);
    payload_total_ += t.nbytes;
    spans.push_back({start, end, i});
  }
  // last_bucket < total_pieces (<= max_pieces) before adding 1: a bucket index of 2^64 - 1
  // must not wrap the count to 0.
  RLPT_CHECK(tensors_.empty() || last_bucket < total_pieces, errors::sync::bad_manifest,
             "the manifest spans {} buckets but has only {} pieces: some buckets would be empty",
             last_bucket == std::numeric_limits<std::uint64_t>::max() ? std::string("2^64")
                                                                      : std::to_string(last_bucket + 1),
             total_pieces);
  const std::uint64_t buckets = tensors_.empty() ? 0 : last_bucket + 1;
  std::sort(spans.begin(), spans.end(),
            [](const span_t& a, const span_t& b) { return a.start != b.start ? a.start < b.start : a.end < b.end; });
  for (std::size_t k = 1; k < spans.size(); ++k)
    RLPT_CHECK(spans[k].start >= spans[k - 1].end, errors::sync::bad_manifest, "tensors \"{}\" and \"{}\" overlap",
               tensors_[spans[k - 1].tensor].name, tensors_[spans[k].tensor].name);

  // Pieces per bucket, in offset order.
  std::vector<std::uint64_t> count(static_cast<std::size_t>(buckets) + 1, 0);
  bucket_used_.assign(static_cast<std::size_t>(buckets), 0);
  for (const auto& s : spans) {
    const auto& t = tensors_[s.tensor];
    const std::uint64_t pieces = t.nbytes <= B ? 1 : (t.nbytes + B - 1) / B;
    for (std::uint64_t k = 0; k < pieces; ++k) ++count[static_cast<std::size_t>(t.bucket + k)];
  }
  piece_begin_.assign(static_cast<std::size_t>(buckets) + 1, 0);
  for (std::size_t b = 0; b < buckets; ++b) {
    RLPT_CHECK(count[b] > 0, errors::sync::bad_manifest, "bucket {} of {} holds no tensor", b, buckets);
    piece_begin_[b + 1] = piece_begin_[b] + static_cast<std::size_t>(count[b]);
  }
  pieces_.assign(static_cast<std::size_t>(total_pieces), piece{});
  std::vector<std::size_t> fill(piece_begin_.begin(), piece_begin_.end() - (buckets ? 1 : 0));
  for (const auto& s : spans) { // spans are in linear order, so pieces land in offset order
    const auto& t = tensors_[s.tensor];
    if (t.nbytes <= B) {
      const auto b = static_cast<std::size_t>(t.bucket);
      pieces_[fill[b]++] = {static_cast<std::uint32_t>(s.tensor), 0, t.offset, t.nbytes};
      bucket_used_[b] = std::max(bucket_used_[b], t.offset + t.nbytes);
    } else {
      for (std::uint64_t k = 0; k * B < t.nbytes; ++k) {
        const auto b = static_cast<std::size_t>(t.bucket + k);
        const std::uint64_t n = std::min(B, t.nbytes - k * B);
        pieces_[fill[b]++] = {static_cast<std::uint32_t>(s.tensor), k * B, 0, n};
        bucket_used_[b] = std::max(bucket_used_[b], n);
      }
    }
  }
  bucket_start_.assign(static_cast<std::size_t>(buckets) + 1, 0);
  for (std::size_t b = 0; b < buckets; ++b) bucket_start_[b + 1] = bucket_start_[b] + bucket_used_[b];
  packed_total_ = buckets ? bucket_start_[static_cast<std::size_t>(buckets)] : 0;
  const std::string layout = layout_json();
  layout_hash_ = xxh3(layout.data(), layout.size());
}

} // namespace sync
RLPT_NAMESPACE_END
#endif // RLPT_HEADER_IMPL()
