// SPDX-License-Identifier: Apache-2.0
//! @file
//! Partial rollouts: a generation that a weight update interrupts keeps what it has and
//! continues afterwards, with the version of every token recorded.
//!
//! A `partial_rollout` holds the prompt and the tokens generated so far with their behaviour
//! log-probs and per-token versions (AReaL: `versions = [-1]·prompt + [version]·output`), the
//! remaining token budget (`max_new_tokens` minus what was generated), the dispatch (head)
//! version that staleness is measured from, and optional server affinity (AReaL routes a
//! resumed request to the same server, `rid → addr`, to reuse its prefix cache).
//!
//! What a weight update does to it is an explicit `pause_mode` (user_asks §3.2: a version
//! publish must never abort anything by itself):
//! - keep:    generation continues under the new weights (vLLM pause mode=keep, PipelineRL);
//!            later tokens simply carry the new version.
//! - retract: generation stops; tokens, log-probs and versions are kept; `resume` continues
//!            with `tokens()` as the engine input and `remaining()` as its max_new_tokens
//!            (AReaL abort-and-resubmit, verl partial_rollout, slime --partial-rollout).
//! - abort:   generation stops and the generated tokens are discarded; `resume` restarts from
//!            the prompt with a fresh dispatch version (slime without --partial-rollout).
//! `mask_prefix_on_resume` trains only the tokens generated after the last resume (slime
//! --mask-offpolicy-in-partial-rollout).
#pragma once

#include <rlpt/config.hpp>
#include <rlpt/core/error.hpp>
#include <rlpt/core/views.hpp>
#include <rlpt/staleness/clock.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string_view>
#include <vector>

RLPT_NAMESPACE_BEGIN

//! Token ids as engines and torch int32 tensors carry them (same alias as rollout/record.hpp).
using token_id = std::int32_t;

enum class pause_mode : std::uint8_t { keep, retract, abort };

enum class partial_state : std::uint8_t {
  running,     //!< generating (or ready to append the next chunk)
  interrupted, //!< stopped by a weight update; resume() continues it
  finished     //!< stop token or budget reached
};

[[nodiscard]] constexpr std::string_view name(partial_state s) noexcept {
  switch (s) {
  case partial_state::running:
    return "running";
  case partial_state::interrupted:
    return "interrupted";
  case partial_state::finished:
    return "finished";
  }
  return "?";
}

struct partial_options {
  index_t max_new_tokens = 1024;      //!< generation budget (rlpt default; set it to your engine's max_new_tokens)
  bool mask_prefix_on_resume = false; //!< slime --mask-offpolicy-in-partial-rollout, default off
  //! Give up after this many interruptions: a further interrupt finishes the generation
  //! (-1: never; verl and AReaL resume indefinitely).
  index_t max_interruptions = -1;
};

class partial_rollout {
public:
  partial_rollout(std::int64_t group_id, view<const token_id> prompt, policy_version dispatch_version,
                  partial_options opt = {})
      : opt_(opt), group_id_(group_id), head_(dispatch_version) {
    RLPT_CHECK(opt_.max_new_tokens >= 1, errors::staleness::bad_option, "max_new_tokens must be >= 1, got {}",
               opt_.max_new_tokens);
    RLPT_CHECK(dispatch_version >= 0, errors::staleness::bad_version, "dispatch version must be >= 0, got {}",
               dispatch_version);
    RLPT_CHECK(opt_.max_interruptions >= -1, errors::staleness::bad_option,
               "max_interruptions must be >= 0 or -1 (no limit), got {}", opt_.max_interruptions);
    tokens_.assign(prompt.begin(), prompt.end());
    prompt_len_ = prompt.size();
    logprobs_.assign(tokens_.size(), 0.0f);
    versions_.assign(tokens_.size(), policy_version{-1});
    loss_mask_.assign(tokens_.size(), mask_t{0});
  }

  // --- generation ----------------------------------------------------------------------------

  //! Appends a chunk the engine generated with the weights of `version`.
  void append(view<const token_id> tokens, view<const float> logprobs, policy_version version) {
    check_append(tokens, logprobs);
    check_version(version, 0);
    push(tokens, logprobs, [version](index_t) { return version; });
  }

  //! Appends a chunk with one version per token (an engine that swapped weights mid-chunk).
  void append(view<const token_id> tokens, view<const float> logprobs, view<const policy_version> versions) {
    check_append(tokens, logprobs);
    detail::expect_size("partial versions", versions.size(), tokens.size(), "one per appended token");
    policy_version prev = tail_version();
    for (index_t i = 0; i < versions.size(); ++i) {
      check_version(versions[i], i, prev);
      prev = versions[i];
    }
    push(tokens, logprobs, [versions](index_t i) { return versions[i]; });
  }

  //! The engine stopped (stop token, or length): the record is complete.
  void finish() {
    RLPT_CHECK(state_ != partial_state::finished, errors::staleness::partial_state,
               "generation of group {} already finished", group_id_);
    state_ = partial_state::finished;
  }

  // --- weight updates ------------------------------------------------------------------------

  //! A weight update is about to happen. Returns the resulting state (a generation past its
  //! interruption limit finishes with what it has).
  partial_state interrupt(pause_mode mode) {
    if (state_ != partial_state::running || mode == pause_mode::keep) return state_;
    ++interruptions_;
    if (mode == pause_mode::abort) {
      discarded_ += generated();
      tokens_.resize(static_cast<std::size_t>(prompt_len_));
      logprobs_.resize(tokens_.size());
      versions_.resize(tokens_.size());
      loss_mask_.resize(tokens_.size());
      restamp_ = true;
    }
    if (opt_.max_interruptions >= 0 && interruptions_ > opt_.max_interruptions && generated() > 0) {
      state_ = partial_state::finished;
      truncated_ = true;
    } else {
      state_ = partial_state::interrupted;
    }
    return state_;
  }

