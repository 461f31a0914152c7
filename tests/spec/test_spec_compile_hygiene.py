"""Generated code is hygienic: a table may name its variables anything a Python identifier allows
-- the generator's own locals (``fail``, ``cuts``, ``h``, ``R``, ...), builtins it calls
(``all``, ``range``, ``max``, ``min``) or the shapes of its derived names (``p_b``, ``r0_x``,
``R_swa``, ``t_ckv``, ``P``) -- and the compiled predicates, guards and the search generated from
them (impl/fastforms.py) still mean what the table says."""

from __future__ import annotations

import linecache
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvstate.impl.fastforms import compile_search
from kvstate.impl.twins import suspend_twins
from kvstate.spec import default_table
from kvstate.spec.compile import compile_guards, compile_hit_rule
from kvstate.spec.errors import SpecError
from kvstate.spec.expr import AND
from kvstate.spec.layers import Rule, RuleScope
from kvstate.spec.table import Conjunct, Scope, Table, Var

# every local and builtin the generator emits, and names shaped like its derived names
COLLIDING = (
    "fail", "where", "cuts", "to", "h", "b", "i", "ok", "Rb", "R", "M", "v", "r", "p", "x",
    "h_max", "q0", "forall0", "all", "range", "max", "min", "True_", "t_ckv", "p_b", "r0_phase",
    "R_swa", "lo", "hi", "P", "env", "define", "rq0",
)  # fmt: skip
BLOCK_NAMES = ("R", "Rb", "M", "q0", "fail")


def odd_table() -> tuple[Table, tuple[Rule, ...]]:
    t = default_table()
    extra = tuple(Var(n, Scope.GLOBAL, lambda k, N, b: 0) for n in COLLIDING)
    extra += tuple(Var(n + "_blk", Scope.BLOCK, lambda k, N, b: 0) for n in BLOCK_NAMES)
    extra = tuple(v for v in extra if v.name not in {x.name for x in t.vars})
    t = replace(t, vars=(*t.vars, *extra))
    rules = (
        Rule(
            "odd_globals",
            "L1",
            "all",
            "all",
            RuleScope.HIT,
            lambda s, r, h: AND(*[getattr(s, n) == j for j, n in enumerate(COLLIDING)]),
        ),
        Rule(
            "odd_blocks",
            "L3",
            "all",
            "all",
            RuleScope.ALL,
            lambda s, r, b: AND(*[getattr(s, n + "_blk")[b] == 0 for n in BLOCK_NAMES]),
        ),
        Rule("fail_zero", "L1", "all", "all", RuleScope.HIT, lambda s, r, h: s.fail == 0),
    )
    return t, rules


class View(SimpleNamespace):
    def req(self, r: int) -> Any:
        return self.reqs[r]

    def forall_blocks(self, lo: int, hi: int, body: Any) -> bool:
        return all(body(b) for b in range(max(lo, 0), min(hi, self.N)))


