"""A table's content digest: what the witness cache and ``kvstate mutate``'s session store key on.

Two tables with the same name may differ (a user's spec named ``default``, a geometry swapped
by ``--geometry``, a derived table that keeps its parent's name), and the same table may be
reached under several names (``default`` and ``small``).  So a cache keyed by name mixes up
tables; one keyed by content does not.  The content is what the proofs read: the geometry, the
declarations (names, scopes, domains, flags), and every callable (each variable's Init, each
guard conjunct, each update, each invariant, each read-safety property) evaluated on a
symbolic state of two blocks, the same way the bounded model checker evaluates it, and
printed by Z3.  Formatting, comments and local names in the spec's source do not change the
digest; a changed term does.  Declarations the proofs read only as data (coverage goals,
locality, completeness, recovery, equivalence arguments) enter by their structure, their own
callables by their code.

Cost: about 0.1 s for the default table (``python -c 'from kvstate.proofs.digest import
table_digest; ...'``), memoized per table object.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import types
from collections.abc import Callable, Mapping
from typing import Any

import z3

from kvstate.spec.table import Table

_POOL = 2  # blocks of the symbolic state the callables are evaluated on
_MEMO: dict[int, tuple[Table, str]] = {}


def table_digest(table: Table) -> str:
    """The SHA-256 (hex) of ``table``'s content (see the module's docstring)."""
    hit = _MEMO.get(id(table))
    if hit is not None and hit[0] is table:
        return hit[1]
    h = hashlib.sha256()
    for part in _parts(table):
        h.update(part.encode())
        h.update(b"\x00")
    digest = h.hexdigest()
    if len(_MEMO) > 256:
        _MEMO.clear()
    _MEMO[id(table)] = (table, digest)
    return digest


def _term(x: Any) -> str:
    from kvstate.model.symbolic import Vec

    if isinstance(x, Vec):
        return "[" + ",".join(_term(i) for i in x.items) + "]"
    if isinstance(x, (list, tuple)):
        return "[" + ",".join(_term(i) for i in x) + "]"
    if isinstance(x, z3.ExprRef):
        return x.sexpr()
    return repr(x)


def _guarded(fn: Callable[..., Any], *args: Any) -> str:
    """``fn(*args)``'s terms, or what it raises (part of its content too)."""
    try:
        return _term(fn(*args))
    except Exception as exc:  # noqa: BLE001
        return f"raises {type(exc).__name__}: {exc}"


def _blocks(fn: Callable[..., Any], *args: Any) -> list[Any]:
    """A per-block callable at every block of the symbolic pool."""
    return [fn(*args, z3.IntVal(b)) for b in range(_POOL)]


