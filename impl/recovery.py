"""Recovery: the table's On-disk Prefix actions (offload, spill, load, drop) and the indexer
rebuild, with the jobs that run them on the pipelines.

A block leaves the device by ``offload`` (DMA to host) and ``spill`` (host to disk), and comes
back by ``load_start`` / ``load_progress`` / ``load_done`` (DMA from host, I/O from disk), after
which a disk-loaded block's indexer is rebuilt on the CPU pipeline.  Each step is a guarded
transition through the :class:`~kvstate.impl.gate.GuardGate`; the jobs
(:mod:`kvstate.impl.pipelines`) call back into this object, under the gate's lock.  Slow disk
reads and writes run without the lock and are published only if the block did not change.
Two jobs live in their own modules and are reached through this object: spill and drop, with
the disk's entries and the host and disk LRUs (:mod:`kvstate.impl.spills`), and the reads a
disk load makes without the lock (:mod:`kvstate.impl.diskreads`).

The admission cap on disk loads is enforced in one place, :meth:`Recovery.admit_load`: the
table's ``load_start`` guard decides, and a load that its ``io_cap`` conjunct alone refuses
waits in ``io_waiting`` until a running load finishes.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from kvstate.kernels import KernelError
from kvstate.spec.phases import Pipe
from kvstate.spec.table import Table

from .blocks import BlockStore
from .disk import DiskEntry, DiskTier
from .diskreads import REAP_AFTER, DiskReads, why_failed
from .errors import CorruptEntry, InternalError, OutOfCapacity, Refused
from .events import EventKind, EventLog
from .gate import GuardGate
from .phasecodes import (
    CKV_DISK,
    CKV_HOST,
    CKV_LOADING,
    CKV_OFFLOADING,
    CKV_READY,
    IDX_ABSENT,
    IDX_REBUILDING,
    PIPE_CPU,
    PIPE_DMA,
    PIPE_NONE,
    SWA_NULL,
    SWA_VALID,
)
from .pipelines import LoadJob, OffloadJob, Pipelines, RebuildJob, TailCheckJob
from .projection import RecoveryStep
from .spills import Spills
from .tiers import Tiers

# what :meth:`Recovery.admit_load` did with a load
STARTED, QUEUED, REFUSED, NO_ROOM = 0, 1, 2, 3


class Recovery:
    def __init__(
        self,
        table: Table,
        gate: GuardGate,
        store: BlockStore,
        tiers: Tiers,
        disk: DiskTier,
        pipes: Pipelines,
        events: EventLog,
        *,
        host_blocks: int,
        disk_blocks: int,
        backend: str | None,
    ) -> None:
        self.gate = gate
        self.store = store
        self.meta = gate.meta
        self.tiers = tiers
        self.disk = disk
        self.pipes = pipes
        self.events = events
        self.k = table.consts
        self.lock = gate.lock
        # the load_start conjuncts that only delay a load (the table's ``recovery.deferred``:
        # the I/O cap): refused by them alone, a load queues instead of failing
        deferred = table.recovery.deferred if table.recovery is not None else ()
        self._queues = frozenset(c for a, c in deferred if a == "load_start")
        self.host_blocks = host_blocks
        self.disk_blocks = disk_blocks
        self.backend = backend
        # spill and drop (and the disk's entries, its LRU and the host's: shared with the loads)
        self.spills = spills = Spills(
            table, gate, store, tiers, disk, events, disk_blocks=disk_blocks
        )
        self.host_lru = spills.host_lru
        self.disk_lru = spills.disk_lru
        self.disk_entries = spills.disk_entries
        # the disk loads' reads made without the lock
        self.reads = DiskReads(self, gate, disk, pipes, reap_after=max(REAP_AFTER, disk_blocks))
        self.want_rebuild: set[int] = set()  # start an indexer rebuild when this load lands
        # verify the restored tail when this load lands
        self.want_tail_check: dict[int, TailCheckJob] = {}
        self.io_waiting: OrderedDict[int, None] = OrderedDict()  # disk loads queued by io_cap

    # ---- what the jobs ask ------------------------------------------------------------------
    def can(self, action: Any, rid: Any) -> bool:
        return self.gate.can(action, rid)

    def notify_changed(self) -> None:
        self.gate.notify_changed()

    def disk_load_step(self, job: LoadJob) -> bool:
        """One step of a disk load (:meth:`DiskReads.disk_load_step`)."""
        return self.reads.disk_load_step(job)

    # ---- the disk tier's entries: adopted at start, spilled in, dropped (impl/spills.py) -----
    def scan_disk(self) -> None:
        self.spills.scan_disk()

    def spill(self, rid: Any) -> None:
        self.spills.spill(rid)

    def spill_some(self, n: int) -> int:
        return self.spills.spill_some(n)

    def drop(self, rid: Any) -> None:
        self.spills.drop(rid)

    def drop_some(self, n: int) -> int:
        return self.spills.drop_some(n)

    # ---- Indexer State: the rebuild ---------------------------------------------------------
    def rebuild_start(self, rid: Any) -> None:
        with self.lock:
            self.gate.check_block("rebuild_start", rid)
            m = self.meta
            m.idx[rid] = IDX_REBUILDING
            m.ixpipe[rid] = PIPE_CPU
            self.pipes.cpu.submit(RebuildJob(self, rid))

    def rebuild_step(self, job: RebuildJob) -> None:
        """A rebuild job's one step: the indexer keys computed from the slot's compressed KV
        *without* the lock, then ``rebuild_done`` under it.  Under the lock, a 1M recovery's
        4,096 rebuilds kept the I/O workers waiting.  While the block is REBUILDING its slot
        cannot go (``evict_start`` and ``offload_done`` wait for the CPU job) and nothing writes
        its pages, so the keys computed are the block's; the transition checks the slot and
        version the keys came from, and computes them again under the lock if either moved."""
        rid = job.rid
        with self.lock:
            m = self.meta
            if self.pipes.cpu.get(rid) is not job or not self.gate.can("rebuild_done", rid):
                self.rebuild_done(rid)  # (refused, as the transition says why)
                return
            slot, ver = m.slot[rid], m.ver[rid]
        self.tiers.build_index(slot)
        with self.lock:
            built = m.slot[rid] == slot and m.ver[rid] == ver and self.pipes.cpu.get(rid) is job
            self._rebuild_done(rid, build=not built)

    def rebuild_done(self, rid: Any) -> None:
        """The table's ``rebuild_done`` asked by name: the keys computed here, under the lock."""
        self._rebuild_done(rid, build=True)

    def _rebuild_done(self, rid: Any, build: bool) -> None:
        """``rebuild_done`` (``build``: compute the keys; else the job computed them)."""
        with self.lock:
            self.gate.check_block("rebuild_done", rid)
            m = self.meta
            self.store.stamp_index(rid, build)
            m.ixpipe[rid] = PIPE_NONE
            self.pipes.cpu.forget(rid)
            self.gate.notify_changed()

    def abandon_rebuild(  # pragma: no cover: a rebuild kernel that raises (no table transition)
        self, job: RebuildJob
    ) -> None:
        """A rebuild job raised: the indexer is absent again (a later admission rebuilds it;
        a waiting one truncates).  The table has no such transition (``rebuild_done`` is the
        only way out of REBUILDING: the keys are recomputed from resident KV), so no
        conforming run reaches it (kvstate/targets/api/jobfaults.py)."""
        with self.lock:
            rid = job.rid
            m = self.meta
            if m.idx[rid] == IDX_REBUILDING and self.pipes.cpu.get(rid) is job:
                m.idx[rid] = IDX_ABSENT
                m.ixpipe[rid] = PIPE_NONE
                self.pipes.cpu.forget(rid)
                self.gate.notify_changed()

    # ---- offload: device -> host -> disk ----------------------------------------------------
    def offload(self, rid: Any) -> None:
        """The table's ``offload``; with every host slot taken, the LRU host block the table
        lets spill goes to disk first, its file written without the lock (:meth:`spill`)."""
        for _ in range(self.host_blocks + 2):  # (a spilled victim's slot taken meanwhile)
            with self.lock:
                self.gate.check_block("offload", rid)
                got = self.tiers.host_slots.take(1)
                if got is not None:
                    self._fx_offload(rid, got[0])
                    return
                victim = next((r for r in self.host_lru if self.gate.can("spill", r)), None)
                if victim is None:
                    raise OutOfCapacity(
                        "offload", (), f"all {self.host_blocks} host slots are busy"
                    )
            self.spill(victim)
        raise OutOfCapacity("offload", (), "host slots freed by spills were taken by others")

    def _fx_offload(self, rid: int, hslot: int) -> None:
        m = self.meta
        m.hslot[rid] = hslot
        m.ckv[rid] = CKV_OFFLOADING
        m.ldpipe[rid] = PIPE_DMA
        self.store.lru.pop(rid, None)
        self.pipes.dma.submit(OffloadJob(self, rid, hslot))

    def offload_done(self, rid: Any) -> None:
        with self.lock:
            self.gate.check_block("offload_done", rid)
            m = self.meta
            pages = m.swa_pages[rid] if m.swa[rid] == SWA_VALID else ()
            self.tiers.to_host(m.slot[rid], pages, m.hslot[rid])
            self.store.free_device(rid)
            m.ckv[rid] = CKV_HOST
            m.ldpipe[rid] = PIPE_NONE
            self.host_lru[rid] = None
            self.pipes.dma.forget(rid)
            self.events.emit(EventKind.EVICTED, m.key[rid], "device", "offloaded to host")
            self.events.emit(EventKind.STORED, m.key[rid], "host")
            self.gate.notify_changed()

    def offload_cancel(self, rid: Any) -> None:
        with self.lock:
            self.gate.check_block("offload_cancel", rid)
            self._fx_offload_cancel(rid)

    def _fx_offload_cancel(self, rid: int) -> None:
        m = self.meta
        self.tiers.host_slots.release([m.hslot[rid]])
        m.hslot[rid] = -1
        m.ckv[rid] = CKV_READY
        m.ldpipe[rid] = PIPE_NONE
        self.store.lru[rid] = None
        self.pipes.dma.forget(rid)
        self.gate.notify_changed()

    def offload_some(self, n: int) -> int:
        """Start offloading up to ``n`` LRU device blocks whose lease expired to host."""
        done = 0
        with self.lock:
            for rid in list(self.store.lru):
                if done >= n:
                    break
                if (
                    self.meta.lease[rid] <= self.gate.now
                    and self.gate.can("offload", rid)
                    and self.tiers.host_slots.free
                ):
                    self.offload(rid)
                    done += 1
        return done

    # ---- recovery: loads --------------------------------------------------------------------
    def load_start(self, rid: Any) -> None:
        with self.lock:
            self.gate.check_block("load_start", rid)
            m = self.meta
            from_disk = m.ckv[rid] == CKV_DISK
            src: Any
            if from_disk:
                src = self.disk_entries.get(rid)
                if src is None:  # pragma: no cover: invariant: a spill sets entry and phase
                    raise InternalError(f"record {rid} is on disk without an entry")
            else:
                src = m.hslot[rid]
            restore_swa = m.swa[rid] == SWA_VALID and (
                not from_disk or self.k.swa_restored_from_disk
            )
            dst = self.store.take_slot(rid, -1)
            claimant = self.tiers.slots.displaced
            swa_pages: tuple[int, ...] = ()
            if restore_swa:
                try:
                    swa_pages = tuple(self.store.take_swa())
                except OutOfCapacity:  # the slot back with the claim it had (fx_allocate's way)
                    self.tiers.slots.untake(dst, claimant)
                    raise
            pipe = Pipe.IO if from_disk else Pipe.DMA
            m.ckv[rid] = CKV_LOADING
            m.ldpipe[rid] = int(pipe)
            m.prog[rid] = 0
            self.gate.io_inflight += int(from_disk)
            (self.disk_lru if from_disk else self.host_lru).pop(rid, None)
            self.io_waiting.pop(rid, None)
            self.pipes.for_pipe(pipe).submit(LoadJob(self, rid, pipe, dst, src, swa_pages))

    def admit_load(self, rid: int) -> int:
        """The admission cap on disk loads, in one place: start the load if the table's
        ``load_start`` guard holds (:data:`STARTED`, or :data:`NO_ROOM` when no device slot can
        be made), queue it in ``io_waiting`` when the guard's ``io_cap`` conjunct alone refuses
        (:data:`QUEUED`: it starts when a running load ends), else :data:`REFUSED`."""
        refused = self.gate.refused("load_start", rid)
        if refused and self._queues.issuperset(refused):
            self.io_waiting[rid] = None
            return QUEUED
        if refused:
            return REFUSED
        try:
            self.load_start(rid)
        except OutOfCapacity:
            return NO_ROOM
        return STARTED

    def load_job(self, rid: int) -> LoadJob:
        job = self.pipes.io.get(rid) or self.pipes.dma.get(rid)
        if not isinstance(job, LoadJob):  # pragma: no cover: invariant: load_start submits the job
            raise InternalError(f"record {rid} is LOADING without a load job")
        return job

    def _chunk(self, job: LoadJob, k: int, data: torch.Tensor | np.ndarray | None) -> None:
        """Land chunk ``k`` of the load (``data``: its bytes, already read and authenticated
        without the lock; else a disk source is read here)."""
        if job.fault:
            job.fault = False
            raise CorruptEntry(f"injected I/O fault while loading record {job.rid}")
        if job.pipe is Pipe.IO:
            if data is None and job.chunks is not None and k < len(job.chunks):
                data = job.chunks[k]  # (read by the job's first step)
            if data is None:  # (only where a step's read-ahead lost a race: read here)
                data = self.disk.read_chunk(job.src, k)
            self._land_bytes(job, k, data)
        else:
            units = self.tiers.units(True)
            n = len(units)
            chunk = units[k * n // self.k.load_steps : (k + 1) * n // self.k.load_steps]
            self.tiers.land_host(chunk, job.src, job.dst)

    def _land_bytes(self, job: LoadJob, k: int, data: torch.Tensor | np.ndarray) -> None:
        entry: DiskEntry = job.src
        self.tiers.land_chunk(entry.chunks[k][0], entry.chunks[k][1], data, job.dst)

    def land_chunk(self, job: LoadJob, k: int) -> None:
        """Copy chunk ``k`` the job's first step read and authenticated into its slot, the
        lock *not* held (``DiskReads._land``: the job's ``landing`` is up meanwhile)."""
        chunks = job.chunks
        if chunks is None:  # pragma: no cover: invariant: set before landing is raised
            raise InternalError(f"record {job.rid}: landing without its chunks read")
        self._land_bytes(job, k, chunks[k])

    def chunk_landed(self, rid: int, k: int) -> None:
        """The table's ``load_progress`` for chunk ``k``, its bytes already in the slot (the
        job's unlocked copy, :meth:`land_chunk`)."""
        with self.lock:
            self.gate.check_block("load_progress", rid)
            if self.meta.prog[rid] != k:  # pragma: no cover: only the job lands its chunks
                raise InternalError(
                    f"record {rid}: chunk {k} landed at progress {self.meta.prog[rid]}"
                )
            self.meta.prog[rid] = k + 1

    def await_landing(self, rid: Any) -> None:
        """Wait (the lock held, released meanwhile) until no chunk is being copied into the
        slot of ``rid``'s load without the lock: a load ended from outside its job (the
        step-by-step surface, a test hook) must not free a slot its job is still writing.
        The job's own thread never waits here (its landing is down between its steps)."""
        job = self.pipes.io.get(rid) if isinstance(rid, int) else None  # (a bad id: the guard says)
        if isinstance(job, LoadJob) and job.landing:
            job.awaited = True
            self.gate.wait_changed(lambda: not job.landing, None)

    def load_progress(self, rid: Any, data: torch.Tensor | None = None) -> None:
        """Land the load's next chunk: ``data`` (read by its job), else, for a disk load driven
        step by step (the core's surface), the chunk read and authenticated first without the
        lock (:meth:`DiskReads.read_ahead`; Refused, nothing changed, if the load moved on
        meanwhile)."""
        ahead = self.reads.read_ahead(rid) if data is None else None
        with self.lock:
            self.await_landing(rid)
            self.gate.check_block("load_progress", rid)
            job = self.load_job(rid)
            if ahead is not None:
                if ahead[0] is not job or ahead[1] != self.meta.prog[rid]:
                    raise Refused("load_progress", (), "the load moved on while its chunk was read")
                data = ahead[2]
            try:
                self._chunk(job, self.meta.prog[rid], data)
            except Exception as exc:  # any failure is a failed load: nothing stays LOADING
                self.fail_load(rid, job, why_failed(exc), corrupt=True)
                if isinstance(exc, CorruptEntry):
                    raise
                raise CorruptEntry(f"loading record {rid}: {why_failed(exc)}") from exc
            self.meta.prog[rid] += 1

    def owns(self, job: LoadJob) -> bool:
        """Is ``job`` still the load of its record (the lock held)?"""
        rid = job.rid
        return self.meta.ckv[rid] == CKV_LOADING and self.pipes.for_pipe(job.pipe).get(rid) is job

    def abandon_load(self, job: LoadJob, why: str) -> None:
        """A load job raised: fail its load (the table's ``load_fail`` effects) if it still
        owns its record, so nothing stays LOADING, no slot or page leaks."""
        with self.lock:
            if self.owns(job):
                self.fail_load(job.rid, job, why, corrupt=True)
        self.reads.reap_if_idle()  # (without the lock)

    def abandon_offload(self, job: OffloadJob) -> None:
        """An offload job raised: cancel it (the device copy stays, the host slot is freed)."""
        with self.lock:
            rid = job.rid
            if self.meta.ckv[rid] == CKV_OFFLOADING and self.pipes.dma.get(rid) is job:
                self.gate.admitted("offload_cancel", 1)  # (no guard on this path: see fail_load)
                self._fx_offload_cancel(rid)

    def start_recovery(
        self, steps: Sequence[RecoveryStep], rids: Sequence[int], hit: int
    ) -> TailCheckJob | None:
        """Start a recovery plan's steps as far as the table and the pipelines allow now: a load
        past the I/O cap queues (:meth:`admit_load`), a rebuild waits on its block's load
        (``want_rebuild``), a load that cannot find device room ends the plan (the admission
        truncates at use).  A load of the hit's last block brings the compressor state saved at
        that boundary with it: the splice check returned runs when the load lands."""
        with self.lock:
            loads_boundary = False
            nb = -(-hit // self.k.L)
            can = self.gate.can
            for st in steps:
                rid = st.rid
                if st.action == "offload_cancel" and can("offload_cancel", rid):
                    self.offload_cancel(rid)
                elif st.action == "load_start":
                    loads_boundary |= st.block == nb - 1
                    if self.admit_load(rid) == NO_ROOM:  # no device room now: truncated at use
                        break
                elif st.action == "rebuild_start":
                    if can("rebuild_start", rid):  # kv_on_device: once its load lands
                        self.rebuild_start(rid)
                    else:
                        self.want_rebuild.add(rid)
            # follow-ups wait only on loads that started or are queued: a load that could not
            # start (no device room) leaves none behind
            for st in steps:
                if st.rid in self.want_rebuild and not self.load_pending(st.rid):
                    self.want_rebuild.discard(st.rid)
            if loads_boundary and nb > 0 and self.load_pending(rids[nb - 1]):
                tc = TailCheckJob(self, rids[nb - 1], hit)
                self.want_tail_check[tc.rid] = tc
                return tc
            return None

    def recovery_pending(self, steps: Sequence[RecoveryStep], tc: TailCheckJob | None) -> bool:
        """Is any job of a recovery plan still queued or running?  Asked by a waiting ``use``
        at every state change, so it scans the plan from its end: loads start and land in plan
        order, so a pending job is found within a few steps of the end until the last ones
        land, where a scan from the start walked every step already done (quadratic in the
        plan's length over one recovery: ~4000 wakes over ~8000 steps at 1M tokens, under the
        lock the landings need)."""
        m = self.meta
        for st in reversed(steps):
            rid = st.rid
            # (a wanted rebuild waits on its load: pending exactly while the load is)
            if m.ckv[rid] == CKV_LOADING or m.idx[rid] == IDX_REBUILDING or rid in self.io_waiting:
                return True
        if tc is not None and tc.ok is None:
            # queued or running, or its block still loading (the load submits it when it lands)
            return (
                tc.key in self.pipes.cpu.jobs
                or m.ckv[tc.rid] == CKV_LOADING
                or tc.rid in self.io_waiting
            )
        return False

    def load_pending(self, rid: int) -> bool:
        """Is a load of this record in flight or queued by the I/O cap?"""
        return self.meta.ckv[rid] == CKV_LOADING or rid in self.io_waiting

    def drop_wants(self, rid: int) -> None:
        """Follow-ups (rebuild, tail check) of a load that will not happen: an admission
        waiting for them validates what is there and truncates instead of waiting forever."""
        self.want_rebuild.discard(rid)
        self.want_tail_check.pop(rid, None)
        self.gate.notify_changed()

    def load_done(self, rid: Any) -> tuple[int, int]:
        """Install the loaded block; returns (device address, stored form) it came back in.
        (A disk load's window section is read here unless its job read it without the lock.)
        A disk load's file is doomed under the lock and unlinked after it."""
        try:
            self.reads.read_window_ahead(rid)
            return self.install_load(rid)
        finally:
            self.reads.reap_if_idle()

    def install_load(self, rid: Any) -> tuple[int, int]:
        """:meth:`load_done` under the lock (the window's bytes read already, or read here)."""
        with self.lock:
            self.await_landing(rid)
            self.gate.check_block("load_done", rid)
            m = self.meta
            job = self.load_job(rid)
            from_disk = job.pipe is Pipe.IO
            if job.fault:
                job.fault = False
                self.fail_load(rid, job, "injected I/O fault at completion", corrupt=False)
                raise CorruptEntry(f"injected I/O fault while completing record {rid}")
            if job.swa_pages:
                try:
                    if from_disk:
                        data = job.swa_data
                        if data is None:
                            data = self.disk.read_swa(job.src)
                        self.tiers.swa_from_bytes(data, job.swa_pages)
                    else:
                        self.tiers.swa_from_host(job.src, job.swa_pages)
                except Exception as exc:  # any failure is a failed load
                    self.fail_load(rid, job, why_failed(exc), corrupt=True)
                    if isinstance(exc, CorruptEntry):
                        raise
                    raise CorruptEntry(f"loading record {rid}: {why_failed(exc)}") from exc
            why = self.store.moved(rid, job.dst)
            m.slot[rid] = job.dst
            m.swa_pages[rid] = job.swa_pages
            m.ckv[rid] = CKV_READY
            m.ldpipe[rid] = PIPE_NONE
            if from_disk:
                self.gate.io_inflight -= 1
                m.idx[rid] = IDX_ABSENT
                if not self.k.swa_restored_from_disk:
                    m.swa[rid] = SWA_NULL
                m.fmt[rid] = job.src.fmt
                self.disk.delete(job.src)  # unlinked after the lock (load_done's reap)
                self.disk_entries.pop(rid, None)
                m.on_disk[rid] = False
            else:
                self.tiers.host_slots.release([job.src])
                m.hslot[rid] = -1
            self.store.lru[rid] = None
            self.pipes.for_pipe(job.pipe).forget(rid)
            self.store.stale(rid, why)  # once the record is whole (BlockStore.moved)
            self.events.emit(EventKind.LOADED, m.key[rid], "disk" if from_disk else "host")
            self._after_load(rid, from_disk)
            self.gate.notify_changed()
            return m.addr[rid], m.fmt[rid]

    def _after_load(self, rid: int, from_disk: bool) -> None:
        check = self.want_tail_check.pop(rid, None)
        if check is not None:
            self.pipes.cpu.submit(check)
        if rid in self.want_rebuild:
            self.want_rebuild.discard(rid)
            if self.gate.can("rebuild_start", rid):
                self.rebuild_start(rid)
        if from_disk:
            self._start_waiting_io()

    def _start_waiting_io(self) -> None:
        """Disk loads queued by the I/O cap start as earlier ones finish, in order, until the
        cap (the table's ``io_cap`` conjunct, through :meth:`admit_load`) queues one again."""
        for rid in list(self.io_waiting):
            got = self.admit_load(rid)
            if got == QUEUED:
                break
            if got != STARTED:  # refused, or no device room now: its admission truncates
                self.io_waiting.pop(rid, None)
                self.drop_wants(rid)

    def load_fail(self, rid: Any) -> None:
        with self.lock:
            self.await_landing(rid)
            self.gate.check_block("load_fail", rid)
            self.fail_load(rid, self.load_job(rid), "load failed", corrupt=False)

    def fail_load(self, rid: int, job: LoadJob, why: str, *, corrupt: bool) -> None:
        m = self.meta
        # the table's ``load_fail``, performed here on every path (a read that failed outside
        # the lock, a job abandoned), not only behind its guard: it writes what the hit rules
        # read, so a search made before it is no longer a proof of them
        self.gate.admitted("load_fail", 1)
        self.tiers.slots.release(job.dst)
        self.tiers.slots.unclaim(job.dst, rid)
        if job.swa_pages:
            self.tiers.swa_pool.release(job.swa_pages)
            job.swa_pages = ()
        from_disk = job.pipe is Pipe.IO
        m.ckv[rid] = CKV_DISK if from_disk else CKV_HOST
        m.ldpipe[rid] = PIPE_NONE
        m.prog[rid] = self.k.load_steps
        if from_disk:
            self.gate.io_inflight -= 1
            self.disk_lru[rid] = None
        else:
            self.host_lru[rid] = None
        if corrupt:
            m.corrupt[rid] = True
        self.want_rebuild.discard(rid)
        self.want_tail_check.pop(rid, None)
        self.pipes.for_pipe(job.pipe).forget(rid)
        self.events.emit(EventKind.LOAD_FAILED, m.key[rid], "disk" if from_disk else "host", why)
        if from_disk:
            self._start_waiting_io()
        self.gate.notify_changed()

    def inject_load_fault(self, rid: Any) -> None:
        """Test hook: the next step of this block's load fails as an I/O error would."""
        with self.lock:
            self.load_job(self.gate.rid(rid)).fault = True

    def forget_unwanted(self) -> None:
        """Queued loads nobody is waiting for any more (no request pins their block) leave
        the I/O queue, and so do their follow-ups (a rebuild, a tail check: left behind, they
        waited for good, and the tail check ran at the block's next load, for nobody)."""
        ref = self.meta.ref
        for rid in list(self.io_waiting):
            if ref[rid] == 0:
                self.io_waiting.pop(rid, None)
                self.drop_wants(rid)

    # ---- verification -----------------------------------------------------------------------
    def check_tail(self, rid: Any, boundary: Any) -> bool:
        """Does the compressor state saved at ``boundary`` (the end of record ``rid``) splice?
        A failure marks the record corrupt (it is not served at that boundary again)."""
        with self.lock:
            m = self.meta
            grp = self.tiers.compressor
            if m.slot[rid] < 0:
                return False
            pages = grp.device_data[:, grp.dev_index(m.slot[rid])]
            try:
                for li in range(grp.nl):
                    state, pos = grp.decode(pages[li])
                    grp.check(state, pos, boundary, self.backend)
            except KernelError:
                m.corrupt[rid] = True
                return False
            return True
