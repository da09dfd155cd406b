"""The peer side of scripts/bench-peers: one long-lived process, one thread, that runs peer
calls on request (one JSON line in, one JSON line out) with the same protocol as rlpt's runners
(bench/support/peer_timing.hpp): untimed warm-up calls, then single timed calls, each preceded
by the same cache flush, process CPU time per call, results released after the clock is read.

A request names a block module (bench/peers/blocks/<block>.py), a peer in it and its
parameters; the block's make_peer(name, params, dir) loads the inputs from `dir` and returns a
Peer. Loaded peers are cached until a different one is asked for.
"""
from __future__ import annotations

import importlib
import json
import os
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

for _name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_name, "1")

_scratch = None
_flush_value = 0


def flush_caches(nbytes: int) -> None:
    """Writes nbytes of a scratch buffer (as flush_caches in peer_timing.hpp)."""
    global _scratch, _flush_value
    if nbytes <= 0:
        return
    import numpy as np
    if _scratch is None or _scratch.size < nbytes:
        _scratch = np.empty(nbytes, dtype=np.uint8)
    _flush_value = (_flush_value + 1) & 0xFF
    _scratch[:nbytes].fill(_flush_value)


def time_calls(fn, warmup: int, calls: int, flush: int) -> tuple[list[float], list[float]]:
    for _ in range(warmup):
        flush_caches(flush)
        r = fn()
        del r
    cpu, wall = [], []
    for _ in range(calls):
        flush_caches(flush)
        w0 = time.perf_counter()
        c0 = time.process_time()  # clock_gettime(CLOCK_PROCESS_CPUTIME_ID), as the runners
        r = fn()
        c1 = time.process_time()
        w1 = time.perf_counter()
        del r  # the outputs are released after the clock is read, as in the runners
        cpu.append(c1 - c0)
        wall.append(w1 - w0)
    return cpu, wall


class Peer:
    """What a block's make_peer returns: `call()` runs one peer call and returns its outputs;
    `save(outputs, out_dir)` writes them for the equality check; `info` is reported as is."""

    def __init__(self, call, save=None, info=None):
        self.call = call
        self.save = save
        self.info = info or {}


def _single_thread() -> None:
    try:
        import torch
        torch.set_num_threads(1)
        try:
            torch.set_num_interop_threads(1)
        except RuntimeError:
            pass  # already set (only allowed once, before any parallel work)
    except ImportError:
        pass


def main() -> None:
    _single_thread()
    cached_key, cached = None, None
    for line in sys.stdin:
        req = json.loads(line)
        if req.get("op") == "exit":
            print(json.dumps({"ok": True}), flush=True)
            return
        try:
            key = json.dumps([req["block"], req["peer"], req["params"], req["dir"]], sort_keys=True)
            if key != cached_key:
                cached_key, cached = None, None  # release the previous peer's inputs first
                module = importlib.import_module(f"blocks.{req['block']}")
                cached = module.make_peer(req["peer"], req["params"], Path(req["dir"]))
                cached_key = key
            peer = cached
            reply = dict(peer.info)
            cpu, wall = time_calls(peer.call, int(req["warmup"]), int(req["calls"]), int(req["flush"]))
            reply.update(cpu_s=cpu, wall_s=wall)
            if req.get("out"):
                if peer.save is None:
                    raise RuntimeError("this peer has no outputs to check")
                with open("/proc/self/clear_refs", "w") as f:
                    f.write("5")  # peak resident bytes of this call: VmHWM after the reset - VmRSS before
                base = _status("VmRSS:")
                outputs = peer.call()
                reply["peak_extra_bytes"] = _status("VmHWM:") - base
                extra = peer.save(outputs, Path(req["out"]))
                del outputs
                if extra:
                    reply.update(extra)
            print(json.dumps(reply), flush=True)
        except Exception as e:  # noqa: BLE001 - reported to the harness, which stops the case
            print(json.dumps({"error": f"{type(e).__name__}: {e}\n{traceback.format_exc()[-3000:]}"}), flush=True)


def _status(field: str) -> int:
    for line in open("/proc/self/status"):
        if line.startswith(field):
            return int(line.split()[1]) * 1024
    return 0


if __name__ == "__main__":
    main()
