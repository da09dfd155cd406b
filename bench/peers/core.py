"""The engine of scripts/bench-peers: the machine, the load gate, the runners, the peer worker,
the timing protocol and the interleaved rounds. Blocks (bench/peers/blocks/*.py) only describe
their cases, their peers, their equality checks, their tables and their targets.

Timing protocol (the same on both sides; bench/support/peer_timing.hpp is the C++ half):
  - every side runs in its own process: rlpt in a fresh runner process per round, each peer in
    one long-lived Python worker (bench/peers/worker.py), one thread each (torch intra- and
    inter-op threads 1, OMP/MKL/OpenBLAS 1) unless a case says otherwise;
  - a round of a side is `warmup` untimed calls and then `calls` single timed calls; with
    `flush` every call is preceded by writing twice the last-level cache (cold calls);
  - the statistic is process CPU time per call: median and min..max over all timed calls of
    all rounds; rounds interleave the sides (rlpt, peer, ..., rlpt, peer, ...);
  - outputs are allocated inside every call on both sides (torch allocates the peer's);
  - before any time is taken, every side runs once with its outputs written to a directory and
    the block's check compares them (to stated tolerances); a case whose check fails reports no
    time.
"""
from __future__ import annotations

import dataclasses
import datetime
import importlib
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[2]
VENV = Path(os.environ.get("RLPT_VENV", ROOT / ".venv"))
PEERS_DIR = Path(__file__).resolve().parent
SINGLE_THREAD_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
                     "NUMEXPR_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


class CheckError(Exception):
    """rlpt and a peer computed different results."""


class SkipCase(Exception):
    """A case cannot run here (e.g. not enough memory); reported, not an error."""


# --- the machine --------------------------------------------------------------------------------

