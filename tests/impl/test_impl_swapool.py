"""The device tier's SWA window policy: a stored prefix keeps SWA pages only at its end window and
its checkpoints (``Geometry.swa_kept``), the SWA pool is sized for the windows a device can need
(``Geometry.swa_pool_blocks``), and an empty pool slides the least recently used window first.

Everything through the public API, every hit's window, tail and compressed bytes compared with
what the deterministic writer says they must be.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from cache_checks import check_compressed, check_tail, check_window, make, offload_all, store
from hypothesis import given, settings
from hypothesis import strategies as st

from kvstate.impl import HeterogeneousKVCache
from kvstate.impl.core import CacheCore
from kvstate.impl.testdata import harness_tokens
from kvstate.impl.tiers import planned_bytes
from kvstate.spec import deepseek_v4_flash, small
from kvstate.spec.phases import CKV, Swa

G = small()
L = G.lcm_tokens
W = G.window_lcm_blocks
P = G.checkpoint_blocks
N = 9  # blocks of the long prefix: past two checkpoints


@pytest.fixture
def cache() -> Any:
    c = make()
    yield c
    c.close()


def windows(c: HeterogeneousKVCache, toks: np.ndarray) -> list[bool]:
    """Per block of ``toks``' chain: does it hold a VALID window (and exactly its pages)?"""
    m = c.inspect().meta
    out = []
    for rid in c.inspect().resolve(c.chain(toks)):
        valid = m.swa[rid] == Swa.VALID
        assert bool(m.swa_pages[rid]) == (valid and m.ckv[rid] == CKV.READY)
        out.append(bool(valid))
    return out


def hit_and_check(c: HeterogeneousKVCache, toks: np.ndarray, want_blocks: int) -> None:
    a = c.admit(c.request(toks))
    assert a.hit_tokens == want_blocks * L, a.explanation
    with c.use(a) as run:
        check_compressed(run, toks)
        check_window(run, toks)
        check_tail(run, toks)


def test_geometry_policy() -> None:
    assert (W, P) == (2, 4)  # the small geometry's checkpoints lie past its window
    # kept: the windows of boundaries 4 (a checkpoint), 9 (the end) and 8 (one block short of
    # it: a prompt of exactly the stored blocks hits one block less)
    assert [G.swa_kept(b, N) for b in range(N)] == [
        False, False, True, True, False, False, True, True, True,
    ]  # fmt: skip
    d = deepseek_v4_flash()
    assert (d.window_lcm_blocks, d.checkpoint_blocks) == (1, 16)
    kept = [b for b in range(4096) if d.swa_kept(b, 4096)]
    assert kept == [16 * c - 1 for c in range(1, 256)] + [4094, 4095]  # 255 checkpoints, end
    # a pool never larger than one block's pages per slot; sized by requests and checkpoints
    assert d.swa_pool_blocks(64, 256) == 64
    assert d.swa_pool_blocks(4160, 256) == 256 + 260 + d.io_cap + 2


def test_kept_blocks_are_the_windows_of_the_kept_boundaries() -> None:
    """``swa_kept_blocks`` (built from the windows) against the rule stated block by block:
    ``b`` keeps its pages iff it lies in the window of the end boundary ``n``, of ``n - 1``,
    or of a checkpoint boundary within the prefix."""
    for g in (G, deepseek_v4_flash(), G.with_changes(swa_checkpoint_tokens=16),
              G.with_changes(swa_checkpoint_tokens=48), G.with_changes(swa_checkpoint_tokens=160)):  # fmt: skip
        w, p = g.window_lcm_blocks, g.checkpoint_blocks
        for n in range(40):
            bounds = {n, n - 1} | set(range(p, n + 1, p))
            want = {b for b in range(n) if any(c - w <= b < c for c in bounds)}
            assert g.swa_kept_blocks(0, n, n) == want, (g.name, n)
            for lo in range(n + 1):
                for hi in range(lo, n + 1):
                    assert g.swa_kept_blocks(lo, hi, n) == {b for b in want if lo <= b < hi}


