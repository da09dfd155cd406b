"""Core statistics: masked mean and variance of float64 values, computed by torch (reference for Welford)."""
from pathlib import Path

import numpy as np
import torch

import peers
import rlpt_golden

N = 1000
KEEP = 0.7  # probability that an element is inside the mask


def generate(out_dir: Path, seed: int) -> None:
    rng = np.random.default_rng(seed)
    x = rng.normal(loc=100.0, scale=3.0, size=N)  # large mean relative to spread: naive sum-of-squares loses digits
    mask = rng.random(N) < KEEP
    selected = torch.from_numpy(x)[torch.from_numpy(mask)]
    rlpt_golden.write(out_dir / "welford.bin", {
        "x": x,
        "mask": mask,
        "count": np.array(mask.sum(), dtype=np.int64),
        "mean": torch.mean(selected),
        "var_unbiased": torch.var(selected, unbiased=True),
        "var_biased": torch.var(selected, unbiased=False),
    }, peers.meta("core", seed, n=N, keep=KEEP, loc=100.0, scale=3.0,
                  reference="torch.mean / torch.var(unbiased=True|False) over x[mask]"))
