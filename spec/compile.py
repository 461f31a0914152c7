"""The generic translator: a table callable's Z3 term -> straight-line Python source.

The table's callables are written once for two readers (Python values and Z3 terms), so
concretely each one costs several nested calls (``AND``, ``IN``, a lambda per rule, a view
attribute).  Compiling does not restate them: each callable is *evaluated on symbolic inputs* --
exactly what the prover does -- and the Z3 term it returns is translated operator by operator
into a Python expression over the table's state interface (``s.ckv[b]``, ``s.req(r).phase``,
``s.N``).  The generated source is kept on the result (``.source``) for inspection, and
``tests/spec/test_spec_compile.py`` checks compiled and interpreted forms agree on random states.

Only the operators below are translated; a callable that produces anything else raises
:class:`CompileError`, and callers keep the interpreted callable for it (explicitly, not
silently: the results list what they skipped).  Z3's integer ``div``/``mod`` are Euclidean;
they equal Python's ``//``/``%`` for the positive constant divisors the table uses, and any
other divisor is refused.

What a term reads is read off it too (:func:`term_reads`): the one read-set analysis, of hit
rules, guards and invariants alike (:func:`invariant_reads`).  Nothing here knows how an
implementation lays its state out; the implementation's own fused forms over its layout are
built from the traced terms kept here (``kvstate.impl.fastforms``).
"""

from __future__ import annotations

import itertools
import linecache
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import z3

from .layers import HitRule, Rule, RuleScope
from .table import Invariant, Scope, Table


class CompileError(ValueError):
    """A predicate's Z3 term uses an operator the translator does not handle."""


# Hygiene.  Every name in generated code is in exactly one of these disjoint namespaces, so no
# table -- whatever its variables are called -- can shadow a generated local, a builtin the code
# calls (``all``, ``range``, ``max``, ``min``) or another table name:
#   t_<var>    a block or global variable of the table (``TABLE_PREFIX``)
#   r<n>_<var> a field of request n;   p_<param> an action parameter;   N the pool size
#   k_<const>  a deployment constant read at run time from the state's ``k`` (``RUNTIME_CONSTS``)
#   anything else (v, r, p, h, b, q0, forall0, rq0, ...) is a generator's own local (the
#   implementation's generators, ``kvstate.impl.fastforms``, add R, R_t_<var>, Rb, M, P, fail, ...)
# (names are checked to be identifiers that are no keyword when a table is validated, and a
# generated function's name is checked by :func:`define`).
TABLE_PREFIX = "t_"
CONST_PREFIX = "k_"
# Constants of ``s.k`` that a deployment sets (admission and I/O caps): traced as free names and
# read at run time from the state's ``k`` (``k_pin_cap = v.k.pin_cap``), not folded into the
# generated source as literals.  So two caches of one table whose caps differ run the same
# generated source (and its ahead-of-time twin); every other constant (block and window sizes,
# load steps, formats) shapes the terms (divisors, ranges, phases) and stays folded.
RUNTIME_CONSTS = ("pin_cap", "io_cap")


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


class _TraceConsts:
    """``s.k`` while tracing: the constants of :data:`RUNTIME_CONSTS` as free Z3 integers
    (``k_pin_cap``), every other one the concrete value of ``k``."""

    def __init__(self, k: Any) -> None:
        self._k = k

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        if name in RUNTIME_CONSTS:
            return z3.Int(CONST_PREFIX + name)
        return getattr(self._k, name)


class _TraceState:
    """The table's state shape with every variable a fresh Z3 constant (``s.k`` stays concrete,
    the geometry being fixed when an implementation is built, but for the caps a deployment
    sets, :data:`RUNTIME_CONSTS`: free names read from the state's ``k`` at run time)."""

    def __init__(self, table: Table, k: Any, N: Any = None) -> None:
        self._table = table
        self.k = _TraceConsts(k)
        self.N = z3.Int("N") if N is None else N
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


