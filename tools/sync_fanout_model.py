#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Bandwidth model of one weight update reaching N inference hosts (issue 20): how long the
slowest host waits, direct fan-out from the trainer against rlpt's forwarders (sync/forward.hpp)
in a chain and in trees, store-and-forward and cut-through (frames passed on as they arrive,
the forwarder's default; what checkpoint engines do). A model, not a measurement: every host
has one link of B bits/s each way, the trainer one uplink of B, transfers run at line rate,
handshakes and per-bucket latency are ignored except where a bucket size is named. Prints a markdown table.

    python3 tools/sync_fanout_model.py [--bucket-mib 512]
"""
import argparse


def tree_levels(k, hosts):
    """Levels of a tree in which the trainer feeds k hosts, each of those k more, ...: L levels
    hold k + k^2 + ... + k^L hosts."""
    levels = 1
    while k * (k**levels - 1) // (k - 1) < hosts:
        levels += 1
    return levels


def times(size_bytes, hosts, gbps, bucket_bytes):
    link = gbps * 1e9 / 8  # bytes per second
    one = size_bytes / link  # one copy over one link
    out = {
        # The trainer's uplink carries N copies.
        "direct": hosts * one,
        # Each host stores the whole version, then sends it on: N hops of one copy.
        "chain (store-and-forward)": hosts * one,
    }
    for k in (2, 4, 8):
        # Each level costs k copies over one uplink, in turn.
        out[f"tree k={k} (store-and-forward)"] = tree_levels(k, hosts) * k * one
    bucket = bucket_bytes / link
    # Cut-through: buckets flow down as they arrive; the last host finishes one bucket-time per
    # hop after the first copy has streamed through.
    out["chain (cut-through)"] = one + (hosts - 1) * bucket
    # A cut-through tree: an inner host's uplink streams k copies at once (k times one copy), and
    # each level adds the k bucket-times a bucket needs to leave it.
    for k in (2, 4):
        out[f"tree k={k} (cut-through)"] = k * one + tree_levels(k, hosts) * k * bucket
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bucket-mib", type=float, default=512)
    a = ap.parse_args()
    models = {"8B": 8e9, "70B": 70e9, "235B": 235e9}
    rows = []
    for gbps in (50, 400):
        for name, params in models.items():
            size = params * 2  # bf16
            for hosts in (8, 64, 512):
                t = times(size, hosts, gbps, a.bucket_mib * 2**20)
                rows.append((gbps, name, hosts, t))
    keys = list(rows[0][3].keys())
    print("| link | model (bf16) | hosts | " + " | ".join(keys) + " |")
    print("|---|---|---|" + "---|" * len(keys))
    for gbps, name, hosts, t in rows:
        print(f"| {gbps} Gb/s | {name} | {hosts} | " + " | ".join(f"{t[k]:,.1f} s" for k in keys) + " |")


if __name__ == "__main__":
    main()
