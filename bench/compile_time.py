#!/usr/bin/env python3
"""Compile cost of rlpt's public headers, against a TU of plain standard headers, in one run.

    python3 bench/compile_time.py [--cxx g++] [--rounds 3] [--json out.json] [--compiled-headers]

Each case is one translation unit compiled with `<cxx> -std=c++20 -O2 -c` (the flags users build
with); its cost is the compiler's CPU time (user + sys of the child), the median of `rounds`
rounds in which every case runs once, in turn, so that drift of the machine hits all cases alike.

Targets (issue 19):
- each header of a block, alone: at most 2x the baseline TU (<vector>, <span>, <string>);
- the umbrella <rlpt/rlpt.hpp>: at most 4 s;
- a TU that calls rlpt::evaluate (PPO clip + k3 KL, token-mean): at most 8 s.

Each header case also has a floor: a TU of the standard, fmt and Eigen headers that rlpt's own
headers include for it (read from the compiler's -H listing: each outside header an rlpt header
includes directly), alone, in the same rounds. No edit of rlpt's code takes a header below its
floor, so a header whose floor is already over 2x the baseline cannot meet that target; `own`
is the case's time over its floor, what rlpt's code adds.
"""
import argparse
import json
import os
import pathlib
import resource
import statistics
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
INCLUDE = ROOT / "include"
EIGEN = "/usr/include/eigen3"

BASELINE = "#include <vector>\n#include <span>\n#include <string>\nint main() {}\n"

EVALUATE = """#include <rlpt/objective.hpp>
#include <vector>
int main() {
  const rlpt::index_t B = 4, T = 16;
  std::vector<float> logp(B * T, -1.0f), old_logp(B * T, -1.1f), ref_logp(B * T, -1.05f), adv(B), grad(B * T);
  std::vector<rlpt::mask_t> mask(B * T, 1);
  rlpt::objective obj{.policy = rlpt::ppo_clip{.eps_low = 0.2, .eps_high = 0.28},
                      .kl = {.coef = 1e-3, .estimator = rlpt::kl_estimator::k3},
                      .agg = {.mode = rlpt::agg_mode::token_mean}};
  rlpt::objective_inputs in{.layout = rlpt::token_layout::padded(B, T), .mask = mask, .logp = logp,
                            .old_logp = old_logp, .ref_logp = ref_logp, .seq_adv = adv};
  return rlpt::evaluate(obj, in, {.logp = grad}).loss > 1e30f;
}
"""


def headers():
    """Every public host header that declares something (umbrellas that only include are skipped:
    their parts are measured; the top umbrella is its own case)."""
    out = []
    for p in sorted((INCLUDE / "rlpt").rglob("*.hpp")):
        rel = p.relative_to(INCLUDE).as_posix()
        if rel.startswith("rlpt/cuda/") or "/detail/" in rel:
            continue
        body = [l for l in p.read_text().splitlines()
                if l.strip() and not l.lstrip().startswith(("#include", "#pragma once", "//"))]
        if body:
            out.append(rel)
    return out


