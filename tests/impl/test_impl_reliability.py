"""Regressions of the reliability issue's public-API items: never a wrong byte, never a state
change behind a refusal, the same documented error in both builds.

* the caller's token buffer is copied at ``request()`` (an engine that reuses its ``input_ids``
  must not change what is stored under the original prompt's keys);
* a ``Run`` refuses to read once its pins are gone (``RunReleased``), also when another thread
  aborts its request while the owner is inside ``with use()``;
* ``use()`` never refuses after changing state (a failed load plus an expired deadline
  downgrades to a recompute), and a writer error inside ``finish()`` releases the request;
* the listed bad inputs raise a documented ``KVStateError`` and change nothing.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest
import torch
from cache_checks import make

from kvstate.impl import (
    AlreadyReleased,
    HeterogeneousKVCache,
    InvalidArgument,
    KVStateError,
    LayoutError,
    NotReady,
    UnknownRequest,
)
from kvstate.impl.errors import CacheClosed, RunReleased, StaleAdmission, WriterFailed
from kvstate.impl.testdata import DeterministicWriter, harness_tokens
from kvstate.spec import small
from kvstate.spec.phases import Req
from kvstate.testing.datacheck import verify_run

G = small()
L = G.lcm_tokens


@pytest.fixture
def cache() -> Any:
    c = make()
    yield c
    c.close()


def state(c: HeterogeneousKVCache) -> Any:
    core = c.inspect()
    m = core.meta
    cols = ("ckv", "gen", "ref", "ver", "idx", "tail", "swa", "lease", "addr", "slot")
    return (
        c.stats(),
        {f: list(getattr(m, f)) for f in cols},
        [(s.phase, s.hit, s.pinned, s.deadline, s.request is not None) for s in core.slots],
    )


def store(c: HeterogeneousKVCache, toks: Any) -> None:
    with c.use(c.admit(c.request(toks))):
        pass


# ---- item 1: the caller's buffer -------------------------------------------------------------
@pytest.mark.parametrize("kind", ["numpy", "numpy-view", "torch"])
def test_request_copies_the_callers_tokens(cache: HeterogeneousKVCache, kind: str) -> None:
    prompt = harness_tokens(3 * L + 1)
    other = harness_tokens(3 * L + 1, seed=7)
    if kind == "numpy":
        buf: Any = prompt.copy()
    elif kind == "numpy-view":
        buf = np.concatenate([prompt, other])[: len(prompt)]  # a contiguous int64 view
    else:
        buf = torch.from_numpy(prompt.copy())
    req = cache.request(buf)
    if kind != "torch":
        assert buf.flags.writeable  # the caller's array is never made read-only
    buf[:] = other if kind != "torch" else torch.from_numpy(other)  # the engine reuses it
    with cache.use(cache.admit(req)):  # stores the blocks (written from the request's tokens)
        pass
    with cache.use(cache.admit(cache.request(prompt))) as run:
        assert run.hit_tokens == 3 * L
        assert verify_run(run, prompt) == []  # the original prompt's bytes, not the new ones


# ---- item 2: reads after the pins are gone -----------------------------------------------------
def test_run_refuses_reads_after_the_block(cache: HeterogeneousKVCache) -> None:
    toks = harness_tokens(3 * L + 1)
    store(cache, toks)
    with cache.use(cache.admit(cache.request(toks))) as run:
        assert run.hit_tokens == 3 * L and verify_run(run, toks) == []
    cache.tick(10)
    cache.evict(10)  # its blocks are gone; another prompt takes the slots
    store(cache, harness_tokens(3 * L + 1, seed=5))
    for read in (
        lambda: run.read_compressed("csa", 0),
        lambda: run.read_window(0),
        lambda: run.read_tail(0),
        run.block_table,
        lambda: run.prefix(L),
        lambda: run.append([1]),
    ):
        with pytest.raises(RunReleased):
            read()


def test_run_refuses_reads_after_abort_from_another_thread(cache: HeterogeneousKVCache) -> None:
    toks = harness_tokens(3 * L + 1)
    store(cache, toks)
    adm = cache.admit(cache.request(toks))
    with cache.use(adm) as run:
        assert verify_run(run, toks) == []
        t = threading.Thread(target=cache.abort, args=(adm.request,))
        t.start()
        t.join()
        cache.tick(10)
        cache.evict(10)
        store(cache, harness_tokens(3 * L + 1, seed=5))  # overwrites the freed slots
        with pytest.raises(RunReleased):
            run.read_compressed("csa", 0)
        with pytest.raises(RunReleased):
            run.read_window(0)
    assert adm.request.slot is None  # leaving the block does not touch the released request


def test_run_is_stale_after_readmission(cache: HeterogeneousKVCache) -> None:
    toks = harness_tokens(2 * L + 1)
    store(cache, toks)
    req = cache.request(toks)
    with cache.use(cache.admit(req)) as old:
        pass
    with cache.use(cache.admit(req)):  # the same request in use again: the old run stays dead
        with pytest.raises(RunReleased):
            old.read_compressed("csa", 0)


def test_wait_finalizes_a_pending_admission(cache: HeterogeneousKVCache) -> None:
    """``Admission.wait`` is the documented way to block on a recovery: once it returns the
    admission is ready (here: validated, the whole prefix).  Under manual pipelines it refuses
    while jobs are queued, as ``use`` does.  (Found by a random mutant campaign: a ``wait``
    that did nothing passed every test and the API harness.)"""
    toks = harness_tokens(3 * L + 1)
    store(cache, toks)
    cache.tick(10)
    cache.offload(10)
    cache.pipelines.drain()
    cache.evict(10)
    adm = cache.admit(cache.request(toks, lifetime=3))
    assert adm.state == "pending" and not adm.ready
    with pytest.raises(NotReady):
        adm.wait()
    assert adm.state == "pending"
    cache.pipelines.drain()
    assert adm.wait() is adm
    assert adm.ready and adm.state == "validated" and adm.hit_tokens == 3 * L
    with cache.use(adm) as run:
        assert verify_run(run, toks) == []


# ---- item 7: no state change behind a refusal -------------------------------------------------
def test_use_after_failed_load_and_expired_deadline_downgrades(cache: HeterogeneousKVCache) -> None:
    toks = harness_tokens(4 * L + 1)
    store(cache, toks)
    cache.tick(10)
    cache.offload(10)
    cache.pipelines.drain()
    cache.evict(10)
    adm = cache.admit(cache.request(toks, lifetime=2))
    assert adm.state == "pending"
    rids = cache.inspect().resolve(adm.request.chain)
    cache.test_hooks().inject_load_fault(rids[3])  # truncated to 3 blocks, whose window is kept
    cache.pipelines.drain()
    cache.tick(5)  # the request's deadline has passed: no truncated hit is covered by a lease
    with cache.use(adm) as run:
        assert adm.state == "downgraded" and run.hit_tokens == 0
        assert adm.request.phase == Req.USING
    assert adm.request.slot is None and cache.stats()["pinned_blocks"] == 0


class FailingWriter(DeterministicWriter):
    def __init__(self) -> None:
        self.fail = False

    def rows(self, *a: Any, **kw: Any) -> torch.Tensor:
        if self.fail:
            raise RuntimeError("engine kernel failed")
        return super().rows(*a, **kw)


def test_writer_error_in_finish_releases_the_request() -> None:
    w = FailingWriter()
    c = make(writer=w)
    try:
        adm = c.admit(c.request(harness_tokens(3 * L + 1)))
        w.fail = True
        with pytest.raises(WriterFailed) as info:
            with c.use(adm):
                pass
        assert isinstance(info.value.__cause__, RuntimeError)
        assert adm.request.slot is None and c.stats()["pinned_blocks"] == 0
        assert c.stats()["blocks"]["writing"] == 0  # the failing block was discarded
        w.fail = False
        store(c, harness_tokens(3 * L + 1))  # and the cache goes on
    finally:
        c.close()


# ---- item 12: the listed examples -------------------------------------------------------------
def test_run_reader_arguments(cache: HeterogeneousKVCache) -> None:
    toks = harness_tokens(2 * L + 1)
    store(cache, toks)
    with cache.use(cache.admit(cache.request(toks))) as run:
        before = state(cache)
        for call in (
            lambda: run.read_compressed("csa", -1),
            lambda: run.read_compressed("csa", 10**6),
            lambda: run.read_compressed("csa", True),
            lambda: run.read_compressed("swa", 0),
            lambda: run.read_compressed(None, 0),
            lambda: run.read_window(-1),
            lambda: run.read_window(1.0),
            lambda: run.read_tail(-1),
            lambda: run.read_tail(False),
            lambda: run.prefix(True),
            lambda: run.prefix(-L),
        ):
            with pytest.raises(InvalidArgument):
                call()
        assert state(cache) == before


def test_constructor_arguments() -> None:
    for kw in (
        {"device_blocks": True},
        {"device_blocks": "4"},
        {"host_blocks": 1.0},
        {"max_requests": -1},
        {"disk_blocks": float("nan")},
        {"memory_limit": None},
        {"max_model_len": 0},
        {"executors": None},
        {"device": "tpu"},
        {"device": 3.5},
        {"kernel_backend": "bogus"},
        {"kernel_backend": 1},
        {"durable": "no"},
        {"derive_index": 1},
        {"writer": 5},
        {"table": "default"},
        {"cache_dir": 5},
    ):
        with pytest.raises(InvalidArgument):
            make(**kw)
    with pytest.raises(LayoutError, match="CUDA-graph block table"):  # 2**40 tokens x 8 requests
        make(max_model_len=2**40)


def test_request_arguments(cache: HeterogeneousKVCache) -> None:
    before = state(cache)
    for kw in ({"namespace": None}, {"namespace": "a\udc80b"}, {"lifetime": True}):
        with pytest.raises(InvalidArgument):
            cache.request(harness_tokens(L), **kw)
    with pytest.raises(InvalidArgument):
        cache.request(torch.zeros(8, dtype=torch.int64, device="meta"))
    with pytest.raises(InvalidArgument):
        cache.get_request([1])
    with pytest.raises(InvalidArgument):
        cache.get_request(True)
    with pytest.raises(UnknownRequest):
        cache.get_request(10**9)
    with pytest.raises(InvalidArgument):
        cache.use(None)
    with pytest.raises(InvalidArgument):
        cache.test_hooks().act("allocate", True)  # a bool is not a record id
    with pytest.raises(InvalidArgument):
        cache.inspect().can("allocate", True)
    assert state(cache) == before
    req = cache.request(harness_tokens(L + 1))
    with pytest.raises(InvalidArgument):
        cache.admit(req, recover="no")
    adm = cache.admit(req)
    mid = state(cache)
    with pytest.raises(InvalidArgument):
        cache.use(adm, store="no")
    with pytest.raises(InvalidArgument):
        cache.use(adm, timeout=float("nan"))
    assert state(cache) == mid
    cache.abort(req)


def test_stale_admission(cache: HeterogeneousKVCache) -> None:
    toks = harness_tokens(2 * L + 1)
    store(cache, toks)
    req = cache.request(toks)
    old = cache.admit(req)
    cache.abort(req)
    new = cache.admit(req)
    before = state(cache)
    with pytest.raises(StaleAdmission):
        cache.use(old)
    assert state(cache) == before
    with cache.use(new) as run:
        assert run.hit_tokens == 2 * L


def test_use_after_close() -> None:
    c = make()
    toks = harness_tokens(2 * L + 1)
    store(c, toks)
    req = c.request(toks)
    c.close()
    c.close()  # twice is fine
    for call in (
        lambda: c.request(toks),
        lambda: c.admit(req),
        lambda: c.tick(1),
        lambda: c.spill(1),
        lambda: c.chain(toks),
    ):
        with pytest.raises(CacheClosed):
            call()
    assert issubclass(CacheClosed, KVStateError)


def test_abort_twice_from_threads_is_documented(cache: HeterogeneousKVCache) -> None:
    req = cache.request(harness_tokens(2 * L + 1))
    cache.admit(req)
    cache.abort(req)
    with pytest.raises(AlreadyReleased):
        cache.abort(req)


# ---- decode and finish only while in use (the table's release guard) -------------------------
def test_append_and_finish_before_use_are_refused_and_change_nothing(
    cache: HeterogeneousKVCache,
) -> None:
    """A request admitted but not yet in use (PINNED, or VALIDATED) may neither decode nor
    finish: both refuse with a documented error and leave every column and slot as they were;
    the request is then used normally."""
    from kvstate.impl import Refused

    toks = harness_tokens(2 * L + 1)
    store(cache, toks)
    req = cache.request(toks)
    adm = cache.admit(req)
    assert req.phase is not Req.USING
    before = state(cache)
    with pytest.raises(Refused):
        cache.append(req, harness_tokens(L, seed=3))
    assert state(cache) == before
    with pytest.raises(Refused):
        cache.finish(req)
    assert state(cache) == before
    with cache.use(adm) as run:
        assert run.hit_tokens == 2 * L


class CountingWriter(DeterministicWriter):
    """Raises at its ``k``-th ``rows`` call (a call per group and block)."""

    def __init__(self, k: int) -> None:
        super().__init__()
        self.k, self.calls = k, 0

    def rows(self, *a: Any, **kw: Any) -> torch.Tensor:
        self.calls += 1
        if self.calls == self.k:
            raise RuntimeError("engine kernel failed")
        return super().rows(*a, **kw)


def test_writer_error_in_finish_keeps_the_recency_order() -> None:
    """The blocks a failed finish stored before the failure are used like a finish's: the
    deepest least recently (``BlockStore.used_locked``), so eviction takes them tail first."""
    probe = CountingWriter(10**9)
    c = make(writer=probe)
    try:
        toks = harness_tokens(3 * L + 1)
        with c.use(c.admit(c.request(toks))):
            pass
        per_block = probe.calls // 3
    finally:
        c.close()
    w = CountingWriter(2 * per_block + 1)  # the third block's first call fails
    c = make(writer=w)
    try:
        req = c.request(toks)
        with pytest.raises(WriterFailed):
            with c.use(c.admit(req)):
                pass
        view = c.inspect()
        rids = [r for r in view.resolve(req.chain) if r in view.lru]
        assert len(rids) >= 2, (rids, probe.calls, view.lru)
        shown = [r for r in view.lru if r in rids]
        assert shown == rids[::-1], (shown, rids)
    finally:
        c.close()
