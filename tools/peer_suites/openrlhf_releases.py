# SPDX-License-Identifier: Apache-2.0
"""rlpt.openrlhf.PolicyLoss against the PolicyLoss of other OpenRLHF releases than the installed one.

    ~/.cache/rlpt/venv/bin/python tools/peer_suites/openrlhf_releases.py 0.11.0 0.11.1 0.11.2

Each release's wheel is downloaded from PyPI (pip download --no-deps, into a temporary folder) and
its openrlhf/models/{utils,loss}.py loaded by path; rlpt follows the release through
RLPT_OPENRLHF_VERSION. Every combination of correction type (the release's own spelling), policy
loss type, dual clip, token-level loss and batch normaliser, on three seeds, must give the same
number of return values, the loss and gradient to float32 tolerance and the same metrics.
"""
import importlib.util
import itertools
import os
import pathlib
import subprocess
import sys
import tempfile
import types
import zipfile

import torch

import rlpt.openrlhf as ro

RTOL = 2e-5


def load_release(version, work):
    subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", f"openrlhf=={version}",
                    "-d", str(work)], check=True)
    wheel = next(work.glob(f"openrlhf-{version}-*.whl"))
    root = work / version
    zipfile.ZipFile(wheel).extractall(root)
    models = next(root.glob("**/openrlhf/models"))
    pkg = f"_openrlhf_{version.replace('.', '_')}"
    sys.modules[pkg] = types.ModuleType(pkg)
    sys.modules[pkg].__path__ = [str(models)]
    for name in ("utils", "loss"):
        spec = importlib.util.spec_from_file_location(f"{pkg}.{name}", models / f"{name}.py")
        sys.modules[f"{pkg}.{name}"] = module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return sys.modules[f"{pkg}.loss"].PolicyLoss


def corrections(cls):
    """The rollout corrections of the release's constructor, in its own spelling."""
    import inspect

    params = inspect.signature(cls.__init__).parameters
    if "is_correction_level" in params:
        band = [{"is_correction_level": level, "is_correction_mode": mode, "is_correction_threshold": (0.8, 1.25)}
                for level, mode in (("token", "clip"), ("token", "mask"), ("seq", "mask"))]
        divergence = [{"is_correction_level": level, "is_correction_gating": gating,
                       "is_correction_threshold": (0.0, bound)}
                      for level, gating, bound in (("token", "binary_kl", 0.01), ("seq", "tv", 0.1))]
        return [{}] + band + divergence
    return [{}] + [{"enable_vllm_is_correction": True, "vllm_is_truncated_threshold": [0.8, 1.25],
                    "vllm_is_correction_type": kind} for kind in ("tis", "icepop", "seq-mask-tis")]


def inputs(seed, B=10, T=8):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    lengths[2] = 1
    mask = (torch.arange(T)[None, :] < lengths[:, None]).float()
    lp = torch.rand(B, T, generator=g) * -3
    old = lp + 0.3 * torch.randn(B, T, generator=g)
    rollout = old + 0.2 * torch.randn(B, T, generator=g)
    return lp, old, rollout, torch.randn(B, T, generator=g) * mask, mask


def rel(a, b):
    return float((a - b).abs().max() / b.abs().max().clamp(min=1e-9))


def compare(version, cls):
    os.environ["RLPT_OPENRLHF_VERSION"] = version
    cases, worst = 0, 0.0
    batches = [{}, {"dp_size": 2, "batch_num_tokens": 97.0, "global_batch_size": 23.0}]
    for seed, corr, ptype, dual, token_level, batch in itertools.product(
            range(3), corrections(cls), ["ppo", "gspo"], [None, 3.0], [True, False], batches):
        lp, old, rollout, adv, mask = inputs(seed)
        kw = dict(corr, policy_loss_type=ptype, dual_clip=dual, token_level_loss=token_level)
        outs = []
        for c in (ro.PolicyLoss, cls):
            x = lp.clone().requires_grad_()
            o = c(**kw)(x, old, adv, mask, rollout_log_probs=rollout, **batch)
            outs.append((o, torch.autograd.grad(o[0], x)[0]))
        (a, ga), (b, gb) = outs
        where = f"OpenRLHF {version}, {kw}, {batch}, seed {seed}"
        assert len(a) == len(b), f"{where}: rlpt returns {len(a)} values, OpenRLHF {len(b)}"
        errs = [rel(a[0].detach(), b[0].detach()), rel(ga, gb), rel(a[2], b[2])]
        if ptype == "ppo":
            errs.append(float((a[1] - b[1]).abs()))
        for i in range(3, len(b)):
            assert (a[i] is None) == (b[i] is None), f"{where}: return value {i} is None on one side only"
            if b[i] is not None:
                errs.append(rel(a[i], b[i]))
        assert max(errs) <= RTOL, f"{where}: differences {errs}"
        worst, cases = max(worst, *errs), cases + 1
    print(f"OpenRLHF {version}: {cases} cases equal (largest relative difference {worst:.2g})")


def main():
    versions = sys.argv[1:] or ["0.11.0", "0.11.1", "0.11.2"]
    with tempfile.TemporaryDirectory() as d:
        for v in versions:
            compare(v, load_release(v, pathlib.Path(d)))


if __name__ == "__main__":
    main()
