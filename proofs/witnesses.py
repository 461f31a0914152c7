"""Witness traces: search, certificate checking, and a cache of known witnesses.

A witness (an action firing, an invariant breaking once a guard is dropped) is a certificate:
checking one is cheap, finding one by bounded model checking at depth 10+ is not.  So found
witnesses are kept in ``witnesses.json`` beside this module (like Hypothesis' example database),
and every run re-checks each cached one twice -- by replay in the concrete interpreter and by
asserting its exact steps in the Z3 unrolling -- before counting it.  A cached witness that no
longer checks (the table changed) is discarded and searched for again.  ``kvstate prove
--update-witnesses`` writes newly found ones back.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import z3

from kvstate.spec.table import ParamKind, Table

from .engine import Unrolling, bmc_find, replay, unroll
from .results import Step, Trace

CACHE_PATH = Path(__file__).with_name("witnesses.json")
_lock = threading.Lock()


@dataclass(frozen=True)
class Shape:
    """The small model a witness lives in: requests, pool size, and whether caps are scaled."""

    requests: int
    pool: int
    scaled_caps: bool

    def table(self, base: Table) -> Table:
        changes: dict[str, Any] = {"model_requests": self.requests}
        if self.scaled_caps:
            changes.update(io_cap=1, pin_cap_blocks=1)
        g = base.geometry.with_changes(**changes)
        return base if g == base.geometry else base.with_geometry(g)

    def describe(self) -> str:
        s = f"N={self.pool}, R={self.requests}"
        return s + (", caps scaled to 1" if self.scaled_caps else "")


def shapes(base: Table, scale_caps: bool) -> list[Shape]:
    out = [Shape(1, 1, scale_caps), Shape(1, 2, scale_caps)]
    if base.consts.R > 1:
        out.append(Shape(base.consts.R, 2, scale_caps))
    return out


def confirm_symbolically(
    table: Table, n: int, steps: list[Step], goal: Callable[[Unrolling], Any]
) -> bool:
    """The exact steps, asserted in the Z3 unrolling, satisfy the guards and reach the goal."""
    u = unroll(table, len(steps), n)
    solver = z3.Solver()
    solver.set(timeout=20000)
    solver.add(*u.constraints)
    for t, st in enumerate(steps):
        idx = [
            i
            for i, inst in enumerate(u.insts)
            if inst.action.name == st.action
            and (inst.r is None or inst.r == st.params.get(_req_param(inst)))
        ]
        if not idx:
            return False
        solver.add(u.sels[t] == idx[0])
        for q in u.insts[idx[0]].action.params:
            if q.kind is not ParamKind.REQ:
                solver.add(u.params[t].values[q.kind] == st.params[q.name])
    solver.add(goal(u))
    return solver.check() == z3.sat


def _req_param(inst: Any) -> str:
    return next(q.name for q in inst.action.params if q.kind is ParamKind.REQ)


def search(
    base: Table,
    goal_for: Callable[[Table], Callable[[Unrolling], Any]],
    check: Callable[[Trace], bool],
    *,
    max_depth: int,
    scale_caps: bool,
    timeout_ms: int,
    depths: tuple[int, ...] = (3, 6, 9, 12, 15),
) -> tuple[Trace, Shape] | None:
    """BMC with stuttering at a few growing depths, on small shapes first."""
    for shape in shapes(base, scale_caps):
        t = shape.table(base)
        for d in [d for d in depths if d <= max_depth] or [max_depth]:
            res, trace = bmc_find(t, d, shape.pool, goal_for(t), timeout_ms)
            if res == "sat" and trace is not None and check(trace):
                return trace, shape
            if res == "unknown":
                break
    return None


# ---- cache ---------------------------------------------------------------------------------
def _load() -> dict[str, Any]:
    try:
        with CACHE_PATH.open(encoding="utf-8") as fh:
            data = json.load(fh)
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def cached(table_name: str, obligation: str) -> tuple[list[Step], Shape] | None:
    entry = _load().get(table_name, {}).get(obligation)
    if not entry:
        return None
    try:
        steps = [
            Step(s["action"], {k: int(v) for k, v in s["params"].items()}) for s in entry["steps"]
        ]
        shape = Shape(int(entry["requests"]), int(entry["pool"]), bool(entry["scaled_caps"]))
    except (KeyError, TypeError, ValueError):
        return None
    return steps, shape


def store(table_name: str, obligation: str, trace: Trace, shape: Shape) -> None:
    """Record a witness (only when the caller asked to update the cache)."""
    with _lock:
        data = _load()
        data.setdefault(table_name, {})[obligation] = {
            "requests": shape.requests,
            "pool": shape.pool,
            "scaled_caps": shape.scaled_caps,
            "steps": [{"action": s.action, "params": s.params} for s in trace.steps],
        }
        tmp = CACHE_PATH.with_suffix(".json.tmp")
        with tmp.open("w", encoding="utf-8") as fh:
            json.dump(data, fh, indent=1, sort_keys=True)
            fh.write("\n")
        os.replace(tmp, CACHE_PATH)


def witness(
    base: Table,
    obligation: str,
    goal_for: Callable[[Table], Callable[[Unrolling], Any]],
    check: Callable[[Trace], bool],
    *,
    max_depth: int,
    scale_caps: bool,
    timeout_ms: int,
    update: bool,
) -> tuple[Trace, Shape, str] | None:
    """A checked witness: from the cache if it still checks, else by search."""
    hit = cached(base.name, obligation)
    if hit is not None:
        steps, shape = hit
        t = shape.table(base)
        trace = replay(t, shape.pool, steps)
        if (
            trace.replayed
            and check(trace)
            and confirm_symbolically(t, shape.pool, steps, goal_for(t))
        ):
            return trace, shape, "cached certificate, re-checked (concrete replay + Z3)"
    found = search(
        base, goal_for, check, max_depth=max_depth, scale_caps=scale_caps, timeout_ms=timeout_ms
    )
    if found is None:
        return None
    trace, shape = found
    if update:
        store(base.name, obligation, trace, shape)
    return trace, shape, "found by Z3 BMC, replayed concretely"


def reach_traces(table_name: str) -> list[list[tuple[str, dict[str, int]]]]:
    """The cached reachability witnesses of a table, as (action, params) lists (fuzz warm-ups)."""
    entries = _load().get(table_name, {})
    out = []
    for ob, entry in sorted(entries.items()):
        if ob.startswith("reach/"):
            out.append([(s["action"], dict(s["params"])) for s in entry.get("steps", [])])
    return out
