"""Compile the hit rule's predicates to straight-line Python, from their Z3 terms.

The implementation runs the hit rule on every admission, and the table's callables are written
once for two readers (Python values and Z3 terms), so concretely each one costs several nested
calls (``AND``, ``IN``, a lambda per rule, a view attribute).  Compiling does not restate them:
each predicate is *evaluated on symbolic inputs* -- exactly what the prover does -- and the Z3
term it returns is translated operator by operator into a Python expression over plain columns.
The generated source is kept on the result (``.source``) for inspection, and
``tests/test_spec_compile.py`` checks compiled and interpreted forms agree on random states.

Only the operators below are translated; a predicate that produces anything else raises
:class:`CompileError`, and callers keep the interpreted callable for it (explicitly, not
silently: :class:`CompiledHitRule` lists what it compiled).  Z3's integer ``div``/``mod`` are
Euclidean; they equal Python's ``//``/``%`` for the positive constant divisors the table uses,
and any other divisor is refused.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import z3

from .layers import HitRule, Rule, RuleScope
from .table import Scope, Table


class CompileError(ValueError):
    """A predicate's Z3 term uses an operator the translator does not handle."""


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

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        v = self._table.var(name)
        if v.scope is Scope.BLOCK:
            return z3.Array(name, z3.IntSort(), z3.IntSort())
        if v.scope is Scope.GLOBAL:
            return z3.Int(name)
        raise CompileError(f"variable {name!r} is per request: read it through s.req(r)")

    def req(self, r: int) -> _Req:
        return _Req(r, self._table)

    def forall_blocks(self, lo: Any, hi: Any, body: Callable[[Any], Any]) -> Any:
        raise CompileError("quantified predicates are not compiled")


def to_python(e: z3.ExprRef, names: set[str]) -> str:
    """A Python expression equal to ``e``; the free constants' names are added to ``names``
    (arrays are read as ``name[index]``)."""
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
    args = [to_python(a, names) for a in e.children()]
    if op == z3.Z3_OP_SELECT:
        arr = e.arg(0)
        if not (z3.is_const(arr) and arr.decl().kind() == z3.Z3_OP_UNINTERPRETED):
            raise CompileError(f"cannot translate a read of a computed array: {e}")
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


def _term(rule: Rule, table: Table, k: Any) -> z3.ExprRef:
    s = _TraceState(table, k)
    x = z3.Int("h" if rule.scope is RuleScope.HIT else "b")
    try:
        t = rule.pred(s, 0, x)
    except CompileError:
        raise
    except Exception as exc:  # noqa: BLE001 - a predicate that cannot be traced stays interpreted
        raise CompileError(f"{rule.qualname}: {type(exc).__name__}: {exc}") from exc
    if isinstance(t, bool):
        return z3.BoolVal(t)
    if not isinstance(t, z3.BoolRef):
        raise CompileError(f"{rule.qualname} is not a boolean term")
    return t


def _prelude(names: set[str], x: str) -> tuple[list[str], list[str]]:
    """Lines binding each free name from the view (``v``) and request ``r``."""
    lines, params = [], []
    for n in sorted(names):
        if n == x:
            continue
        if n == "N":
            lines.append("N = v.N")
        elif n.startswith("r0_"):
            lines.append(f"{n} = v.req(r).{n[3:]}")
        else:
            lines.append(f"{n} = v.{n}")
        params.append(n)
    return lines, params


def _define(name: str, src: str) -> Callable[..., Any]:
    scope: dict[str, Any] = {}
    exec(compile(src, f"<kvstate.spec.compile:{name}>", "exec"), scope)  # noqa: S102
    fn: Callable[..., Any] = scope[name]
    return fn


def compile_hit_rule(hit_rule: HitRule, table: Table, k: Any) -> CompiledHitRule:
    """Compile what can be compiled; the rest is listed in ``skipped`` with the reason."""
    rules: dict[str, CompiledPredicate] = {}
    skipped: dict[str, str] = {}
    exprs: dict[str, tuple[str, set[str]]] = {}
    for rule in hit_rule.rules:
        x = "h" if rule.scope is RuleScope.HIT else "b"
        try:
            names: set[str] = set()
            expr = to_python(_term(rule, table, k), names)
        except CompileError as exc:
            skipped[rule.qualname] = str(exc)
            continue
        exprs[rule.qualname] = (expr, names)
        pre, _ = _prelude(names, x)
        fname = "pred_" + rule.qualname.replace(".", "_")
        body = "".join(f"    {ln}\n" for ln in pre)
        src = f"def {fname}(v, r, {x}):\n{body}    return {expr}\n"
        rules[rule.qualname] = CompiledPredicate(rule, src, _define(fname, src))
    all_rules = tuple(r for r in hit_rule.rules if r.scope is RuleScope.ALL)
    first_bad = None
    src = ""
    if all_rules and all(r.qualname in exprs for r in all_rules):
        names = set().union(*(exprs[r.qualname][1] for r in all_rules))
        pre, _ = _prelude(names, "b")
        cond = " and ".join(exprs[r.qualname][0] for r in all_rules)
        body = "".join(f"    {ln}\n" for ln in pre)
        src = (
            f"def first_bad(v, r, lo, hi):\n{body}"
            f"    for b in range(lo, hi):\n"
            f"        if not ({cond}):\n"
            f"            return b\n"
            f"    return -1\n"
        )
        first_bad = _define("first_bad", src)
    return CompiledHitRule(all_rules, first_bad, src, rules, skipped)
