// SPDX-License-Identifier: Apache-2.0
// The UCX transport with payload slots it does not own (what ucx_device_link runs on, with CUDA
// memory), exercised here with host memory standing in for the device: one block per send (the
// meta block copied in front of the payload, or both spilled to a second buffer), each frame
// pulled into a slot in arrival order with its payload slot-aligned, meta blocks copied back and
// checked, a slot reused only after the consumer's work on it has run, and frame tags limited
// to integrity::control.
#include "sync_support.hpp"
#include "ucx_frames.hpp"

#include <rlpt/sync/ucx.hpp>
#ifdef RLPT_TEST_UCX_AUTH
#include <rlpt/sync/auth_openssl.hpp>
#endif

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <memory>
#include <thread>
#include <vector>

using namespace rlpt::sync;
using namespace rlpt::test::sync;
using namespace std::chrono_literals;

namespace {

// Host slots with the contract of device ones: give_back() starts the consumer's "work" on a
// slot, which ends at the next take() unless the test holds it (hold_reads).
class host_slots final : public ucx_payload_slots {
public:
  explicit host_slots(std::size_t slots) : max_(slots) {}
  [[nodiscard]] ucs_memory_type_t memory_type() const noexcept override { return UCS_MEMORY_TYPE_HOST; }
  std::byte* send_slot(std::size_t n) override { return grow(tx_, n); }
  std::byte* spill(std::size_t n) override {
    ++spills;
    return grow(spill_, n);
  }
  void ready(deadline) override { ++readies; }
  void copy(void* dst, const void* src, std::size_t n, deadline) override {
    std::memcpy(dst, src, n);
    ++copies;
  }
  std::byte* take(std::size_t n) override {
    slot* pick = nullptr;
    for (auto& s : slots_) {
      if (s.state == reading && !hold_reads) s.state = idle;
      if (s.state == idle && (pick == nullptr || s.mem.n < pick->mem.n)) pick = &s;
    }
    if (pick == nullptr && slots_.size() < max_) pick = &slots_.emplace_back();
    if (pick == nullptr) return nullptr;
    grow(pick->mem, n);
    pick->state = taken;
    ++takes;
    return pick->mem.p.get();
  }
  void give_back(std::byte* p) noexcept override {
    for (auto& s : slots_)
      if (s.state == taken && s.mem.p.get() == p) s.state = reading;
  }
  [[nodiscard]] std::size_t taken_slots() const {
    return static_cast<std::size_t>(
        std::count_if(slots_.begin(), slots_.end(), [](const slot& s) { return s.state == taken; }));
  }

  std::atomic<bool> hold_reads{false};
  std::size_t spills = 0, readies = 0, copies = 0, takes = 0;

private:
  struct block {
    std::unique_ptr<std::byte, decltype(&std::free)> p{nullptr, &std::free};
    std::size_t n = 0;
  };
  enum state_t { idle, taken, reading };
  struct slot {
    block mem;
    state_t state = idle;
  };
  static std::byte* grow(block& b, std::size_t n) { // 256-aligned, as cudaMalloc's
    if (b.n < n) {
      b.p.reset(static_cast<std::byte*>(std::aligned_alloc(256, (std::max<std::size_t>(n, 1) + 255) / 256 * 256)));
      REQUIRE(b.p != nullptr);
      b.n = n;
    }
    return b.p.get();
  }
  std::size_t max_;
  block tx_, spill_;
  std::vector<slot> slots_;
};

} // namespace

TEST_CASE("ucx payload slots: frames of every shape arrive intact, slot-aligned, with one slot and with two") {
  for (const std::size_t slots : {std::size_t{1}, std::size_t{2}}) {
    CAPTURE(slots);
    host_slots rx_slots(slots), tx_slots(1);
    ucx_transport rx({.listen = true}, role::receiver, rx_slots);
    exchange_frames(
        rx, [&] { return std::make_unique<ucx_transport>(ucx_options{.port = rx.port()}, role::sender, tx_slots); },
        every_frame_shape, 256);
    CHECK(tx_slots.spills == 1);  // the 200 KiB meta block with a payload: past the headroom
    CHECK(tx_slots.readies == 6); // every frame with a payload waited for its packing work
    CHECK(rx_slots.takes == 6);
    CHECK(rx_slots.taken_slots() == 1); // the last frame's, until the next receive releases it
  }
}

