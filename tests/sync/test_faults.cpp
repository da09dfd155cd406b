// SPDX-License-Identifier: Apache-2.0
// Faults between sender and receiver (in-process link with injected corruption, loss, stalls):
// every failure is reported with a stable id and leaves the previous version intact and
// readable; the next update succeeds. Also: the receiver fed fuzzed frames.
#include "receiver_loop.hpp"

using namespace rlpt::sync;
using namespace rlpt::test::sync;
using namespace std::chrono_literals;

namespace {

const plan_options small_buckets{.bucket_bytes = 1024, .alignment = 256};

// One sender/receiver pair with a fault hook on what the sender sends.
struct rig {
  model md;
  manifest m;
  inproc_pipe pipe;
  inproc_transport tl{pipe, role::sender};
  inproc_transport rl{pipe, role::receiver};
  faulty_link fl{tl};
  sink s;
  std::function<void(const tensor_view&)> before_load; // runs before the sink (may throw)
  std::unique_ptr<sender> tx;
  std::unique_ptr<receiver> rx;
  std::unique_ptr<receiver_loop> loop;
  rlpt::test::rng r{77};

  explicit rig(sender_options so = {}, receiver_options ro = {}, std::uint64_t seed = 1)
      : md(make_model(seed)), m(plan(md.refs, small_buckets)) {
    if (so.timeout == sender_options{}.timeout) so.timeout = 500ms;
    if (so.commit_timeout == sender_options{}.commit_timeout) so.commit_timeout = 2s;
    if (ro.timeout == receiver_options{}.timeout) ro.timeout = 300ms;
    tx = std::make_unique<sender>(fl, m, md.refs, so);
    rx = std::make_unique<receiver>(
        rl,
        [this, f = s.fn()](const tensor_view& t) {
          if (before_load) before_load(t);
          f(t);
        },
        std::move(ro));
    loop = std::make_unique<receiver_loop>(*rx);
  }

  // Publishes `v`, returns the receiver's report of it.
  update publish_expecting_failure(std::uint64_t v, std::string_view sender_id) {
    const std::size_t before = loop->seen().size();
    RLPT_CHECK_ERROR(tx->publish(v), std::string(sender_id));
    const auto ups = loop->wait(before + 1);
    REQUIRE(ups.size() == before + 1);
    return ups.back();
  }
};

// The receiver still serves `want` (bytes captured at the last good version).
void check_intact(const receiver& rx, std::uint64_t version,
                  const std::map<std::string, std::vector<std::byte>>& want) {
  CHECK(rx.version() == version);
  for (const auto& [name, bytes] : want) CHECK(same_bytes(rx.tensor(name).bytes, bytes));
}

std::map<std::string, std::vector<std::byte>> snapshot(model& md) {
  std::map<std::string, std::vector<std::byte>> out;
  for (const auto& t : md.refs) out[t.name].assign(md.bytes(t.name).begin(), md.bytes(t.name).end());
  return out;
}

} // namespace

TEST_CASE("faults: a corrupted bucket fails its checksum, the previous version stays, the next update succeeds") {
  rig g;
  g.tx->publish(1);
  REQUIRE(g.loop->wait(1).size() == 1);
  const auto v1 = snapshot(g.md);
  g.md.step(0.3, g.r);
  g.fl.on_send = [](std::size_t, std::vector<std::byte>& meta, std::span<std::byte> payload) {
    if (type_of(meta) == frame_type::bucket && meta[24] == std::byte{2}) payload[100] ^= std::byte{0x10}; // bucket 2
    return true;
  };
  const update u = g.publish_expecting_failure(2, "rlpt.sync.checksum");
  CHECK(u.failed());
  CHECK(u.error_id == "rlpt.sync.checksum");
  CHECK(u.reason.find("bucket 2 of version 2") != std::string::npos);
  CHECK(u.reason.find("the sender's is") != std::string::npos);
  CHECK_FALSE(u.partial);
  check_intact(*g.rx, 1, v1);
  g.fl.on_send = nullptr;
  g.tx->publish(3);
  REQUIRE(g.loop->wait(3).size() == 3);
  check_mirror(*g.rx, g.md);
}