def _quantifier(
    e: z3.ExprRef, names: set[str], quants: Quants, via: Via | None
) -> tuple[str, str, str]:
    """A quantifier placeholder's body, bound variable and concrete range, ``(src, q, range)``:
    the one translation both the expression form (``all(...)``) and the statement form (a
    ``for`` loop) are written from."""
    return _quantifier_named(e.decl().name(), names, quants, via)


def _quantifier_named(
    name: str, names: set[str], quants: Quants, via: Via | None
) -> tuple[str, str, str]:
    lo, hi, q, body = quants[name]
    inner: set[str] = set()
    src = to_python(body, inner, quants, via)
    qn = q.decl().name()
    names.update(inner - {qn})
    names.add("N")
    lo_s, hi_s = _operand(lo, names, quants, via), _operand(hi, names, quants, via)
    return src, qn, f"range(max({lo_s}, 0), min({hi_s}, N))"


def to_python(
    e: z3.ExprRef, names: set[str], quants: Quants | None = None, via: Via | None = None
) -> str:
    """A Python expression equal to ``e``; the free constants' names are added to ``names``
    (arrays are read as ``name[index]``; a quantifier placeholder of ``quants`` becomes an
    ``all(...)`` over ``range(max(lo, 0), min(hi, N))``, as concrete states loop).

    ``via(array)`` names an index array to read ``array`` through (``array[via[index]]``), or
    None: the *direct* form, where block columns are the implementation's live record-indexed
    lists and the chain's record ids map block positions to records.

    The walk reads Z3's C interface directly, like :func:`read_sites` (an ``ExprRef`` per node
    costs several calls, each checked): every guard is translated in the timed window of a fuzz
    run, twice (plain and direct form)."""
    return _py(e.ctx, e.as_ast(), names, quants or {}, via)


def _py(c: z3.Context, a: Any, names: set[str], quants: Quants, via: Via | None) -> str:
    ctx = c.ref()
    kind = z3.Z3_get_ast_kind(ctx, a)
    if kind != z3.Z3_APP_AST and kind != z3.Z3_NUMERAL_AST:
        raise CompileError(f"cannot translate {z3.ExprRef(a, c)}")
    decl = z3.Z3_get_app_decl(ctx, a)
    op = z3.Z3_get_decl_kind(ctx, decl)
    nargs = z3.Z3_get_app_num_args(ctx, a)
    if nargs == 0:
        if op == z3.Z3_OP_UNINTERPRETED:
            n = _decl_name(ctx, decl)
            if n in quants:
                src, qn, rng = _quantifier_named(n, names, quants, via)
                return f"all({src} for {qn} in {rng})"
            names.add(n)
            return n
        if op == z3.Z3_OP_TRUE:
            return "True"
        if op == z3.Z3_OP_FALSE:
            return "False"
        if _is_int_value(ctx, a):
            return str(int(z3.Z3_get_numeral_string(ctx, a)))
    args = [_py(c, z3.Z3_get_app_arg(ctx, a, i), names, quants, via) for i in range(nargs)]
    if op == z3.Z3_OP_SELECT:
        arr = z3.Z3_get_app_arg(ctx, a, 0)
        if not (
            _is_const(ctx, arr)
            and z3.Z3_get_decl_kind(ctx, z3.Z3_get_app_decl(ctx, arr)) == z3.Z3_OP_UNINTERPRETED
        ):
            raise CompileError(f"cannot translate a read of a computed array: {z3.ExprRef(a, c)}")
        through = via(_decl_name(ctx, z3.Z3_get_app_decl(ctx, arr))) if via is not None else None
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
            raise CompileError(f"cannot translate an n-ary distinct: {z3.ExprRef(a, c)}")
        return f"({args[0]} != {args[1]})"
    if op in _BIN:
        return f"({args[0]} {_BIN[op]} {args[1]})"
    if op in _NARY:
        return "(" + _NARY[op].join(args) + ")"
    if op == z3.Z3_OP_UMINUS:
        return f"(-{args[0]})"
    if op in (z3.Z3_OP_IDIV, z3.Z3_OP_MOD):
        d = z3.Z3_get_app_arg(ctx, a, 1)
        if not (_is_int_value(ctx, d) and int(z3.Z3_get_numeral_string(ctx, d)) > 0):
            raise CompileError(
                f"only positive constant divisors are translated: {z3.ExprRef(a, c)}"
            )
        return f"({args[0]} {'//' if op == z3.Z3_OP_IDIV else '%'} {args[1]})"
    e = z3.ExprRef(a, c)
    raise CompileError(f"no translation for {e.decl()} in {e}")


