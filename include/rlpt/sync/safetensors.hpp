// SPDX-License-Identifier: Apache-2.0
//! @file
//! safetensors files: a reader and writer byte-compatible with Hugging Face safetensors, and
//! a file transport that publishes each version as a safetensors file (atomic rename).
//!
//! Format: u64 little-endian N, N bytes of JSON header (padded with spaces to a multiple of
//! 8), then the data. The header maps each name to {"dtype", "shape", "data_offsets":
//! [begin, end]} (offsets relative to the data), plus an optional flat string map
//! "__metadata__". Like HF's writer, rlpt orders tensors by dtype (widest first) then name,
//! writes "__metadata__" first (keys sorted: HF's own order is a hash map's), and emits
//! compact JSON. The reader enforces HF's rules (header at most 100,000,000 bytes, offsets
//! contiguous from 0 with no gaps or overlap, sizes equal to shape x dtype, no trailing
//! bytes) and rejects unknown dtypes and malformed JSON with rlpt.sync.bad_safetensors.
//!
//! The transport (safetensors_transport) writes dense versions as plain HF files (loadable
//! by `safetensors.torch.load_file`, SGLang's update_weights_from_disk, ...) whose metadata
//! carries the rlpt manifest and checksums; deltas become files of U8 record chunks. The
//! reading side replays a directory as protocol messages, so the same receiver verifies and
//! applies them: the newest dense file, then every delta whose base it holds.
#pragma once

#include <rlpt/config.hpp>
#include <rlpt/core/copy.hpp>
#include <rlpt/core/error.hpp>
#include <rlpt/core/format.hpp>
#include <rlpt/core/file.hpp>
#include <rlpt/sync/checksum.hpp>
#include <rlpt/sync/detail/json.hpp>
#include <rlpt/sync/dtype.hpp>
#include <rlpt/sync/frame.hpp>
#include <rlpt/sync/link.hpp>
#include <rlpt/sync/manifest.hpp>
#include <rlpt/sync/transform.hpp>

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

RLPT_NAMESPACE_BEGIN
namespace sync {

struct safetensors_limits {
  std::uint64_t max_header_bytes = 100'000'000; //!< HF safetensors' MAX_HEADER_SIZE
  std::uint64_t max_tensors = std::uint64_t{1} << 22;
};

//! One tensor of a safetensors header; offsets are relative to the data section.
struct safetensors_entry {
  std::string name{};
  wire_dtype dtype = wire_dtype::f32;
  std::vector<std::int64_t> shape{};
  std::uint64_t begin = 0;
  std::uint64_t end = 0;
};

struct safetensors_header {
  std::vector<std::pair<std::string, std::string>> metadata; //!< "__metadata__", file order
  std::vector<safetensors_entry> tensors;                    //!< offset order
  std::uint64_t header_bytes = 0;                            //!< N
  std::uint64_t data_bytes = 0;

