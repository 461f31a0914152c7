"""The side-by-side benches' shared part: kvstate's side, the trace, the rounds, the report.

``bench/vs_vllm.py`` and ``bench/vs_sglang.py`` time the same trace (``bench/impl_bench.py``'s
families: one miss that stores a prefix, four full-prefix hits) through kvstate's request path
and through another engine's cache; each supplies only that engine's side (an object with
``name``, ``family(side | None)`` and ``close()``).  Here: the kvstate side, the prompts, the
paired rounds (each round runs every side's families back to back, the order rotating, so that a
round's ratio compares sides under the same machine load) and the two tables printed.

Importing it takes the repository root off ``sys.path``: the engines import a top-level package
named ``kernels`` (the Hugging Face kernels hub) that the project's own ``kernels/`` folder would
shadow; kvstate itself is imported through its installed package mapping, not the root.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:] = [
    p for p in sys.path if Path(p or os.getcwd()).resolve() != ROOT and p not in ("", ".")
]
sys.path.insert(0, str(HERE))

import impl_bench as B  # noqa: E402
import numpy as np  # noqa: E402

# what a cycle is timed with: this thread's CPU time (default: on a shared machine a process
# descheduled mid-cycle accrues no CPU time, where wall time counts the other jobs too) or wall
CLOCK = {"cpu": time.thread_time, "wall": time.perf_counter}


@dataclass
class Side:
    """Accumulated time of one side over one round."""

    cycles: int = 0
    cycle_s: float = 0.0
    request_s: float = 0.0
    hit_s: float = 0.0
    hits: int = 0
    miss_s: float = 0.0
    misses: int = 0

    def add(self, req_s: float, cyc_s: float, miss: bool) -> None:
        self.cycles += 1
        self.cycle_s += cyc_s
        self.request_s += req_s
        if miss:
            self.misses += 1
            self.miss_s += cyc_s
        else:
            self.hits += 1
            self.hit_s += cyc_s


class Tokens:
    """The impl_bench trace's prompts: a per-family prefix (unique first token) + suffixes."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.base = (np.arange(n, dtype=np.int64) * 7919 + 13) % 50_000
        self.family = 0
        self.serial = 0
        self.prefix = self.base

    def next(self, r: int) -> np.ndarray:
        if r == 0:
            self.prefix = self.base.copy()
            self.prefix[0] = 100_000 + self.family
            self.family += 1
        self.serial += 1
        suffix = 1_000_000 + self.serial * B.SUFFIX + np.arange(B.SUFFIX, dtype=np.int64)
        return np.concatenate([self.prefix, suffix])


