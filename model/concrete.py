"""The executable reference state machine: the table read concretely.

It answers three questions about a concrete state: which actions are enabled (with which
parameters), what a step produces, and which invariants fail.  The proofs replay every Z3
counterexample through it before reporting, and the conformance harness runs it in lockstep
with the implementation.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from kvstate.spec.compile import invariant_reads
from kvstate.spec.errors import SpecError
from kvstate.spec.phases import Fmt
from kvstate.spec.state import ConcreteState, initial_state, req_var_names
from kvstate.spec.table import Action, Invariant, ParamKind, Scope, Table


class GuardError(Exception):
    """An action was stepped in a state where its guard is false."""

    def __init__(self, action: str, params: Mapping[str, Any], failed: list[str]) -> None:
        super().__init__(
            f"{action}({_fmt_params(params)}) is disabled: guard {', '.join(failed)} false"
        )
        self.action = action
        self.params = dict(params)
        self.failed = failed


def _fmt_params(params: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in params.items())


@dataclass(frozen=True)
class Violation:
    invariant: str
    request: int | None
    block: int | None

    def __str__(self) -> str:
        where = []
        if self.request is not None:
            where.append(f"r={self.request}")
        if self.block is not None:
            where.append(f"b={self.block}")
        return f"{self.invariant}" + (f" at {', '.join(where)}" if where else "")


_MEMO_CAP = 1 << 16  # read-set values remembered per invariant (then forgotten, re-evaluated)


class _Held:
    """One invariant's memo: its read set, and the values of it the invariant held on."""

    __slots__ = ("inv", "names", "held", "last")

    def __init__(self, inv: Invariant, names: tuple[str, ...]) -> None:
        self.inv = inv
        self.names = names
        self.held: set[tuple[Any, ...]] = set()
        self.last: tuple[Any, ...] | None = None


_VALID_KEPT = 1 << 14  # parameter tuples a machine remembers as valid (then forgets all)