TEST_CASE("faults: staged updates reuse the replaced mirror as staging, failures there leave the published version") {
  // From the third dense update on, the receiver stages into the mirror that the previous
  // commit replaced. A failure after every byte was staged must still leave the published
  // version readable and unchanged, and the next update must stage into the same memory.
  rig g;
  std::vector<const std::byte*> at; // mirror address of each published version
  const std::string name = "model.layers.1.mlp.up_proj.weight";
  for (std::uint64_t v = 1; v <= 3; ++v) {
    g.md.step(0.1, g.r);
    g.tx->publish(v);
    REQUIRE(g.loop->wait(v).back().published());
    at.push_back(g.rx->tensor(name).bytes.data());
  }
  CHECK(at[2] == at[0]); // version 3 was staged into version 1's memory
  const auto v3 = snapshot(g.md);
  const std::uint64_t last = g.m.bucket_count() - 1;
  g.md.step(0.3, g.r);
  std::string id;
  SUBCASE("the last bucket is corrupted") {
    g.fl.on_send = [last](std::size_t, std::vector<std::byte>& meta, std::span<std::byte> payload) {
      if (type_of(meta) == frame_type::bucket && static_cast<std::uint64_t>(meta[24]) == last)
        payload[0] ^= std::byte{1};
      return true;
    };
    id = "rlpt.sync.checksum";
  }
  SUBCASE("a tensor checksum in COMMIT disagrees (everything was staged)") {
    g.fl.on_send = [](std::size_t, std::vector<std::byte>& meta, std::span<std::byte>) {
      if (type_of(meta) != frame_type::commit) return true;
      const frame f = decode_frame(meta, "t");
      std::vector<std::byte> body(f.body.begin(), f.body.end());
      body[body.size() - 8] ^= std::byte{1};
      std::vector<std::byte> out;
      encode_frame(out, frame_type::commit, f.tag, f.version, f.base_version, f.index, f.count, 0, body);
      meta = out;
      return true;
    };
    id = "rlpt.sync.checksum";
  }
  SUBCASE("the load callback throws at commit (after loading from the staging area)") {
    int calls = 0;
    g.before_load = [calls](const tensor_view&) mutable {
      if (++calls == 5) throw std::runtime_error("engine ran out of memory");
    };
    id = "rlpt.sync.load_failed";
  }
  const update u = g.publish_expecting_failure(4, id);
  CHECK(u.error_id == id);
  check_intact(*g.rx, 3, v3);
  CHECK(g.rx->tensor(name).bytes.data() == at[2]);
  g.fl.on_send = nullptr;
  g.before_load = nullptr;
  g.tx->publish(5);
  REQUIRE(g.loop->wait(5).back().published());
  check_mirror(*g.rx, g.md);
  CHECK(g.rx->tensor(name).bytes.data() == at[1]); // staged into version 2's memory, as the failed update was
  g.md.step(0.1, g.r);
  g.tx->publish(6);
  REQUIRE(g.loop->wait(6).back().published());
  check_mirror(*g.rx, g.md);
  CHECK(g.rx->tensor(name).bytes.data() == at[2]);
}

TEST_CASE("faults: a lost bucket, a truncated stream and a lost COMMIT are reported") {
  rig g;
  g.tx->publish(1);
  REQUIRE(g.loop->wait(1).size() == 1);
  const auto v1 = snapshot(g.md);
  const std::uint64_t last = g.m.bucket_count() - 1;
  SUBCASE("lost bucket") {
    g.fl.on_send = [](std::size_t, std::vector<std::byte>& meta, std::span<std::byte>) {
      return !(type_of(meta) == frame_type::bucket && meta[24] == std::byte{1});
    };
    const update u = g.publish_expecting_failure(2, "rlpt.sync.protocol");
    CHECK(u.reason.find("got bucket 2 of version 2, expected bucket 1 of") != std::string::npos);
  }
  SUBCASE("truncated stream") {
    g.fl.on_send = [last](std::size_t, std::vector<std::byte>& meta, std::span<std::byte>) {
      return !(type_of(meta) == frame_type::bucket && static_cast<std::uint64_t>(meta[24]) == last);
    };
    const update u = g.publish_expecting_failure(2, "rlpt.sync.truncated");
    CHECK(u.reason.find("COMMIT of version 2 counts") != std::string::npos);
  }
  SUBCASE("lost COMMIT: both sides time out") {
    g.fl.on_send = [](std::size_t, std::vector<std::byte>& meta, std::span<std::byte>) {
      return type_of(meta) != frame_type::commit;
    };
    const update u = g.publish_expecting_failure(2, "rlpt.sync.timeout");
    CHECK(u.error_id == "rlpt.sync.timeout");
    CHECK(u.reason.find("waiting for COMMIT of version 2") != std::string::npos);
  }
  check_intact(*g.rx, 1, v1);
  g.fl.on_send = nullptr;
  g.tx->publish(3);
  REQUIRE(g.loop->wait(3).back().published());
  check_mirror(*g.rx, g.md);
}

