"""Run a table's obligations, in parallel across cores, and collect a report.

Obligations are independent, so they are farmed out to worker processes (``fork``: the table,
with its Python callables, is inherited rather than pickled).  Each worker builds fresh solvers.

No run goes silent or unbounded: a unit of work gets at most ``timeout_s`` seconds (its worker
is killed past them and its verdict is ``unknown``), the whole run at most ``budget_s`` (the
units left are ``unknown``, or ``not-run`` when never started), and an interruption
(``KeyboardInterrupt``: SIGINT, or SIGTERM as the command line maps it) stops the workers and
returns the report of what finished.  ``unknown`` is not a pass: ``Report.verdict`` is then
``undecided``.  The pool is Pebble's ``ProcessPool`` (a task timeout that kills the worker and
replaces it), not the standard library's, which cannot stop one task.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time
from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass, field
from typing import Any, Protocol

from kvstate.spec.table import Table

from .config import Config
from .obligations import Unit, plan, run_unit
from .results import Result

_TABLE: Table | None = None
_CFG: Config | None = None
_ONLY: str | None = None

# statuses that neither prove nor refute: the report is then undecided, not failed
UNDECIDED = ("unknown", "not-run")
KIND_ORDER = (
    "structure",
    "init",
    "enabled",
    "inductive",
    "action-safety",
    "local",
    "tight",
    "k-induction",
    "bmc",
    "completeness",
    "reach",
    "anti-vacuity",
)


class UsageError(ValueError):
    """A request :func:`prove` cannot run (a depth, budget or ``only`` that selects nothing)."""


@dataclass
class Report:
    table: str
    geometry: str
    results: list[Result]
    seconds: float
    jobs: int
    config: Config = field(default_factory=Config)
    stopped: str | None = None  # why the run stopped early: "budget", "interrupted"
    budget_s: float | None = None
    timeout_s: float | None = None

    @property
    def ok(self) -> bool:
        return self.stopped is None and all(r.ok for r in self.results)

    @property
    def failures(self) -> list[Result]:
        """Every obligation that does not hold (refuted or undecided)."""
        return [r for r in self.results if not r.ok]

    @property
    def refuted(self) -> list[Result]:
        return [r for r in self.results if not r.ok and r.status not in UNDECIDED]

    @property
    def undecided(self) -> list[Result]:
        return [r for r in self.results if not r.ok and r.status in UNDECIDED]

    @property
    def verdict(self) -> str:
        """``hold`` (all proved), ``fail`` (some refuted), ``undecided`` (neither)."""
        if self.refuted:
            return "fail"
        return "hold" if self.ok else "undecided"

    def by_kind(self, kind: str) -> list[Result]:
        return [r for r in self.results if r.kind == kind]

    def result(self, obligation: str) -> Result:
        for r in self.results:
            if r.obligation == obligation:
                return r
        raise KeyError(obligation)


class Listener(Protocol):
    """What a caller hears while a run goes on (the command line's progress output)."""

    def start(self, units: list[Unit]) -> None: ...

    def unit_done(self, unit: Unit, results: list[Result]) -> None: ...

    def tick(self, running: int, done: int, total: int) -> None: ...


def _worker_init() -> None:
    """A worker leaves interruptions to the parent: SIGINT (a terminal's Ctrl-C reaches the
    whole process group) is ignored, SIGTERM kills at once (the default; a Python handler
    inherited from the parent would wait for Z3 to return), and the parent stops the pool."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _work(unit: Unit) -> list[Result]:
    assert _TABLE is not None and _CFG is not None
    return run_unit(_TABLE, unit, _CFG, _ONLY)


def _undecided(unit: Unit, status: str, seconds: float, detail: str) -> Result:
    args = unit.args
    action = args[0] if unit.kind in ("inductive", "reach", "local", "enabled") and args else None
    return Result(
        unit.name, unit.kind, "-", "-", status, False, seconds, action=action, detail=detail
    )


def prove(
    table: Table,
    depth: int | None = None,
    *,
    only: str | None = None,
    jobs: int | None = None,
    config: Config | None = None,
    progress: Callable[[Result], None] | None = None,
    kinds: Iterable[str] | None = None,
    budget_s: float | None = None,
    timeout_s: float | None = None,
    listener: Listener | None = None,
) -> Report:
    """Check every obligation of ``table``; ``report.ok`` is True when all hold.

    ``budget_s``: seconds for the whole run; ``timeout_s``: seconds for one unit of work (an
    obligation, or an action's induction steps against every invariant).  Either way what is
    left gets the verdict ``unknown``."""
    global _TABLE, _CFG, _ONLY
    from pebble import ProcessExpired, ProcessPool

    cfg = config or Config()
    if depth is not None:
        if depth < 1:
            raise UsageError("depth must be >= 1")
        cfg = Config(**{**cfg.__dict__, "depth": depth})
    for what, v in (("budget", budget_s), ("timeout", timeout_s)):
        if v is not None and not v > 0:
            raise UsageError(f"{what} must be > 0 seconds")
    units = plan(table, cfg, only)
    if kinds is not None:
        wanted = set(kinds)
        units = [u for u in units if u.kind in wanted]
    if only and not units:
        raise UsageError(f"--only {only!r} matches no obligation, invariant or action")
    n_jobs = max(1, jobs if jobs is not None else (os.cpu_count() or 1))
    t0 = time.perf_counter()
    deadline = None if budget_s is None else t0 + budget_s
    results: list[Result] = []
    stopped: str | None = None
    # The one-query dead-action checks first (a verdict at once), then expensive units first, so
    # the pool stays busy at the end.
    order = {
        "enabled": -1,
        "anti-vacuity": 0,
        "completeness": 0,
        "reach": 1,
        "bmc": 2,
        "inductive": 3,
        "action-safety": 3,
        "k-induction": 4,
        "structure": 5,
        "init": 6,
    }
    units.sort(key=lambda u: order.get(u.kind, 9))
    if listener is not None:
        listener.start(units)
    _TABLE, _CFG, _ONLY = table, cfg, only
    futs: dict[Future[Any], Unit] = {}
    finished: set[Unit] = set()

    def record(unit: Unit, got: list[Result]) -> None:
        finished.add(unit)
        results.extend(got)
        if progress:
            for r in got:
                progress(r)
        if listener is not None:
            listener.unit_done(unit, got)

    pool = ProcessPool(
        max_workers=min(n_jobs, len(units)) or 1,
        initializer=_worker_init,
        context=mp.get_context("fork"),
    )
    running: set[Future[Any]] = set()
    try:
        futs = {pool.schedule(_work, args=(u,), timeout=timeout_s): u for u in units}
        pending: set[Future[Any]] = set(futs)
        while pending:
            left = None if deadline is None else deadline - time.perf_counter()
            if left is not None and left <= 0:
                stopped = "budget"
                break
            done, pending = wait(
                pending,
                timeout=1.0 if left is None else min(1.0, left),
                return_when=FIRST_COMPLETED,
            )
            for f in done:
                unit = futs[f]
                try:
                    record(unit, f.result())
                except TimeoutError:
                    record(unit, [_undecided(unit, "unknown", timeout_s or 0.0,
                        f"no verdict within the per-obligation timeout ({timeout_s:g} s): "
                        "raise --timeout to give it longer")])  # fmt: skip
                except ProcessExpired as exc:
                    record(unit, [_undecided(unit, "error", 0.0, f"its worker died: {exc}")])
            if listener is not None:
                listener.tick(sum(1 for f in pending if f.running()), len(finished), len(units))
    except KeyboardInterrupt:
        stopped = "interrupted"
    finally:
        running = {f for f in futs if f.running()}  # before the pool cancels them
        pool.stop()
        pool.join()
        _TABLE = _CFG = None
        _ONLY = None
    spent = time.perf_counter() - t0
    if stopped is not None:
        why = f"the --budget of {budget_s:g} s ran out" if stopped == "budget" else "interrupted"
        for f, unit in futs.items():
            if unit in finished:
                continue
            if f in running:
                results.append(_undecided(unit, "unknown", spent, f"not finished: {why}"))
            else:
                results.append(_undecided(unit, "not-run", 0.0, f"not started: {why}"))
    results.sort(
        key=lambda r: (KIND_ORDER.index(r.kind) if r.kind in KIND_ORDER else 99, r.obligation)
    )
    return Report(
        table.name,
        table.geometry.name,
        results,
        spent,
        n_jobs,
        cfg,
        stopped=stopped,
        budget_s=budget_s,
        timeout_s=timeout_s,
    )


def summary_counts(report: Report) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for r in report.results:
        d = out.setdefault(r.kind, {"total": 0, "ok": 0, "unbounded": 0, "undecided": 0})
        d["total"] += 1
        d["ok"] += int(r.ok)
        d["unbounded"] += int(r.unbounded)
        d["undecided"] += int(not r.ok and r.status in UNDECIDED)
    return out
