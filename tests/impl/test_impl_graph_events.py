"""A subscriber that acts on ``STALE_GRAPH`` as it receives it sees the block as moved.

An engine recaptures its CUDA graph when the cache reports it stale.  The event used to be
delivered in the middle of the move (before the record's new address and phase were written),
so a subscriber recapturing at once recorded the old address: the graph was CAPTURED over a
buffer that had moved, and its replay was allowed (found by ``kvstate/targets/api/delivery.py``).
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from kvstate.impl import EventKind, HeterogeneousKVCache
from kvstate.impl.testdata import DeterministicWriter, harness_tokens
from kvstate.spec import small
from kvstate.spec.phases import CKV, Graph

G = small()
L = G.lcm_tokens


@pytest.mark.parametrize("executors", ["manual", "threads"])
def test_a_subscriber_recapturing_on_stale_graph_records_the_new_address(executors: str) -> None:
    c = HeterogeneousKVCache(G, executors=executors, writer=DeterministicWriter())
    try:
        view, hooks = c.inspect(), c.test_hooks()
        toks = harness_tokens(2 * L + 1)
        with c.use(c.admit(c.request(toks))):
            pass
        rids = view.resolve(c.chain(toks))
        hooks.act("capture")
        seen: list[tuple[int, int, int]] = []

        def recapture(ev: Any) -> None:
            if ev.kind is EventKind.STALE_GRAPH:
                rid = view.index[ev.key]
                seen.append((view.meta.ckv[rid], view.meta.addr[rid], view.meta.slot[rid]))
                hooks.act("recapture")

        c.events.subscribe(recapture)
        c.tick(10)
        c.offload(1000)
        c.pipelines.drain() if executors == "manual" else None
        deadline = time.time() + 10
        while view.busy() and time.time() < deadline:
            time.sleep(0.005)
        a = c.admit(c.request(toks))
        if executors == "manual":
            c.pipelines.drain()
        with c.use(a):
            pass
        assert seen, "no load moved a block: the test does not reach its path"
        assert all(ckv == int(CKV.READY) and addr == slot for ckv, addr, slot in seen), seen
        assert view.graph.phase == Graph.CAPTURED
        assert [view.meta.gaddr[r] for r in rids] == [view.meta.addr[r] for r in rids]
        hooks.act("replay")
    finally:
        c.close()
