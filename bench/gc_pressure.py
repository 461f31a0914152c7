"""Garbage-collector runs caused by the request path: collections per generation and the time
spent in them, over ``impl_bench``'s trace (families of one miss and four full-prefix hits).

A cycle that leaves reference cycles behind (objects only the collector can free) brings the
next collection closer; in a server each collection also scans whatever else is young then.
The counts are repeatable where timings are not, so this is the figure to compare between
builds: run it with each build's interpreter, one after the other.

    .venv/bin/python bench/gc_pressure.py [--length 1K] [--families 2000] [--repeats 3]
"""

from __future__ import annotations

import os

os.environ.setdefault("KVSTATE_KERNEL_BACKEND", "torch")

import argparse  # noqa: E402
import gc  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import impl_bench as B  # noqa: E402

from kvstate.impl import native_modules  # noqa: E402


def measure(length: int, families: int) -> dict[str, float]:
    """Collections and seconds in the collector per generation over ``families`` families,
    after a warm-up; requests are built and ticked as in the bench (all of it counts)."""
    row = B.Row(length, blocks=length // 256)
    cache = B.make_cache(length, row, "auto", 4.0)
    try:
        trace = B.Trace(cache, length, row)
        for _ in range(100):
            trace.run_family(timed=False)
        gc.collect()
        counts = [0, 0, 0]
        secs = [0.0, 0.0, 0.0]
        started = [0.0]

        def cb(phase: str, info: dict[str, Any]) -> None:
            if phase == "start":
                started[0] = time.perf_counter()
            else:
                g = info["generation"]
                counts[g] += 1
                secs[g] += time.perf_counter() - started[0]

        gc.callbacks.append(cb)
        try:
            for _ in range(families):
                trace.run_family(timed=False)
        finally:
            gc.callbacks.remove(cb)
        cycles = families * B.FAMILY
        return {
            **{f"gen{g}": counts[g] for g in range(3)},
            "us_per_cycle": 1e6 * sum(secs) / cycles,
            "cycles": cycles,
        }
    finally:
        cache.close()
        gc.collect()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--length", default="1K")
    ap.add_argument("--families", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    n = B.parse_length(args.length)
    print(
        f"machine load (1/5/15 min): {' '.join(f'{x:.2f}' for x in os.getloadavg())}; "
        f"request path: {', '.join(native_modules()) or 'pure Python'}"
    )
    runs = [measure(n, args.families) for _ in range(args.repeats)]
    print(
        f"{args.length} prefix, {runs[0]['cycles']:.0f} cycles per run, {args.repeats} runs "
        "(min/median/max):"
    )
    for key in ("gen0", "gen1", "gen2", "us_per_cycle"):
        xs = [r[key] for r in runs]
        print(f"  {key:>13}: {min(xs):8.2f} {statistics.median(xs):8.2f} {max(xs):8.2f}")


if __name__ == "__main__":
    main()