TEST_CASE("faults: a lost ACK: the retry finds the receiver holding the version and completes without resending") {
  for (const bool changed_before_retry : {false, true}) {
    CAPTURE(changed_before_retry);
    model md = make_model(5);
    const manifest m = plan(md.refs, small_buckets);
    inproc_pipe pipe;
    inproc_transport tl(pipe, role::sender), rl_inner(pipe, role::receiver);
    faulty_link rl(rl_inner); // what the receiver sends: its ACK of version 2 is lost once
    bool lost = false;
    rl.on_send = [&](std::size_t, std::vector<std::byte>& meta, std::span<std::byte>) {
      std::uint64_t v;
      std::memcpy(&v, meta.data() + 8, 8);
      if (lost || type_of(meta) != frame_type::ack || v != 2) return true;
      lost = true;
      return false;
    };
    sender tx(tl, m, md.refs, {.delta = true, .timeout = 500ms, .commit_timeout = 500ms});
    receiver rx(rl, [](const tensor_view&) {}, {.timeout = 300ms});
    receiver_loop loop(rx);
    tx.publish(1);
    rlpt::test::rng r(9);
    md.step(0.02, r);
    RLPT_CHECK_ERROR(tx.publish(2), "rlpt.sync.timeout", "waiting for the receivers to commit");
    REQUIRE(loop.wait(2).size() == 2);
    CHECK(loop.seen()[1].published()); // the receiver did publish it
    // A retry confirms the attempt it repeats: the receiver holds that attempt's bytes (even if
    // the caller changed its tensors since: publish() reports what the receiver holds).
    if (changed_before_retry) md.step(0.02, r);
    const publish_result again = tx.publish(2);
    CHECK(again.confirmed);
    CHECK(again.messages == 0);
    CHECK(tx.published_version() == 2);
    CHECK(again.digest == loop.seen()[1].digest);
    CHECK(tx.digest() == rx.digest());
    md.step(0.02, r);
    const publish_result next = tx.publish(3);
    CHECK_FALSE(next.delta); // the sender's delta base did not advance with the lost ACK: dense
    const auto ups = loop.wait(4);
    CHECK(ups.back().published());
    CHECK(ups.back().version == 3);
    loop.stop();
    check_mirror(rx, md);
  }
}

TEST_CASE("faults: a COMMIT whose tensor checksum disagrees is rejected") {
  rig g;
  g.tx->publish(1);
  REQUIRE(g.loop->wait(1).size() == 1);
  const auto v1 = snapshot(g.md);
  g.md.step(0.2, g.r);
  g.fl.on_send = [](std::size_t, std::vector<std::byte>& meta, std::span<std::byte>) {
    if (type_of(meta) != frame_type::commit) return true;
    const frame f = decode_frame(meta, "t");
    std::vector<std::byte> body(f.body.begin(), f.body.end());
    body[3 * 8] ^= std::byte{1}; // tensor 3
    std::vector<std::byte> out;
    encode_frame(out, frame_type::commit, f.tag, f.version, f.base_version, f.index, f.count, 0, body);
    meta = out;
    return true;
  };
  const update u = g.publish_expecting_failure(2, "rlpt.sync.checksum");
  CHECK(u.reason.find("tensor \"model.layers.0.mlp.gate_proj.weight\" arrived with checksum") != std::string::npos);
  check_intact(*g.rx, 1, v1);
}