def oracle(hr: Any, v: View, h_max: int) -> tuple[int, bool]:
    """The longest candidate the search steps through where the table's callables hold."""
    L = v.k.L
    h = h_max
    while True:
        if hr.holds(v, 0, h):
            return h, False
        if h <= 0:
            return 0, True
        h = ((h - 1) // L) * L


def test_odd_names_compile_to_what_the_table_says() -> None:
    t, rules = odd_table()
    k = replace(t.consts, R=2)
    hr = replace(t.hit_rule, rules=(*t.hit_rule.rules, *rules))
    c = compile_search(hr, t, k)
    assert not c.skipped and not compile_hit_rule(hr, t, k).skipped

    @settings(max_examples=200, deadline=None)
    @given(data=st.data(), n=st.integers(1, 5))
    def check(data: st.DataObject, n: int) -> None:
        good = data.draw(st.booleans())
        glob = {
            name: (j if good or data.draw(st.integers(0, 3)) else j + 1)
            for j, name in enumerate(COLLIDING)
        }
        glob["fail"] = 0 if good else data.draw(st.integers(0, 1))
        # the default rules hold everywhere on the initial state of a READY chain; the odd
        # block columns fail where drawn non-zero
        base = {v.name: [0] * n for v in t.vars if v.scope is Scope.BLOCK}
        for col in t.vars:
            if col.scope is Scope.GLOBAL and col.name not in glob:
                glob[col.name] = col.init(k, n, None)
        for col in t.vars:
            if col.scope is Scope.BLOCK:
                base[col.name] = [col.init(k, n, b) for b in range(n)]
        for name in BLOCK_NAMES:
            base[name + "_blk"] = data.draw(
                st.lists(st.sampled_from([0, 0, 0, 1]), min_size=n, max_size=n)
            )
        me = SimpleNamespace(deadline=data.draw(st.integers(0, 6)), phase=0, hit=0, pinned=0)
        v = View(N=n, k=k, reqs=(me, me), **base, **glob)
        h_max = data.draw(st.integers(0, (n + 1) * k.L))
        hit, _cuts, rejected = c.search(v, 0, h_max)
        assert (hit, rejected is not None) == oracle(hr, v, h_max)

    check()


def test_the_fail_variable_is_not_overwritten_by_the_search() -> None:
    """The miscompile found in review: a global ``fail`` with a hit rule ``s.fail == 0`` was
    shadowed by the generated search's own ``fail = -1`` and rejected every hit."""
    t, rules = odd_table()
    k = replace(t.consts, R=2)
    hr = replace(t.hit_rule, rules=(rules[2],))
    c = compile_search(hr, t, k)
    v = View(N=1, k=k, reqs=(), fail=0)
    assert hr.holds(v, 0, 0)
    assert c.search(v, 0, 0) == (0, [], None)


def test_guards_read_odd_names_through_their_own_namespace() -> None:
    t = default_table()
    extra = tuple(Var(n, Scope.GLOBAL, lambda k, N, b: 0) for n in ("v", "p", "fail", "all"))
    a = next(x for x in t.actions if any(q.name == "b" for q in x.params))
    odd = Conjunct("odd", lambda s, p: AND(s.v == 1, s.p == 2, s.fail == 3, s.all == 4, p.b == 5))
    t = replace(t, vars=(*t.vars, *extra))
    t = replace(
        t, actions=tuple(replace(x, guard=(*x.guard, odd)) if x is a else x for x in t.actions)
    )
    g = compile_guards(t, replace(t.consts, R=2))
    fn = dict(g.conjuncts[a.name])["odd"]
    assert fn(SimpleNamespace(v=1, p=2, fail=3, all=4), {"b": 5}) is True
    assert fn(SimpleNamespace(v=1, p=2, fail=3, all=5), {"b": 5}) is False


def test_generated_source_is_registered_for_tracebacks() -> None:
    t = default_table()
    k = replace(t.consts, R=2)
    with suspend_twins():  # the compiled build's twins of these sources are compiled code
        preds = compile_hit_rule(t.hit_rule, t, k).rules
        c = compile_search(t.hit_rule, t, k)
    for rule in t.hit_rule.rules:
        pred = preds[rule.qualname]
        assert "".join(linecache.getlines(pred.fn.__code__.co_filename)) == pred.source
    filename = c.search.__code__.co_filename
    assert "".join(linecache.getlines(filename)) == c.sources[0]


@pytest.mark.parametrize("bad", ["1x", "for", "_private", "a-b", "N", "req"])
def test_table_names_must_be_public_identifiers(bad: str) -> None:
    t = default_table()
    with pytest.raises(SpecError, match="name"):
        Table.build(
            name="odd",
            geometry=t.geometry,
            vars=(*t.vars, Var(bad, Scope.GLOBAL, lambda k, N, b: 0)),
            actions=t.actions,
            invariants=t.invariants,
            hit_rule=t.hit_rule,
        )
