// SPDX-License-Identifier: Apache-2.0
//! @file
//! Umbrella for the device weight-sync transports: NCCL broadcast and CUDA IPC links, the
//! device sender/receiver protocol, the gather/scatter (pack/unpack with dtype cast) kernels
//! and the device delta codec. Needs only the CUDA runtime (driver functions such as cuMem* are
//! resolved at run time through cudaGetDriverEntryPointByVersion); the NCCL link needs NCCL.
#pragma once

#include <rlpt/cuda/sync/cast.hpp>
#include <rlpt/cuda/sync/copy.cuh>
#include <rlpt/cuda/sync/copy_plan.hpp>
#include <rlpt/cuda/sync/delta.cuh>
#include <rlpt/cuda/sync/delta_plan.hpp>
#include <rlpt/cuda/sync/device_link.cuh>
#include <rlpt/cuda/sync/ipc_link.cuh>
#include <rlpt/cuda/sync/ipc_wire.hpp>
#include <rlpt/cuda/sync/nccl_link.cuh>
#include <rlpt/cuda/sync/preflight.cuh>
#include <rlpt/cuda/sync/nccl_wire.hpp>
#include <rlpt/cuda/sync/protocol.cuh>
#include <rlpt/cuda/sync/unix_link.hpp>
#include <rlpt/cuda/sync/wsum.hpp>
