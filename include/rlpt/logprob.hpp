// SPDX-License-Identifier: Apache-2.0
//! @file
//! Umbrella for the logprob family: chosen-token logprob and entropy from logits (forward,
//! backward, top-k/top-p sampling-consistent mode), packed/padded sequences, vocab-parallel
//! shards, and the fused lm-head that never materialises the logits. Device versions:
//! <rlpt/cuda/logprob.cuh>.
#pragma once

#include <rlpt/logprob/compat.hpp>
#include <rlpt/logprob/from_logits.hpp>
#include <rlpt/logprob/lm_head.hpp>
#include <rlpt/logprob/math.hpp>
#include <rlpt/logprob/options.hpp>
#include <rlpt/logprob/sequence.hpp>
#include <rlpt/logprob/vocab_parallel.hpp>
