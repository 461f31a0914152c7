"""The rule epoch (``CacheView.epoch``) moves with every transition that writes what the hit
rules read (``CacheView.rule_reads``): a hit search made at an epoch is a proof of the rules
only while the epoch has not moved.  A disk load that fails on a read made outside the cache's
lock takes its block back to disk (the table's ``load_fail``) on a path that runs no guard, and
must move the epoch all the same (the API fuzz's inspection check found it did not)."""

from __future__ import annotations

import errno
from pathlib import Path

import numpy as np
import pytest
from cache_checks import L, make, store

from kvstate.impl.errors import CorruptEntry
from kvstate.impl.testdata import harness_tokens
from kvstate.spec.phases import CKV


def test_a_load_failed_outside_the_lock_moves_the_rule_epoch(tmp_path: Path) -> None:
    toks = harness_tokens(2 * L + 1)
    with make(cache_dir=tmp_path, device_blocks=4, host_blocks=2, disk_blocks=4) as c:
        view, hooks = c.inspect(), c.test_hooks()
        store(c, toks)
        c.tick(16)  # the leases run out: the blocks may leave the device
        assert c.offload(2) == 2
        hooks.drain()
        assert c.spill(2) == 2
        adm = c.admit(c.request(toks))  # a disk recovery of both blocks, pending
        rids = view.resolve(c.chain(toks))
        rid = next(r for r in rids if view.meta.ckv[r] == CKV.LOADING)
        assert "ckv" in view.rule_reads

        def refused(fd: int, buf: object, offset: int, need: int | None = None) -> int:
            raise OSError(errno.EIO, "the disk refused the read")

        hooks.replace_disk_read(refused)
        before = view.epoch
        with pytest.raises(CorruptEntry):
            hooks.act("load_progress", rid)
        hooks.replace_disk_read(None)
        assert view.meta.ckv[rid] == CKV.DISK  # load_fail: back on disk
        assert view.epoch > before
        c.abort(adm.request)
        assert np.all(np.asarray(view.meta.ref) == 0)
