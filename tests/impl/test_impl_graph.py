"""The CUDA-graph protocol through the public API: a graph goes stale when a load moves a block
it recorded, an evicted block keeps its address, and the block table holds a long hit whole and
is refilled with exactly what it is given."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from cache_checks import G, L, offload_all, store

from kvstate.impl import EventKind, HeterogeneousKVCache, InternalError, Refused
from kvstate.impl.testdata import DeterministicWriter, harness_tokens
from kvstate.spec import small
from kvstate.spec.phases import Graph


# ---- CUDA graph -----------------------------------------------------------------------------
def test_graph_goes_stale_when_a_load_moves_a_block(cache: HeterogeneousKVCache) -> None:
    toks = harness_tokens(2 * L + 1)
    store(cache, toks)
    core, act = cache.inspect(), cache.test_hooks().act
    bufs = core.graph.buffer_ptrs
    act("capture")
    act("replay")
    offload_all(cache)
    a = cache.admit(cache.request(toks))
    cache.pipelines.drain()
    assert core.graph.phase == Graph.STALE and cache.events.of(EventKind.STALE_GRAPH)
    with pytest.raises(Refused):
        act("replay")
    act("recapture")
    act("replay")
    with cache.use(a) as run:
        row = core.graph.block_tables[a.request.slot.index]
        assert row[:2].tolist() == run.block_table() and row[2:].eq(-1).all()
    assert core.graph.buffer_ptrs == bufs  # persistent buffers never move


def test_evicted_block_keeps_its_address(cache: HeterogeneousKVCache) -> None:
    toks = harness_tokens(2 * L + 1)
    store(cache, toks)
    rids = cache.inspect().resolve(cache.chain(toks))
    addrs = [cache.inspect().meta.addr[r] for r in rids]
    cache.test_hooks().act("capture")
    cache.tick(10)
    assert cache.evict(2) == 2
    store(cache, toks)
    assert [cache.inspect().meta.addr[r] for r in rids] == addrs
    assert cache.inspect().graph.phase == Graph.CAPTURED


def test_graph_block_table_holds_a_long_hit_whole() -> None:
    """The persistent block table is sized by max_model_len (as vLLM sizes its own): a hit of
    more than 1024 blocks is refilled whole, and a refill that would not fit is refused, never
    truncated."""
    n = 1030
    g = G.with_changes(device_blocks=n + 8, pin_cap_blocks=n + 8)
    c = HeterogeneousKVCache(g, executors="manual", writer=None, max_model_len=(n + 1) * L)
    try:
        toks = harness_tokens(n * L + 1)
        store(c, toks)
        a = c.admit(c.request(toks))
        assert a.hit_tokens == n * L
        with c.use(a) as run:
            row = c.inspect().graph.block_tables[a.request.slot.index]
            assert row.shape[0] >= n + 1
            assert row[:n].tolist() == run.block_table() and row[n:].eq(-1).all()
        with pytest.raises(InternalError, match="do not fit"):
            c.test_hooks().graph_refill(0, [0] * (row.shape[0] + 1), [0] * (row.shape[0] + 1))
    finally:
        c.close()


def test_graph_refill_writes_what_it_is_given_even_after_an_equal_one() -> None:
    """A refill equal to what the row holds writes nothing (``GraphRegistry.refill``); what it
    compares with is a copy of the last refill's lists, so a caller reusing (mutating) its
    lists, a shorter or longer table, or a refill refused (a value that does not fit), all
    leave the row holding exactly the last refill's values, padded."""
    from kvstate.impl.graphs import GraphRegistry
    from kvstate.impl.meta import BlockMeta

    g = GraphRegistry(BlockMeta(4), rows=2, max_blocks=6, device=torch.device("cpu"))

    def row(r: int) -> tuple[list[int], list[int]]:
        return g.block_tables[r].tolist(), g.state_ptrs[r].tolist()

    slots, ptrs = [3, 1, 4], [30, 10, 40]
    g.refill(0, slots, ptrs)
    assert row(0) == ([3, 1, 4, -1, -1, -1], [30, 10, 40, 0, 0, 0])
    g.refill(0, slots, ptrs)  # equal: nothing to write
    assert row(0) == ([3, 1, 4, -1, -1, -1], [30, 10, 40, 0, 0, 0])
    slots[1], ptrs[1] = 5, 50  # the caller's lists, reused
    g.refill(0, slots, ptrs)
    assert row(0) == ([3, 5, 4, -1, -1, -1], [30, 50, 40, 0, 0, 0])
    g.refill(0, [3, 5], [30, 50, 40])  # shorter (the pointers cut to the table)
    assert row(0) == ([3, 5, -1, -1, -1, -1], [30, 50, 0, 0, 0, 0])
    assert row(1) == ([-1] * 6, [0] * 6)  # other rows untouched
    with pytest.raises((ValueError, OverflowError)):  # a pointer past int64: refused
        g.refill(0, [7, 7, 7], [70, 2**70, 70])
    # converted before anything is written: the row still holds the last refill's values
    assert row(0) == ([3, 5, -1, -1, -1, -1], [30, 50, 0, 0, 0, 0])
    g.refill(0, [3, 5], [30, 50])  # equal to the last refill that went through
    assert row(0) == ([3, 5, -1, -1, -1, -1], [30, 50, 0, 0, 0, 0])


