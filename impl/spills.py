"""Spill and drop: blocks leaving the host tier for the disk, and leaving a tier for good.

The On-disk Prefix's entries live here: the ones a previous process left (adopted at start,
:meth:`Spills.scan_disk`), the ones ``spill`` writes (the file written and published without
the lock, adopted only if the block did not change meanwhile), and ``drop`` of a host or disk
copy (a file's unlink after the lock).  It is its own module because none of it starts a job
or touches a load: :class:`~kvstate.impl.recovery.Recovery` owns one, shares its LRUs and
entry map (loads take blocks out of them and put failed ones back), and forwards the table's
``spill`` and ``drop`` to it.  It takes the gate's lock (the one every part shares:
``CacheCore.lock`` replaces them together).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from kvstate.spec.table import Table

from .blocks import BlockStore
from .disk import DiskEntry, DiskTier
from .errors import DiskWriteError, InternalError, OutOfCapacity, Refused
from .events import EventKind, EventLog
from .gate import GuardGate
from .phasecodes import CKV_DISK, CKV_HOST, IDX_ABSENT, SWA_VALID
from .tiers import Tiers


class Spills:
    def __init__(
        self,
        table: Table,
        gate: GuardGate,
        store: BlockStore,
        tiers: Tiers,
        disk: DiskTier,
        events: EventLog,
        *,
        disk_blocks: int,
    ) -> None:
        self.gate = gate
        self.store = store
        self.meta = gate.meta
        self.tiers = tiers
        self.disk = disk
        self.events = events
        self.k = table.consts
        self.disk_blocks = disk_blocks
        self.host_lru: OrderedDict[int, None] = OrderedDict()
        self.disk_lru: OrderedDict[int, None] = OrderedDict()
        self.disk_entries: dict[int, DiskEntry] = {}

    def scan_disk(self) -> None:
        """Adopt the entries a previous process left in the cache directory (valid ones only;
        over ``disk_blocks``, the most recently written, in the LRU by age)."""
        good, bad = self.disk.scan()
        for path, why in bad:
            self.events.emit(EventKind.REMOVED, None, "disk", f"rejected {path.name}: {why}")
        m = self.meta
        over = max(0, len(good) - self.disk_blocks)
        for e in good[over:]:
            rid = self.store.record(e.key, None, -1)
            self.store.tombstones.pop(rid, None)
            m.ckv[rid], m.ver[rid], m.gen[rid] = CKV_DISK, e.ver, e.gen
            m.fmt[rid] = m.disk_fmt[rid] = e.fmt
            m.tail[rid], m.swa[rid], m.idx[rid] = e.tail, e.swa, IDX_ABSENT
            m.on_disk[rid] = True
            self.disk_entries[rid] = e
            self.disk_lru[rid] = None
        for e in good[:over]:
            self.disk.delete(e)
        self.disk.reap()  # (the constructor: nothing else holds the lock yet)

    def _make_disk_room(self) -> None:
        while len(self.disk_entries) >= self.disk_blocks:
            victim = next((r for r in self.disk_lru if self.gate.can("drop", r)), None)
            if victim is None:
                raise OutOfCapacity("spill", (), f"all {self.disk_blocks} disk entries are in use")
            self._drop(victim)  # (its file is unlinked by the caller's reap, after the lock)

    def spill(self, rid: Any) -> None:
        """The table's ``spill`` of one block (the conformance adapter, and ``offload`` making
        host room): the guard checked and room made under the lock, the file written and
        published without it, then adopted if the block is still the same host copy (else
        :class:`Refused`, the file thrown away).  Raises DiskWriteError, nothing changed but
        the room made, when the disk refuses the write."""
        with self.gate.lock:
            self.gate.check_block("spill", rid)
            self._make_disk_room()
            key, fields, state = self._spill_snapshot(rid)
        try:
            entry = self.disk.publish(self.disk.prepare(key, **fields))  # no lock held
            if not self._adopt_spill(rid, key, state, entry):
                raise Refused("spill", (), "the block changed while its file was written")
        finally:
            self.disk.reap()  # victims dropped for room, a file not adopted: after the lock

    def _spill_snapshot(self, rid: int) -> tuple[bytes, dict[str, Any], tuple[int, ...]]:
        """What a spill writes (copies of the host pages), and the record's state it was taken
        at: (key, the entry's fields, (gen, ver, hslot, ckv))."""
        m = self.meta
        key = m.key[rid]
        if key is None:  # pragma: no cover: a record keeps its key while it has a host copy
            raise InternalError(f"record {rid} has no key to name its disk entry")
        with_swa = m.swa[rid] == SWA_VALID and self.k.swa_restored_from_disk
        units, swa = self.tiers.host_payload(m.hslot[rid], with_swa)
        fields: dict[str, Any] = {
            "ver": m.ver[rid],
            "gen": m.gen[rid],
            "fmt": m.fmt[rid],
            "tail": m.tail[rid],
            "swa": m.swa[rid],
            "units": units,
            "swa_data": swa,
        }
        return key, fields, self._spill_state(rid)

    def _spill_state(self, rid: int) -> tuple[int, ...]:
        m = self.meta
        return (m.gen[rid], m.ver[rid], m.hslot[rid], m.ckv[rid], m.swa[rid])

    def drop_some(self, n: int) -> int:
        """Delete up to ``n`` LRU (or corrupt) disk, then host, entries the table lets go (the
        files unlinked once the lock is released)."""
        done = 0
        try:
            with self.gate.lock:
                for rid in [*list(self.disk_lru), *list(self.host_lru)]:
                    if done >= n:
                        break
                    if self.gate.can("drop", rid):
                        self._drop(rid)
                        done += 1
        finally:
            self.disk.reap()
        return done

    def spill_some(self, n: int) -> int:
        """Spill up to ``n`` LRU host blocks, each file written *without* the lock (a slow disk
        blocks no other work): the payload is copied under the lock, written to a private
        temporary, and published only if the block is still the same host copy (generation,
        version, host slot, phase) and the table still allows the spill; else discarded."""
        done = 0
        tried: set[int] = set()
        while done < n:
            snap = self._next_spill(tried)
            if snap is None:
                break
            rid, key, fields, state = snap
            try:
                # the write and its rename to a fresh name: no lock held
                entry = self.disk.publish(self.disk.prepare(key, **fields))
            except DiskWriteError:  # a full disk: the temporary is gone, nothing published
                if done:
                    return done
                raise
            try:
                done += self._adopt_spill(rid, key, state, entry)
            finally:
                self.disk.reap()
        return done

    def _next_spill(
        self, tried: set[int]
    ) -> tuple[int, bytes, dict[str, Any], tuple[int, ...]] | None:
        """The next LRU host block the table lets spill, and its snapshot (under the lock)."""
        with self.gate.lock:
            rid = next(
                (r for r in self.host_lru if r not in tried and self.gate.can("spill", r)), None
            )
            if rid is None:
                return None
            tried.add(rid)
            key, fields, state = self._spill_snapshot(rid)
            return rid, key, fields, state

    def _adopt_spill(self, rid: int, key: bytes, state: tuple[int, ...], entry: DiskEntry) -> int:
        """Adopt an entry written and published without the lock if its block is still the
        same host copy and the table still allows it (1); else doom the file (0: the caller
        reaps it after the lock)."""
        with self.gate.lock:
            still = self.meta.key[rid] == key and self._spill_state(rid) == state
            if still:
                try:
                    self.gate.check_block("spill", rid)
                    self._make_disk_room()
                except Refused:
                    still = False
            if not still:
                self.disk.delete(entry)
                return 0
            self._fx_spill(rid, entry)
            return 1

    def _fx_spill(self, rid: int, entry: DiskEntry) -> None:
        m = self.meta
        self.tiers.host_slots.release([m.hslot[rid]])
        m.hslot[rid] = -1
        m.ckv[rid] = CKV_DISK
        m.on_disk[rid] = True
        m.disk_fmt[rid] = m.fmt[rid]
        self.disk_entries[rid] = entry
        self.host_lru.pop(rid, None)
        self.disk_lru[rid] = None
        self.events.emit(EventKind.STORED, entry.key, "disk")

    def drop(self, rid: Any) -> None:
        """The table's ``drop``: the record's effects under the lock, a disk entry's unlink
        after it (a refused unlink leaves the file behind: ``DiskTier.orphans``)."""
        try:
            self._drop(rid)
        finally:
            self.disk.reap()

    def _drop(self, rid: Any) -> None:
        """:meth:`drop` under the lock (re-entrant: a caller already holding it reaps after
        releasing it)."""
        with self.gate.lock:
            self.gate.check_block("drop", rid)
            m = self.meta
            tier = "host" if m.ckv[rid] == CKV_HOST else "disk"
            if tier == "host":
                self.tiers.host_slots.release([m.hslot[rid]])
                m.hslot[rid] = -1
                self.host_lru.pop(rid, None)
            else:
                entry = self.disk_entries.pop(rid, None)
                if entry is not None:
                    self.disk.delete(entry)
                m.on_disk[rid] = False
                self.disk_lru.pop(rid, None)
            m.corrupt[rid] = False
            self.store.freed(rid)
            self.events.emit(EventKind.REMOVED, m.key[rid], tier)