def to_statements(
    terms: list[tuple[z3.ExprRef, Quants]], names: set[str], via: Via | None = None
) -> list[str]:
    """Statements equal to ``return`` the conjunction of ``terms`` (each with its quantifier
    placeholders), in order: each conjunct (``And`` flattened) becomes ``if not (e): return
    False``, and a quantifier placeholder standing alone as a conjunct becomes a ``for`` loop
    over the range its ``all(...)`` would take, returning False at the first block whose body
    is false; then ``return True``.  The same terms and the same order as :func:`to_python`'s
    ``(t1) and (t2) ...`` (the conjuncts are pure, so only the bool returned differs: it is
    always a bool); what it saves is the generator object and the call of ``all`` per
    quantifier, each a cost per call of a guard.  A quantifier nested under any other operator
    stays an ``all(...)``.  Loops of different conjuncts may reuse a bound name (each conjunct
    numbers its own ``q<n>`` from 0): they run one after another, never nested."""
    lines: list[str] = []

    def emit(e: z3.ExprRef, quants: Quants) -> None:
        if z3.is_and(e):
            for c in e.children():
                emit(c, quants)
            return
        if z3.is_true(e):
            return
        if z3.is_const(e) and e.decl().name() in quants:
            src, qn, rng = _quantifier(e, names, quants, via)
            lines.extend(
                [
                    f"for {qn} in {rng}:",
                    f"    if not ({src}):",
                    "        return False",
                ]
            )
            return
        lines.extend([f"if not ({to_python(e, names, quants, via)}):", "    return False"])

    for term, quants in terms:
        emit(term, quants)
    return [*lines, "return True"]


# ---- what a term reads: the one read-set analysis -------------------------------------------
REQ_NAME = re.compile(r"r(\d+)_")


def read_sites(t: z3.ExprRef, quants: Quants | None = None) -> frozenset[tuple[str, str | None]]:
    """Every free name a traced term reads, as ``(name, at)``: ``name`` as generated code spells
    it (``t_ckv``, ``r0_phase``, ``p_b``, ``N``, a quantifier placeholder ``forall0`` or its bound
    ``q0``), ``at`` the constant an array is read at (``"p_b"``), ``"?"`` for a computed index,
    None for a scalar read.  A quantifier placeholder's range and body are read too.

    The walk reads Z3's C interface directly (AST handles, no ``ExprRef`` per node: making one
    costs several calls and a reference count each); every guard and invariant is walked once
    per process, in the timed window of a fuzz run."""
    quants = quants or {}
    out: set[tuple[str, str | None]] = set()
    todo: list[tuple[Any, Any]] = []

    def push(x: Any) -> None:
        if isinstance(x, z3.ExprRef):
            todo.append((x.ctx_ref(), x.as_ast()))

    push(t)
    seen: set[int] = set()
    while todo:
        ctx, a = todo.pop()
        ident = z3.Z3_get_ast_id(ctx, a)
        if ident in seen:
            continue
        seen.add(ident)
        kind = z3.Z3_get_ast_kind(ctx, a)
        if kind != z3.Z3_APP_AST and kind != z3.Z3_NUMERAL_AST:
            continue  # a bound variable, a quantifier, a sort: reads no free name
        nargs = z3.Z3_get_app_num_args(ctx, a)
        decl = z3.Z3_get_app_decl(ctx, a)
        if nargs == 0:  # a constant
            n = _decl_name(ctx, decl)
            if n in quants:
                lo, hi, _q, body = quants[n]
                for x in (lo, hi, body):
                    push(x)
            if n in quants or z3.Z3_get_decl_kind(ctx, decl) == z3.Z3_OP_UNINTERPRETED:
                out.add((n, None))
            continue
        if z3.Z3_get_decl_kind(ctx, decl) == z3.Z3_OP_SELECT:
            arr = z3.Z3_get_app_arg(ctx, a, 0)
            if _is_const(ctx, arr):
                idx = z3.Z3_get_app_arg(ctx, a, 1)
                at = (
                    _decl_name(ctx, z3.Z3_get_app_decl(ctx, idx))
                    if _is_const(ctx, idx) and not _is_int_value(ctx, idx)
                    else "?"
                )
                out.add((_decl_name(ctx, z3.Z3_get_app_decl(ctx, arr)), at))
                todo.append((ctx, idx))
                continue
        todo.extend((ctx, z3.Z3_get_app_arg(ctx, a, i)) for i in range(nargs))
    return frozenset(out)