def floor_source(cxx, src, tmp):
    """The outside headers rlpt's headers include for the TU `src`, as a TU of their own."""
    f = pathlib.Path(tmp) / "listing.cpp"
    f.write_text(src)
    proc = subprocess.run([cxx, "-std=c++20", "-H", "-fsyntax-only", "-I", str(INCLUDE), "-I", EIGEN, str(f)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"listing failed for:\n{src}\n{proc.stderr[-4000:]}")
    parents, outside = {0: str(f)}, []
    for line in proc.stderr.splitlines():
        dots, _, path = line.partition(" ")
        if not dots or set(dots) != {"."} or not path.startswith("/"):
            continue
        depth = len(dots)
        parents[depth] = path
        parent = parents.get(depth - 1, "")
        ours = parent == str(f) or pathlib.Path(parent).resolve().is_relative_to(INCLUDE)
        if ours and not pathlib.Path(path).resolve().is_relative_to(INCLUDE) and path not in outside:
            outside.append(path)
    return "".join(f'#include "{p}"\n' for p in outside) + "int main() {}\n"


def cpu_seconds(cmd):
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run(cmd, capture_output=True, text=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        sys.exit(f"compile failed: {' '.join(cmd)}\n{proc.stderr[-4000:]}")
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cxx", default=os.environ.get("CXX", "g++"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json")
    ap.add_argument("--only", help="substring filter on case names")
    ap.add_argument("--compiled-headers", action="store_true",
                    help="every header also in separate-compilation mode (RLPT_COMPILED_LIB)")
    args = ap.parse_args()

    cases = {"baseline <vector> <span> <string>": BASELINE}
    for h in headers():
        cases[h] = f"#include <{h}>\nint main() {{}}\n"
    if args.compiled_headers:
        for h in headers():
            cases[f"{h}, RLPT_COMPILED_LIB"] = f"#define RLPT_COMPILED_LIB\n#include <{h}>\nint main() {{}}\n"
    cases["umbrella <rlpt/rlpt.hpp>"] = "#include <rlpt/rlpt.hpp>\nint main() {}\n"
    cases["umbrella <rlpt/rlpt.hpp>, RLPT_COMPILED_LIB"] = "#define RLPT_COMPILED_LIB\n#include <rlpt/rlpt.hpp>\nint main() {}\n"
    cases["TU calling rlpt::evaluate"] = EVALUATE
    cases["TU calling rlpt::evaluate, RLPT_COMPILED_LIB"] = "#define RLPT_COMPILED_LIB\n" + EVALUATE
    if args.only:
        cases = {k: v for k, v in cases.items() if k.startswith("baseline") or args.only in k}

    with tempfile.TemporaryDirectory() as tmp:
        files = {}
        for i, (name, src) in enumerate(cases.items()):
            f = pathlib.Path(tmp) / f"case{i}.cpp"
            f.write_text(src)
            files[name] = f
            if not name.startswith("baseline"):
                f = pathlib.Path(tmp) / f"floor{i}.cpp"
                f.write_text(floor_source(args.cxx, src, tmp))
                files["floor of " + name] = f
        times = {k: [] for k in files}
        for _ in range(args.rounds):
            for name, f in files.items():
                cmd = [args.cxx, "-std=c++20", "-O2", "-I", str(INCLUDE), "-I", EIGEN, "-c", str(f), "-o", os.devnull]
                times[name].append(cpu_seconds(cmd))

    load = os.getloadavg()
    base = statistics.median(times["baseline <vector> <span> <string>"])
    rows = []
    for name, ts in times.items():
        if name.startswith("floor of "):
            continue
        med = statistics.median(ts)
        floor = statistics.median(times["floor of " + name]) if "floor of " + name in times else None
        reach = None
        if name.startswith("umbrella"):
            target, ok = "<= 4 s", med <= 4.0
            reach = floor <= 4.0
        elif name.startswith("TU calling"):
            target, ok = "<= 8 s", med <= 8.0
            reach = floor <= 8.0
        elif name.startswith("baseline"):
            target, ok = "", None
        else:
            target, ok = "<= 2x baseline", med <= 2.0 * base
            reach = floor <= 2.0 * base
        rows.append({"case": name, "cpu_s": med, "spread": max(ts) - min(ts), "x_baseline": med / base,
                     "floor_s": floor, "own_s": None if floor is None else med - floor,
                     "target": target, "met": ok, "reachable": reach})
    print(f"compiler: {subprocess.run([args.cxx, '--version'], capture_output=True, text=True).stdout.splitlines()[0]}")
    print(f"flags: -std=c++20 -O2 -c; {args.rounds} interleaved rounds, median CPU seconds; load after {load[0]:.2f}")
    w = max(len(r["case"]) for r in rows)
    print(f"{'case':{w}}  {'cpu s':>6}  {'spread':>6}  {'x base':>6}  {'floor':>6}  {'own':>6}  target")
    for r in rows:
        met = "" if r["met"] is None else ("met" if r["met"] else "NOT met")
        if r["met"] is False and r["reachable"] is False:
            met += " (the floor alone is over it)"
        fl = "" if r["floor_s"] is None else f"{r['floor_s']:6.2f}  {r['own_s']:6.2f}"
        print(f"{r['case']:{w}}  {r['cpu_s']:6.2f}  {r['spread']:6.2f}  {r['x_baseline']:6.2f}  {fl:14}  "
              f"{r['target']} {met}")
    for mode in ("", "RLPT_COMPILED_LIB"):
        n_hdr = [r for r in rows
                 if r["target"] == "<= 2x baseline" and ("RLPT_COMPILED_LIB" in r["case"]) == bool(mode)]
        if n_hdr:
            print(f"headers{', ' + mode if mode else ''} within 2x baseline: {sum(r['met'] for r in n_hdr)} of "
                  f"{len(n_hdr)}; floor within 2x baseline: {sum(r['reachable'] for r in n_hdr)} of {len(n_hdr)}")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps({"load": load, "rows": rows}, indent=1))


main()
