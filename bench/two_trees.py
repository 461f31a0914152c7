"""Two checkouts' side-by-side benches in one run: each tree's own ``vs_vllm.py`` (or
``vs_sglang.py``), alternating, so that a commit is compared with another under the same load.

A side-by-side bench already pairs kvstate with an engine inside one process; comparing two
commits of kvstate needs their two builds, each in its own checkout and interpreter.  This runs
``TREE/bench/SCRIPT ARGS`` with each tree's interpreter (``TREE/.venv/bin/python`` unless given
as ``--tree DIR=PYTHON``), ``--repeats`` times, the order rotating between repeats, and reads
off each run's tables: the ratio table (kvstate's cycles/s over the engine's, the median over
the run's rounds) and kvstate's own hit and miss cycle times.  Printed: min / median / max over
repeats, per tree and prefix length, and per repeat the ratio of the two trees' figures (the
second tree over the first; runs next to each other saw about the same load).

    .venv/bin/python bench/two_trees.py --tree /tmp/old --tree . --repeats 3 -- \\
        vs_vllm.py --lengths 1K 16K --layouts equal --rounds 3
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROW = re.compile(r"^\s*(\d+[KM]?)\s+\|(.*)$")
FLOAT = re.compile(r"[\d.]+")
HITMISS = re.compile(r"^\s*(\d+[KM]?)\s+kvstate\s+([\d.]+)\s+([\d.]+)\s")


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def _mmm(xs: list[float], digits: int = 2) -> str:
    return "/".join(f"{x:.{digits}f}" for x in (min(xs), statistics.median(xs), max(xs)))


def parse(out: str) -> dict[str, float]:
    """``{"1K vs NAME": median ratio, "1K hit us": ..., "1K miss us": ...}`` of one run."""
    got: dict[str, float] = {}
    lines = out.splitlines()
    names: list[str] = []
    for i, line in enumerate(lines):
        if line.startswith("kvstate's cycles/s over"):
            names = [c.strip() for c in lines[i + 1].split("|")[1:]]
        m = ROW.match(line)
        if m and names and "FAILED" not in line:
            for name, cell in zip(names, m.group(2).split("|"), strict=False):
                num = FLOAT.search(cell)
                if num:
                    got[f"{m.group(1)} {name}"] = float(num.group())
        h = HITMISS.match(line)
        if h:
            got[f"{h.group(1)} kvstate hit us"] = float(h.group(2))
            got[f"{h.group(1)} kvstate miss us"] = float(h.group(3))
    return got


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tree", action="append", required=True, help="DIR or DIR=PYTHON (twice)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("script", help="the bench under each tree's bench/, e.g. vs_vllm.py")
    ap.add_argument("args", nargs=argparse.REMAINDER, help="its arguments (after --)")
    a = ap.parse_args()
    if len(a.tree) != 2 or a.repeats < 1:
        ap.error("give --tree twice and --repeats >= 1")
    trees = []
    for t in a.tree:
        d, _, py = t.partition("=")
        root = Path(d).resolve()
        trees.append((root, py or str(root / ".venv" / "bin" / "python")))
    args = [x for x in a.args if x != "--"]
    print(f"machine load (1/5/15 min): {_load()}, {os.cpu_count()} CPUs")
    for i, (root, py) in enumerate(trees):
        head = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip()
        print(f"  [{i}] {root} ({head or 'not a git checkout'}), {py}")
    print(f"  each run: bench/{a.script} {' '.join(args)}")
    runs: list[list[dict[str, float]]] = [[], []]
    with tempfile.TemporaryDirectory() as cwd:
        for rep in range(a.repeats):
            for i in [0, 1] if rep % 2 == 0 else [1, 0]:
                root, py = trees[i]
                load = _load()
                proc = subprocess.run(
                    [py, "-P", str(root / "bench" / a.script), *args],
                    capture_output=True,
                    text=True,
                    cwd=cwd,
                    stdin=subprocess.DEVNULL,
                    check=False,
                )
                got = parse(proc.stdout)
                if proc.returncode != 0 or not got:
                    print(proc.stdout[-3000:] + proc.stderr[-3000:])
                    raise SystemExit(f"[{i}] run {rep + 1} failed (rc {proc.returncode})")
                print(f"  repeat {rep + 1} [{i}] load {load}: {got}", flush=True)
                runs[i].append(got)
    keys = [k for k in runs[0][0] if all(k in r for side in runs for r in side)]
    print(f"\nmin/median/max over {a.repeats} repeats; last column: [1] over [0] per repeat")
    print(f"{'figure':>40} {'[0]':>22} {'[1]':>22} {'[1]/[0]':>18}")
    for k in keys:
        xs = [r[k] for r in runs[0]]
        ys = [r[k] for r in runs[1]]
        print(
            f"{k:>40} {_mmm(xs):>22} {_mmm(ys):>22} "
            f"{_mmm([y / x for x, y in zip(xs, ys, strict=True)]):>18}"
        )
    print(f"\nmachine load at the end: {_load()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
