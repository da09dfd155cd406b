#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Plots an async_grpo run: reward/accuracy vs step and vs wall time for each mode, and the
staleness histogram of the trained groups. Usage: plot.py RUN.csv OUT.png (python3-matplotlib)."""
import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(path, out):
    runs = {}
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            runs.setdefault((r["mode"], int(r["eta"])), []).append(r)
    if not runs:
        sys.exit(f"plot.py: {path} has no rows")

    fig, ax = plt.subplots(2, 2, figsize=(13, 8.5))
    colors = {"sync": "tab:blue", "async": "tab:orange"}
    for (mode, eta), rows in runs.items():
        c = colors.get(mode, None)
        label = f"{mode} (η={eta})"
        step = [int(r["step"]) for r in rows]
        wall = [float(r["wall_s"]) for r in rows]
        reward = [float(r["gen_reward"]) for r in rows]
        acc = [float(r["gen_acc"]) for r in rows]
        ev = [(int(r["step"]), float(r["wall_s"]), float(r["heldout_acc"])) for r in rows if r["heldout_acc"]]
        for a, x, evx in ((ax[0][0], step, [e[0] for e in ev]), (ax[0][1], wall, [e[1] for e in ev])):
            a.plot(x, reward, color=c, alpha=0.35, lw=1, label=f"{label}: rollout reward")
            a.plot(x, acc, color=c, alpha=0.35, lw=1, ls=":", label=f"{label}: rollout accuracy")
            a.plot(evx, [e[2] for e in ev], color=c, lw=2.2, marker="o", ms=3, label=f"{label}: held-out accuracy (greedy)")

    ax[0][0].set_xlabel("training step (policy version)")
    ax[0][1].set_xlabel("wall time [s] (evaluation time excluded)")
    for a in ax[0]:
        a.set_ylim(0, 1.02)
        a.grid(alpha=0.3)
        a.legend(fontsize=7, loc="lower right")
    ax[0][0].set_title("reward / accuracy vs step")
    ax[0][1].set_title("reward / accuracy vs wall time")

    # Staleness histogram of trained groups (v - dispatch version), per mode.
    a = ax[1][0]
    width = 0.8 / max(1, len(runs))
    for k, ((mode, eta), rows) in enumerate(runs.items()):
        counts = [sum(int(r[f"stale_{s}"]) for r in rows) for s in ("0", "1", "2", "3plus")]
        total = max(1, sum(counts))
        a.bar([i + k * width for i in range(4)], [100.0 * n / total for n in counts], width,
              color=colors.get(mode), label=f"{mode} (η={eta})")
    a.set_xticks([i + 0.4 - width / 2 for i in range(4)], ["0", "1", "2", "≥3"])
    a.set_xlabel("staleness of trained groups (versions behind)")
    a.set_ylabel("% of trained groups")
    a.set_title("staleness histogram")
    a.legend(fontsize=8)
    a.grid(alpha=0.3, axis="y")

    # Step time split: training vs waiting for rollouts, and the weight sync.
    a = ax[1][1]
    for (mode, eta), rows in runs.items():
        c = colors.get(mode)
        step = [int(r["step"]) for r in rows]
        a.plot(step, [float(r["wait_ms"]) for r in rows], color=c, lw=1, label=f"{mode}: trainer waits for rollouts [ms]")
        a.plot(step, [float(r["train_ms"]) for r in rows], color=c, lw=1, ls="--", label=f"{mode}: train step [ms]")
        a.plot(step, [float(r["sync_ms"]) for r in rows], color=c, lw=1, ls=":", label=f"{mode}: weight sync [ms]")
    a.set_xlabel("training step")
    a.set_yscale("symlog", linthresh=1.0)
    a.set_title("where a step's time goes")
    a.legend(fontsize=7)
    a.grid(alpha=0.3)

    fig.suptitle("rlpt async GRPO (libtorch trainer + engine process): reverse a digit string")
    fig.tight_layout()
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: plot.py RUN.csv OUT.png")
    main(sys.argv[1], sys.argv[2])
