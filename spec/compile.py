"""Compile the hit rule's predicates to straight-line Python, from their Z3 terms.

The implementation runs the hit rule on every admission, and the table's callables are written
once for two readers (Python values and Z3 terms), so concretely each one costs several nested
calls (``AND``, ``IN``, a lambda per rule, a view attribute).  Compiling does not restate them:
each predicate is *evaluated on symbolic inputs* -- exactly what the prover does -- and the Z3
term it returns is translated operator by operator into a Python expression over plain columns.
The generated source is kept on the result (``.source``) for inspection, and
``tests/spec/test_spec_compile.py`` checks compiled and interpreted forms agree on random states.

Only the operators below are translated; a predicate that produces anything else raises
:class:`CompileError`, and callers keep the interpreted callable for it (explicitly, not
silently: :class:`CompiledHitRule` lists what it compiled).  Z3's integer ``div``/``mod`` are
Euclidean; they equal Python's ``//``/``%`` for the positive constant divisors the table uses,
and any other divisor is refused.
"""

from __future__ import annotations

import itertools
import linecache
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import z3

from .layers import HitRule, Rule, RuleScope, scope_range
from .table import Scope, Table


class CompileError(ValueError):
    """A predicate's Z3 term uses an operator the translator does not handle."""


# Hygiene.  Every name in generated code is in exactly one of these disjoint namespaces, so no
# table -- whatever its variables are called -- can shadow a generated local, a builtin the code
# calls (``all``, ``range``, ``max``, ``min``) or another table name:
#   t_<var>    a block or global variable of the table (``TABLE_PREFIX``)
#   r<n>_<var> a field of request n;   p_<param> an action parameter
#   R, R_t_<var>, Rb, M, N             the chain's record ids, a group's own ids, columns, pool size
#   anything else (h, b, v, r, p, fail, cuts, q0, ...) is the generator's own
# (names are checked to be identifiers that are no keyword when a table is validated).
TABLE_PREFIX = "t_"


def _table_name(n: str) -> str | None:
    """The table variable a generated name stands for, or None."""
    return n[len(TABLE_PREFIX) :] if n.startswith(TABLE_PREFIX) else None


_BIN = {
    z3.Z3_OP_LE: "<=",
    z3.Z3_OP_LT: "<",
    z3.Z3_OP_GE: ">=",
    z3.Z3_OP_GT: ">",
    z3.Z3_OP_EQ: "==",
}
_NARY = {z3.Z3_OP_ADD: " + ", z3.Z3_OP_SUB: " - ", z3.Z3_OP_MUL: " * "}


class _Req:
    def __init__(self, r: int, table: Table) -> None:
        self._r = r
        self._table = table

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        v = self._table.var(name)
        if v.scope is Scope.REQ_BLOCK:
            return z3.Array(f"r{self._r}_{name}", z3.IntSort(), z3.IntSort())
        return z3.Int(f"r{self._r}_{name}")


class _TraceState:
    """The table's state shape with every variable a fresh Z3 constant (``s.k`` stays concrete:
    the geometry is fixed when an implementation is built)."""

    def __init__(self, table: Table, k: Any) -> None:
        self._table = table
        self.k = k
        self.N = z3.Int("N")
        self._quants: dict[str, tuple[Any, Any, z3.ExprRef, z3.ExprRef]] = {}

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        v = self._table.var(name)
        if v.scope is Scope.BLOCK:
            return z3.Array(TABLE_PREFIX + name, z3.IntSort(), z3.IntSort())
        if v.scope is Scope.GLOBAL:
            return z3.Int(TABLE_PREFIX + name)
        raise CompileError(f"variable {name!r} is per request: read it through s.req(r)")

    def req(self, r: int) -> _Req:
        return _Req(r, self._table)

    def forall_blocks(self, lo: Any, hi: Any, body: Callable[[Any], Any]) -> Any:
        """A fresh boolean standing for the quantifier; :func:`to_python` expands it into an
        ``all(...)`` over the same range the concrete states loop over."""
        n = len(self._quants)
        q = z3.Int(f"q{n}")
        t = body(q)
        if isinstance(t, bool):
            t = z3.BoolVal(t)
        self._quants[f"forall{n}"] = (lo, hi, q, t)
        return z3.Bool(f"forall{n}")


Quants = dict[str, tuple[Any, Any, z3.ExprRef, z3.ExprRef]]


Via = Callable[[str], "str | None"]


def _operand(x: Any, names: set[str], quants: Quants, via: Via | None = None) -> str:
    if isinstance(x, bool):
        return str(x)
    if isinstance(x, int):
        return str(int(x))
    return to_python(x, names, quants, via)


