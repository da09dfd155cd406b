// SPDX-License-Identifier: Apache-2.0
// Buffer checkpoints: lossless round trip, identical subsequent batches after a restore at
// random kill points, crash-consistent files, clear errors for corrupted / truncated /
// inconsistent input, and a seeded mutation fuzz loop (raw bytes, and payloads re-signed so
// the mutations reach the parser behind the checksums) that must never crash.
#include <rlpt/rollout/checkpoint.hpp>

#include "support/errors.hpp"
#include "support/random.hpp"

#include <doctest/doctest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include <sys/wait.h>
#include <unistd.h>

using namespace rlpt;
namespace fs = std::filesystem;

namespace {

constexpr index_t group_size = 3;

builder_options record_options() {
  return {.reward_channels = 2, .token_reward_channels = 1, .extras = {{"experts", dtype::i32, 3}}};
}

buffer_options options() {
  const builder_options b = record_options();
  return {.capacity_groups = 64,
          .group_size = group_size,
          .min_group_size = 2,
          .schema = {.reward_channels = b.reward_channels,
                     .token_reward_channels = b.token_reward_channels,
                     .extras = b.extras},
          .filters = {filters::dapo()}};
}

trajectory make(test::rng& r, std::int64_t group, std::int32_t sample) {
  std::vector<token_id> prompt(static_cast<std::size_t>(r.integer(1, 4)));
  for (auto& t : prompt) t = static_cast<token_id>(r.integer(0, 999));
  trajectory_builder b(group, prompt, record_options());
  const auto n = static_cast<std::size_t>(r.integer(1, 6));
  std::vector<token_id> out(n);
  for (auto& t : out) t = static_cast<token_id>(r.integer(0, 999));
  const std::vector<float> lp = r.uniforms(n, -4.0, 0.0);
  b.model(out, lp, static_cast<policy_version>(group % 5));
  if (r.bernoulli(0.3)) {
    const std::vector<token_id> tool{7, 7};
    b.context(tool, token_source::tool);
  }
  // Group 4k has equal rewards on channel 0: the DAPO filter drops it.
  b.reward(group % 4 == 0 ? 1.0f : static_cast<float>(r.integer(0, 1)), 0).reward(static_cast<float>(r.uniform()), 1);
  b.token_reward(b.size() - 1, 0.5f);
  std::vector<std::int32_t> ex(static_cast<std::size_t>(3 * b.size()));
  for (auto& x : ex) x = static_cast<std::int32_t>(r.integer(0, 63));
  b.extra<std::int32_t>("experts", 0, ex);
  trajectory t = std::move(b).finish();
  t.sample_index = sample;
  return t;
}

struct op {
  enum kind_t { push, close_group, pop } kind = push;
  trajectory record;
  std::int64_t group = 0;
  index_t n = 1;
};

// A random interleaving of pushes, early group closes and pops.
std::vector<op> script(test::rng& r, index_t groups) {
  std::vector<op> ops;
  std::vector<std::pair<std::int64_t, std::int32_t>> live; // (group, next sample)
  std::int64_t next = 0;
  while (next < groups || !live.empty()) {
    if (live.size() < 4 && next < groups) live.push_back({next++, 0});
    const auto pick = static_cast<std::size_t>(r.integer(0, static_cast<std::int64_t>(live.size()) - 1));
    auto& [g, s] = live[pick];
    if (s >= 2 && r.bernoulli(0.1)) {
      ops.push_back({op::close_group, {}, g, 0});
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(pick));
    } else {
      ops.push_back({op::push, make(r, g, s), g, 0});
      if (++s == group_size) live.erase(live.begin() + static_cast<std::ptrdiff_t>(pick));
    }
    if (r.bernoulli(0.25)) ops.push_back({op::pop, {}, 0, r.integer(1, 3)});
  }
  return ops;
}

struct result {
  std::vector<std::optional<rollout_batch>> pops;
  std::vector<int> statuses;
};