  //! Continues after the update, under policy `version`. After an abort the dispatch version
  //! becomes `version`; with mask_prefix_on_resume, tokens generated by older versions leave
  //! the loss.
  void resume(policy_version version) {
    RLPT_CHECK(state_ == partial_state::interrupted, errors::staleness::partial_state,
               "resume needs an interrupted generation; group {} is {}", group_id_, name(state_));
    RLPT_CHECK(version >= tail_version(), errors::staleness::bad_version,
               "group {} resumes at version {}, older than its newest token's version {}", group_id_, version,
               tail_version());
    if (restamp_) {
      head_ = version;
      restamp_ = false;
    }
    if (opt_.mask_prefix_on_resume)
      for (index_t i = prompt_len_; i < size(); ++i)
        if (versions_[static_cast<std::size_t>(i)] < version) loss_mask_[static_cast<std::size_t>(i)] = 0;
    state_ = partial_state::running;
    ++resumes_;
  }

  // --- queries -------------------------------------------------------------------------------

  [[nodiscard]] std::int64_t group_id() const noexcept { return group_id_; }
  [[nodiscard]] partial_state state() const noexcept { return state_; }
  [[nodiscard]] bool done() const noexcept { return state_ == partial_state::finished; }
  //! Tokens the engine may still generate (its max_new_tokens when resuming).
  [[nodiscard]] index_t remaining() const noexcept { return opt_.max_new_tokens - generated(); }
  [[nodiscard]] index_t size() const noexcept { return static_cast<index_t>(tokens_.size()); }
  [[nodiscard]] index_t prompt_len() const noexcept { return prompt_len_; }
  [[nodiscard]] index_t generated() const noexcept { return size() - prompt_len_; }
  //! Staleness is measured from here: the version at dispatch.
  [[nodiscard]] policy_version head_version() const noexcept { return head_; }
  //! Newest version among generated tokens (the head version before the first token).
  [[nodiscard]] policy_version tail_version() const noexcept { return generated() > 0 ? versions_.back() : head_; }
  //! tail − head: how many updates the generation spanned (verl `max_partial_span`).
  [[nodiscard]] index_t version_span() const noexcept {
    return static_cast<index_t>(tail_version()) - static_cast<index_t>(head_);
  }
  [[nodiscard]] index_t interruptions() const noexcept { return interruptions_; }
  [[nodiscard]] index_t resumes() const noexcept { return resumes_; }
  [[nodiscard]] index_t discarded_tokens() const noexcept { return discarded_; }
  //! Finished because it exceeded max_interruptions (not by the engine).
  [[nodiscard]] bool truncated() const noexcept { return truncated_; }

  //! Prompt + generated tokens: the engine input when resuming.
  [[nodiscard]] view<const token_id> tokens() const noexcept { return tokens_; }
  [[nodiscard]] view<const float> logprobs() const noexcept { return logprobs_; }
  [[nodiscard]] view<const policy_version> versions() const noexcept { return versions_; }
  [[nodiscard]] view<const mask_t> loss_mask() const noexcept { return loss_mask_; }

  //! Server affinity for the resumed request (-1: any).
  std::int64_t server = -1;

private:
  void check_append(view<const token_id> tokens, view<const float> logprobs) const {
    RLPT_CHECK(state_ == partial_state::running, errors::staleness::partial_state,
               "group {} cannot take tokens while {} (resume it first)", group_id_, name(state_));
    detail::expect_size("partial logprobs", logprobs.size(), tokens.size(), "one per appended token");
    RLPT_CHECK(tokens.size() <= remaining(), errors::staleness::partial_budget,
               "group {} got {} tokens but only {} of its max_new_tokens {} remain", group_id_, tokens.size(),
               remaining(), opt_.max_new_tokens);
    for (index_t i = 0; i < logprobs.size(); ++i)
      RLPT_CHECK(std::isfinite(logprobs[i]), errors::staleness::non_finite, "group {} chunk token {} has logprob {}",
                 group_id_, i, logprobs[i]);
  }

  void check_version(policy_version v, index_t i, policy_version prev = -2) const {
    if (prev == -2) prev = tail_version();
    RLPT_CHECK(v >= prev && v >= head_, errors::staleness::bad_version,
               "group {} chunk token {} has version {}, older than the version {} before it (versions never go back)",
               group_id_, i, v, std::max(prev, head_));
  }

  template <class Version> void push(view<const token_id> tokens, view<const float> logprobs, Version version) {
    for (index_t i = 0; i < tokens.size(); ++i) {
      tokens_.push_back(tokens[i]);
      logprobs_.push_back(logprobs[i]);
      versions_.push_back(version(i));
      loss_mask_.push_back(1);
    }
    if (remaining() == 0) state_ = partial_state::finished;
  }

  partial_options opt_;
  std::int64_t group_id_ = 0;
  policy_version head_ = 0;
  index_t prompt_len_ = 0;
  std::vector<token_id> tokens_;
  std::vector<float> logprobs_;
  std::vector<policy_version> versions_;
  std::vector<mask_t> loss_mask_;
  partial_state state_ = partial_state::running;
  index_t interruptions_ = 0;
  index_t resumes_ = 0;
  index_t discarded_ = 0;
  bool restamp_ = false;
  bool truncated_ = false;
};

RLPT_NAMESPACE_END