def _is_const(ctx: Any, a: Any) -> bool:
    """``z3.is_const`` of an AST handle: an application of no arguments (a numeral too)."""
    kind = z3.Z3_get_ast_kind(ctx, a)
    return (kind == z3.Z3_APP_AST or kind == z3.Z3_NUMERAL_AST) and not z3.Z3_get_app_num_args(
        ctx, a
    )


def _is_int_value(ctx: Any, a: Any) -> bool:
    """``z3.is_int_value`` of an AST handle: an integer numeral."""
    return bool(z3.Z3_is_numeral_ast(ctx, a)) and (
        z3.Z3_get_sort_kind(ctx, z3.Z3_get_sort(ctx, a)) == z3.Z3_INT_SORT
    )


def _decl_name(ctx: Any, decl: Any) -> str:
    """``FuncDeclRef.name`` of a declaration handle."""
    sym = z3.Z3_get_decl_name(ctx, decl)
    if z3.Z3_get_symbol_kind(ctx, sym) == z3.Z3_INT_SYMBOL:
        return f"k!{z3.Z3_get_symbol_int(ctx, sym)}"
    return str(z3.Z3_get_symbol_string(ctx, sym))


def term_reads(t: z3.ExprRef, quants: Quants | None = None) -> frozenset[str]:
    """The table variables a traced term reads: block columns and scalars by name, request
    fields (of any request) by field name.  Parameters, bound variables and ``N`` are not
    variables of the table.  The one read-set analysis: guards, rules and invariants alike."""
    out: set[str] = set()
    for n, _at in read_sites(t, quants):
        name = _table_name(n)
        if name is not None:
            out.add(name)
        elif (m := REQ_NAME.match(n)) is not None:
            out.add(n[m.end() :])
    return frozenset(out)


_INV_READS: dict[tuple[int, int], tuple[Table, Invariant, frozenset[str]]] = {}


def invariant_reads(table: Table, inv: Invariant) -> frozenset[str]:
    """Variables an invariant reads, off its Z3 terms (:func:`term_reads`): the invariant
    evaluated on a symbolic state of two blocks (a bounded invariant counts over a concrete
    pool), for every request when it is per request, at a symbolic block.  Kept per (table,
    invariant): every model machine asks (the fuzzer makes one per example)."""
    hit = _INV_READS.get((id(table), id(inv)))
    if hit is not None and hit[0] is table and hit[1] is inv:
        return hit[2]
    out = _invariant_reads(table, inv)
    if len(_INV_READS) >= 1024:
        _INV_READS.clear()
    _INV_READS[(id(table), id(inv))] = (table, inv, out)
    return out


