"""Advantage estimators: golden vectors from verl, OpenRLHF and TRL on seeded random inputs.

Every output array comes from the peer's own function:
  verl      verl.trainer.ppo.core_algos.compute_*_advantage* (grpo loop and vectorised, rloo loop and
            vectorised, opo, gpg, grpo_passk, reinforce_plus_plus(_baseline), remax, gae, gdpo)
  OpenRLHF  RemoteExperienceMaker.compute_advantages_and_returns (group_norm, dr_grpo, rloo,
            reinforce_baseline, reinforce, gae, with its length penalties and token whitening),
            called on a stub `self` that carries only the attributes the method reads
  TRL       trl.rewards.get_soft_overlong_punishment; trl.trainer.utils.nanstd. TRL computes GRPO
            advantages inline in GRPOTrainer._generate_and_score_completions (it needs a model and
            generation), so `trl_grpo` applies TRL's nanstd and torch.nanmean with that method's
            formula (documented in the file's meta), not a callable TRL advantage function.
  verl-agent gigpo.core_gigpo.compute_step_discounted_returns and compute_gigpo_outcome_advantage (GiGPO),
            from a checkout named by $RLPT_VERL_AGENT (verl-agent is not on PyPI; without the variable
            the committed verl_agent_gigpo.bin is kept)
Each verl/OpenRLHF case is run twice: in float32 (the peers' dtype) and in float64 (the same
functions on float64 tensors: the peer's formula without fp32 rounding), so the C++ tests can
tell rlpt's rounding from the peer's.
"""
import importlib
import importlib.util
import os
import pathlib
import sys
import types
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace as NS

import numpy as np
import torch

import peers
import rlpt_golden


def _openrlhf_experience_maker():
    """Import openrlhf's experience_maker without its package __init__ files (flash_attn, vllm, ray actors)."""
    root = pathlib.Path(importlib.util.find_spec("openrlhf").submodule_search_locations[0])
    for name, path in (("openrlhf.models", "models"), ("openrlhf.utils", "utils"), ("openrlhf.trainer", "trainer"),
                       ("openrlhf.trainer.ppo_utils", "trainer/ppo_utils"), ("openrlhf.trainer.ray", "trainer/ray")):
        if name not in sys.modules:
            package = types.ModuleType(name)
            package.__path__ = [str(root / path)]
            sys.modules[name] = package
    if "openrlhf.trainer.ray.launcher" not in sys.modules:
        launcher = types.ModuleType("openrlhf.trainer.ray.launcher")
        launcher.RayActorGroup = object  # only used as a type annotation
        sys.modules["openrlhf.trainer.ray.launcher"] = launcher
    return importlib.import_module("openrlhf.trainer.ppo_utils.experience_maker")


# --- inputs ---------------------------------------------------------------------------------------

def ragged_groups(rng, n_groups, sizes, shuffle=True):
    """Group ids (any order) with the given size choices; includes singletons when 1 is in sizes."""
    ids = np.concatenate([np.full(rng.choice(sizes), 1000 + 7 * g) for g in range(n_groups)]).astype(np.int64)
    if shuffle:
        rng.shuffle(ids)
    return ids


def outcome_rewards(rng, ids):
    """Per-sequence rewards mixing the shapes seen in practice, group by group."""
    r = np.zeros(len(ids))
    for k, gid in enumerate(np.unique(ids)):
        members = np.flatnonzero(ids == gid)
        kind = k % 6
        if kind == 0:  # binary verifier
            r[members] = rng.integers(0, 2, len(members))
        elif kind == 1:  # continuous reward model
            r[members] = rng.normal(0.3, 1.2, len(members))
        elif kind == 2:  # all equal, non-dyadic (zero std must give exactly 0)
            r[members] = 0.35
        elif kind == 3:  # non-dyadic near-constant grid (NeMo-RL regression: 0.35, 0.4, 0.3)
            r[members] = rng.choice([0.35, 0.4, 0.3], len(members))
        elif kind == 4:  # all equal, exactly representable
            r[members] = 1.0
        else:  # rubric scores
            r[members] = rng.integers(0, 11, len(members)) / 10.0
    return r.astype(np.float32)