TEST_CASE("faults: a delta whose result fails its checksum is rolled back") {
  rig g({.delta = true});
  g.tx->publish(1);
  REQUIRE(g.loop->wait(1).size() == 1);
  const std::string name = "model.layers.1.mlp.up_proj.weight";
  const std::size_t victim = *g.m.find(name);
  const std::vector<std::byte> v1(g.rx->tensor(name).bytes.begin(), g.rx->tensor(name).bytes.end());
  // A record whose values are wrong but whose chunk checksum matches (a sender that encoded
  // against another snapshot): the base verifies, only the result checksum can catch it.
  g.fl.on_send = [victim](std::size_t, std::vector<std::byte>& meta, std::span<std::byte> payload) {
    if (type_of(meta) != frame_type::delta) return true;
    std::vector<std::byte> copy(payload.begin(), payload.end());
    bool hit = false;
    for_each_delta_record(std::span<std::byte>(copy), "test", [&](delta_record& rec) {
      if (rec.tensor == victim && rec.changed > 0) {
        payload[static_cast<std::size_t>(rec.values - copy.data())] ^= std::byte{0x40};
        hit = true;
      }
    });
    if (!hit) return true;
    const frame f = decode_frame(meta, "t");
    const std::uint64_t check = xxh3(payload.data(), payload.size());
    std::vector<std::byte> body(8), out;
    std::memcpy(body.data(), &check, 8);
    encode_frame(out, frame_type::delta, f.tag, f.version, f.base_version, f.index, f.count, payload.size(), body);
    meta = out;
    return true;
  };
  g.md.step(0.01, g.r);
  const update u = g.publish_expecting_failure(2, "rlpt.sync.checksum");
  CHECK(u.delta);
  CHECK(u.reason.find("after applying delta version 2, tensor \"model.layers.1.mlp.up_proj.weight\"") !=
        std::string::npos);
  CHECK(u.reason.find("rolled back to version 1") != std::string::npos);
  CHECK(g.rx->version() == 1);
  CHECK(same_bytes(g.rx->tensor(name).bytes, v1)); // exactly as before the update
  CHECK(g.rx->verify() == model_digest(g.rx->published_manifest()));
  // The receiver now takes only a dense update: the next delta is refused and sent dense.
  g.fl.on_send = nullptr;
  const publish_result p = g.tx->publish(3);
  CHECK(p.fell_back);
  CHECK_FALSE(p.delta);
  REQUIRE(g.loop->wait(3).back().published());
  check_mirror(*g.rx, g.md);
  g.md.step(0.01, g.r);
  CHECK(g.tx->publish(4).delta);
  REQUIRE(g.loop->wait(4).back().published());
  check_mirror(*g.rx, g.md);
}

