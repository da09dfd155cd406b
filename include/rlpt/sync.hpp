// SPDX-License-Identifier: Apache-2.0
//! @file
//! Umbrella for weight sync: manifest and bucket planner, the versioned update protocol,
//! receiver-side transforms, the delta codec and the host transports (in-process, POSIX shared
//! memory, TCP, safetensors files). Device transports (NCCL, CUDA IPC) build on the same link.
#pragma once

#include <rlpt/sync/checksum.hpp>
#include <rlpt/sync/compat.hpp>
#include <rlpt/sync/delta.hpp>
#include <rlpt/sync/dtype.hpp>
#include <rlpt/sync/forward.hpp>
#include <rlpt/sync/fp8.hpp>
#include <rlpt/sync/frame.hpp>
#include <rlpt/sync/inproc.hpp>
#include <rlpt/sync/link.hpp>
#include <rlpt/sync/manifest.hpp>
#include <rlpt/sync/planner.hpp>
#include <rlpt/sync/preflight.hpp>
#include <rlpt/sync/protocol.hpp>
#include <rlpt/sync/safetensors.hpp>
#include <rlpt/sync/shm.hpp>
#include <rlpt/sync/tcp.hpp>
#include <rlpt/sync/transform.hpp>
