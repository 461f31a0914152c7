"""The reads a disk load makes without the lock, and the I/O pipeline's load job.

A disk load's bytes come off the disk without the cache's lock (a stalled disk blocks no other
work) and are authenticated before any lands.  The load's phase changes are the table's
``load_progress`` / ``load_done`` / ``load_fail`` effects, taken under the lock by the owner
(:class:`~kvstate.impl.recovery.Recovery`, seen here as :class:`LoadOwner`); the chunks' copies
into the job's own slot run before their ``load_progress`` steps, without the lock.  Three
callers read: the I/O job (:meth:`DiskReads.disk_load_step`: one read of the whole file at its
first step, its chunks copied into the slot, then one ``load_progress`` per step), and the
core's step-by-step surface (:meth:`DiskReads.read_ahead` before ``load_progress``,
:meth:`DiskReads.read_window_ahead` before ``load_done``).  It is its own module because that
read-then-publish protocol (read unlocked, land only if the job still owns its record, fail the
load on a bad read) is one job, apart from the table's transitions.
"""

from __future__ import annotations

from typing import Any, Final, Protocol

import torch

from .disk import DiskEntry, DiskTier
from .errors import CorruptEntry
from .gate import GuardGate
from .pipelines import LoadJob, Pipelines


def why_failed(exc: BaseException) -> str:
    """A failed load's reason: a CorruptEntry's own text, else the error's type and text."""
    return str(exc) if isinstance(exc, CorruptEntry) else f"{type(exc).__name__}: {exc}"


class LoadOwner(Protocol):
    """What the reads ask of the loads' owner (each under the lock, which it re-enters)."""

    def owns(self, job: LoadJob) -> bool: ...

    def await_landing(self, rid: int) -> None: ...

    def fail_load(self, rid: int, job: LoadJob, why: str, *, corrupt: bool) -> None: ...

    def load_progress(self, rid: Any, data: torch.Tensor | None = None) -> None: ...

    def install_load(self, rid: Any) -> tuple[int, int]: ...

    def land_chunk(self, job: LoadJob, k: int) -> None: ...

    def chunk_landed(self, rid: int, k: int) -> None: ...


# the fewest doomed files a load's end unlinks while other disk loads run (the bound is the
# disk tier's entries where they are more: :meth:`DiskReads.reap_if_idle`)
REAP_AFTER: Final = 256


