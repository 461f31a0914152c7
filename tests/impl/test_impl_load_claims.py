"""A load that fails for want of SWA pages after it took its device slot leaves the slot's claim
as it found it: no free slot stays claimed by a record whose address is elsewhere (the slot
pool's claims steer a record back to the slot its pages were in)."""

from __future__ import annotations

from cache_checks import L, make, offload_all, store

from kvstate.impl.testdata import harness_tokens


def _misclaimed(c: object) -> list[str]:
    v = c.inspect()  # type: ignore[attr-defined]
    slots, m = v.tiers.slots, v.meta
    lands = {j.rid: j.dst for _, j in v.jobs() if j.kind == "load"}  # a load's slot to be
    return [
        f"slot {s} claimed by record {r}, whose address is {m.addr[r]}"
        for s, r in enumerate(slots.claim)
        if r and m.addr[r] != s and lands.get(r, -1) != s
    ]


def test_load_short_of_swa_pages_gives_its_slot_back_with_its_claim() -> None:
    c = make(swa_blocks=1)
    try:
        toks = harness_tokens(3 * L + 1)
        store(c, toks[: L + 1])  # block 0 with its window: the pool's one window
        offload_all(c)  # block 0 on host, its window with it; the pool free again
        adm = c.admit(c.request(toks[: 2 * L + 1]))
        (rid,) = c.pipelines.dma.jobs  # block 0's host load: the engine reports it failed
        c.test_hooks().act("load_fail", rid)
        c.pipelines.drain()
        with c.use(adm) as run:
            assert run.hit_tokens == 0
        offload_all(c)  # block 1 (stored with its window at the end of use) on host too
        assert c.inspect().tiers.swa_pool.free == c.inspect().tiers.swa_pool.n - 1
        # blocks 0 and 1 load from host: 0 takes the pool's one window, 1 takes a device slot
        # and finds no pages and nothing to slide, so its load does not start
        adm = c.admit(c.request(toks[: 2 * L + 1]))
        assert _misclaimed(c) == []
        c.pipelines.drain()
        with c.use(adm) as run:
            assert run.hit_tokens == L
        assert _misclaimed(c) == []
    finally:
        c.close()
