"""Regenerates the results of each block in docs/performance.md from scripts/bench-peers' JSON.

Each block's results live between two markers in the page:

    <!-- bench-peers:advantage:begin -->
    ... generated: command, machine, tables, targets (issue 21) met or not ...
    <!-- bench-peers:advantage:end -->

Everything outside the markers is left as written. `scripts/bench-peers --render` redoes the
page from bench/peers/results.json without measuring.
"""
from __future__ import annotations

import re
from pathlib import Path


def begin(block: str) -> str:
    return f"<!-- bench-peers:{block}:begin -->"


def end(block: str) -> str:
    return f"<!-- bench-peers:{block}:end -->"


def met_text(met) -> str:
    return "**met**" if met is True else "**not met**" if met is False else "not measured"


def cell(v) -> str:
    s = "-" if v is None else str(v)
    return s.replace("|", "\\|").replace("\n", " ")


def table_markdown(table: dict) -> str:
    lines = []
    if table.get("title"):
        lines.append(f"**{table['title']}**\n")
    cols = table["columns"]
    lines.append("| " + " | ".join(cell(c) for c in cols) + " |")
    lines.append("|" + "|".join("---" for _ in cols) + "|")
    for row in table["rows"]:
        lines.append("| " + " | ".join(cell(v) for v in row) + " |")
    if table.get("notes"):
        lines.append("\n" + table["notes"])
    return "\n".join(lines)


def block_markdown(block: dict) -> str:
    m = block["machine"]
    peers = ", ".join(f"{k} {v}" for k, v in m.get("peers", {}).items() if k in ("torch", "verl", "trl", "safetensors",
                                                                                  "numpy", "openrlhf"))
    simd = f" ({m['simd']})" if m.get("simd") else ""  # runs before the field existed have none
    out = [
        f"Command: `{block['command']}` (this run: `{block['run_command']}`, {block['started']} to {block['finished']}, "
        f"commit {m['commit']}).",
        "",
        f"Machine: {m['cpu']}{simd}, {m['cores']} cores, {m['memory_gib']} GiB, Linux {m['kernel']}; 1-minute load "
        f"{block['load_before']:.2f} before, {block['load_after']:.2f} after; {peers}.",
        "",
        "Protocol: each side in its own process, one thread, rounds interleaved (rlpt, peer, rlpt, peer, ...); "
        "process CPU time per call, median (min..max) over every timed call of every round; outputs allocated "
        "inside every call on both sides; both sides' results checked equal before any time is taken. "
        "Ratios read peer / rlpt: > 1 means rlpt is faster.",
    ]
    failed = [c for c in block.get("cases", []) if "check_failed" in c or "error" in c]
    skipped = [c for c in block.get("cases", []) if "skipped" in c]
    for table in block.get("tables", []):
        out += ["", table_markdown(table)]
    if block.get("notes"):
        out += ["", block["notes"]]
    if failed:
        out += ["", "Not reported (check failed or error): " + "; ".join(
            f"{c['key']}: {c.get('check_failed') or c.get('error')}" for c in failed)]
    if skipped:
        out += ["", "Skipped: " + "; ".join(f"{c['key']}: {c['skipped']}" for c in skipped)]
    if block.get("targets"):
        out += ["", "Targets (issue 21):", ""]
        for t in block["targets"]:
            out.append(f"- {t['text']}: {met_text(t['met'])}" + (f" ({t['detail']})" if t.get("detail") else ""))
    return "\n".join(out)


def update(docs: Path, results: dict, blocks: list[str], allow_unrecorded: bool = False) -> list[str]:
    """Replaces the marked region of every block in `blocks` that has recorded results (written
    by an idle, complete run; --dump output is not) and returns them."""
    text = docs.read_text()
    changed = []
    for name in blocks:
        block = results.get("blocks", {}).get(name)
        if block is None or block.get("check_only") or not (block.get("recorded") or allow_unrecorded):
            continue
        pattern = re.compile(re.escape(begin(name)) + r".*?" + re.escape(end(name)), re.S)
        if not pattern.search(text):
            raise SystemExit(f"{docs}: no {begin(name)} ... {end(name)} region for block {name}")
        body = f"{begin(name)}\n{block_markdown(block)}\n{end(name)}"
        text = pattern.sub(lambda _: body, text, count=1)
        changed.append(name)
    docs.write_text(text)
    return changed
