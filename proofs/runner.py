"""Run a table's obligations, in parallel across cores, and collect a report.

Obligations are independent, so they are farmed out to worker processes (``fork``: the table,
with its Python callables, is inherited rather than pickled).  Each worker builds fresh solvers.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from typing import Any

from kvstate.spec.table import Table

from .obligations import Config, Unit, plan, run_unit
from .results import Result

_TABLE: Table | None = None
_CFG: Config | None = None
_ONLY: str | None = None


@dataclass
class Report:
    table: str
    geometry: str
    results: list[Result]
    seconds: float
    jobs: int
    config: Config = field(default_factory=Config)

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.results)

    @property
    def failures(self) -> list[Result]:
        return [r for r in self.results if not r.ok]

    def by_kind(self, kind: str) -> list[Result]:
        return [r for r in self.results if r.kind == kind]

    def result(self, obligation: str) -> Result:
        for r in self.results:
            if r.obligation == obligation:
                return r
        raise KeyError(obligation)


def _work(unit: Unit) -> list[Result]:
    assert _TABLE is not None and _CFG is not None
    return run_unit(_TABLE, unit, _CFG, _ONLY)


def prove(
    table: Table,
    depth: int | None = None,
    *,
    only: str | None = None,
    jobs: int | None = None,
    config: Config | None = None,
    progress: Callable[[Result], None] | None = None,
    kinds: Iterable[str] | None = None,
) -> Report:
    """Check every obligation of ``table``; ``report.ok`` is True when all hold."""
    global _TABLE, _CFG, _ONLY
    cfg = config or Config()
    if depth is not None:
        if depth < 1:
            raise ValueError("depth must be >= 1")
        cfg = Config(**{**cfg.__dict__, "depth": depth})
    units = plan(table, cfg, only)
    if kinds is not None:
        wanted = set(kinds)
        units = [u for u in units if u.kind in wanted]
    if only and not units:
        raise ValueError(f"--only {only!r} matches no obligation, invariant or action")
    n_jobs = max(1, jobs if jobs is not None else (os.cpu_count() or 1))
    t0 = time.perf_counter()
    results: list[Result] = []
    _TABLE, _CFG, _ONLY = table, cfg, only
    # Expensive units first, so the pool stays busy at the end.
    order = {
        "anti-vacuity": 0,
        "completeness": 0,
        "action-safety": 3,
        "reach": 1,
        "bmc": 2,
        "inductive": 3,
        "k-induction": 4,
        "structure": 5,
        "init": 6,
    }
    units.sort(key=lambda u: order.get(u.kind, 9))
    try:
        if n_jobs == 1 or len(units) == 1:
            for u in units:
                for r in run_unit(table, u, cfg, only):
                    results.append(r)
                    if progress:
                        progress(r)
        else:
            ctx = mp.get_context("fork")
            with ProcessPoolExecutor(max_workers=n_jobs, mp_context=ctx) as ex:
                futs = [ex.submit(_work, u) for u in units]
                for f in as_completed(futs):
                    for r in f.result():
                        results.append(r)
                        if progress:
                            progress(r)
    finally:
        _TABLE = _CFG = None
        _ONLY = None
    kind_order = [
        "structure",
        "init",
        "inductive",
        "action-safety",
        "k-induction",
        "bmc",
        "completeness",
        "reach",
        "anti-vacuity",
    ]
    results.sort(
        key=lambda r: (kind_order.index(r.kind) if r.kind in kind_order else 99, r.obligation)
    )
    return Report(table.name, table.geometry.name, results, time.perf_counter() - t0, n_jobs, cfg)


def summary_counts(report: Report) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for r in report.results:
        d = out.setdefault(r.kind, {"total": 0, "ok": 0, "unbounded": 0})
        d["total"] += 1
        d["ok"] += int(r.ok)
        d["unbounded"] += int(r.unbounded)
    return out