  [[nodiscard]] const safetensors_entry* find(std::string_view name) const noexcept {
    for (const auto& t : tensors)
      if (t.name == name) return &t;
    return nullptr;
  }
  [[nodiscard]] std::optional<std::string_view> meta(std::string_view key) const noexcept {
    for (const auto& [k, v] : metadata)
      if (k == key) return std::string_view(v);
    return std::nullopt;
  }
};

using safetensors_metadata = std::vector<std::pair<std::string, std::string>>;

//! Parses and validates the header of a safetensors file of `file_size` bytes; `prefix` holds
//! at least its first 8 + N bytes. `where` names the file in errors.
RLPT_DEFER [[nodiscard]] safetensors_header parse_safetensors_header(std::span<const std::byte> prefix,
                                                                     std::uint64_t file_size, std::string_view where,
                                                                     safetensors_limits limits = {});

//! Header bytes and data offsets of a file holding `tensors` (name, dtype, shape), in HF's
//! order: dtype widest first, then name.
struct safetensors_layout {
  std::string header;                //!< JSON padded with spaces to a multiple of 8
  std::vector<std::size_t> order;    //!< file order as indices into the input
  std::vector<std::uint64_t> offset; //!< data offset per input tensor
  std::uint64_t data_bytes = 0;
};

template <class T>
[[nodiscard]] safetensors_layout layout_safetensors(std::span<const T> tensors,
                                                    const safetensors_metadata& metadata = {}) {
  safetensors_layout l;
  l.order.resize(tensors.size());
  for (std::size_t i = 0; i < tensors.size(); ++i) l.order[i] = i;
  std::sort(l.order.begin(), l.order.end(), [&](std::size_t a, std::size_t b) {
    if (tensors[a].dtype != tensors[b].dtype) return tensors[a].dtype > tensors[b].dtype;
    return tensors[a].name < tensors[b].name;
  });
  l.offset.assign(tensors.size(), 0);
  std::string& s = l.header;
  s.push_back('{');
  bool first = true;
  if (!metadata.empty()) {
    std::vector<std::pair<std::string, std::string>> sorted(metadata.begin(), metadata.end());
    std::sort(sorted.begin(), sorted.end());
    s += "\"__metadata__\":{";
    for (std::size_t i = 0; i < sorted.size(); ++i) {
      if (i) s.push_back(',');
      detail::write_json_string(s, sorted[i].first);
      s.push_back(':');
      detail::write_json_string(s, sorted[i].second);
    }
    s.push_back('}');
    first = false;
  }
  std::uint64_t at = 0;
  std::vector<std::string_view> seen;
  for (std::size_t i : l.order) {
    const auto& t = tensors[i];
    RLPT_CHECK(t.name != "__metadata__", errors::sync::bad_safetensors, "a tensor cannot be called __metadata__");
    const std::uint64_t n = detail::tensor_nbytes(t.name, t.dtype, t.shape);
    if (!first) s.push_back(',');
    first = false;
    detail::write_json_string(s, t.name);
    s += rlpt::detail::format(":{{\"dtype\":\"{}\",\"shape\":[{}],\"data_offsets\":[{},{}]}}", name(t.dtype),
                              rlpt::detail::joined(t.shape, ","), at, at + n);
    l.offset[i] = at;
    at += n;
    seen.push_back(t.name);
  }
  std::sort(seen.begin(), seen.end());
  const auto dup = std::adjacent_find(seen.begin(), seen.end());
  RLPT_CHECK(dup == seen.end(), errors::sync::bad_safetensors, "tensor name \"{}\" appears twice",
             dup == seen.end() ? std::string_view{} : *dup);
  s.push_back('}');
  s.append((8 - s.size() % 8) % 8, ' ');
  l.data_bytes = at;
  return l;
}

namespace detail {

[[noreturn]] inline void io_fail(std::string_view what, std::string_view where, int err) {
  RLPT_FAIL(errors::sync::io, "{} {}: {}", what, where, std::strerror(err));
}

inline void write_all(int fd, const void* data, std::size_t n, std::uint64_t at, std::string_view where) {
  if (const int err = rlpt::detail::pwrite_all(fd, data, n, at); err != 0) io_fail("cannot write", where, err);
}

} // namespace detail

//! Serialises tensors to safetensors bytes in memory (the bytes HF's `save` produces).
RLPT_DEFER [[nodiscard]] std::vector<std::byte> serialize_safetensors(std::span<const tensor_ref> tensors,
                                                                      const safetensors_metadata& metadata = {});

//! Writes a safetensors file atomically and durably (core/file.hpp's durable_file: temporary
//! file, fsync, rename, directory fsync): readers see the old file or the whole new one.
RLPT_DEFER void write_safetensors(const std::string& path, std::span<const tensor_ref> tensors,
                                  const safetensors_metadata& metadata = {});

//! A safetensors file mapped read-only; tensors are views into the mapping.
template <class = void> class basic_safetensors_file {
public:
  explicit basic_safetensors_file(const std::string& path, safetensors_limits limits = {});
  basic_safetensors_file(const basic_safetensors_file&) = delete;
  basic_safetensors_file& operator=(const basic_safetensors_file&) = delete;
  ~basic_safetensors_file() { unmap(); }

  [[nodiscard]] const safetensors_header& header() const noexcept { return header_; }
  [[nodiscard]] std::span<const std::byte> bytes() const noexcept { return {base_, static_cast<std::size_t>(size_)}; }
  [[nodiscard]] std::span<const std::byte> data() const noexcept {
    return bytes().subspan(static_cast<std::size_t>(8 + header_.header_bytes));
  }

  [[nodiscard]] tensor_view tensor(std::string_view name) const { return view(entry(name)); }
  [[nodiscard]] tensor_view view(const safetensors_entry& e) const {
    return {e.name, e.dtype, e.shape,
            data().subspan(static_cast<std::size_t>(e.begin), static_cast<std::size_t>(e.end - e.begin))};
  }

  //! Copies tensor `e`'s bytes into `dst`, which must hold exactly that many: the way to fill
  //! buffers the caller has just allocated (core/copy.hpp: plain vector stores, about 1.25x
  //! memcpy's speed into fresh pages).
  void read(const safetensors_entry& e, std::span<std::byte> dst) const {
    const std::span<const std::byte> src = view(e).bytes;
    RLPT_CHECK(dst.size() == src.size(), errors::sync::bad_shape,
               "{}: tensor \"{}\" has {} bytes; the destination holds {}", path_, e.name, src.size(), dst.size());
    rlpt::detail::copy_bytes(dst.data(), src.data(), src.size());
  }
  void read(std::string_view name, std::span<std::byte> dst) const { read(entry(name), dst); }

private:
  [[nodiscard]] const safetensors_entry& entry(std::string_view name) const {
    const safetensors_entry* e = header_.find(name);
    RLPT_CHECK(e != nullptr, errors::sync::unknown_tensor, "{}: no tensor \"{}\"", path_, name);
    return *e;
  }
  void unmap() noexcept {
    if (base_ != nullptr) ::munmap(const_cast<std::byte*>(base_), static_cast<std::size_t>(size_));
    base_ = nullptr;
  }

  std::string path_;
  const std::byte* base_ = nullptr;
  std::uint64_t size_ = 0;
  safetensors_header header_;
};
using safetensors_file = basic_safetensors_file<>;
RLPT_EXTERN_TEMPLATE(class basic_safetensors_file<>)

struct safetensors_options {
  //! Sender: delete files older than the newest dense version (a reader needs only that one
  //! and the deltas after it). false keeps every version.
  bool prune = true;
  //! Receiver: how often the directory is rescanned while waiting.
  std::chrono::milliseconds scan_interval{20};
};

//! File transport over a directory: see the file comment. The sending end answers for the
//! files (READY when the directory's latest version is the delta's base, ACK once the file is
//! renamed into place); the receiving end replays files as protocol messages.
template <class = void> class basic_safetensors_transport final : public link {
public:
  basic_safetensors_transport(std::string dir, role r, safetensors_options o = {})
      : dir_(std::move(dir)), role_(r), o_(o) {
    where_ = rlpt::detail::format("safetensors {} ({})", dir_, r == role::sender ? "sender" : "receiver");
    struct stat st {};
    RLPT_CHECK(::stat(dir_.c_str(), &st) == 0 && S_ISDIR(st.st_mode), errors::sync::io, "{}: not a directory", where_);
  }
  basic_safetensors_transport(const basic_safetensors_transport&) = delete;
  basic_safetensors_transport& operator=(const basic_safetensors_transport&) = delete;
  ~basic_safetensors_transport() override { abandon_tmp(); }

  [[nodiscard]] link_info info() const override { return {where_, true, std::uint64_t{1} << 40, memory_space::host}; }

  //! Path of the dense file of `version` / the delta file of `version`.
  [[nodiscard]] std::string dense_path(std::uint64_t version) const {
    return rlpt::detail::format("{}/rlpt-v{:020}.safetensors", dir_, version);
  }
  [[nodiscard]] std::string delta_path(std::uint64_t version) const {
    return rlpt::detail::format("{}/rlpt-v{:020}.delta.safetensors", dir_, version);
  }

  std::span<std::byte> payload_buffer(std::uint64_t bytes, deadline) override {
    if (payload_.size() < bytes) payload_.resize(static_cast<std::size_t>(bytes));
    return {payload_.data(), static_cast<std::size_t>(bytes)};
  }

  RLPT_INLINE void send(std::span<const std::byte> meta, std::uint64_t payload_bytes, deadline) override;

  RLPT_INLINE std::optional<message> receive(deadline until) override;

  void release() override { held_meta_.clear(); }

private:
  // --- sending side: files ------------------------------------------------------------------

  static std::string pieces_placeholder(const manifest& m) {
    std::uint64_t total = 0;
    for (std::uint64_t b = 0; b < m.bucket_count(); ++b) total += m.pieces(b).size();
    return std::string(static_cast<std::size_t>(total * 16), '0');
  }

  safetensors_metadata dense_metadata(const manifest& m, const std::string& pieces) const {
    return {{"format", "pt"}, {"rlpt.kind", "dense"}, {"rlpt.manifest", m.to_json()}, {"rlpt.pieces", pieces}};
  }

  void queue_reply(frame_type t, std::uint64_t version, std::uint64_t index, std::string_view body) {
    std::vector<std::byte> meta;
    encode_frame(meta, t, tx_.tag, version, 0, index, 0, 0, as_bytes(body));
    replies_.push_back(std::move(meta));
  }

  void begin(const frame& f);

  void bucket(const frame& f, std::span<const std::byte> payload);

  void delta(const frame& f, std::span<const std::byte> payload);

  void commit(const frame& f);

  void abandon_tmp() noexcept {
    tx_.file.abandon();
    tx_.active = false;
  }

  struct file_entry {
    std::uint64_t version = 0;
    bool delta = false;
    std::string path;
  };

  std::vector<file_entry> scan() const;

  [[nodiscard]] std::optional<std::uint64_t> latest_version() const {
    const auto files = scan();
    if (files.empty()) return std::nullopt;
    return files.back().version;
  }

  void prune(std::uint64_t newest_dense) const {
    for (const auto& f : scan())
      if (f.version < newest_dense) ::unlink(f.path.c_str());
  }

  // --- receiving side: replay ---------------------------------------------------------------

  struct replay_state {
    std::unique_ptr<safetensors_file> file;
    manifest m;
    std::uint64_t version = 0, base = 0;
    bool delta = false;
    std::uint64_t tag = 0;
    std::vector<std::uint64_t> pieces;     // dense: per piece, bucket order
    std::vector<std::uint64_t> chunk_sums; // delta
    std::vector<std::uint64_t> offset;     // dense: data offset per manifest tensor
    std::uint64_t next = 0, messages = 0;  // messages: BEGIN + buckets/chunks + COMMIT
  };

  static std::vector<std::uint64_t> parse_sums(std::string_view hex, std::string_view what, std::string_view where);

  // Picks the next file to replay: a delta on top of what the receiver holds, else the newest
  // dense version beyond it.
  bool open_next();

  std::optional<message> produce();

  void on_reply(const frame& f);

  std::string dir_;
  role role_;
  safetensors_options o_;
  std::string where_;
  std::vector<std::byte> payload_;
  std::vector<std::byte> held_meta_;
  std::deque<std::vector<std::byte>> replies_;
  struct tx_state {
    bool active = false;
    std::uint64_t tag = 0;
    manifest m;
    std::uint64_t version = 0, base = 0;
    bool delta = false;
    safetensors_layout layout;
    rlpt::detail::durable_file file; // the dense file being received
    std::vector<std::uint64_t> pieces, piece_base;
    std::vector<std::vector<std::byte>> chunks;
    std::vector<std::uint64_t> chunk_sums;
  } tx_;
  std::unique_ptr<replay_state> replay_;
  std::string replay_path_;
  std::optional<std::uint64_t> acked_;
  std::uint64_t replays_ = 0;
  bool want_dense_ = false;
  std::set<std::string> skip_;
  std::string last_error_;
};
using safetensors_transport = basic_safetensors_transport<>;
RLPT_EXTERN_TEMPLATE(class basic_safetensors_transport<>)

} // namespace sync
RLPT_NAMESPACE_END