TEST_CASE("ucx payload slots: a frame waits for a free slot, and slots go to frames in arrival order") {
  // One slot. After a first frame (no payload: the connection is up), a small (eager) payload
  // frame arrives, then a large (rendezvous) one, before the receiver looks again: the first gets
  // the slot, the second waits in UCX until the consumer's work on that slot has run. Were the
  // slot given to the second, each would wait for the other.
  host_slots rx_slots(1), tx_slots(1);
  ucx_transport rx({.listen = true}, role::receiver, rx_slots);
  const frame_shape frames[] = {{8, 0}, {40, 100}, {40, 4 << 20}};
  std::thread tx_thread([&] {
    ucx_transport tx({.port = rx.port()}, role::sender, tx_slots);
    for (std::size_t k = 0; k < std::size(frames); ++k) {
      fill_frame_bytes(tx.payload_buffer(frames[k].payload, after(10s)), k + 100);
      tx.send(frame_bytes(frames[k].meta, k), frames[k].payload, after(10s));
    }
    static_cast<void>(tx.receive(after(10s)));
  });
  auto expect = [&](const std::optional<message>& m, std::size_t k) {
    CAPTURE(k);
    REQUIRE(m.has_value());
    CHECK(equal_bytes(m->meta, frame_bytes(frames[k].meta, k)));
    CHECK(equal_bytes(m->payload, frame_bytes(frames[k].payload, k + 100)));
  };
  std::optional<message> m;
  const auto connected = after(5s);
  while (!m && clock::now() < connected) m = rx.receive(after(50ms)); // the connection, then frame 0
  expect(m, 0);
  std::this_thread::sleep_for(300ms); // frames 1 and 2 are sent meanwhile; the receiver sees both at once
  expect(rx.receive(after(5s)), 1);
  rx_slots.hold_reads = true; // the consumer's work on frame 1's slot is still running
  CHECK_FALSE(rx.receive(after(300ms)).has_value());
  rx_slots.hold_reads = false;
  expect(rx.receive(after(5s)), 2);
  static_cast<void>(rx.payload_buffer(0, after(5s)));
  rx.send({}, 0, after(5s));
  tx_thread.join();
}

TEST_CASE("ucx payload slots: a sender that gives up on a frame held for a slot is reported, and no slot is lost") {
  // One slot, held by frame 0's reader; frame 1 waits in UCX for it until its sender times out
  // and goes away. The receiver reports the lost peer, its held frame is dropped, and the slot
  // (free once its reader ends) serves the next sender's frame.
  host_slots rx_slots(1), tx_slots(1);
  ucx_transport rx({.listen = true}, role::receiver, rx_slots);
  const std::vector<std::byte> big = frame_bytes(std::size_t{4} << 20, 7);
  std::atomic<bool> gave_up{false};
  std::thread tx_thread([&] {
    ucx_transport tx({.port = rx.port()}, role::sender, tx_slots);
    for (int k = 0; k < 2; ++k) {
      const std::span<std::byte> slot = tx.payload_buffer(big.size(), after(5s));
      std::copy(big.begin(), big.end(), slot.begin());
      try {
        tx.send(frame_bytes(8, 1), big.size(), after(k == 0 ? 5s : 500ms));
      } catch (const rlpt::error& e) {
        CHECK(std::string(e.id()) == "rlpt.sync.timeout");
        gave_up = true;
      }
    }
  }); // the sender's transport closes here
  std::optional<message> m;
  const auto connected = after(5s);
  while (!m && clock::now() < connected) m = rx.receive(after(50ms));
  REQUIRE(m.has_value());
  CHECK(equal_bytes(m->payload, big));
  rx_slots.hold_reads = true; // frame 0's slot stays busy: frame 1 cannot be pulled
  bool lost = false;
  const auto until = after(10s);
  while (!lost && clock::now() < until) {
    try {
      const bool got = rx.receive(after(100ms)).has_value();
      CHECK_FALSE(got);
    } catch (const rlpt::error& e) {
      CHECK(std::string(e.id()) == "rlpt.sync.peer_lost");
      lost = true;
    }
  }
  tx_thread.join();
  CHECK(gave_up);
  CHECK(lost);
  CHECK(rx_slots.taken_slots() == 0); // frame 0's was given back; frame 1 never took one
  rx_slots.hold_reads = false;
  exchange_frames(
      rx, [&] { return std::make_unique<ucx_transport>(ucx_options{.port = rx.port()}, role::sender, tx_slots); },
      std::span(every_frame_shape).first(4), 256);
}

#ifdef RLPT_TEST_UCX_AUTH
TEST_CASE("ucx payload slots: authenticated frames (integrity::control) arrive, integrity::full is refused") {
  const auto job = openssl_authenticator::from_string("0123456789abcdef0123456789abcdef");
  host_slots rx_slots(2), tx_slots(1);
  ucx_transport rx({.listen = true, .auth = job, .tags = integrity::control}, role::receiver, rx_slots);
  exchange_frames(
      rx,
      [&] {
        return std::make_unique<ucx_transport>(ucx_options{.port = rx.port(), .auth = job, .tags = integrity::control},
                                               role::sender, tx_slots);
      },
      every_frame_shape, 256);
  CHECK(rx.auth_stats().handshakes == 1);
  CHECK(rx.auth_stats().refused_frames == 0);
  RLPT_CHECK_ERROR(ucx_transport({.listen = true, .auth = job, .tags = integrity::full}, role::receiver, rx_slots),
                   "rlpt.sync.bad_link", "integrity::full", "integrity::control", "staged_link");
}
#endif