def to_python(
    e: z3.ExprRef, names: set[str], quants: Quants | None = None, via: Via | None = None
) -> str:
    """A Python expression equal to ``e``; the free constants' names are added to ``names``
    (arrays are read as ``name[index]``; a quantifier placeholder of ``quants`` becomes an
    ``all(...)`` over ``range(max(lo, 0), min(hi, N))``, as concrete states loop).

    ``via(array)`` names an index array to read ``array`` through (``array[via[index]]``), or
    None: the *direct* form, where block columns are the implementation's live record-indexed
    lists and the chain's record ids map block positions to records."""
    quants = quants or {}
    if z3.is_const(e) and e.decl().name() in quants:
        lo, hi, q, body = quants[e.decl().name()]
        inner: set[str] = set()
        src = to_python(body, inner, quants, via)
        qn = q.decl().name()
        names.update(inner - {qn})
        names.add("N")
        lo_s, hi_s = _operand(lo, names, quants, via), _operand(hi, names, quants, via)
        return f"all({src} for {qn} in range(max({lo_s}, 0), min({hi_s}, N)))"
    if z3.is_true(e):
        return "True"
    if z3.is_false(e):
        return "False"
    if z3.is_int_value(e):
        return str(e.as_long())
    if z3.is_const(e) and e.decl().kind() == z3.Z3_OP_UNINTERPRETED:
        names.add(e.decl().name())
        return e.decl().name()
    if not z3.is_app(e):
        raise CompileError(f"cannot translate {e}")
    op = e.decl().kind()
    args = [to_python(a, names, quants, via) for a in e.children()]
    if op == z3.Z3_OP_SELECT:
        arr = e.arg(0)
        if not (z3.is_const(arr) and arr.decl().kind() == z3.Z3_OP_UNINTERPRETED):
            raise CompileError(f"cannot translate a read of a computed array: {e}")
        through = via(arr.decl().name()) if via is not None else None
        if through is not None:
            names.add(through)
            return f"{args[0]}[{through}[{args[1]}]]"
        return f"{args[0]}[{args[1]}]"
    if op == z3.Z3_OP_AND:
        return "(" + " and ".join(args) + ")" if args else "True"
    if op == z3.Z3_OP_OR:
        return "(" + " or ".join(args) + ")" if args else "False"
    if op == z3.Z3_OP_NOT:
        return f"(not {args[0]})"
    if op == z3.Z3_OP_IMPLIES:
        return f"((not {args[0]}) or {args[1]})"
    if op == z3.Z3_OP_ITE:
        return f"({args[1]} if {args[0]} else {args[2]})"
    if op == z3.Z3_OP_DISTINCT:
        if len(args) != 2:
            raise CompileError(f"cannot translate an n-ary distinct: {e}")
        return f"({args[0]} != {args[1]})"
    if op in _BIN:
        return f"({args[0]} {_BIN[op]} {args[1]})"
    if op in _NARY:
        return "(" + _NARY[op].join(args) + ")"
    if op == z3.Z3_OP_UMINUS:
        return f"(-{args[0]})"
    if op in (z3.Z3_OP_IDIV, z3.Z3_OP_MOD):
        d = e.arg(1)
        if not (z3.is_int_value(d) and d.as_long() > 0):
            raise CompileError(f"only positive constant divisors are translated: {e}")
        return f"({args[0]} {'//' if op == z3.Z3_OP_IDIV else '%'} {args[1]})"
    raise CompileError(f"no translation for {e.decl()} in {e}")


@dataclass(frozen=True)
class CompiledPredicate:
    """``fn(s, r, x)``-equivalent over plain values: ``fn(view, r, x)`` reads the view's columns
    (``s.ckv``) and request fields once per call."""

    rule: Rule
    source: str
    fn: Callable[[Any, int, int], bool]


@dataclass(frozen=True)
class CompiledHitRule:
    """The block-scoped ALL rules fused into one first-failing-block scan, and each rule alone."""

    all_rules: tuple[Rule, ...]
    first_bad: Callable[[Any, int, int, int], int] | None  # (view, r, lo, hi) -> block or -1
    first_bad_source: str
    rules: dict[str, CompiledPredicate]  # qualname -> compiled (those that compiled)
    skipped: dict[str, str]  # qualname -> why it stays interpreted
    # every rule that is not of scope ALL, over its own scope range, at a hit of ``h`` tokens:
    # ``(view, r, h) -> bool`` (the search's accept test at each candidate length)
    points_hold: Callable[[Any, int, int], bool] | None = None
    points_hold_source: str = ""
    # the same two in the direct form (``_Traced.direct``), for views whose columns are the
    # implementation's live record-indexed lists (``v._m``, ``v._rids``, ``v.rids_of``)
    first_bad_direct: Callable[[Any, int, int, int], int] | None = None
    points_hold_direct: Callable[[Any, int, int], bool] | None = None
    direct_sources: tuple[str, str] = ("", "")
    rules_direct: dict[str, Callable[[Any, int, int], bool]] = field(default_factory=dict)
    # the whole search in one function (see ``_search_function``), plain and direct forms
    search: Callable[[Any, int, int], Any] | None = None
    search_direct: Callable[[Any, int, int], Any] | None = None
    search_sources: tuple[str, str] = ("", "")
    # the table variables the rules read (request fields by field name), off their Z3 terms;
    # None when a rule did not compile (its reads are unknown).  An action whose frame misses
    # this set cannot change any rule's value.
    reads: frozenset[str] | None = None