def masks(rng, B, T, holes=True, empty_row=False):
    """Prefix masks (length uniform in [T/4, T]) with interior holes (multi-turn tool tokens)."""
    m = np.zeros((B, T), dtype=np.uint8)
    for b in range(B):
        n = rng.integers(T // 4, T + 1)
        m[b, :n] = 1
        if holes and b % 3 == 0 and n > 8:
            for _ in range(rng.integers(1, 3)):
                s = rng.integers(1, n - 4)
                m[b, s:s + rng.integers(1, 5)] = 0
    if empty_row:
        m[B // 2] = 0
    return m


def last_valid(m):
    idx = np.full(m.shape[0], -1)
    for b in range(m.shape[0]):
        nz = np.flatnonzero(m[b])
        if len(nz):
            idx[b] = nz[-1]
    return idx


def place_last(m, seq):
    """Token rewards with seq[b] on the last valid token of row b."""
    tok = np.zeros(m.shape, dtype=np.float32)
    for b, t in enumerate(last_valid(m)):
        if t >= 0:
            tok[b, t] = seq[b]
    return tok


def t(x, dtype):
    return torch.tensor(np.asarray(x), dtype=dtype)


# --- verl -------------------------------------------------------------------------------------------

def gen_verl_outcome(out_dir: Path, seed: int):
    import verl.trainer.ppo.core_algos as ca

    rng = np.random.default_rng(seed + 1)
    ids = ragged_groups(rng, 48, [1, 2, 3, 4, 5, 8, 16])
    B, T = len(ids), 10
    m = masks(rng, B, T)
    m[:, 0] = 1  # every row has at least one valid token (the reward sits on the last one)
    seq = outcome_rewards(rng, ids)
    tok = place_last(m, seq)
    lengths = m.sum(1).astype(np.int64)
    baselines = rng.normal(0.2, 0.5, B).astype(np.float32)

    arrays = {"ids": ids, "mask": m, "token_rewards": tok, "lengths": lengths, "baselines": baselines}
    for suffix, dt in (("f32", torch.float32), ("f64", torch.float64)):
        r, mm = t(tok, dt), t(m, dt)
        for norm in (True, False):
            a, _ = ca.compute_grpo_outcome_advantage(r.clone(), mm, ids, norm_adv_by_std_in_grpo=norm)
            arrays[f"grpo_{'std' if norm else 'nostd'}_{suffix}"] = a
        arrays[f"rloo_{suffix}"] = ca.compute_rloo_outcome_advantage(r.clone(), mm, ids)[0]
        arrays[f"rloo_vectorized_{suffix}"] = ca.compute_rloo_vectorized_outcome_advantage(r.clone(), mm, ids)[0]
        arrays[f"opo_{suffix}"] = ca.compute_opo_outcome_advantage(r.clone(), mm, ids)[0]
        arrays[f"gpg_{suffix}"] = ca.compute_gpg_outcome_advantage(r.clone(), mm, ids)[0]
        arrays[f"reinforce_baseline_{suffix}"] = ca.compute_reinforce_plus_plus_baseline_outcome_advantage(
            r.clone(), mm, ids)[0]
        adv, ret = ca.compute_remax_outcome_advantage(r.clone(), t(baselines, dt), mm)
        arrays[f"remax_adv_{suffix}"], arrays[f"remax_ret_{suffix}"] = adv, ret
    # grpo_vectorized works in float32 whatever the input dtype (group_mean_std casts)
    for norm in (True, False):
        a, _ = ca.compute_grpo_vectorized_outcome_advantage(t(tok, torch.float32), t(m, torch.float32), ids,
                                                            norm_adv_by_std_in_grpo=norm)
        arrays[f"grpo_vectorized_{'std' if norm else 'nostd'}_f32"] = a
    rlpt_golden.write(out_dir / "verl_outcome.bin", arrays, peers.meta(
        "advantage", seed, case="verl outcome estimators", B=B, T=T,
        functions=["compute_grpo_outcome_advantage", "compute_grpo_vectorized_outcome_advantage",
                   "compute_rloo_outcome_advantage", "compute_rloo_vectorized_outcome_advantage",
                   "compute_opo_outcome_advantage", "compute_gpg_outcome_advantage",
                   "compute_reinforce_plus_plus_baseline_outcome_advantage", "compute_remax_outcome_advantage"]))

    # pass@k needs groups of >= 2
    ids2 = ragged_groups(rng, 40, [2, 3, 4, 8])
    B2 = len(ids2)
    m2 = np.ones((B2, 4), dtype=np.uint8)
    seq2 = outcome_rewards(rng, ids2)
    seq2[::5] = rng.normal(0, 1, len(seq2[::5]))  # break some ties
    tok2 = place_last(m2, seq2)
    arrays = {"ids": ids2, "mask": m2, "token_rewards": tok2}
    for suffix, dt in (("f32", torch.float32), ("f64", torch.float64)):
        for norm in (True, False):
            a, _ = ca.compute_grpo_passk_outcome_advantage(t(tok2, dt), t(m2, dt), ids2,
                                                           config={"norm_adv_by_std_in_grpo": norm})
            arrays[f"passk_{'std' if norm else 'nostd'}_{suffix}"] = a
    rlpt_golden.write(out_dir / "verl_passk.bin", arrays, peers.meta(
        "advantage", seed, case="verl grpo_passk", functions=["compute_grpo_passk_outcome_advantage"]))


def gen_verl_tokens(out_dir: Path, seed: int):
    import verl.trainer.ppo.core_algos as ca

    rng = np.random.default_rng(seed + 2)
    B, T = 40, 64
    m = masks(rng, B, T, holes=True, empty_row=True)
    values = rng.normal(0.0, 1.0, (B, T)).astype(np.float32)
    # token rewards: a small per-token KL-like term plus an outcome on the last valid token
    tok = (rng.normal(0.0, 0.05, (B, T)) * m).astype(np.float32) + place_last(m, rng.normal(0.5, 1.0, B).astype(np.float32))
    arrays = {"mask": m, "values": values, "token_rewards": tok}
    settings = [(1.0, 1.0), (0.99, 0.95), (1.0, 0.9)]
    for k, (gamma, lam) in enumerate(settings):
        for suffix, dt in (("f32", torch.float32), ("f64", torch.float64)):
            adv, ret = ca.compute_gae_advantage_return(t(tok, dt), t(values, dt), t(m, dt), gamma, lam)
            arrays[f"gae{k}_adv_{suffix}"], arrays[f"gae{k}_ret_{suffix}"] = adv, ret
    for k, gamma in enumerate((1.0, 0.97)):
        for suffix, dt in (("f32", torch.float32), ("f64", torch.float64)):
            adv, ret = ca.compute_reinforce_plus_plus_outcome_advantage(t(tok, dt), t(m, dt), config=NS(gamma=gamma))
            arrays[f"rpp{k}_adv_{suffix}"], arrays[f"rpp{k}_ret_{suffix}"] = adv, ret
    arrays["gae_settings"] = np.array(settings)
    arrays["rpp_gammas"] = np.array([1.0, 0.97])
    rlpt_golden.write(out_dir / "verl_tokens.bin", arrays, peers.meta(
        "advantage", seed, case="verl token estimators (masks with interior holes, one empty row)", B=B, T=T,
        functions=["compute_gae_advantage_return", "compute_reinforce_plus_plus_outcome_advantage"]))


def gen_verl_gdpo(out_dir: Path, seed: int):
    import verl.trainer.ppo.core_algos as ca

    rng = np.random.default_rng(seed + 3)
    ids = ragged_groups(rng, 24, [1, 2, 4, 6])
    B, T, P = len(ids), 16, 5
    m = np.zeros((B, T), dtype=np.uint8)
    for b in range(B):
        m[b, :rng.integers(1, T + 1)] = 1  # prefix masks: verl places each channel at sum(mask) - 1
    channels = np.stack([outcome_rewards(rng, ids), rng.integers(0, 2, B).astype(np.float32),
                         rng.normal(0, 2, B).astype(np.float32)], axis=1)
    weights = np.array([1.0, 0.5, 2.0], dtype=np.float32)
    keys = ["acc", "fmt", "len"]
    arrays = {"ids": ids, "mask": m, "channels": channels, "weights": weights}
    attention = np.concatenate([np.ones((B, P), dtype=np.int64), m.astype(np.int64)], axis=1)
    for suffix, dt in (("f32", torch.float32), ("f64", torch.float64)):
        adv, _ = ca.compute_gdpo_outcome_advantage(
            token_level_rewards=torch.zeros((B, T), dtype=dt), response_mask=t(m, dt), index=ids,
            config={"gdpo_reward_keys": keys, "gdpo_reward_weights": weights.tolist()},
            non_tensor_batch={k: channels[:, i] for i, k in enumerate(keys)},
            batch={"prompts": torch.zeros((B, P), dtype=torch.long), "attention_mask": torch.from_numpy(attention)})
        arrays[f"gdpo_{suffix}"] = adv
    rlpt_golden.write(out_dir / "verl_gdpo.bin", arrays, peers.meta(
        "advantage", seed, case="verl gdpo, 3 reward channels", functions=["compute_gdpo_outcome_advantage"]))


# --- verl-agent (GiGPO) ----------------------------------------------------------------------------

def _verl_agent_gigpo():
    """verl-agent's gigpo.core_gigpo from a checkout named by $RLPT_VERL_AGENT (not on PyPI; its module
    imports verl.DataProto, which the venv has). None when the variable is unset."""
    root = os.environ.get("RLPT_VERL_AGENT")
    if not root:
        return None
    spec = importlib.util.spec_from_file_location("verl_agent_core_gigpo", Path(root) / "gigpo" / "core_gigpo.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def gigpo_steps(rng, tasks, n, max_len, n_states):
    """A batch of agent steps as verl-agent lays it out (each trajectory's steps contiguous, in order): task
    (episode group) and trajectory ids, the state each step starts from (a small set, so states recur;
    every trajectory of a task starts in state 0), per-step rewards, the trajectory's score."""
    task, traj, state, reward, score = [], [], [], [], []
    for k in range(tasks):
        for j in range(n):
            length = int(rng.integers(1, max_len + 1))
            s = float(rng.integers(0, 2)) if rng.random() < 0.8 else float(rng.normal())
            for step in range(length):
                task.append(500 + 11 * k)
                traj.append(1000 * k + j)
                state.append(0 if step == 0 else int(rng.integers(0, n_states)))
                reward.append(s if step + 1 == length else float(rng.choice([0.0, 0.0, -0.1, 0.05])))
                score.append(s)
    return (np.array(task, dtype=np.int64), np.array(traj, dtype=np.int64), np.array(state, dtype=np.int64),
            np.array(reward, dtype=np.float32), np.array(score, dtype=np.float32))


def gen_verl_agent_gigpo(out_dir: Path, seed: int):
    """GiGPO against verl-agent's own functions (compute_step_discounted_returns,
    compute_gigpo_outcome_advantage), float32 as verl-agent runs them: one row per step."""
    gigpo = _verl_agent_gigpo()
    if gigpo is None:
        print("gen_advantage: RLPT_VERL_AGENT is not set (a verl-agent checkout); verl_agent_gigpo.bin kept")
        return
    from verl import DataProto

    rng = np.random.default_rng(seed + 11)
    arrays = {}
    # Two batches: many tasks with recurring states; and tasks of one trajectory (singleton groups).
    for tag, shape in (("a", (6, 8, 6, 3)), ("b", (5, 1, 3, 2))):
        task, traj, state, reward, score = gigpo_steps(rng, *shape)
        B, T = len(task), 4
        batch = DataProto.from_dict(tensors={"input_ids": torch.zeros((B, T), dtype=torch.long)},
                                    non_tensors={"rewards": reward, "traj_uid": traj.astype(str),
                                                 "active_masks": np.ones(B, dtype=bool)})
        returns = gigpo.compute_step_discounted_returns(batch, gamma=0.95)
        token_rewards = torch.zeros((B, T), dtype=torch.float32)
        token_rewards[:, -1] = torch.from_numpy(score)  # the score on the last token, as verl's reward manager puts it
        mask = torch.ones((B, T), dtype=torch.float32)
        anchor_obs = np.array([f"state {s}" for s in state], dtype=object)
        arrays.update({f"{tag}_task": task, f"{tag}_traj": traj, f"{tag}_state": state, f"{tag}_reward": reward,
                       f"{tag}_score": score, f"{tag}_returns": returns.numpy()})
        for mode in ("mean_norm", "mean_std_norm"):
            for w in (1.0, 0.5):
                adv, _ = gigpo.compute_gigpo_outcome_advantage(
                    token_level_rewards=token_rewards, step_rewards=returns, response_mask=mask,
                    anchor_obs=anchor_obs, index=task.astype(str), traj_index=traj.astype(str), epsilon=1e-6,
                    step_advantage_w=w, mode=mode)
                arrays[f"{tag}_{mode}_w{w:g}"] = adv[:, 0].numpy()
    # Text observations with near-duplicates, grouped by verl-agent's similarity clustering
    # (enable_similarity: difflib ratios against each cluster's first observation) at two thresholds.
    rng = np.random.default_rng(seed + 12)
    task, traj, state, reward, score = gigpo_steps(rng, 5, 6, 5, 4)
    B, T = len(task), 4
    rooms = ["kitchen", "hallway", "study", "garden"]
    things = ["a red key", "two books", "a lamp", "a locked chest"]
    texts = []
    for s_ in state:
        text = f"You are in the {rooms[s_]}. You see {things[s_]} and a door to the north."
        kind = int(rng.integers(0, 3))
        if kind == 1:
            text += f" Step {int(rng.integers(1, 9))}."
        elif kind == 2:
            text = text.replace("north", "south") + " It is quiet."
        texts.append(text)
    encoded = [t_.encode() for t_ in texts]
    batch = DataProto.from_dict(tensors={"input_ids": torch.zeros((B, T), dtype=torch.long)},
                                non_tensors={"rewards": reward, "traj_uid": traj.astype(str),
                                             "active_masks": np.ones(B, dtype=bool)})
    returns = gigpo.compute_step_discounted_returns(batch, gamma=0.95)
    token_rewards = torch.zeros((B, T), dtype=torch.float32)
    token_rewards[:, -1] = torch.from_numpy(score)
    arrays.update({"c_task": task, "c_traj": traj, "c_score": score, "c_returns": returns.numpy(),
                   "c_obs_bytes": np.frombuffer(b"".join(encoded), dtype=np.uint8).copy(),
                   "c_obs_offsets": np.cumsum([0] + [len(e) for e in encoded]).astype(np.int64)})
    for mode in ("mean_norm", "mean_std_norm"):
        for thresh in (0.8, 0.95):
            adv, _ = gigpo.compute_gigpo_outcome_advantage(
                token_level_rewards=token_rewards, step_rewards=returns, response_mask=torch.ones((B, T)),
                anchor_obs=np.array(texts, dtype=object), index=task.astype(str), traj_index=traj.astype(str),
                epsilon=1e-6, step_advantage_w=1.0, mode=mode, enable_similarity=True, similarity_thresh=thresh)
            arrays[f"c_{mode}_t{thresh:g}"] = adv[:, 0].numpy()
    rlpt_golden.write(out_dir / "verl_agent_gigpo.bin", arrays, peers.meta(
        "advantage", seed, case="GiGPO: step returns (gamma 0.95) and advantages, both modes, w in (1, 0.5); "
        "batch c: text observations grouped by similarity (enable_similarity, thresholds 0.8 and 0.95)",
        source=getattr(gigpo, "VERL_AGENT_SOURCE", str(Path(os.environ["RLPT_VERL_AGENT"]))),
        functions=["compute_step_discounted_returns", "compute_gigpo_outcome_advantage"]))


# --- OpenRLHF -----------------------------------------------------------------------------------------

def gen_openrlhf(out_dir: Path, seed: int):
    em = _openrlhf_experience_maker()
    import openrlhf.models.utils as outils

    rng = np.random.default_rng(seed + 4)
    n, prompts, T = 4, 12, 32
    B = n * prompts
    m = masks(rng, B, T, holes=True)
    m[:, 0] = 1
    rewards = outcome_rewards(rng, np.repeat(np.arange(prompts), n))
    values = rng.normal(0.0, 1.0, (B, T)).astype(np.float32)
    kl = np.abs(rng.normal(0.0, 0.05, (B, T))).astype(np.float32)
    lengths = m.sum(1).astype(np.int64)
    truncated = (rng.random(B) < 0.25).astype(np.uint8)
    order = rng.permutation(B)  # experiences arrive out of prompt order; OpenRLHF sorts by index
    beta = 0.05
    arrays = {"mask": m, "rewards": rewards, "values": values, "kl": kl, "lengths": lengths,
              "truncated": truncated, "beta": np.array(beta)}

    def run(estimator, dt, gamma=1.0, lambd=0.95, no_std_norm=False, kl_coef=0.0, overlong=None, stop_coef=None):
        args = NS(algo=NS(advantage=NS(estimator=estimator, gamma=gamma, lambd=lambd, no_std_norm=no_std_norm)),
                  rollout=NS(n_samples_per_prompt=n, max_new_tokens=T),
                  reward=NS(clip_range=(-10.0, 10.0), overlong_buffer_len=overlong[0] if overlong else None,
                            overlong_penalty_factor=overlong[1] if overlong else 1.0,
                            stop_properly_penalty_coef=stop_coef),
                  data=NS(max_len=T))
        maker = NS(strategy=NS(args=args), args=args, advantage_estimator=estimator, kl_ctl=NS(value=kl_coef))
        for method in ("get_advantages_and_returns", "get_cumulative_returns"):
            setattr(maker, method, types.MethodType(getattr(em.RemoteExperienceMaker, method), maker))
        exps = []
        for chunk in np.array_split(order, 3):
            exps.append(NS(index=chunk.tolist(), rewards=t(rewards[chunk], dt), action_mask=t(m[chunk], torch.bool),
                           kl=t(kl[chunk], dt), values=t(values[chunk], dt), info={},
                           response_length=t(lengths[chunk], torch.int64), truncated=t(truncated[chunk], torch.bool)))
        exps = em.RemoteExperienceMaker.compute_advantages_and_returns(maker, exps)
        adv = np.zeros((B, T))
        ret = np.zeros((B, T))
        for chunk, e in zip(np.array_split(order, 3), exps):
            adv[chunk] = e.advantages.double().numpy()
            ret[chunk] = e.returns.double().numpy()
        return adv, ret

    for suffix, dt in (("f32", torch.float32), ("f64", torch.float64)):
        for est in ("group_norm", "dr_grpo", "rloo", "reinforce_baseline"):
            arrays[f"{est}_adv_{suffix}"] = run(est, dt)[0]
        arrays[f"reinforce_adv_{suffix}"], arrays[f"reinforce_ret_{suffix}"] = run("reinforce", dt, gamma=0.98,
                                                                                  kl_coef=beta)
        arrays[f"gae_adv_{suffix}"], arrays[f"gae_ret_{suffix}"] = run("gae", dt, gamma=0.99, lambd=0.95, kl_coef=beta)
        arrays[f"gae_nostd_adv_{suffix}"] = run("gae", dt, gamma=1.0, lambd=0.9, no_std_norm=True, kl_coef=beta)[0]
        arrays[f"shaped_group_norm_adv_{suffix}"] = run("group_norm", dt, overlong=(8, 0.5), stop_coef=0.3)[0]
        arrays[f"shaped_neg_group_norm_adv_{suffix}"] = run("group_norm", dt, overlong=(8, 2.0), stop_coef=-0.5)[0]
        # the token rewards OpenRLHF's compute_reward builds for the KL runs (input of GAE / reinforce)
        arrays[f"token_rewards_{suffix}"] = outils.compute_reward(t(rewards, dt), beta, t(kl, dt),
                                                                  action_mask=t(m, torch.bool),
                                                                  reward_clip_range=(-10.0, 10.0))
    rlpt_golden.write(out_dir / "openrlhf.bin", arrays, peers.meta(
        "advantage", seed, case="OpenRLHF compute_advantages_and_returns", n_samples_per_prompt=n, prompts=prompts,
        T=T, beta=beta, clip_range=[-10.0, 10.0],
        functions=["RemoteExperienceMaker.compute_advantages_and_returns", "compute_reward",
                   "apply_overlong_penalty (buffer 8, factor 0.5 / 2.0)", "apply_stop_properly_penalty (0.3 / -0.5)"]))


# --- TRL ----------------------------------------------------------------------------------------------

def gen_trl(out_dir: Path, seed: int):
    from trl.rewards import get_soft_overlong_punishment
    from trl.trainer.utils import nanstd

    rng = np.random.default_rng(seed + 5)
    n, prompts, K = 6, 16, 2
    B = n * prompts
    per_func = np.stack([outcome_rewards(rng, np.repeat(np.arange(prompts), n)),
                         rng.integers(0, 2, B).astype(np.float32)], axis=1)
    per_func[rng.random((B, K)) < 0.08] = np.nan  # reward functions returning None
    per_func[5] = np.nan                          # an unscorable completion
    per_func[6 * 3: 6 * 3 + 5] = np.nan           # a group with one scorable completion
    weights = np.array([1.0, 0.5], dtype=np.float32)
    arrays = {"per_func": per_func, "weights": weights, "num_generations": np.array(n)}

    # GRPOTrainer._generate_and_score_completions (trl 1.16.0), formula restated:
    rpf = torch.from_numpy(per_func)
    w = torch.from_numpy(weights)
    unscorable = torch.isnan(rpf).all(dim=1)
    rewards = (rpf * w.unsqueeze(0)).nansum(dim=1)
    rewards[unscorable] = torch.nan
    arrays["summed"] = rewards
    mean_g = torch.nanmean(rewards.view(-1, n), dim=1).repeat_interleave(n)
    std_g = nanstd(rewards.view(-1, n), dim=1).repeat_interleave(n)
    std_b = nanstd(rewards).expand_as(rewards)
    arrays["sum_group"] = torch.nan_to_num((rewards - mean_g) / (std_g + 1e-4), nan=0.0)
    arrays["sum_batch"] = torch.nan_to_num((rewards - mean_g) / (std_b + 1e-4), nan=0.0)
    arrays["sum_none"] = torch.nan_to_num(rewards - mean_g, nan=0.0)
    grouped = rpf.view(-1, n, K)
    z = (grouped - torch.nanmean(grouped, dim=1, keepdim=True)) / (nanstd(grouped, dim=1, keepdim=True) + 1e-4)
    summed = (z.view(-1, K) * w.unsqueeze(0)).nansum(dim=1)
    summed[unscorable] = torch.nan
    arrays["norm_then_sum"] = torch.nan_to_num((summed - torch.nanmean(summed)) / (nanstd(summed) + 1e-4), nan=0.0)

    # RLOOTrainer (trl 1.16.0), formula restated, on the summed rewards:
    g = rewards.view(-1, n)
    counts = (~torch.isnan(g)).sum(dim=1, keepdim=True)
    loo = (rewards - ((torch.nansum(g, dim=1, keepdim=True) - g) / (counts - 1)).view(-1))
    arrays["rloo"] = torch.nan_to_num(loo, nan=0.0)
    arrays["rloo_norm"] = torch.nan_to_num((loo - torch.nanmean(loo)) / (nanstd(loo) + 1e-4), nan=0.0)

    # soft overlong punishment: TRL's own reward function
    lengths = rng.integers(0, 140, 64)
    fn = get_soft_overlong_punishment(max_completion_len=100, soft_punish_cache=20)
    arrays["overlong_lengths"] = lengths.astype(np.int64)
    arrays["overlong"] = np.array(fn(completion_ids=[[1] * int(L) for L in lengths]), dtype=np.float64)
    rlpt_golden.write(out_dir / "trl.bin", arrays, peers.meta(
        "advantage", seed, case="TRL GRPO / RLOO advantages and soft overlong punishment", num_generations=n,
        reward_funcs=K, functions=["trl.trainer.utils.nanstd", "trl.rewards.get_soft_overlong_punishment"],
        restated=("sum_group/sum_batch/sum_none/norm_then_sum follow GRPOTrainer._generate_and_score_completions, "
                  "rloo/rloo_norm follow RLOOTrainer._generate_and_score_completions (trl 1.16.0): advantages are "
                  "computed inline there, so these call TRL's nanstd with torch.nanmean/nansum in the same order")))


def generate(out_dir: Path, seed: int) -> None:
    torch.manual_seed(seed)
    gen_verl_outcome(out_dir, seed)
    gen_verl_tokens(out_dir, seed)
    gen_verl_gdpo(out_dir, seed)
    gen_openrlhf(out_dir, seed)
    gen_trl(out_dir, seed)
    gen_verl_agent_gigpo(out_dir, seed)
