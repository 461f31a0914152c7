"""The implementation's fast forms (impl/fastforms.py) of the table's guards agree with the
table's callables: each conjunct (compiled by spec/compile.py), each action's fused guard, a
guard's locality (evaluating without a view), and the direct forms over live record-indexed
lists -- on random states, including states the allocator never produces."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvstate.impl.fastforms import fast_guards
from kvstate.spec import default_table
from kvstate.spec.geometry import deepseek_v4_flash, small
from kvstate.spec.table import ParamKind, Scope

GEOMETRIES = {"small": small(), "small32": small(block_tokens=32), "flash": deepseek_v4_flash()}


class View(SimpleNamespace):
    """A concrete state with the same quantifier semantics as ``ConcreteState``/``ChainView``."""

    def req(self, r: int) -> Any:
        return self.reqs[r]

    def forall_blocks(self, lo: int, hi: int, body: Any) -> bool:
        return all(body(b) for b in range(max(lo, 0), min(hi, self.N)))


# ---- action guards ------------------------------------------------------------------------
PARAM_VALUES = {
    ParamKind.TOKENS: st.integers(-2, 40),
    ParamKind.ADDR: st.integers(-1, 6),
    ParamKind.TICKS: st.integers(0, 6),
    ParamKind.FMT: st.integers(-1, 4),
}


@st.composite
def guard_cases(draw: st.DrawFn, table: Any, k: Any) -> tuple[View, Any]:
    n = draw(st.integers(1, 4))
    val = st.integers(-1, 8)
    fields: dict[str, Any] = {"N": n, "k": k}
    req_fields: list[dict[str, Any]] = [{}, {}]
    for var in table.vars:
        if var.scope is Scope.BLOCK:
            fields[var.name] = draw(st.lists(val, min_size=n, max_size=n))
        elif var.scope is Scope.GLOBAL:
            fields[var.name] = draw(val)
        else:
            for rf in req_fields:
                if var.scope is Scope.REQ:
                    rf[var.name] = draw(st.integers(-1, 40))
                else:
                    rf[var.name] = tuple(draw(st.lists(val, min_size=n, max_size=n)))
    fields["reqs"] = tuple(SimpleNamespace(**rf) for rf in req_fields)
    params: dict[str, int] = {}
    for action in table.actions:  # one value per parameter name, shared by every action
        for prm in action.params:
            if prm.name in params:
                continue
            if prm.kind is ParamKind.BLOCK:
                params[prm.name] = draw(st.integers(0, n - 1))
            elif prm.kind is ParamKind.REQ:
                params[prm.name] = 0
            else:
                params[prm.name] = draw(PARAM_VALUES[prm.kind])
    return View(**fields), SimpleNamespace(**params)


@pytest.mark.parametrize("name", sorted(GEOMETRIES))
def test_compiled_guards_agree_with_the_table(name: str) -> None:
    t = default_table(GEOMETRIES[name])
    k = replace(t.consts, R=2)
    c = fast_guards(t, k)
    assert c.compiled.skipped == {}

    @settings(max_examples=300)
    @given(case=guard_cases(t, k))
    def check(case: tuple[View, Any]) -> None:
        v, p = case
        for action in t.actions:  # every conjunct of every action on the same state
            compiled = dict(c.compiled.conjuncts[action.name])
            d = vars(p)
            for conj in action.guard:
                assert compiled[conj.name](v, d) == conj.fn(v, p), (action.name, conj.name)
            whole = all(conj.fn(v, p) for conj in action.guard)
            assert c.fused[action.name](v, d) == whole, action.name

    check()


# ---- guard locality: evaluating without a view ----------------------------------------------
@pytest.mark.parametrize("name", sorted(GEOMETRIES))
def test_local_guards_agree_on_record_indexed_and_slot_states(name: str) -> None:
    """A "block"/"global" guard on the whole record-indexed columns at p_b = the record equals
    the same guard on a one-block view of that record; a "slot" guard on a state holding only
    the acting request equals it on the full view."""
    t = default_table(GEOMETRIES[name])
    k = replace(t.consts, R=2)
    c = fast_guards(t, k)
    kinds = set(c.locality.values())
    assert {"block", "global", "slot", "chain"} <= kinds  # the default table has all four
    assert c.locality["evict_start"] == "block" and c.locality["pin"] == "chain"

    @settings(max_examples=200)
    @given(case=guard_cases(t, k), data=st.data())
    def check(case: tuple[View, Any], data: st.DataObject) -> None:
        v, p = case
        rec = data.draw(st.integers(0, v.N - 1))
        one = View(**{**vars(v), "N": 1})
        for var in t.vars:
            if var.scope is Scope.BLOCK:
                setattr(one, var.name, [getattr(v, var.name)[rec]])
        slot_only = View(reqs=(v.reqs[0],))
        for action in t.actions:
            kind = c.locality.get(action.name)
            fn = c.fused[action.name]
            if kind in ("block", "global"):
                want = fn(one, {**vars(p), "b": 0})
                assert fn(v, {**vars(p), "b": rec}) == want, action.name
            elif kind == "slot":
                assert fn(slot_only, vars(p)) == fn(v, vars(p)), action.name

    check()


def test_locality_is_chain_for_other_blocks_quantifiers_and_other_requests() -> None:
    t = default_table()
    base = t.action("evict_start")
    k = replace(t.consts, R=2)
    variants = {
        "next block": lambda s, p: s.ckv[p.b + 1] == 2,
        "pool size": lambda s, p: p.b < s.N,
        "quantifier": lambda s, p: s.forall_blocks(0, s.N, lambda b: s.ref[b] == 0),
        "other request": lambda s, p: s.req(1).phase == 0,
        "slot and a global": lambda s, p: s.req(0).phase == s.now,
    }
    for why, fn in variants.items():
        guard = (*base.guard, replace(base.guard[0], name="extra", fn=fn))
        table = t.derive(replace_action=[replace(base, guard=guard)])
        assert fast_guards(table, k).locality["evict_start"] == "chain", why
    assert fast_guards(t, k).locality["evict_start"] == "block"


# ---- the direct forms: live record-indexed lists read through the chain's record ids --------
class Records(SimpleNamespace):
    """Record-indexed columns (the implementation's metadata lists)."""


def direct_view(v: View, table: Any, data: st.DataObject, mapped: frozenset[str]) -> View:
    """The same chain as ``v`` laid out as the implementation stores it: every block column a
    list over records (other records hold noise), block ``b`` at record ``rids[b]``, a mapped
    column at record ``rids_of(col)[b]``."""
    n = v.N
    n_rec = n + data.draw(st.integers(0, 4))
    noise = st.integers(-1, 8)
    perm = data.draw(st.permutations(range(n_rec)))
    rids = perm[:n]
    own = {c: data.draw(st.permutations(range(n_rec)))[:n] for c in mapped}
    cols: dict[str, list[int]] = {}
    for var in table.vars:
        if var.scope is Scope.BLOCK:
            col = [data.draw(noise) for _ in range(n_rec)]
            where = own.get(var.name, rids)
            for b in range(n):
                col[where[b]] = getattr(v, var.name)[b]
            cols[var.name] = col
    d = View(**vars(v))
    d.meta = Records(**cols)
    d.rids = rids
    d.rids_of = lambda c: own.get(c, rids)
    return d


@pytest.mark.parametrize("mapped", [frozenset(), frozenset({"swa", "tail"})])
@pytest.mark.parametrize("name", ["small", "flash"])
def test_direct_forms_agree_with_the_table(name: str, mapped: frozenset[str]) -> None:
    t = default_table(GEOMETRIES[name])
    k = replace(t.consts, R=2)
    g = fast_guards(t, k, mapped)
    assert set(g.fused_direct) == {a.name for a in t.actions}

    @settings(max_examples=200)
    @given(case=guard_cases(t, k), data=st.data())
    def check(case: tuple[View, Any], data: st.DataObject) -> None:
        v, p = case
        d = direct_view(v, t, data, mapped)
        for action in t.actions:
            whole = all(conj.fn(v, p) for conj in action.guard)
            assert g.fused_direct[action.name](d, vars(p)) == whole, action.name
            names = frozenset(c.name for c in action.guard)
            for conj in action.guard:  # each conjunct alone, in the direct form
                one = g.fused_without(action.name, names - {conj.name}, direct=True)
                assert one is not None and one(d, vars(p)) == conj.fn(v, p), (action, conj)

    check()


def test_fused_guards_loop_over_their_quantifiers() -> None:
    """A quantifier that is a conjunct of its own runs as a loop in the fused forms (no
    generator and ``all`` call per guard call: kvstate.spec.compile.to_statements), and every
    fused guard returns a bool; the agreement with the table is the tests above."""
    t = default_table(GEOMETRIES["flash"])
    g = fast_guards(t, replace(t.consts, R=2))
    src = g.fused_sources["pin"]
    assert "for q0 in range(" in src and "all(" not in src, src
    assert src.rstrip().endswith("return True"), src
