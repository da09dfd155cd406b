# SPDX-License-Identifier: Apache-2.0
"""rlpt.verl_agent (drop-ins for verl-agent's gigpo.core_gigpo) against the golden vectors verl-agent's
own compute_step_discounted_returns and compute_gigpo_outcome_advantage computed
(tests/data/golden/advantage/verl_agent_gigpo.bin, tools/golden/gen_advantage.py): verl-agent is
not on PyPI, so its outputs come from the file; the batch goes through verl's DataProto as there."""
import pathlib
import sys

import numpy as np
import pytest
import torch

pytest.importorskip("verl")
import rlpt  # noqa: E402
import rlpt.verl_agent as core_gigpo  # noqa: E402
from conftest import close  # noqa: E402
from verl import DataProto  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools" / "golden"))
import rlpt_golden  # noqa: E402

GOLDEN, _META = rlpt_golden.read(ROOT / "tests" / "data" / "golden" / "advantage" / "verl_agent_gigpo.bin")


@pytest.mark.parametrize("tag", ["a", "b"])
def test_drop_ins_equal_verl_agent(tag):
    g = {k[len(tag) + 1:]: v for k, v in GOLDEN.items() if k.startswith(tag + "_")}
    B, T = len(g["task"]), 4
    batch = DataProto.from_dict(tensors={"input_ids": torch.zeros((B, T), dtype=torch.long)},
                                non_tensors={"rewards": g["reward"], "traj_uid": g["traj"].astype(str),
                                             "active_masks": np.ones(B, dtype=bool)})
    returns = core_gigpo.compute_step_discounted_returns(batch, gamma=0.95)
    close(returns.double(), torch.from_numpy(g["returns"]).double(), 2e-5, 2e-6, "returns")
    token_rewards = torch.zeros((B, T))
    token_rewards[:, -1] = torch.from_numpy(g["score"])
    mask = torch.ones((B, T))
    mask[0, 2:] = 0  # masked tokens get 0
    anchor_obs = np.array([f"state {s}" for s in g["state"]], dtype=object)
    for mode in ("mean_norm", "mean_std_norm"):
        for w in (1.0, 0.5):
            scores, same = core_gigpo.compute_gigpo_outcome_advantage(
                token_rewards, torch.from_numpy(g["returns"]), mask, anchor_obs, g["task"].astype(str),
                g["traj"].astype(str), epsilon=1e-6, step_advantage_w=w, mode=mode)
            assert scores is same and scores.shape == (B, T)
            want = torch.from_numpy(g[f"{mode}_w{w:g}"]).double()[:, None] * mask.double()
            close(scores.double(), want, 2e-5, 2e-6, f"{mode} w={w}")


def test_similarity_grouping_equals_verl_agent():
    # text observations with near-duplicates, clustered as verl-agent's enable_similarity does
    g = {k[2:]: v for k, v in GOLDEN.items() if k.startswith("c_")}
    B, T = len(g["task"]), 4
    raw, off = g["obs_bytes"].tobytes(), g["obs_offsets"]
    texts = np.array([raw[off[i]:off[i + 1]].decode() for i in range(B)], dtype=object)
    token_rewards = torch.zeros((B, T))
    token_rewards[:, -1] = torch.from_numpy(g["score"])
    for mode in ("mean_norm", "mean_std_norm"):
        for thresh in (0.8, 0.95):
            scores, _ = core_gigpo.compute_gigpo_outcome_advantage(
                token_rewards, torch.from_numpy(g["returns"]), torch.ones((B, T)), texts, g["task"].astype(str),
                g["traj"].astype(str), mode=mode, enable_similarity=True, similarity_thresh=thresh)
            close(scores[:, 0].double(), torch.from_numpy(g[f"{mode}_t{thresh:g}"]).double(), 2e-5, 2e-6,
                  f"{mode} threshold {thresh}")
    # the groups themselves: within a task, each row joins the first group whose first text it matches
    ids = rlpt.similar_anchor_ids(["ab cd", "ab ce", "xyz", "ab cd"], [0, 0, 0, 1], 0.75)
    assert ids.tolist() == [0, 0, 1, 2]


def test_drop_in_refusals():
    t = torch.zeros((2, 3))
    with pytest.raises(rlpt.Error, match="not in \\(0, 1\\)"):
        core_gigpo.compute_gigpo_outcome_advantage(t, torch.zeros(2), torch.ones(2, 3), np.array(["a", "b"]),
                                                   np.array(["p", "p"]), np.array(["t0", "t1"]), enable_similarity=True,
                                                   similarity_thresh=1.0)
    with pytest.raises(rlpt.Error, match="anchor_obs\\[1\\] is a int"):
        rlpt.similar_anchor_ids(["a", 3], [0, 0], 0.9)
    batch = DataProto.from_dict(tensors={"input_ids": torch.zeros((2, 3), dtype=torch.long)},
                                non_tensors={"rewards": np.zeros(2, dtype=np.float32),
                                             "traj_uid": np.array(["t0", "t0"]),
                                             "active_masks": np.array([True, False])})
    with pytest.raises(rlpt.Error, match="1 inactive rows"):
        core_gigpo.compute_step_discounted_returns(batch, 0.9)
