"""The library's request path on real storage: hits and their explanations, decode, eviction,
the request's phases and events.

KV bytes come from the deterministic writer, so every hit's blocks, window and tail are compared
byte for byte with what (group, layer, position, token) say they must be
(``cache_checks``).
"""

from __future__ import annotations

import numpy as np
import pytest
from cache_checks import G, L, check_compressed, check_tail, check_window, make, store

from kvstate.impl import EventKind, HeterogeneousKVCache
from kvstate.impl.testdata import DeterministicWriter, harness_tokens
from kvstate.spec.phases import CKV, Indexer, Req, Swa


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
        table=default_table(G.with_changes(pin_cap_blocks=3)),
        executors="manual",
        writer=DeterministicWriter(),
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