@settings(max_examples=60, deadline=None)
@given(
    runs=st.lists(
        st.tuples(st.integers(0, 12), st.integers(1, 7), st.integers(0, 10)),
        min_size=1,
        max_size=10,
    )
)
def test_window_policy_is_asked_afresh_for_every_run(runs: list[tuple[int, int, int]]) -> None:
    """A store run's blocks outside the window policy (``BlockStore.policy_slid``, whose
    answers are memoized per span) are those of the spec's function asked afresh, for any
    sequence of runs on one cache: the same blocks stored toward different prefix ends (the
    blocks past them already cached) included."""
    with make() as c:
        # the block store itself: a core of its own (a unit test of the part, not the façade)
        core = CacheCore(c.table, mode="manual")
        rids = [core.store.record(bytes([b + 1]) * 16, None, b * L) for b in range(20)]
        for first, n, extra in runs:
            stop = first + n
            end = stop + extra  # the prefix being stored ends at or past the run
            kept = G.swa_kept_blocks(first, stop, end)
            want = {rids[b] for b in range(first, stop) if b not in kept}
            assert core.store.policy_slid(rids[first:stop], end) == want, (first, stop, end)
        core.close()


def test_planned_device_bytes_shrink_on_long_prefixes() -> None:
    d = deepseek_v4_flash()
    swa = len(d.layers) * d.lcm_tokens * d.entry_bytes  # one block's SWA pages
    slots = 4096 + 64
    dev, host = planned_bytes(d, slots, 1)
    dev_1, _ = planned_bytes(d, slots, 1, 1)  # fewer requests: fewer windows
    assert dev_1 == dev - 255 * swa
    per_slot = host - swa  # a host slot keeps one block's pages of every group
    null_page = len(d.layers) * d.swa_block_tokens * d.entry_bytes  # the SWA pool's page 0
    assert dev == slots * per_slot + d.swa_pool_blocks(slots, d.max_requests) * swa + null_page
    before = slots * (per_slot + swa)  # one block's SWA pages per slot
    assert before - dev > 21 * 2**30  # a 1M-token prefix: 31.5 GiB down to 9.7 GiB


@pytest.mark.parametrize("swa_blocks", [None, 1, 5])
def test_planned_bytes_are_the_bytes_the_tiers_allocate(swa_blocks: int | None) -> None:
    """The memory plan (checked against ``memory_limit`` before anything is allocated) is
    what the tiers then allocate, the SWA pool's reserved null page included."""
    c = make(device_blocks=6, host_blocks=2, swa_blocks=swa_blocks)
    try:
        t = c.inspect().tiers
        dev = sum(g.device_data.nbytes for g in t.groups)
        host = sum(g.host_data.nbytes for g in t.groups)
        assert planned_bytes(G, 6, 2, None, t.swa_blocks) == (dev, host)
    finally:
        c.close()


def test_store_keeps_end_window_and_checkpoints(cache: HeterogeneousKVCache) -> None:
    toks = harness_tokens(N * L + 3)
    free0 = cache.inspect().tiers.swa_pool.free
    store(cache, toks)
    assert windows(cache, toks) == [G.swa_kept(b, N) for b in range(N)]
    kept = sum(G.swa_kept(b, N) for b in range(N))
    assert (
        free0 - cache.inspect().tiers.swa_pool.free
        == kept * cache.inspect().tiers.swa_pages_per_block
    )
    assert cache.stats()["blocks"]["ready"] == N  # the compressed KV stays


def test_full_prefix_hits_in_full(cache: HeterogeneousKVCache) -> None:
    toks = harness_tokens(N * L + 3)
    store(cache, toks)
    for _ in range(4):
        hit_and_check(cache, toks, N)


@pytest.mark.parametrize("blocks", [5, 6, 7, 8])
def test_shorter_shared_prefix_hits_at_the_last_kept_boundary(
    cache: HeterogeneousKVCache, blocks: int
) -> None:
    toks = harness_tokens(N * L + 3)
    store(cache, toks)
    short = toks[: blocks * L + 1]
    want = max(
        h for h in range(blocks + 1) if all(G.swa_kept(b, N) for b in range(max(0, h - W), h))
    )
    assert want < blocks or blocks == 8
    a = cache.admit(cache.request(short))
    if want < blocks:
        assert any(s.rule == "L3.swa_window" for s in a.explanation.shortenings)
    cache.abort(a.request)
    hit_and_check(cache, short, want)


def test_decode_keeps_checkpoint_windows(cache: HeterogeneousKVCache) -> None:
    toks = harness_tokens(2 * L + 1)
    more = harness_tokens(7 * L, seed=5)
    a = cache.admit(cache.request(toks))
    with cache.use(a) as run:
        run.append(more)
    full = np.concatenate([toks, more])
    assert windows(cache, full) == [G.swa_kept(b, N) for b in range(N)]
    hit_and_check(cache, full, N)
    hit_and_check(cache, full[: 4 * L + 1], 4)  # the checkpoint's window survived decode


