"""Recovery pipelines: one executor per kind of work (five-state separation), two run modes.

* CPU executor: indexer rebuilds and tail checks (pure compute over resident data);
* I/O executor: disk loads, at most ``io_cap`` in flight (the admission cap on recovery);
* DMA executor: host <-> device copies (offloads, host loads).

A slow disk therefore never blocks an indexer rebuild, and a CPU job never waits on an I/O job
(the table's ``kv_on_device`` conjunct: a rebuild starts only once its input is resident).  A
disk load reads and authenticates each chunk *without* the cache's lock and re-takes it only to
land the bytes (if its record is still its own), so a stalled disk blocks no other work.

No exception may leave a record stuck: a job that raises anything (a bug, a malformed entry,
a refusal between two of its steps) is *abandoned*: :meth:`Job.abandon` restores the table's
invariants for its record (a load fails, an offload is cancelled, a rebuild is undone, a tail
check fails), in both run modes; ``drain()`` records the error and goes on.

Jobs are small state machines whose ``step()`` performs exactly one transition of the cache (a
spec action: ``load_progress``, ``load_done``, ``rebuild_done`` ...), choosing the next one by
asking the table's guards what is allowed.  The *same* job code runs in both modes:

* ``threads``: worker threads pop jobs and call ``step()`` until the job is over (production);
* ``manual``: nothing runs by itself; a test calls :meth:`Executor.step` / :meth:`Executor.run`
  / :meth:`Pipelines.drain`, or the conformance adapter performs each action directly, so every
  interleaving is reproducible.
"""

from __future__ import annotations

import queue
import threading
import traceback
from collections.abc import Callable
from typing import Any, Protocol

from kvstate.spec.phases import Pipe

from .errors import CorruptEntry, KVStateError, Refused

MODES = ("manual", "threads")


class JobOwner(Protocol):
    """What a job calls back (the recovery part, :class:`~kvstate.impl.recovery.Recovery`):
    declared here, so that the pipelines do not import the part that owns their jobs."""

    lock: Any
    pipes: Any

    def can(self, action: Any, rid: Any) -> bool: ...
    def owns(self, job: LoadJob) -> bool: ...
    def disk_load_step(self, job: LoadJob) -> bool: ...
    def load_progress(self, rid: Any, data: Any = None) -> None: ...
    def load_done(self, rid: Any) -> tuple[int, int]: ...
    def abandon_load(self, job: LoadJob, why: str) -> None: ...
    def offload_done(self, rid: Any) -> None: ...
    def offload_cancel(self, rid: Any) -> None: ...
    def abandon_offload(self, job: OffloadJob) -> None: ...
    def rebuild_step(self, job: RebuildJob) -> None: ...
    def abandon_rebuild(self, job: RebuildJob) -> None: ...
    def check_tail(self, rid: int, boundary: int) -> bool: ...
    def notify_changed(self) -> None: ...


