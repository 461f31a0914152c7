"""The API harness with threads: several engine threads, the real threaded pipelines.

``kvstate fuzz --target kvstate-api --threads`` (and :func:`run_threads`) runs request threads
(request / admit / use / read / append / finish or abort), a maintenance thread (tick, evict,
offload, spill, drop), a thread that aborts other threads' requests while they are inside
``use``, and the cache's own CPU / I/O / DMA workers, over a slow disk (every disk read stalls a
little, so uses wait for loads that are still landing).

Linearizability.  Every state change of the cache happens under its lock, so the lock itself
orders the history: the harness replaces the lock with a recording one that snapshots the
table's variables when a thread enters its outermost critical section and when it leaves it
(``Condition.wait`` included), labelled with the public call that thread is inside.  The check
then is the one a linearizability checker performs, with the linearization given by the lock:

* consecutive sections connect (the state a section starts from is the one the previous one
  left: nothing changes outside the lock);
* each section's change is explained on the model by the patterns of its thread's call
  (``spec/api.py``; a ``use`` that waited is two sections, ``SECTIONS``), and a worker's by its
  job steps (``drain``); a call that raised a documented error changed nothing;
* every section of a call lies between its invocation and its response (by construction).

We looked for a linearizability checker on the package index (a Python Wing-Gong / Knossos /
Porcupine equivalent) and found none maintained; since the lock yields the witness order, a
search over orders is not needed and this check is exact for the recorded history.

Bytes: every read of every request thread is compared byte for byte with the content of that
request's own tokens while its pins are held.  At the end the threads are joined, the pipelines
drained, the cache brought to quiescence through the API, and every pool must be free.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kvstate.model.apimap import Explainer, state_diff, with_ghosts
from kvstate.model.concrete import Machine
from kvstate.spec.table import Table

from .base import NAMESPACE
from .state import ApiHarness


class RecordingLock:
    """An ``RLock`` that reports each outermost critical section (enter, exit) to ``on``."""

    def __init__(self, on_enter: Any, on_exit: Any) -> None:
        self._lock = threading.RLock()
        self._local = threading.local()
        self._enter = on_enter
        self._exit = on_exit

    def _depth(self) -> int:
        return getattr(self._local, "d", 0)

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        ok = self._lock.acquire(blocking, timeout)
        if ok:
            self._local.d = self._depth() + 1
            if self._local.d == 1:
                self._enter()
        return ok

    def release(self) -> None:
        if self._depth() == 1:
            self._exit()
        self._local.d = self._depth() - 1
        self._lock.release()

    __enter__ = acquire

    def __exit__(self, *exc: object) -> None:
        self.release()

    # the Condition protocol (wait releases every level of the lock, then takes them back)
    def _is_owned(self) -> bool:
        return self._lock._is_owned()  # type: ignore[attr-defined]

    def _release_save(self) -> Any:
        self._exit()
        d = self._depth()
        self._local.d = 0
        return (self._lock._release_save(), d)  # type: ignore[attr-defined]

    def _acquire_restore(self, state: Any) -> None:
        inner, d = state
        self._lock._acquire_restore(inner)  # type: ignore[attr-defined]
        self._local.d = d
        self._enter()


@dataclass
class Section:
    thread: str
    call: str
    before: dict[str, Any]
    after: dict[str, Any] | None = None
    seq: int = 0


@dataclass
class ThreadResult:
    problems: list[str] = field(default_factory=list)
    counts: Counter[str] = field(default_factory=Counter)
    seconds: float = 0.0
    seed: int = 0


class _Recorder:
    def __init__(self, h: ApiHarness) -> None:
        self.h = h
        self.sections: list[Section] = []
        self.open: dict[int, Section] = {}
        self.local = threading.local()
        self.seq = 0

    def call(self) -> str:
        return getattr(self.local, "call", None) or (
            "drain" if threading.current_thread().name.startswith("kvstate-") else "read"
        )

    def enter(self) -> None:
        self.seq += 1
        s = Section(threading.current_thread().name, self.call(), self.h.observe(), seq=self.seq)
        self.open[threading.get_ident()] = s
        calls = getattr(self.local, "sections", None)
        if calls is not None:
            calls.append(s)

    def exit(self) -> None:
        s = self.open.pop(threading.get_ident(), None)
        if s is not None:
            s.after = self.h.observe()
            self.sections.append(s)


def run_threads(
    table: Table,
    N: int = 4,
    *,
    seed: int = 0,
    iterations: int = 12,
    users: int = 2,
    stall: float = 0.002,
    tamper: Any = None,
) -> ThreadResult:
    """One threaded run; the problems found (empty: the history conforms)."""
    from kvstate.impl.errors import KVStateError
    from kvstate.testing.datacheck import verify_run

    res = ThreadResult(seed=seed)
    started = time.monotonic()
    h = ApiHarness(table, N, threads=True)
    rec = _Recorder(h)
    core = h.view
    lock = RecordingLock(rec.enter, rec.exit)
    h.hooks.set_lock(lock, threading.Condition(lock))  # type: ignore[arg-type]
    real_read: Any = None

    def slow_read(*a: Any, **kw: Any) -> Any:  # the world: a slow disk
        time.sleep(stall)
        res.counts["fault stall"] += 1
        return real_read(*a, **kw)

    real_read = h.hooks.replace_disk_read(slow_read)
    L = table.consts.L
    problems = res.problems
    plock = threading.Lock()
    live: dict[int, Any] = {}

    def api(name: str, fn: Any, *a: Any, **kw: Any) -> Any:
        rec.local.call, rec.local.sections = name, []
        try:
            out = fn(*a, **kw)
            res.counts[f"call {name}"] += 1
            return out
        except KVStateError as exc:
            changed = [s for s in rec.local.sections if s.after is not None and s.after != s.before]
            if changed:
                with plock:
                    problems.append(
                        f"{name} raised {type(exc).__name__}: {exc}, yet changed state: "
                        + "; ".join(state_diff(changed[0].before, changed[0].after or {}, table))
                    )
            res.counts[f"refused {name}:{type(exc).__name__}"] += 1
            raise
        finally:
            rec.local.call, rec.local.sections = None, None

    def user(k: int) -> None:
        rng = random.Random(seed * 100 + k)
        for _ in range(iterations):
            n = rng.choice([L + 1, 2 * L + 1, N * L + 1])
            want = np.array(h.tokens[:n], dtype=np.int64)
            try:
                life = rng.randint(1, 2)
                req = api(
                    "request", h.cache.request, want.copy(), namespace=NAMESPACE, lifetime=life
                )
                api("admit", h.cache.admit, req)
                ctx = api("use", h.cache.use, req, timeout=5.0)
                rec.local.call = "use"
                run = ctx.__enter__()
                rec.local.call = None
                live[k] = req
                for _ in range(2):
                    if req.slot is None:  # aborted by the other thread: the pins are gone
                        try:
                            run.read_compressed("csa", 0)
                        except KVStateError:
                            res.counts["reads refused after abort"] += 1
                        else:
                            with plock:
                                problems.append(
                                    f"user {k}: a Run read after another thread aborted its "
                                    "request (its pins are gone) instead of a documented error"
                                )
                        break
                    problems_now = verify_run(run, want)
                    res.counts["reads checked"] += 1
                    if problems_now and req.slot is not None:
                        with plock:
                            problems.append(
                                f"user {k}: wrong bytes while pinned: {problems_now[0]}"
                            )
                live.pop(k, None)
                if req.slot is not None:
                    if rng.random() < 0.8:
                        api("finish", h.cache.finish, req)
                    else:
                        api("abort", h.cache.abort, req)
            except KVStateError:
                res.counts["user refusals"] += 1
            except Exception as exc:  # noqa: BLE001 - reported
                with plock:
                    problems.append(f"user {k}: {type(exc).__name__}: {exc}")

    def maint() -> None:
        rng = random.Random(seed * 100 + 99)
        for _ in range(iterations * 3):
            if tamper is not None and _ == iterations:
                tamper(h)  # a test's deliberate change behind the lock's back
            name = rng.choice(
                ["tick", "tick", "evict", "offload", "offload", "spill", "spill", "drop"]
            )
            try:
                api(name, getattr(h.cache, name), rng.randint(1, N))
            except KVStateError:
                pass
            except Exception as exc:  # noqa: BLE001 - reported
                with plock:
                    problems.append(f"maintenance {name}: {type(exc).__name__}: {exc}")
            time.sleep(0.001)

    def aborter() -> None:
        rng = random.Random(seed * 100 + 77)
        for _ in range(iterations):
            time.sleep(0.003)
            for req in list(live.values()):
                if rng.random() < 0.3 and req.slot is not None:
                    try:
                        api("abort", h.cache.abort, req)
                        res.counts["fault abort_in_use"] += 1
                    except KVStateError:
                        pass

    threads = [threading.Thread(target=user, args=(k,), name=f"user-{k}") for k in range(users)]
    threads += [
        threading.Thread(target=maint, name="maint"),
        threading.Thread(target=aborter, name="aborter"),
    ]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        deadline = time.monotonic() + 30
        while core.busy() and time.monotonic() < deadline:
            time.sleep(0.01)
        if core.busy():
            problems.append(f"pipelines still busy 30 s after the threads ended: {core.pending()}")
        errs = core.pipeline_errors()
        if errs:
            res.counts["pipeline errors (documented)"] += len(errs)
        # quiescence through the API: every lease runs out, everything is evicted and dropped
        for name, arg in (
            ("tick", table.consts.lease_max),
            ("evict", 4 * N + 8),
            ("drop", 4 * N + 8),
        ):
            api(name, getattr(h.cache, name), arg)
        t = core.tiers
        if t.slots.free != t.slots.n or t.host_slots.free != t.host_slots.n or core.pinned_blocks:
            problems.append(
                f"leak at quiescence: device {t.slots.n - t.slots.free}, host "
                f"{t.host_slots.n - t.host_slots.free}, pinned {core.pinned_blocks}"
            )
        problems.extend(h.accounting())
        explain_sections(h, rec.sections, problems, res.counts)
    finally:
        h.close()
    res.seconds = time.monotonic() - started
    return res


def explain_sections(
    h: ApiHarness, sections: list[Section], problems: list[str], counts: Counter[str]
) -> None:
    """The linearization the lock gives: consecutive sections connect (nothing changes outside
    the lock), and each section's change is explained by its thread's call on the model."""
    table = h.table
    m = Machine(table, h.N)
    ex = Explainer(m)
    prev: dict[str, Any] | None = None
    for s in sorted(sections, key=lambda x: x.seq):
        if prev is not None and s.before != prev:
            problems.append(
                f"state changed outside the lock before section {s.seq} ({s.thread}, {s.call}): "
                + "; ".join(state_diff(prev, s.before, table))
            )
        prev = s.after
        if s.after == s.before:
            continue
        counts["sections checked"] += 1
        call = f"{s.call}/section" if f"{s.call}/section" in ex.nfas else s.call
        got = ex.explain(
            call, with_ghosts(m, s.before), s.after or {}, ignore=_unkept(h, s.after or {})
        )
        if got.steps is None:
            problems.append(
                f"section {s.seq} ({s.thread} in {s.call}) is not explained by {call!r}: "
                + "; ".join(state_diff(s.before, s.after or {}, table))
            )
            break
        for name, _ in got.steps:
            counts[f"action {name}"] += 1


def _unkept(h: ApiHarness, after: dict[str, Any]) -> list[tuple[str, Any]]:
    """``state_data_ptrs`` cells past each request's own chain (padding)."""
    return [(v, (r, b)) for r in range(h.R) for b in range(h.N) for v in ("pgen", "paddr")]
