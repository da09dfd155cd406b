// SPDX-License-Identifier: Apache-2.0
//! @file
//! Framework presets for logprob scoring: the distribution each framework's trainer scores
//! tokens under. All of them divide the logits by the rollout temperature and score the full
//! (untruncated) softmax; vLLM/SGLang sample from the top-k/top-p truncated one, so the
//! behaviour logprobs an engine returns ("processed" logprobs) match `sampled(...)`, not these.
#pragma once

#include <rlpt/config.hpp>
#include <rlpt/logprob/options.hpp>

RLPT_NAMESPACE_BEGIN

//! The distribution an inference engine actually sampled from: temperature, then top-k (ties
//! kept), then top-p over the renormalised top-k distribution (vLLM's processed logprobs and
//! DeepSeek-V3.2's kept sampling mask). Use it to score behaviour/old logprobs consistently.
[[nodiscard]] inline logprob_options sampled(float temperature, index_t top_k, float top_p) {
  return {.temperature = temperature, .top_k = top_k, .top_p = top_p};
}

namespace compat {

namespace verl {
//! verl: actor/ref compute `logits.div_(temperature)` with the rollout temperature, then
//! logprobs_from_logits and entropy_from_logits on the full softmax.
[[nodiscard]] inline logprob_options logprob(float rollout_temperature = 1.0f) {
  return {.temperature = rollout_temperature};
}
} // namespace verl

namespace trl {
//! TRL GRPOTrainer: `logits / self.temperature`, selective_log_softmax, full softmax entropy.
[[nodiscard]] inline logprob_options logprob(float temperature = 1.0f) { return {.temperature = temperature}; }
} // namespace trl

namespace openrlhf {
//! OpenRLHF Actor.forward(temperature=...): logits divided by the generation temperature.
[[nodiscard]] inline logprob_options logprob(float temperature = 1.0f) { return {.temperature = temperature}; }
} // namespace openrlhf

namespace areal {
//! AReaL: logits divided by the rollout temperature before gather_logprobs(_entropy).
[[nodiscard]] inline logprob_options logprob(float temperature = 1.0f) { return {.temperature = temperature}; }
} // namespace areal

namespace slime {
//! slime: logits divided by the rollout temperature (T = 0 greedy rollouts must score with
//! T = 1 or top_k = 1: rlpt rejects T <= 0, slime #2197).
[[nodiscard]] inline logprob_options logprob(float rollout_temperature = 1.0f) {
  return {.temperature = rollout_temperature};
}
} // namespace slime

} // namespace compat
RLPT_NAMESPACE_END
