// SPDX-License-Identifier: Apache-2.0
// Preflight: capture, the wire form (round trip, every truncation and corruption refused), the
// comparison rules, and the exchange over a link (agreement, findings on both ends, a peer that
// starts the protocol instead, a peer that never answers).
#include <rlpt/sync/inproc.hpp>
#include <rlpt/sync/preflight.hpp>
#include <rlpt/sync/protocol.hpp>

#include "support/errors.hpp"

#include <doctest/doctest.h>

#include <chrono>
#include <cstdlib>
#include <future>
#include <string>
#include <vector>

namespace rs = rlpt::sync;
using namespace std::chrono_literals;

namespace {

rs::environment sample() {
  rs::environment e;
  e.host = "trainer-0";
  e.machine = "8c1f0d6e-2b9a-4c55-9d7e-1a2b3c4d5e6f";
  e.pid = 4242;
  e.variables = {{"NCCL_CUMEM_ENABLE", "0"}, {"NCCL_P2P_DISABLE", std::nullopt}, {"NCCL_PROTO", "Simple"}};
  e.devices = {{"GPU-0a1b2c3d-0000-1111-2222-333344445555", 0}, {"GPU-ffeeddcc-9999-8888-7777-666655554444", 3}};
  e.nccl = "2.21.5";
  e.cuda_runtime = "12.4";
  return e;
}

bool same(const rs::environment& a, const rs::environment& b) {
  if (a.rlpt_version != b.rlpt_version || a.protocol != b.protocol || a.host != b.host || a.machine != b.machine ||
      a.pid != b.pid || a.variables != b.variables || a.nccl != b.nccl || a.cuda_runtime != b.cuda_runtime ||
      a.devices.size() != b.devices.size())
    return false;
  for (std::size_t i = 0; i < a.devices.size(); ++i)
    if (a.devices[i].uuid != b.devices[i].uuid || a.devices[i].index != b.devices[i].index) return false;
  return true;
}

} // namespace

TEST_CASE("preflight: capture reads the version, the host, the boot id and the variables") {
  ::setenv("RLPT_TEST_PREFLIGHT_SET", "7", 1);
  ::unsetenv("RLPT_TEST_PREFLIGHT_UNSET");
  const std::string_view vars[] = {"RLPT_TEST_PREFLIGHT_SET", "RLPT_TEST_PREFLIGHT_UNSET"};
  const auto e = rs::capture_environment(vars);
  CHECK(e.rlpt_version == RLPT_VERSION);
  CHECK(e.protocol == rs::frame_protocol);
  CHECK_FALSE(e.host.empty());
  CHECK(e.machine.size() == 36); // a UUID, newline stripped
  CHECK(e.pid > 0);
  REQUIRE(e.variables.size() == 2);
  CHECK(e.variables[0] == std::pair<std::string, std::optional<std::string>>{"RLPT_TEST_PREFLIGHT_SET", "7"});
  CHECK(e.variables[1].first == "RLPT_TEST_PREFLIGHT_UNSET");
  CHECK_FALSE(e.variables[1].second.has_value());
  // the default set is NCCL's
  CHECK(rs::capture_environment().variables.size() == std::size(rs::nccl_parity_variables));
}

