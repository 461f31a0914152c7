"""Load-time validation of a transition table.

Structural checks (names resolve, updates inside ``modifies``, request-scoped updates only in
request actions) run first; then every guard, update and invariant is evaluated once on a probe
state that visits every per-block body, so a misspelt variable, a guard that returns an int or
an update of the wrong type is reported with the action's name before anything runs.
"""

from __future__ import annotations

import keyword
from typing import Any, Protocol

from .errors import SpecError
from .parts import Action, Completeness, Consts, Invariant, ParamKind, ReadSafety, Scope, Var
from .state import ConcreteState, ProbeState, RecordingState, initial_state


class Table(Protocol):
    """What validation reads of a :class:`kvstate.spec.table.Table` (that module validates
    every table it builds, so this one names the shape it reads instead of importing it)."""

    @property
    def name(self) -> str: ...
    @property
    def vars(self) -> tuple[Var, ...]: ...
    @property
    def actions(self) -> tuple[Action, ...]: ...
    @property
    def invariants(self) -> tuple[Invariant, ...]: ...
    @property
    def reads(self) -> tuple[ReadSafety, ...]: ...
    @property
    def completeness(self) -> Completeness | None: ...
    @property
    def consts(self) -> Consts: ...
    def action(self, name: str) -> Action: ...


class _P:
    """Probe parameters: one representative value per parameter kind."""

    def __init__(self, a: Action, L: int) -> None:
        sample = {
            ParamKind.BLOCK: 0,
            ParamKind.REQ: 0,
            ParamKind.TOKENS: L,
            ParamKind.ADDR: 1,
            ParamKind.TICKS: 1,
            ParamKind.FMT: 0,
        }
        for p in a.params:
            setattr(self, p.name, sample[p.kind])


def _check_value(var: Var, value: Any, N: int, where: str) -> None:
    def scalar_ok(x: Any) -> bool:
        if var.is_bool:
            return isinstance(x, bool)
        if isinstance(x, bool) or not isinstance(x, int):
            return False
        if var.domain is not None:
            return int(x) in {int(m) for m in var.domain}
        return True

    kind = "bool" if var.is_bool else (var.domain.__name__ if var.domain else "int")
    if var.scope in (Scope.BLOCK, Scope.REQ_BLOCK):
        if not isinstance(value, tuple) or len(value) != N:
            raise SpecError(
                f"{where}: update of per-block variable {var.name!r} must be a whole array "
                f"(use store()/array()), got {type(value).__name__}"
            )
        bad = [x for x in value if not scalar_ok(x)]
        if bad:
            raise SpecError(
                f"{where}: update of {var.name!r} has an element {bad[0]!r} that is not a {kind}"
            )
    elif not scalar_ok(value):
        raise SpecError(
            f"{where}: update of {var.name!r} gives {value!r} ({type(value).__name__}), not a {kind}"
        )


# What the state mapping itself answers (``s.N``, ``s.k``, ``s.req(r)``, ...): a variable of that
# name could never be read (and would shadow the method in the state's instance dictionary).
# Read off the class, so a new method reserves its name without a second list to keep.
RESERVED_NAMES = frozenset(n for n in dir(ConcreteState) if not n.startswith("_"))


def _check_name(what: str, name: Any, *, dotted: bool = False) -> None:
    """Names become attribute reads and parts of generated identifiers (spec/compile.py), so each
    must be a Python identifier (dotted: each part) that is no keyword and no private name."""
    parts = name.split(".") if dotted and isinstance(name, str) else [name]
    if not all(
        isinstance(x, str) and x.isidentifier() and not keyword.iskeyword(x) and x[:1] != "_"
        for x in parts
    ):
        raise SpecError(f"{what} name {name!r} is not a public Python identifier")


def validate_table(t: Table) -> None:
    for v in t.vars:
        _check_name("variable", v.name)
        if v.name in RESERVED_NAMES:
            raise SpecError(f"variable name {v.name!r} is reserved by the state mapping")
    for a in t.actions:
        _check_name("action", a.name)
        for p in a.params:
            _check_name(f"action {a.name!r}: parameter", p.name)
        for c in a.guard:
            _check_name(f"action {a.name!r}: guard conjunct", c.name, dotted=True)
    names = [v.name for v in t.vars]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise SpecError(f"table {t.name!r}: duplicate variables {sorted(dup)}")
    anames = [a.name for a in t.actions]
    dup = {n for n in anames if anames.count(n) > 1}
    if dup:
        raise SpecError(f"table {t.name!r}: duplicate actions {sorted(dup)}")
    by_name = {v.name: v for v in t.vars}
    for a in t.actions:
        for m in a.modifies:
            if m not in by_name:
                raise SpecError(f"action {a.name!r}: modifies unknown variable {m!r}")
        for u in a.updates:
            if u not in by_name:
                raise SpecError(f"action {a.name!r}: updates unknown variable {u!r}")
            if u not in a.modifies:
                raise SpecError(
                    f"action {a.name!r}: updates {u!r} outside its modifies frame {sorted(a.modifies)}"
                )
            if by_name[u].scope in (Scope.REQ, Scope.REQ_BLOCK) and not a.request_scoped:
                raise SpecError(
                    f"action {a.name!r}: updates per-request {u!r} but has no request parameter"
                )
        if not a.guard:
            raise SpecError(f"action {a.name!r}: a guard needs at least one conjunct")
        cn = [c.name for c in a.guard]
        if len(set(cn)) != len(cn):
            raise SpecError(f"action {a.name!r}: duplicate guard conjunct names {cn}")
        pn = [p.name for p in a.params]
        if len(set(pn)) != len(pn):
            raise SpecError(f"action {a.name!r}: duplicate parameter names {pn}")
        if sum(1 for p in a.params if p.kind is ParamKind.REQ) > 1:
            raise SpecError(f"action {a.name!r}: at most one request parameter")
    inames = [i.name for i in t.invariants]
    if len(set(inames)) != len(inames):
        raise SpecError(f"table {t.name!r}: duplicate invariant names")
    _probe(t, by_name)
    _check_ghosts(t)
    _check_reads(t)


