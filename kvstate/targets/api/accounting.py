"""The harness's accounting checks: pool counters against what the blocks hold, and nothing
left waiting after a drain (read through the cache's inspection view ``h.view``)."""

from __future__ import annotations

import os

from kvstate.spec.phases import CKV, Indexer, Pipe, Swa
from kvstate.targets.api.base import Harness
from kvstate.targets.api.poolstate import pool_state


def accounting(h: Harness) -> list[str]:
    """Pool counters against what the blocks hold (a leak or a double free shows here)."""
    core = h.view
    out = []
    with core.lock:
        m = core.meta
        t = core.tiers
        live = list(core.index.values())
        jobs = [j for _, j in core.jobs()]
        loads = [j for j in jobs if getattr(j, "kind", "") == "load"]
        held = sum(1 for r in live if m.slot[r] >= 0) + len(loads)
        if t.slots.free + held != t.slots.n:
            out.append(f"device slots: {t.slots.free} free + {held} held != {t.slots.n}")
        hheld = sum(1 for r in live if m.hslot[r] >= 0)
        if t.host_slots.free + hheld != t.host_slots.n:
            out.append(f"host slots: {t.host_slots.free} free + {hheld} held != {t.host_slots.n}")
        sw = sum(len(m.swa_pages[r]) for r in live) + sum(len(j.swa_pages) for j in loads)
        if t.swa_pool.free + sw != t.swa_pool.n - t.swa_pool.first:
            out.append(
                f"SWA pages: {t.swa_pool.free} free + {sw} held != {t.swa_pool.n - t.swa_pool.first}"
            )
        # each block's phase says which pools it holds (the table's phases, read as data)
        dev_phases = {int(CKV.WRITING), int(CKV.READY), int(CKV.OFFLOADING), int(CKV.EVICTING)}
        load_dma = {j.rid for j in loads if j.pipe is Pipe.DMA}
        load_io = {j.rid for j in loads if j.pipe is Pipe.IO}
        for r in live:
            ck = m.ckv[r]
            if (m.slot[r] >= 0) != (ck in dev_phases):
                out.append(f"record {r}: phase {CKV(ck).name} but device slot {m.slot[r]}")
            in_host = ck in (CKV.OFFLOADING, CKV.HOST) or r in load_dma
            if (m.hslot[r] >= 0) != in_host:
                out.append(f"record {r}: phase {CKV(ck).name} but host slot {m.hslot[r]}")
            on_disk = ck == CKV.DISK or r in load_io
            if (r in core.disk_entries) != on_disk:
                out.append(f"record {r}: phase {CKV(ck).name}, disk entry {r in core.disk_entries}")
            # SWA pages: a device block holds them exactly while its window is VALID (a
            # slid window gave them back; a load's are its job's until it lands), or while
            # it is written (``allocate`` took them, ``commit`` makes the window VALID: seen
            # between the two when they are fired one at a time, kvstate/targets/api/single.py)
            held = ck == CKV.WRITING or (ck in dev_phases and m.swa[r] == Swa.VALID)
            if bool(m.swa_pages[r]) != held:
                out.append(
                    f"record {r}: phase {CKV(ck).name}, window {Swa(m.swa[r]).name}, "
                    f"{len(m.swa_pages[r])} SWA pages"
                )
            # a phase a job drives has its job (one whose job is gone stays there for good)
            if ck == CKV.OFFLOADING and core.job("dma", r) is None:
                out.append(f"record {r}: phase OFFLOADING, no offload job")
            if m.idx[r] == Indexer.REBUILDING and core.job("cpu", r) is None:
                out.append(f"record {r}: indexer REBUILDING, no rebuild job")
            if (ck == CKV.LOADING) != (r in load_dma or r in load_io):
                out.append(
                    f"record {r}: phase {CKV(ck).name}, load job {r in load_dma or r in load_io}"
                )
        # a FREE record of the index is reclaimable only from the tombstones: one off them
        # is never purged (leaked); a tombstone that is not FREE would purge a live block
        tombstones = set(core.tombstones)
        idx = set(live)
        for r in live:
            if (m.ckv[r] == CKV.FREE) != (r in tombstones):
                out.append(
                    f"record {r}: phase {CKV(m.ckv[r]).name}, on the tombstones {r in tombstones}"
                )
        gone = [r for r in core.tombstones if r not in idx]
        if gone:
            out.append(f"tombstones {gone} are not records of the index")
        out.extend(pool_state(h))  # sizes and device-slot claims (targets/api/poolstate.py)
        refs = sum(m.ref[r] for r in live)
        pins = sum(len(s.rids) for s in core.slots)
        if not refs == pins == core.pinned_blocks:
            out.append(
                f"pins: sum of reference counts {refs}, slots pin {pins}, "
                f"pinned_blocks {core.pinned_blocks}"
            )
        if "remote" in h.cache_kwargs:
            return out  # a remote tier has no directory: its entries are the server's
        names = [p.name for p in os.scandir(h.dir)]  # one listing: entries and leftovers
        for name, data in h.foreign_files.items():  # never deleted, never rewritten
            path = os.path.join(h.dir, name)
            if not os.path.isfile(path):
                out.append(f"disk: a file kvstate did not write is gone: {name}")
            elif open(path, "rb").read() != data:
                out.append(f"disk: a file kvstate did not write was changed: {name}")
        # files whose unlink the file system refused: the tier lists them (unlinks.Orphans)
        orphaned = {os.path.basename(p) for p, _ in core.disk.orphans}
        # loaded or dropped entries' files doomed, their unlinks waiting for the last disk
        # load in flight to end (impl/diskreads.py): no entry, not yet gone (drained_idle
        # requires them gone once nothing runs)
        doomed = set(core.disk.doomed)
        names = [
            n for n in names if n not in h.foreign_files and n not in orphaned and n not in doomed
        ]
        files = sorted(n for n in names if n.endswith(".kvb"))
        entries = sorted(e.path.name for e in core.disk_entries.values())
        if files != entries:
            out.append(f"disk: files {files} != entries {entries}")
        tmps = [n for n in names if n.endswith(".tmp")]
        if tmps:
            out.append(f"disk: temporary files left behind: {tmps}")
    return out


def drained_idle(h: Harness) -> list[str]:
    """After a drain of manual pipelines nothing runs, so nothing may wait on something
    running: no job left, no disk load held back by the I/O cap, no follow-up (rebuild,
    tail check) waiting on a load (each would leave an admission pending for good)."""
    core = rec = h.view
    out = []
    with core.lock:
        if core.busy():
            out.append(f"drained, yet jobs are left: {list(core.pending().values())}")
        if core.io_inflight:
            out.append(f"drained, yet io_inflight is {core.io_inflight}")
        if rec.io_waiting:
            out.append(f"drained, yet loads wait for the I/O cap: {list(rec.io_waiting)}")
        if core.disk.unlinking:
            out.append(f"drained, yet {core.disk.unlinking} doomed files wait for their unlink")
        if rec.want_rebuild or rec.want_tail_check:
            out.append(
                f"drained, yet follow-ups wait on loads: rebuild {sorted(rec.want_rebuild)}, "
                f"tail check {sorted(rec.want_tail_check)}"
            )
    return out