class Job:
    """One recovery job on one record; ``step()`` returns True once the job is over."""

    pipe = Pipe.NONE
    kind = "job"

    def __init__(self, owner: JobOwner, rid: int) -> None:
        self.owner = owner  # the part the job's transitions go through
        self.rid = rid
        self.key = rid  # executors hold one job per key
        self.over = False

    def step(self) -> bool:
        raise NotImplementedError  # pragma: no cover: abstract: every job kind defines it

    def abandon(self, why: str) -> None:
        """The job raised: undo what it holds so its record is in a consistent phase."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(rid={self.rid}, over={self.over})"


class LoadJob(Job):
    """A block coming back to the device, chunk by chunk (``load_steps`` chunks)."""

    kind = "load"

    def __init__(
        self, owner: JobOwner, rid: int, pipe: Pipe, dst: int, src: Any, swa_pages: tuple[int, ...]
    ) -> None:
        super().__init__(owner, rid)
        self.pipe = pipe
        self.dst = dst  # device slot being written (owned by this job until the load ends)
        self.src = src  # host slot (DMA) or DiskEntry (IO)
        self.swa_pages = swa_pages  # device SWA pages reserved for the window, if restored
        self.fault = False  # fault injection: the next step fails as an I/O error would
        self.swa_data: Any = None  # a disk load's window bytes, read without the lock
        # a disk load's chunks, read at its first step in one read and all authenticated
        # (``DiskTier.read_block``), and the buffer that holds them (given back at the end)
        self.chunks: list[Any] | None = None
        self.buffer: Any = None
        # chunks being copied into ``dst`` by the job's thread without the lock: a failure
        # delivered from elsewhere waits until it is down (``Recovery.await_landing``)
        self.landing = False
        self.awaited = False  # a failure waits for the landing to end (wake it then)

    def step(self) -> bool:
        c = self.owner
        try:
            if self.pipe is Pipe.IO:
                return c.disk_load_step(self)
            with c.lock:  # the choice and the transition, one atomic step
                if not c.owns(self):
                    return True
                if c.can("load_done", self.rid):
                    c.load_done(self.rid)
                    return True
                c.load_progress(self.rid)
                return False
        except CorruptEntry:
            return True  # the core already turned it into load_fail

    def give_back_window(self) -> tuple[int, ...]:
        """The SWA pages reserved for the block's window, handed back (the window slid while
        the block loads): from now on the load lands no window."""
        pages, self.swa_pages = self.swa_pages, ()
        return pages

    def abandon(self, why: str) -> None:
        self.owner.abandon_load(self, why)


class OffloadJob(Job):
    """A device -> host copy; completes (device slot freed) or is cancelled (block stays)."""

    kind = "offload"
    pipe = Pipe.DMA

    def __init__(self, owner: JobOwner, rid: int, hslot: int) -> None:
        super().__init__(owner, rid)
        self.hslot = hslot

    def step(self) -> bool:
        c = self.owner
        with c.lock:  # the choice and the transition, one atomic step
            if c.pipes.dma.get(self.rid) is not self:
                return True  # cancelled already
            if c.can("offload_done", self.rid):
                c.offload_done(self.rid)
            else:  # pinned, leased or being re-indexed meanwhile: keep the device copy
                c.offload_cancel(self.rid)
        return True

    def abandon(self, why: str) -> None:
        self.owner.abandon_offload(self)


class RebuildJob(Job):
    """Recompute a block's indexer keys from its (resident) compressed KV."""

    kind = "rebuild"
    pipe = Pipe.CPU

    def step(self) -> bool:
        self.owner.rebuild_step(self)
        return True

    def abandon(self, why: str) -> None:  # pragma: no cover: a rebuild raises (no transition)
        self.owner.abandon_rebuild(self)


class TailCheckJob(Job):
    """Verify the compressor state restored at a hit boundary with the tail-splice kernel."""

    kind = "tail_check"
    pipe = Pipe.CPU

    def __init__(self, owner: JobOwner, rid: int, boundary: int) -> None:
        super().__init__(owner, rid)
        self.key = -rid  # may run beside the record's rebuild job
        self.boundary = boundary
        self.ok: bool | None = None

    def step(self) -> bool:
        core = self.owner
        with core.lock:
            self.ok = core.check_tail(self.rid, self.boundary)
            core.notify_changed()
        return True

    def abandon(self, why: str) -> None:
        core = self.owner
        with core.lock:
            if self.ok is None:
                self.ok = False  # unverified: the hit is not served at this boundary
            core.notify_changed()