class KVSide:
    name = "kvstate"

    def __init__(self, n: int, args: argparse.Namespace) -> None:
        row = B.Row(n, blocks=n // 256)
        self.cache = B.make_cache(n, row, "auto", args.memory_gib)
        self.trace = B.Trace(self.cache, n, row)  # its checks: hit lengths, stored blocks
        self.trace.clock = CLOCK[args.clock]

    def family(self, side: Side | None) -> None:
        t = self.trace
        row = t.row
        before = (row.cycles, row.total_s, row.request_s, row.hit_s, row.miss_s)
        t.run_family(timed=side is not None)
        if side is not None:
            c, tot, req, hit, miss = (
                a - b
                for a, b in zip(
                    (row.cycles, row.total_s, row.request_s, row.hit_s, row.miss_s),
                    before,
                    strict=True,
                )
            )
            side.cycles += int(c)
            side.cycle_s += tot
            side.request_s += req
            side.hit_s += hit
            side.miss_s += miss
            side.hits += B.FAMILY - 1
            side.misses += 1

    def close(self) -> None:
        self.cache.close()


@dataclass
class Result:
    length: int
    rounds: list[dict[str, Side]] = field(default_factory=list)
    error: str | None = None


def ratio(a: Side, b: Side, what: str) -> float:
    """kvstate's speed over the other's: b's time per item over a's."""
    if what == "cycle":
        return (b.cycle_s / b.cycles) / (a.cycle_s / a.cycles)
    if what == "request+cycle":
        return ((b.cycle_s + b.request_s) / b.cycles) / ((a.cycle_s + a.request_s) / a.cycles)
    if what == "hit":
        return (b.hit_s / b.hits) / (a.hit_s / a.hits)
    return (b.miss_s / b.misses) / (a.miss_s / a.misses)


def mmm(xs: list[float]) -> str:
    return f"{statistics.median(xs):.2f} ({min(xs):.2f}-{max(xs):.2f})"


def run_length(n: int, make_sides: Callable[[int], list[Any]], args: argparse.Namespace) -> Result:
    """One prefix length ``n``: kvstate's side and ``make_sides(n)``'s, warmed up, then
    ``args.rounds`` paired rounds of ``args.families`` families each (0: 256 / blocks, >= 4);
    ``args.gc`` false pauses the collector while a side's families run.  An error ends the
    row (reported), not the run."""
    res = Result(n)
    sides: list[Any] = []
    try:
        sides.append(KVSide(n, args))
        sides += make_sides(n)
        fams = args.families or max(4, 256 // (n // 256))
        for s in sides:  # warm-up: records, pools and free queues in steady state
            for _ in range(args.warmup):
                s.family(None)
        for rnd in range(args.rounds):
            acc = {s.name: Side() for s in sides}
            k = rnd % len(sides)
            for s in sides[k:] + sides[:k]:  # rotate who goes first
                gc.collect()
                if not getattr(args, "gc", True):  # (--no-gc) paused while the families run
                    gc.disable()
                try:
                    for _ in range(fams):
                        s.family(acc[s.name])
                finally:
                    gc.enable()
            res.rounds.append(acc)
    except Exception as exc:  # noqa: BLE001 - report the row, go on with the next
        res.error = f"{type(exc).__name__}: {exc}".splitlines()[0][:200]
    finally:
        for s in sides:
            s.close()
        gc.collect()
    return res


def report(results: list[Result], names: list[str], engine: str) -> None:
    """The ratio table (cycle, and request + cycle) and the hit/miss table, per length."""
    print()
    print(f"kvstate's cycles/s over {engine}'s, paired per round: median (min-max) over rounds")
    hdr = f"{'prefix':>7} | " + " | ".join(f"{'vs ' + n:>26}" for n in names)
    hdr += " | " + " | ".join(f"{'incl. request, vs ' + n:>32}" for n in names)
    print(hdr)
    print("-" * len(hdr))
    for r in results:
        if r.error is not None:
            print(f"{B.fmt_length(r.length):>7} | FAILED: {r.error}")
            continue
        cells = [mmm([ratio(rd["kvstate"], rd[n], "cycle") for rd in r.rounds]) for n in names]
        cells2 = [
            mmm([ratio(rd["kvstate"], rd[n], "request+cycle") for rd in r.rounds]) for n in names
        ]
        print(
            f"{B.fmt_length(r.length):>7} | "
            + " | ".join(f"{c:>26}" for c in cells)
            + " | "
            + " | ".join(f"{c:>32}" for c in cells2)
        )
    print()
    print("hit and miss cycles alone (median over rounds of the ratio); times: median us per cycle")
    hdr = f"{'prefix':>7} {'side':>13} {'hit us':>9} {'miss us':>9} {'req() us':>9} {'hit x':>7} {'miss x':>7}"
    print(hdr)
    print("-" * len(hdr))
    for r in results:
        if r.error is not None:
            continue
        for n in ["kvstate", *names]:
            med = statistics.median
            hit = med([1e6 * rd[n].hit_s / rd[n].hits for rd in r.rounds])
            miss = med([1e6 * rd[n].miss_s / rd[n].misses for rd in r.rounds])
            req = med([1e6 * rd[n].request_s / rd[n].cycles for rd in r.rounds])
            hx = mx = ""
            if n != "kvstate":
                hx = f"{med([ratio(rd['kvstate'], rd[n], 'hit') for rd in r.rounds]):.2f}"
                mx = f"{med([ratio(rd['kvstate'], rd[n], 'miss') for rd in r.rounds]):.2f}"
            print(
                f"{B.fmt_length(r.length):>7} {n:>13} {hit:>9.1f} {miss:>9.1f} {req:>9.1f} "
                f"{hx:>7} {mx:>7}"
            )