#if RLPT_HEADER_IMPL()
RLPT_NAMESPACE_BEGIN
namespace sync {

RLPT_DEFER RLPT_INLINE safetensors_header parse_safetensors_header(std::span<const std::byte> prefix,
                                                                   std::uint64_t file_size, std::string_view where,
                                                                   safetensors_limits limits) {
  auto bad = [&](const std::string& what) -> void { RLPT_FAIL(errors::sync::bad_safetensors, "{}: {}", where, what); };
  if (file_size < 8 || prefix.size() < 8)
    bad(rlpt::detail::format("{} bytes is too short for the 8-byte header length", file_size));
  std::uint64_t n = 0;
  std::memcpy(&n, prefix.data(), 8);
  if (n > limits.max_header_bytes)
    bad(rlpt::detail::format("header length {} exceeds the limit {}", n, limits.max_header_bytes));
  if (n > file_size - 8)
    bad(rlpt::detail::format("header length {} runs past the end of the {}-byte file", n, file_size));
  if (prefix.size() < 8 + n)
    bad(rlpt::detail::format("only {} of the header's {} bytes were given", prefix.size() - 8, n));
  const std::string_view text(reinterpret_cast<const char*>(prefix.data() + 8), static_cast<std::size_t>(n));
  // JSON whitespace may precede the object: the reference reader (serde_json) skips it too.
  const std::size_t first = text.find_first_not_of(" \t\n\r");
  if (first == std::string_view::npos || text[first] != '{') bad("the header does not start with '{'");
  const detail::json root =
      detail::parse_json(text, rlpt::detail::format("{} header", where), {64, limits.max_header_bytes});
  if (!root.is_object()) bad("the header is not a JSON object");
  safetensors_header h;
  h.header_bytes = n;
  for (std::size_t i = 0; i < root.size(); ++i) {
    const std::string& key = root.keys()[i];
    const detail::json& v = root.items()[i];
    if (key == "__metadata__") {
      if (!v.is_object()) bad("__metadata__ is not an object");
      for (std::size_t j = 0; j < v.size(); ++j) {
        if (!v.items()[j].is_string())
          bad(rlpt::detail::format("__metadata__ value of \"{}\" is not a string", v.keys()[j]));
        h.metadata.emplace_back(v.keys()[j], v.items()[j].text());
      }
      continue;
    }
    if (h.tensors.size() >= limits.max_tensors) bad(rlpt::detail::format("more than {} tensors", limits.max_tensors));
    if (!v.is_object()) bad(rlpt::detail::format("tensor \"{}\" is not an object", key));
    for (const auto& k : v.keys())
      if (k != "dtype" && k != "shape" && k != "data_offsets")
        bad(rlpt::detail::format("tensor \"{}\" has an unknown key \"{}\"", key, k));
    const detail::json* dt = v.find("dtype");
    const detail::json* shape = v.find("shape");
    const detail::json* off = v.find("data_offsets");
    if (!dt || !shape || !off) bad(rlpt::detail::format("tensor \"{}\" lacks dtype, shape or data_offsets", key));
    safetensors_entry e;
    e.name = key;
    const auto parsed = dt->is_string() ? parse_wire_dtype(dt->text()) : std::nullopt;
    if (!parsed)
      bad(rlpt::detail::format(
          "tensor \"{}\" has unsupported dtype {} (supported: BOOL, U8, I8, F8_E5M2, F8_E4M3, F8_E8M0, I16, "
          "U16, F16, BF16, I32, U32, F32, C64, F64, I64, U64)",
          key, dt->is_string() ? dt->text() : std::string("(not a string)")));
    e.dtype = *parsed;
    if (!shape->is_array() || shape->size() > 16)
      bad(rlpt::detail::format("tensor \"{}\" shape is not an array of at most 16 dims", key));
    for (const auto& d : shape->items()) {
      std::uint64_t u = 0;
      if (!d.to_uint(u) || u > static_cast<std::uint64_t>(INT64_MAX))
        bad(rlpt::detail::format("tensor \"{}\" shape has a dimension that is not a non-negative integer", key));
      e.shape.push_back(static_cast<std::int64_t>(u));
    }
    if (!off->is_array() || off->size() != 2 || !off->items()[0].to_uint(e.begin) || !off->items()[1].to_uint(e.end) ||
        e.begin > e.end)
      bad(rlpt::detail::format("tensor \"{}\" data_offsets is not [begin, end] with begin <= end", key));
    std::uint64_t want = 0;
    try {
      want = detail::tensor_nbytes(key, e.dtype, e.shape);
    } catch (const error& err) {
      bad(err.message());
    }
    if (e.end - e.begin != want)
      bad(rlpt::detail::format("tensor \"{}\" spans {} bytes but {} [{}] needs {}", key, e.end - e.begin, e.dtype,
                               rlpt::detail::joined(e.shape, ", "), want));
    h.tensors.push_back(std::move(e));
  }
  std::stable_sort(h.tensors.begin(), h.tensors.end(), [](const safetensors_entry& a, const safetensors_entry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  std::uint64_t at = 0;
  for (const auto& t : h.tensors) {
    if (t.begin != at)
      bad(rlpt::detail::format(
          "tensor \"{}\" starts at {} but the previous data ends at {} (gaps and overlaps are invalid)", t.name,
          t.begin, at));
    at = t.end;
  }
  if (at != file_size - 8 - n)
    bad(rlpt::detail::format("the tensors cover {} data bytes but the file has {} after the header", at,
                             file_size - 8 - n));
  h.data_bytes = at;
  return h;
}

RLPT_DEFER RLPT_INLINE std::vector<std::byte> serialize_safetensors(std::span<const tensor_ref> tensors,
                                                                    const safetensors_metadata& metadata) {
  const safetensors_layout l = layout_safetensors(tensors, metadata);
  std::vector<std::byte> out(8 + l.header.size() + l.data_bytes);
  const std::uint64_t n = l.header.size();
  std::memcpy(out.data(), &n, 8);
  std::memcpy(out.data() + 8, l.header.data(), l.header.size());
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const std::uint64_t bytes = detail::tensor_nbytes(tensors[i].name, tensors[i].dtype, tensors[i].shape);
    RLPT_CHECK(bytes == 0 || tensors[i].data != nullptr, errors::sync::bad_source, "tensor \"{}\" has no data",
               tensors[i].name);
    if (bytes) std::memcpy(out.data() + 8 + n + l.offset[i], tensors[i].data, static_cast<std::size_t>(bytes));
  }
  return out;
}

RLPT_DEFER RLPT_INLINE void write_safetensors(const std::string& path, std::span<const tensor_ref> tensors,
                                              const safetensors_metadata& metadata) {
  const safetensors_layout l = layout_safetensors(tensors, metadata);
  const std::uint64_t n = l.header.size();
  rlpt::detail::durable_file f(path, detail::io_fail); // a throw below removes the temporary file
  const std::string& tmp = f.temporary();
  f.resize(8 + n + l.data_bytes, detail::io_fail);
  detail::write_all(f.fd(), &n, 8, 0, tmp);
  detail::write_all(f.fd(), l.header.data(), l.header.size(), 8, tmp);
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const std::uint64_t bytes = detail::tensor_nbytes(tensors[i].name, tensors[i].dtype, tensors[i].shape);
    RLPT_CHECK(bytes == 0 || tensors[i].data != nullptr, errors::sync::bad_source, "tensor \"{}\" has no data",
               tensors[i].name);
    if (bytes) detail::write_all(f.fd(), tensors[i].data, static_cast<std::size_t>(bytes), 8 + n + l.offset[i], tmp);
  }
  f.publish(detail::io_fail);
}

template <class Tag>
RLPT_INLINE basic_safetensors_file<Tag>::basic_safetensors_file(const std::string& path, safetensors_limits limits)
    : path_(path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  RLPT_CHECK(fd >= 0, errors::sync::io, "{}: cannot open: {}", path, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    RLPT_FAIL(errors::sync::io, "{}: fstat failed: {}", path, std::strerror(err));
  }
  size_ = static_cast<std::uint64_t>(st.st_size);
  if (size_ > 0) {
    void* p = ::mmap(nullptr, static_cast<std::size_t>(size_), PROT_READ, MAP_SHARED, fd, 0);
    const int err = errno;
    ::close(fd);
    RLPT_CHECK(p != MAP_FAILED, errors::sync::io, "{}: mmap failed: {}", path, std::strerror(err));
    base_ = static_cast<const std::byte*>(p);
  } else {
    ::close(fd);
  }
  try {
    header_ = parse_safetensors_header(bytes(), size_, path_, limits);
  } catch (...) {
    unmap();
    throw;
  }
}

template <class Tag>
RLPT_INLINE void basic_safetensors_transport<Tag>::send(std::span<const std::byte> meta, std::uint64_t payload_bytes,
                                                        deadline) {
  const frame f = decode_frame(meta, where_);
  if (role_ == role::receiver) return on_reply(f);
  const std::span<const std::byte> payload(payload_.data(), static_cast<std::size_t>(payload_bytes));
  switch (f.type) {
  case frame_type::begin:
    return begin(f);
  case frame_type::bucket:
    return bucket(f, payload);
  case frame_type::delta:
    return delta(f, payload);
  case frame_type::commit:
    return commit(f);
  case frame_type::abort:
    abandon_tmp();
    return;
  default:
    RLPT_FAIL(errors::sync::protocol, "{}: unexpected {} frame from the sender", where_, name(f.type));
  }
}

template <class Tag> RLPT_INLINE std::optional<message> basic_safetensors_transport<Tag>::receive(deadline until) {
  release();
  if (role_ == role::sender) {
    if (replies_.empty()) return std::nullopt;
    held_meta_ = std::move(replies_.front());
    replies_.pop_front();
    return message{held_meta_, {}};
  }
  for (;;) {
    if (replay_ && replay_->next < replay_->messages) return produce();
    if (!replay_ && open_next()) continue;
    if (clock::now() >= until) return std::nullopt;
    std::this_thread::sleep_for(std::min<clock::duration>(o_.scan_interval, until - clock::now()));
  }
}

template <class Tag> RLPT_INLINE void basic_safetensors_transport<Tag>::begin(const frame& f) {
  abandon_tmp();
  tx_ = {};
  tx_.m = manifest::from_json(as_chars(f.body));
  tx_.tag = f.tag;
  tx_.version = f.version;
  tx_.delta = f.index == static_cast<std::uint64_t>(update_kind::delta);
  tx_.base = f.base_version;
  tx_.m.set_versions(f.version,
                     tx_.delta ? f.base_version : 0); // fixed from here on: the header's length must not change
  if (tx_.delta) {
    const auto latest = latest_version();
    if (!latest || *latest != f.base_version) {
      queue_reply(frame_type::refuse, f.version, static_cast<std::uint64_t>(refusal::base_mismatch),
                  rlpt::detail::format(
                      "rlpt.sync.base_mismatch\n{}: the directory's latest version is {}, not the delta's base {}",
                      where_, latest ? rlpt::detail::format("{}", *latest) : std::string("none"), f.base_version));
      return;
    }
  } else {
    std::vector<tensor_entry> entries(tx_.m.tensors().begin(), tx_.m.tensors().end());
    tx_.pieces.assign(pieces_placeholder(tx_.m).size() / 16, 0);
    tx_.layout =
        layout_safetensors(std::span<const tensor_entry>(entries), dense_metadata(tx_.m, pieces_placeholder(tx_.m)));
    tx_.file = rlpt::detail::durable_file(dense_path(f.version), detail::io_fail);
    tx_.file.resize(8 + tx_.layout.header.size() + tx_.layout.data_bytes, detail::io_fail);
    std::uint64_t b0 = 0;
    tx_.piece_base.clear();
    for (std::uint64_t b = 0; b < tx_.m.bucket_count(); ++b) {
      tx_.piece_base.push_back(b0);
      b0 += tx_.m.pieces(b).size();
    }
  }
  tx_.active = true;
  queue_reply(frame_type::ready, f.version, 0, {});
}

template <class Tag>
RLPT_INLINE void basic_safetensors_transport<Tag>::bucket(const frame& f, std::span<const std::byte> payload) {
  RLPT_CHECK(tx_.active && !tx_.delta && f.version == tx_.version && f.index < tx_.m.bucket_count(),
             errors::sync::protocol, "{}: unexpected bucket {} of version {}", where_, f.index, f.version);
  const auto pieces = tx_.m.pieces(f.index);
  RLPT_CHECK(f.body.size() == pieces.size() * 8 && payload.size() >= tx_.m.bucket_size(f.index), errors::sync::protocol,
             "{}: bucket {} of version {} is malformed", where_, f.index, f.version);
  const std::uint64_t data_at = 8 + tx_.layout.header.size();
  for (std::size_t j = 0; j < pieces.size(); ++j) {
    const piece& p = pieces[j];
    detail::write_all(tx_.file.fd(), payload.data() + p.bucket_offset, static_cast<std::size_t>(p.nbytes),
                      data_at + tx_.layout.offset[p.tensor] + p.tensor_offset, tx_.file.temporary());
    std::memcpy(&tx_.pieces[static_cast<std::size_t>(tx_.piece_base[f.index]) + j], f.body.data() + j * 8, 8);
  }
}

template <class Tag>
RLPT_INLINE void basic_safetensors_transport<Tag>::delta(const frame& f, std::span<const std::byte> payload) {
  RLPT_CHECK(tx_.active && tx_.delta && f.version == tx_.version, errors::sync::protocol,
             "{}: unexpected delta chunk {}", where_, f.index);
  tx_.chunks.emplace_back(payload.begin(), payload.end());
  RLPT_CHECK(f.body.size() == 8, errors::sync::protocol, "{}: delta chunk {} has a malformed body", where_, f.index);
  std::uint64_t sum;
  std::memcpy(&sum, f.body.data(), 8);
  tx_.chunk_sums.push_back(sum);
}

template <class Tag> RLPT_INLINE void basic_safetensors_transport<Tag>::commit(const frame& f) {
  RLPT_CHECK(tx_.active && f.version == tx_.version && f.body.size() == tx_.m.size() * 8, errors::sync::protocol,
             "{}: unexpected COMMIT of version {}", where_, f.version);
  for (std::size_t i = 0; i < tx_.m.size(); ++i) {
    std::uint64_t c;
    std::memcpy(&c, f.body.data() + i * 8, 8);
    tx_.m.set_checksum(i, c);
  }
  tx_.m.set_versions(tx_.version, tx_.delta ? tx_.base : 0);
  if (!tx_.delta) {
    std::string pieces;
    pieces.reserve(tx_.pieces.size() * 16);
    for (auto c : tx_.pieces) pieces += to_hex(c);
    std::vector<tensor_entry> entries(tx_.m.tensors().begin(), tx_.m.tensors().end());
    const safetensors_layout l =
        layout_safetensors(std::span<const tensor_entry>(entries), dense_metadata(tx_.m, pieces));
    RLPT_CHECK(l.header.size() == tx_.layout.header.size(), errors::sync::io, "{}: header size changed at commit",
               where_);
    const std::uint64_t n = l.header.size();
    detail::write_all(tx_.file.fd(), &n, 8, 0, tx_.file.temporary());
    detail::write_all(tx_.file.fd(), l.header.data(), l.header.size(), 8, tx_.file.temporary());
    tx_.file.publish(detail::io_fail);
  } else {
    std::vector<tensor_ref> refs;
    std::string sums;
    for (std::size_t k = 0; k < tx_.chunks.size(); ++k) {
      refs.push_back({rlpt::detail::format("rlpt.delta.{:06}", k),
                      wire_dtype::u8,
                      {static_cast<std::int64_t>(tx_.chunks[k].size())},
                      tx_.chunks[k].data()});
      sums += to_hex(tx_.chunk_sums[k]);
    }
    write_safetensors(delta_path(tx_.version), refs,
                      {{"format", "pt"},
                       {"rlpt.kind", "delta"},
                       {"rlpt.manifest", tx_.m.to_json()},
                       {"rlpt.base_version", rlpt::detail::format("{}", tx_.base)},
                       {"rlpt.chunks", sums}});
  }
  const std::uint64_t v = tx_.version;
  const bool dense = !tx_.delta;
  if (dense && o_.prune) prune(v);
  queue_reply(frame_type::ack, v, 0, {});
  tx_ = {};
}

template <class Tag>
RLPT_INLINE std::vector<typename basic_safetensors_transport<Tag>::file_entry>
basic_safetensors_transport<Tag>::scan() const {
  std::vector<file_entry> out;
  DIR* d = ::opendir(dir_.c_str());
  if (d == nullptr) return out;
  while (const dirent* e = ::readdir(d)) {
    const std::string_view n(e->d_name);
    if (n.size() < 6 + 20 || n.substr(0, 6) != "rlpt-v") continue;
    const std::string_view digits = n.substr(6, 20);
    if (digits.find_first_not_of("0123456789") != std::string_view::npos) continue;
    const std::string_view rest = n.substr(26);
    bool delta;
    if (rest == ".safetensors")
      delta = false;
    else if (rest == ".delta.safetensors")
      delta = true;
    else
      continue;
    // 20 digits can exceed 2^64 - 1: such a name is not a version (std::stoull threw out_of_range).
    std::uint64_t version = 0;
    const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), version);
    if (ec != std::errc{} || end != digits.data() + digits.size()) continue;
    out.push_back({version, delta, rlpt::detail::format("{}/{}", dir_, n)});
  }
  ::closedir(d);
  std::sort(out.begin(), out.end(), [](const file_entry& a, const file_entry& b) {
    return a.version != b.version ? a.version < b.version : a.delta < b.delta;
  });
  return out;
}