def test_decode_in_steps_slides_each_passed_end_window(cache: HeterogeneousKVCache) -> None:
    """Decoded a block at a time, every end the prefix passes had its windows kept (the end's
    and the boundary one block earlier's): once the prefix is longer, only the policy's stay
    (a window kept at an old end fills the SWA pool for no hit: a 1M recovery restored 63 of
    them and ran out of pages)."""
    toks = harness_tokens(L + 1)
    more = harness_tokens(N * L, seed=5)
    a = cache.admit(cache.request(toks))
    with cache.use(a) as run:
        for k in range(N - 1):
            run.append(more[k * L : (k + 1) * L])
    full = np.concatenate([toks, more[: (N - 1) * L]])
    assert windows(cache, full) == [G.swa_kept(b, N) for b in range(N)]
    hit_and_check(cache, full, N)


def test_empty_pool_slides_the_lru_window_before_evicting() -> None:
    c = make(max_requests=1, device_blocks=64)
    try:
        pool = G.swa_pool_blocks(64, 1)
        assert c.inspect().tiers.swa_blocks == pool < 64
        prefixes = [harness_tokens(W * L + 1, seed=100 + i) for i in range(pool // W + 1)]
        for t in prefixes:
            store(c, t)
            c.tick(10)
        # the last store found the pool empty: the oldest prefix's deepest block was slid
        # (the least recently used window), its compressed KV kept (nothing evicted), so it
        # no longer hits; the others still do
        assert c.stats()["blocks"]["ready"] == W * len(prefixes)
        assert sum(sum(windows(c, t)) for t in prefixes) == pool
        assert windows(c, prefixes[0]) == [True] * (W - 1) + [False]
        a = c.admit(c.request(prefixes[0]))
        assert a.hit_tokens == L  # boundary 1's window (block 0) is still there
        assert any(s.rule == "L3.swa_window" for s in a.explanation.shortenings)
        c.abort(a.request)
        for t in prefixes[1:]:
            hit_and_check(c, t, W)
    finally:
        c.close()


def test_disk_recovery_restores_the_end_window(cache: HeterogeneousKVCache) -> None:
    toks = harness_tokens(N * L + 3)
    store(cache, toks)
    offload_all(cache)
    assert cache.spill(N) == N
    assert cache.stats()["blocks"]["disk"] == N
    a = cache.admit(cache.request(toks, lifetime=3))
    assert a.state == "pending" and a.hit_tokens == N * L
    cache.pipelines.drain()
    with cache.use(a) as run:
        assert run.hit_tokens == N * L and run.verify_pins() == []
        check_compressed(run, toks)
        check_window(run, toks)
        check_tail(run, toks)
    assert windows(cache, toks) == [G.swa_kept(b, N) for b in range(N)]


def test_load_without_swa_pages_gives_its_device_slot_back() -> None:
    """A load that takes a device slot and then finds no SWA pages (the pool's one window
    pinned by a request in use, nothing left to slide) fails, and the slot goes back: the hit
    is truncated and recomputed, and every device slot is free once the requests end.

    Found by a random mutant campaign (docs/api-harness-findings.md): deleting the slot's
    release on this path leaked it, and no test or harness run reached the path."""
    c = make(swa_blocks=1)
    try:
        slots, pool = c.inspect().tiers.slots, c.inspect().tiers.swa_pool
        a, b = harness_tokens(2 * L + 1, seed=1), harness_tokens(2 * L + 1, seed=2)
        store(c, a)
        c.tick(10)
        offload_all(c)  # a's blocks on host only
        c.evict(10)
        store(c, b)
        held = c.use(c.admit(c.request(b)))
        held.__enter__()  # b's window, the pool's only one, pinned while in use
        assert pool.free == 0
        free = slots.free
        adm = c.admit(c.request(a))  # a's load from host needs SWA pages: there are none
        c.pipelines.drain()
        with c.use(adm) as run:
            assert run.hit_tokens == 0
        # the cut names the table's failed load, its state and its doc, as the table has them
        fail = c.table.action("load_fail")
        cuts = [(t.rule, t.state, t.doc) for t in adm.explanation.truncations]
        assert (fail.name, fail.component, fail.doc) in cuts, cuts
        assert slots.free == free, "the failed load kept a device slot"
        held.__exit__(None, None, None)
        c.tick(10)
        assert c.evict(100) >= 0
        assert slots.free == slots.n, f"{slots.n - slots.free} device slots leaked"
    finally:
        c.close()