class Executor:
    """Jobs of one pipeline, keyed by record (one live job per record per executor)."""

    def __init__(self, name: str, pipe: Pipe, mode: str, workers: int = 1) -> None:
        if mode not in MODES:  # pragma: no cover: the cache's args.choice refused it first
            raise ValueError(f"executor mode must be one of {MODES}, got {mode!r}")
        self.name = name
        self.pipe = pipe
        self.mode = mode
        self.workers = workers
        self.jobs: dict[int, Job] = {}
        self.errors: list[str] = []
        self._q: queue.Queue[Job | None] = queue.Queue()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()

    def submit(self, job: Job) -> None:
        with self._lock:
            self.jobs[job.key] = job
        if self.mode == "threads":
            self._q.put(job)

    def get(self, key: int) -> Job | None:
        return self.jobs.get(key)

    def forget(self, key: int) -> None:
        with self._lock:
            job = self.jobs.pop(key, None)
        if job is not None:
            job.over = True

    # ---- manual mode --------------------------------------------------------------------
    def step(self, key: int) -> bool:
        """Run one step of the job under ``key`` (a record id); True when the job is over."""
        job = self.jobs.get(key)
        if job is None:
            raise KeyError(f"{self.name}: no job for record {key}")
        try:
            return self._step(job)
        except Exception as exc:
            self.fail(job, exc)  # abandoned, as in a worker thread; the caller sees why
            raise

    def step_job(self, job: Job) -> bool:
        """One step of this job (True when it is over), as :meth:`step` does for a key: a
        checker stepping jobs it listed earlier steps exactly those, even where one that ended
        meanwhile was followed by a new job under the same key."""
        try:
            return self._step(job)
        except Exception as exc:
            self.fail(job, exc)
            raise

    def run(self, key: int) -> None:
        while not self.step(key):
            pass

    def hand_over(self, q: Any) -> list[tuple[str, Callable[[], None]]]:
        """Threads mode over the queue ``q``, with worker loops the caller runs on threads of
        its own (a schedule explorer runs them one at a time): (thread name, loop) each."""
        self._q = q
        self.mode = "threads"
        return [(f"kvstate-{self.name}-{i}", self._work) for i in range(self.workers)]

    def pending(self) -> list[int]:
        return list(self.jobs)

    def _step(self, job: Job) -> bool:
        done = job.step()
        if done:
            with self._lock:
                if self.jobs.get(job.key) is job:
                    del self.jobs[job.key]
            job.over = True
        return done

    # ---- threads mode -------------------------------------------------------------------
    def start(self) -> None:
        if self.mode != "threads" or self._threads:
            return
        for i in range(self.workers):
            t = threading.Thread(target=self._work, name=f"kvstate-{self.name}-{i}", daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self) -> None:
        for _ in self._threads:
            self._q.put(None)
        for t in self._threads:
            t.join(timeout=5)
        self._threads.clear()

    def _work(self) -> None:
        while True:
            job = self._q.get()
            if job is None:
                return
            try:
                while not job.over and not self._step(job):
                    pass
            except Exception as exc:  # noqa: BLE001 - a worker must not die silently
                self.fail(job, exc)

    def fail(self, job: Job, exc: Exception) -> None:
        """A job raised: abandon it (its record back to a consistent phase) and drop it.  A
        refusal means its block moved on without it (cancelled, aborted): not an error."""
        if not isinstance(exc, Refused):
            detail = str(exc) if isinstance(exc, KVStateError) else traceback.format_exc()
            self.errors.append(f"{job!r}: {detail}")
        try:
            job.abandon(f"{type(exc).__name__}: {exc}")
        except Exception:  # noqa: BLE001 - recorded; the worker (or drain) goes on
            self.errors.append(f"{job!r} could not be abandoned:\n{traceback.format_exc()}")
        finally:
            self._drop(job)

    def _drop(self, job: Job) -> None:
        with self._lock:
            if self.jobs.get(job.key) is job:
                del self.jobs[job.key]
        job.over = True


class Pipelines:
    """The three executors; ``drain()`` runs every manual job to completion (jobs may enqueue
    follow-ups, e.g. a disk load is followed by an indexer rebuild)."""

    def __init__(self, mode: str, io_cap: int, on_idle: Callable[[], None] | None = None) -> None:
        self.mode = mode
        self.cpu = Executor("cpu", Pipe.CPU, mode, workers=1)
        self.io = Executor("io", Pipe.IO, mode, workers=max(1, io_cap))
        self.dma = Executor("dma", Pipe.DMA, mode, workers=1)
        self.all = (self.cpu, self.io, self.dma)
        self._on_idle = on_idle

    def for_pipe(self, pipe: Pipe) -> Executor:
        return {Pipe.CPU: self.cpu, Pipe.IO: self.io, Pipe.DMA: self.dma}[pipe]

    def start(self) -> None:
        for e in self.all:
            e.start()

    def stop(self) -> None:
        for e in self.all:
            e.stop()

    def busy(self) -> bool:
        return any(e.jobs for e in self.all)

    def drain(self, max_steps: int = 1_000_000) -> int:
        """Manual mode: step every job until none is left; returns the steps taken."""
        if self.mode != "manual":
            raise RuntimeError("drain() drives manual pipelines; threaded ones run by themselves")
        steps = 0
        while steps < max_steps:
            progressed = False
            for e in self.all:
                for key in list(e.jobs):
                    job = e.jobs.get(key)
                    if job is None:
                        continue
                    try:
                        e._step(job)
                    except Exception as exc:  # as in a worker thread: abandoned, recorded
                        e.fail(job, exc)
                    steps += 1
                    progressed = True
            if not progressed:
                break
        return steps

    def errors(self) -> list[str]:
        return [err for e in self.all for err in e.errors]
