"""Bad input raises a documented exception, before any state changes (check, then mutate)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from kvstate.impl import (
    AlreadyReleased,
    HeterogeneousKVCache,
    InvalidArgument,
    KVStateError,
    LayoutError,
    OutOfCapacity,
    Refused,
    UnknownRequest,
)
from kvstate.impl.testdata import DeterministicWriter, harness_tokens
from kvstate.spec import deepseek_v4_flash, default_table, small
from kvstate.spec.errors import ActionRefused, GeometryError
from kvstate.testing import seeded
from kvstate.testing.adapter import make_target

L = small().lcm_tokens


@pytest.fixture
def cache() -> Any:
    c = HeterogeneousKVCache(small(), executors="manual", writer=DeterministicWriter())
    yield c
    c.close()


def snapshot(c: HeterogeneousKVCache) -> Any:
    core = c.inspect()
    m = core.meta
    fields = ("ckv", "gen", "ref", "ver", "idx", "iver", "tail", "swa", "lease", "addr", "prog")
    return (
        {f: list(getattr(m, f)) for f in fields},
        [(s.phase, s.hit, s.pinned, s.deadline, s.request is not None) for s in core.slots],
        core.now,
        core.pinned_blocks,
        core.tiers.slots.free,
        core.tiers.host_slots.free,
        len(core.index),
    )


def test_hierarchy() -> None:
    assert issubclass(Refused, ActionRefused) and issubclass(Refused, KVStateError)
    for exc in (AlreadyReleased, OutOfCapacity):
        assert issubclass(exc, Refused)
    assert issubclass(InvalidArgument, ValueError)
    assert issubclass(LayoutError, GeometryError)
    assert issubclass(UnknownRequest, KeyError)


@pytest.mark.parametrize(
    "tokens",
    [
        [-1, 2, 3],  # negative id
        [[1, 2], [3, 4]],  # not 1-D
        [1.5, 2.0],  # not integers
        np.array([2**41]),  # absurd id
        "abc",  # not a sequence of ints
    ],
)
def test_bad_tokens(cache: HeterogeneousKVCache, tokens: Any) -> None:
    before = snapshot(cache)
    with pytest.raises(InvalidArgument):
        cache.request(tokens)
    assert snapshot(cache) == before


def test_absurd_prompt_length() -> None:
    c = HeterogeneousKVCache(
        small(), executors="manual", max_model_len=100, writer=DeterministicWriter()
    )
    try:
        with pytest.raises(InvalidArgument, match="max_model_len"):
            c.request(np.zeros(101, dtype=np.int64))
    finally:
        c.close()


@pytest.mark.parametrize("lifetime", [0, -3, 1.5, True])
def test_bad_lifetime(cache: HeterogeneousKVCache, lifetime: Any) -> None:
    with pytest.raises(InvalidArgument):
        cache.request(harness_tokens(40), lifetime=lifetime)


def test_unknown_requests(cache: HeterogeneousKVCache) -> None:
    other = HeterogeneousKVCache(small(), executors="manual", writer=DeterministicWriter())
    try:
        foreign = other.request(harness_tokens(40))
        before = snapshot(cache)
        with pytest.raises(UnknownRequest):
            cache.admit(foreign)
        with pytest.raises(UnknownRequest):
            cache.get_request(12345)
        with pytest.raises(UnknownRequest):
            cache.test_hooks().act("match", 99, 0)
        with pytest.raises(UnknownRequest):
            cache.abort(foreign)
        assert snapshot(cache) == before
    finally:
        other.close()


def test_release_twice_and_abort_after_release(cache: HeterogeneousKVCache) -> None:
    req = cache.request(harness_tokens(3 * L + 1))
    adm = cache.admit(req)
    with cache.use(adm):
        pass
    before = snapshot(cache)
    with pytest.raises(AlreadyReleased):
        cache.finish(req)
    with pytest.raises(AlreadyReleased):
        cache.abort(req)
    with pytest.raises(AlreadyReleased):
        with cache.use(req):
            pass
    assert snapshot(cache) == before


def test_admit_twice_is_refused(cache: HeterogeneousKVCache) -> None:
    req = cache.request(harness_tokens(2 * L + 1))
    cache.admit(req)
    before = snapshot(cache)
    with pytest.raises(Refused):
        cache.admit(req)
    assert snapshot(cache) == before
    cache.abort(req)


def test_negative_and_too_long_hits(cache: HeterogeneousKVCache) -> None:
    req = cache.request(harness_tokens(2 * L))
    slot = cache.test_hooks().act("admit", req, 2)
    before = snapshot(cache)
    for h in (-1, 2 * L + 1, 10**12):
        with pytest.raises(InvalidArgument):
            cache.test_hooks().act("match", slot, h)
    with pytest.raises(InvalidArgument):
        cache.test_hooks().act("match", slot, 3.0)  # type: ignore[arg-type]
    assert snapshot(cache) == before
    cache.test_hooks().act("abort", slot)


def test_bad_ticks(cache: HeterogeneousKVCache) -> None:
    before = snapshot(cache)
    for t in (0, -1):
        with pytest.raises(InvalidArgument):
            cache.tick(t)
    rid = cache.register(cache.chain(harness_tokens(L)))[0]
    before = snapshot(cache)
    for t in (0, small().lease_max + 1):
        with pytest.raises(InvalidArgument):
            cache.test_hooks().act("touch", rid, t)
    assert snapshot(cache) == before


def test_bad_block_records(cache: HeterogeneousKVCache) -> None:
    before = snapshot(cache)
    for rid in (-1, 0, 10**6, "x"):
        with pytest.raises(InvalidArgument):
            cache.test_hooks().act("allocate", rid)  # type: ignore[arg-type]
    assert snapshot(cache) == before


def test_refusal_changes_nothing(cache: HeterogeneousKVCache) -> None:
    rid = cache.register(cache.chain(harness_tokens(L)))[0]
    before = snapshot(cache)
    for action in ("commit", "seal", "slide", "offload", "spill", "load_start", "load_done",
                   "evict_start", "evict_done", "drop", "rebuild_done", "discard"):  # fmt: skip
        with pytest.raises(Refused) as info:
            cache.test_hooks().act(action, rid)
        assert info.value.action == action and info.value.failed
        assert snapshot(cache) == before


def test_geometry_that_cannot_be_laid_out() -> None:
    with pytest.raises(LayoutError):  # 65536 device blocks of DeepSeek-V4-Flash: hundreds of GiB
        HeterogeneousKVCache(deepseek_v4_flash(), writer=DeterministicWriter())
    with pytest.raises(GeometryError):  # m does not divide m'
        small().with_changes(hca_ratio=18)
    with pytest.raises(LayoutError):  # indexer keys wider than the entries they come from
        HeterogeneousKVCache(
            small().with_changes(indexer_entry_bytes=400),
            executors="manual",
            writer=DeterministicWriter(),
        )
    with pytest.raises(InvalidArgument):
        HeterogeneousKVCache(small(), executors="fibers", writer=DeterministicWriter())
    with pytest.raises(InvalidArgument):
        HeterogeneousKVCache(
            small(), executors="manual", device_blocks=0, writer=DeterministicWriter()
        )


def test_flash_geometry_with_small_capacity() -> None:
    g = deepseek_v4_flash().with_changes(
        device_blocks=4, host_blocks=2, disk_blocks=4, pin_cap_blocks=4
    )
    c = HeterogeneousKVCache(g, executors="manual", writer=DeterministicWriter())
    try:
        toks = harness_tokens(2 * g.lcm_tokens + 1)
        a = c.admit(c.request(toks, lifetime=4))
        with c.use(a):
            pass
        a = c.admit(c.request(toks, lifetime=4))
        assert a.hit_tokens == 2 * g.lcm_tokens
        c.abort(a.request)
    finally:
        c.close()


def test_unknown_seeded_bug() -> None:
    """A typo cannot plant nothing: the seeded API refuses it (the cache itself has no bugs)."""
    with pytest.raises(InvalidArgument):
        seeded.cache(small(), bugs=("no_such_bug",), executors="manual")
    with pytest.raises(InvalidArgument):
        make_target(default_table(), 2, bugs=["typo"])


def test_adapter_refusals_are_action_refused() -> None:
    t = make_target(default_table(), 3)
    try:
        before = t.observe()
        for name, kw in (("commit", {"b": 0}), ("pin", {"r": 0}), ("release", {"r": 1}),
                         ("use", {"r": 0}), ("load_done", {"b": 2}), ("recapture", {})):  # fmt: skip
            with pytest.raises(ActionRefused):
                getattr(t, name)(**kw)
            assert t.observe() == before
    finally:
        t.close()


def test_out_of_capacity_when_everything_is_pinned() -> None:
    c = HeterogeneousKVCache(
        small(), executors="manual", device_blocks=4, writer=DeterministicWriter()
    )
    try:
        toks = harness_tokens(4 * L + 1)
        a = c.admit(c.request(toks, lifetime=4))
        with c.use(a):
            pass
        held = c.admit(c.request(toks, lifetime=4))  # pins all 4 blocks
        assert held.hit_tokens == 4 * L
        c.tick(10)
        before = snapshot(c)
        rid = c.register(c.chain(harness_tokens(L, seed=9)))[0]
        before = snapshot(c)
        with pytest.raises(OutOfCapacity):
            c.test_hooks().act("allocate", rid)
        assert snapshot(c) == before
        c.abort(held.request)
        c.test_hooks().act("allocate", rid)  # now the LRU block can be evicted
    finally:
        c.close()


@pytest.mark.parametrize("op", ["evict", "offload", "spill", "drop"])
@pytest.mark.parametrize("n", [-1, 1.5, "2", True])
def test_bad_maintenance_counts(cache: HeterogeneousKVCache, op: str, n: Any) -> None:
    before = cache.stats()
    with pytest.raises(InvalidArgument):
        getattr(cache, op)(n)
    assert cache.stats() == before