class Machine:
    """The table over a concrete pool of ``N`` blocks."""

    def __init__(self, table: Table, N: int | None = None, *, memo: bool = False) -> None:
        self.table = table
        self.N = N if N is not None else table.geometry.model_blocks
        if self.N <= 0:
            raise SpecError("pool size must be positive")
        self.k = table.consts
        self._req = req_var_names(table)
        self._scope = {v.name: v.scope for v in table.vars}
        self._spaces: dict[tuple[str, int | None], tuple[dict[str, Any], ...]] = {}
        self._plans: dict[str, tuple[Action, tuple[str | None, tuple[Any, ...]]]] = {}
        self._valid: set[tuple[Any, ...]] = set()  # (action, params' items) found valid
        # memo=True (the fuzzers): per invariant, its read set and the read-set values it was
        # seen to hold on (see ``violations``)
        self._memo: list[_Held] | None = (
            [_Held(inv, tuple(sorted(invariant_reads(table, inv)))) for inv in table.invariants]
            if memo
            else None
        )

    # ---- states -------------------------------------------------------------------------
    def init(self) -> ConcreteState:
        return initial_state(self.table, self.N)

    def state(self, values: Mapping[str, Any]) -> ConcreteState:
        missing = {v.name for v in self.table.vars} - set(values)
        if missing:
            raise SpecError(f"state is missing variables {sorted(missing)}")
        return ConcreteState(values, self.N, self.k, self._req)

    # ---- parameters ---------------------------------------------------------------------
    def domain(self, kind: ParamKind) -> range | list[int]:
        if kind is ParamKind.BLOCK:
            return range(self.N)
        if kind is ParamKind.REQ:
            return range(self.k.R)
        if kind is ParamKind.TOKENS:
            return range(0, self.N * self.k.L + 1)
        if kind is ParamKind.ADDR:
            return range(0, 4 * self.N)
        if kind is ParamKind.TICKS:
            return range(1, self.k.lease_max + 1)
        return [int(f) for f in Fmt]

    def param_space(
        self, action: Action, *, tokens_step: int | None = None
    ) -> Iterator[dict[str, Any]]:
        key = (action.name, tokens_step)
        space = self._spaces.get(key)
        if space is None:  # the domains are the machine's constants: enumerate them once
            doms = []
            for p in action.params:
                d = self.domain(p.kind)
                if p.kind is ParamKind.TOKENS and tokens_step:
                    d = range(0, self.N * self.k.L + 1, tokens_step)
                doms.append(d)
            names = [p.name for p in action.params]
            space = self._spaces[key] = tuple(
                dict(zip(names, combo, strict=True)) for combo in itertools.product(*doms)
            )
        for params in space:
            yield dict(params)  # a fresh dict each time: callers may keep or edit it

    # ---- transitions --------------------------------------------------------------------
    def failed_conjuncts(
        self, s: ConcreteState, action: Action | str, params: Mapping[str, Any]
    ) -> list[str]:
        a = self.table.action(action) if isinstance(action, str) else action
        p = SimpleNamespace(**params)
        return [c.name for c in a.guard if not c.fn(s, p)]

    def is_enabled(self, s: ConcreteState, action: Action | str, params: Mapping[str, Any]) -> bool:
        a = self.table.action(action) if isinstance(action, str) else action
        p = SimpleNamespace(**params)
        for c in a.guard:
            if not c.fn(s, p):
                return False
        return True

    def enabled(
        self, s: ConcreteState, *, tokens_step: int | None = None
    ) -> Iterator[tuple[str, dict[str, Any]]]:
        for a in self.table.actions:
            for params in self.param_space(a, tokens_step=tokens_step):
                if self.is_enabled(s, a, params):
                    yield a.name, params

    def step(
        self, s: ConcreteState, action: Action | str, params: Mapping[str, Any]
    ) -> ConcreteState:
        """The successor state; raises :class:`GuardError` (state untouched) if disabled."""
        a = self.table.action(action) if isinstance(action, str) else action
        rq, updates = self._plan(a)
        self._check_params(a, params)
        failed = self.failed_conjuncts(s, a, params)
        if failed:
            raise GuardError(a.name, params, failed)
        p = SimpleNamespace(**params)
        new = dict(s._v)
        r = params.get(rq, None) if rq is not None else None
        for name, fn, per_req in updates:
            value = fn(s, p)
            if per_req:
                assert r is not None
                row = list(new[name])
                row[r] = value
                new[name] = tuple(row)
            else:
                new[name] = value
        return ConcreteState(new, self.N, self.k, self._req)

    def _plan(self, a: Action) -> tuple[str | None, tuple[tuple[str, Any, bool], ...]]:
        """An action's request parameter and its updates, each with whether its variable is
        per request (read from the table once per action)."""
        got = self._plans.get(a.name)
        if got is None or got[0] is not a:
            rq = next((q.name for q in a.params if q.kind is ParamKind.REQ), None)
            ups = tuple(
                (name, fn, self._scope[name] in (Scope.REQ, Scope.REQ_BLOCK))
                for name, fn in a.updates.items()
            )
            if got is not None:  # another action object of that name: forget the old checks
                self._valid.clear()
            got = self._plans[a.name] = (a, (rq, ups))
        return got[1]

    def _check_params(self, a: Action, params: Mapping[str, Any]) -> None:
        # checked before: a pure function of the action and the values (plain ints only: a
        # bool equals its int, and other values are refused below anyway)
        key = None
        if all(type(v) is int for v in params.values()) and a.name in self._plans:
            key = (a.name, tuple(params.items()))
            if key in self._valid:
                return
        self._check_params_uncached(a, params)
        if key is not None:
            if len(self._valid) >= _VALID_KEPT:
                self._valid.clear()
            self._valid.add(key)

    def _check_params_uncached(self, a: Action, params: Mapping[str, Any]) -> None:
        names = {p.name for p in a.params}
        if set(params) != names:
            raise SpecError(
                f"action {a.name!r} takes parameters {sorted(names)}, got {sorted(params)}"
            )
        for q in a.params:
            v = params[q.name]
            if not isinstance(v, int) or isinstance(v, bool):
                raise SpecError(f"action {a.name!r}: parameter {q.name}={v!r} is not an int")
            if q.kind is ParamKind.ADDR:
                if v < 0:
                    raise SpecError(f"action {a.name!r}: address {q.name}={v} is negative")
                continue
            if v not in self.domain(q.kind):
                raise SpecError(
                    f"action {a.name!r}: parameter {q.name}={v!r} outside its {q.kind.value} domain"
                )

    # ---- invariants ---------------------------------------------------------------------
    def violations(
        self, s: ConcreteState, invariants: list[Invariant] | None = None
    ) -> list[Violation]:
        """Every violation of ``invariants`` (default: the table's), in table order.

        With ``memo`` (the fuzzers check every invariant after every step), an invariant is
        evaluated only on read-set values it has not been seen to hold on.  An invariant is a
        pure function of the variables it reads (``invariant_reads``, taken from the table's
        terms: the frame the proofs use to skip an (invariant, action) pair whose action writes
        nothing the invariant reads), so it holds again on equal values; only passing
        evaluations are remembered, so the list is the one a full evaluation returns.
        """
        if invariants is None and self._memo is not None:
            return self._memo_violations(s)
        out: list[Violation] = []
        for inv in invariants if invariants is not None else self.table.invariants:
            for r in range(self.k.R) if inv.per_request else [None]:
                args: tuple[Any, ...] = (s,) if r is None else (s, r)
                if inv.scalar is not None and not inv.scalar(*args):
                    out.append(Violation(inv.name, r, None))
                if inv.per_block is not None:
                    for b in range(self.N):
                        if not inv.per_block(*args, b):
                            out.append(Violation(inv.name, r, b))
                            break
        return out

    def _memo_violations(self, s: ConcreteState) -> list[Violation]:
        assert self._memo is not None
        values = s._v
        todo: list[tuple[_Held, tuple[Any, ...]]] = []
        for h in self._memo:
            now = tuple([values[n] for n in h.names])
            # identity first (a model successor shares what its action did not write), then
            # by value (a target's fresh observe(), an earlier state)
            if now != h.last and now not in h.held:
                todo.append((h, now))
            else:
                h.last = now
        if not todo:
            return []
        out = self.violations(s, [h.inv for h, _ in todo])
        broken = {v.invariant for v in out}
        for h, now in todo:
            if h.inv.name not in broken:
                if len(h.held) >= _MEMO_CAP:
                    h.held.clear()
                h.held.add(now)
                h.last = now
        return out

    def run(
        self, trace: list[tuple[str, Mapping[str, Any]]], s: ConcreteState | None = None
    ) -> list[ConcreteState]:
        """States along a trace of (action, params), starting from ``s`` or Init."""
        states = [s if s is not None else self.init()]
        for name, params in trace:
            states.append(self.step(states[-1], name, params))
        return states


