// SPDX-License-Identifier: Apache-2.0
// ucx_device_link (cuda/sync/ucx_link.cuh) where it cannot run: a UCX without CUDA transports
// (Debian's) is refused before any CUDA call, and so are frame tags that would cover device
// payloads (integrity::full). Its transfers are tested on a GPU (test_sync_gpu_ucx.cu).
#include "support/errors.hpp"

#include <rlpt/cuda/sync/ucx_link.cuh>

#ifdef RLPT_TEST_UCX_AUTH
#include <rlpt/sync/auth_openssl.hpp>
#endif

#include <doctest/doctest.h>

#include <string>

using namespace rlpt::sync;

TEST_CASE("ucx device link: a UCX that does not move CUDA memory is refused, naming what is missing") {
  if (ucx_transport({.listen = true}, role::receiver).moves_device_memory()) {
    MESSAGE("this UCX moves CUDA memory: the refusal cannot be shown here (the GPU test covers the link)");
    return;
  }
  for (const role r : {role::receiver, role::sender}) {
    CAPTURE(static_cast<int>(r));
    RLPT_CHECK_ERROR(ucx_device_link({.port = 5555, .listen = r == role::receiver}, r), "rlpt.sync.ucx",
                     "built with CUDA", "libucx-cu13", "staged_link");
  }
}

#ifdef RLPT_TEST_UCX_AUTH
TEST_CASE("ucx device link: frame tags over payload bytes (integrity::full) are refused, control is what it offers") {
  const auto job = openssl_authenticator::from_string("0123456789abcdef0123456789abcdef");
  RLPT_CHECK_ERROR(ucx_device_link({.listen = true, .auth = job, .tags = integrity::full}, role::receiver),
                   "rlpt.sync.bad_link", "integrity::full", "integrity::control", "staged_link");
  // control passes the tag check and stops only where this machine's UCX or device falls short
  try {
    ucx_device_link link({.listen = true, .auth = job, .tags = integrity::control}, role::receiver);
  } catch (const rlpt::error& e) {
    CHECK(std::string(e.id()) != "rlpt.sync.bad_link");
  }
}
#endif