TEST_CASE("faults: a delta over a damaged receiver copy is not published, the sender resends the version dense") {
  // Issue 18: the receiver's copy of the published version is damaged behind its back (a
  // stray write, a bad DIMM). A delta must not be applied to it and published, whether it
  // touches the damaged tensor or not; the receiver NACKs with base_mismatch and the sender
  // resends the same version dense within the same publish().
  rig g({.delta = true});
  const publish_result p1 = g.tx->publish(1);
  REQUIRE(g.loop->wait(1).size() == 1);
  CHECK(p1.digest == g.tx->digest());
  CHECK(g.rx->digest() == p1.digest);
  CHECK(g.loop->seen()[0].digest == p1.digest);
  CHECK(g.rx->verify() == p1.digest);
  const std::string damaged = "model.layers.1.mlp.up_proj.weight";
  const tensor_view t = g.rx->tensor(damaged);
  const_cast<std::byte*>(t.bytes.data())[10] ^= std::byte{0x40};
  RLPT_CHECK_ERROR(static_cast<void>(g.rx->verify()), "rlpt.sync.checksum",
                   "version 1: tensor \"model.layers.1.mlp.up_proj.weight\" now has checksum");
  SUBCASE("the delta touches the damaged tensor") { g.md.step(0.01, g.r); }
  SUBCASE("the delta does not touch it") { g.md.bytes("model.layers.0.mlp.gate_proj.weight")[6] ^= std::byte{1}; }
  const publish_result p2 = g.tx->publish(2);
  CHECK(p2.fell_back);
  CHECK_FALSE(p2.delta);
  const auto ups = g.loop->wait(3);
  REQUIRE(ups.size() == 3);
  CHECK(ups[1].failed());
  CHECK(ups[1].delta);
  CHECK(ups[1].version == 2);
  CHECK(ups[1].error_id == "rlpt.sync.base_mismatch");
  CHECK(ups[1].reason.find("tensor \"model.layers.1.mlp.up_proj.weight\" has checksum") != std::string::npos);
  CHECK(ups[1].reason.find("whose copy here is damaged") != std::string::npos);
  CHECK(ups[2].published());
  CHECK_FALSE(ups[2].delta);
  CHECK(ups[2].version == 2);
  CHECK(ups[2].digest == p2.digest);
  check_mirror(*g.rx, g.md);
  CHECK(g.rx->verify() == g.tx->digest());
  g.md.step(0.01, g.r);
  const publish_result p3 = g.tx->publish(3); // deltas resume on the verified dense base
  CHECK(p3.delta);
  CHECK_FALSE(p3.fell_back);
  REQUIRE(g.loop->wait(4).back().published());
  check_mirror(*g.rx, g.md);
  CHECK(g.rx->verify() == p3.digest);
}

TEST_CASE("faults: corrupted frames, wrong manifest hash, stale versions") {
  SUBCASE("a damaged meta block is a wire error") {
    rig g;
    g.fl.on_send = [](std::size_t i, std::vector<std::byte>& meta, std::span<std::byte>) {
      if (i == 2) meta[30] ^= std::byte{4};
      return true;
    };
    const update u = g.publish_expecting_failure(1, "rlpt.sync.wire");
    CHECK(u.reason.find("frame checksum") != std::string::npos);
    CHECK_FALSE(g.rx->has_version());
  }
  SUBCASE("the receiver expects another layout") {
    rig g({}, {.expect_layout_hash = 0x1234});
    const update u = g.publish_expecting_failure(1, "rlpt.sync.manifest_hash");
    CHECK(u.reason.find("this receiver expects 0000000000001234") != std::string::npos);
  }
  SUBCASE("BEGIN announces a layout hash its manifest does not have") {
    rig g;
    g.fl.on_send = [](std::size_t, std::vector<std::byte>& meta, std::span<std::byte>) {
      if (type_of(meta) != frame_type::begin) return true;
      const frame f = decode_frame(meta, "t");
      std::vector<std::byte> out;
      encode_frame(out, frame_type::begin, f.tag, f.version, f.base_version, f.index, f.count ^ 1, 0, f.body);
      meta = out;
      return true;
    };
    const update u = g.publish_expecting_failure(1, "rlpt.sync.manifest_hash");
    CHECK(u.reason.find("but its manifest hashes to") != std::string::npos);
  }
  SUBCASE("a restarted trainer publishing an older version is refused") {
    rig g;
    g.tx->publish(5);
    REQUIRE(g.loop->wait(1).size() == 1);
    sender again(g.fl, g.m, g.md.refs, {.timeout = 500ms});
    RLPT_CHECK_ERROR(again.publish(3), "rlpt.sync.stale_version",
                     "version 3 is not newer than the published version 5");
    CHECK(g.rx->version() == 5);
  }
}

TEST_CASE("faults: abort from another thread stops the publish and the receiver says why") {
  rig g;
  g.tx->publish(1);
  REQUIRE(g.loop->wait(1).size() == 1);
  const auto v1 = snapshot(g.md);
  g.md.step(0.1, g.r);
  std::atomic<int> buckets{0};
  g.fl.on_send = [&](std::size_t, std::vector<std::byte>& meta, std::span<std::byte>) {
    if (type_of(meta) == frame_type::bucket && ++buckets == 2) std::this_thread::sleep_for(100ms);
    return true;
  };
  std::thread killer([&] {
    while (buckets < 2) std::this_thread::sleep_for(1ms);
    g.tx->abort("trainer is shutting down");
  });
  const update u = g.publish_expecting_failure(2, "rlpt.sync.aborted");
  killer.join();
  CHECK(u.error_id == "rlpt.sync.aborted");
  CHECK(u.reason.find("trainer is shutting down") != std::string::npos);
  check_intact(*g.rx, 1, v1);
  g.fl.on_send = nullptr;
  g.tx->publish(2);
  REQUIRE(g.loop->wait(3).back().published());
}