TEST_CASE("preflight: the wire form round-trips and refuses every truncation, extension and bad field") {
  const auto e = sample();
  const auto bytes = rs::encode_environment(e);
  CHECK(same(rs::decode_environment(bytes, "test"), e));
  CHECK(same(rs::decode_environment(rs::encode_environment(rs::environment{}), "test"), rs::environment{}));
  for (std::size_t n = 0; n < bytes.size(); ++n) {
    CAPTURE(n);
    RLPT_CHECK_ERROR(rs::decode_environment(std::span(bytes).first(n), "link x"), "rlpt.sync.wire", "link x");
  }
  auto long_host = e;
  long_host.host.assign(5000, 'h');
  RLPT_CHECK_ERROR((void)rs::encode_environment(long_host), "rlpt.sync.preflight", "host is 5000 bytes long");
  auto longer = bytes;
  longer.push_back(std::byte{0});
  RLPT_CHECK_ERROR(rs::decode_environment(longer, "x"), "rlpt.sync.wire", "1 bytes after its last field");
  auto bad_magic = bytes;
  bad_magic[0] = std::byte{0};
  RLPT_CHECK_ERROR(rs::decode_environment(bad_magic, "x"), "rlpt.sync.wire", "not a preflight");
  auto bad_format = bytes;
  bad_format[4] = std::byte{9};
  RLPT_CHECK_ERROR(rs::decode_environment(bad_format, "x"), "rlpt.sync.wire", "preflight format 9");
  // a string length past the limit, and a variable flag other than 0 or 1
  auto bad_len = bytes;
  const std::uint32_t huge = 1u << 30;
  std::memcpy(bad_len.data() + 12, &huge, 4); // the host's length
  RLPT_CHECK_ERROR(rs::decode_environment(bad_len, "x"), "rlpt.sync.wire", "host at byte 12", "over the limit");
  const std::size_t flag_at = 12 + 4 + e.host.size() + 4 + e.machine.size() + 8 + 4 + 4 + 17;
  auto bad_flag = bytes;
  REQUIRE(bad_flag[flag_at] == std::byte{1});
  bad_flag[flag_at] = std::byte{2};
  RLPT_CHECK_ERROR(rs::decode_environment(bad_flag, "x"), "rlpt.sync.wire", "NCCL_CUMEM_ENABLE has flag 2");
  // a protocol frame where a preflight belongs names the missing call
  std::vector<std::byte> frame;
  rs::encode_frame(frame, rs::frame_type::ready, 1, 0, 0, 0, 0, 0, {});
  RLPT_CHECK_ERROR(rs::decode_environment(frame, "x"), "rlpt.sync.wire", "update-protocol frame", "sync::preflight");
}

TEST_CASE("preflight: each rule finds its mismatch and names both values") {
  const auto a = sample();
  const auto peer = [&] { // the same environment on other GPUs
    auto e = a;
    e.devices = {{"GPU-12345678-9999-8888-7777-666655554444", 0}};
    return e;
  };
  auto b = peer();
  CHECK(rs::compare_environments(a, b, rs::preflight_rules::nccl()).empty());
  CHECK(rs::compare_environments(a, a, rs::preflight_rules::nccl()).size() == 2); // both GPUs shared
  b.rlpt_version = a.rlpt_version + 1;
  b.protocol = static_cast<std::uint16_t>(a.protocol + 1);
  auto f = rs::compare_environments(a, b, {});
  REQUIRE(f.size() == 2);
  CHECK(f[0].field == "rlpt version");
  CHECK(f[1].field == "wire protocol");
  CHECK(rs::compare_environments(a, b, {.same_version = false}).empty());

  b = peer();
  b.variables[0].second = std::nullopt; // NCCL_CUMEM_ENABLE unset on the peer
  b.variables[2].second = "LL128";
  b.variables.push_back({"NCCL_BUFFSIZE", "8388608"}); // only the peer reports it
  f = rs::compare_environments(a, b, rs::preflight_rules::nccl());
  REQUIRE(f.size() == 3);
  CHECK(f[0].field == "NCCL_CUMEM_ENABLE");
  CHECK(f[0].ours == "'0'");
  CHECK(f[0].theirs == "unset");
  CHECK(f[1].field == "NCCL_PROTO");
  CHECK(f[2].field == "NCCL_BUFFSIZE");
  CHECK(f[2].ours == "unset");
  CHECK(rs::compare_environments(a, b, rs::preflight_rules::same_host()).empty()); // no variable rules

  b = peer();
  b.devices = {{"GPU-ffeeddcc-9999-8888-7777-666655554444", 1}};
  f = rs::compare_environments(a, b, rs::preflight_rules::nccl());
  REQUIRE(f.size() == 1);
  CHECK(f[0].field == "device");
  CHECK(f[0].why.find("Duplicate GPU") != std::string::npos);
  b.devices = {{"GPU-12345678-9999-8888-7777-666655554444", 0}};
  CHECK(rs::compare_environments(a, b, rs::preflight_rules::nccl()).empty());
  b.nccl = "2.18.1";
  f = rs::compare_environments(a, b, rs::preflight_rules::nccl());
  REQUIRE(f.size() == 1);
  CHECK(f[0].field == "NCCL version");
  b.nccl.clear(); // an end that does not report one is not compared
  CHECK(rs::compare_environments(a, b, rs::preflight_rules::nccl()).empty());

  b = peer();
  b.machine = "another-boot-id";
  b.host = "engine-3";
  f = rs::compare_environments(a, b, rs::preflight_rules::same_host());
  REQUIRE(f.size() == 1);
  CHECK(f[0].field == "machine");
  b.machine = a.machine; // one kernel: containers with different host names share a machine
  CHECK(rs::compare_environments(a, b, rs::preflight_rules::same_host()).empty());
  b.machine.clear(); // no boot id: host names decide
  CHECK(rs::compare_environments(a, b, rs::preflight_rules::same_host()).size() == 1);

  b = a;
  b.variables[0].second = "1";
  b.devices = a.devices;
  RLPT_CHECK_ERROR(rs::require_parity(a, b, rs::preflight_rules::nccl(), "engine 3"), "rlpt.sync.preflight", "engine 3",
                   "3 mismatches", "NCCL_CUMEM_ENABLE: '0' here, '1' on engine 3", "device:");
}

