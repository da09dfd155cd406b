"""scripts/bench-peers: every side-by-side comparison of rlpt with its peers, one harness.

    scripts/bench-peers [--only BLOCK,...] [--build DIR] [--quick] [--check-only] [--force] ...

Blocks: advantage, objective, logprob, rollout, staleness, sync (bench/peers/blocks/*.py).
The protocol is in bench/peers/core.py; bench/peers/README.md describes every comparison.

Results are written only from an idle machine (1-minute load <= 0.65 x cores, i.e. 1.3 on two
cores, before every case): bench/peers/results.json (machine-readable, merged per block) and
the generated results section of each block in docs/performance.md. --force runs on a busy
machine and prints the tables but writes nothing. --check-only runs the equality checks alone
(no timing, nothing written); with --quick on small inputs, in seconds (the `peers` ctest).
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import core  # noqa: E402
import docgen  # noqa: E402

BLOCKS = [b for b in ("advantage", "objective", "logprob", "rollout", "staleness", "sync")
          if (core.PEERS_DIR / "blocks" / f"{b}.py").exists()]
SKIP = 77


def parse(argv):
    p = argparse.ArgumentParser(prog="scripts/bench-peers", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", default=",".join(BLOCKS), help=f"comma-separated blocks (default: all of {BLOCKS})")
    p.add_argument("--build", default=str(core.ROOT / "build" / "peers"), help="CMake build tree holding the runners")
    p.add_argument("--no-build", action="store_true", help="do not build missing runners (skip their blocks)")
    p.add_argument("--jobs", type=int, default=2, help="parallel jobs when building runners")
    p.add_argument("--quick", action="store_true", help="small inputs (for --check-only: seconds)")
    p.add_argument("--check-only", action="store_true", help="equality checks only: no timing, nothing written")
    p.add_argument("--force", action="store_true", help="time on a busy machine: print, never write")
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds per side (3 for calls over 5 s)")
    p.add_argument("--round-seconds", type=float, default=0.4, help="CPU seconds a side's round aims at")
    p.add_argument("--json", default=str(core.PEERS_DIR / "results.json"), help="machine-readable results")
    p.add_argument("--docs", default=str(core.ROOT / "docs" / "performance.md"), help="page whose results it regenerates")
    p.add_argument("--render", action="store_true", help="only regenerate --docs from --json (no measurement)")
    p.add_argument("--dump", metavar="PATH", help="also write this run's JSON to PATH, whatever the load (never the docs)")
    p.add_argument("--quiet", action="store_true")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse(argv if argv is not None else sys.argv[1:])
    blocks = [b.strip() for b in args.only.split(",") if b.strip()]
    unknown = [b for b in blocks if b not in BLOCKS]
    if unknown:
        print(f"unknown block(s) {unknown}; known: {BLOCKS}", file=sys.stderr)
        return 2
    if args.render:
        results = json.loads(Path(args.json).read_text())
        rerendered = rereport(results, blocks)
        if rerendered:  # the stored cases, read again by the blocks' current report()
            Path(args.json).write_text(json.dumps(results, indent=1, sort_keys=False) + "\n")
        changed = docgen.update(Path(args.docs), results, blocks)
        print(f"regenerated {', '.join(changed) or 'nothing'} in {args.docs} from {args.json}"
              + (f" (tables and targets of {', '.join(rerendered)} recomputed from their cases)" if rerendered else ""))
        return 0
    if not core.in_venv():
        print(f"bench-peers needs the peers' venv {core.VENV} (tools/golden/setup-venv); skipped", file=sys.stderr)
        return SKIP
    command = "scripts/bench-peers " + " ".join(shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:]))
    machine = core.machine()
    gate = core.LoadGate(settle_s=0.0 if args.force else 90.0)  # --force: record the load, do not wait for it
    timing = not args.check_only
    print(f"# scripts/bench-peers: {machine['cpu']}, {machine['cores']} cores, {machine['memory_gib']} GiB; "
          f"commit {machine['commit']}; " + ", ".join(f"{k} {v}" for k, v in machine["peers"].items()), flush=True)
    if timing:
        first = gate.settle("start")
        print(f"# load {first:.2f} (limit {gate.limit:.2f} = 0.65 x {machine['cores']} cores)", flush=True)
        if gate.contended and not args.force:
            print(f"declined: the machine is busy ({gate.contended[0]}); figures from a contended run are not "
                  f"recorded. Run on an idle machine, or with --force to print (never write) them.", file=sys.stderr)
            return 3
    runners = core.Runners(Path(args.build), may_build=not args.no_build, jobs=args.jobs)
    modules = {b: core.load_block(b) for b in blocks}
    missing = runners.ensure([r for m in modules.values() for r in m.RUNNERS])
    results, failed, skipped = {}, [], []
    worker = core.PeerWorker()  # one peer process for the whole run: torch, verl and TRL import once
    try:
        for name in blocks:
            block = run_block(args, name, modules[name], missing, runners, gate, timing, machine, command, worker,
                              failed)
            if block is None:
                skipped.append(name)
            else:
                results[name] = block
    finally:
        worker.close()
    if failed:
        print("\nFAILED: " + "; ".join(failed), file=sys.stderr)
    if args.dump:
        Path(args.dump).write_text(json.dumps({"schema": 1, "contended": gate.contended, "force": args.force,
                                               "blocks": results}, indent=1) + "\n")
        print(f"\nthis run's JSON: {args.dump} (not a record)")
    if not timing:
        print("\ncheck-only: nothing written" + (f"; skipped blocks: {', '.join(skipped)}" if skipped else ""))
        return 1 if failed else (SKIP if skipped else 0)
    if args.force or gate.contended or failed or args.quick:
        why = ("--force" if args.force else "the machine was busy: " + "; ".join(gate.contended) if gate.contended
               else "--quick inputs are not the documented ones" if args.quick else "a case failed")
        print(f"\nnot written ({why})")
        return 1 if failed else 0
    write(Path(args.json), Path(args.docs), results)
    return 0


def rereport(results: dict, blocks: list[str]) -> list[str]:
    """Recomputes the tables and targets of each recorded block from its stored cases with the
    block's current report(): a fix to how a figure is derived (not measured) re-renders without
    measuring again. Returns the blocks recomputed."""
    done = []
    for name in blocks:
        block = (results.get("blocks") or {}).get(name)
        if not block or not block.get("cases") or block.get("check_only"):
            continue
        module = core.load_block(name)
        ctx = core.Context(block=name, runners=None, quick=bool(block.get("quick")), check_only=False, verbose=False)
        block.update(module.report(ctx, block["cases"]))
        done.append(name)
    return done


def run_block(args, name, module, missing, runners, gate, timing, machine, command, worker, failed) -> dict | None:
    lacking = [r for r in module.RUNNERS if r in missing]
    if lacking:
        print(f"\n## {module.TITLE}: skipped, runner(s) not built: {', '.join(lacking)} (in {args.build})", flush=True)
        return None
    print(f"\n## {module.TITLE}", flush=True)
    ctx = core.Context(block=name, runners=runners, quick=args.quick, check_only=args.check_only, rounds=args.rounds,
                       round_seconds=args.round_seconds, verbose=not args.quiet, gate=gate if timing else None,
                       worker=worker)
    tmp = getattr(module, "TMP", None)
    if tmp and os.path.isdir(tmp):
        ctx.tmp = Path(tmp)  # e.g. sync: /dev/shm, so memory (not a disk) is the limit
    started, load_before = core.now_utc(), core.LoadGate.load()
    case_results = []
    for case in module.cases(ctx):
        try:
            r = core.run_case(ctx, case)
        except Exception as e:  # noqa: BLE001 - a broken case is reported, the others run
            r = {"key": case.key, "labels": case.labels, "error": f"{type(e).__name__}: {e}"}
            print(f"  {case.key}: ERROR {e}", flush=True)
            if not args.quiet:
                traceback.print_exc()
            if worker.proc.poll() is not None:
                worker.proc = core.PeerWorker().proc  # the worker died (e.g. out of memory): a fresh one
        case_results.append(r)
        if "check_failed" in r or "error" in r:
            failed.append(f"{name}: {r['key']}")
    block = {"title": module.TITLE, "command": module.COMMAND, "run_command": command, "started": started,
             "finished": core.now_utc(), "machine": machine, "load_before": load_before,
             "load_after": core.LoadGate.load(), "quick": args.quick, "check_only": args.check_only,
             "cases": case_results}
    if timing:
        try:
            block.update(module.report(ctx, case_results))
        except Exception as e:  # noqa: BLE001
            print(f"  report failed: {e}", flush=True)
            traceback.print_exc()
            failed.append(f"{name}: report")
        for table in block.get("tables", []):
            print("\n" + docgen.table_markdown(table))
        for t in block.get("targets", []):
            print(f"- target: {t['text']}: {docgen.met_text(t['met'])} ({t.get('detail', '')})")
    return block


def write(json_path: Path, docs: Path, results: dict) -> None:
    merged = {"schema": 1, "blocks": {}}
    if json_path.exists():
        try:
            merged = json.loads(json_path.read_text())
        except json.JSONDecodeError:
            pass
    for block in results.values():
        block["recorded"] = True  # an idle, complete, non-quick run: docgen renders only these
    merged.setdefault("blocks", {}).update(results)
    json_path.write_text(json.dumps(merged, indent=1, sort_keys=False) + "\n")
    changed = docgen.update(docs, merged, list(results))
    print(f"\nwrote {json_path} and the results of {', '.join(changed)} in {docs}")


if __name__ == "__main__":
    sys.exit(main())