def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def simd() -> str:
    """The widest vector set rlpt's host kernels dispatch to on this CPU (their clones: AVX-512,
    AVX2 + FMA, or the baseline build)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                if {"avx512f", "avx512vl", "avx512bw", "avx512dq"} <= flags:
                    return "AVX-512"
                if {"avx2", "fma"} <= flags:
                    return "AVX2 + FMA, no AVX-512"
                return "no AVX2"
    except OSError:
        pass
    return "unknown"


def cores() -> int:
    return len(os.sched_getaffinity(0))


def llc_bytes() -> int:
    """Size of the largest cache level of cpu0 (sysfs), 32 MiB when unknown."""
    best = 0
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            text = (index / "size").read_text().strip()
        except OSError:
            continue
        unit = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        best = max(best, int(text.rstrip("KMG")) * unit)
    return best or 32 << 20


def flush_bytes() -> int:
    return 2 * llc_bytes()


def mem_total_gib() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) / (1 << 20)
    return 0.0


def mem_available_bytes() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


def git_commit() -> str:
    try:
        out = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short=12", "HEAD"], capture_output=True,
                             text=True, check=True).stdout.strip()
        # The harness's own outputs (results.json, docs/performance.md) do not change the code measured.
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no", "--", ".",
                                ":!bench/peers/results.json", ":!docs/performance.md"],
                               capture_output=True, text=True).stdout.strip()
        return out + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def peer_versions() -> dict[str, str | None]:
    sys.path.insert(0, str(ROOT / "tools" / "golden"))
    try:
        import peers  # tools/golden/peers.py
        return peers.versions()
    finally:
        sys.path.pop(0)


def machine() -> dict:
    return {"cpu": cpu_model(), "simd": simd(), "cores": cores(), "memory_gib": round(mem_total_gib(), 1),
            "kernel": platform.release(), "llc_bytes": llc_bytes(), "python": platform.python_version(),
            "commit": git_commit(), "peers": {k: v for k, v in peer_versions().items() if v}}


def in_venv() -> bool:
    return Path(sys.prefix).resolve() == VENV.resolve()


# --- the load gate ------------------------------------------------------------------------------

class LoadGate:
    """Results are only written from an idle machine: 1-minute load at most 1.3 on two cores,
    scaled with the core count. The harness's own process adds up to 1.0 while it runs; before
    each case the gate waits (up to `settle_s`) for the load to fall back under the limit, and a
    case that starts above it marks the run contended."""

    def __init__(self, limit_per_core: float = 0.65, settle_s: float = 90.0):
        self.limit = limit_per_core * cores()
        self.settle_s = settle_s
        self.samples: list[tuple[str, float]] = []
        self.contended: list[str] = []

    @staticmethod
    def load() -> float:
        return os.getloadavg()[0]

    def record(self, where: str) -> float:
        value = self.load()
        self.samples.append((where, value))
        return value

    def settle(self, where: str) -> float:
        start = time.monotonic()
        value = self.load()
        while value > self.limit and time.monotonic() - start < self.settle_s:
            time.sleep(2.0)
            value = self.load()
        self.samples.append((where, value))
        if value > self.limit:
            self.contended.append(f"load {value:.2f} > {self.limit:.2f} before {where}")
        return value


# --- series -------------------------------------------------------------------------------------

@dataclasses.dataclass
class Series:
    cpu: list[float] = dataclasses.field(default_factory=list)
    wall: list[float] = dataclasses.field(default_factory=list)
    extra: dict = dataclasses.field(default_factory=dict)

    def add(self, result: dict, prefix: str = "") -> None:
        self.cpu += result.get(prefix + "cpu_s", [])
        self.wall += result.get(prefix + "wall_s", [])

    @property
    def median(self) -> float | None:
        return statistics.median(self.cpu) if self.cpu else None

    def summary(self) -> dict:
        if not self.cpu:
            return {"n": 0}
        return {"n": len(self.cpu), "median": statistics.median(self.cpu), "min": min(self.cpu), "max": max(self.cpu),
                "wall_median": statistics.median(self.wall) if self.wall else None, **self.extra}


def run_json(cmd: list[str], env: dict | None = None, timeout: float | None = None) -> dict:
    """Runs a command and returns the JSON object on the last line of its stdout."""
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=env, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, cmd))} exited with {proc.returncode}:\n{proc.stderr[-4000:]}")
    lines = [l for l in proc.stdout.strip().splitlines() if l.strip()]
    if not lines:
        raise RuntimeError(f"{cmd[0]} printed nothing on stdout")
    return json.loads(lines[-1])


# --- the runners --------------------------------------------------------------------------------

class Runners:
    """rlpt's C++ runners in a CMake build tree; builds the missing ones unless told not to."""

    LOCATION = {"bench_advantage_runner": "bench/advantage", "bench_logprob_runner": "bench/logprob",
                "objective_runner": "bench/objective", "bench_rollout_peer": "bench/rollout",
                "bench_staleness_runner": "bench/staleness", "bench_sync_runner": "bench/sync",
                "bench_limits": "bench"}

    def __init__(self, build: Path, may_build: bool, jobs: int = 2):
        self.build = Path(build)
        self.may_build = may_build
        self.jobs = jobs

    def path(self, target: str) -> Path:
        return self.build / self.LOCATION[target] / target

    def ensure(self, targets: list[str]) -> list[str]:
        """Builds the targets that are missing (or all of them: ninja is a no-op when current);
        returns the ones that are still missing."""
        targets = sorted(set(targets))
        if self.may_build:
            if not (self.build / "CMakeCache.txt").exists():
                subprocess.run(["cmake", "--preset", "default", "-B", str(self.build), "-DRLPT_BUILD_BENCH=ON",
                                "-DRLPT_BUILD_TESTS=OFF", "-DRLPT_BUILD_EXAMPLES=OFF"], cwd=ROOT, check=True,
                               stdout=subprocess.DEVNULL)
            proc = subprocess.run(["cmake", "--build", str(self.build), "-j", str(self.jobs), "--target", *targets],
                                  cwd=ROOT, capture_output=True, text=True)
            if proc.returncode != 0:
                print(proc.stdout[-3000:] + proc.stderr[-3000:], file=sys.stderr)
        return [t for t in targets if not self.path(t).exists()]


# --- the peer worker ----------------------------------------------------------------------------