def _parts(table: Table) -> list[str]:
    from kvstate.model.symbolic import bind, fresh_params, fresh_state, instances, post

    k = table.consts
    out = [f"geometry {_structure(table.geometry)}", f"consts {_structure(k)}"]
    for v in table.vars:
        dom = None if v.domain is None else [(m.name, int(m)) for m in v.domain]
        init = _guarded(v.init, k, z3.Int("N"), z3.Int("b"))
        out.append(
            f"var {v.name} {v.scope.name} {dom} bool={v.is_bool} nonneg={v.nonneg} "
            f"ghost={v.ghost} address={v.address} init={init}"
        )
    s = fresh_state(table, "s.", _POOL)
    params = fresh_params(table, "p.", _POOL)
    for inst in instances(table):
        a = inst.action
        p = bind(inst, params)
        out.append(
            f"action {inst.label} {a.component} params={[(q.name, q.kind.name) for q in a.params]} "
            f"modifies={sorted(a.modifies)}"
        )
        for c in a.guard:
            out.append(f"guard {inst.label}.{c.name} " + _guarded(c.fn, s, p))
        out.append(
            f"post {inst.label} " + _guarded(lambda i, q: sorted(post(s, i, q).items()), inst, p)
        )
    for inv in table.invariants:
        out.append(
            f"invariant {inv.name} {inv.kind} per_request={inv.per_request} bounded={inv.bounded} "
            f"protected_by={inv.protected_by} tight={inv.tight}"
        )
        for r in range(k.R) if inv.per_request else [None]:
            args: tuple[Any, ...] = (s,) if r is None else (s, r)
            if inv.scalar is not None:
                out.append(f"  scalar {r} " + _guarded(inv.scalar, *args))
            if inv.per_block is not None:
                out.append(f"  per_block {r} " + _guarded(_blocks, inv.per_block, *args))
    for rs in table.reads:
        for inst in instances(table, [table.action(rs.action)]):
            p = bind(inst, params)
            out.append(f"reads {inst.label}.{rs.name} " + _structure(rs, skip_callables=True))
            if rs.scalar is not None:
                out.append("  scalar " + _guarded(rs.scalar, s, p))
            if rs.per_block is not None:
                out.append("  per_block " + _guarded(_blocks, rs.per_block, s, p))
    out.append(f"hit_rule {_structure(table.hit_rule)}")
    out.append(f"equivalent {sorted(table.equivalent.items())}")
    out.append(f"completeness {_structure(table.completeness)}")
    out.append(f"locality {_structure(table.locality)}")
    out.append(f"recovery {_structure(table.recovery)}")
    out.append(f"coverage {_structure(table.coverage)}")
    return out


def _code(fn: types.FunctionType) -> str:
    """A function by its code: bytecode, constants, names, and what its closure holds."""
    co = fn.__code__
    consts = [_code_const(c) for c in co.co_consts]
    cells = [_structure(c.cell_contents) for c in fn.__closure__ or ()]
    h = hashlib.sha256(co.co_code + repr((consts, co.co_names, cells)).encode())
    return f"<fn {fn.__qualname__} {h.hexdigest()[:16]}>"


def _code_const(c: Any) -> str:
    if isinstance(c, types.CodeType):
        inner = repr([_code_const(x) for x in c.co_consts]).encode()
        return hashlib.sha256(c.co_code + inner).hexdigest()[:16]
    if isinstance(c, frozenset):  # ``x in {...}``: its order is the hash seed's
        return repr(sorted(map(repr, c)))
    return repr(c)


def _structure(x: Any, *, skip_callables: bool = False, depth: int = 0) -> str:
    """A deterministic description of declaration data (dataclasses, enums, containers)."""
    if depth > 12:
        return "..."
    if isinstance(x, enum.Enum):
        return f"{type(x).__name__}.{x.name}"
    if isinstance(x, (str, int, float, bool, type(None))):
        return repr(x)
    if isinstance(x, Table):
        return f"<table {x.name}>"
    if isinstance(x, types.FunctionType):
        return "<fn>" if skip_callables else _code(x)
    if isinstance(x, type):
        return f"<type {x.__qualname__}>"
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        fields = ", ".join(
            f"{f.name}={_structure(getattr(x, f.name), skip_callables=skip_callables, depth=depth + 1)}"
            for f in dataclasses.fields(x)
        )
        return f"{type(x).__name__}({fields})"
    if isinstance(x, Mapping):
        items = sorted(
            (
                _structure(k, depth=depth + 1),
                _structure(v, skip_callables=skip_callables, depth=depth + 1),
            )
            for k, v in x.items()
        )
        return "{" + ", ".join(f"{k}: {v}" for k, v in items) + "}"
    if isinstance(x, (list, tuple, frozenset, set)):
        elems = [_structure(i, skip_callables=skip_callables, depth=depth + 1) for i in x]
        if isinstance(x, (frozenset, set)):
            elems.sort()
        return "[" + ", ".join(elems) + "]"
    if callable(x):
        return f"<callable {getattr(x, '__qualname__', type(x).__qualname__)}>"
    return f"<{type(x).__qualname__}>"