template <class Tag>
RLPT_INLINE std::vector<std::uint64_t>
basic_safetensors_transport<Tag>::parse_sums(std::string_view hex, std::string_view what, std::string_view where) {
  RLPT_CHECK(hex.size() % 16 == 0, errors::sync::bad_safetensors, "{}: {} is not a list of 16-digit checksums", where,
             what);
  std::vector<std::uint64_t> out;
  for (std::size_t i = 0; i < hex.size(); i += 16) {
    const auto v = parse_hex(hex.substr(i, 16));
    RLPT_CHECK(v.has_value(), errors::sync::bad_safetensors, "{}: {} has a malformed checksum at {}", where, what,
               i / 16);
    out.push_back(*v);
  }
  return out;
}

template <class Tag> RLPT_INLINE bool basic_safetensors_transport<Tag>::open_next() {
  const auto files = scan();
  const file_entry* pick = nullptr;
  if (acked_ && !want_dense_)
    for (const auto& f : files)
      if (f.delta && f.version > *acked_ && !skip_.count(f.path)) {
        pick = &f; // the first newer delta; its base is checked by the receiver
        break;
      }
  if (pick == nullptr)
    for (auto it = files.rbegin(); it != files.rend(); ++it)
      if (!it->delta && (!acked_ || it->version > *acked_) && !skip_.count(it->path)) {
        pick = &*it;
        break;
      }
  if (pick == nullptr) return false;
  auto r = std::make_unique<replay_state>();
  try {
    r->file = std::make_unique<safetensors_file>(pick->path);
    const auto& h = r->file->header();
    const auto mj = h.meta("rlpt.manifest");
    const auto kind = h.meta("rlpt.kind");
    RLPT_CHECK(mj && kind, errors::sync::bad_safetensors, "{}: no rlpt metadata (not written by an rlpt sender)",
               pick->path);
    r->m = manifest::from_json(*mj);
    r->version = r->m.version();
    r->base = r->m.base_version();
    r->delta = *kind == "delta";
    RLPT_CHECK(r->version == pick->version && r->delta == pick->delta, errors::sync::bad_safetensors,
               "{}: metadata says version {} ({}), the name says otherwise", pick->path, r->version, *kind);
    if (r->delta) {
      const auto sums = h.meta("rlpt.chunks");
      RLPT_CHECK(sums.has_value(), errors::sync::bad_safetensors, "{}: no rlpt.chunks metadata", pick->path);
      r->chunk_sums = parse_sums(*sums, "rlpt.chunks", pick->path);
      RLPT_CHECK(r->chunk_sums.size() == h.tensors.size(), errors::sync::bad_safetensors,
                 "{}: {} chunk checksums for {} chunks", pick->path, r->chunk_sums.size(), h.tensors.size());
      r->messages = 2 + r->chunk_sums.size();
    } else {
      const auto sums = h.meta("rlpt.pieces");
      RLPT_CHECK(sums.has_value(), errors::sync::bad_safetensors, "{}: no rlpt.pieces metadata", pick->path);
      r->pieces = parse_sums(*sums, "rlpt.pieces", pick->path);
      std::uint64_t total = 0;
      for (std::uint64_t b = 0; b < r->m.bucket_count(); ++b) total += r->m.pieces(b).size();
      RLPT_CHECK(r->pieces.size() == total, errors::sync::bad_safetensors, "{}: {} piece checksums for {} pieces",
                 pick->path, r->pieces.size(), total);
      std::unordered_map<std::string_view, const safetensors_entry*> by_name; // not h.find: O(n^2) for n tensors
      by_name.reserve(h.tensors.size());
      for (const auto& t : h.tensors) by_name.emplace(t.name, &t);
      for (std::size_t i = 0; i < r->m.size(); ++i) {
        const auto it = by_name.find(r->m[i].name);
        const safetensors_entry* e = it == by_name.end() ? nullptr : it->second;
        RLPT_CHECK(e != nullptr && e->dtype == r->m[i].dtype && e->shape == r->m[i].shape,
                   errors::sync::bad_safetensors, "{}: tensor \"{}\" of the manifest is missing or differs in the file",
                   pick->path, r->m[i].name);
        r->offset.push_back(e->begin);
      }
      r->messages = 2 + r->m.bucket_count();
    }
  } catch (const error& e) {
    skip_.insert(pick->path); // unreadable: never retried; the receiver waits for a newer dense file
    last_error_ = e.message();
    return false;
  }
  r->tag = xxh3(pick->path.data(), pick->path.size()) ^ ++replays_;
  replay_path_ = pick->path;
  replay_ = std::move(r);
  return true;
}

