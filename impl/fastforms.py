"""The implementation's fast forms of the table's guards and hit rule, over its own layout.

``kvstate.spec.compile`` translates each guard conjunct and hit rule to Python over the table's
state interface and keeps the traced Z3 terms.  This module builds, from those same terms, the
forms the implementation runs on its request path -- nothing here restates a guard or a rule:

- *fused* forms: an action's whole guard as one accept test (``fused``; ``fused_without`` for a
  subset of its conjuncts), and a block guard over a run of blocks in one call (``fused_run``);
- *direct* forms of them, reading block columns as the implementation's live record-indexed
  lists through the chain's record ids (``X[R[b]]``, or ``X[R_t_X[b]]`` for a column a group
  remaps): ``v.meta`` the metadata, ``v.rids`` the chain, ``v.rids_of(X)`` a group's mapping;
- each guard's *locality*, read off its term (:func:`kvstate.spec.compile.read_sites`):
  ``global``, ``block`` (block variables only at its own parameter), ``slot`` (only the acting
  request's fields) or ``chain``;
- the longest-hit *search* (:func:`compile_search`): the one search the coordinator runs, every
  rule inlined; a rule that did not translate is called through the table's callables
  (``P[j]``).  ``kvstate/testing/search.py`` is its rule-by-rule oracle in the tests.

Hygiene: generated names are those of ``kvstate.spec.compile`` (``t_<var>``, ``r<n>_<field>``,
``p_<param>``) plus ``R``/``R_t_<var>``/``Rb``/``M``/``N``/``P`` and the generator's own locals;
no table name can shadow them.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import z3

from kvstate.spec.compile import (
    REQ_NAME,
    CompiledGuards,
    CompileError,
    Traced,
    block_columns,
    compile_guards,
    compile_hit_rule,
    define,
    memo,
    operand,
    prelude,
    read_sites,
    to_python,
    to_statements,
    trace_term,
)
from kvstate.spec.layers import HitRule, RuleScope, scope_range
from kvstate.spec.table import Table

TABLE_PREFIX = "t_"


def _var(n: str) -> str | None:
    return n[len(TABLE_PREFIX) :] if n.startswith(TABLE_PREFIX) else None


# ---- locality -------------------------------------------------------------------------------
def locality(tr: Traced) -> str:
    """What a traced term reads (its read sites), as the narrowest of:

    - ``"global"``: only global scalars (``now``, ``graph``, ...) and parameters;
    - ``"block"``: that, plus block variables read at exactly the parameter ``p_b``;
    - ``"slot"``: only the acting request's own scalar fields (``r0_phase``) and parameters;
    - ``"chain"``: anything else (quantifiers, ``N``, other blocks, other requests).

    A ``global``/``block`` term evaluates the same on a state indexed by record id (with
    ``p_b`` the record id) as on a one-block view, and a ``slot`` term the same on any state
    whose ``req(0)`` is the request: that is what lets an implementation skip building views.
    """
    if tr.quants:
        return "chain"
    kinds: set[str] = set()
    for n, at in read_sites(tr.term, tr.quants):
        req = REQ_NAME.match(n)
        if at is not None:
            kinds.add("block" if at == "p_b" and req is None else "chain")
        elif n == "N":
            kinds.add("chain")
        elif n.startswith("p_"):
            pass
        elif req is not None:
            kinds.add("slot" if req.group(1) == "0" else "chain")
        else:
            kinds.add("global")
    return combine(kinds)


def combine(kinds: set[str]) -> str:
    """The narrowest locality covering every kind read (one term's reads, or several terms')."""
    if kinds <= {"global"}:
        return "global"
    if kinds <= {"global", "block"}:
        return "block"
    if kinds <= {"slot"}:
        return "slot"
    return "chain"


# ---- the direct form ------------------------------------------------------------------------
def _via(mapped: frozenset[str]) -> Callable[[str], str | None]:
    """The direct form's index arrays: block column ``X`` read at chain position ``i`` as
    ``X[R[i]]`` (``R`` the chain's record ids), or ``X[R_X[i]]`` for a column in ``mapped``
    (read through its group's own block mapping); request arrays are read as they are."""

    def via(arr: str) -> str | None:
        if REQ_NAME.match(arr):
            return None
        return f"R_{arr}" if _var(arr) in mapped else "R"

    return via


def direct(tr: Traced, mapped: frozenset[str]) -> tuple[str, set[str]]:
    """The expression over the live record-indexed columns (see :func:`_via`)."""
    names: set[str] = set()
    return to_python(tr.term, names, tr.quants, _via(mapped)), names


def form(
    tr: Traced, columns: frozenset[str] | None, mapped: frozenset[str]
) -> tuple[str, set[str]]:
    """The plain form (``columns`` None) or the direct one."""
    return direct(tr, mapped) if columns is not None else (tr.expr, set(tr.names))


def bindings(
    names: set[str], bound: set[str], req: Callable[[int], str], columns: frozenset[str] | None
) -> list[str]:
    """The generated function's first lines (see ``kvstate.spec.compile.prelude``); in the
    direct form (``columns``: the block variables) columns are the live lists ``v.meta.X``, ``R``
    the chain's record ids ``v.rids`` and ``R_t_X`` those of a mapped column."""
    if columns is None:
        return prelude(names, bound, req)
    lines: list[str] = []
    rest: set[str] = set()
    if any(_var(n) in columns for n in names - bound):
        lines.append("M = v.meta")
    for n in sorted(names - bound):
        var = _var(n)
        if var is not None and var in columns:
            lines.append(f"{n} = M.{var}")
        elif n == "R":
            lines.append("R = v.rids")
        elif n.startswith("R_") and _var(n[2:]) is not None:
            lines.append(f"{n} = v.rids_of({_var(n[2:])!r})")
        else:
            rest.add(n)
    return lines + prelude(rest, set(), req)


# ---- guards ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class FastGuards:
    """Each action's whole guard as one function ``fn(view, params)`` for the acting request
    ``r == 0`` (``fused``; ``fused_direct`` in the direct form), only where every conjunct
    compiled; each such action's locality; subsets and run forms made on demand."""

    compiled: CompiledGuards
    fused: dict[str, Callable[[Any, dict[str, int]], bool]]
    fused_sources: dict[str, str]
    fused_direct: dict[str, Callable[[Any, dict[str, int]], bool]]
    locality: dict[str, str]
    conjunct_locality: dict[tuple[str, str], str]  # (action, conjunct) -> its locality
    columns: frozenset[str]
    mapped: frozenset[str]
    _subsets: dict[tuple[str, frozenset[str], bool], Any] = field(default_factory=dict)

    def _traced(self, action: str, skip: frozenset[str]) -> list[Traced] | None:
        out = []
        for n, _ in self.compiled.conjuncts[action]:
            if n in skip:
                continue
            tr = self.compiled.traced.get((action, n))
            if tr is None:
                return None
            out.append(tr)
        return out

    def locality_without(self, action: str, skip: frozenset[str]) -> str | None:
        """The locality of ``action``'s conjuncts not in ``skip`` (None: one did not compile)."""
        kinds = set()
        for n, _ in self.compiled.conjuncts[action]:
            if n not in skip:
                kind = self.conjunct_locality.get((action, n))
                if kind is None:
                    return None
                kinds.add(kind)
        return combine(kinds)

    def fused_without(
        self, action: str, skip: frozenset[str], direct: bool = False
    ) -> Callable[[Any, dict[str, int]], bool] | None:
        """The conjunction of ``action``'s conjuncts not in ``skip``, in one function (None if
        one of them did not compile).  Made once per (action, skip, form)."""
        key = (action, skip, direct)
        if key not in self._subsets:
            trs = self._traced(action, skip)
            fname = f"guard_{action}_subset".replace(".", "_")
            cols = self.columns if direct else None
            self._subsets[key] = None if trs is None else fuse(fname, trs, cols, self.mapped)[0]
        fn: Callable[[Any, dict[str, int]], bool] | None = self._subsets[key]
        return fn

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
            trs = self._traced(action, frozenset()) if action in self.compiled.conjuncts else None
            if trs is not None and self.locality.get(action) in ("block", "global"):
                names = set().union(*(tr.names for tr in trs)) if trs else set()
                reads = {_var(n) or n for n in names}
                if not (reads - self.columns) & written:
                    body = "".join(f"    {ln}\n" for ln in prelude(names - {"p_b"}, set(), str))
                    cond = " and ".join(f"({tr.expr})" for tr in trs) or "True"
                    fname = f"guard_{action}_run".replace(".", "_")
                    src = (
                        f"def {fname}(v, p, bs):\n{body}"
                        f"    for i, p_b in enumerate(bs):\n"
                        f"        if not ({cond}):\n            return i\n    return -1\n"
                    )
                    fn = define(fname, src)
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
                trs = self._traced(action, skip) if action in self.compiled.conjuncts else None
                if trs is None or self.locality_without(action, skip) not in ("block", "global"):
                    break
                conds.append(" and ".join(f"({tr.expr})" for tr in trs) or "True")
                names.update(*(tr.names for tr in trs))
            else:
                if not any(n.startswith("p_") and n != "p_b" for n in names):
                    body = "".join(f"    {ln}\n" for ln in prelude(names - {"p_b"}, set(), str))
                    cond = " or ".join(f"({c})" for c in conds) or "False"
                    # each column read once per block (the disjuncts read the same cells):
                    # ``t_X[p_b]`` becomes the loop's local ``B_t_X``
                    cells = sorted(set(_AT_B.findall(cond)))
                    cond = _AT_B.sub(lambda m: f"B_{m.group(1)}", cond)
                    reads = "".join(f"        B_{c} = {c}[p_b]\n" for c in cells)
                    src = (
                        f"def guards_enabled_run(v, bs):\n{body}"
                        f"    for i, p_b in enumerate(bs):\n{reads}"
                        f"        if {cond}:\n            return i\n    return -1\n"
                    )
                    fn = define("guards_enabled_run", src)
            self._subsets[key] = fn
        run: Callable[[Any, Sequence[int]], int] | None = self._subsets[key]
        return run


_AT_B = re.compile(r"(?<![\w.])(t_\w+)\[p_b\]")  # a table column read at the loop's block


def fuse(
    fname: str, trs: list[Traced], columns: frozenset[str] | None, mapped: frozenset[str]
) -> tuple[Callable[[Any, dict[str, int]], bool], str]:
    """One function for the conjunction of traced terms (direct form when ``columns``), in
    statement form (:func:`kvstate.spec.compile.to_statements`: a quantifier that is a
    conjunct of its own runs as a loop, not as ``all`` over a generator)."""
    names: set[str] = set()
    via = _via(mapped) if columns is not None else None
    stmts = to_statements([(tr.term, tr.quants) for tr in trs], names, via)
    lines = [*bindings(names, set(), str, columns), *stmts]
    src = f"def {fname}(v, p):\n" + "".join(f"    {ln}\n" for ln in lines)
    return define(fname, src), src


def fast_guards(table: Table, k: Any, mapped: frozenset[str] = frozenset()) -> FastGuards:
    return memo("fast-guards", (table, (k, mapped)), _fast_guards)  # type: ignore[no-any-return]


def _fast_guards(table: Table, km: tuple[Any, frozenset[str]]) -> FastGuards:
    k, mapped = km
    compiled = compile_guards(table, k)
    columns = block_columns(table)
    fused: dict[str, Callable[[Any, dict[str, int]], bool]] = {}
    sources: dict[str, str] = {}
    fused_direct: dict[str, Callable[[Any, dict[str, int]], bool]] = {}
    loc: dict[str, str] = {}
    each = {key: locality(tr) for key, tr in compiled.traced.items()}
    for a in table.actions:
        trs = [compiled.traced.get((a.name, c.name)) for c in a.guard]
        if any(tr is None for tr in trs):
            continue
        done = [tr for tr in trs if tr is not None]
        fname = f"guard_{a.name}".replace(".", "_")
        fused[a.name], sources[a.name] = fuse(fname, done, None, mapped)
        fused_direct[a.name], _ = fuse(fname + "_direct", done, columns, mapped)
        loc[a.name] = combine({each[(a.name, c.name)] for c in a.guard})
    return FastGuards(compiled, fused, sources, fused_direct, loc, each, columns, mapped)


# ---- the hit search -------------------------------------------------------------------------
@dataclass(frozen=True)
class CompiledSearch:
    """The longest-hit search as one function, ``(view, r, h_max) -> (hit, cuts, rejected)``,
    in the plain form (any state) and the direct form (a direct ``ChainView``)."""

    search: Callable[[Any, int, int], Any]
    search_direct: Callable[[Any, int, int], Any]
    sources: tuple[str, str]
    skipped: dict[str, str]  # rules called through the table's callables, and why
    reads: frozenset[str] | None  # what the rules read (None: a rule did not compile)


_R_AT_B = re.compile(r"(?<![\w.])R\[b\]")  # the chain's record id of block b, not X_R[b]


def compile_search(
    hit_rule: HitRule, table: Table, k: Any, mapped: frozenset[str] = frozenset()
) -> CompiledSearch:
    """``mapped``: block columns an implementation reads through a group's own block mapping
    (see :func:`direct`); it only shapes the direct form."""
    return memo("search", (hit_rule, table, (k, mapped)), _compile_search)  # type: ignore[no-any-return]


def _compile_search(
    hit_rule: HitRule, table: Table, km: tuple[Any, frozenset[str]]
) -> CompiledSearch:
    k, mapped = km
    c = compile_hit_rule(hit_rule, table, k)
    columns = block_columns(table)
    fns, srcs = [], []
    for cols in (None, columns):
        fn, src = _search_function(hit_rule, c.traced, table, k, cols, mapped)
        fns.append(fn)
        srcs.append(src)
    return CompiledSearch(fns[0], fns[1], (srcs[0], srcs[1]), dict(c.skipped), c.reads)


def _search_function(
    hit_rule: HitRule,
    traced: dict[str, Traced],
    table: Table,
    k: Any,
    columns: frozenset[str] | None,
    mapped: frozenset[str],
) -> tuple[Callable[[Any, int, int], Any], str]:
    """The longest-hit search as one function with every rule inlined:
    ``(view, r, h_max) -> (hit, cuts, rejected)``, ``cuts`` a list of
    ``(rule index, block or None, from, to)`` and ``rejected`` a ``(rule index, block)`` or None.

    The ALL-scope rules (prefix-closed) are scanned once over their range (every rule failing
    at the first bad block is recorded, the hit cut to the LCM boundary before it), then the
    other rules in table order at each candidate length, stepping down one LCM block per
    failure and merging consecutive cuts by the same rule.  A rule that did not compile is
    called as ``P[j](v, r, x)``, the table's own callable."""
    L = k.L
    rules = hit_rule.rules
    names: set[str] = set()
    env = {"P": [x.pred for x in rules]}

    def cond(j: int, x: str) -> str:
        tr = traced.get(rules[j].qualname)
        if tr is None:
            return f"P[{j}](v, r, {x})"
        e, n = form(tr, columns, mapped)
        names.update(n)
        return f"({e})"

    def scope(j: int) -> tuple[str, str]:
        lo, hi = trace_term(lambda s: scope_range(rules[j], s, z3.Int("h")), table, k)
        return operand(lo, names), operand(hi, names)

    def bind(indent: str, *exprs: str) -> tuple[list[str], list[str]]:
        """A loop body reading block ``b`` of the chain's records once (``Rb = R[b]``), where
        the direct forms read ``R[b]`` several times per block."""
        if not any(_R_AT_B.search(e) for e in exprs):
            return [], list(exprs)
        return [f"{indent}Rb = R[b]"], [_R_AT_B.sub("Rb", e) for e in exprs]

    body: list[str] = ["h = h_max", "cuts = []"]
    alls = [i for i, x in enumerate(rules) if x.scope is RuleScope.ALL]
    if alls:
        lo, hi = scope(alls[0])
        names.add("N")
        first, (fused, each) = bind(
            "        ",
            " and ".join(cond(i, "b") for i in alls),
            ", ".join(f"({i}, {cond(i, 'b')})" for i in alls),
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
            body += [f"    if fail < 0 and not {cond(j, 'h')}:", f"        fail = {j}"]
            continue
        lo, hi = scope(j)
        names.add("N")
        first, (c,) = bind("            ", cond(j, "b"))
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
    pre = bindings(names, {"b", "h", "h_max", "i", "ok", "Rb"}, acting, columns)
    fname = "search_direct" if columns is not None else "search"
    src = f"def {fname}(v, r, h_max):\n" + "".join(f"    {ln}\n" for ln in [*pre, *body])
    return define(fname, src, env), src


__all__ = ["CompileError", "CompiledSearch", "FastGuards", "compile_search", "fast_guards"]
