"""The recovery pipelines under failing and stalled jobs: a failing load or offload never leaves
a record stuck or a slot leaked, an admission never waits forever for a load that cannot start,
an offload's choice and transition are one step, and disk I/O never holds the cache lock."""

from __future__ import annotations

import itertools
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from cache_checks import make
from disk_checks import Proxy, check_compressed
from test_impl_disk import persist

from kvstate.impl import EventKind, HeterogeneousKVCache
from kvstate.impl.pipelines import OffloadJob
from kvstate.impl.testdata import DeterministicWriter, harness_tokens
from kvstate.spec import small
from kvstate.spec.phases import CKV

G = small()
L = G.lcm_tokens


# ---- item 3: a failing load job -----------------------------------------------------------
@pytest.mark.parametrize("mode", ["manual", "threads"])
def test_any_exception_in_a_load_fails_it_cleanly(
    tmp_path: Path, mode: str, monkeypatch: Any
) -> None:
    toks = harness_tokens(3 * L + 1)
    persist(tmp_path, toks)
    c = HeterogeneousKVCache(G, cache_dir=tmp_path, executors=mode, writer=DeterministicWriter())
    try:
        free, swa_free = c.inspect().tiers.slots.free, c.inspect().tiers.swa_pool.free
        # the first chunk read comes back one byte short, as from an inconsistent chunk table:
        # landing it raises inside the (possibly compiled) tiers, not a CorruptEntry
        # (a disk load reads its block with read_block, all chunks at once: the first chunk
        # of the first block read is the short one)
        name = "read_block"  # every disk load's read (DiskTier.read_block)
        real: Any = None
        calls = itertools.count(1)  # (atomic: the I/O workers read concurrently)

        def broken(*args: Any) -> Any:
            first = next(calls) == 1
            data = real(*args)
            if name == "read_block":
                base, chunks, swa = data
                return base, [chunks[0][:-1], *chunks[1:]] if first else chunks, swa
            return data[:-1] if first else data

        real = c.test_hooks().replace_disk_method(name, broken)
        a = c.admit(c.request(toks))
        if mode == "manual":
            c.pipelines.drain()
            c.pipelines.drain()  # does not raise again
        with c.use(a, timeout=20) as run:
            assert run.hit_tokens < 3 * L  # truncated to the valid prefix
            check_compressed(run, toks)
        assert c.events.of(EventKind.LOAD_FAILED)
        assert c.inspect().io_inflight == 0
        assert not any(c.inspect().meta.ckv[r] == CKV.LOADING for r in c.inspect().index.values())
        c.tick(100)
        c.evict(100)
        assert c.inspect().tiers.slots.free == free  # the failed load's slot came back
        assert c.inspect().tiers.swa_pool.free == swa_free  # and its window pages
    finally:
        c.close()


# ---- item 4: an admission never waits forever for a load that cannot start -----------------
def test_queued_loads_without_device_room_do_not_leave_admission_pending(tmp_path: Path) -> None:
    toks = harness_tokens(3 * L + 1)  # 3 blocks: the store keeps every window (swa_kept)
    persist(tmp_path, toks)
    c = make(cache_dir=tmp_path, device_blocks=4)
    try:
        other = harness_tokens(2 * L + 1, seed=5)
        a0 = c.admit(c.request(other))
        with c.use(a0):
            pass
        b = c.admit(c.request(other))
        with c.use(b):  # 2 device slots pinned; 2 left for 3 disk blocks (io_cap 2)
            a = c.admit(c.request(toks))
            assert a.state == "pending"
            c.pipelines.drain()
            c.pipelines.drain()
            with c.use(a) as run:  # truncated, not NotReady forever
                assert 0 < run.hit_tokens < 3 * L
                check_compressed(run, toks)
        assert not c.inspect().want_rebuild and not c.inspect().want_tail_check
        assert c.inspect().io_inflight == 0 and not c.inspect().io_waiting
    finally:
        c.close()


# ---- item 5: an offload's choice and transition are one step --------------------------------
def test_offload_done_is_atomic_with_its_guard(tmp_path: Path, monkeypatch: Any) -> None:
    c = make()
    try:
        toks = harness_tokens(2 * L + 1)
        a = c.admit(c.request(toks))
        with c.use(a):
            pass
        c.tick(10)
        host_free = c.inspect().tiers.host_slots.free
        assert c.offload(1) == 1
        core, act = c.inspect(), c.test_hooks().act
        (rid,) = [r for r in core.index.values() if core.meta.ckv[r] == CKV.OFFLOADING]
        raced = threading.Event()
        job = core.job("dma", rid)
        owner = job.owner

        def can(action: str, r: Any) -> bool:
            ok = owner.can(action, r)
            if action == "offload_done" and not raced.is_set():
                raced.set()  # another thread leases the block between the check and the step
                t = threading.Thread(target=act, args=("touch", rid, 2))
                t.start()
                t.join(timeout=0.5)  # blocked while the job holds the lock (as it must)
            return ok

        job.owner = Proxy(owner, can=can)  # the part the job calls back (works compiled too)
        c.pipelines.drain()
        time.sleep(0.2)  # the toucher ran after the job's step
        assert core.meta.ckv[rid] in (CKV.HOST, CKV.READY)  # never left OFFLOADING
        assert not core.busy()
        if core.meta.ckv[rid] == CKV.READY:
            assert core.tiers.host_slots.free == host_free
    finally:
        c.close()


