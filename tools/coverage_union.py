"""Branch coverage of ``impl/`` united over several fuzz runs' ``--coverage-json`` files.

CI runs the API fuzz's ci profile twice: without and with a remote tier (``--remote``, a
``redis-server`` it starts).  Each run's ``--coverage-json`` holds the lines and branch arcs
it executed; a line or arc counts as covered when some run executed it.  The figure is
coverage.py's own: (covered statements + covered arcs) / (statements + arcs), lines excluded
with a ``# pragma: no cover: <reason>`` left out.

    cd /tmp
    KVSTATE_PURE_PYTHON=1 python -m kvstate fuzz --target kvstate-api --profile ci \\
        --coverage --coverage-json plain.json
    KVSTATE_PURE_PYTHON=1 python -m kvstate fuzz --target kvstate-api --remote --profile ci \\
        --coverage --coverage-json remote.json
    python tools/coverage_union.py plain.json remote.json

prints one Markdown row per module (its figure in the first run alone, and united) and the total.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def _module(path: str) -> str:
    return path.rsplit("/impl/", 1)[-1]


def union(runs: list[dict[str, Any]]) -> list[tuple[str, int, int, int, int, float, float]]:
    """Per module: statements, missed, arcs, missed arcs, first run's cover, united cover."""
    rows = []
    first = runs[0]["files"]
    for path in sorted(first):
        f = first[path]
        excluded = set(f["excluded_lines"])
        statements = f["summary"]["num_statements"]
        arcs = {tuple(a) for a in f["executed_branches"] + f["missing_branches"]}
        lines: set[int] = set()
        taken: set[tuple[int, ...]] = set()
        for run in runs:
            g = run["files"].get(path)
            if g is None:
                continue
            lines |= set(g["executed_lines"]) - excluded
            taken |= {tuple(a) for a in g["executed_branches"]}
        covered, covered_arcs = len(lines), len(taken & arcs)
        alone = f["summary"]["covered_lines"] + f["summary"]["covered_branches"]
        total = statements + len(arcs)
        rows.append(
            (
                _module(path),
                statements,
                statements - covered,
                len(arcs),
                len(arcs) - covered_arcs,
                alone / total if total else 1.0,
                (covered + covered_arcs) / total if total else 1.0,
            )
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("json", nargs="+", type=Path, help="--coverage-json files, the first alone")
    args = ap.parse_args(argv)
    runs = [json.loads(p.read_text()) for p in args.json]
    rows = union(runs)
    print("| module | stmts | missed | branch arcs | missed arcs | first run | united |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    s = m = b = mb = 0
    for name, st, ms, br, mbr, alone, both in rows:
        print(f"| `{name}` | {st} | {ms} | {br} | {mbr} | {alone:.1%} | {both:.1%} |")
        s, m, b, mb = s + st, m + ms, b + br, mb + mbr
    first = runs[0]["totals"]
    alone = (first["covered_lines"] + first["covered_branches"]) / (
        first["num_statements"] + first["num_branches"]
    )
    print(
        f"| **total** | {s} | {m} | {b} | {mb} | {alone:.1%} | **{(s - m + b - mb) / (s + b):.1%}** |"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
