"""A finished request leaves nothing for the garbage collector.

A request and its admission used to point at each other (``Request.admission``,
``Admission.request``), so every finished request was a reference cycle: freed only when the
collector ran, and each cycle left behind brought the next collection closer (in a server, a
pause that grows with the heap).  The request drops its admission when it is released, and
staleness is told by the admission's number (``Admission.seq`` against
``Request.admissions``), not by identity.  These tests hold both halves: nothing is left to
collect, and a stale admission or run is still refused.
"""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator
from typing import Any

import pytest
from cache_checks import make

from kvstate.impl import AlreadyReleased, HeterogeneousKVCache
from kvstate.impl.errors import RunReleased, StaleAdmission
from kvstate.impl.testdata import harness_tokens
from kvstate.spec import small

G = small()
L = G.lcm_tokens


@pytest.fixture
def cache() -> Iterator[HeterogeneousKVCache]:
    c = make()
    try:
        yield c
    finally:
        c.close()


@pytest.fixture
def no_gc() -> Iterator[None]:
    """The collector paused: what is freed here is freed by reference counting alone."""
    was = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _cycle(cache: HeterogeneousKVCache, toks: Any, end: str) -> weakref.ref[Any]:
    req = cache.request(toks)
    adm = cache.admit(req)
    if end == "finish":
        with cache.use(adm) as run:
            assert run.hit_tokens == adm.hit_tokens
    else:
        cache.abort(req)
    assert adm.request is req
    return weakref.ref(req)


@pytest.mark.parametrize("end", ["finish", "abort"])
@pytest.mark.parametrize("hit", [False, True], ids=["miss", "hit"])
def test_released_request_is_freed_without_the_collector(
    cache: HeterogeneousKVCache, no_gc: None, end: str, hit: bool
) -> None:
    toks = harness_tokens(3 * L + 1)
    if hit:
        with cache.use(cache.admit(cache.request(toks))):
            pass
    ref = _cycle(cache, toks, end)
    assert ref() is None, "the request outlived its last reference: a cycle keeps it"


def test_a_cycle_of_requests_leaves_no_garbage(cache: HeterogeneousKVCache, no_gc: None) -> None:
    toks = harness_tokens(2 * L + 1)
    for i in range(20):
        req = cache.request(toks if i % 2 else harness_tokens(2 * L + 1, seed=i))
        with cache.use(cache.admit(req)):
            pass
        cache.tick()
    del req
    assert gc.collect() == 0


def test_older_admission_is_stale_after_the_request_finished(cache: HeterogeneousKVCache) -> None:
    toks = harness_tokens(2 * L + 1)
    req = cache.request(toks)
    first = cache.admit(req)
    with cache.use(first):
        pass
    second = cache.admit(req)
    assert second.seq == first.seq + 1
    with pytest.raises(StaleAdmission):
        cache.use(first)
    with cache.use(second) as run:
        assert run.live
    # released: the request holds no admission, and using either one again is refused
    assert req.admission is None
    with pytest.raises(StaleAdmission):
        cache.use(first)
    with pytest.raises(AlreadyReleased):
        with cache.use(second):
            pass
    with pytest.raises(AlreadyReleased):
        with cache.use(req):
            pass


def test_run_of_a_dropped_admission_stays_its_own(cache: HeterogeneousKVCache) -> None:
    """``use(request)`` with the Admission object dropped: the run is live for this
    admission, and dead once the request is admitted again."""
    toks = harness_tokens(2 * L + 1)
    with cache.use(cache.admit(cache.request(toks))):
        pass
    req = cache.request(toks)
    cache.admit(req)  # the Admission is not kept by the caller
    with cache.use(req) as run:
        assert run.live and run.hit_tokens == 2 * L
        assert len(run.pins) == 2
        run.read_compressed("csa", 0)
    cache.admit(req)
    with pytest.raises(RunReleased):
        run.read_compressed("csa", 0)
    cache.abort(req)
