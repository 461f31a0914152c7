"""The compiled hit rule (spec/compile.py) agrees with the table's callables, on every geometry
preset, for random states -- including states the allocator never produces."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import pytest
import z3
from hypothesis import given
from hypothesis import strategies as st

from kvstate.spec import default_table
from kvstate.spec.compile import CompileError, compile_hit_rule, to_python
from kvstate.spec.geometry import deepseek_v4_flash, small
from kvstate.spec.layers import Rule, RuleScope

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
    assert c.reads is not None and set(c.traced) == set(c.rules)


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
    assert len(c.rules) == len(t.hit_rule.rules)  # the others still compile
    assert c.reads is None  # what the opaque rule reads is unknown