def term_reads(t: z3.ExprRef) -> frozenset[str]:
    """The table variables a traced term reads: block columns and scalars by name, request
    fields (of any request) by field name.  Parameters, bound variables and ``N`` are not
    variables of the table.  The one read-set analysis: guards and rules alike."""
    out: set[str] = set()
    todo = [t]
    seen: set[int] = set()
    while todo:
        e = todo.pop()
        if e.get_id() in seen:
            continue
        seen.add(e.get_id())
        if z3.is_const(e) and e.decl().kind() == z3.Z3_OP_UNINTERPRETED:
            n = e.decl().name()
            name = _table_name(n)
            if name is not None:
                out.add(name)
            elif (m := _REQ_NAME.match(n)) is not None:
                out.add(n[m.end() :])
            continue
        todo.extend(e.children())
    return frozenset(out)


def _trace(
    what: str, call: Callable[[_TraceState], Any], table: Table, k: Any
) -> tuple[str, set[str]]:
    """Evaluate ``call`` on a symbolic state and translate the term: (expression, free names)."""
    tr = _trace_with_locality(what, call, table, k)
    return tr.expr, tr.names


_REQ_NAME = re.compile(r"r(\d+)_")


def _locality(t: z3.ExprRef, quants: Quants) -> str:
    """What a term reads, as the narrowest of:

    - ``"global"``: only global scalars (``now``, ``graph``, ...) and parameters;
    - ``"block"``: that, plus block variables read at exactly the parameter ``p_b``;
    - ``"slot"``: only the acting request's own scalar fields (``r0_phase``) and parameters;
    - ``"chain"``: anything else (quantifiers, ``N``, other blocks, other requests).

    A ``global``/``block`` term evaluates the same on a state indexed by record id (with
    ``p_b`` the record id) as on a one-block view, and a ``slot`` term the same on any state
    whose ``req(0)`` is the request: that is what lets an implementation skip building views.
    """
    reads: set[str] = set()
    todo = [t]
    seen: set[int] = set()
    while todo:
        e = todo.pop()
        if e.get_id() in seen:
            continue
        seen.add(e.get_id())
        if z3.is_const(e):
            n = e.decl().name()
            if n in quants or n == "N":
                reads.add("chain")
            elif e.decl().kind() != z3.Z3_OP_UNINTERPRETED or n.startswith("p_"):
                pass
            elif (m := _REQ_NAME.match(n)) is not None:
                reads.add("slot" if m.group(1) == "0" else "chain")
            else:
                reads.add("global")
            continue
        if z3.is_app(e) and e.decl().kind() == z3.Z3_OP_SELECT:
            arr, idx = e.arg(0), e.arg(1)
            name = arr.decl().name() if z3.is_const(arr) else ""
            local = z3.is_const(idx) and idx.decl().name() == "p_b"
            reads.add("block" if local and not _REQ_NAME.match(name) else "chain")
            todo.append(idx)
            continue
        todo.extend(e.children())
    return _combine(reads)


@dataclass
class _Traced:
    """A traced term: its Python expression over view columns, free names and locality; and
    the term itself, to translate again in the direct form."""

    expr: str
    names: set[str]
    kind: str
    term: z3.ExprRef
    quants: Quants

    def direct(self, mapped: frozenset[str]) -> tuple[str, set[str]]:
        """The expression over the live record-indexed columns: block column ``X`` read at
        chain position ``i`` as ``X[R[i]]`` (``R`` the chain's record ids), or ``X[R_X[i]]`` for
        a column in ``mapped`` (read through its group's own block mapping)."""

        def via(arr: str) -> str | None:
            if _REQ_NAME.match(arr):
                return None
            return f"R_{arr}" if _table_name(arr) in mapped else "R"

        names: set[str] = set()
        return to_python(self.term, names, self.quants, via), names


