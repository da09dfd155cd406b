// SPDX-License-Identifier: Apache-2.0
//! @file
//! Buffer checkpoints: a versioned, checksummed binary format and a crash-consistent writer.
//!
//! Resuming a run must not lose the rollouts the buffer held (OpenRLHF #1322, NeMo-RL #3599):
//! a checkpoint holds every resident group (open and ready, in order), the ordinal counters,
//! the accounting, and an opaque caller blob (data-loader cursor, RNG state, version clock).
//! Restoring it into a fresh buffer with the same options gives exactly the same subsequent
//! batches for the same subsequent pushes and pops.
//!
//! Layout (little-endian):
//!   header  (40 bytes): magic "RLPTRBUF", u32 format version, u32 flags (0),
//!                       u64 payload size, u64 XXH3-64 of the payload, u64 XXH3-64 of the
//!                       preceding 32 header bytes
//!   payload: options (group sizes, schema), counters, stats, caller blob, open groups,
//!            ready groups; every count is checked against the bytes that remain.
//! Files are written to a temporary name in the same directory, fsync'ed, renamed over the
//! target and the directory fsync'ed: a crash leaves either the old or the new checkpoint.
//! A writer killed mid-save leaves its temporary file (`<name>.tmp.<pid>.<n>`) behind; the
//! next save or load of `<name>` removes those of processes that no longer run.
//! Any truncated, corrupted or inconsistent input raises rlpt::error (never UB): ids
//! rlpt.rollout.checkpoint_corrupt, rlpt.rollout.checkpoint_version, rlpt.rollout.checkpoint_io,
//! and the restore checks of rollout_buffer::restore.
#pragma once

#include <rlpt/config.hpp>
#include <rlpt/core/error.hpp>
#include <rlpt/core/file.hpp>
#include <rlpt/rollout/buffer.hpp>
#include <rlpt/rollout/record.hpp>

#include <bit>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <utility>
#include <vector>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

// xxHash as header-only code with private symbols, whether or not the user includes it too.
#if !defined(XXH_INLINE_ALL)
#define XXH_INLINE_ALL
#define RLPT_ROLLOUT_UNDEF_XXH_INLINE_ALL
#endif
#include <xxhash.h>
#if defined(RLPT_ROLLOUT_UNDEF_XXH_INLINE_ALL)
#undef XXH_INLINE_ALL
#undef RLPT_ROLLOUT_UNDEF_XXH_INLINE_ALL
#endif

RLPT_NAMESPACE_BEGIN

inline constexpr std::uint32_t checkpoint_format_version = 1;

//! A decoded checkpoint: the buffer state and the caller's blob.
struct checkpoint {
  buffer_state state;
  std::vector<std::byte> user;
};

namespace detail {

inline constexpr char checkpoint_magic[8] = {'R', 'L', 'P', 'T', 'R', 'B', 'U', 'F'};
inline constexpr std::size_t checkpoint_header_bytes = 40;

[[nodiscard]] inline std::uint64_t xxh3(std::span<const std::byte> b) noexcept {
  return XXH3_64bits(b.data(), b.size());
}

class byte_writer {
public:
  template <class T>
    requires std::is_arithmetic_v<T>
  void put(T v) {
    using U = std::conditional_t<sizeof(T) == 1, std::uint8_t,
                                 std::conditional_t<sizeof(T) == 2, std::uint16_t,
                                                    std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>>>;
    U u;
    std::memcpy(&u, &v, sizeof(T));
    for (std::size_t i = 0; i < sizeof(T); ++i) out_.push_back(static_cast<std::byte>((u >> (8 * i)) & 0xFFu));
  }
  void put_bool(bool v) { put<std::uint8_t>(v ? 1 : 0); }
  //! Element arrays as raw little-endian bytes (the host is checked little-endian below).
  template <class T> void put_raw(const T* data, std::size_t n) {
    const auto* p = reinterpret_cast<const std::byte*>(data);
    out_.insert(out_.end(), p, p + n * sizeof(T));
  }
  void put_string(std::string_view s) {
    put<std::uint32_t>(static_cast<std::uint32_t>(s.size()));
    put_raw(s.data(), s.size());
  }
  [[nodiscard]] std::vector<std::byte>& bytes() noexcept { return out_; }

private:
  std::vector<std::byte> out_;
};

class byte_reader {
public:
  explicit byte_reader(std::span<const std::byte> in) : in_(in) {}