TEST_CASE("faults: a throwing load callback fails the update and says the load was partial") {
  auto md = make_model(3);
  const manifest m = plan(md.refs, small_buckets);
  inproc_pipe pipe;
  inproc_transport tl(pipe, role::sender), rl(pipe, role::receiver);
  sender tx(tl, m, md.refs, {.timeout = 500ms, .commit_timeout = 2s});
  int calls = 0;
  receiver rx(rl, [&](const tensor_view& t) {
    if (++calls == 4) throw std::runtime_error(fmt::format("engine has no parameter {}", t.name));
  });
  receiver_loop loop(rx);
  RLPT_CHECK_ERROR(tx.publish(1), "rlpt.sync.load_failed", "engine has no parameter");
  const auto ups = loop.wait(1);
  REQUIRE(ups.size() == 1);
  CHECK(ups[0].error_id == "rlpt.sync.load_failed");
  CHECK(ups[0].partial);
  CHECK(ups[0].tensors_loaded == 3);
  CHECK_FALSE(rx.has_version());
}

TEST_CASE("faults: the receiver survives fuzzed frame sequences") {
  // Record a valid dense + delta exchange, then replay mutants of it into fresh receivers.
  auto md = make_model(4, 1);
  const manifest m = plan(md.refs, small_buckets);
  std::vector<std::pair<std::vector<std::byte>, std::vector<std::byte>>> recorded; // (meta, payload)
  {
    inproc_pipe pipe;
    inproc_transport tl(pipe, role::sender), rl(pipe, role::receiver);
    faulty_link fl(tl);
    fl.on_send = [&](std::size_t, std::vector<std::byte>& meta, std::span<std::byte> payload) {
      recorded.emplace_back(meta, std::vector<std::byte>(payload.begin(), payload.end()));
      return true;
    };
    sender tx(fl, m, md.refs, {.delta = true});
    sink s;
    receiver rx(rl, s.fn());
    receiver_loop loop(rx);
    tx.publish(1);
    rlpt::test::rng r(5);
    md.step(0.05, r);
    tx.publish(2);
    REQUIRE(loop.wait(2).size() == 2);
  }
  REQUIRE(recorded.size() > 4);
  rlpt::test::rng r(6);
  int published = 0, failed = 0;
  for (int it = 0; it < 300; ++it) {
    inproc_pipe pipe({.slots = 64}); // the whole exchange fits: send it all, then let the receiver run
    inproc_transport tl(pipe, role::sender), rl(pipe, role::receiver);
    sink s;
    receiver rx(rl, s.fn(), {.timeout = 20ms});
    const std::size_t victim = static_cast<std::size_t>(r.integer(0, static_cast<std::int64_t>(recorded.size()) - 1));
    for (std::size_t k = 0; k < recorded.size(); ++k) {
      std::vector<std::byte> meta = recorded[k].first, payload = recorded[k].second;
      if (k == victim) {
        if (r.bernoulli(0.5) || payload.empty())
          meta = mutate(meta, r);
        else
          payload = mutate(payload, r);
      }
      const auto buf = tl.payload_buffer(payload.size(), after(1s));
      if (!payload.empty()) std::memcpy(buf.data(), payload.data(), payload.size());
      tl.send(meta, payload.size(), after(1s));
    }
    for (;;) {
      const update u = rx.poll(0ms);
      if (u.published()) ++published;
      if (u.failed()) {
        ++failed;
        CHECK(u.error_id.rfind("rlpt.sync.", 0) == 0);
        CHECK_FALSE(u.reason.empty());
      }
      if (u.state == update::status::idle) break;
    }
  }
  CHECK(failed > 0);
  CHECK(published > 0); // mutations of ignorable bytes (padding) still publish
}