result apply(rollout_buffer& buf, const std::vector<op>& ops, std::size_t from, std::size_t to) {
  result res;
  for (std::size_t i = from; i < to; ++i) {
    const op& o = ops[i];
    switch (o.kind) {
    case op::push: {
      trajectory t = o.record;
      res.statuses.push_back(static_cast<int>(buf.try_push(std::move(t))));
      break;
    }
    case op::close_group:
      res.statuses.push_back(buf.close_group(o.group) ? 1 : 0);
      break;
    case op::pop:
      res.pops.push_back(buf.try_pop(o.n));
      break;
    }
  }
  return res;
}

std::vector<std::byte> blob(std::string_view s) {
  std::vector<std::byte> b(s.size());
  std::memcpy(b.data(), s.data(), s.size());
  return b;
}

std::vector<std::byte> sample_checkpoint(std::uint64_t seed, index_t groups = 12) {
  test::rng r(seed);
  const auto ops = script(r, groups);
  rollout_buffer buf(options());
  apply(buf, ops, 0, ops.size() * 2 / 3);
  return encode_checkpoint(buf.snapshot(), blob("cursor=42"));
}

// Header over a (possibly mutated) payload with valid checksums, so mutations reach the parser.
std::vector<std::byte> resign(std::span<const std::byte> payload, std::uint32_t version = checkpoint_format_version,
                              std::uint32_t flags = 0) {
  detail::byte_writer h;
  h.put_raw(detail::checkpoint_magic, 8);
  h.put<std::uint32_t>(version);
  h.put<std::uint32_t>(flags);
  h.put<std::uint64_t>(payload.size());
  h.put<std::uint64_t>(detail::xxh3(payload));
  h.put<std::uint64_t>(detail::xxh3(h.bytes()));
  std::vector<std::byte> out = h.bytes();
  out.insert(out.end(), payload.begin(), payload.end());
  return out;
}

