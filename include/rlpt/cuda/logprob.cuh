// SPDX-License-Identifier: Apache-2.0
//! @file
//! Device umbrella of the logprob family (needs nvcc): logits -> logprob/entropy forward,
//! backward and fused forward+backward, sequences, vocab-parallel stages (hook or NCCL).
//!
//! The cuBLAS-tiled fused lm-head is not included here, so that no other device block pulls in
//! cuBLAS: include <rlpt/cuda/logprob/lm_head.cuh> and link rlpt::cuda_lm_head.
#pragma once

#include <rlpt/cuda/logprob/from_logits.cuh>
#include <rlpt/cuda/logprob/vocab_parallel.cuh>
#include <rlpt/logprob.hpp>
