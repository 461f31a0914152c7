"""The threaded mode on the cache's own worker threads: started, waited for, failing, stopped.

The schedule exploration (:mod:`kvstate.targets.api.schedule`) runs the executors' worker loops
on threads the scheduler owns (``TestHooks.hand_over_workers``), so the threads the cache starts
itself (``Executor.start``), a ``use`` that really waits on the lock's condition for them (its
``timeout`` included) and their shutdown at ``close`` (``Executor.stop``) are not in it.  One
run here covers them, made deterministic by holding the disk reads at a gate the run opens:

* a ``use`` whose admission waits for a disk load that cannot finish (its read is held) must
  refuse with the documented ``NotReady`` once its ``timeout`` is spent, changing nothing;
  once the read is let go, a ``use`` waits for the load and serves its hit;
* a job that raises inside a worker thread (a disk load's step, an error no file system
  raises) must be abandoned as a failed load (its slot and pages given back), recorded in the
  pipelines' errors (a worker must not die silently), and the admission waiting for it
  truncates: ``use`` returns, the request's own bytes over what it serves;
* between the calls the workers run: every critical section (the callers' and the workers')
  is explained on the model in the order the lock gives (:func:`threads.explain_sections`),
  every read is byte-checked while pinned, and at quiescence every pool is free and the
  harness's accounting holds; ``close`` stops the workers (none left alive).
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kvstate.spec.table import Table

from .base import NAMESPACE
from .state import ApiHarness
from .threads import RecordingLock, _Recorder, explain_sections

HOLD = 10.0  # seconds a held read waits for the gate before the run reports it stuck
TIMEOUT = 0.05  # the timed-out use's timeout


class WorkerFault(RuntimeError):
    """The error the run makes a job raise inside a worker thread."""


@dataclass
class WorkersResult:
    problems: list[str] = field(default_factory=list)
    counts: Counter[str] = field(default_factory=Counter)
    seconds: float = 0.0

    def lines(self) -> list[str]:
        if self.problems:
            return [
                "kvstate fuzz: FAILED (threads, the cache's own worker threads)",
                *(f"  {p}" for p in self.problems[:5]),
                "  replay:    python -m kvstate.targets.api.workers",
            ]
        c = self.counts
        return [
            f"  worker threads: {c['sections checked']} critical sections explained in lock "
            f"order in {self.seconds:.1f} s, {c['use timed out']} use timed out on a held load, "
            f"{c['job raised in a worker']} job raised in a worker and abandoned, "
            f"{c['reads checked']} reads byte-checked, workers stopped at close"
        ]


def _settle(h: ApiHarness, problems: list[str], where: str) -> None:
    """Wait (the workers run) until no job is left."""
    deadline = time.monotonic() + HOLD
    while h.view.busy() and time.monotonic() < deadline:
        time.sleep(0.002)
    if h.view.busy():
        problems.append(f"{where}: jobs still pending after {HOLD} s: {h.view.pending()}")


def run_workers(table: Table, N: int = 4) -> WorkersResult:
    """One run (see the module doc); the problems found (empty: it conforms)."""
    from kvstate.impl.errors import KVStateError, NotReady
    from kvstate.testing.datacheck import verify_run

    res = WorkersResult()
    problems, counts = res.problems, res.counts
    started = time.monotonic()
    h = ApiHarness(table, N, threads=True)
    cache, L = h.cache, h.L
    rec = _Recorder(h)
    lock = RecordingLock(rec.enter, rec.exit)
    h.hooks.set_lock(lock, threading.Condition(lock))  # type: ignore[arg-type]
    gate, entered = threading.Event(), threading.Event()
    gate.set()
    real: Any = None

    def held(*a: Any, **kw: Any) -> Any:  # the world: a disk read that waits at the gate
        entered.set()
        if not gate.wait(HOLD):
            problems.append(f"a disk read held for {HOLD} s: the run's gate was never opened")
        return real(*a, **kw)

    real = h.hooks.replace_disk_read(held)

    def api(name: str, *a: Any, **kw: Any) -> Any:
        rec.local.call, rec.local.sections = name, []
        try:
            out = getattr(cache, name)(*a, **kw)
            counts[f"call {name}"] += 1
            return out
        except KVStateError as exc:
            changed = [s for s in rec.local.sections if s.after is not None and s.after != s.before]
            if changed:
                problems.append(f"{name} raised {type(exc).__name__}: {exc}, yet changed state")
            raise
        finally:
            rec.local.call, rec.local.sections = None, None

    n = N * L + 1
    want = np.array(h.tokens[:n], dtype=np.int64)

    def whole(end: str = "finish", timeout: float = HOLD) -> None:
        """request, admit, use (waiting), the bytes read while pinned, ``end``."""
        req = api("request", want.copy(), namespace=NAMESPACE, lifetime=2)
        api("admit", req)
        serve(req, timeout)
        api(end, req)

    def serve(req: Any, timeout: float) -> None:
        ctx = api("use", req, timeout=timeout)
        rec.local.call = "use"
        run = ctx.__enter__()
        rec.local.call = None
        bad = verify_run(run, want)
        counts["reads checked"] += 1
        if bad:
            problems.append(f"wrong bytes while pinned: {bad[0]}")

    def away() -> None:
        """The chain's blocks moved off the device: leases run out, offloads (the DMA worker),
        then the host copies spilled to disk."""
        api("tick", h.table.consts.lease_max)
        api("offload", N)
        _settle(h, problems, "offload")
        api("spill", N)
        api("offload", N)
        _settle(h, problems, "offload")

    def disk_load_held(what: str) -> tuple[Any, Any] | None:
        """A request admitted while every disk read is held: (request, the disk load's job),
        or None (the admission started no disk load: nothing to check)."""
        gate.clear()
        entered.clear()
        req = api("request", want.copy(), namespace=NAMESPACE, lifetime=2)
        api("admit", req)
        loads = h.view.pending()["io"]
        if not loads:
            counts[f"{what}: no disk load"] += 1
            gate.set()
            return None
        return req, h.view.job("io", loads[0])

    try:
        whole()
        away()
        # a use whose disk load cannot finish: NotReady at its timeout, then served
        got = disk_load_held("timeout")
        if got is not None:
            req, _job = got
            try:
                api("use", req, timeout=TIMEOUT)
            except NotReady:
                counts["use timed out"] += 1
            else:
                problems.append(
                    f"use(timeout={TIMEOUT}) returned while the disk load its admission waits "
                    "for was held (a documented NotReady at the timeout)"
                )
            gate.set()
            serve(req, HOLD)
            api("finish", req)
        away()
        # a job that raises inside a worker thread: abandoned, recorded, the use truncated
        got = disk_load_held("worker fault")
        if got is not None:
            req, job = got
            rid = job.rid

            def broken() -> bool:
                raise WorkerFault(f"injected failure in the load job of record {rid}")

            job.step = broken  # its next step (the worker is held in the read, or not yet in it)
            gate.set()
            serve(req, HOLD)
            api("finish", req)
            _settle(h, problems, "after the failing job")
            errs = h.view.pipeline_errors()
            if job.over and any("injected failure" in e for e in errs):
                counts["job raised in a worker"] += 1
            elif job.over:
                problems.append(
                    "a load job raised in a worker thread, yet the pipelines recorded no error "
                    f"(a worker must not fail silently): {errs}"
                )
            else:
                counts["worker fault: the job ended first"] += 1
        whole("abort")
        # quiescence through the API: every lease runs out, everything evicted and dropped
        api("tick", h.table.consts.lease_max)
        _settle(h, problems, "quiescence")
        api("evict", 4 * N + 8)
        api("drop", 4 * N + 8)
        t = h.view.tiers
        if t.slots.free != t.slots.n or t.host_slots.free != t.host_slots.n or h.view.pinned_blocks:
            problems.append(
                f"leak at quiescence: device {t.slots.n - t.slots.free}, host "
                f"{t.host_slots.n - t.host_slots.free}, pinned {h.view.pinned_blocks}"
            )
        # a worker's last step may still be unlinking a loaded file after the lock, its job
        # already gone from the pipelines: quiescence is the accounting once that is done
        deadline = time.monotonic() + HOLD
        while (bad := h.accounting()) and time.monotonic() < deadline:
            time.sleep(0.005)
        problems.extend(bad)
        if not problems:
            explain_sections(h, rec.sections, problems, counts)
    except KVStateError as exc:
        problems.append(f"an undocumented refusal on the worker run: {type(exc).__name__}: {exc}")
    finally:
        gate.set()
        workers = [t for t in threading.enumerate() if t.name.startswith("kvstate-")]
        h.close()
        alive = [t.name for t in workers if t.is_alive()]
        if alive:
            problems.append(f"worker threads still alive after close: {alive}")
    res.seconds = time.monotonic() - started
    return res


def main() -> int:
    from kvstate.spec import default_table

    r = run_workers(default_table())
    print("\n".join(r.lines()) if r.problems else "kvstate fuzz: ok\n" + r.lines()[0])
    print(dict(r.counts))
    return 1 if r.problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