def _invariant_reads(table: Table, inv: Invariant) -> frozenset[str]:
    s = _TraceState(table, table.consts, N=2)
    terms: list[Any] = []
    for r in range(table.consts.R) if inv.per_request else [None]:
        args: tuple[Any, ...] = (s,) if r is None else (s, r)
        if inv.scalar is not None:
            terms.append(inv.scalar(*args))
        if inv.per_block is not None:
            terms.append(inv.per_block(*args, z3.Int("b")))
    out: set[str] = set()
    for t in terms:
        if isinstance(t, z3.ExprRef):
            out |= term_reads(t, s._quants)
    return frozenset(out)


# ---- tracing and generated functions --------------------------------------------------------
@dataclass
class Traced:
    """A traced term: its Python expression over the state interface and free names; the term
    itself and its quantifier placeholders, to read (:func:`read_sites`) or translate again."""

    expr: str
    names: set[str]
    term: z3.ExprRef
    quants: Quants


def trace(what: str, call: Callable[[_TraceState], Any], table: Table, k: Any) -> Traced:
    """Evaluate ``call`` on a symbolic state and translate the boolean term it returns."""
    s = _TraceState(table, k)
    try:
        t = call(s)
    except CompileError:
        raise
    except Exception as exc:  # noqa: BLE001 - a callable that cannot be traced stays interpreted
        raise CompileError(f"{what}: {type(exc).__name__}: {exc}") from exc
    if isinstance(t, bool):
        t = z3.BoolVal(t)
    if not isinstance(t, z3.BoolRef):
        raise CompileError(f"{what} is not a boolean term")
    names: set[str] = set()
    expr = to_python(t, names, s._quants)
    return Traced(expr, names, t, dict(s._quants))


def trace_term(call: Callable[[_TraceState], Any], table: Table, k: Any) -> Any:
    """``call`` evaluated on a symbolic state (an int, a bool or a Z3 term: a scope bound)."""
    return call(_TraceState(table, k))


def operand(x: Any, names: set[str]) -> str:
    """A Python expression for a traced value that may be a plain int or bool."""
    return _operand(x, names, {})


def prelude(names: set[str], bound: set[str], req: Callable[[int], str]) -> list[str]:
    """Lines binding each free name over the state interface: columns and scalars from ``v``,
    request fields from ``v.req(...)`` (``req(n)`` spells the request index; a request whose
    fields are read more than once is fetched once, as the local ``rq<n>``), action
    parameters (``p_b``) from the dict ``p``, ``N`` from ``v.N``, a run-time constant
    (``k_pin_cap``) from ``v.k``."""
    lines = []
    free = sorted(names - bound)
    fields: dict[str, int] = {}
    for n in free:
        head, _, field_ = n.partition("_")
        if head[:1] == "r" and head[1:].isdigit() and field_:
            fields[head] = fields.get(head, 0) + 1
    fetched: set[str] = set()
    for n in free:
        head, _, field_ = n.partition("_")
        var = _table_name(n)
        if var is not None:
            lines.append(f"{n} = v.{var}")
        elif n == "N":
            lines.append("N = v.N")
        elif n.startswith(CONST_PREFIX) and n[len(CONST_PREFIX) :] in RUNTIME_CONSTS:
            lines.append(f"{n} = v.k.{n[len(CONST_PREFIX) :]}")
        elif head == "p" and field_:
            lines.append(f"{n} = p[{field_!r}]")
        elif head[:1] == "r" and head[1:].isdigit() and field_:
            idx = req(int(head[1:]))
            if fields[head] == 1:
                lines.append(f"{n} = v.req({idx}).{field_}")
                continue
            if head not in fetched:
                fetched.add(head)
                lines.append(f"rq{head[1:]} = v.req({idx})")
            lines.append(f"{n} = rq{head[1:]}.{field_}")
        else:
            raise CompileError(f"generated code reads an unknown name {n!r}")
    return lines


_MEMO: dict[tuple[Any, ...], tuple[tuple[Any, ...], Any]] = {}
_MEMO_SIZE = 32


