"""The compiled hit rule (spec/compile.py) agrees with the table's callables, on every geometry
preset, for random states -- including states the allocator never produces."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import pytest
import z3
from hypothesis import given, settings
from hypothesis import strategies as st

from kvstate.spec import default_table
from kvstate.spec.compile import CompileError, compile_guards, compile_hit_rule, to_python
from kvstate.spec.geometry import deepseek_v4_flash, small
from kvstate.spec.layers import Rule, RuleScope
from kvstate.spec.table import ParamKind, Scope

GEOMETRIES = {"small": small(), "small32": small(block_tokens=32), "flash": deepseek_v4_flash()}
COLUMNS = ("ckv", "fmt", "idx", "iver", "ver", "ldpipe", "prog", "lease", "swa", "tail")


class View(SimpleNamespace):
    """A concrete state with the same quantifier semantics as ``ConcreteState``/``ChainView``."""

    def req(self, r: int) -> Any:
        return self.reqs[r]

    def forall_blocks(self, lo: int, hi: int, body: Any) -> bool:
        return all(body(b) for b in range(max(lo, 0), min(hi, self.N)))


@st.composite
def views(draw: st.DrawFn, k: Any) -> View:
    n = draw(st.integers(1, 6))
    small_int = st.integers(-1, 4)
    cols = {c: draw(st.lists(small_int, min_size=n, max_size=n)) for c in COLUMNS}
    cols["prog"] = draw(st.lists(st.sampled_from([0, 1, k.load_steps]), min_size=n, max_size=n))
    deadline = draw(st.integers(-1, 5))
    return View(N=n, k=k, reqs=(SimpleNamespace(deadline=deadline),), **cols)


@pytest.mark.parametrize("name", sorted(GEOMETRIES))
def test_every_default_rule_compiles(name: str) -> None:
    t = default_table(GEOMETRIES[name])
    c = compile_hit_rule(t.hit_rule, t, replace(t.consts, R=2))
    assert c.skipped == {}
    assert set(c.rules) == {r.qualname for r in t.hit_rule.rules}
    assert c.first_bad is not None and "for b in range(lo, hi)" in c.first_bad_source


@pytest.mark.parametrize("name", sorted(GEOMETRIES))
def test_compiled_predicates_agree_with_the_table(name: str) -> None:
    t = default_table(GEOMETRIES[name])
    k = replace(t.consts, R=2)
    c = compile_hit_rule(t.hit_rule, t, k)

    @given(v=views(k), h=st.integers(-3, 7 * k.L + 3))
    def check(v: View, h: int) -> None:
        for rule in t.hit_rule.rules:
            fn = c.rules[rule.qualname].fn
            if rule.scope is RuleScope.HIT:
                assert fn(v, 0, h) == rule.pred(v, 0, h), rule.qualname
            else:
                for b in range(v.N):
                    assert fn(v, 0, b) == rule.pred(v, 0, b), (rule.qualname, b)
        lo, hi = 0, v.N
        want = next((b for b in range(lo, hi) if not all(r.pred(v, 0, b) for r in c.all_rules)), -1)
        assert c.first_bad is not None
        assert c.first_bad(v, 0, lo, hi) == want

    check()


def test_untranslatable_terms_are_refused_not_guessed() -> None:
    x, y = z3.Ints("x y")
    with pytest.raises(CompileError, match="positive constant divisors"):
        to_python(x / y == 1, set())
    with pytest.raises(CompileError):
        to_python(z3.ForAll([x], x > y), set())


def test_a_quantified_rule_compiles_to_the_same_loop() -> None:
    t = default_table()
    k = replace(t.consts, R=2)
    quantified = Rule(
        "all_ready", "L3", "Compressed KV", "csa", RuleScope.HIT,
        lambda s, r, h: s.forall_blocks(1, h, lambda b: s.ckv[b] == 2),
    )  # fmt: skip
    hr = replace(t.hit_rule, rules=(*t.hit_rule.rules, quantified))
    c = compile_hit_rule(hr, t, k)
    fn = c.rules["L3.all_ready"].fn
    for ckv in ([2, 2, 2], [2, 0, 2], [0, 2, 2], [2, 2, 0]):
        v = View(N=3, k=k, ckv=ckv, reqs=())
        for h in range(-1, 5):
            assert fn(v, 0, h) == quantified.pred(v, 0, h), (ckv, h)


def test_an_untraceable_rule_stays_interpreted_and_is_listed() -> None:
    t = default_table()
    opaque = Rule(
        "opaque", "L3", "Compressed KV", "csa", RuleScope.HIT,
        lambda s, r, h: bool(h),  # Python truth of a Z3 term: cannot be traced
    )  # fmt: skip
    hr = replace(t.hit_rule, rules=(*t.hit_rule.rules, opaque))
    c = compile_hit_rule(hr, t, replace(t.consts, R=2))
    assert "L3.opaque" in c.skipped and "L3.opaque" not in c.rules
    assert c.first_bad is not None  # the ALL rules still fuse


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
    c = compile_guards(t, k)
    assert c.skipped == {}

    @settings(max_examples=300)
    @given(case=guard_cases(t, k))
    def check(case: tuple[View, Any]) -> None:
        v, p = case
        for action in t.actions:  # every conjunct of every action on the same state
            compiled = dict(c.conjuncts[action.name])
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
    c = compile_guards(t, k)
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
        assert compile_guards(table, k).locality["evict_start"] == "chain", why
    assert compile_guards(t, k).locality["evict_start"] == "block"


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
    d._m = Records(**cols)
    d._rids = rids
    d.rids_of = lambda c: own.get(c, rids)
    return d


@pytest.mark.parametrize("mapped", [frozenset(), frozenset({"swa", "tail"})])
@pytest.mark.parametrize("name", ["small", "flash"])
def test_direct_forms_agree_with_the_table(name: str, mapped: frozenset[str]) -> None:
    t = default_table(GEOMETRIES[name])
    k = replace(t.consts, R=2)
    hr = compile_hit_rule(t.hit_rule, t, k, mapped)
    g = compile_guards(t, k, mapped)
    assert hr.first_bad_direct is not None and hr.points_hold_direct is not None
    assert set(g.fused_direct) == {a.name for a in t.actions}

    lengths = st.one_of(st.integers(-3, 7 * k.L + 3), st.integers(0, 7).map(lambda x: x * k.L))

    @settings(max_examples=200)
    @given(case=guard_cases(t, k), data=st.data(), h=lengths)
    def check(case: tuple[View, Any], data: st.DataObject, h: int) -> None:
        v, p = case
        d = direct_view(v, t, data, mapped)
        want = next((b for b in range(v.N) if not all(r.pred(v, 0, b) for r in hr.all_rules)), -1)
        assert hr.first_bad_direct(d, 0, 0, v.N) == want
        for rule in t.hit_rule.rules:  # each rule alone, as the search names culprits
            fn = hr.rules_direct[rule.qualname]
            if rule.scope is RuleScope.HIT:
                assert fn(d, 0, h) == rule.pred(v, 0, h), rule.qualname
            else:
                for b in range(v.N):
                    assert fn(d, 0, b) == rule.pred(v, 0, b), (rule.qualname, b)
        points = [r for r in t.hit_rule.rules if r.scope is not RuleScope.ALL]
        assert hr.points_hold_direct(d, 0, h) == all(
            bool(t.hit_rule.rule_holds(r, v, 0, h)) for r in points
        )
        for action in t.actions:
            whole = all(conj.fn(v, p) for conj in action.guard)
            assert g.fused_direct[action.name](d, vars(p)) == whole, action.name
            names = frozenset(c.name for c in action.guard)
            for conj in action.guard:  # each conjunct alone, in the direct form
                one = g.fused_without(action.name, names - {conj.name}, direct=True)
                assert one is not None and one(d, vars(p)) == conj.fn(v, p), (action, conj)

    check()
