// SPDX-License-Identifier: Apache-2.0
// Device payloads over a host link (staged_link.cuh): a device sender and a device receiver on
// one GPU, each behind a staged_link over the two ends of a loopback TCP connection, move dense
// then delta versions into the engine's device targets, every byte checked. With a cast target
// the receiver refuses deltas (they need equal dtypes) and each one falls back to dense.
#include "gpu_engine.cuh"
#include "support/errors.hpp"

#include <rlpt/cuda/sync/staged_link.cuh>
#include <rlpt/sync/tcp.hpp>

#include <doctest/doctest.h>

using namespace rlpt::sync;
namespace model = rlpt::test::sync_gpu;

namespace {

void run_staged(bool cast_one) {
  tcp_transport rx_host({.listen = true}, role::receiver);
  tcp_transport tx_host({.port = rx_host.port()}, role::sender);
  staged_link rx_link(rx_host), tx_link(tx_host);
  model::publish_three_versions(rx_link, tx_link, cast_one);
}

} // namespace

TEST_CASE("sync staged: device sender and receiver over loopback TCP, dense then deltas, bit-exact") {
  for (const bool cast_one : {false, true}) {
    CAPTURE(cast_one);
    run_staged(cast_one);
  }
}