class PeerWorker:
    """A long-lived Python process that runs peer calls for the harness (bench/peers/worker.py)."""

    def __init__(self):
        env = dict(os.environ, **SINGLE_THREAD_ENV)
        self.proc = subprocess.Popen([sys.executable, str(PEERS_DIR / "worker.py")], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=env, bufsize=1)

    def request(self, **req) -> dict:
        assert self.proc.stdin and self.proc.stdout
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the peer worker died (exit {self.proc.wait()})")
        reply = json.loads(line)
        if "error" in reply:
            raise RuntimeError(f"peer {req.get('peer')}: {reply['error']}")
        return reply

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.request(op="exit")
            except (RuntimeError, BrokenPipeError, OSError):
                pass
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()


# --- cases --------------------------------------------------------------------------------------

@dataclasses.dataclass
class Side:
    """One side of a comparison: rlpt's runner, a peer function, or a hardware limit."""
    label: str                  # column name: "rlpt", "verl", "torch", "copy", ...
    runner: str | None = None   # C++ target (rlpt and limits)
    args: list = dataclasses.field(default_factory=list)
    peer: str | None = None     # name of a peer in the block module (bench/peers/worker.py runs it)
    params: dict = dataclasses.field(default_factory=dict)
    role: str = "rlpt"          # rlpt | peer | limit
    check: bool = True          # takes part in the equality check


@dataclasses.dataclass
class Case:
    key: str
    labels: dict                # the parameters shown in the table
    sides: list[Side]
    prepare: Callable[[Path], None] | None = None
    check: Callable[[Path, dict], dict] | None = None  # (input dir, {label: output dir}) -> metrics
    flush: bool = True          # cold calls
    warmup: int = 1
    min_memory: int = 0         # bytes this case needs available
    rounds: int | None = None   # override of the context's rounds
    calls: int | None = None    # override of the calls per round
    timed: bool = True          # False: the check run's outputs are the result (no timing rounds)
    processes: int = 1          # busy processes while a side runs (the transports: 2)


@dataclasses.dataclass
class Context:
    block: str
    runners: Runners
    quick: bool
    check_only: bool
    rounds: int = 5
    round_seconds: float = 0.4
    max_calls: int = 20
    verbose: bool = True
    tmp: Path = dataclasses.field(default_factory=lambda: Path(tempfile.gettempdir()))
    gate: LoadGate | None = None
    worker: PeerWorker | None = None

    def log(self, *args) -> None:
        if self.verbose:
            print(*args, flush=True)


def side_call(ctx: Context, case: Case, side: Side, inputs: Path, warmup: int, calls: int, flush: int,
              out: Path | None) -> dict:
    if side.peer is not None:
        assert ctx.worker is not None
        return ctx.worker.request(op="time", block=ctx.block, peer=side.peer, params=side.params, dir=str(inputs),
                                  warmup=warmup, calls=calls, flush=flush, out=str(out) if out else "")
    cmd = [ctx.runners.path(side.runner), *[str(a).replace("{dir}", str(inputs)) for a in side.args],
           "--warmup", warmup, "--calls", calls, "--flush", flush]
    if out is not None:
        cmd += ["--out", out]
    return run_json(cmd)