def memo(kind: str, args: tuple[Any, ...], build: Callable[..., Any]) -> Any:
    """Compiling costs ~0.1 s and every cache object (the fuzzer makes one per example) asks
    again for the same table: results are kept per (kind, identity of the table objects, k).
    The key holds the arguments themselves, so an id is never reused while it is cached, and
    the hook's epoch: what was built while another hook answered is not served after it."""
    key = (kind, _HOOK_EPOCH, *(id(a) for a in args[:-1]), args[-1])
    hit = _MEMO.get(key)
    if hit is not None and all(x is y for x, y in zip(hit[0], args[:-1], strict=True)):
        return hit[1]
    out = build(*args)
    if len(_MEMO) >= _MEMO_SIZE:
        _MEMO.pop(next(iter(_MEMO)))
    _MEMO[key] = (args[:-1], out)
    return out


_DEFINED = itertools.count()
# asked by ``define`` before it runs a source: (name, source, env names) -> a function standing
# in for it, or None.  An implementation installs it (``kvstate.impl.twins``: its compiled twins
# of the sources its default tables generate, and the recording ``kvstate/buildtools/aotgen.py`` emits)
_HOOK: Callable[[str, str, tuple[str, ...]], Callable[..., Any] | None] | None = None
_HOOK_EPOCH = 0  # moved by every set_define_hook: part of memo()'s key


def set_define_hook(
    hook: Callable[[str, str, tuple[str, ...]], Callable[..., Any] | None] | None,
) -> None:
    """Install (None: remove) the one hook :func:`define` asks first; installing it again
    says its answers changed (functions :func:`memo` kept are built afresh)."""
    global _HOOK, _HOOK_EPOCH
    _HOOK = hook
    _HOOK_EPOCH += 1


def define(name: str, src: str, env: dict[str, Any] | None = None) -> Callable[..., Any]:
    """Run one generated function's source (``env``: globals it may read besides builtins); it
    is registered with ``linecache`` under a unique file name, so tracebacks,
    ``inspect.getsource`` and profilers show the generated lines.  A registered twin of exactly
    this source is returned instead when the hook (:func:`set_define_hook`) answers one."""
    if not name.isidentifier():
        raise CompileError(f"generated function name {name!r} is not an identifier")
    if _HOOK is not None:
        twin = _HOOK(name, src, tuple(sorted(env or ())))
        if twin is not None:
            return twin
    filename = f"<kvstate.spec.compile:{name}#{next(_DEFINED)}>"
    lines = src.splitlines(keepends=True)
    linecache.cache[filename] = (len(src), None, lines, filename)
    scope: dict[str, Any] = dict(env or {})
    exec(compile(src, filename, "exec"), scope)  # noqa: S102
    fn: Callable[..., Any] = scope[name]
    return fn


def block_columns(table: Table) -> frozenset[str]:
    """The table's block variables an implementation has (ghost truth aside)."""
    return frozenset(v.name for v in table.vars if v.scope is Scope.BLOCK and not v.ghost)


def _acting(i: int) -> str:
    return "r" if i == 0 else str(i)  # r0 is the request asked about


# ---- the hit rule's predicates --------------------------------------------------------------
@dataclass(frozen=True)
class CompiledPredicate:
    """``rule.pred``-equivalent over plain values: ``fn(view, r, x)`` reads the view's columns
    (``s.ckv``) and request fields once per call."""

    rule: Rule
    source: str
    fn: Callable[[Any, int, int], bool]


@dataclass(frozen=True)
class CompiledHitRule:
    """Each rule of a hit rule compiled alone, and what they read."""

    rules: dict[str, CompiledPredicate]  # qualname -> compiled (those that compiled)
    skipped: dict[str, str]  # qualname -> why it stays interpreted
    traced: dict[str, Traced]  # qualname -> its traced term (those that compiled)
    # the table variables the rules read (request fields by field name), off their Z3 terms;
    # None when a rule did not compile (its reads are unknown).  An action whose frame misses
    # this set cannot change any rule's value.
    reads: frozenset[str] | None = None