template <class Tag> RLPT_INLINE std::optional<message> basic_safetensors_transport<Tag>::produce() {
  replay_state& r = *replay_;
  const std::uint64_t k = r.next++;
  if (k == 0) {
    const std::string body = r.m.to_json();
    encode_frame(held_meta_, frame_type::begin, r.tag, r.version, r.base,
                 static_cast<std::uint64_t>(r.delta ? update_kind::delta : update_kind::dense), r.m.layout_hash(), 0,
                 as_bytes(body));
    return message{held_meta_, {}};
  }
  if (k + 1 == r.messages) {
    std::vector<std::uint64_t> sums;
    for (const auto& t : r.m.tensors()) sums.push_back(t.checksum);
    encode_frame(held_meta_, frame_type::commit, r.tag, r.version, r.base, 0, r.messages - 2, 0,
                 std::span<const std::byte>(reinterpret_cast<const std::byte*>(sums.data()), sums.size() * 8));
    return message{held_meta_, {}};
  }
  if (r.delta) {
    const std::uint64_t c = k - 1;
    const tensor_view t = r.file->view(r.file->header().tensors[static_cast<std::size_t>(c)]);
    const std::uint64_t sum = r.chunk_sums[static_cast<std::size_t>(c)];
    encode_frame(held_meta_, frame_type::delta, r.tag, r.version, r.base, c, 0, t.bytes.size(),
                 std::span<const std::byte>(reinterpret_cast<const std::byte*>(&sum), 8));
    return message{held_meta_, t.bytes};
  }
  const std::uint64_t b = k - 1;
  const auto pieces = r.m.pieces(b);
  const std::uint64_t size = r.m.bucket_size(b);
  if (payload_.size() < size) payload_.resize(static_cast<std::size_t>(size));
  std::memset(payload_.data(), 0, static_cast<std::size_t>(size));
  std::uint64_t first = 0;
  for (std::uint64_t x = 0; x < b; ++x) first += r.m.pieces(x).size();
  const auto data = r.file->data();
  for (const piece& p : pieces)
    std::memcpy(payload_.data() + p.bucket_offset, data.data() + r.offset[p.tensor] + p.tensor_offset,
                static_cast<std::size_t>(p.nbytes));
  encode_frame(
      held_meta_, frame_type::bucket, r.tag, r.version, 0, b, pieces.size(), size,
      std::span<const std::byte>(reinterpret_cast<const std::byte*>(r.pieces.data() + first), pieces.size() * 8));
  return message{held_meta_, {payload_.data(), static_cast<std::size_t>(size)}};
}

template <class Tag> RLPT_INLINE void basic_safetensors_transport<Tag>::on_reply(const frame& f) {
  if (!replay_ || f.version != replay_->version || f.tag != replay_->tag) return;
  switch (f.type) {
  case frame_type::ready:
    return;
  case frame_type::ack:
    acked_ = f.version;
    want_dense_ = false;
    replay_.reset();
    return;
  case frame_type::refuse:
    if (f.index == static_cast<std::uint64_t>(refusal::base_mismatch))
      want_dense_ = true;
    else
      skip_.insert(replay_path_);
    replay_.reset();
    return;
  case frame_type::nack:
    skip_.insert(replay_path_);
    replay_.reset();
    return;
  default:
    return;
  }
}

} // namespace sync
RLPT_NAMESPACE_END
#endif // RLPT_HEADER_IMPL()
