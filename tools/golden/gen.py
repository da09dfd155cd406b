"""Generate golden test vectors by calling the peer frameworks' own functions.

    .venv/bin/python tools/golden/gen.py [family ...] [--seed N]

A family is a module tools/golden/gen_<family>.py exposing `generate(out_dir: pathlib.Path, seed: int)`;
it writes its files into tests/data/golden/<family>/. With no family given, all are run.
"""
import argparse
import importlib
import sys
from pathlib import Path

import rlpt_golden

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
OUT = ROOT / "tests" / "data" / "golden"


def families() -> list[str]:
    return sorted(path.stem.removeprefix("gen_") for path in HERE.glob("gen_*.py"))


def snapshot(directory: Path) -> dict[Path, tuple[int, int]]:
    return {path: (path.stat().st_mtime_ns, path.stat().st_size) for path in directory.glob("*.bin")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("families", nargs="*", metavar="family", help=f"default: all of {families()}")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    unknown = sorted(set(args.families) - set(families()))
    if unknown:
        sys.exit(f"unknown families {unknown}; available: {families()}")
    for family in args.families or families():
        out_dir = OUT / family
        out_dir.mkdir(parents=True, exist_ok=True)
        before = snapshot(out_dir)
        importlib.import_module(f"gen_{family}").generate(out_dir, args.seed)
        for path, stat in sorted(snapshot(out_dir).items()):
            if before.get(path) != stat:
                arrays, _ = rlpt_golden.read(path)
                shapes = ", ".join(f"{name}:{a.dtype.name}{list(a.shape)}" for name, a in arrays.items())
                print(f"wrote {path.relative_to(ROOT)} ({stat[1]} bytes): {shapes}")


if __name__ == "__main__":
    main()