def _trace_with_locality(
    what: str, call: Callable[[_TraceState], Any], table: Table, k: Any
) -> _Traced:
    s = _TraceState(table, k)
    try:
        t = call(s)
    except CompileError:
        raise
    except Exception as exc:  # noqa: BLE001 - a predicate that cannot be traced stays interpreted
        raise CompileError(f"{what}: {type(exc).__name__}: {exc}") from exc
    if isinstance(t, bool):
        t = z3.BoolVal(t)
    if not isinstance(t, z3.BoolRef):
        raise CompileError(f"{what} is not a boolean term")
    names: set[str] = set()
    expr = to_python(t, names, s._quants)
    kind = "chain" if s._quants else _locality(t, s._quants)
    return _Traced(expr, names, kind, t, dict(s._quants))


def _prelude(
    names: set[str],
    bound: set[str],
    req: Callable[[int], str],
    columns: frozenset[str] | None = None,
) -> list[str]:
    """Lines binding each free name: view columns and scalars from ``v``, request fields from
    ``v.req(...)``, action parameters (``p_b``) from the dict ``p``.  In the direct form
    (``columns``: the block variables) columns are the live lists ``v._m.X``, ``R`` the chain's
    record ids ``v._rids`` and ``R_X`` those of a mapped column, ``v.rids_of("X")``."""
    lines = []
    if columns is not None and any(_table_name(n) in columns for n in names):
        lines.append("M = v._m")
    for n in sorted(names - bound):
        head, _, field_ = n.partition("_")
        var = _table_name(n)
        if var is not None:
            src = "M" if columns is not None and var in columns else "v"
            lines.append(f"{n} = {src}.{var}")
        elif columns is not None and n == "R":
            lines.append("R = v._rids")
        elif columns is not None and head == "R" and _table_name(field_) is not None:
            lines.append(f"{n} = v.rids_of({_table_name(field_)!r})")
        elif n == "N":
            lines.append("N = v.N")
        elif head == "p" and field_:
            lines.append(f"{n} = p[{field_!r}]")
        elif head[:1] == "r" and head[1:].isdigit() and field_:
            lines.append(f"{n} = v.req({req(int(head[1:]))}).{field_}")
        else:
            raise CompileError(f"generated code reads an unknown name {n!r}")
    return lines


_MEMO: dict[tuple[Any, ...], tuple[tuple[Any, ...], Any]] = {}
_MEMO_SIZE = 16


def _memo(kind: str, args: tuple[Any, ...], build: Callable[..., Any]) -> Any:
    """Compiling costs ~0.1 s and every cache object (the fuzzer makes one per example) asks
    again for the same table: results are kept per (kind, identity of the table objects, k).
    The key holds the arguments themselves, so an id is never reused while it is cached."""
    key = (kind, *(id(a) for a in args[:-1]), args[-1])
    hit = _MEMO.get(key)
    if hit is not None and all(x is y for x, y in zip(hit[0], args[:-1], strict=True)):
        return hit[1]
    out = build(*args)
    if len(_MEMO) >= _MEMO_SIZE:
        _MEMO.pop(next(iter(_MEMO)))
    _MEMO[key] = (args[:-1], out)
    return out


_R_AT_B = re.compile(r"(?<![\w.])R\[b\]")  # the chain's record id of block b, not X_R[b]
_DEFINED = itertools.count()


def _define(name: str, src: str) -> Callable[..., Any]:
    """Run one generated function's source; it is registered with ``linecache`` under a unique
    file name, so tracebacks, ``inspect.getsource`` and profilers show the generated lines."""
    filename = f"<kvstate.spec.compile:{name}#{next(_DEFINED)}>"
    lines = src.splitlines(keepends=True)
    linecache.cache[filename] = (len(src), None, lines, filename)
    scope: dict[str, Any] = {}
    exec(compile(src, filename, "exec"), scope)  # noqa: S102
    fn: Callable[..., Any] = scope[name]
    return fn


def compile_hit_rule(
    hit_rule: HitRule, table: Table, k: Any, mapped: frozenset[str] = frozenset()
) -> CompiledHitRule:
    """``mapped``: block columns an implementation reads through a group's own block mapping
    (see :meth:`_Traced.direct`); it only shapes the direct forms."""
    return _memo("hit", (hit_rule, table, (k, mapped)), _compile_hit_rule)


def _block_columns(table: Table) -> frozenset[str]:
    return frozenset(v.name for v in table.vars if v.scope is Scope.BLOCK and not v.ghost)