def compile_hit_rule(hit_rule: HitRule, table: Table, k: Any) -> CompiledHitRule:
    return memo("hit", (hit_rule, table, k), _compile_hit_rule)


def _compile_hit_rule(hit_rule: HitRule, table: Table, k: Any) -> CompiledHitRule:
    """Compile what can be compiled; the rest is listed in ``skipped`` with the reason."""
    rules: dict[str, CompiledPredicate] = {}
    skipped: dict[str, str] = {}
    traced: dict[str, Traced] = {}
    reads: set[str] = set()
    for rule in hit_rule.rules:
        x = "h" if rule.scope is RuleScope.HIT else "b"
        try:
            tr = trace(rule.qualname, lambda s: rule.pred(s, 0, z3.Int(x)), table, k)  # noqa: B023
        except CompileError as exc:
            skipped[rule.qualname] = str(exc)
            continue
        traced[rule.qualname] = tr
        reads |= term_reads(tr.term, tr.quants)
        fname = "pred_" + rule.qualname.replace(".", "_")
        body = "".join(f"    {ln}\n" for ln in prelude(tr.names, {x}, _acting))
        src = f"def {fname}(v, r, {x}):\n{body}    return {tr.expr}\n"
        rules[rule.qualname] = CompiledPredicate(rule, src, define(fname, src))
    return CompiledHitRule(rules, skipped, traced, None if skipped else frozenset(reads))


# ---- the actions' guards --------------------------------------------------------------------
@dataclass(frozen=True)
class CompiledGuards:
    """Each action's guard conjuncts as ``fn(view, params)`` for the acting request ``r == 0``,
    ``params`` a dict of the action's parameters; a conjunct that did not compile keeps the
    table's callable (wrapped to take the dict) and is listed in ``skipped``."""

    conjuncts: dict[str, tuple[tuple[str, Callable[[Any, dict[str, int]], bool]], ...]]
    sources: dict[tuple[str, str], str]
    skipped: dict[tuple[str, str], str]
    traced: dict[tuple[str, str], Traced] = field(default_factory=dict)


class _Params:
    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return 0 if name == "r" else z3.Int(f"p_{name}")


def compile_guards(table: Table, k: Any) -> CompiledGuards:
    return memo("guards", (table, k), _compile_guards)


def _interpreted(fn: Callable[[Any, Any], Any]) -> Callable[[Any, dict[str, int]], bool]:
    return lambda v, p: bool(fn(v, SimpleNamespace(**p)))


def _compile_guards(table: Table, k: Any) -> CompiledGuards:
    conj: dict[str, tuple[tuple[str, Callable[[Any, dict[str, int]], bool]], ...]] = {}
    sources: dict[tuple[str, str], str] = {}
    skipped: dict[tuple[str, str], str] = {}
    traced: dict[tuple[str, str], Traced] = {}
    for a in table.actions:
        out: list[tuple[str, Callable[[Any, dict[str, int]], bool]]] = []
        for c in a.guard:
            try:
                tr = trace(f"{a.name}.{c.name}", lambda s: c.fn(s, _Params()), table, k)  # noqa: B023
            except CompileError as exc:
                skipped[(a.name, c.name)] = str(exc)
                out.append((c.name, _interpreted(c.fn)))
                continue
            traced[(a.name, c.name)] = tr
            fname = f"guard_{a.name}_{c.name}".replace(".", "_")
            body = "".join(f"    {ln}\n" for ln in prelude(tr.names, set(), str))
            src = f"def {fname}(v, p):\n{body}    return {tr.expr}\n"
            sources[(a.name, c.name)] = src
            out.append((c.name, define(fname, src)))
        conj[a.name] = tuple(out)
    return CompiledGuards(conj, sources, skipped, traced)
