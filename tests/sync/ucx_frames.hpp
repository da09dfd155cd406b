// SPDX-License-Identifier: Apache-2.0
// Frames of every shape for the UCX transport tests (host payloads, payload slots, device
// payloads): meta only, payload only, both, a meta block beyond the 64 KiB headroom, small
// (eager) and large (rendezvous) payloads; each byte a function of its position and frame.
#pragma once

#include <rlpt/sync/ucx.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <thread>
#include <vector>

namespace rlpt::test::sync {

struct frame_shape {
  std::size_t meta, payload;
};

inline constexpr frame_shape every_frame_shape[] = {
    {0, 0}, {100, 0}, {0, 3 << 20}, {300, 3 << 20}, {7, 100}, {200 << 10, 1 << 20}, {64 << 10, 5}, {5, 1 << 20}};

//! Frame k's meta block is frame_bytes(meta, k), its payload frame_bytes(payload, k + 100).
inline void fill_frame_bytes(std::span<std::byte> b, std::size_t salt) {
  for (std::size_t i = 0; i < b.size(); ++i) b[i] = static_cast<std::byte>((i * 131 + salt) >> 3);
}
inline std::vector<std::byte> frame_bytes(std::size_t n, std::size_t salt) {
  std::vector<std::byte> b(n);
  fill_frame_bytes(b, salt);
  return b;
}
inline bool equal_bytes(std::span<const std::byte> a, std::span<const std::byte> b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin());
}

//! Sends `shapes` from the sender `make_sender()` builds (in a thread of its own) to `rx` and
//! checks each frame as it arrives (a payload starting `payload_align`-aligned); the receiver
//! first waits `before_first_receive`, so that several frames arrive at once.
template <class MakeSender>
void exchange_frames(rlpt::sync::ucx_transport& rx, MakeSender make_sender, std::span<const frame_shape> shapes,
                     std::size_t payload_align = 1, std::chrono::milliseconds before_first_receive = {}) {
  using rlpt::sync::after;
  using namespace std::chrono_literals;
  std::thread tx_thread([&] {
    const std::unique_ptr<rlpt::sync::ucx_transport> tx = make_sender();
    for (std::size_t k = 0; k < shapes.size(); ++k) {
      const std::vector<std::byte> meta = frame_bytes(shapes[k].meta, k);
      fill_frame_bytes(tx->payload_buffer(shapes[k].payload, after(5s)), k + 100);
      tx->send(meta, shapes[k].payload, after(5s));
    }
    static_cast<void>(tx->receive(after(5s))); // until the receiver says it has them all
  });
  std::this_thread::sleep_for(before_first_receive);
  for (std::size_t k = 0; k < shapes.size(); ++k) {
    CAPTURE(k);
    const auto m = rx.receive(after(5s));
    REQUIRE(m.has_value());
    CHECK(equal_bytes(m->meta, frame_bytes(shapes[k].meta, k)));
    CHECK(equal_bytes(m->payload, frame_bytes(shapes[k].payload, k + 100)));
    if (!m->payload.empty()) CHECK(reinterpret_cast<std::uintptr_t>(m->payload.data()) % payload_align == 0);
  }
  static_cast<void>(rx.payload_buffer(0, after(5s)));
  rx.send({}, 0, after(5s));
  tx_thread.join();
}

} // namespace rlpt::test::sync
