"""The library's request path on real storage: hits, tiers, recovery, explanations, graphs.

KV bytes come from the deterministic writer, so every restored block, window and tail is
compared byte for byte with what (group, layer, position, token) say it must be.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest
import torch

from kvstate.impl import EventKind, HeterogeneousKVCache, InternalError, NotReady, Refused
from kvstate.impl.pipelines import LoadJob
from kvstate.impl.testdata import expected_rows, expected_state_rows, harness_tokens
from kvstate.kernels import TailDiscontinuityError
from kvstate.spec import small
from kvstate.spec.phases import CKV, Graph, Indexer, Pipe, Req, Swa
from kvstate.testing import seeded

G = small()
L = G.lcm_tokens


def make(**kw: Any) -> HeterogeneousKVCache:
    kw.setdefault("executors", "manual")
    return HeterogeneousKVCache(G, **kw)


def planted(*bugs: str, **kw: Any) -> HeterogeneousKVCache:
    """``make``, from the staged copy of ``impl/`` with ``bugs`` planted."""
    kw.setdefault("executors", "manual")
    return seeded.cache(G, bugs=bugs, **kw)


@pytest.fixture
def cache() -> Any:
    c = make()
    yield c
    c.close()


def store(c: HeterogeneousKVCache, toks: np.ndarray, **kw: Any) -> None:
    """First request over ``toks``: no hit, stores its full blocks on finish."""
    a = c.admit(c.request(toks, **kw))
    with c.use(a):
        pass


def check_window(run: Any, toks: np.ndarray, layer: int = 3) -> None:
    h = run.hit_tokens
    lo = max(0, h - G.n_win)
    want = torch.zeros(G.n_win, G.entry_bytes, dtype=torch.uint8)
    if h:
        rows = expected_rows(
            "swa",
            torch.tensor([layer]),
            torch.arange(lo, h),
            torch.tensor(toks[lo:h]),
            G.entry_bytes,
        )
        want[G.n_win - (h - lo) :] = rows[0]
    assert torch.equal(run.read_window(layer), want)


def check_tail(run: Any, toks: np.ndarray, li: int = 0) -> None:
    h, m = run.hit_tokens, G.csa_ratio
    layer = [i for i, k in enumerate(G.layers) if k == "csa"][li]
    state = run.read_tail(li)
    q = torch.arange(h - m, h)
    rows = expected_state_rows(
        torch.tensor([layer]), q, torch.tensor(toks[h - m : h]), 2 * G.head_dim
    )[0]
    assert torch.equal(state[:m], rows)  # the next entry's window: positions h - m .. h + m - 1
    assert not state[m:].any()  # positions >= h do not exist yet


def check_compressed(run: Any, toks: np.ndarray) -> None:
    core = run.cache.inspect()
    for grp in (core.tiers.csa, core.tiers.hca):
        for li, layer in enumerate(grp.layers):
            pages = run.read_compressed(grp.name, li)
            for b in range(run.blocks):
                want = grp.make_pages(b * L, toks[b * L : (b + 1) * L], core.writer)[li]
                assert torch.equal(
                    pages[b * grp.pages_per_block : (b + 1) * grp.pages_per_block], want
                )
                n_e = L // grp.ratio
                raw = expected_rows(
                    grp.name,
                    torch.tensor([layer]),
                    torch.arange(b * n_e, (b + 1) * n_e),
                    torch.tensor(toks[b * L + grp.ratio - 1 : (b + 1) * L : grp.ratio]),
                    G.entry_bytes,
                )
                flat = want[:, : grp.entries_per_page * G.entry_bytes].reshape(-1, G.entry_bytes)
                assert torch.equal(flat, raw[0])
    idx = core.tiers.indexer
    for li in range(idx.nl):  # indexer pages are in sync with the compressed KV they index
        got = run.read_compressed("indexer", li)
        assert torch.equal(got, idx.build(run.read_compressed("csa", li).unsqueeze(0))[0])


# ---- hits ------------------------------------------------------------------------------
def test_miss_then_hit_with_exact_bytes(cache: HeterogeneousKVCache) -> None:
    toks = harness_tokens(5 * L + 3)
    first = cache.admit(cache.request(toks))
    assert first.hit_tokens == 0 and first.state == "validated"
    assert any(s.rule == "L3.ckv_ready" and s.block == 0 for s in first.explanation.shortenings)
    with cache.use(first):
        pass
    assert len(cache.events.of(EventKind.STORED)) == 5
    second = cache.admit(cache.request(toks, lifetime=2))
    assert second.hit_tokens == 5 * L
    (cut,) = second.explanation.shortenings  # only the partial last block is cut
    assert (cut.rule, cut.from_tokens, cut.to_tokens) == ("L1.lcm_aligned", 5 * L + 2, 5 * L)
    assert [p.block for p in second.pins] == list(range(5))
    with cache.use(second) as run:
        assert run.verify_pins() == []
        check_window(run, toks)
        check_tail(run, toks)
        check_compressed(run, toks)


def test_last_token_is_never_a_hit_and_alignment_is_explained(cache: HeterogeneousKVCache) -> None:
    toks = harness_tokens(3 * L)  # exactly 3 blocks: the last token must be computed
    store(cache, toks)
    a = cache.admit(cache.request(toks))
    assert a.requested == 3 * L - 1 and a.hit_tokens == 2 * L
    (cut,) = a.explanation.shortenings
    assert (cut.rule, cut.layer, cut.from_tokens, cut.to_tokens) == (
        "L1.lcm_aligned",
        "L1",
        3 * L - 1,
        2 * L,
    )
    cache.abort(a.request)
    short = cache.admit(cache.request(toks[: L - 3]))  # shorter than one LCM block: never a hit
    assert short.hit_tokens == 0 and short.explanation.shortenings[0].rule == "L1.lcm_aligned"


def test_namespaces_do_not_share(cache: HeterogeneousKVCache) -> None:
    toks = harness_tokens(3 * L + 1)
    store(cache, toks, namespace="tenant-a")
    assert cache.admit(cache.request(toks, namespace="tenant-b")).hit_tokens == 0
    assert cache.admit(cache.request(toks, namespace="tenant-a")).hit_tokens == 3 * L


def test_prefix_hit_of_a_longer_prompt(cache: HeterogeneousKVCache) -> None:
    toks = harness_tokens(6 * L + 1)
    store(cache, toks[: 3 * L + 1])
    a = cache.admit(cache.request(toks))
    assert a.hit_tokens == 3 * L
    assert a.explanation.shortenings[0].block == 3
    with cache.use(a) as run:
        check_window(run, toks)
    b = cache.admit(cache.request(toks))
    assert b.hit_tokens == 6 * L  # the first request stored its remaining blocks


def test_lease_longer_than_lease_max_is_explained(cache: HeterogeneousKVCache) -> None:
    toks = harness_tokens(2 * L + 1)
    store(cache, toks)
    a = cache.admit(cache.request(toks, lifetime=G.lease_max + 5))
    assert a.hit_tokens == 0
    assert a.explanation.shortenings[0].rule == "L1.lease_covers"


def test_admission_cap_downgrades() -> None:
    from kvstate.spec import default_table

    c = HeterogeneousKVCache(
        table=default_table(G.with_changes(pin_cap_blocks=3)), executors="manual"
    )
    try:
        toks = harness_tokens(4 * L + 1)
        store(c, toks)
        a = c.admit(c.request(toks))
        assert (
            a.state == "downgraded"
            and a.hit_tokens == 0
            and "pin_cap" in (a.explanation.rejection or "")
        )
        assert c.events.of(EventKind.DOWNGRADED)
        with c.use(a) as run:  # a downgraded request recomputes from scratch
            assert run.hit_tokens == 0
        assert c.inspect().pinned_blocks == 0
    finally:
        c.close()


def test_decode_append_seals_indexes_and_slides(cache: HeterogeneousKVCache) -> None:
    toks = harness_tokens(2 * L + 1)
    a = cache.admit(cache.request(toks))
    m = cache.inspect().meta
    with cache.use(a) as run:
        run.append(harness_tokens(4 * L, seed=5))
        req = a.request
        rids = cache.inspect().resolve(req.chain)
        assert req.chain.blocks == 6
        for rid in rids:
            assert (
                m.ckv[rid] == CKV.READY
                and m.idx[rid] == Indexer.PRESENT
                and m.iver[rid] == m.ver[rid]
            )
        W = cache.table.consts.W
        kept = [G.swa_kept(b, 6) for b in range(6)]  # the window, and a checkpoint's window
        assert kept[6 - W :] == [True] * W and not all(kept)
        assert [m.swa[r] == Swa.VALID for r in rids] == kept  # the rest of the window slid
        assert all(bool(m.swa_pages[r]) == k for r, k in zip(rids, kept, strict=True))
    full = np.concatenate([toks, harness_tokens(4 * L, seed=5)])
    b = cache.admit(cache.request(full))
    assert b.hit_tokens == 6 * L  # the window at the end is valid
    with cache.use(b) as run:
        check_window(run, full)
        check_tail(run, full, 1)


def test_slid_window_shortens_with_explanation(cache: HeterogeneousKVCache) -> None:
    toks = harness_tokens(6 * L + 1)
    a = cache.admit(cache.request(toks[: 2 * L + 1]))
    with cache.use(a) as run:
        run.append(toks[2 * L + 1 :])
    a = cache.admit(cache.request(toks[: 3 * L + 1]))  # boundary 3: its window was slid
    assert a.hit_tokens == 0
    assert any(s.rule == "L3.swa_window" for s in a.explanation.shortenings)


# ---- eviction ----------------------------------------------------------------------------
def test_lru_eviction_reverse_order_and_pins() -> None:
    c = make(device_blocks=6)
    try:
        t1, t2 = harness_tokens(3 * L + 1, seed=1), harness_tokens(3 * L + 1, seed=2)
        store(c, t1)
        held = c.admit(c.request(t1))  # keep t1 pinned
        c.tick(10)
        store(c, t2)  # fills the pool
        c.tick(10)
        r1 = c.inspect().resolve(held.request.chain)
        r2 = c.inspect().resolve(c.chain(t2))
        assert c.evict(1) == 1
        m = c.inspect().meta
        assert m.ckv[r2[2]] == CKV.FREE and m.ckv[r2[0]] == CKV.READY  # deepest block first
        assert c.evict(10) == 2
        assert all(m.ckv[r] == CKV.READY for r in r1)  # pinned blocks never evicted
        with c.use(held) as run:
            assert run.verify_pins() == []
            check_compressed(run, t1)
    finally:
        c.close()


def test_lease_protects_unpinned_blocks(cache: HeterogeneousKVCache) -> None:
    store(cache, harness_tokens(2 * L + 1), lifetime=3)
    assert cache.evict(5) == 0  # leases run to now + 3
    cache.tick(3)
    assert cache.evict(5) == 2


# ---- tiers and recovery ----------------------------------------------------------------------
def offload_all(c: HeterogeneousKVCache) -> None:
    c.tick(10)
    c.offload(1000)
    if c.inspect().pipeline_mode == "manual":
        c.pipelines.drain()
    else:
        deadline = time.time() + 10
        while c.inspect().busy() and time.time() < deadline:
            time.sleep(0.005)


def test_offload_spill_and_recover_exactly(cache: HeterogeneousKVCache) -> None:
    toks = harness_tokens(5 * L + 1)
    store(cache, toks)
    offload_all(cache)
    assert cache.stats()["blocks"]["host"] == 5
    assert cache.spill(2) == 2  # LRU host blocks go to disk: the deepest ones
    a = cache.admit(cache.request(toks, lifetime=3))
    assert a.state == "pending" and a.hit_tokens == 5 * L
    assert a.explanation.immediate.hit == 0 and a.explanation.after_recovery is not None
    plan = a.recovery.by_state()
    assert {s.block for s in plan["On-disk Prefix"]} == {3, 4}
    assert {s.block for s in plan["Compressed KV"]} == {0, 1, 2}
    assert {s.block for s in plan["Indexer State"]} == {3, 4}  # disk loads come back unindexed
    assert all(s.pipeline is Pipe.CPU for s in plan["Indexer State"])
    with pytest.raises(NotReady):
        with cache.use(a):
            pass
    # drive the pipelines by hand: one job step at a time
    io = cache.pipelines.io
    rid = next(iter(io.jobs))
    assert isinstance(io.jobs[rid], LoadJob) and cache.inspect().meta.prog[rid] == 0
    io.step(rid)  # a disk load's first step reads its block and checks every MAC: none lands
    assert cache.inspect().meta.prog[rid] == 0 and io.jobs[rid].chunks is not None
    io.step(rid)
    assert cache.inspect().meta.prog[rid] == 1 and cache.inspect().meta.ckv[rid] == CKV.LOADING
    cache.pipelines.drain()
    with cache.use(a) as run:
        assert run.hit_tokens == 5 * L and run.verify_pins() == []
        check_compressed(run, toks)
        check_window(run, toks)
        check_tail(run, toks)
    assert len(cache.events.of(EventKind.LOADED)) == 5


def test_io_cap_bounds_disk_loads(cache: HeterogeneousKVCache) -> None:
    toks = harness_tokens(6 * L + 1)
    store(cache, toks)
    offload_all(cache)
    cache.spill(6)
    a = cache.admit(cache.request(toks))
    assert (
        cache.inspect().io_inflight == G.io_cap and len(cache.inspect().io_waiting) == 6 - G.io_cap
    )
    peak = 0
    while cache.pipelines.busy():
        for rid in list(cache.pipelines.io.jobs):
            cache.pipelines.io.step(rid)
            peak = max(peak, cache.inspect().io_inflight)
        cache.pipelines.drain() if not cache.pipelines.io.jobs else None
    assert peak <= G.io_cap
    with cache.use(a) as run:
        assert run.hit_tokens == 6 * L
        check_compressed(run, toks)


def test_load_failure_truncates_and_recomputes(cache: HeterogeneousKVCache) -> None:
    toks = harness_tokens(4 * L + 1)
    store(cache, toks)
    offload_all(cache)
    a = cache.admit(cache.request(toks))
    rids = cache.inspect().resolve(a.request.chain)
    # block 3 fails (a boundary whose window the store kept: Geometry.swa_kept)
    cache.test_hooks().inject_load_fault(rids[3])
    cache.pipelines.drain()
    with cache.use(a) as run:
        assert run.hit_tokens == 3 * L  # blocks 0-2 loaded; 3 failed: the rest is recomputed
        check_compressed(run, toks)
        check_window(run, toks)
    assert cache.events.of(EventKind.LOAD_FAILED)
    cuts = a.explanation.truncations
    assert cuts[0].from_tokens == 4 * L and cuts[0].to_tokens == 3 * L
    assert any(s.rule == "L3.ckv_ready" and s.block == 3 for s in cuts[1:])
    assert cache.inspect().meta.ckv[rids[3]] == CKV.HOST  # the source stayed where it was


def test_abort_during_load_neither_leaks_nor_reuses(cache: HeterogeneousKVCache) -> None:
    toks = harness_tokens(3 * L + 1)
    store(cache, toks)
    offload_all(cache)
    free_before = cache.inspect().tiers.slots.free
    a = cache.admit(cache.request(toks))
    rids = cache.inspect().resolve(a.request.chain)
    cache.pipelines.dma.step(rids[0])  # first chunk of block 0 landed
    dst = cache.inspect().load_job(rids[0]).dst
    cache.abort(a.request)
    assert (
        cache.inspect().meta.ref[rids[0]] == 0 and cache.inspect().meta.ckv[rids[0]] == CKV.LOADING
    )
    # the in-flight destination is not handed out while the load writes into it
    other = cache.register(cache.chain(harness_tokens(L, seed=77)))[0]
    cache.test_hooks().act("allocate", other)
    assert cache.inspect().meta.slot[other] != dst
    cache.test_hooks().act("discard", other)
    cache.pipelines.drain()  # the loads finish in their pipeline
    assert all(cache.inspect().meta.ckv[r] == CKV.READY for r in rids)
    assert cache.inspect().tiers.slots.free == free_before - 3
    assert cache.inspect().tiers.host_slots.free == G.host_blocks
    b = cache.admit(cache.request(toks))
    assert b.hit_tokens == 3 * L
    with cache.use(b) as run:
        check_compressed(run, toks)


def test_offload_cancelled_by_a_hit(cache: HeterogeneousKVCache) -> None:
    toks = harness_tokens(2 * L + 1)
    store(cache, toks)
    cache.tick(10)
    cache.offload(10)  # jobs queued, not run: blocks are OFFLOADING
    a = cache.admit(cache.request(toks))
    assert [s.action for s in a.recovery.steps if s.state == "Compressed KV"] == [
        "offload_cancel"
    ] * 2
    cache.pipelines.drain()
    with cache.use(a) as run:
        assert run.hit_tokens == 2 * L
    assert cache.inspect().tiers.host_slots.free == G.host_blocks


def test_zero_swa_policy_recomputes_the_window() -> None:
    from kvstate.spec import default_table

    c = HeterogeneousKVCache(
        table=default_table(G.with_changes(swa_disk_policy="zero")), executors="manual"
    )
    try:
        toks = harness_tokens(4 * L + 1)
        store(c, toks)
        offload_all(c)
        c.spill(4)
        a = c.admit(c.request(toks))
        assert a.hit_tokens == 0 and a.explanation.after_recovery is None
        assert any(s.rule == "L3.ckv_ready" for s in a.explanation.shortenings)
        # ... and it says why no recovery was planned: the window does not come back from disk
        un = a.explanation.unrecoverable
        assert un is not None and any(s.rule == "L3.swa_window" for s in un.shortenings)
        assert any("even after recovery: L3.swa_window" in x for x in a.explanation.lines())
    finally:
        c.close()


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


# ---- threads -----------------------------------------------------------------------------------
def test_threaded_recovery_same_jobs() -> None:
    c = make(executors="threads")
    try:
        toks = harness_tokens(6 * L + 1)
        store(c, toks)
        offload_all(c)
        c.spill(3)
        a = c.admit(c.request(toks))
        with c.use(a, timeout=20) as run:
            assert run.hit_tokens == 6 * L
            check_compressed(run, toks)
            check_window(run, toks)
            check_tail(run, toks)
        assert c.pipelines.errors() == []
    finally:
        c.close()


# ---- seeded bugs at the library level (data and pins, not only the abstract state) ------------
def test_bug_swa_offset_reads_the_wrong_window() -> None:
    c = planted("swa_offset_by_one_block")
    try:
        toks = harness_tokens(4 * L + 1)
        store(c, toks)
        a = c.admit(c.request(toks[: 3 * L + 1]))
        assert a.hit_tokens == 2 * L  # the window one block late "validates" at boundary 2
        with c.use(a) as run:
            with pytest.raises(AssertionError):
                check_window(run, toks)
    finally:
        c.close()


def test_bug_tail_off_by_one_breaks_the_splice() -> None:
    c = planted("tail_splice_off_by_one")
    try:
        toks = harness_tokens(3 * L + 1)  # 3 blocks: every window kept (Geometry.swa_kept)
        store(c, toks)
        a = c.admit(c.request(toks[: 2 * L + 1]))
        with c.use(a) as run:
            with pytest.raises(TailDiscontinuityError):
                run.read_tail(0)
    finally:
        c.close()


def test_bug_skip_indexer_version_kills_every_hit() -> None:
    c = planted("skip_indexer_version")
    try:
        toks = harness_tokens(3 * L + 1)
        store(c, toks)
        a = c.admit(c.request(toks), recover=False)
        assert a.hit_tokens == 0 and a.explanation.shortenings[0].rule == "L3.indexer_synced"
    finally:
        c.close()


def test_bug_use_before_load_complete_lands_garbage() -> None:
    c = planted("use_before_load_complete")
    try:
        toks = harness_tokens(2 * L + 1)
        store(c, toks)
        offload_all(c)
        store(c, harness_tokens(4 * L + 1, seed=3))  # reuses the freed device slots
        a = c.admit(c.request(toks))
        c.pipelines.drain()
        core = c.inspect()
        rid = a.rids[0]
        assert (
            core.meta.ckv[rid] == CKV.READY and core.meta.prog[rid] < G.load_steps
        )  # "done" early
        grp = core.tiers.csa
        landed = grp.device_data[:, grp.dev_index(core.meta.slot[rid])]
        assert not torch.equal(landed, grp.make_pages(0, toks[:L], core.writer))  # never copied
        with c.use(a) as run:  # the L3 disk_loaded rule still refuses to serve it
            assert run.hit_tokens == 0
        assert any(s.rule == "L3.disk_loaded" for s in a.explanation.truncations)
    finally:
        c.close()


def test_bug_abort_during_load_double_frees() -> None:
    from kvstate.impl import InternalError

    c = planted("abort_during_load_double_free")
    try:
        toks = harness_tokens(2 * L + 1)
        store(c, toks)
        offload_all(c)
        a = c.admit(c.request(toks))
        rids = c.inspect().resolve(a.request.chain)
        c.abort(a.request)
        assert c.inspect().meta.ckv[rids[0]] == CKV.FREE  # freed while its load is still in flight
        job = c.inspect().load_job(rids[0])
        with pytest.raises(InternalError):  # ... and the load frees its destination again
            c.test_hooks().fail_load(rids[0], job, "late failure", corrupt=False)
    finally:
        c.close()


def test_bug_evict_ignores_pins_breaks_toctou() -> None:
    c = planted("evict_ignores_pins")
    try:
        toks = harness_tokens(2 * L + 1)
        store(c, toks)
        a = c.admit(c.request(toks, lifetime=1))
        c.tick(5)  # the lease ran out, the pin did not
        with c.use(a, store=False) as run:
            assert c.evict(2) == 2
            assert run.verify_pins()
    finally:
        c.close()


def test_request_phases_and_events(cache: HeterogeneousKVCache) -> None:
    seen: list[str] = []
    unsubscribe = cache.events.subscribe(lambda e: seen.append(e.kind.value))
    req = cache.request(harness_tokens(2 * L + 1))
    assert req.phase is Req.IDLE
    a = cache.admit(req)
    assert req.phase is Req.VALIDATED and a.ready
    with cache.use(a):
        assert req.phase is Req.USING
    assert req.phase is Req.IDLE and seen.count("stored") == 2
    unsubscribe()
    with pytest.raises(ZeroDivisionError):
        with cache.use(cache.admit(cache.request(harness_tokens(2 * L + 1)))):
            1 / 0  # noqa: B018 - an exception inside use() aborts the request
    assert cache.inspect().pinned_blocks == 0 and seen.count("stored") == 2


def test_same_job_code_in_both_modes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Manual and threaded pipelines run the very same job classes, step by step."""
    from kvstate.impl import pipelines

    calls: dict[str, list[str]] = {}
    for cls in (
        pipelines.LoadJob,
        pipelines.RebuildJob,
        pipelines.OffloadJob,
        pipelines.TailCheckJob,
    ):
        original = cls.step

        def counted(self: Any, _orig: Any = original, _name: str = cls.__name__) -> bool:
            calls.setdefault(mode, []).append(_name)
            return bool(_orig(self))

        monkeypatch.setattr(cls, "step", counted)
    toks = harness_tokens(4 * L + 1)
    for mode in ("manual", "threads"):
        c = make(executors=mode)
        try:
            store(c, toks)
            offload_all(c)
            c.spill(1)
            a = c.admit(c.request(toks))
            if mode == "manual":
                c.pipelines.drain()
            with c.use(a, timeout=20) as run:
                assert run.hit_tokens == 4 * L
        finally:
            c.close()
    for mode in ("manual", "threads"):
        assert {"LoadJob", "RebuildJob", "OffloadJob", "TailCheckJob"} <= set(calls[mode]), calls