def test_graph_rows_are_the_last_refill_then_padding() -> None:
    """Each refill leaves its row exactly the slots and pointers it wrote, then padding (-1 /
    0): a shorter refill after a longer one leaves no stale entry the graph would read."""
    import random

    # a row as wide as 16 blocks: the plan refills every width down to 0 (quadratic in it)
    g_ = small()
    with HeterogeneousKVCache(
        g_, executors="manual", max_model_len=16 * g_.lcm_tokens, writer=DeterministicWriter()
    ) as c:
        g, refill = c.inspect().graph, c.test_hooks().graph_refill
        width = g.block_tables.shape[1]
        assert width <= 32
        rng = random.Random(3)
        # every length down by one (each refill one shorter than the last), then at random
        plan = [(0, n) for n in range(width, -1, -1)]
        plan += [(rng.randrange(g.block_tables.shape[0]), rng.randint(0, width)) for _ in range(40)]
        for row, n in plan:
            slots = [rng.randrange(100) for _ in range(n)]
            ptrs = [rng.randrange(1, 1 << 40) for _ in range(n)]
            refill(row, slots, ptrs)
            assert g.block_tables[row].tolist() == slots + [-1] * (width - n)
            assert g.state_ptrs[row].tolist() == ptrs + [0] * (width - n)


def test_a_captured_graph_goes_stale_when_any_recorded_address_moves() -> None:
    """A move of a block the graph recorded stales it, whatever the address (slot 0 too)."""

    for old in (0, 1, 5):
        with HeterogeneousKVCache(small(), executors="manual", writer=DeterministicWriter()) as c:
            core, hooks = c.inspect(), c.test_hooks()
            rid = hooks.register(c.chain(np.arange(small().lcm_tokens)))[0]
            hooks.poke("addr", rid, old)
            hooks.act("capture")
            assert hooks.graph_moved(rid, old, old + 7)
            assert core.graph.phase != 0 and not core.graph.captured


def test_registered_records_outlive_the_index_bound() -> None:
    """A registered prefix's records are never purged: FREE ones stay indexed with their
    reserved addresses while other keys pass the index's bound (``BlockStore.max_records``:
    4 * (device + host + disk blocks) + 64) and their tombstones are purged and reused.  Its FREE
    records were purged first (the oldest tombstones): their ids went to other keys and a
    captured graph lost their addresses."""
    g = G.with_changes(host_blocks=2, disk_blocks=2)
    cache = HeterogeneousKVCache(g, executors="manual", writer=DeterministicWriter())
    try:
        toks = harness_tokens(2 * L + 1)
        view, hooks = cache.inspect(), cache.test_hooks()
        chain = cache.chain(toks)
        rids = cache.register(chain)
        addrs = [view.meta.addr[r] for r in rids]
        hooks.act("capture")
        bound = 4 * (g.device_blocks + 4) + 64
        for ns in range(bound):  # twice the bound's keys: the first purged again and again
            other = cache.chain(toks, namespace=f"other-{ns}")
            for k, key in enumerate(other.keys):
                hooks.record(key, other.block_tokens_of(k), k * L)
        assert len(view.index) <= bound  # the bound was met: tombstones were purged
        assert [view.index.get(k) for k in chain.keys] == rids
        assert [view.meta.addr[r] for r in rids] == addrs == [view.meta.gaddr[r] for r in rids]
        assert min(addrs) >= 0 and cache.register(chain) == rids
    finally:
        cache.close()