def _compile_hit_rule(hit_rule: HitRule, table: Table, km: tuple[Any, Any]) -> CompiledHitRule:
    """Compile what can be compiled; the rest is listed in ``skipped`` with the reason."""
    k, mapped = km
    columns = _block_columns(table)
    rules: dict[str, CompiledPredicate] = {}
    rules_direct: dict[str, Callable[[Any, int, int], bool]] = {}
    skipped: dict[str, str] = {}
    traced: dict[str, _Traced] = {}
    reads: set[str] = set()
    acting = lambda i: "r" if i == 0 else str(i)  # noqa: E731 - r0 is the request asked about
    for rule in hit_rule.rules:
        x = "h" if rule.scope is RuleScope.HIT else "b"
        try:
            tr = _trace_with_locality(
                rule.qualname,
                lambda s: rule.pred(s, 0, z3.Int(x)),  # noqa: B023
                table,
                k,
            )
        except CompileError as exc:
            skipped[rule.qualname] = str(exc)
            continue
        traced[rule.qualname] = tr
        reads |= term_reads(tr.term)
        pre = _prelude(tr.names, {x}, acting)
        fname = "pred_" + rule.qualname.replace(".", "_")
        body = "".join(f"    {ln}\n" for ln in pre)
        src = f"def {fname}(v, r, {x}):\n{body}    return {tr.expr}\n"
        rules[rule.qualname] = CompiledPredicate(rule, src, _define(fname, src))
        dexpr, dnames = tr.direct(mapped)
        dbody = "".join(f"    {ln}\n" for ln in _prelude(dnames, {x}, acting, columns))
        dsrc = f"def {fname}_direct(v, r, {x}):\n{dbody}    return {dexpr}\n"
        rules_direct[rule.qualname] = _define(fname + "_direct", dsrc)
    all_rules = tuple(r for r in hit_rule.rules if r.scope is RuleScope.ALL)
    scans: dict[bool, tuple[Any, str]] = {}
    if all_rules and all(r.qualname in traced for r in all_rules):
        for direct in (False, True):
            parts = [
                traced[r.qualname].direct(mapped)
                if direct
                else (traced[r.qualname].expr, traced[r.qualname].names)
                for r in all_rules
            ]
            names = set().union(*(n for _, n in parts))
            pre = _prelude(names, {"b"}, acting, columns if direct else None)
            cond = " and ".join(e for e, _ in parts)
            body = "".join(f"    {ln}\n" for ln in pre)
            fname = "first_bad_direct" if direct else "first_bad"
            src = (
                f"def {fname}(v, r, lo, hi):\n{body}"
                f"    for b in range(lo, hi):\n"
                f"        if not ({cond}):\n"
                f"            return b\n"
                f"    return -1\n"
            )
            scans[direct] = (_define(fname, src), src)
    points = tuple(r for r in hit_rule.rules if r.scope is not RuleScope.ALL)
    holds: dict[bool, tuple[Any, str]] = {}
    if points and all(r.qualname in traced for r in points):
        try:
            ptr = _trace_with_locality(
                "point rules",
                lambda s: z3.And(
                    *[z3.BoolVal(True)]
                    + [_as_bool(hit_rule.rule_holds(x, s, 0, z3.Int("h"))) for x in points]
                ),
                table,
                k,
            )
        except CompileError as exc:
            skipped["<point rules>"] = str(exc)
        else:
            for direct in (False, True):
                pexpr, pnames = ptr.direct(mapped) if direct else (ptr.expr, ptr.names)
                pre = _prelude(pnames, {"h"}, acting, columns if direct else None)
                body = "".join(f"    {ln}\n" for ln in pre)
                fname = "points_hold_direct" if direct else "points_hold"
                psrc = f"def {fname}(v, r, h):\n{body}    return {pexpr}\n"
                holds[direct] = (_define(fname, psrc), psrc)
    searches: dict[bool, tuple[Any, str]] = {}
    if len(traced) == len(hit_rule.rules):
        try:
            for direct in (False, True):
                searches[direct] = _search_function(
                    hit_rule, traced, table, k, columns if direct else None, mapped
                )
        except CompileError as exc:
            skipped["<search>"] = str(exc)
            searches.clear()
    none: tuple[Any, str] = (None, "")
    return CompiledHitRule(
        all_rules,
        scans.get(False, none)[0],
        scans.get(False, none)[1],
        rules,
        skipped,
        holds.get(False, none)[0],
        holds.get(False, none)[1],
        first_bad_direct=scans.get(True, none)[0],
        points_hold_direct=holds.get(True, none)[0],
        direct_sources=(scans.get(True, none)[1], holds.get(True, none)[1]),
        rules_direct=rules_direct,
        search=searches.get(False, none)[0],
        search_direct=searches.get(True, none)[0],
        search_sources=(searches.get(False, none)[1], searches.get(True, none)[1]),
        reads=None if any(r.qualname in skipped for r in hit_rule.rules) else frozenset(reads),
    )