  template <class T>
    requires std::is_arithmetic_v<T>
  [[nodiscard]] T get(std::string_view what) {
    need(sizeof(T), what);
    using U = std::conditional_t<sizeof(T) == 1, std::uint8_t,
                                 std::conditional_t<sizeof(T) == 2, std::uint16_t,
                                                    std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>>>;
    U u = 0;
    for (std::size_t i = 0; i < sizeof(T); ++i) u = static_cast<U>(u | (static_cast<U>(in_[pos_ + i]) << (8 * i)));
    pos_ += sizeof(T);
    T v;
    std::memcpy(&v, &u, sizeof(T));
    return v;
  }
  [[nodiscard]] bool get_bool(std::string_view what) {
    const auto b = get<std::uint8_t>(what);
    RLPT_CHECK(b <= 1, errors::rollout::checkpoint_corrupt, "checkpoint field {} at byte {} is {}, not a boolean", what,
               pos_ - 1, b);
    return b == 1;
  }
  //! A count of elements of `elem_bytes` each that must still fit in the input.
  [[nodiscard]] std::size_t get_count(std::string_view what, std::size_t elem_bytes) {
    const auto n = get<std::uint64_t>(what);
    const std::size_t left = in_.size() - pos_;
    RLPT_CHECK(elem_bytes == 0 ? n <= left : n <= left / elem_bytes, errors::rollout::checkpoint_corrupt,
               "checkpoint field {} at byte {} counts {} elements of {} bytes, but only {} bytes remain", what,
               pos_ - 8, n, elem_bytes, left);
    return static_cast<std::size_t>(n);
  }
  //! A signed size that must be in [lo, hi].
  [[nodiscard]] index_t get_index(std::string_view what, index_t lo, index_t hi) {
    const auto v = get<std::int64_t>(what);
    RLPT_CHECK(v >= lo && v <= hi, errors::rollout::checkpoint_corrupt,
               "checkpoint field {} at byte {} is {}, outside [{}, {}]", what, pos_ - 8, v, lo, hi);
    return v;
  }
  template <class T> void get_raw(std::vector<T>& v, std::size_t n, std::string_view what) {
    check_raw(n, sizeof(T), what);
    v.resize(n);
    copy_raw(v.data(), n * sizeof(T));
  }
  void get_raw(extra_storage& v, std::size_t n, std::string_view what) {
    check_raw(n, size_of(v.type()), what);
    v.resize(n);
    copy_raw(v.bytes(), n * size_of(v.type()));
  }
  [[nodiscard]] std::string get_string(std::string_view what) {
    const auto n = get<std::uint32_t>(what);
    need(n, what);
    std::string s(reinterpret_cast<const char*>(in_.data() + pos_), n);
    pos_ += n;
    return s;
  }
  [[nodiscard]] std::size_t position() const noexcept { return pos_; }
  [[nodiscard]] std::size_t remaining() const noexcept { return in_.size() - pos_; }

private:
  //! n elements of `size` bytes each must remain (checked before anything is allocated for them).
  void check_raw(std::size_t n, std::size_t size, std::string_view what) const {
    RLPT_CHECK(n <= (in_.size() - pos_) / size, errors::rollout::checkpoint_corrupt,
               "checkpoint is truncated: field {} at byte {} needs {} bytes, {} remain", what, pos_, n * size,
               in_.size() - pos_);
  }
  void copy_raw(void* to, std::size_t bytes) {
    if (bytes != 0) std::memcpy(to, in_.data() + pos_, bytes);
    pos_ += bytes;
  }
  void need(std::size_t bytes, std::string_view what) const { check_raw(bytes, 1, what); }