TEST_CASE("preflight over a link: both ends agree, or both raise the same findings") {
  rs::inproc_pipe pipe;
  rs::inproc_transport tx(pipe, rs::role::sender), rx(pipe, rs::role::receiver);
  const auto rules = rs::preflight_rules::nccl();
  auto a = sample();
  auto b = sample();
  b.host = "engine-0";
  b.devices = {{"GPU-12345678-9999-8888-7777-666655554444", 0}};
  {
    auto got =
        std::async(std::launch::async, [&] { return rs::preflight(rx, rs::role::receiver, b, rules, rs::after(5s)); });
    const auto theirs = rs::preflight(tx, rs::role::sender, a, rules, rs::after(5s));
    CHECK(same(theirs, b));
    CHECK(same(got.get(), a));
  }
  b.variables[0].second = "1";
  {
    auto got =
        std::async(std::launch::async, [&] { return rs::preflight(rx, rs::role::receiver, b, rules, rs::after(5s)); });
    RLPT_CHECK_ERROR(rs::preflight(tx, rs::role::sender, a, rules, rs::after(5s)), "rlpt.sync.preflight",
                     "the receiver", "NCCL_CUMEM_ENABLE: '0' here, '1' on the receiver");
    RLPT_CHECK_ERROR(got.get(), "rlpt.sync.preflight", "the sender", "NCCL_CUMEM_ENABLE: '1' here, '0' on the sender");
  }
}

TEST_CASE("preflight over a link: a peer that skips it, or never answers, is named") {
  rs::inproc_pipe pipe;
  rs::inproc_transport tx(pipe, rs::role::sender), rx(pipe, rs::role::receiver);
  // the sender starts the protocol straight away: its first frame reaches the receiver's preflight
  std::vector<std::byte> frame;
  rs::encode_frame(frame, rs::frame_type::begin, 1, 1, 0, 0, 0, 0, {});
  tx.send(frame, 0, rs::after(1s));
  RLPT_CHECK_ERROR(rs::preflight(rx, rs::role::receiver, sample(), {}, rs::after(1s)), "rlpt.sync.wire",
                   "update-protocol frame", "sync::preflight");
  // the other way round: a receiver that went straight to the protocol gets the sender's preflight
  const auto pre = rs::encode_environment(sample());
  RLPT_CHECK_ERROR((void)rs::decode_frame(pre, "link y"), "rlpt.sync.wire", "link y", "the peer sent its preflight",
                   "sync::preflight");
  // a receiver that never answers: the sender times out naming it
  RLPT_CHECK_ERROR(rs::preflight(tx, rs::role::sender, sample(), {}, rs::after(50ms)), "rlpt.sync.timeout",
                   "no preflight from the receiver");
}