@pytest.mark.parametrize("mode", ["manual", "threads"])
def test_a_failing_offload_is_cancelled(mode: str, monkeypatch: Any) -> None:
    c = HeterogeneousKVCache(G, executors=mode, writer=DeterministicWriter())
    try:
        toks = harness_tokens(2 * L + 1)
        a = c.admit(c.request(toks))
        with c.use(a):
            pass
        c.tick(10)
        host_free = c.inspect().tiers.host_slots.free

        def broken(*args: Any) -> None:
            raise RuntimeError("DMA engine fault")

        real_step = OffloadJob.step

        def step(job: Any) -> bool:  # the jobs see a cache whose offload_done raises
            job.owner = Proxy(job.owner, offload_done=broken)
            return real_step(job)

        monkeypatch.setattr(OffloadJob, "step", step)
        assert c.offload(2) == 2
        if mode == "manual":
            c.pipelines.drain()
        deadline = time.monotonic() + 10
        while c.inspect().busy() and time.monotonic() < deadline:
            time.sleep(0.01)
        core = c.inspect()
        assert not any(core.meta.ckv[r] == CKV.OFFLOADING for r in core.index.values())
        assert core.tiers.host_slots.free == host_free
        assert len(c.pipelines.errors()) == 2  # recorded, not silent
        b = c.admit(c.request(toks))  # the device copies are still served
        assert b.state == "validated" and b.hit_tokens == 2 * L
        c.abort(b.request)
    finally:
        c.close()


def test_a_use_waiting_on_a_stalled_load_holds_back_no_other_use(tmp_path: Path) -> None:
    """Two admissions wait in ``use`` for their recoveries; the first's load is stalled on
    the disk, the second's completes: the second ``use`` returns at once.  A state change
    wakes the waiters only where what one of them waits for holds (``GuardGate.notify_changed``
    asks each); stopping at the first waiter whose condition does not hold lost the second's
    wake-up, and it timed out behind a load it does not need."""
    toks_a = harness_tokens(2 * L + 1, seed=3)
    toks_b = harness_tokens(2 * L + 1, seed=4)
    persist(tmp_path, toks_a)
    persist(tmp_path, toks_b)
    c = HeterogeneousKVCache(
        G, cache_dir=tmp_path, executors="threads", writer=DeterministicWriter()
    )
    entered, release = threading.Event(), threading.Event()
    try:
        real: Any = None
        first = [True]

        def stalled(*args: Any) -> Any:
            if first[0]:  # (the first disk read: one of the first admission's loads)
                first[0] = False
                entered.set()
                release.wait(timeout=10)  # bounded so a failure cannot hang
            return real(*args)

        real = c.test_hooks().replace_disk_method("read_block", stalled)
        a = c.admit(c.request(toks_a))
        assert entered.wait(timeout=10)
        waiting_a: list[Any] = []

        def use_a() -> None:
            with c.use(a, timeout=20) as run:
                waiting_a.append(run.hit_tokens)

        ta = threading.Thread(target=use_a, daemon=True)
        ta.start()
        time.sleep(0.2)  # (the first use waits first: its condition is asked first)
        b = c.admit(c.request(toks_b))
        t0 = time.perf_counter()
        with c.use(b, timeout=5) as run:
            assert run.hit_tokens == 2 * L
            check_compressed(run, toks_b)
        took = time.perf_counter() - t0
        assert not release.is_set() and not waiting_a  # the first still waits on its load
        assert took < 2.0, f"a use waited {took:.2f} s behind another's stalled load"
        release.set()
        ta.join(timeout=20)
        assert waiting_a == [2 * L]
    finally:
        release.set()
        c.close()


# ---- item 6: a stalled disk read blocks nothing that does not need the disk -----------------
def test_stalled_disk_read_blocks_no_other_work(tmp_path: Path) -> None:
    toks = harness_tokens(2 * L + 1)
    persist(tmp_path, toks)
    c = HeterogeneousKVCache(
        G, cache_dir=tmp_path, executors="threads", writer=DeterministicWriter()
    )
    try:
        resident = harness_tokens(3 * L + 1, seed=9)
        a0 = c.admit(c.request(resident))
        with c.use(a0):
            pass
        entered, release = threading.Event(), threading.Event()
        real: Any = None

        def stalled(*args: Any) -> Any:
            entered.set()
            release.wait(timeout=5)  # a disk that hangs (bounded so a failure cannot hang)
            return real(*args)

        real = c.test_hooks().replace_disk_method("read_block", stalled)
        a = c.admit(c.request(toks))
        assert entered.wait(timeout=10)
        t0 = time.perf_counter()
        stats = c.stats()
        c.tick(1)
        b = c.admit(c.request(resident))
        with c.use(b) as run:
            assert run.hit_tokens == 3 * L
        took = time.perf_counter() - t0
        stalled_meanwhile = not release.is_set()
        release.set()
        print(f"stats+tick+admit+use during a stalled disk read: {took * 1000:.1f} ms")
        assert stalled_meanwhile and stats["io_inflight"] >= 1
        assert took < 2.0, f"work that needs no disk waited {took:.2f} s on a stalled read"
        with c.use(a, timeout=20) as run:
            assert run.hit_tokens == 2 * L
            check_compressed(run, toks)
    finally:
        release.set()
        c.close()


def test_spill_writes_without_the_lock(tmp_path: Path) -> None:
    c = make(cache_dir=tmp_path)
    try:
        toks = harness_tokens(2 * L + 1)
        a = c.admit(c.request(toks))
        with c.use(a):
            pass
        c.tick(10)
        c.offload(100)
        c.pipelines.drain()
        seen: list[bool] = []
        real: Any = None

        def probe(*args: Any, **kw: Any) -> Any:
            free = threading.Thread(target=lambda: seen.append(c.stats() is not None))
            free.start()
            free.join(timeout=1)  # another thread can use the cache during the write
            seen.append(not free.is_alive())
            return real(*args, **kw)

        real = c.test_hooks().replace_disk_write(probe)
        assert c.spill(100) == 2
        assert seen and all(seen)
    finally:
        c.close()