  std::span<const std::byte> in_;
  std::size_t pos_ = 0;
};

static_assert(std::endian::native == std::endian::little,
              "rlpt checkpoints store raw arrays little-endian; big-endian hosts need byte swapping here");

inline void put_flow(byte_writer& w, const flow_count& f) {
  w.put<std::int64_t>(f.records);
  w.put<std::int64_t>(f.groups);
  w.put<std::int64_t>(f.tokens);
}
[[nodiscard]] inline flow_count get_flow(byte_reader& r, std::string_view what) {
  constexpr index_t big = index_t{1} << 62;
  flow_count f;
  f.records = r.get_index(what, 0, big);
  f.groups = r.get_index(what, 0, big);
  f.tokens = r.get_index(what, 0, big);
  return f;
}

RLPT_DEFER void put_info(byte_writer& w, const group_info& g);
RLPT_DEFER [[nodiscard]] group_info get_info(byte_reader& r);

RLPT_DEFER void put_record(byte_writer& w, const trajectory& t, const record_schema& s);

RLPT_DEFER [[nodiscard]] trajectory get_record(byte_reader& r, const record_schema& s);

RLPT_DEFER void put_schema(byte_writer& w, const record_schema& s);

RLPT_DEFER [[nodiscard]] record_schema get_schema(byte_reader& r);

//! The payload parser (also reached directly by the fuzz tests, past the checksums).
RLPT_DEFER [[nodiscard]] checkpoint decode_payload(std::span<const std::byte> payload);

} // namespace detail

//! Serialises a buffer state (and a caller blob) into the checkpoint format.
RLPT_DEFER [[nodiscard]] std::vector<std::byte> encode_checkpoint(const buffer_state& s,
                                                                  std::span<const std::byte> user = {});

//! Parses checkpoint bytes. Every malformed input raises rlpt::error naming what is wrong.
RLPT_DEFER [[nodiscard]] checkpoint decode_checkpoint(std::span<const std::byte> bytes);

//! Removes the temporary files that writers of the checkpoint `path` killed mid-save left
//! behind (`<path>.tmp.<pid>.<n>` of processes that no longer run; never this process's, nor
//! a running writer's). save and load call it; returns how many files it removed. Best effort:
//! a file that cannot be removed (permissions, a race with another cleaner) is skipped.
RLPT_DEFER inline index_t remove_stale_checkpoint_temporaries(const std::string& path) {
  return detail::remove_stale_temporaries(path);
}

namespace detail {

[[noreturn]] inline void io_fail(std::string_view what, std::string_view path, int err) {
  RLPT_FAIL(errors::rollout::checkpoint_io, "{} {}: {}", what, path, std::generic_category().message(err));
}

//! Writes bytes durably (core/file.hpp's write_durable): the target is the old file or the
//! whole new one, never a mix.
RLPT_DEFER void write_file_durable(const std::string& path, std::span<const std::byte> bytes);

RLPT_DEFER [[nodiscard]] std::vector<std::byte> read_file(const std::string& path);

} // namespace detail

//! Writes a checkpoint of `buffer` (a consistent snapshot) and `user` to `path`, crash-consistently.
RLPT_DEFER inline void save_checkpoint(const rollout_buffer& buffer, const std::string& path,
                                       std::span<const std::byte> user = {}) {
  const std::vector<std::byte> bytes = encode_checkpoint(buffer.snapshot(), user);
  detail::write_file_durable(path, bytes);
}

//! Reads and verifies a checkpoint file.
RLPT_DEFER [[nodiscard]] inline checkpoint load_checkpoint(const std::string& path) {
  static_cast<void>(remove_stale_checkpoint_temporaries(path));
  const std::vector<std::byte> bytes = detail::read_file(path);
  return decode_checkpoint(bytes);
}

