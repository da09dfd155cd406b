# SPDX-License-Identifier: Apache-2.0
"""TRL's own trainer tests (tests/test_grpo_trainer.py, tests/test_rloo_trainer.py of a TRL
checkout) against rlpt.trl.GRPOTrainer and rlpt.trl.RLOOTrainer, offline.

The tests load tiny models and a dataset from the Hub; trl_offline_hub.py builds local stand-ins.
On them some tests fail whatever the trainer (a missing image dataset or model, a vocabulary they
assume), so each file runs twice, once as written (TRL's trainer) and once with
`from rlpt.trl import GRPOTrainer` (RLOOTrainer), and the suite fails only where a test that passes
with TRL's trainer does not pass with rlpt's.

    python trl_suite.py CHECKOUT WORKDIR [--trainer grpo|rloo] [--qwen-vocab] [pytest args]

--trainer: one file (default: both).

--qwen-vocab gives the stand-in models Qwen2.5's 151,665 tokens and special ids, which the two
mask_truncated_completions tests need, at about ten times the run time on a CPU (see
trl_offline_hub.py).
"""

import json
import os
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET

HERE = os.path.dirname(os.path.abspath(__file__))
FILES = ("__init__.py", "conftest.py", "testing_utils.py", "testing_constants.py")
# trainer: (its test file, the config class the test imports with it, the trainer class)
TRAINERS = {"grpo": ("test_grpo_trainer.py", "GRPOConfig", "GRPOTrainer"),
            "rloo": ("test_rloo_trainer.py", "RLOOConfig", "RLOOTrainer")}

# Appended to the rlpt side's conftest.py: which loss each of a test's steps took (rlpt's, or TRL's
# for a configuration rlpt.trl leaves to TRL), so a test that passes is known to have run rlpt's.
COUNT_LOSSES = """

# ---- added by rlpt's tools/peer_suites/trl_suite.py ----
import json as _json
import os as _os

import rlpt.trl as _rlpt_trl

_rlpt_used = {}
_rlpt_compute_loss = _rlpt_trl.TRAINER._compute_loss


def _rlpt_counting_compute_loss(self, model, inputs):
    out = _rlpt_compute_loss(self, model, inputs)
    test = _os.environ.get("PYTEST_CURRENT_TEST", "?").rsplit(" ", 1)[0].split("::", 1)[-1]
    kinds = _rlpt_used.setdefault(test, {})
    kinds[self.rlpt_loss_used] = kinds.get(self.rlpt_loss_used, 0) + 1
    return out


_rlpt_trl.TRAINER._compute_loss = _rlpt_counting_compute_loss


def pytest_sessionfinish(session, exitstatus):
    with open(_os.environ["RLPT_TRL_SUITE_LOSSES"], "w") as f:
        _json.dump(_rlpt_used, f, indent=1)
"""


def tolerate_missing_import_utils(path):
    """A checkout newer than the installed TRL may import helpers from trl.import_utils that the
    installed one lacks (is_joblib_available): those become `lambda: False`, so what they guard skips."""
    import trl.import_utils as iu

    s = open(path).read()
    m = re.search(r"from trl\.import_utils import \(([^)]*)\)\n", s)
    if not m:
        return
    names = [n.strip() for n in m.group(1).split(",") if n.strip()]
    have = [n for n in names if hasattr(iu, n)]
    missing = [n for n in names if not hasattr(iu, n)]
    block = "from trl.import_utils import (\n" + "".join(f"    {n},\n" for n in have) + ")\n"
    block += "".join(f"{n} = lambda: False  # not in the installed trl\n" for n in missing)
    open(path, "w").write(s[: m.start()] + block + s[m.end() :])


def side(checkout, work, name, trainer, rlpt):
    test, config, cls = TRAINERS[trainer]
    pkg = os.path.join(work, name, "tests")
    os.makedirs(pkg)
    for f in FILES + (test,):
        shutil.copy(os.path.join(checkout, "tests", f), pkg)
    tolerate_missing_import_utils(os.path.join(pkg, "testing_utils.py"))
    if rlpt:
        t = os.path.join(pkg, test)
        s = open(t).read()
        line = f"from trl import {config}, {cls}\n"
        if line not in s:
            sys.exit(f"{t}: no line '{line.strip()}' to replace (the test changed; update {__file__})")
        open(t, "w").write(s.replace(line, f"from trl import {config}\nfrom rlpt.trl import {cls}\n", 1))
        with open(os.path.join(pkg, "conftest.py"), "a") as f:
            f.write(COUNT_LOSSES.replace("TRAINER", cls))
    return os.path.join(pkg, test)


