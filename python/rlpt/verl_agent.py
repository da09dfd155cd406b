# SPDX-License-Identifier: Apache-2.0
"""rlpt inside verl-agent: drop-ins for the two GiGPO functions of its ``gigpo.core_gigpo``, with
their signatures and return values, computed by rlpt::step_returns and rlpt::gigpo_advantages
(docs/advantage.md, "GiGPO: multi-step agents"):

    from rlpt import verl_agent as core_gigpo       # in place of: from gigpo import core_gigpo

compute_step_discounted_returns(batch, gamma) reads batch.non_tensor_batch's ``rewards`` and
``traj_uid`` (and ``active_masks``, which verl-agent requires to be all ones within a trajectory),
and returns float32 [bs] on batch.batch["input_ids"]'s device. compute_gigpo_outcome_advantage(...)
returns (scores, scores), [bs, response_length] in token_level_rewards' dtype, zero where
response_mask is. enable_similarity=True groups text observations as verl-agent does
(rlpt.similar_anchor_ids: difflib ratios against each group's first observation, in row order).
What differs on purpose: a non-finite reward raises rlpt.Error (verl-agent propagates it).
"""
import numpy as np
import torch

import rlpt


def compute_step_discounted_returns(batch, gamma):
    nt = batch.non_tensor_batch
    active = np.asarray(nt["active_masks"]).astype(bool)
    if not active.all():
        raise rlpt.Error("rlpt.python.shape", f"active_masks has {int((~active).sum())} inactive rows; verl-agent "
                         "requires every row of a trajectory to be active")
    rewards = torch.as_tensor(np.asarray(nt["rewards"], dtype=np.float32))
    out = rlpt.step_returns(rewards, list(nt["traj_uid"]), gamma=gamma)
    return out.to(batch.batch["input_ids"].device)


def compute_gigpo_outcome_advantage(token_level_rewards, step_rewards, response_mask, anchor_obs, index, traj_index,
                                    epsilon=1e-6, step_advantage_w=1.0, mode="mean_norm", enable_similarity=False,
                                    similarity_thresh=0.95):
    del traj_index  # verl-agent's episode statistics run over rows (steps), not trajectories
    scores = token_level_rewards.sum(dim=-1)
    adv, _ = rlpt.gigpo_advantages(scores, list(index), step_rewards, list(anchor_obs), mode=mode,
                                   step_advantage_w=step_advantage_w, epsilon=epsilon,
                                   similarity_threshold=similarity_thresh if enable_similarity else None)
    out = adv.to(token_level_rewards.dtype).to(token_level_rewards.device)[:, None] * response_mask
    return out, out