//! Restores `buffer` (fresh, same group sizes and schema) from a checkpoint file; returns the
//! caller blob saved with it.
RLPT_DEFER inline std::vector<std::byte> restore_checkpoint(rollout_buffer& buffer, const std::string& path) {
  checkpoint c = load_checkpoint(path);
  buffer.restore(std::move(c.state));
  return std::move(c.user);
}

RLPT_NAMESPACE_END

#if RLPT_HEADER_IMPL()
RLPT_NAMESPACE_BEGIN

namespace detail {

RLPT_DEFER RLPT_INLINE void put_info(byte_writer& w, const group_info& g) {
  w.put<std::int64_t>(g.id);
  w.put<std::uint64_t>(g.ordinal);
  w.put<std::uint64_t>(g.ready_seq);
  w.put<std::int64_t>(g.samples);
  w.put<std::int64_t>(g.expected);
  w.put<std::int64_t>(g.tokens);
  w.put<std::int64_t>(g.loss_tokens);
  w.put<std::int32_t>(g.head_version);
  w.put<std::int32_t>(g.tail_version);
  w.put_bool(g.partial);
}

RLPT_DEFER RLPT_INLINE group_info get_info(byte_reader& r) {
  constexpr index_t big = index_t{1} << 62;
  group_info g;
  g.id = r.get<std::int64_t>("group.id");
  g.ordinal = r.get<std::uint64_t>("group.ordinal");
  g.ready_seq = r.get<std::uint64_t>("group.ready_seq");
  g.samples = r.get_index("group.samples", 0, big);
  g.expected = r.get_index("group.expected", 1, big);
  g.tokens = r.get_index("group.tokens", 0, big);
  g.loss_tokens = r.get_index("group.loss_tokens", 0, big);
  g.head_version = r.get<std::int32_t>("group.head_version");
  g.tail_version = r.get<std::int32_t>("group.tail_version");
  g.partial = r.get_bool("group.partial");
  return g;
}

RLPT_DEFER RLPT_INLINE void put_record(byte_writer& w, const trajectory& t, const record_schema& s) {
  const auto n = t.tokens.size();
  w.put<std::int64_t>(t.group_id);
  w.put<std::int32_t>(t.sample_index);
  w.put<std::int64_t>(t.prompt_len);
  w.put<std::uint64_t>(n);
  w.put_raw(t.tokens.data(), n);
  w.put_raw(t.loss_mask.data(), n);
  if (s.logprobs) w.put_raw(t.logprobs.data(), n);
  if (s.versions) w.put_raw(t.versions.data(), n);
  w.put_raw(t.rewards.data(), t.rewards.size());
  w.put_raw(t.token_rewards.data(), t.token_rewards.size());
  w.put<std::uint64_t>(t.segments.size());
  for (const auto& g : t.segments) {
    w.put<std::int64_t>(g.begin);
    w.put<std::int64_t>(g.end);
    w.put<std::uint8_t>(static_cast<std::uint8_t>(g.source));
    w.put<std::int32_t>(g.turn);
  }
  for (const auto& e : t.extras) w.put_raw(e.values.bytes(), e.values.size_bytes());
}

RLPT_DEFER RLPT_INLINE trajectory get_record(byte_reader& r, const record_schema& s) {
  trajectory t;
  t.group_id = r.get<std::int64_t>("record.group_id");
  t.sample_index = r.get<std::int32_t>("record.sample_index");
  const index_t prompt_len = r.get_index("record.prompt_len", 0, index_t{1} << 40);
  // Every token carries at least its id and mask: the count must fit in what remains.
  const std::size_t n = r.get_count("record.tokens", sizeof(token_id) + sizeof(mask_t));
  t.prompt_len = prompt_len;
  r.get_raw(t.tokens, n, "record.tokens");
  r.get_raw(t.loss_mask, n, "record.loss_mask");
  if (s.logprobs) r.get_raw(t.logprobs, n, "record.logprobs");
  if (s.versions) r.get_raw(t.versions, n, "record.versions");
  r.get_raw(t.rewards, usize(s.reward_channels), "record.rewards");
  RLPT_CHECK(s.token_reward_channels == 0 || n <= r.remaining() / usize(s.token_reward_channels),
             errors::rollout::checkpoint_corrupt, "checkpoint is truncated in record.token_rewards at byte {}",
             r.position());
  r.get_raw(t.token_rewards, n * usize(s.token_reward_channels), "record.token_rewards");
  const std::size_t ns = r.get_count("record.segments", 21);
  t.segments.resize(ns);
  for (auto& g : t.segments) {
    g.begin = r.get<std::int64_t>("segment.begin");
    g.end = r.get<std::int64_t>("segment.end");
    const auto src = r.get<std::uint8_t>("segment.source");
    RLPT_CHECK(src <= static_cast<std::uint8_t>(token_source::chat_template), errors::rollout::checkpoint_corrupt,
               "checkpoint segment source {} at byte {} is not a token_source", src, r.position() - 1);
    g.source = static_cast<token_source>(src);
    g.turn = r.get<std::int32_t>("segment.turn");
  }
  for (const auto& spec : s.extras) {
    token_extra e(spec.name, spec.type, spec.width);
    RLPT_CHECK(n <= r.remaining() / usize(spec.width), errors::rollout::checkpoint_corrupt,
               "checkpoint is truncated in extra '{}' at byte {}", spec.name, r.position());
    r.get_raw(e.values, n * usize(spec.width), "record.extra");
    t.extras.push_back(std::move(e));
  }
  return t;
}

RLPT_DEFER RLPT_INLINE void put_schema(byte_writer& w, const record_schema& s) {
  w.put_bool(s.logprobs);
  w.put_bool(s.versions);
  w.put<std::int64_t>(s.reward_channels);
  w.put<std::int64_t>(s.token_reward_channels);
  w.put<std::uint64_t>(s.extras.size());
  for (const auto& e : s.extras) {
    w.put_string(e.name);
    w.put<std::uint8_t>(static_cast<std::uint8_t>(e.type));
    w.put<std::int64_t>(e.width);
  }
}

RLPT_DEFER RLPT_INLINE record_schema get_schema(byte_reader& r) {
  record_schema s;
  s.logprobs = r.get_bool("schema.logprobs");
  s.versions = r.get_bool("schema.versions");
  s.reward_channels = r.get_index("schema.reward_channels", 0, 1 << 20);
  s.token_reward_channels = r.get_index("schema.token_reward_channels", 0, 1 << 20);
  const std::size_t ne = r.get_count("schema.extras", 13);
  for (std::size_t k = 0; k < ne; ++k) {
    extra_spec e;
    e.name = r.get_string("schema.extra.name");
    const auto t = r.get<std::uint8_t>("schema.extra.dtype");
    RLPT_CHECK(t <= static_cast<std::uint8_t>(dtype::i64), errors::rollout::checkpoint_corrupt,
               "checkpoint extra '{}' has dtype code {}, not an rlpt::dtype", e.name, t);
    e.type = static_cast<dtype>(t);
    e.width = r.get_index("schema.extra.width", 1, 1 << 24);
    s.extras.push_back(std::move(e));
  }
  return s;
}

RLPT_DEFER RLPT_INLINE checkpoint decode_payload(std::span<const std::byte> payload) {
  constexpr index_t big = index_t{1} << 62;
  byte_reader r(payload);
  checkpoint c;
  buffer_state& s = c.state;
  s.group_size = r.get_index("group_size", 1, big);
  s.min_group_size = r.get_index("min_group_size", 0, s.group_size);
  s.schema = get_schema(r);
  s.next_ordinal = r.get<std::uint64_t>("next_ordinal");
  s.next_ready_seq = r.get<std::uint64_t>("next_ready_seq");
  s.stats.inserted = get_flow(r, "stats.inserted");
  s.stats.consumed = get_flow(r, "stats.consumed");
  for (auto& e : s.stats.evicted) e = get_flow(r, "stats.evicted");
  s.stats.resident = get_flow(r, "stats.resident");
  s.stats.open_groups = r.get_index("stats.open_groups", 0, big);
  s.stats.ready_groups = r.get_index("stats.ready_groups", 0, big);
  s.stats.completed_groups = r.get_index("stats.completed_groups", 0, big);
  const std::size_t nf = r.get_count("stats.dropped_by_filter", 8);
  for (std::size_t k = 0; k < nf; ++k)
    s.stats.dropped_by_filter.push_back(r.get_index("stats.dropped_by_filter", 0, big));
  const std::size_t nu = r.get_count("user blob", 1);
  r.get_raw(c.user, nu, "user blob");
  for (auto* list : {&s.open, &s.ready}) {
    // A group is at least its 69-byte header.
    const std::size_t ng = r.get_count("group count", 69);
    list->reserve(ng);
    for (std::size_t k = 0; k < ng; ++k) {
      group_snapshot g;
      g.info = get_info(r);
      RLPT_CHECK(usize(g.info.samples) <= r.remaining() / 29, errors::rollout::checkpoint_corrupt,
                 "checkpoint group {} claims {} records, more than the {} bytes left can hold", g.info.id,
                 g.info.samples, r.remaining());
      g.records.reserve(usize(g.info.samples));
      for (index_t i = 0; i < g.info.samples; ++i) g.records.push_back(get_record(r, s.schema));
      list->push_back(std::move(g));
    }
  }
  RLPT_CHECK(r.remaining() == 0, errors::rollout::checkpoint_corrupt,
             "checkpoint payload has {} unexpected trailing bytes at byte {}", r.remaining(), r.position());
  return c;
}

} // namespace detail