def _search_function(
    hit_rule: HitRule,
    traced: dict[str, _Traced],
    table: Table,
    k: Any,
    columns: frozenset[str] | None,
    mapped: frozenset[str],
) -> tuple[Callable[[Any, int, int], Any], str]:
    """The coordinator's longest-hit search (``impl/coordinator.py``) as one function with every
    rule inlined: ``(view, r, h_max) -> (hit, cuts, rejected)``, ``cuts`` a list of
    ``(rule index, block or None, from, to)`` and ``rejected`` a ``(rule index, block)`` or None.

    Same algorithm, step for step: the ALL-scope rules scanned once over their range (every rule
    failing at the first bad block is recorded), then the other rules in table order at each
    candidate length, stepping down one LCM block per failure and merging consecutive cuts by
    the same rule.  ``tests/impl/test_impl_search.py`` checks it against the generic search."""
    L = k.L
    rules = hit_rule.rules
    names: set[str] = set()

    def cond(rule: Rule) -> str:
        tr = traced[rule.qualname]
        e, n = tr.direct(mapped) if columns is not None else (tr.expr, tr.names)
        names.update(n)
        return f"({e})"

    def scope(rule: Rule) -> tuple[str, str]:
        s = _TraceState(table, k)
        lo, hi = scope_range(rule, s, z3.Int("h"))
        return _operand(lo, names, {}), _operand(hi, names, {})

    def bind(indent: str, *exprs: str) -> tuple[list[str], list[str]]:
        """A loop body reading block ``b`` of the chain's records once (``Rb = R[b]``), where
        the direct forms read ``R[b]`` several times per block."""
        if not any(_R_AT_B.search(e) for e in exprs):
            return [], list(exprs)
        return [f"{indent}Rb = R[b]"], [_R_AT_B.sub("Rb", e) for e in exprs]

    body: list[str] = ["h = h_max", "cuts = []"]
    alls = [(i, x) for i, x in enumerate(rules) if x.scope is RuleScope.ALL]
    if alls:
        lo, hi = scope(alls[0][1])
        names.add("N")
        first, (fused, each) = bind(
            "        ",
            " and ".join(cond(x) for _, x in alls),
            ", ".join(f"({i}, {cond(x)})" for i, x in alls),
        )
        body += [
            "if h > 0:",
            f"    for b in range(max({lo}, 0), min({hi}, N)):",
            *first,
            f"        if not ({fused}):",
            f"            for i in [i for i, ok in ({each},) if not ok]:",
            f"                cuts.append((i, b, h, b * {L}))",
            f"            h = b * {L}",
            "            break",
        ]
    body += ["while True:", "    fail = -1", "    where = None"]
    for j, x in enumerate(rules):
        if x.scope is RuleScope.ALL:
            continue
        if x.scope is RuleScope.HIT:
            body += [f"    if fail < 0 and not {cond(x)}:", f"        fail = {j}"]
            continue
        lo, hi = scope(x)
        names.add("N")
        first, (c,) = bind("            ", cond(x))
        body += [
            "    if fail < 0:",
            f"        for b in range(max({lo}, 0), min({hi}, N)):",
            *first,
            f"            if not {c}:",
            f"                fail = {j}",
            "                where = b",
            "                break",
        ]
    body += [
        "    if fail < 0:",
        "        return h, cuts, None",
        "    if h <= 0:",
        "        return 0, cuts, (fail, where)",
        f"    to = ((h - 1) // {L}) * {L}",
        "    if cuts and cuts[-1][0] == fail and cuts[-1][3] == h:",
        "        cuts[-1] = (fail, where, cuts[-1][2], to)",
        "    else:",
        "        cuts.append((fail, where, h, to))",
        "    h = to",
    ]
    acting = lambda i: "r" if i == 0 else str(i)  # noqa: E731
    pre = _prelude(names, {"b", "h", "h_max", "i", "ok", "Rb"}, acting, columns)
    fname = "search_direct" if columns is not None else "search"
    src = f"def {fname}(v, r, h_max):\n" + "".join(f"    {ln}\n" for ln in [*pre, *body])
    return _define(fname, src), src


def _as_bool(t: Any) -> Any:
    return z3.BoolVal(t) if isinstance(t, bool) else t


