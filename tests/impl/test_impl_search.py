"""The compiled whole search (spec/compile.py) returns exactly what the generic search returns
-- hit, every shortening in order, the rejection -- on random chains, in both of its forms."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvstate.impl.coordinator import Coordinator
from kvstate.impl.meta import BlockMeta, ChainView, Others
from kvstate.spec import default_table
from kvstate.spec.compile import compile_hit_rule
from kvstate.spec.geometry import deepseek_v4_flash, small
from kvstate.spec.layers import Rule, RuleScope
from kvstate.spec.phases import CKV, Fmt, Indexer, Pipe, Swa, Tail

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


@pytest.mark.parametrize("extra", [False, True])
@pytest.mark.parametrize("remap", [False, True])
@pytest.mark.parametrize("name", sorted(GEOMETRIES))
def test_compiled_search_equals_the_generic_search(name: str, remap: bool, extra: bool) -> None:
    t = default_table(GEOMETRIES[name])
    k = replace(t.consts, R=2)
    shift = lambda rids: list(rids[1:]) + [0]  # noqa: E731 - a remapping group (seeded-bug shape)
    maps = {"swa": shift} if remap else {}
    hr = replace(t.hit_rule, rules=(*t.hit_rule.rules, NONZERO)) if extra else t.hit_rule
    c = compile_hit_rule(hr, t, k, frozenset(maps))
    assert c.search is not None and c.search_direct is not None
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
        want = coord.search_generic(ChainView(m, rids, k, **kw), 0, h_max)
        assert coord.search(direct, 0, h_max) == want
        assert coord.search(plain, 0, h_max) == want
        assert not plain._direct and direct._direct
        if extra and h_max == 0:
            assert want.rejected is not None  # the rejection path is exercised

    check()