_STATES_KEPT = 1 << 12  # states whose answers a KeptMachine keeps (then all are forgotten)


class KeptMachine(Machine):
    """A :class:`Machine` that keeps its answers per state value: guard answers
    (``failed_conjuncts``, ``is_enabled``), successors (``step``) and, with ``memo``, the
    table's invariant violations.

    Each is a pure function of the state mapping and the parameters: a guard conjunct, an
    update or an invariant reads the state and the parameters only, and ``N`` and the constants
    are this machine's.  So an equal state gives equal answers, and a machine shared by many
    examples (the fuzzers make one per run) answers a state it has met from what it kept.  The
    fuzz walks revisit few states many times (the block ``ci`` run asks about 3227 state
    objects holding 317 distinct values: every example starts at Init, and Hypothesis'
    optimiser replays variations of one walk), and each state is asked about every input of
    every action.  Refusals (:class:`GuardError`) and errors are raised afresh, never kept.
    """

    def __init__(self, table: Table, N: int | None = None, *, memo: bool = False) -> None:
        super().__init__(table, N, memo=memo)
        # (N, the state's items) -> {("?", action, params' items): enabled,
        #   ("!", action, params' items): false conjuncts, ("violations",): violations, ...}
        self._answers: dict[tuple[Any, ...], dict[tuple[Any, ...], Any]] = {}
        self._succ: dict[tuple[Any, ...], tuple[dict[tuple[Any, ...], Any], ConcreteState]] = {}

    def answers_for(self, s: ConcreteState) -> dict[tuple[Any, ...], Any]:
        """What is kept about ``s``'s value (callers may keep their own pure answers there,
        under keys of their own).  The state object remembers it (``s._kept``), so its values
        are hashed once per state object and machine, not at every question."""
        held = s._kept
        if held is not None and held[0] is self:
            return held[1]  # type: ignore[no-any-return]
        key = (s.N, tuple(s._v.items()))
        got = self._answers.get(key)
        if got is None:
            if len(self._answers) >= _STATES_KEPT:
                self._answers.clear()  # states that hold theirs keep using them: still true
                self._succ.clear()
            got = self._answers[key] = {}
        s._kept = (self, got)
        return got

    def failed_conjuncts(
        self, s: ConcreteState, action: Action | str, params: Mapping[str, Any]
    ) -> list[str]:
        a = self.table.action(action) if isinstance(action, str) else action
        kept = self.answers_for(s)
        items = tuple(params.items())
        key = ("!", a.name, items)
        got = kept.get(key)
        if got is None:
            # an enabled guard has no false conjunct (is_enabled evaluated them all, true): a
            # step after the search's is_enabled does not evaluate the guard a second time
            got = kept[key] = (
                ()
                if kept.get(("?", a.name, items))
                else tuple(super().failed_conjuncts(s, a, params))
            )
        return list(got)

    def is_enabled(self, s: ConcreteState, action: Action | str, params: Mapping[str, Any]) -> bool:
        a = self.table.action(action) if isinstance(action, str) else action
        kept = self.answers_for(s)
        items = tuple(params.items())
        got = kept.get(("?", a.name, items))
        if got is None:
            failed = kept.get(("!", a.name, items))
            got = kept["?", a.name, items] = (
                super().is_enabled(s, a, params) if failed is None else not failed
            )
        return bool(got)

    def step(
        self, s: ConcreteState, action: Action | str, params: Mapping[str, Any]
    ) -> ConcreteState:
        """The successor, kept per (state value, action, parameters); the same successor object
        then lets the kept answers, and the invariant memo's identity check, hit at once."""
        a = self.table.action(action) if isinstance(action, str) else action
        kept = self.answers_for(s)
        # the entry holds the kept dict itself: while it is there, no other dict has its id,
        # so the id names this state value
        key = (id(kept), a.name, tuple(params.items()))
        got = self._succ.get(key)
        if got is None:
            got = (kept, super().step(s, a, params))
            if len(self._succ) >= 8 * _STATES_KEPT:
                self._succ.clear()
            self._succ[key] = got
        return got[1]

    def violations(
        self, s: ConcreteState, invariants: list[Invariant] | None = None
    ) -> list[Violation]:
        if invariants is not None or self._memo is None:
            return super().violations(s, invariants)
        kept = self.answers_for(s)
        got = kept.get(("violations",))
        if got is None:
            got = kept["violations",] = tuple(super().violations(s))
        return list(got)