fs::path temp_dir(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("rlpt_rollout_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

} // namespace

TEST_CASE("checkpoint round trip: decode(encode(state)) re-encodes to the same bytes") {
  const std::vector<std::byte> bytes = sample_checkpoint(1);
  const checkpoint c = decode_checkpoint(bytes);
  CHECK(c.user == blob("cursor=42"));
  CHECK(encode_checkpoint(c.state, c.user) == bytes);
  CHECK(c.state.group_size == group_size);
  CHECK(c.state.schema == options().schema);
  CHECK(c.state.stats.balanced());
  CHECK((c.state.open.size() + c.state.ready.size()) > 0);
  // The restored buffer holds exactly what the original did.
  rollout_buffer b(options());
  b.restore(c.state);
  CHECK(encode_checkpoint(b.snapshot(), c.user) == bytes);
}

TEST_CASE("restore yields exactly the same subsequent batches (random kill points)") {
  test::rng r(50);
  const fs::path dir = temp_dir("killpoints");
  for (int trial = 0; trial < 12; ++trial) {
    const auto ops = script(r, 40);
    const auto kill = static_cast<std::size_t>(r.integer(0, static_cast<std::int64_t>(ops.size())));
    CAPTURE(trial);
    CAPTURE(kill);
    rollout_buffer a(options());
    apply(a, ops, 0, kill);
    rollout_buffer b(options());
    std::vector<std::byte> user;
    if (trial % 2 == 0) {
      save_checkpoint(a, dir / "buffer.ckpt", blob("step=7"));
      user = restore_checkpoint(b, dir / "buffer.ckpt");
    } else {
      const checkpoint c = decode_checkpoint(encode_checkpoint(a.snapshot(), blob("step=7")));
      b.restore(c.state);
      user = c.user;
    }
    CHECK(user == blob("step=7"));
    const result ra = apply(a, ops, kill, ops.size());
    const result rb = apply(b, ops, kill, ops.size());
    CHECK(ra.statuses == rb.statuses);
    REQUIRE(ra.pops.size() == rb.pops.size());
    for (std::size_t i = 0; i < ra.pops.size(); ++i) {
      REQUIRE(ra.pops[i].has_value() == rb.pops[i].has_value());
      if (ra.pops[i]) CHECK(*ra.pops[i] == *rb.pops[i]);
    }
    const buffer_stats sa = a.stats(), sb = b.stats();
    CHECK(sa.inserted == sb.inserted);
    CHECK(sa.consumed == sb.consumed);
    CHECK(sa.evicted == sb.evicted);
    CHECK(sa.resident == sb.resident);
    CHECK(sa.dropped_by_filter == sb.dropped_by_filter);
    CHECK(sb.balanced());
    CHECK(encode_checkpoint(a.snapshot()) == encode_checkpoint(b.snapshot()));
  }
  fs::remove_all(dir);
}

TEST_CASE("checkpoint files are replaced atomically and leave no temporary files") {
  const fs::path dir = temp_dir("files");
  test::rng r(51);
  const auto ops = script(r, 10);
  rollout_buffer a(options());
  apply(a, ops, 0, ops.size() / 2);
  save_checkpoint(a, dir / "c.bin");
  apply(a, ops, ops.size() / 2, ops.size());
  save_checkpoint(a, dir / "c.bin", blob("second"));
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  CHECK(names == std::vector<std::string>{"c.bin"});
  const checkpoint c = load_checkpoint(dir / "c.bin");
  CHECK(c.user == blob("second"));
  CHECK(encode_checkpoint(c.state, c.user) == encode_checkpoint(a.snapshot(), blob("second")));

  RLPT_CHECK_ERROR(save_checkpoint(a, dir / "missing" / "c.bin"), "rlpt.rollout.checkpoint_io", "cannot create",
                   "missing");
  RLPT_CHECK_ERROR(load_checkpoint(dir / "nope.bin"), "rlpt.rollout.checkpoint_io", "cannot open", "nope.bin");
  fs::remove_all(dir);
}

TEST_CASE("restore refuses a used buffer, different options and inconsistent states") {
  const checkpoint c = decode_checkpoint(sample_checkpoint(2));
  test::rng r(52);
  {
    rollout_buffer used(options());
    CHECK(used.push(make(r, 1000, 0)));
    RLPT_CHECK_ERROR(used.restore(c.state), "rlpt.rollout.restore_nonempty", "fresh buffer", "1 records");
  }
  {
    buffer_options o = options();
    o.group_size = 4;
    rollout_buffer b(o);
    RLPT_CHECK_ERROR(b.restore(c.state), "rlpt.rollout.restore_mismatch", "group_size 3", "4");
  }
  {
    buffer_options o = options();
    o.schema.extras[0].width = 2;
    rollout_buffer b(o);
    RLPT_CHECK_ERROR(b.restore(c.state), "rlpt.rollout.restore_mismatch", "record schema");
  }
  {
    buffer_options o = options();
    o.filters.clear();
    rollout_buffer b(o);
    RLPT_CHECK_ERROR(b.restore(c.state), "rlpt.rollout.restore_mismatch", "1 filters", "has 0");
  }
  {
    buffer_state s = c.state;
    s.stats.resident.records += 1;
    s.stats.inserted.records += 1;
    rollout_buffer b(options());
    RLPT_CHECK_ERROR(b.restore(s), "rlpt.rollout.restore_inconsistent", "do not match");
  }
  {
    buffer_state s = c.state;
    auto& list = s.ready.empty() ? s.open : s.ready;
    REQUIRE_FALSE(list.empty());
    list[0].records[0].group_id += 1000;
    rollout_buffer b(options());
    RLPT_CHECK_ERROR(b.restore(s), "rlpt.rollout.restore_inconsistent", "group_id");
  }
  {
    buffer_state s = c.state;
    auto& list = s.ready.empty() ? s.open : s.ready;
    list[0].records[0].loss_mask[0] = 1; // a prompt token marked trained
    rollout_buffer b(options());
    RLPT_CHECK_ERROR(b.restore(s), "rlpt.rollout.record_value", "loss_mask[0]");
  }
}

TEST_CASE("corrupted and truncated checkpoints give clear errors") {
  const std::vector<std::byte> good = sample_checkpoint(3);
  auto cut = [&](std::size_t n) {
    return std::vector<std::byte>(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(n));
  };
  RLPT_CHECK_ERROR(decode_checkpoint(cut(10)), "rlpt.rollout.checkpoint_corrupt", "truncated", "10 bytes");
  RLPT_CHECK_ERROR(decode_checkpoint(cut(good.size() - 5)), "rlpt.rollout.checkpoint_corrupt", "truncated",
                   "announces");
  std::vector<std::byte> longer = good;
  longer.push_back(std::byte{0});
  RLPT_CHECK_ERROR(decode_checkpoint(longer), "rlpt.rollout.checkpoint_corrupt", "trailing bytes");
  std::vector<std::byte> flipped = good;
  flipped[good.size() / 2] ^= std::byte{0x10};
  RLPT_CHECK_ERROR(decode_checkpoint(flipped), "rlpt.rollout.checkpoint_corrupt", "payload checksum mismatch");
  flipped = good;
  flipped[17] ^= std::byte{0x01}; // payload size field
  RLPT_CHECK_ERROR(decode_checkpoint(flipped), "rlpt.rollout.checkpoint_corrupt", "header checksum mismatch");
  flipped = good;
  flipped[0] = std::byte{'X'};
  RLPT_CHECK_ERROR(decode_checkpoint(flipped), "rlpt.rollout.checkpoint_corrupt", "RLPTRBUF");
  const std::span<const std::byte> payload(good.data() + 40, good.size() - 40);
  RLPT_CHECK_ERROR(decode_checkpoint(resign(payload, 2)), "rlpt.rollout.checkpoint_version", "version 2");
  RLPT_CHECK_ERROR(decode_checkpoint(resign(payload, 1, 4)), "rlpt.rollout.checkpoint_corrupt", "flags 0x4");
  CHECK_NOTHROW(decode_checkpoint(resign(payload)));
  // Behind valid checksums the parser still names what is wrong.
  std::vector<std::byte> p(payload.begin(), payload.end());
  RLPT_CHECK_ERROR(decode_checkpoint(resign(std::span(p).first(p.size() - 3))), "rlpt.rollout.checkpoint_corrupt",
                   "truncated");
  p[0] = std::byte{0}; // group_size = 0 (low byte of 3)
  RLPT_CHECK_ERROR(decode_checkpoint(resign(p)), "rlpt.rollout.checkpoint_corrupt", "group_size", "0");
}

TEST_CASE("fuzz: mutated checkpoints give rlpt errors or valid buffers, never a crash" * doctest::timeout(120)) {
  test::rng r(53);
  std::vector<std::vector<std::byte>> seeds;
  for (std::uint64_t s = 0; s < 4; ++s) seeds.push_back(sample_checkpoint(100 + s, 6 + static_cast<index_t>(s) * 4));
  int decoded = 0, restored = 0, errors = 0, parser_errors = 0;
  auto mutate = [&](std::vector<std::byte>& b) {
    const int kind = static_cast<int>(r.integer(0, 5));
    const auto pos = [&] { return static_cast<std::size_t>(r.integer(0, static_cast<std::int64_t>(b.size()) - 1)); };
    if (b.empty()) return;
    switch (kind) {
    case 0: // bit flips
      for (int i = 0, n = static_cast<int>(r.integer(1, 8)); i < n; ++i)
        b[pos()] ^= static_cast<std::byte>(1u << r.integer(0, 7));
      break;
    case 1: // random bytes
      for (int i = 0, n = static_cast<int>(r.integer(1, 16)); i < n; ++i)
        b[pos()] = static_cast<std::byte>(r.integer(0, 255));
      break;
    case 2: // truncation
      b.resize(pos());
      break;
    case 3: { // insertion
      const auto at = static_cast<std::ptrdiff_t>(pos());
      std::vector<std::byte> ins(static_cast<std::size_t>(r.integer(1, 32)));
      for (auto& x : ins) x = static_cast<std::byte>(r.integer(0, 255));
      b.insert(b.begin() + at, ins.begin(), ins.end());
      break;
    }
    case 4: { // deletion
      const auto at = pos();
      const auto n = std::min<std::size_t>(b.size() - at, static_cast<std::size_t>(r.integer(1, 32)));
      b.erase(b.begin() + static_cast<std::ptrdiff_t>(at), b.begin() + static_cast<std::ptrdiff_t>(at + n));
      break;
    }
    default: { // a huge or negative 64-bit value where a count or size may sit
      const auto at = pos() & ~std::size_t{7};
      if (at + 8 <= b.size()) {
        const std::uint64_t v = r.bernoulli(0.5) ? ~std::uint64_t{0} - static_cast<std::uint64_t>(r.integer(0, 3))
                                                 : static_cast<std::uint64_t>(r.integer(0, 1 << 20));
        std::memcpy(b.data() + at, &v, 8);
      }
    }
    }
  };
  for (int iter = 0; iter < 6000; ++iter) {
    const auto& seed = seeds[static_cast<std::size_t>(iter) % seeds.size()];
    const bool resigned = iter % 3 != 0;
    std::vector<std::byte> bytes;
    if (resigned) {
      std::vector<std::byte> payload(seed.begin() + 40, seed.end());
      for (int m = 0, n = static_cast<int>(r.integer(1, 3)); m < n; ++m) mutate(payload);
      bytes = resign(payload);
    } else {
      bytes = seed;
      mutate(bytes);
    }
    try {
      checkpoint c = decode_checkpoint(bytes);
      ++decoded;
      rollout_buffer b(options());
      b.restore(std::move(c.state));
      ++restored;
      CHECK(b.stats().balanced());
      b.close();
      while (!b.pop(4).empty()) {}
      b.evict_incomplete();
      CHECK(b.stats().resident == flow_count{});
    } catch (const rlpt::error& e) {
      ++errors;
      parser_errors += e.message().find("checksum") == std::string::npos;
    }
  }
  MESSAGE("fuzz: ", decoded, " decoded (", restored, " restored), ", errors, " rlpt errors (", parser_errors,
          " from the parser or restore checks)");
  CHECK(errors > 0);
  CHECK(parser_errors > 1000); // the re-signed mutations really exercised the parser
}

namespace {

// A pid that certainly ran and no longer runs: a child that exited and was reaped.
pid_t dead_pid() {
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  REQUIRE(child > 0);
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  return child;
}

void touch(const fs::path& p) { std::ofstream(p) << "partial"; }

} // namespace

TEST_CASE("temporary files of a killed save are removed by the next save and by a load") {
  const fs::path dir = temp_dir("stale_tmp");
  test::rng r(53);
  const auto ops = script(r, 6);
  rollout_buffer a(options());
  apply(a, ops, 0, ops.size());
  const pid_t dead = dead_pid();
  const std::string mine = std::to_string(::getpid());
  // What kill -9 during save_checkpoint(a, dir / "c.bin") leaves behind, and files to keep:
  const fs::path stale1 = dir / ("c.bin.tmp." + std::to_string(dead) + ".0");
  const fs::path stale2 = dir / ("c.bin.tmp." + std::to_string(dead) + ".17");
  const fs::path own = dir / ("c.bin.tmp." + mine + ".99");                   // this process's (a concurrent save)
  const fs::path running = dir / "c.bin.tmp.1.3";                             // pid 1 runs
  const fs::path other = dir / ("d.bin.tmp." + std::to_string(dead) + ".0");  // another checkpoint's
  const fs::path unlike = dir / ("c.bin.tmp." + std::to_string(dead) + ".x"); // not a writer's name
  for (const auto& p : {stale1, stale2, own, running, other, unlike}) touch(p);

  save_checkpoint(a, dir / "c.bin");
  CHECK_FALSE(fs::exists(stale1));
  CHECK_FALSE(fs::exists(stale2));
  CHECK(fs::exists(own));
  CHECK(fs::exists(running));
  CHECK(fs::exists(other));
  CHECK(fs::exists(unlike));
  CHECK(fs::exists(dir / "c.bin"));

  // Loading cleans too (a run that crashed while saving, restarted and resumed from the file).
  touch(stale1);
  const checkpoint c = load_checkpoint(dir / "c.bin");
  CHECK(encode_checkpoint(c.state) == encode_checkpoint(a.snapshot()));
  CHECK_FALSE(fs::exists(stale1));
  CHECK(remove_stale_checkpoint_temporaries(dir / "d.bin") == 1);
  CHECK_FALSE(fs::exists(other));
  CHECK(remove_stale_checkpoint_temporaries(dir / "c.bin") == 0);
  fs::remove_all(dir);
}

TEST_CASE("restore errors name the field that differs and both values") {
  const checkpoint c = decode_checkpoint(sample_checkpoint(4));
  {
    buffer_options o = options();
    o.schema.extras[0].width = 2;
    rollout_buffer b(o);
    RLPT_CHECK_ERROR(b.restore(c.state), "rlpt.rollout.restore_mismatch", "record schema",
                     "extras[0] is 'experts' (i32 x 3) in the state, 'experts' (i32 x 2) in this buffer");
  }
  {
    // Schemas that print alike but for an extra column only one of them has.
    buffer_options o = options();
    o.schema.extras.push_back({"teacher", dtype::f32, 1});
    rollout_buffer b(o);
    RLPT_CHECK_ERROR(b.restore(c.state), "rlpt.rollout.restore_mismatch",
                     "the state has 1 extras and this buffer has 2",
                     "extras[1] 'teacher' (f32 x 1) is only in this buffer");
  }
  {
    buffer_options o = options();
    o.schema.logprobs = false;
    rollout_buffer b(o);
    RLPT_CHECK_ERROR(b.restore(c.state), "rlpt.rollout.restore_mismatch",
                     "logprobs is true in the state, false in this buffer");
  }
  {
    // Equal resident record counts, but the token counter differs: the message says which.
    buffer_state s = c.state;
    s.stats.resident.tokens += 5;
    s.stats.inserted.tokens += 5;
    rollout_buffer b(options());
    RLPT_CHECK_ERROR(b.restore(s), "rlpt.rollout.restore_inconsistent", "stats.resident.tokens = ",
                     fmt::format("= {}, but the state holds {} tokens", c.state.stats.resident.tokens + 5,
                                 c.state.stats.resident.tokens));
  }
  {
    buffer_state s = c.state;
    s.stats.ready_groups += 1;
    rollout_buffer b(options());
    RLPT_CHECK_ERROR(b.restore(s), "rlpt.rollout.restore_inconsistent",
                     fmt::format("stats.ready_groups = {}, but the state holds {} ready groups", s.stats.ready_groups,
                                 c.state.ready.size()));
  }
  {
    buffer_state s = c.state;
    s.stats.consumed.groups += 2;
    rollout_buffer b(options());
    RLPT_CHECK_ERROR(b.restore(s), "rlpt.rollout.restore_inconsistent", "do not balance",
                     fmt::format("stats.inserted.groups = {}", s.stats.inserted.groups));
  }
  {
    // Counters a file may hold (each <= 2^62) whose sum overflows: an error, not signed overflow.
    buffer_state s = c.state;
    for (auto& e : s.stats.evicted) e.records = index_t{1} << 62;
    rollout_buffer b(options());
    RLPT_CHECK_ERROR(b.restore(s), "rlpt.rollout.restore_inconsistent", "overflow a 64-bit count",
                     "stats.inserted.records");
    const checkpoint again = decode_checkpoint(encode_checkpoint(s));
    RLPT_CHECK_ERROR(b.restore(again.state), "rlpt.rollout.restore_inconsistent", "overflow a 64-bit count");
  }
  {
    buffer_state s = c.state;
    auto& list = s.ready.empty() ? s.open : s.ready;
    list[0].info.samples += 1;
    rollout_buffer b(options());
    RLPT_CHECK_ERROR(
        b.restore(s), "rlpt.rollout.restore_inconsistent",
        fmt::format("holds {} records but its samples counter says {}", list[0].records.size(), list[0].info.samples));
  }
}