RLPT_DEFER RLPT_INLINE std::vector<std::byte> encode_checkpoint(const buffer_state& s,
                                                                std::span<const std::byte> user) {
  detail::byte_writer w;
  w.put<std::int64_t>(s.group_size);
  w.put<std::int64_t>(s.min_group_size);
  detail::put_schema(w, s.schema);
  w.put<std::uint64_t>(s.next_ordinal);
  w.put<std::uint64_t>(s.next_ready_seq);
  detail::put_flow(w, s.stats.inserted);
  detail::put_flow(w, s.stats.consumed);
  for (const auto& e : s.stats.evicted) detail::put_flow(w, e);
  detail::put_flow(w, s.stats.resident);
  w.put<std::int64_t>(s.stats.open_groups);
  w.put<std::int64_t>(s.stats.ready_groups);
  w.put<std::int64_t>(s.stats.completed_groups);
  w.put<std::uint64_t>(s.stats.dropped_by_filter.size());
  for (const auto d : s.stats.dropped_by_filter) w.put<std::int64_t>(d);
  w.put<std::uint64_t>(user.size());
  w.put_raw(user.data(), user.size());
  for (const auto* list : {&s.open, &s.ready}) {
    w.put<std::uint64_t>(list->size());
    for (const auto& g : *list) {
      RLPT_CHECK(detail::isize(g.records.size()) == g.info.samples, errors::rollout::checkpoint_corrupt,
                 "group {} says {} records but holds {}", g.info.id, g.info.samples, g.records.size());
      detail::put_info(w, g.info);
      for (const auto& t : g.records) detail::put_record(w, t, s.schema);
    }
  }
  std::vector<std::byte> payload = std::move(w.bytes());

  detail::byte_writer h;
  h.put_raw(detail::checkpoint_magic, 8);
  h.put<std::uint32_t>(checkpoint_format_version);
  h.put<std::uint32_t>(0);
  h.put<std::uint64_t>(payload.size());
  h.put<std::uint64_t>(detail::xxh3(payload));
  h.put<std::uint64_t>(detail::xxh3(h.bytes()));
  std::vector<std::byte> out = std::move(h.bytes());
  out.insert(out.end(), payload.begin(), payload.end());
  return out;
}