TEST_CASE("faults: a BEGIN repeating the version before any of it arrived is a retry, a BEGIN of another version "
          "supersedes") {
  // One state machine for host and device receivers (issue 19): the device's retry rule (a
  // sender resending a refused delta dense, to a group) holds on the host too, and only for
  // the same version; a BEGIN of another version still fails the update it replaces.
  rig g;
  g.tx->publish(1);
  REQUIRE(g.loop->wait(1).size() == 1);
  std::uint64_t fake_version = 0;
  g.fl.on_send = [&](std::size_t, std::vector<std::byte>& meta, std::span<std::byte>) {
    if (type_of(meta) != frame_type::begin || fake_version == 0) return true;
    const frame f = decode_frame(meta, "t");
    std::vector<std::byte> fake; // an attempt the sender abandoned before sending anything else
    encode_frame(fake, frame_type::begin, f.tag ^ 0x5a5a, fake_version, f.base_version, f.index, f.count, 0, f.body);
    g.tl.send(fake, 0, after(1s));
    fake_version = 0;
    return true;
  };
  g.md.step(0.1, g.r);
  fake_version = 2; // same version as the real BEGIN that follows
  g.tx->publish(2);
  auto ups = g.loop->wait(2);
  REQUIRE(ups.size() == 2);
  CHECK(ups[1].published());
  CHECK(ups[1].version == 2);
  g.md.step(0.1, g.r);
  fake_version = 9; // another version: the real BEGIN of 3 supersedes it
  g.tx->publish(3);
  ups = g.loop->wait(4);
  REQUIRE(ups.size() == 4);
  CHECK(ups[2].failed());
  CHECK(ups[2].version == 9);
  CHECK(ups[2].error_id == "rlpt.sync.superseded");
  CHECK(ups[2].reason.find("version 9 was superseded by a BEGIN of version 3") != std::string::npos);
  CHECK(ups[3].published());
  CHECK(ups[3].version == 3);
  check_mirror(*g.rx, g.md);
}

TEST_CASE("faults: a failure after loading began makes the receiver take only a dense update next") {
  // The engine holds a mix after a partly loaded update. A delta loads only what changed, so
  // it cannot repair a tensor that the failed update loaded and the next version changes
  // back: the receiver (host and device alike, issue 19) accepts only a dense update next.
  rig g({.delta = true});
  g.tx->publish(1);
  REQUIRE(g.loop->wait(1).size() == 1);
  const std::string a = "model.layers.0.self_attn.q_proj.weight", b = "model.layers.0.self_attn.k_proj.weight";
  const std::vector<std::byte> a1(g.md.bytes(a).begin(), g.md.bytes(a).end());
  g.md.bytes(a)[0] ^= std::byte{1};
  g.md.bytes(b)[0] ^= std::byte{1};
  g.before_load = [&](const tensor_view& t) {
    if (t.name == b) throw std::runtime_error("engine rejected the tensor");
  };
  const update u = g.publish_expecting_failure(2, "rlpt.sync.load_failed");
  CHECK(u.delta);
  CHECK(u.partial);
  CHECK(u.tensors_loaded == 1); // `a` reached the engine
  CHECK(g.rx->dense_only());
  CHECK_FALSE(g.rx->torn()); // the mirror is intact: only the engine holds a mix
  g.before_load = nullptr;
  std::copy(a1.begin(), a1.end(), g.md.bytes(a).begin()); // version 3 has `a` as version 1 had it
  const publish_result p = g.tx->publish(3);
  CHECK(p.fell_back);
  CHECK_FALSE(p.delta);
  REQUIRE(g.loop->wait(3).back().published());
  CHECK_FALSE(g.rx->dense_only());
  for (const auto& t : g.md.refs) CHECK_MESSAGE(same_bytes(g.s.got.at(t.name), g.md.bytes(t.name)), t.name);
  g.md.step(0.01, g.r);
  CHECK(g.tx->publish(4).delta);
  REQUIRE(g.loop->wait(4).back().published());
  check_mirror(*g.rx, g.md);
}