def run(test, hub, xml, extra, losses):
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_VERBOSITY="error")
    env["RLPT_TRL_SUITE_LOSSES"] = losses
    # the datasets cache keys a local folder by its name: a shared one would serve an earlier hub's rows
    env["HF_DATASETS_CACHE"] = os.path.join(hub, ".datasets-cache")
    env.setdefault("OMP_NUM_THREADS", "1")
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not slow", f"--junitxml={xml}"]
    subprocess.run(cmd + extra + [test], cwd=hub, env=env)
    out = {}
    for case in ET.parse(xml).getroot().iter("testcase"):
        key = case.get("classname", "").split(".")[-1] + "::" + case.get("name", "")
        kinds = {c.tag for c in case}
        out[key] = "failed" if kinds & {"failure", "error"} else "skipped" if "skipped" in kinds else "passed"
    return out


def compare(checkout, work, hub, trainer, extra):
    """Runs one trainer's test file on both sides; returns how many tests pass only with TRL's."""
    cls = TRAINERS[trainer][2]
    work = os.path.join(work, trainer)
    losses = os.path.join(work, "losses.json")
    theirs = run(side(checkout, work, "trl_side", trainer, False), hub, os.path.join(work, "trl.xml"), extra,
                 os.devnull)
    ours = run(side(checkout, work, "rlpt_side", trainer, True), hub, os.path.join(work, "rlpt.xml"), extra, losses)
    used = json.load(open(losses))
    worse = sorted(k for k, v in theirs.items() if v == "passed" and ours.get(k) != "passed")
    better = sorted(k for k, v in ours.items() if v == "passed" and theirs.get(k) != "passed")
    count = lambda d, s: sum(v == s for v in d.values())  # noqa: E731
    for label, d in ((f"TRL's {cls}", theirs), (f"rlpt.trl.{cls}", ours)):
        print(f"{label}: {count(d, 'passed')} passed, {count(d, 'failed')} failed, {count(d, 'skipped')} skipped")
    passed = [k for k, v in ours.items() if v == "passed"]
    by = lambda kind: [k for k in passed if used.get(k, {}).get(kind)]  # noqa: E731
    rl, tr = by("rlpt"), by("trl")
    print(f"of the {len(passed)} passing with rlpt's trainer, {len(rl)} train with rlpt's loss, "
          f"{len(tr)} with TRL's (a configuration rlpt.trl leaves to TRL)")
    for k in tr:
        print(f"  TRL's loss: {k} {used[k]}")
    for k in better:
        print(f"passes only with rlpt's trainer: {k}")
    for k in worse:
        print(f"FAILS with rlpt's trainer, passes with TRL's: {k}")
    print(f"{TRAINERS[trainer][0]}: {len(worse)} tests pass with TRL's trainer and not with rlpt's")
    return len(worse)


def main():
    checkout, work, extra = sys.argv[1], sys.argv[2], sys.argv[3:]
    qwen = ["--qwen-vocab"] if "--qwen-vocab" in extra else []
    extra = [a for a in extra if a != "--qwen-vocab"]
    trainers = list(TRAINERS)
    if "--trainer" in extra:
        i = extra.index("--trainer")
        trainers = [extra[i + 1]]
        del extra[i:i + 2]
        if trainers[0] not in TRAINERS:
            sys.exit(f"--trainer {trainers[0]}: expected one of {sorted(TRAINERS)}")
    hub = os.path.join(work, "hub")
    os.makedirs(hub)
    builder = [sys.executable, os.path.join(HERE, "trl_offline_hub.py"), hub] + qwen
    subprocess.run(builder, check=True, capture_output=True)
    worse = sum(compare(checkout, work, hub, t, extra) for t in trainers)
    sys.exit(1 if worse else 0)


if __name__ == "__main__":
    main()