def run_case(ctx: Context, case: Case) -> dict:
    """Prepares the inputs, checks equality, then (unless check-only) times interleaved rounds."""
    result: dict[str, Any] = {"key": case.key, "labels": case.labels}
    if case.min_memory and mem_available_bytes() < case.min_memory:
        result["skipped"] = f"needs {case.min_memory / 2**30:.1f} GiB available, {mem_available_bytes() / 2**30:.1f} here"
        ctx.log(f"  {case.key}: skipped ({result['skipped']})")
        return result
    work = Path(tempfile.mkdtemp(prefix=f"rlpt-peers-{ctx.block}-", dir=ctx.tmp))
    try:
        inputs = work / "in"
        inputs.mkdir()
        if case.prepare:
            case.prepare(inputs)
        flush = flush_bytes() if case.flush else 0
        check_flush = 0 if ctx.check_only else flush  # nothing is timed in a check-only run
        # 1. one call per side with its outputs written, then the equality check.
        outs, first = {}, {}
        for side in case.sides:
            if ctx.check_only and not side.check and case.check is not None:
                continue  # limits and diagnostics have nothing to compare
            out = work / f"out-{side.label}"
            out.mkdir()
            r = side_call(ctx, case, side, inputs, 0, 1, check_flush, out if side.check else None)
            outs[side.label] = out
            first[side.label] = r
        result["first_call"] = {k: (v.get("cpu_s") or [None])[0] for k, v in first.items()}
        result["info"] = {k: {kk: vv for kk, vv in v.items() if not kk.endswith("_s")} for k, v in first.items()}
        if case.check:
            try:
                result["check"] = case.check(inputs, {"outs": outs, "runs": first})
            except CheckError as e:
                result["check_failed"] = str(e)
                ctx.log(f"  {case.key}: CHECK FAILED: {e}")
                return result
        if case.check:
            ctx.log(f"  {case.key}: equal" + (f" ({fmt_check(result['check'])})" if result.get("check") else ""))
        else:
            ctx.log(f"  {case.key}: ran (nothing to compare)")
        if ctx.check_only or not case.timed:
            return result
        # 2. interleaved rounds, the same number and kind of calls on every side.
        if ctx.gate:
            result["load_before"] = ctx.gate.settle(case.key)
        slow = max((v for v in result["first_call"].values() if v), default=1e-3)
        calls = case.calls or max(1, min(ctx.max_calls, round(ctx.round_seconds / max(slow, 1e-9))))
        rounds = case.rounds or (3 if slow * calls > 5.0 else ctx.rounds)
        series = {s.label: Series() for s in case.sides}
        for _ in range(rounds):
            for side in case.sides:
                r = side_call(ctx, case, side, inputs, case.warmup, calls, flush, None)
                series[side.label].add(r)
                for k, v in r.items():  # scalar side outputs (e.g. bytes moved), kept from the last round
                    if not k.endswith("_s") and isinstance(v, (int, float, str, bool)):
                        series[side.label].extra[k] = v
        if ctx.gate:
            result["load_after"] = ctx.gate.record(case.key + " (after)")
            if result["load_after"] > ctx.gate.limit + case.processes:  # more than this case's own processes
                ctx.gate.contended.append(f"load {result['load_after']:.2f} after {case.key} (limit "
                                          f"{ctx.gate.limit:.2f} + its own {case.processes} process(es))")
        result["rounds"], result["calls_per_round"], result["flush_bytes"] = rounds, calls, flush
        result["sides"] = {k: v.summary() for k, v in series.items()}
        result["roles"] = {s.label: s.role for s in case.sides}
        med = {k: v.median for k, v in series.items()}
        ctx.log(f"  {case.key}: " + ", ".join(f"{k} {fmt_s(v)}" for k, v in med.items())
                + "".join(f", {k}/rlpt {med[k] / med['rlpt']:.3g}x" for k in med
                          if k != "rlpt" and med.get("rlpt") and med[k] and result["roles"][k] == "peer"))
        return result
    finally:
        shutil.rmtree(work, ignore_errors=True)


def fmt_s(v: float | None) -> str:
    if v is None:
        return "-"
    if v >= 1:
        return f"{v:.3g} s"
    if v >= 1e-3:
        return f"{v * 1e3:.3g} ms"
    return f"{v * 1e6:.3g} µs"


def fmt_check(check: dict) -> str:
    return ", ".join(f"{k} {v:.1e}" if isinstance(v, float) else f"{k} {v}" for k, v in check.items())


def ratio(result: dict, peer: str, base: str = "rlpt") -> float | None:
    """peer median / rlpt median: > 1 means rlpt is faster."""
    sides = result.get("sides") or {}
    p, b = sides.get(peer, {}).get("median"), sides.get(base, {}).get("median")
    return p / b if p and b else None


def spread(result: dict, label: str) -> str:
    s = (result.get("sides") or {}).get(label) or {}
    if not s.get("n"):
        return "-"
    return f"{fmt_s(s['median'])} ({fmt_s(s['min'])}..{fmt_s(s['max'])})"


def load_block(name: str):
    if str(PEERS_DIR) not in sys.path:
        sys.path.insert(0, str(PEERS_DIR))
    return importlib.import_module(f"blocks.{name}")


def now_utc() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