RLPT_DEFER RLPT_INLINE checkpoint decode_checkpoint(std::span<const std::byte> bytes) {
  RLPT_CHECK(bytes.size() >= detail::checkpoint_header_bytes, errors::rollout::checkpoint_corrupt,
             "checkpoint is truncated: {} bytes, the header alone needs {}", bytes.size(),
             detail::checkpoint_header_bytes);
  RLPT_CHECK(std::memcmp(bytes.data(), detail::checkpoint_magic, 8) == 0, errors::rollout::checkpoint_corrupt,
             "not an rlpt buffer checkpoint: the magic bytes are not \"RLPTRBUF\"");
  detail::byte_reader hr(bytes.first(detail::checkpoint_header_bytes));
  static_cast<void>(hr.get<std::uint64_t>("magic"));
  const auto version = hr.get<std::uint32_t>("format version");
  const auto flags = hr.get<std::uint32_t>("flags");
  const auto payload_size = hr.get<std::uint64_t>("payload size");
  const auto payload_hash = hr.get<std::uint64_t>("payload checksum");
  const auto header_hash = hr.get<std::uint64_t>("header checksum");
  const auto computed_header = detail::xxh3(bytes.first(32));
  RLPT_CHECK(header_hash == computed_header, errors::rollout::checkpoint_corrupt,
             "checkpoint header checksum mismatch: stored {:#018x}, computed {:#018x} (the file is corrupted)",
             header_hash, computed_header);
  RLPT_CHECK(version == checkpoint_format_version, errors::rollout::checkpoint_version,
             "checkpoint format version {} is not supported (this rlpt reads version {})", version,
             checkpoint_format_version);
  RLPT_CHECK(flags == 0, errors::rollout::checkpoint_corrupt, "checkpoint header flags {:#x} are unknown", flags);
  const std::size_t have = bytes.size() - detail::checkpoint_header_bytes;
  RLPT_CHECK(payload_size == have, errors::rollout::checkpoint_corrupt,
             "checkpoint is {}: the header announces {} payload bytes, the input has {}",
             payload_size > have ? "truncated" : "followed by trailing bytes", payload_size, have);
  const auto payload = bytes.subspan(detail::checkpoint_header_bytes);
  const auto computed = detail::xxh3(payload);
  RLPT_CHECK(payload_hash == computed, errors::rollout::checkpoint_corrupt,
             "checkpoint payload checksum mismatch: stored {:#018x}, computed {:#018x} (the file is corrupted)",
             payload_hash, computed);
  return detail::decode_payload(payload);
}

namespace detail {

RLPT_DEFER RLPT_INLINE void write_file_durable(const std::string& path, std::span<const std::byte> bytes) {
  write_durable(
      path,
      [&](int fd, const std::string& tmp) {
        if (const int err = pwrite_all(fd, bytes.data(), bytes.size(), 0); err != 0) io_fail("cannot write", tmp, err);
      },
      io_fail);
}

RLPT_DEFER RLPT_INLINE std::vector<std::byte> read_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) io_fail("cannot open", path, errno);
  struct stat st {};
  // The size is a hint (the file may change while it is read): read until end of file.
  std::vector<std::byte> out(::fstat(fd, &st) == 0 && st.st_size > 0 ? static_cast<std::size_t>(st.st_size) + 1 : 4096);
  std::size_t got = 0;
  for (;;) {
    if (got == out.size()) out.resize(2 * out.size());
    const ::ssize_t n = ::read(fd, out.data() + got, out.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      io_fail("cannot read", path, err);
    }
    if (n == 0) break;
    got += static_cast<std::size_t>(n);
  }
  ::close(fd);
  out.resize(got);
  return out;
}

} // namespace detail

RLPT_NAMESPACE_END
#endif // RLPT_HEADER_IMPL()