def _check_reads(t: Table) -> None:
    """Read-safety properties and the completeness rule name real actions and evaluate."""
    anames = {a.name for a in t.actions}
    s = initial_state(t, 2, ProbeState)
    for rs in t.reads:
        if rs.action not in anames:
            raise SpecError(f"read safety {rs.name!r}: unknown action {rs.action!r}")
        a = t.action(rs.action)
        p = _P(a, t.consts.L)
        try:
            vals = [rs.scalar(s, p)] if rs.scalar is not None else []
            vals += [rs.per_block(s, p, b) for b in range(2)] if rs.per_block is not None else []
        except Exception as exc:  # noqa: BLE001
            raise SpecError(f"read safety {rs.name!r}: {exc}") from exc
        if any(not isinstance(v, bool) for v in vals):
            raise SpecError(f"read safety {rs.name!r}: does not return a bool")
    c = t.completeness
    if c is not None:
        for name in (*c.write_path, *c.disturbing, *c.read_path):
            if name not in anames:
                raise SpecError(f"completeness: unknown action {name!r}")
        try:
            v = c.stored(s, 1)
        except Exception as exc:  # noqa: BLE001
            raise SpecError(f"completeness: stored() failed: {exc}") from exc
        if not isinstance(v, bool):
            raise SpecError("completeness: stored() does not return a bool")


def _check_ghosts(t: Table) -> None:
    """Ghost variables record the truth for the properties: no guard, and no update of a
    mechanism variable, may read one (the implementation has no ghosts to read)."""
    ghosts = {v.name for v in t.vars if v.ghost}
    if not ghosts:
        return
    for a in t.actions:
        p = _P(a, t.consts.L)
        parts = [(f"guard conjunct {c.name!r}", c.fn) for c in a.guard]
        parts += [(f"update of {u!r}", fn) for u, fn in a.updates.items() if u not in ghosts]
        for what, fn in parts:
            s = initial_state(t, 2, RecordingState)
            assert isinstance(s, RecordingState)
            fn(s, p)
            bad = s._reads & ghosts
            if bad:
                raise SpecError(
                    f"action {a.name!r}: {what} reads ghost variable(s) {sorted(bad)}; ghosts "
                    "are for properties only (guards and mechanism updates must not read them)"
                )


def _probe(t: Table, by_name: dict[str, Var]) -> None:
    N = 2
    try:
        s = initial_state(t, N, ProbeState)
        for v in t.vars:
            _check_value(
                v,
                s._v[v.name]
                if v.scope is not Scope.REQ and v.scope is not Scope.REQ_BLOCK
                else s._v[v.name][0],
                N,
                f"variable {v.name!r} init",
            )
    except SpecError:
        raise
    except Exception as exc:  # noqa: BLE001 - any failure of user callables is a spec error
        raise SpecError(f"table {t.name!r}: evaluating initial values failed: {exc}") from exc
    for a in t.actions:
        p = _P(a, t.consts.L)
        for c in a.guard:
            try:
                g = c.fn(s, p)
            except Exception as exc:  # noqa: BLE001
                raise SpecError(
                    f"action {a.name!r}: guard conjunct {c.name!r} failed: {exc}"
                ) from exc
            if not isinstance(g, bool):
                raise SpecError(
                    f"action {a.name!r}: guard conjunct {c.name!r} returned "
                    f"{type(g).__name__} {g!r}, not a bool"
                )
        for u, fn in a.updates.items():
            try:
                val = fn(s, p)
            except Exception as exc:  # noqa: BLE001
                raise SpecError(f"action {a.name!r}: update of {u!r} failed: {exc}") from exc
            _check_value(by_name[u], val, N, f"action {a.name!r}")
    for inv in t.invariants:
        rs = range(t.consts.R) if inv.per_request else [None]
        for r in rs:
            args: tuple[Any, ...] = (s,) if r is None else (s, r)
            try:
                if inv.scalar is not None:
                    v = inv.scalar(*args)
                    if not isinstance(v, bool):
                        raise TypeError(f"scalar part returned {type(v).__name__}")
                if inv.per_block is not None:
                    for b in range(N):
                        v = inv.per_block(*args, b)
                        if not isinstance(v, bool):
                            raise TypeError(f"per-block part returned {type(v).__name__}")
            except Exception as exc:  # noqa: BLE001
                raise SpecError(f"invariant {inv.name!r}: {exc}") from exc
