// SPDX-License-Identifier: Apache-2.0
//! @file
//! Umbrella for the logprob family: chosen-token logprob and entropy from logits (forward,
//! backward, top-k/top-p sampling-consistent mode), packed/padded sequences, vocab-parallel
//! shards, and the training-inference mismatch metrics. Device versions: <rlpt/cuda/logprob.cuh>.
//!
//! The fused lm-head that never materialises the logits is not included here: it needs Eigen.
//! Include <rlpt/logprob/lm_head.hpp> and link rlpt::lm_head (component lm_head).
#pragma once

#include <rlpt/logprob/compat.hpp>
#include <rlpt/logprob/from_logits.hpp>
#include <rlpt/logprob/math.hpp>
#include <rlpt/logprob/mismatch.hpp>
#include <rlpt/logprob/options.hpp>
#include <rlpt/logprob/sequence.hpp>
#include <rlpt/logprob/vocab_parallel.hpp>