@dataclass(frozen=True)
class CompiledGuards:
    """Each action's guard conjuncts as ``fn(view, params)`` for the acting request ``r == 0``
    (how the implementation's views are laid out), ``params`` a dict of the action's parameters;
    a conjunct that did not compile keeps the table's callable (wrapped to take the dict) and is
    listed in ``skipped``.  ``fused[action]`` is the conjunction of all of them in one function,
    for the accept path, and ``fused_direct[action]`` the same in the direct form
    (:meth:`_Traced.direct`); both exist only when every conjunct compiled."""

    conjuncts: dict[str, tuple[tuple[str, Callable[[Any, dict[str, int]], bool]], ...]]
    sources: dict[tuple[str, str], str]
    skipped: dict[tuple[str, str], str]
    fused: dict[str, Callable[[Any, dict[str, int]], bool]] = field(default_factory=dict)
    fused_sources: dict[str, str] = field(default_factory=dict)
    fused_direct: dict[str, Callable[[Any, dict[str, int]], bool]] = field(default_factory=dict)
    # what each action's guard reads (see ``_locality``): "global", "block", "slot" or "chain";
    # absent for an action with a conjunct that did not compile
    locality: dict[str, str] = field(default_factory=dict)
    columns: frozenset[str] = frozenset()  # the table's block variables
    mapped: frozenset[str] = frozenset()
    _traced: dict[tuple[str, str], _Traced] = field(default_factory=dict)
    _subsets: dict[tuple[str, frozenset[str], bool], Any] = field(default_factory=dict)

    def locality_without(self, action: str, skip: frozenset[str]) -> str | None:
        """The locality of ``action``'s conjuncts not in ``skip`` (None: one did not compile)."""
        kinds = set()
        for n, _ in self.conjuncts[action]:
            if n in skip:
                continue
            tr = self._traced.get((action, n))
            if tr is None:
                return None
            kinds.add(tr.kind)
        return _combine(kinds)

    def fused_without(
        self, action: str, skip: frozenset[str], direct: bool = False
    ) -> Callable[[Any, dict[str, int]], bool] | None:
        """The conjunction of ``action``'s conjuncts not in ``skip``, in one function (None if
        one of them did not compile).  Made once per (action, skip, form)."""
        key = (action, skip, direct)
        if key not in self._subsets:
            names = [n for n, _ in self.conjuncts[action] if n not in skip]
            if all((action, n) in self._traced for n in names):
                trs = [self._traced[(action, n)] for n in names]
                fname = f"guard_{action}_subset".replace(".", "_")
                fn, _ = _fuse(fname, trs, self.columns if direct else None, self.mapped)
                self._subsets[key] = fn
            else:
                self._subsets[key] = None
        fn_: Callable[[Any, dict[str, int]], bool] | None = self._subsets[key]
        return fn_

    def fused_run(self, action: str, written: frozenset[str]) -> Callable[..., int] | None:
        """``action``'s whole guard over a run of blocks in one call, ``fn(v, p, bs) -> int``:
        the guard with ``p['b']`` = each of ``bs`` in turn, on the one state ``v`` (record
        indexed), returning the position of the first block it refuses (-1: all accepted).

        Checking a run up front equals checking each block just before its own transition only
        when no block's transition changes what another block's guard reads: the guard must
        read block variables at its own block alone ("block"/"global" locality) and no scalar
        in ``written`` (the variables the action updates; its block updates are at ``p.b``).
        None when that does not hold or a conjunct did not compile."""
        key = (action, frozenset({"<run>"}) | written, False)
        if key not in self._subsets:
            fn: Callable[..., int] | None = None
            names_ = [n for n, _ in self.conjuncts.get(action, ())]
            trs = [self._traced.get((action, n)) for n in names_]
            if self.locality.get(action) in ("block", "global") and all(
                tr is not None for tr in trs
            ):
                parts = [(tr.expr, tr.names) for tr in trs if tr is not None]
                names = set().union(*(n for _, n in parts)) if parts else set()
                reads = {_table_name(n) or n for n in names}
                if not (reads - self.columns) & written:
                    body = "".join(f"    {ln}\n" for ln in _prelude(names - {"p_b"}, set(), str))
                    cond = " and ".join(f"({e})" for e, _ in parts) or "True"
                    fname = f"guard_{action}_run".replace(".", "_")
                    src = (
                        f"def {fname}(v, p, bs):\n{body}"
                        f"    for i, p_b in enumerate(bs):\n"
                        f"        if not ({cond}):\n            return i\n    return -1\n"
                    )
                    fn = _define(fname, src)
            self._subsets[key] = fn
        run: Callable[..., int] | None = self._subsets[key]
        return run

    def enabled_run(
        self, parts: tuple[tuple[str, frozenset[str]], ...]
    ) -> Callable[[Any, Sequence[int]], int] | None:
        """Is any of several guards enabled (each without its ``skip`` conjuncts), over a run
        of blocks in one call: ``fn(v, bs) -> int``, the position of the first block of ``bs``
        at which one of them holds with ``p['b']`` = that block (-1: none), on the
        record-indexed state ``v``.  None unless every conjunct compiled, each guard reads
        block variables at its own block only and no parameter but ``b``."""
        key = (repr(parts), frozenset({"<any>"}), False)
        if key not in self._subsets:
            fn: Callable[[Any, Sequence[int]], int] | None = None
            conds: list[str] = []
            names: set[str] = set()
            for action, skip in parts:
                trs = [
                    self._traced.get((action, n))
                    for n, _ in self.conjuncts.get(action, ())
                    if n not in skip
                ]
                if self.locality_without(action, skip) not in ("block", "global") or any(
                    tr is None for tr in trs
                ):
                    break
                conds.append(" and ".join(f"({tr.expr})" for tr in trs if tr) or "True")
                names.update(*(tr.names for tr in trs if tr))
            else:
                if not any(n.startswith("p_") and n != "p_b" for n in names):
                    body = "".join(f"    {ln}\n" for ln in _prelude(names - {"p_b"}, set(), str))
                    cond = " or ".join(f"({c})" for c in conds) or "False"
                    src = (
                        f"def guards_enabled_run(v, bs):\n{body}"
                        f"    for i, p_b in enumerate(bs):\n"
                        f"        if {cond}:\n            return i\n    return -1\n"
                    )
                    fn = _define("guards_enabled_run", src)
            self._subsets[key] = fn
        run: Callable[[Any, Sequence[int]], int] | None = self._subsets[key]
        return run


