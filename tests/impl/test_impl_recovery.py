"""Tiers and recovery through the public API: offload, spill and load back byte-exact, the I/O
cap, a failed load's truncation, aborts during a load, cancelled offloads, a window policy of
none, and the same jobs run by threads and by manual pipelines."""

from __future__ import annotations

from typing import Any

import pytest
from cache_checks import G, L, check_compressed, check_tail, check_window, make, offload_all, store

from kvstate.impl import EventKind, HeterogeneousKVCache, NotReady
from kvstate.impl.pipelines import LoadJob
from kvstate.impl.testdata import DeterministicWriter, harness_tokens
from kvstate.spec.phases import CKV, Pipe


# ---- tiers and recovery ----------------------------------------------------------------------
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
        table=default_table(G.with_changes(swa_disk_policy="zero")),
        executors="manual",
        writer=DeterministicWriter(),
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
