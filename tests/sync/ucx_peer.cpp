// SPDX-License-Identifier: Apache-2.0
// The other process of the UCX tests (test_ucx.cpp): UCX keeps process-wide state (its async
// thread) that a fork() does not carry, so a peer is a fresh program, not a forked child.
// Publishes versions 1..N of the seeded test model to 127.0.0.1:PORT over UCX; exits 0 when
// every publish succeeded, 1 with the error otherwise.
//
//   ucx_peer PORT SEED VERSIONS [--tls LIST] [--secret S] [--tags full|control]
//            [--bucket-kib K] [--first V] [--stall-at-version V]   (pauses forever inside version V)
#include "sync_support.hpp"

#include <rlpt/sync/ucx.hpp>
#ifdef RLPT_TEST_UCX_AUTH
#include <rlpt/sync/auth_openssl.hpp>
#endif

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

using namespace rlpt::sync;
using namespace rlpt::test::sync;
using namespace std::chrono_literals;

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: ucx_peer PORT SEED VERSIONS [options]\n");
    return 2;
  }
  ucx_options o{.port = static_cast<std::uint16_t>(std::atoi(argv[1]))};
  const std::uint64_t seed = std::strtoull(argv[2], nullptr, 10), versions = std::strtoull(argv[3], nullptr, 10);
  std::uint64_t stall_at = 0, first = 1;
  plan_options buckets{.bucket_bytes = 1024, .alignment = 256};
  for (int i = 4; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--tls") {
      o.transports = v;
    } else if (k == "--tags") {
      o.tags = v == "control" ? integrity::control : integrity::full;
    } else if (k == "--bucket-kib") {
      buckets.bucket_bytes = std::strtoull(v.c_str(), nullptr, 10) << 10;
    } else if (k == "--first") {
      first = std::strtoull(v.c_str(), nullptr, 10);
    } else if (k == "--stall-at-version") {
      stall_at = std::strtoull(v.c_str(), nullptr, 10);
#ifdef RLPT_TEST_UCX_AUTH
    } else if (k == "--secret") {
      o.auth = openssl_authenticator::from_string(v);
#endif
    } else {
      std::fprintf(stderr, "ucx_peer: unknown option %s\n", k.c_str());
      return 2;
    }
  }
  try {
    model md = model_at(seed, 1);
    ucx_transport out(o, role::sender);
    bool stalled = false;
    sender tx(out, plan(md.refs, buckets),
              [&](std::size_t i) {
                if (stalled && i == 8) ::pause(); // mid-update, until killed
                return std::span<const std::byte>(md.storage[i]);
              },
              {.delta = true, .timeout = 10s});
    for (std::uint64_t v = 1; v <= versions; ++v) {
      if (v > 1) {
        rlpt::test::rng r(2000 + v);
        md.step(0.02, r);
      }
      stalled = v == stall_at;
      if (v >= first) tx.publish(v);
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ucx_peer: %s\n", e.what());
    return 1;
  }
}
