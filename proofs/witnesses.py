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

import contextlib
import json
import os
import tempfile
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
# The file: {"schema": 2, "tables": {<table digest>: {"table": <name>, "witnesses": {<obligation>:
# {"requests", "pool", "scaled_caps", "steps"}}}}}.  Keyed by the table's content
# (:func:`kvstate.proofs.digest.table_digest`), so two tables of one name never share entries;
# the name is kept as a hint: an entry of another table of the same name is tried (and, being a
# certificate, re-checked) when the table's own has none.
SCHEMA = 2


def _load() -> dict[str, Any]:
    try:
        with CACHE_PATH.open(encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        return {}
    tables = data.get("tables")
    return tables if isinstance(tables, dict) else {}


def _entry(raw: Any) -> tuple[list[Step], Shape] | None:
    try:
        steps = [
            Step(s["action"], {k: int(v) for k, v in s["params"].items()}) for s in raw["steps"]
        ]
        shape = Shape(int(raw["requests"]), int(raw["pool"]), bool(raw["scaled_caps"]))
    except (KeyError, TypeError, ValueError, AttributeError):
        return None
    return steps, shape


def candidates(table: Table, obligation: str) -> list[tuple[list[Step], Shape, bool]]:
    """The cached witnesses for ``obligation``: the table's own (by content) first, then those
    of other tables with its name (hints: the caller re-checks every one); the flag says
    which: True for the table's own."""
    from .digest import table_digest

    data = _load()
    key = table_digest(table)
    keys = [key] + sorted(
        k
        for k, v in data.items()
        if k != key and isinstance(v, dict) and v.get("table") == table.name
    )
    out: list[tuple[list[Step], Shape, bool]] = []
    for k in keys:
        raw = data.get(k, {}).get("witnesses", {}).get(obligation)
        found = _entry(raw) if raw else None
        if found is not None and all(found != (s, sh) for s, sh, _ in out):
            out.append((*found, k == key))
    return out


def store(table: Table, obligation: str, trace: Trace, shape: Shape) -> None:
    """Record a witness (only when the caller asked to update the cache).

    Safe for processes writing at once (``--update-witnesses`` runs in parallel): the file is
    read, changed and replaced under a lock file beside it (``filelock``), and replaced
    atomically (a temporary of its own, ``os.replace``), so no writer loses another's entry and
    no reader sees half a file."""
    from filelock import FileLock

    from .digest import table_digest

    key = table_digest(table)
    with _lock, FileLock(str(CACHE_PATH) + ".lock"):
        tables = _load()
        slot = tables.setdefault(key, {"table": table.name, "witnesses": {}})
        slot["table"] = table.name
        slot.setdefault("witnesses", {})[obligation] = {
            "requests": shape.requests,
            "pool": shape.pool,
            "scaled_caps": shape.scaled_caps,
            "steps": [{"action": s.action, "params": s.params} for s in trace.steps],
        }
        write({"schema": SCHEMA, "tables": tables})


def write(data: dict[str, Any]) -> None:
    """Replace the cache file atomically (the caller holds the lock)."""
    fd, tmp = tempfile.mkstemp(dir=CACHE_PATH.parent, prefix=".witnesses.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(data, fh, indent=1, sort_keys=True)
            fh.write("\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, CACHE_PATH)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


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
    hopeless: Callable[[], bool] | None = None,
) -> tuple[Trace, Shape, str] | None:
    """A checked witness: from the cache if it still checks, else by search.

    ``hopeless``: a cheap test run before the search (not before the cache: a cached witness
    is a certificate); True skips the search, which could only come back empty (a dead
    action's reach search: minutes of BMC at growing depths, each query UNSAT)."""
    for steps, shape, own in candidates(base, obligation):
        t = shape.table(base)
        trace = replay(t, shape.pool, steps)
        if (
            trace.replayed
            and check(trace)
            and confirm_symbolically(t, shape.pool, steps, goal_for(t))
        ):
            if not own and update:  # a hint that checks: keep it under this table's content too
                store(base, obligation, trace, shape)
            return trace, shape, "cached certificate, re-checked (concrete replay + Z3)"
    if hopeless is not None and hopeless():
        return None
    found = search(
        base, goal_for, check, max_depth=max_depth, scale_caps=scale_caps, timeout_ms=timeout_ms
    )
    if found is None:
        return None
    trace, shape = found
    if update:
        store(base, obligation, trace, shape)
    return trace, shape, "found by Z3 BMC, replayed concretely"


def reach_traces(table: Table | str) -> list[list[tuple[str, dict[str, int]]]]:
    """The cached reachability witnesses of a table, as (action, params) lists (fuzz warm-ups).

    Given a table: its own (by content), or, where it has none, those of the tables of its
    name.  Given a name: those of the tables of that name.  Not re-checked here: the fuzzer
    replays each in lockstep and the model refuses a step its guard does not allow."""
    data = _load()
    if isinstance(table, str):
        name, own = table, None
    else:
        from .digest import table_digest

        name, own = table.name, data.get(table_digest(table))
    slots = [own] if own else [v for _, v in sorted(data.items()) if v.get("table") == name]
    out, seen = [], set()
    for slot in slots:
        for ob, entry in sorted(slot.get("witnesses", {}).items()):
            if ob.startswith("reach/") and ob not in seen:
                seen.add(ob)
                out.append([(s["action"], dict(s["params"])) for s in entry.get("steps", [])])
    return out
