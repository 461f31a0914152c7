"""A restored compressor state that fails its splice check is never served at its boundary.

Host memory has no checksum: a bit flip in the host copy of a block's compressor state comes
back with the block's load, and the tail-splice check that runs when the load lands marks the
record.  The admission that started the load is cut by one block at ``use``; an admission taken
later, while the block sits on the device, must be cut the same way (found by
``kvstate fuzz --target kvstate-api --profile dev --seed 0``).
"""

from __future__ import annotations

from typing import Any

import pytest
from cache_checks import make

from kvstate.impl import HeterogeneousKVCache
from kvstate.impl.testdata import harness_tokens
from kvstate.spec import small
from kvstate.spec.phases import CKV

G = small()
L = G.lcm_tokens
N = 4  # blocks of the prompt; the last one goes to the host and comes back damaged


@pytest.fixture
def cache() -> Any:
    c = make(max_requests=4)
    yield c
    c.close()


def _flip_host_tail(c: HeterogeneousKVCache, rid: int) -> None:
    """Flip the low bit of the position the host copy records for the boundary's last token."""
    grp, m = c.inspect().tiers.compressor, c.inspect().meta
    assert m.ckv[rid] == CKV.HOST and m.hslot[rid] >= 0
    idx = grp.host_index(m.hslot[rid])
    v = grp.host_data[:, idx].clone()
    v[..., grp.state_bytes + 8 * ((N * L - 1) % grp.ring)] ^= 0x01
    grp.host_data[:, idx] = v


def _tails_splice(run: Any) -> None:
    for li in range(sum(1 for k in G.layers if k == "csa")):
        run.read_tail(li)  # raises TailDiscontinuityError on a state of another position


def test_a_tail_that_failed_its_check_is_not_served_to_a_later_admission(
    cache: HeterogeneousKVCache,
) -> None:
    toks = harness_tokens(N * L + 1)
    first = cache.admit(cache.request(toks, lifetime=1))
    with cache.use(first):
        pass
    cache.tick(1)
    rids = cache.register(cache.chain(toks[: N * L]))
    last = rids[N - 1]
    assert cache.offload(1) == 1 and cache.inspect().meta.hslot[last] >= 0  # the LRU: the last
    cache.pipelines.drain()
    _flip_host_tail(cache, last)

    loading = cache.admit(cache.request(toks, lifetime=1))
    assert loading.state == "pending" and loading.hit_tokens == N * L
    cache.pipelines.drain()  # the load lands, its tail check fails and marks the record
    assert cache.inspect().meta.ckv[last] == CKV.READY and cache.inspect().meta.corrupt[last]

    later = cache.admit(cache.request(toks, lifetime=1))
    assert later.hit_tokens == (N - 1) * L  # cut by one block, as the first admission is
    with cache.use(later) as run:
        assert run.hit_tokens == (N - 1) * L
        _tails_splice(run)
    with cache.use(loading) as run:
        assert run.hit_tokens == (N - 1) * L
        _tails_splice(run)


def _flip_host_tail_at(c: HeterogeneousKVCache, rid: int, boundary: int) -> None:
    """:func:`_flip_host_tail` for the state saved at ``boundary`` (the record's end)."""
    grp, m = c.inspect().tiers.compressor, c.inspect().meta
    assert m.ckv[rid] == CKV.HOST and m.hslot[rid] >= 0
    idx = grp.host_index(m.hslot[rid])
    v = grp.host_data[:, idx].clone()
    v[..., grp.state_bytes + 8 * ((boundary - 1) % grp.ring)] ^= 0x01
    grp.host_data[:, idx] = v


def test_a_cut_back_onto_another_restored_tail_checks_it_too(
    cache: HeterogeneousKVCache,
) -> None:
    """The last two blocks come back from the host, both tails damaged: the hit's end fails its
    check and is cut by one block, onto the other restored tail, which was never checked; it
    must be checked then and cut again, never served (found by ``kvstate fuzz --target
    kvstate-api --profile ci``, witness "a damaged host tail, then the prefix hit again")."""
    toks = harness_tokens(N * L + 1)
    first = cache.admit(cache.request(toks, lifetime=1))
    with cache.use(first):
        pass
    cache.tick(1)
    rids = cache.register(cache.chain(toks[: N * L]))
    assert cache.offload(2) == 2  # the LRU's head: the deepest two blocks
    cache.pipelines.drain()
    for b in (N - 2, N - 1):
        _flip_host_tail_at(cache, rids[b], (b + 1) * L)

    loading = cache.admit(cache.request(toks, lifetime=1))
    assert loading.state == "pending" and loading.hit_tokens == N * L
    cache.pipelines.drain()
    with cache.use(loading) as run:
        assert run.hit_tokens <= (N - 2) * L  # (shorter where a rule fails there too)
        _tails_splice(run)
    assert cache.inspect().meta.corrupt[rids[N - 2]]
