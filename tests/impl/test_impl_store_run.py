"""A store is one run: each write-path guard checked once over the run's blocks.

The run form of a guard (``FastGuards.fused_run``, impl/fastforms.py) must refuse exactly where a check per
block would, must not exist where one check up front would differ from a check per block, and a
run store must leave every block as the per-block sequence allocate, commit, (slide, for a block
outside the window policy ``Geometry.swa_kept``), seal, index_update, touch would.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from cache_checks import make

from kvstate.impl import EventKind, HeterogeneousKVCache, Refused
from kvstate.impl.core import CacheCore
from kvstate.impl.testdata import DeterministicWriter
from kvstate.spec import default_table, small
from kvstate.spec.phases import CKV, Indexer, Swa, Tail

G = small()
L = G.lcm_tokens


@pytest.fixture
def cache() -> Iterator[HeterogeneousKVCache]:
    c = make(device_blocks=12, host_blocks=2)
    yield c
    c.close()


def test_run_form_refuses_at_the_first_refused_block(cache: HeterogeneousKVCache) -> None:
    # the guard gate itself: a core of its own (a unit test of the parts, not of the façade)
    core = CacheCore(default_table(G), mode="manual", device_blocks=12, host_blocks=2)
    rids = core.store.register(cache.chain(np.arange(4 * L)))
    run = core.gate.guards.run_test("allocate")
    assert run is not None
    assert run(core.gate.records, {"b": 0, "f": 0}, rids) == -1  # every block FREE
    core.meta.ckv[rids[2]] = int(CKV.READY)
    assert run(core.gate.records, {"b": 0, "f": 0}, rids) == 2
    with pytest.raises(Refused) as err:  # named by the per-block check, nothing moved
        core.gate.check_run("allocate", rids, f=0)
    assert err.value.failed == ("free",)
    assert [core.meta.ckv[r] for r in rids] == [CKV.FREE, CKV.FREE, CKV.READY, CKV.FREE]
    core.close()


def test_no_run_form_where_a_check_up_front_differs() -> None:
    core = CacheCore(default_table(G), mode="manual")
    guards = core.gate.guards
    core.close()
    # a guard over the request or the chain is not a block guard
    assert guards.run_test("pin") is None
    # a guard that reads a scalar its own action writes: checking it once for the run would
    # see the value before the first block's transition
    compiled = guards.fast
    assert compiled is not None
    assert compiled.fused_run("evict_start", frozenset({"now"})) is None
    assert compiled.fused_run("evict_start", frozenset({"ckv"})) is not None


def _per_block_expectation(core: Any, rid: int, now: int, ticks: int) -> dict[str, Any]:
    m = core.meta
    return {
        "ckv": m.ckv[rid],
        "tail": m.tail[rid],
        "swa": m.swa[rid],
        "idx": m.idx[rid],
        "iver==ver": m.iver[rid] == m.ver[rid],
        "ver": m.ver[rid],
        "lease>=": m.lease[rid] >= now + ticks,
        "slot": m.slot[rid] >= 0,
        "swa pages": bool(m.swa_pages[rid]),
    }


def test_run_store_equals_the_per_block_sequence() -> None:
    toks = np.arange(5 * L + 3)
    with (
        make(device_blocks=12) as a,
        make(device_blocks=12) as b,
    ):
        req = a.request(toks, lifetime=2)
        with a.use(a.admit(req)):
            pass
        stored = a.inspect().resolve(req.chain)
        # the same blocks through the public per-block transitions, one block at a time
        core, act = b.inspect(), b.test_hooks().act
        rids = b.test_hooks().register(b.chain(toks))
        for k, rid in enumerate(rids):
            act("allocate", rid)
            act("commit", rid)
            if not G.swa_kept(k, len(rids)):  # the store's window policy
                act("slide", rid)
            act("seal", rid)
            act("index_update", rid)
            act("touch", rid, 2)
        got = [_per_block_expectation(a.inspect(), r, a.inspect().now, 2) for r in stored]
        want = [_per_block_expectation(core, r, core.now, 2) for r in rids]
        assert got == want
        assert got[0]["ckv"] == CKV.READY and got[0]["tail"] == Tail.SEALED
        assert got[0]["swa"] == Swa.NULL and not got[0]["swa pages"]  # slid as it was stored
        assert got[-1]["swa"] == Swa.VALID and got[-1]["idx"] == Indexer.PRESENT
        assert len(a.events_of(EventKind.STORED)) == len(rids) == 5
        # the bytes a later hit reads are the writer's (the run wrote every block)
        hit = a.request(toks)
        adm = a.admit(hit)
        with a.use(adm) as run:
            assert adm.hit_tokens == 5 * L
            assert run.verify_pins() == []


def test_run_store_evicts_the_least_recent_blocks_to_make_room() -> None:
    with make(device_blocks=6) as c:
        first = c.request(np.arange(4 * L + 1), lifetime=1)
        with c.use(c.admit(first)):
            pass
        c.tick(2)  # leases expired: the first prefix may be evicted
        second = c.request(100_000 + np.arange(4 * L + 1), lifetime=1)
        with c.use(c.admit(second)):
            pass
        core = c.inspect()
        assert all(core.meta.ckv[r] == CKV.READY for r in core.resolve(second.chain))
        old = [core.meta.ckv[r] for r in core.resolve(first.chain)]
        # 6 slots, 4 + 4 blocks: the two least recent blocks of the first prefix went (the
        # deepest first: released pins return them to the LRU in reverse order)
        assert old.count(CKV.FREE) == 2
        assert len(c.events_of(EventKind.EVICTED)) == 2


def test_default_table_block_guards_have_run_forms() -> None:
    from dataclasses import replace

    from kvstate.impl.guards import Guards

    t = default_table(G)
    g = Guards(t, replace(t.consts, R=2))
    for a in ("allocate", "commit", "seal", "index_update", "touch", "evict_start", "evict_done"):
        assert g.run_test(a) is not None, a


def _pool_state(c: HeterogeneousKVCache) -> tuple[list[int], bytes]:
    pool = c.inspect().tiers.swa_pool
    return pool.free_pages(), bytes(pool.busy)


def test_run_eviction_and_store_take_the_pages_a_block_by_block_sequence_would() -> None:
    """A store run takes its SWA pages in one call and an eviction run gives its victims'
    back in one: the pages each block holds and the free list after must be those of the same
    work one block at a time (``evict`` evicts one block per call, ``allocate`` takes one
    block's pages).  Prefixes of 3 blocks: the window policy keeps every window of them."""
    first, second = np.arange(3 * L + 1), 100_000 + np.arange(3 * L + 1)
    assert all(G.swa_kept(k, 3) for k in range(3))
    with (
        make(device_blocks=4) as a,
        make(device_blocks=4) as b,
    ):
        for c in (a, b):
            with c.use(c.admit(c.request(first, lifetime=1))):
                pass
            c.tick(2)
        assert _pool_state(a) == _pool_state(b)
        with a.use(a.admit(a.request(second, lifetime=1))):  # evicts 2 blocks as one run
            pass
        assert b.evict(2) == 2  # the same two blocks, one at a time
        hooks = b.test_hooks()
        rids = hooks.register(b.chain(second))
        for rid in rids:
            hooks.act("allocate", rid)
        assert [
            a.inspect().meta.swa_pages[r] for r in a.inspect().resolve(a.request(second).chain)
        ] == [b.inspect().meta.swa_pages[r] for r in rids]
        assert _pool_state(a) == _pool_state(b)


def test_page_pool_runs_equal_calls_per_block() -> None:
    from kvstate.impl.errors import InternalError
    from kvstate.impl.storage import PagePool

    a, b = PagePool(10, first=1), PagePool(10, first=1)
    ta, tb = a.take(6), [b.take(2), b.take(2), b.take(2)]
    assert ta is not None and all(t is not None for t in tb)
    a.release_run([*ta[2:4], *ta[:2]])
    for t in (tb[1], tb[0]):
        assert t is not None
        b.release(t)
    assert a.free_pages() == b.free_pages() and a.busy == b.busy
    before = (a.free_pages(), bytes(a.busy))
    with pytest.raises(InternalError, match="twice"):  # a page twice in one run
        a.release_run([ta[4], ta[5], ta[4]])
    with pytest.raises(InternalError, match="outside"):
        a.release_run([ta[4], 10])
    assert (a.free_pages(), bytes(a.busy)) == before  # a refused run releases nothing
    got = a.take(3)
    assert got is not None
    a.untake(got)  # as if never taken
    assert (a.free_pages(), bytes(a.busy)) == before


def _leaked(c: HeterogeneousKVCache) -> list[int]:
    """Indexed FREE records off the tombstones (never purged, never reused: leaked)."""
    view = c.inspect()
    m, tombstones = view.meta, set(view.tombstones)
    return sorted(r for r in view.index.values() if m.ckv[r] == CKV.FREE and r not in tombstones)


def test_a_run_refused_part_way_leaves_what_one_block_at_a_time_would() -> None:
    """allocate refused at the third block of a run (a table whose allocate also wants a home
    slot, which only the registered blocks have): the two blocks before it are stored, the
    refused one and the rest stay FREE on the tombstones (reclaimable), as a store one block at
    a time would leave them, and the refusal reaches the caller through ``finish``."""
    from kvstate.spec.expr import AND

    table = default_table(G).derive(
        name="allocate-needs-a-home",
        replace_guard={
            ("allocate", "free"): lambda s, p: AND(s.ckv[p.b] == CKV.FREE, s.addr[p.b] >= 0)
        },
    )
    toks = np.arange(4 * L + 1)
    with HeterogeneousKVCache(
        table=table, executors="manual", device_blocks=12, writer=DeterministicWriter()
    ) as c:
        home = c.register(c.chain(toks[: 2 * L]))  # two FREE records with their home slots
        req = c.request(toks, lifetime=2)
        adm = c.admit(req)
        with pytest.raises(Refused) as err:
            with c.use(adm):
                pass
        assert err.value.failed == ("free",)
        rids = c.inspect().resolve(req.chain)
        assert rids[:2] == home
        m = c.inspect().meta
        assert [m.ckv[r] for r in rids] == [CKV.READY, CKV.READY, CKV.FREE, CKV.FREE]
        assert _leaked(c) == []
        assert [e.key for e in c.events_of(EventKind.STORED)] == req.chain.keys[:2]
        assert c.inspect().tiers.slots.free == 12 - 2


def test_a_raising_event_callback_does_not_break_the_store() -> None:
    """A subscriber that raises on STORED: the store completes (every block sealed and indexed,
    as without the subscriber), nothing is reported as the writer's failure, and the
    subscriber's exception is recorded (it broke the run half way, as a WriterFailed)."""
    toks = np.arange(3 * L + 1)
    with make(device_blocks=12) as c:

        def boom(ev: Any) -> None:
            if ev.kind is EventKind.STORED:
                raise ValueError("a subscriber's bug")

        c.events.subscribe(boom)
        req = c.request(toks, lifetime=2)
        with c.use(c.admit(req)):
            pass
        m = c.inspect().meta
        rids = c.inspect().resolve(req.chain)
        assert [(m.ckv[r], m.tail[r], m.idx[r]) for r in rids] == [
            (CKV.READY, Tail.SEALED, Indexer.PRESENT)
        ] * 3
        assert len(c.events.callback_errors) == 3
        assert "a subscriber's bug" in c.events.callback_errors[0]
        assert req.slot is None  # released


def test_pool_single_frees_refuse_bad_frees() -> None:
    """The defensive checks of one release (excluded from the fuzz's coverage: only a caller's
    bug reaches them) refuse and change nothing."""
    from kvstate.impl.errors import InternalError
    from kvstate.impl.storage import PagePool, SlotPool

    pages = PagePool(4, first=1)
    got = pages.take(2)
    assert got is not None
    before = (pages.free_pages(), bytes(pages.busy))
    with pytest.raises(InternalError, match="outside"):
        pages.release([0])
    pages.release(got[:1])
    with pytest.raises(InternalError, match="twice"):
        pages.release(got[:1])
    assert pages.free_pages() == [*before[0], got[0]]
    slots = SlotPool(2)
    s = slots.take(5, -1)
    with pytest.raises(InternalError, match="outside"):
        slots.release(2)
    slots.release(s)
    with pytest.raises(InternalError, match="twice"):
        slots.release(s)
    assert slots.free == 2