class DiskReads:
    def __init__(
        self,
        owner: LoadOwner,
        gate: GuardGate,
        disk: DiskTier,
        pipes: Pipelines,
        reap_after: int = REAP_AFTER,
    ) -> None:
        self.owner = owner
        self.reap_after = reap_after
        self.gate = gate
        self.meta = gate.meta
        self.disk = disk
        self.pipes = pipes

    def disk_load_step(self, job: LoadJob) -> bool:
        """One step of a disk load.  Its first step reads the block's whole file *without* the
        lock (a stalled disk blocks nothing else) in one read, and authenticates every chunk
        (and the window's section when the load restores it) before any lands
        (``DiskTier.read_block``), then copies them into the job's slot, still without the
        lock (:meth:`_land`); each later step takes one chunk's ``load_progress`` under the
        lock, if the job still owns its record.  True when the job is over."""
        try:
            over = self._load_step(job)
        except CorruptEntry:  # the load failed (load_fail ran): over, as any other end
            self.reap_if_idle()
            raise
        if over:
            self.reap_if_idle()
        return over

    def _load_step(self, job: LoadJob) -> bool:
        """:meth:`disk_load_step` (its CorruptEntry, a failed load, ends the job too).  A
        worker thread takes the landed chunks' ``load_progress`` steps and the ``load_done``
        after them in one hold of the lock, each the table's transition as in a step of its
        own: a step each took the lock five times more per block, and on two cores a taken
        lock is a context switch.  Manual pipelines keep one transition per step (a test, the
        harness, interleave others between them)."""
        rid = job.rid
        with self.gate.lock:
            while True:
                if not self.owner.owns(job):
                    self._give_back(job)
                    return True
                entry: DiskEntry = job.src
                if self.gate.can("load_done", rid):
                    if not job.swa_pages or job.swa_data is not None or job.fault:
                        try:
                            self.owner.install_load(rid)  # (CorruptEntry when the load fails)
                        finally:
                            self._give_back(job)
                        return True
                    k = -1  # the window's section, read before load_done
                elif job.fault:
                    self.owner.load_progress(rid)  # fails the load (CorruptEntry)
                    return False  # pragma: no cover: load_progress raises for an injected fault
                else:
                    k = self.meta.prog[rid]
                    if job.chunks is not None:  # (chunk k on are in the slot already: _land)
                        self.owner.chunk_landed(rid, k)
                        if self.pipes.mode == "threads":
                            continue  # (the next transition in the same hold of the lock)
                        return False
                break
        try:
            if k < 0:  # (the chunks landed without this job's read: the window alone)
                data = self.disk.read_swa(entry)
            else:
                job.buffer, job.chunks, job.swa_data = self.disk.read_block(
                    entry, bool(job.swa_pages)
                )
        except Exception as exc:
            with self.gate.lock:
                if self.owner.owns(job):
                    self.owner.fail_load(rid, job, why_failed(exc), corrupt=True)
            return True
        if k < 0:
            with self.gate.lock:
                if self.owner.owns(job):
                    job.swa_data = data
        else:
            self._land(job, k)
        return False

    def _land(self, job: LoadJob, k0: int) -> None:
        """Copy the chunks ``k0`` on (read and authenticated by this step) into the job's
        device slot *without* the lock; the later steps take their ``load_progress`` under it,
        one each (an entry has ``load_steps`` chunks, checked at its scan).  Under the lock, the copies were a 1M recovery's longest
        work there, every other load's step waiting behind them.  The slot is the job's while
        its record is LOADING and the job owns it: only the job ends its load in its own
        steps, and a failure delivered from another thread (the step-by-step surface, a test
        hook) waits until ``job.landing`` is down (:meth:`LoadOwner.await_landing`)."""
        rid = job.rid
        n = len(job.chunks or ())
        with self.gate.lock:
            if not self.owner.owns(job):
                return  # (its next step gives the buffer back and ends)
            job.landing = True
        try:
            for k in range(k0, n):
                self.owner.land_chunk(job, k)
        except Exception as exc:  # any failure is a failed load: nothing stays LOADING
            with self.gate.lock:
                self._landed(job)
                if self.owner.owns(job):
                    self.owner.fail_load(rid, job, why_failed(exc), corrupt=True)
            if isinstance(exc, CorruptEntry):
                raise
            err = CorruptEntry(f"loading record {rid}: {why_failed(exc)}")
            err.__cause__ = exc  # (kept where a compiled caller re-raises it)
            raise err from exc
        with self.gate.lock:
            self._landed(job)

    def _landed(self, job: LoadJob) -> None:
        """The job's copies are over (the lock held): wake a failure waiting for them, if one
        waits (a notification for nothing wakes every waiting ``use``: one more per block)."""
        job.landing = False
        if job.awaited:
            job.awaited = False
            self.gate.notify_changed()

    def reap_if_idle(self) -> None:
        """A disk load is over (its job's end, an abandoned job, a load ended by name): the
        loaded files' unlinks (``reap``, without the lock) wait until no disk load is in
        flight.  An unlink takes the directory's lock and, with the file system's metadata
        out of the page cache, reads its block bitmaps from the disk (about 0.5 ms per file
        here, mostly waiting): between a recovery's reads, the unlinks took disk time from
        them (at 64K about as long as the reads themselves, on two cores; at 1M a worker
        unlinked all the time).  The last load to end (``io_inflight`` 0 once its own
        ``load_done`` or ``load_fail`` ran) unlinks them all; a load's end that finds
        ``reap_after`` waiting (:data:`REAP_AFTER`, or the disk tier's entries where more: the
        files on disk never exceed about twice the tier's) unlinks those, one such end at a
        time, while the others go on loading: a server whose disk loads never all end still
        frees them."""
        if not self.gate.io_inflight:
            self.disk.reap()
        elif self.disk.unlinking >= self.reap_after:
            self.disk.reap(alone=True)

    def _give_back(self, job: LoadJob) -> None:
        """The job's read buffer to the disk tier (nothing reads its chunks any more)."""
        if job.buffer is not None:
            self.disk.give_back(job.buffer)
            job.buffer = job.chunks = job.swa_data = None

    def read_ahead(self, rid: Any) -> tuple[LoadJob, int, torch.Tensor] | None:
        """A step-by-step disk load's next chunk, read and authenticated *without* the lock:
        (its job, the chunk's index, its bytes), or None where there is nothing to read (the
        guard refuses: the locked step says why; a host load; an injected fault; chunks the
        job already read).  A failed read fails the load, as a failure under the lock did."""
        with self.gate.lock:
            if not self.gate.can("load_progress", rid):
                return None
            job = self.pipes.io.get(rid)
            if not isinstance(job, LoadJob) or job.fault or job.chunks is not None:
                return None
            entry: DiskEntry = job.src
            k = self.meta.prog[rid]
        try:
            return job, k, self.disk.read_chunk(entry, k)
        except Exception as exc:
            self._failed_read(job, k, exc)
            raise  # (not reached: _failed_read raises)

    def _failed_read(self, job: LoadJob, k: int, exc: Exception) -> None:
        """A read made without the lock failed: fail the load if it is still where the read
        left it, and raise CorruptEntry."""
        rid = job.rid
        with self.gate.lock:
            self.owner.await_landing(rid)
            if self.owner.owns(job) and (k < 0 or self.meta.prog[rid] == k):
                self.owner.fail_load(rid, job, why_failed(exc), corrupt=True)
        if isinstance(exc, CorruptEntry):
            raise exc
        err = CorruptEntry(f"loading record {rid}: {why_failed(exc)}")
        err.__cause__ = exc
        raise err

    def read_window_ahead(self, rid: Any) -> None:
        """A step-by-step disk load's window section, read and authenticated without the lock
        before ``load_done`` installs it (the job keeps it; nothing to do where the guard
        refuses or the job read it already)."""
        with self.gate.lock:
            if not self.gate.can("load_done", rid):
                return
            job = self.pipes.io.get(rid)
            if (
                not isinstance(job, LoadJob)
                or job.fault
                or not job.swa_pages
                or job.swa_data is not None
            ):
                return
            entry: DiskEntry = job.src
        try:
            data = self.disk.read_swa(entry)
        except Exception as exc:
            self._failed_read(job, -1, exc)
            raise
        with self.gate.lock:
            if self.owner.owns(job) and job.swa_data is None:
                job.swa_data = data
