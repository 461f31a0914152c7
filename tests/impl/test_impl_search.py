"""The one hit search (impl/fastforms.py, every rule inlined) returns exactly what the
rule-by-rule oracle (kvstate/testing/search.py, the table's callables) returns -- hit, every
shortening in order, the rejection -- on random chains, in both of its forms; also with rules
that do not translate (called through the table's callables) and a table variable named like
the search's own locals."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvstate.impl.coordinator import Coordinator
from kvstate.impl.fastforms import compile_search
from kvstate.impl.meta import BlockMeta, ChainView, Others
from kvstate.spec import default_table
from kvstate.spec.expr import AND
from kvstate.spec.geometry import deepseek_v4_flash, small
from kvstate.spec.layers import Rule, RuleScope
from kvstate.spec.phases import CKV, Fmt, Indexer, Pipe, Swa, Tail
from kvstate.spec.table import Scope, Var
from kvstate.testing import search as oracle

GEOMETRIES = {"small": small(), "flash": deepseek_v4_flash()}


def chains(k: Any) -> st.SearchStrategy[tuple[BlockMeta, list[int]]]:
    @st.composite
    def build(draw: st.DrawFn) -> tuple[BlockMeta, list[int]]:
        m = BlockMeta(k.load_steps)
        n = draw(st.integers(0, 6))
        rids = [m.new(bytes([i]), None, 0) for i in range(n)]
        rids = [draw(st.sampled_from([0, r])) if draw(st.booleans()) else r for r in rids]
        good = draw(st.integers(0, 10))  # most blocks valid, so long hits happen
        for i in range(1, len(m)):
            ok = draw(st.integers(0, 10)) < good
            m.ckv[i] = int(CKV.READY) if ok else int(draw(st.sampled_from(list(CKV))))
            m.idx[i] = int(Indexer.PRESENT) if ok else int(draw(st.sampled_from(list(Indexer))))
            m.ver[i] = m.iver[i] = draw(st.integers(0, 2))
            if not ok:
                m.iver[i] = draw(st.integers(0, 2))
            m.fmt[i] = int(Fmt.PRIMARY) if ok else draw(st.integers(0, 3))
            m.prog[i] = k.load_steps if ok else draw(st.integers(0, k.load_steps))
            m.ldpipe[i] = int(Pipe.NONE) if ok else int(draw(st.sampled_from(list(Pipe))))
            m.swa[i] = int(Swa.VALID) if ok else int(draw(st.sampled_from(list(Swa))))
            m.tail[i] = int(Tail.SEALED) if ok else int(draw(st.sampled_from(list(Tail))))
            m.lease[i] = draw(st.integers(0, 6))
        return m, rids

    return build()


# a length rule that fails at 0 makes the search reject (the default rules all hold at 0)
NONZERO = Rule("nonzero", "L1", "all", "all", RuleScope.HIT, lambda s, r, h: h > 0)
# rules that do not translate (Python truth of a Z3 term): the search calls the table's callable
OPAQUE_LEN = Rule("opaque_len", "L1", "all", "all", RuleScope.HIT, lambda s, r, h: bool(h != 5))
OPAQUE_ALL = Rule(
    "opaque_all", "L3", "Compressed KV", "csa", RuleScope.ALL,
    lambda s, r, b: bool(s.lease[b] != 5),
)  # fmt: skip
OPAQUE_WIN = Rule(
    "opaque_win", "L2", "SWA", "swa", RuleScope.WINDOW, lambda s, r, b: bool(s.lease[b] != 4)
)
EXTRA = {
    "none": (),
    "nonzero": (NONZERO,),
    "opaque": (OPAQUE_ALL, OPAQUE_LEN, OPAQUE_WIN, NONZERO),
}


@pytest.mark.parametrize("extra", sorted(EXTRA))
@pytest.mark.parametrize("remap", [False, True])
@pytest.mark.parametrize("name", sorted(GEOMETRIES))
def test_the_search_equals_the_rule_by_rule_oracle(name: str, remap: bool, extra: str) -> None:
    t = default_table(GEOMETRIES[name])
    k = replace(t.consts, R=2)
    shift = lambda rids: list(rids[1:]) + [0]  # noqa: E731 - a remapping group (seeded-bug shape)
    maps = {"swa": shift} if remap else {}
    hr = replace(t.hit_rule, rules=(*t.hit_rule.rules, *EXTRA[extra]))
    c = compile_search(hr, t, k, frozenset(maps))
    assert set(c.skipped) == {x.qualname for x in EXTRA[extra] if x.name.startswith("opaque")}
    assert (c.reads is None) == bool(c.skipped)
    if c.skipped:
        assert "P[" in c.sources[0] and "P[" in c.sources[1]
    coord = Coordinator(hr, c)

    @settings(max_examples=300)
    @given(chain=chains(k), deadline=st.integers(0, 6), data=st.data())
    def check(chain: tuple[BlockMeta, list[int]], deadline: int, data: st.DataObject) -> None:
        m, rids = chain
        top = len(rids) * k.L + k.L
        h_max = data.draw(st.one_of(st.integers(0, top), st.integers(0, 7).map(lambda x: x * k.L)))
        me = SimpleNamespace(deadline=deadline, phase=0, hit=0, pinned=0)
        kw: dict[str, Any] = dict(now=0, graph=0, io_inflight=0, reqs=(me, Others(0)), maps=maps)
        direct = ChainView(m, rids, k, **kw)
        plain = ChainView(m, rids, k, overrides={"fmt": lambda r: [m.fmt[i] for i in r]}, **kw)
        want = oracle.search(hr, ChainView(m, rids, k, **kw), 0, h_max)
        assert coord.search(direct, 0, h_max) == want
        assert coord.search(plain, 0, h_max) == want
        assert not plain._direct and direct._direct
        if extra != "none" and h_max == 0:
            assert want.rejected is not None  # the rejection path is exercised

    check()


class View(SimpleNamespace):
    def req(self, r: int) -> Any:
        return self.reqs[r]

    def forall_blocks(self, lo: int, hi: int, body: Any) -> bool:
        return all(body(b) for b in range(max(lo, 0), min(hi, self.N)))


@pytest.mark.parametrize("opaque", [False, True])
def test_a_table_variable_named_fail_is_not_the_search_s_own(opaque: bool) -> None:
    """The miscompile found in review: a global ``fail`` with a hit rule ``s.fail == 0`` was
    shadowed by the generated search's own ``fail = -1`` and rejected every hit; ``P`` (the
    table's callables) is the search's own name too."""
    t = default_table()
    extra = tuple(Var(n, Scope.GLOBAL, lambda k, N, b: 0) for n in ("fail", "P", "where"))
    t = replace(t, vars=(*t.vars, *extra))
    k = replace(t.consts, R=2)
    if opaque:
        pred = lambda s, r, h: bool(AND(s.fail == 0, s.P == 0, s.where == 0))  # noqa: E731
    else:
        pred = lambda s, r, h: AND(s.fail == 0, s.P == 0, s.where == 0)  # noqa: E731
    rule = Rule("fail_zero", "L1", "all", "all", RuleScope.HIT, pred)
    hr = replace(t.hit_rule, rules=(rule, NONZERO))
    c = compile_search(hr, t, k)
    assert bool(c.skipped) == opaque
    coord = Coordinator(hr, c)
    for fail in (0, 1):
        for h_max in (0, 3, k.L, 2 * k.L + 1):
            v = View(N=2, k=k, reqs=(), fail=fail, P=0, where=0, _direct=False)
            assert coord.search(v, 0, h_max) == oracle.search(hr, v, 0, h_max)
    v = View(N=1, k=k, reqs=(), fail=0, P=0, where=0, _direct=False)
    assert coord.search(v, 0, k.L).hit == k.L
