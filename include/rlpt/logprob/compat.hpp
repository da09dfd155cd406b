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
//! DeepSeek-V3.2's kept sampling mask), with min-p where `order` says (vLLM's first by default;
//! compat::sglang::sampled and compat::hf::sampled put it last). Use it to score behaviour/old
//! logprobs consistently.
[[nodiscard]] inline logprob_options sampled(float temperature, index_t top_k, float top_p, float min_p = 0.0f,
                                             min_p_order order = min_p_order::first) {
  return {.temperature = temperature, .top_k = top_k, .top_p = top_p, .min_p = min_p, .min_p_order = order};
}

namespace compat {

namespace vllm {
//! vLLM's SamplingParams (temperature, top_k, top_p, min_p; top_k -1 = off): its sampler divides
//! by the temperature, applies min-p (an argmax-invariant logits processor), then top-k and
//! top-p over what min-p kept.
[[nodiscard]] inline logprob_options sampled(float temperature, index_t top_k = -1, float top_p = 1.0f,
                                             float min_p = 0.0f) {
  return rlpt::sampled(temperature, top_k, top_p, min_p, min_p_order::first);
}
} // namespace vllm

namespace sglang {
//! SGLang's sampling params: temperature, then top-k and top-p on the probabilities, then min-p
//! against the most probable token (its torch and FlashInfer samplers alike).
[[nodiscard]] inline logprob_options sampled(float temperature, index_t top_k = -1, float top_p = 1.0f,
                                             float min_p = 0.0f) {
  return rlpt::sampled(temperature, top_k, top_p, min_p, min_p_order::last);
}
} // namespace sglang

namespace hf {
//! Hugging Face generate(): TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper, then
//! MinPLogitsWarper (top_k 0 = off).
[[nodiscard]] inline logprob_options sampled(float temperature, index_t top_k = 0, float top_p = 1.0f,
                                             float min_p = 0.0f) {
  return rlpt::sampled(temperature, top_k, top_p, min_p, min_p_order::last);
}
} // namespace hf

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
