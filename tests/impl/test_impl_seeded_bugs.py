"""The seeded bugs at the library level: each planted bug is seen in the data and the pins
(a wrong window, a broken splice, stale indexer pages, garbage from a partial load, a double
free, an eviction under a pin), not only in the abstract state."""

from __future__ import annotations

import pytest
import torch
from cache_checks import G, L, check_window, offload_all, planted, store

from kvstate.impl import InternalError
from kvstate.impl.testdata import harness_tokens
from kvstate.kernels import TailDiscontinuityError
from kvstate.spec.phases import CKV


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
