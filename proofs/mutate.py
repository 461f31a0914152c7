"""Mutation analysis of a table: how strong are its properties?

A *mutant* is the table with one small, plausible defect, built from the table's data the way
``Table.derive`` builds seeded bugs (no source is edited).  Each mutant is then put to the
table's own safety obligations; a mutant that some obligation refutes is *killed* (by that
obligation), one that passes them all *survived*: the properties did not notice the defect.  A
survivor is either a hole in the properties or a change that really is harmless; the table
records the harmless ones, with a one-line argument, in ``Table.equivalent`` and they are
reported as *equivalent*.

Operators (``OPERATORS``):

* ``drop-conjunct``: one named guard conjunct removed (actions with two or more conjuncts);
* ``drop-guard``: an action's whole guard replaced by ``True``;
* ``forget-update``: one update replaced by the identity (a forgotten assignment);
* ``skip-reset``: the same, for the resets of an action that frees or reallocates a slot
  (reported apart: a reallocated block inheriting its previous occupant's state);
* ``off-by-one-update``: one update's value at the acting block (or the scalar) plus one;
* ``off-by-one-compare``: one integer operand a guard conjunct reads (a variable, or one of the
  caps ``io_cap``, ``pin_cap``, ``load_steps``) shifted by +1 or -1;
* ``swap-phase``: an update of a phase variable writes a neighbouring phase of the same
  lifecycle instead (the two swapped).

Ghost variables (``Var.ghost``) are the properties' observers, not the mechanism: their updates
are never mutated.

Which obligations: a mutant changes one action, so Init and every other action's induction step
are unchanged.  A mutant is checked with the mutated action's induction step against every
invariant, its action-level read obligations, the phase-graph structure of the lifecycles it
touches, the bounded (k-induction) invariants it can affect, and the table's completeness rule.
That is exactly the part of ``kvstate prove``'s safety obligations that can change, so a mutant
survives here if and only if those obligations all still hold.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from kvstate.spec.expr import ITE, array, store
from kvstate.spec.phases import CKV, LIFECYCLES
from kvstate.spec.state import RecordingState, initial_state
from kvstate.spec.table import Action, Conjunct, ParamKind, Scope, Table

OPERATORS = (
    "drop-conjunct",
    "drop-guard",
    "forget-update",
    "skip-reset",
    "off-by-one-update",
    "off-by-one-compare",
    "swap-phase",
)
SHIFTED_CONSTS = ("io_cap", "pin_cap", "load_steps")
_PRIORITY = (
    "drop-guard",
    "skip-reset",
    "forget-update",
    "drop-conjunct",
    "swap-phase",
    "off-by-one-update",
    "off-by-one-compare",
)

Fn = Callable[..., Any]


@dataclass(frozen=True)
class Mutant:
    id: str  # stable name: operator:action[.detail]
    operator: str
    action: str
    detail: str
    make: Callable[[Table], Table] = field(compare=False, repr=False)


@dataclass
class Outcome:
    mutant: str
    operator: str
    action: str
    detail: str
    verdict: str  # killed | survived | equivalent | unknown (timed out) | invalid | unchecked
    killed_by: list[str] = field(default_factory=list)  # "obligation: status"
    reason: str = ""  # the table's equivalence argument, or why it is invalid
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


# ---- state views used by the operand-shifting operators ------------------------------------
class _ReqShift:
    def __init__(self, inner: Any, var: str, delta: int) -> None:
        self._inner, self._var, self._delta = inner, var, delta

    def __getattr__(self, name: str) -> Any:
        v = getattr(self._inner, name)
        return v + self._delta if name == self._var else v


class _Shifted:
    """A state whose variable ``var`` (or constant ``s.k.<const>``) reads ``delta`` off."""

    def __init__(self, s: Any, var: str | None, const: str | None, delta: int, scope: Any):
        self._s, self._var, self._const, self._delta, self._scope = s, var, const, delta, scope

    def __getattr__(self, name: str) -> Any:
        s = self._s
        if name == "k":
            k = s.k
            if self._const is not None:
                k = replace(k, **{self._const: getattr(k, self._const) + self._delta})
            return k
        v = getattr(s, name)
        if name == self._var:
            if self._scope is Scope.BLOCK:
                d = self._delta
                return array(s, lambda b: v[b] + d)
            return v + self._delta
        return v

    def req(self, r: int) -> Any:
        inner = self._s.req(r)
        return _ReqShift(inner, self._var, self._delta) if self._var else inner


def _shift_conjunct(c: Conjunct, var: str | None, const: str | None, delta: int, scope: Any) -> Fn:
    def fn(s: Any, p: Any) -> Any:
        return c.fn(_Shifted(s, var, const, delta, scope), p)

    return fn


class _KRec:
    def __init__(self, k: Any, seen: set[str]) -> None:
        self._k, self._seen = k, seen

    def __getattr__(self, name: str) -> Any:
        self._seen.add(name)
        return getattr(self._k, name)


def conjunct_reads(table: Table, a: Action, c: Conjunct) -> tuple[frozenset[str], frozenset[str]]:
    """(variables, constants) a guard conjunct reads, found on a probe state."""
    s = initial_state(table, 2, RecordingState)
    assert isinstance(s, RecordingState)
    seen: set[str] = set()
    s.k = _KRec(table.consts, seen)  # type: ignore[assignment]
    p = _probe_params(a, table.consts.L)
    try:
        c.fn(s, p)
    except Exception:  # noqa: BLE001 - an unreadable conjunct just gets no operand mutants
        return frozenset(), frozenset()
    return frozenset(s._reads), frozenset(seen)


def _probe_params(a: Action, L: int) -> Any:
    from kvstate.spec.validate import _P

    return _P(a, L)


# ---- update transforms -------------------------------------------------------------------------
def _at_block(a: Action) -> str | None:
    for q in a.params:
        if q.kind is ParamKind.BLOCK:
            return q.name
    return None


def _map_value(table: Table, a: Action, var: str, old: Fn, f: Callable[[Any], Any]) -> Fn:
    """The update ``old`` with ``f`` applied to the value it writes at the acting block (or to
    every element when the action has no block parameter; to the scalar for scalars)."""
    scope = table.var(var).scope
    bp = _at_block(a)

    def fn(s: Any, p: Any) -> Any:
        val = old(s, p)
        if scope in (Scope.BLOCK, Scope.REQ_BLOCK):
            if bp is not None and scope is Scope.BLOCK:
                b = getattr(p, bp)
                return store(s, val, b, f(val[b]))
            return array(s, lambda b: f(val[b]))
        return f(val)

    return fn


def _written_phase(table: Table, a: Action, var: str) -> int | None:
    """The phase an update writes on the probe state (at the acting block)."""
    from kvstate.spec.state import ProbeState

    s = initial_state(table, 2, ProbeState)
    p = _probe_params(a, table.consts.L)
    try:
        val = a.updates[var](s, p)
    except Exception:  # noqa: BLE001
        return None
    bp = _at_block(a)
    if isinstance(val, tuple):
        val = val[getattr(p, bp)] if bp is not None else val[0]
    return int(val) if isinstance(val, int) else None


def _replace_updates(a: Action, updates: dict[str, Fn]) -> Action:
    return replace(a, updates=updates)


# ---- enumeration -------------------------------------------------------------------------------
def mutants(table: Table, operators: Iterable[str] = OPERATORS) -> list[Mutant]:
    ops = set(operators)
    unknown = ops - set(OPERATORS)
    if unknown:
        raise ValueError(f"unknown mutation operator(s) {sorted(unknown)}; known: {OPERATORS}")
    ghosts = {v.name for v in table.vars if v.ghost}
    out: list[Mutant] = []
    free_actions = _freeing_actions(table)
    for a in table.actions:
        # guards
        if "drop-conjunct" in ops and len(a.guard) >= 2:
            for c in a.guard:
                out.append(
                    Mutant(
                        f"drop-conjunct:{a.name}.{c.name}",
                        "drop-conjunct",
                        a.name,
                        c.name,
                        lambda t, a=a, c=c: t.derive(drop_guard=[(a.name, c.name)]),
                    )
                )
        if "drop-guard" in ops:
            out.append(
                Mutant(
                    f"drop-guard:{a.name}",
                    "drop-guard",
                    a.name,
                    "guard := True",
                    lambda t, a=a: t.derive(
                        replace_action=[
                            replace(t.action(a.name), guard=(Conjunct("true", lambda s, p: True),))
                        ]
                    ),
                )
            )
        if "off-by-one-compare" in ops:
            for c in a.guard:
                vars_, consts = conjunct_reads(table, a, c)
                operands: list[tuple[str | None, str | None, Any]] = []
                for v in sorted(vars_):
                    var = table.var(v)
                    if (
                        var.domain is None
                        and not var.is_bool
                        and var.scope
                        in (
                            Scope.BLOCK,
                            Scope.GLOBAL,
                            Scope.REQ,
                        )
                    ):
                        operands.append((v, None, var.scope))
                operands += [(None, k, None) for k in SHIFTED_CONSTS if k in consts]
                for var_name, const, scope in operands:
                    for d in (1, -1):
                        what = var_name or f"k.{const}"
                        out.append(
                            Mutant(
                                f"off-by-one-compare:{a.name}.{c.name}[{what}{d:+d}]",
                                "off-by-one-compare",
                                a.name,
                                f"{c.name} reads {what}{d:+d}",
                                lambda t, a=a, c=c, v=var_name, k=const, d=d, sc=scope: t.derive(
                                    replace_guard={
                                        (a.name, c.name): _shift_conjunct(
                                            t.action(a.name).conjunct(c.name), v, k, d, sc
                                        )
                                    }
                                ),
                            )
                        )
        # updates
        for var_name in sorted(a.updates):
            if var_name in ghosts:
                continue
            var = table.var(var_name)
            op = "skip-reset" if a.name in free_actions and var_name not in ("ckv",) else None
            forget = op or "forget-update"
            if forget in ops:
                out.append(
                    Mutant(
                        f"{forget}:{a.name}.{var_name}",
                        forget,
                        a.name,
                        f"{var_name} keeps its old value",
                        lambda t, a=a, v=var_name: t.derive(
                            replace_action=[
                                _replace_updates(
                                    t.action(a.name),
                                    {k: f for k, f in t.action(a.name).updates.items() if k != v},
                                )
                            ]
                        ),
                    )
                )
            if "off-by-one-update" in ops and var.domain is None and not var.is_bool:
                out.append(
                    Mutant(
                        f"off-by-one-update:{a.name}.{var_name}",
                        "off-by-one-update",
                        a.name,
                        f"{var_name} written +1",
                        lambda t, a=a, v=var_name: t.derive(
                            update={
                                (a.name, v): _map_value(
                                    t,
                                    t.action(a.name),
                                    v,
                                    t.action(a.name).updates[v],
                                    lambda x: x + 1,
                                )
                            }
                        ),
                    )
                )
            if "swap-phase" in ops and var.domain is not None:
                y = _written_phase(table, a, var_name)
                members = [int(m) for m in _lifecycle_members(var_name, var.domain)]
                if y is None or y not in members:
                    continue
                i = members.index(y)
                for z in {members[j] for j in (i - 1, i + 1) if 0 <= j < len(members)}:

                    def swap(x: Any, y: int = y, z: int = z) -> Any:
                        return ITE(x == y, z, ITE(x == z, y, x))

                    out.append(
                        Mutant(
                            f"swap-phase:{a.name}.{var_name}[{var.domain(y).name}<->{var.domain(z).name}]",
                            "swap-phase",
                            a.name,
                            f"{var_name} writes {var.domain(z).name} for {var.domain(y).name}",
                            lambda t, a=a, v=var_name, f=swap: t.derive(
                                update={
                                    (a.name, v): _map_value(
                                        t, t.action(a.name), v, t.action(a.name).updates[v], f
                                    )
                                }
                            ),
                        )
                    )
    return out


def _lifecycle_members(var: str, domain: Any) -> list[Any]:
    for lc in LIFECYCLES:
        if lc.var == var:
            return lc.members
    return list(domain)


def _freeing_actions(table: Table) -> set[str]:
    """Actions that free a slot or take a free one (their other updates are resets).

    Found on the table, not by name: the action writes ``ckv`` and either its guard needs the
    slot FREE or it moves the slot to FREE.
    """
    from kvstate.spec.state import ProbeState

    out: set[str] = set()
    for a in table.actions:
        if "ckv" not in a.updates:
            continue
        y = _written_phase(table, a, "ckv")
        s = initial_state(table, 2, ProbeState)
        p = _probe_params(a, table.consts.L)
        try:
            from_free = all(c.fn(s, p) is True for c in a.guard if "ckv" in _reads(table, a, c))
            needs_free = from_free and any("ckv" in _reads(table, a, c) for c in a.guard)
        except Exception:  # noqa: BLE001
            needs_free = False
        if y == int(CKV.FREE) or needs_free:
            out.add(a.name)
    return out


def _reads(table: Table, a: Action, c: Conjunct) -> frozenset[str]:
    return conjunct_reads(table, a, c)[0]


# ---- checking ----------------------------------------------------------------------------------
GUARD_ONLY = ("drop-conjunct", "drop-guard", "off-by-one-compare")
REFUTED = ("violated", "not-inductive", "cti")  # a definite refutation (timeouts are not)


def table_edges(table: Table) -> dict[str, dict[tuple[str, int | None], Any]]:
    """Each lifecycle's phase edges per action instance of ``table`` (computed once, before
    the workers fork; a mutant's structure check reuses every unchanged action's edges)."""
    from kvstate.model.graph import action_edges
    from kvstate.model.symbolic import instances

    out: dict[str, dict[tuple[str, int | None], Any]] = {}
    for lc in LIFECYCLES:
        scope = table.var(lc.var).scope
        d = out.setdefault(lc.component, {})
        for inst in instances(table):
            if lc.var not in inst.action.modifies or (scope is Scope.REQ and inst.r != 0):
                continue
            d[(inst.action.name, inst.r)] = action_edges(table, lc, inst)
    return out


def check_mutant(
    table: Table,
    m: Mutant,
    timeout_ms: int = 4000,
    *,
    liveness: bool = True,
    edges: dict[str, dict[tuple[str, int | None], Any]] | None = None,
) -> Outcome:
    """Run the obligations ``m`` can change, cheapest first, stopping at the first refutation.

    Verdicts: ``killed`` (an obligation refuted it), ``equivalent`` (proved: a guard-only
    mutant whose guard accepts exactly the same states under the invariants; or argued in
    ``Table.equivalent``), ``unknown`` (an obligation timed out and none refuted it: not a
    kill), ``survived``.  ``edges``: :func:`table_edges` of ``table``."""
    from .config import Config
    from .engine import check_guard_equivalence
    from .obligations import kill_units, run_unit

    t0 = time.perf_counter()
    base = Outcome(m.id, m.operator, m.action, m.detail, "survived")
    try:
        mt = m.make(table)
    except Exception as exc:  # noqa: BLE001 - a mutant the table refuses to build
        base.verdict, base.reason = "invalid", f"{type(exc).__name__}: {exc}"
        base.seconds = time.perf_counter() - t0
        return base
    known = (
        {c: {k: v for k, v in d.items() if k[0] != m.action} for c, d in edges.items()}
        if edges is not None
        else None
    )
    cfg = Config(
        timeout_ms=timeout_ms,
        k_timeout_ms=max(timeout_ms, 30000),
        find_traces=False,
        first_failure=True,
        known_edges=known,
    )
    undecided: list[str] = []
    for unit in kill_units(table, mt, m.action, liveness=liveness):
        for r in run_unit(mt, unit, cfg):
            if r.ok:
                continue
            if r.status in REFUTED:
                base.killed_by.append(f"{r.obligation}: {r.status}")
            else:  # unknown (a timeout), error, no answer: refutes nothing
                undecided.append(f"{r.obligation}: {r.status}")
        if base.killed_by:
            break
    if not base.killed_by and any(u.startswith("inductive/") for u in undecided):
        # A step whose counterexample needs more blocks than a small pool holds (a cap of
        # 48 blocks): the same table with its caps scaled to 1 shows it on a small pool.
        g = table.geometry
        scaled = table.with_geometry(g.with_changes(io_cap=1, pin_cap_blocks=1))
        try:
            mts = m.make(scaled)
        except Exception:  # noqa: BLE001 - not buildable there: stays undecided
            mts = None
        if mts is not None:
            unit = next(u for u in kill_units(scaled, mts, m.action) if u.kind == "inductive")
            for r in run_unit(mts, unit, cfg):
                if not r.ok and r.status in REFUTED:
                    base.killed_by.append(f"{r.obligation}: {r.status} (caps scaled to 1)")
    if base.killed_by:
        base.verdict = "killed"
    elif m.operator in GUARD_ONLY and (
        check_guard_equivalence(table, mt, m.action, max(timeout_ms, 10000)) == "proved"
    ):
        base.verdict = "equivalent"
        base.reason = (
            "proved: under the invariants the guard accepts exactly the same states "
            "(Z3, any pool size)"
        )
    elif m.id in table.equivalent:
        base.verdict, base.reason = "equivalent", table.equivalent[m.id]
    elif undecided:
        base.verdict, base.reason = "unknown", "timed out: " + "; ".join(undecided)
    base.seconds = time.perf_counter() - t0
    return base


VERDICTS = ("killed", "survived", "equivalent", "unknown", "invalid", "unchecked")
_TABLE: Table | None = None
_MUTANTS: list[Mutant] = []
_TMO = 20000
_LIVENESS = True
_EDGES: dict[str, dict[tuple[str, int | None], Any]] | None = None


def _work(i: int) -> Outcome:
    """Runs in a forked worker: the mutants (closures) are inherited, only indices travel."""
    assert _TABLE is not None
    return check_mutant(_TABLE, _MUTANTS[i], _TMO, liveness=_LIVENESS, edges=_EDGES)


@dataclass
class MutationReport:
    table: str
    outcomes: list[Outcome]
    seconds: float
    jobs: int
    budget_s: float | None
    liveness: bool = True
    resumed: int = 0  # verdicts read back from the session store, not checked in this run
    stopped: str | None = None  # "budget" or "interrupted" when mutants were left unchecked
    session: str | None = None

    def count(self, verdict: str) -> int:
        return sum(1 for o in self.outcomes if o.verdict == verdict)

    @property
    def judged(self) -> int:
        """The mutants the kill rate is over: all but the equivalent and invalid ones."""
        return len(self.outcomes) - self.count("equivalent") - self.count("invalid")

    @property
    def checked(self) -> int:
        """Mutants with a verdict (this run's or the session store's): all but unchecked."""
        return len(self.outcomes) - self.count("unchecked")

    @property
    def kill_rate(self) -> float:
        """Killed among every mutant that is not equivalent or invalid: a mutant that timed
        out (``unknown``) or was never checked (``unchecked``, past the budget) counts as not
        killed, so a gate never passes on what it did not check.  0 when there is none."""
        return 0.0 if self.judged == 0 else self.count("killed") / self.judged

    @property
    def kill_rate_checked(self) -> float:
        """Killed among the mutants checked (not equivalent or invalid): what the checked part
        shows, not a gate."""
        n = self.judged - self.count("unchecked")
        return 0.0 if n == 0 else self.count("killed") / n

    def survivors(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.verdict == "survived"]

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "table": self.table,
            "seconds": round(self.seconds, 2),
            "jobs": self.jobs,
            "budget_s": self.budget_s,
            "liveness": self.liveness,
            "stopped": self.stopped,
            "session": self.session,
            "resumed": self.resumed,
            "total": len(self.outcomes),
            "checked": self.checked,
            "counts": {v: self.count(v) for v in VERDICTS},
            "kill_rate": round(self.kill_rate, 4),
            "kill_rate_checked": round(self.kill_rate_checked, 4),
            "by_operator": self.by_operator(),
            "mutants": [o.to_dict() for o in self.outcomes],
        }

    def by_operator(self) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {}
        for o in self.outcomes:
            d = out.setdefault(o.operator, {})
            d[o.verdict] = d.get(o.verdict, 0) + 1
        return out


SCHEMA = "kvstate.mutate/1"  # the JSON report's version: bumped when a field changes meaning


def mutate(
    table: Table,
    *,
    operators: Iterable[str] = OPERATORS,
    only: Sequence[str] = (),
    jobs: int | None = None,
    budget_s: float | None = None,
    timeout_ms: int = 4000,
    liveness: bool = True,
    progress: Callable[[Outcome], None] | None = None,
    session: str | os.PathLike[str] | None = None,
) -> MutationReport:
    """Generate the mutants of ``table`` and check each (forked workers, within ``budget_s``:
    the mutants not finished by then are reported ``unchecked``).  ``liveness=False`` runs the
    safety obligations alone (no completeness BMC).  ``session``: a session store
    (:mod:`.session`) whose verdicts for this table and these settings are reused, and which
    keeps every new one at once; an interruption (``KeyboardInterrupt``) stops the workers and
    returns the report so far."""
    global _TABLE, _TMO, _MUTANTS, _LIVENESS, _EDGES
    ms = mutants(table, operators)
    if only:
        ms = [m for m in ms if any(o in m.id for o in only)]
    # The classic defects first (a whole guard, a reset, an assignment), so that a run cut short
    # by ``budget_s`` has checked those.
    ms.sort(key=lambda m: _PRIORITY.index(m.operator))
    n_jobs = max(1, jobs if jobs is not None else (os.cpu_count() or 1))
    t0 = time.perf_counter()
    done: dict[str, Outcome] = {}
    store = None
    if session is not None:
        from .digest import table_digest
        from .session import Session, settings_key

        store = Session(
            session, table_digest(table), settings_key(timeout_ms=timeout_ms, liveness=liveness)
        )
        kept = store.load()
        for m in ms:
            if m.id in kept:
                try:
                    done[m.id] = Outcome(**kept[m.id])
                except TypeError:  # a row of another shape: check it again
                    continue
    resumed = len(done)
    todo = [m for m in ms if m.id not in done]
    stopped: str | None = None

    def finish(o: Outcome) -> None:
        done[o.mutant] = o
        if store is not None:
            store.save(o.mutant, o.to_dict())
        if progress:
            progress(o)

    _TABLE, _TMO, _MUTANTS, _LIVENESS = table, timeout_ms, todo, liveness
    _EDGES = table_edges(table) if todo else None
    try:
        if n_jobs == 1:
            for m in todo:
                if budget_s is not None and time.perf_counter() - t0 > budget_s:
                    stopped = "budget"
                    break
                finish(check_mutant(table, m, timeout_ms, liveness=liveness, edges=_EDGES))
        elif todo:
            ctx = mp.get_context("fork")
            pool = ctx.Pool(n_jobs)
            try:
                it = pool.imap_unordered(_work, range(len(todo)))
                while len(done) < len(ms):
                    left = None if budget_s is None else budget_s - (time.perf_counter() - t0)
                    if left is not None and left <= 0:
                        stopped = "budget"
                        break
                    try:
                        o = it.next(timeout=left)
                    except mp.TimeoutError:
                        stopped = "budget"
                        break
                    finish(o)
            finally:
                pool.terminate()
                pool.join()
    except KeyboardInterrupt:
        stopped = "interrupted"
    finally:
        _TABLE, _MUTANTS, _EDGES = None, [], None
        if store is not None:
            store.close()
    outcomes = [
        done.get(m.id) or Outcome(m.id, m.operator, m.action, m.detail, "unchecked") for m in ms
    ]
    return MutationReport(
        table.name,
        outcomes,
        time.perf_counter() - t0,
        n_jobs,
        budget_s,
        liveness,
        resumed=resumed,
        stopped=stopped if len(done) < len(ms) else None,
        session=None if session is None else str(session),
    )