def _combine(kinds: set[str]) -> str:
    """The narrowest locality covering every kind read (one term's reads, or several terms')."""
    if kinds <= {"global"}:
        return "global"
    if kinds <= {"global", "block"}:
        return "block"
    if kinds <= {"slot"}:
        return "slot"
    return "chain"


def _fuse(
    fname: str, trs: list[_Traced], columns: frozenset[str] | None, mapped: frozenset[str]
) -> tuple[Callable[[Any, dict[str, int]], bool], str]:
    """One function for the conjunction of traced terms (direct form when ``columns``)."""
    parts = [tr.direct(mapped) if columns is not None else (tr.expr, tr.names) for tr in trs]
    names = set().union(*(n for _, n in parts)) if parts else set()
    body = "".join(f"    {ln}\n" for ln in _prelude(names, set(), str, columns))
    cond = " and ".join(f"({e})" for e, _ in parts) or "True"
    src = f"def {fname}(v, p):\n{body}    return {cond}\n"
    return _define(fname, src), src


class _Params:
    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return 0 if name == "r" else z3.Int(f"p_{name}")


def compile_guards(table: Table, k: Any, mapped: frozenset[str] = frozenset()) -> CompiledGuards:
    return _memo("guards", (table, (k, mapped)), _compile_guards)


def _interpreted(fn: Callable[[Any, Any], Any]) -> Callable[[Any, dict[str, int]], bool]:
    return lambda v, p: bool(fn(v, SimpleNamespace(**p)))


def _compile_guards(table: Table, km: tuple[Any, Any]) -> CompiledGuards:
    k, mapped = km
    columns = _block_columns(table)
    conj: dict[str, tuple[tuple[str, Callable[[Any, dict[str, int]], bool]], ...]] = {}
    sources: dict[tuple[str, str], str] = {}
    skipped: dict[tuple[str, str], str] = {}
    fused: dict[str, Callable[[Any, dict[str, int]], bool]] = {}
    fused_sources: dict[str, str] = {}
    fused_direct: dict[str, Callable[[Any, dict[str, int]], bool]] = {}
    traced: dict[tuple[str, str], _Traced] = {}
    locality: dict[str, str] = {}
    for a in table.actions:
        out: list[tuple[str, Callable[[Any, dict[str, int]], bool]]] = []
        trs: list[_Traced] = []
        for c in a.guard:
            try:
                tr = _trace_with_locality(
                    f"{a.name}.{c.name}",
                    lambda s: c.fn(s, _Params()),  # noqa: B023
                    table,
                    k,
                )
            except CompileError as exc:
                skipped[(a.name, c.name)] = str(exc)
                out.append((c.name, _interpreted(c.fn)))
                continue
            trs.append(tr)
            traced[(a.name, c.name)] = tr
            pre = _prelude(tr.names, set(), str)
            fname = f"guard_{a.name}_{c.name}".replace(".", "_")
            body = "".join(f"    {ln}\n" for ln in pre)
            src = f"def {fname}(v, p):\n{body}    return {tr.expr}\n"
            sources[(a.name, c.name)] = src
            out.append((c.name, _define(fname, src)))
        conj[a.name] = tuple(out)
        if len(trs) == len(a.guard):
            fname = f"guard_{a.name}".replace(".", "_")
            fused[a.name], fused_sources[a.name] = _fuse(fname, trs, None, mapped)
            fused_direct[a.name], _ = _fuse(fname + "_direct", trs, columns, mapped)
            locality[a.name] = _combine({tr.kind for tr in trs})
    return CompiledGuards(
        conj,
        sources,
        skipped,
        fused,
        fused_sources,
        fused_direct,
        locality=locality,
        columns=columns,
        mapped=mapped,
        _traced=traced,
    )