@pytest.mark.parametrize("derive", [None, True])
def test_who_writes_the_indexer_pages_of_a_stored_block(derive: bool | None) -> None:
    """writer=None: the engine wrote every page; storing stamps the indexer's version and leaves
    its pages alone, unless derive_index=True.  Either way the block then hits."""
    c = make(writer=None, derive_index=derive)
    try:
        ix = c.inspect().tiers.indexer.device_data
        ix.fill_(0x5A)  # what "the engine" wrote
        before = ix.clone()
        toks = harness_tokens(2 * L + 3)
        store(c, toks)
        rids = c.inspect().resolve(c.chain(toks))
        m = c.inspect().meta
        assert all(m.idx[r] == Indexer.PRESENT and m.iver[r] == m.ver[r] for r in rids)
        if derive:
            assert not torch.equal(ix, before)  # derived from the (zero) CSA entries
        else:
            assert torch.equal(ix, before)
        a = c.admit(c.request(toks))
        assert a.state == "validated" and a.hit_tokens == 2 * L
    finally:
        c.close()


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

    from kvstate.spec import small

    # a row as wide as 16 blocks: the plan refills every width down to 0 (quadratic in it)
    g_ = small()
    with HeterogeneousKVCache(g_, executors="manual", max_model_len=16 * g_.lcm_tokens) as c:
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
    from kvstate.spec import small

    for old in (0, 1, 5):
        with HeterogeneousKVCache(small(), executors="manual") as c:
            core, hooks = c.inspect(), c.test_hooks()
            rid = hooks.register(c.chain(np.arange(small().lcm_tokens)))[0]
            hooks.poke("addr", rid, old)
            hooks.act("capture")
            assert hooks.graph_moved(rid, old, old + 7)
            assert core.graph.phase != 0 and not core.graph.captured
