"""A deterministic scheduler for the cache's threads: one runs at a time, switches at chosen points.

The threads are real ones (the façade's callers and the pipelines' own worker loop,
``Executor._work``), but each waits on its own semaphore until the scheduler hands it the turn,
so exactly one runs at any moment.  The turn moves only at a *switch point*: an acquire or a
release of the cache's lock (:class:`SchedLock`, reentrant like the ``RLock`` it replaces), a
wait or notify of its condition (:class:`SchedCondition`), a put or get of a pipeline's queue
(:class:`SchedQueue`).  A schedule is a list of *preemptions*, flattened as ``[gap, thread, gap, thread, ...]``: let
``gap`` more decisions go by, then hand the turn to the ``thread``-th of the other threads that can
run, in spawn order (modulo their number); every other decision lets the current thread go on (or, when it
blocks, the first that can run).  Bounding the preemptions rather than the switch points is
CHESS's preemption bounding: most concurrency bugs need one or two preemptions at the right
places, and Hypothesis draws the list, shrinks it toward fewer and earlier preemptions and
replays it exactly.  Time is logical: a timed wait times out only when no thread
can run any more, never because the machine was slow.

What the scheduler itself reports (``problems``): a *lost wake-up* (a waiter whose condition
holds once a critical section ends, yet nobody notified it), a *deadlock* (no thread can run
while a caller still waits, its wait having no timeout), and a thread's exception.  The cache
itself is never edited: the primitives are put in through its public ``lock`` / ``changed``
setters and the executors' queue attribute (:mod:`kvstate.targets.api.schedule`).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

_NONE = (-1, None)


class Task:
    """One scheduled thread: its body, its turn (a semaphore) and what it waits for."""

    def __init__(self, name: str, fn: Callable[[], None], primary: bool) -> None:
        self.name = name
        self.fn = fn
        self.primary = primary  # a caller (the run ends when every caller is done), or a worker
        self.turn = threading.Semaphore(0)
        self.done = False
        self.until: Callable[[], bool] | None = None  # blocked until this holds
        self.timed = False  # the wait may time out (logical time: when nothing else can run)
        self.timed_out = False

    def runnable(self) -> bool:
        return not self.done and (self.until is None or self.until())


class Hung(Exception):
    """The scheduled threads did not finish within the real-time guard."""


class Scheduler:
    def __init__(self, choices: Sequence[int], *, on_idle: Callable[[], list[str]] | None = None):
        self.choices = list(choices)
        self.pos = 0
        self.gap: int | None = None  # decisions left before the next preemption
        self.tasks: list[Task] = []
        self.local = threading.local()
        self.current: Task | None = None
        self.quiet = 0  # > 0: inside the harness's own callbacks, no switch
        self.stopping = False  # every caller is done: workers' gets return None
        self.problems: list[str] = []
        self.points = 0  # switch points met
        self.switches = 0  # turns handed to another thread
        self.waits = 0  # condition waits (a use waiting for its recovery)
        self.finished = threading.Event()
        self.on_idle = on_idle  # every caller done, nothing runnable: the harness's checks

    # -- threads ----------------------------------------------------------------------------
    def spawn(self, name: str, fn: Callable[[], None], primary: bool = True) -> Task:
        t = Task(name, fn, primary)
        self.tasks.append(t)
        return t

    def me(self) -> Task | None:
        return getattr(self.local, "task", None)

    def run(self, guard_s: float = 60.0) -> None:
        """Start every task, hand the first turn, wait until all are done."""
        for t in self.tasks:
            th = threading.Thread(target=self._body, args=(t,), name=t.name, daemon=True)
            th.start()
        first = self._pick(None)
        if first is None:
            return
        self.current = first
        first.turn.release()
        if not self.finished.wait(guard_s):
            raise Hung(f"scheduled threads not done after {guard_s} s (points {self.points})")

    def _body(self, t: Task) -> None:
        self.local.task = t
        t.turn.acquire()
        try:
            t.fn()
        except BaseException as exc:  # noqa: BLE001 - reported
            self.problems.append(f"thread {t.name}: {type(exc).__name__}: {exc}")
        t.done = True
        nxt = self._pick(t)
        if nxt is None:
            self.finished.set()
            return
        self.current = nxt
        nxt.turn.release()

    # -- switching --------------------------------------------------------------------------
    def _choice(self) -> int:
        """This decision's choice: 0 (no preemption) unless the schedule's next preemption
        falls here."""
        if self.pos + 1 >= len(self.choices):
            return 0
        if self.gap is None:
            self.gap = self.choices[self.pos]
        if self.gap > 0:
            self.gap -= 1
            return 0
        c = self.choices[self.pos + 1]
        self.pos += 2
        self.gap = None
        return c

    def _pick(self, me: Task | None) -> Task | None:
        """The next task to run (None: all done).  Decides timeouts and the end of a run."""
        while True:
            ready = [t for t in self.tasks if t.runnable()]
            if ready:
                c = self._choice()
                others = [t for t in ready if t is not me]
                if c and others:
                    return others[(c - 1) % len(others)]
                return me if me is not None and me in ready else ready[0]
            live = [t for t in self.tasks if not t.done]
            if not live:
                return None
            callers = [t for t in live if t.primary]
            timed = [t for t in callers if t.timed]
            if timed:  # nothing else can run: the first timed wait times out
                t = timed[0]
                t.timed_out = True
                t.until = None
                continue
            if callers and not self.stopping:
                self.problems.append(
                    "deadlock: no thread can run while "
                    + ", ".join(t.name for t in callers)
                    + " still wait"
                )
            elif not self.stopping and self.on_idle is not None:
                self.quiet += 1
                try:
                    self.problems.extend(self.on_idle())
                finally:
                    self.quiet -= 1
            if self.stopping and callers:
                return None  # deadlocked: give up (the threads are daemons)
            self.stopping = True  # the workers' gets return None: they end

    def point(self, kind: str = "") -> None:
        """A switch point of the current task (runnable: it may go on)."""
        me = self.me()
        if me is None or self.quiet:
            return
        self.points += 1
        self._switch(me)

    def block(self, until: Callable[[], bool], timed: bool = False) -> bool:
        """Wait until ``until()`` holds (another task makes it so); False: timed out."""
        me = self.me()
        assert me is not None, "a blocking primitive called outside the scheduled threads"
        me.until, me.timed, me.timed_out = until, timed, False
        while not me.runnable():
            self._switch(me)
            if me.timed_out:
                break
        me.until, me.timed = None, False
        return not me.timed_out

    def _switch(self, me: Task) -> None:
        nxt = self._pick(me)
        if nxt is None:
            if not me.runnable():  # deadlocked: park this thread for good (a daemon)
                self.finished.set()
                me.turn.acquire()
            return
        if nxt is me:
            return
        self.switches += 1
        self.current = nxt
        nxt.turn.release()
        me.turn.acquire()


class SchedLock:
    """The cache's lock, reentrant, with a switch point at every acquire and release.
    ``on_enter`` / ``on_exit`` run when a thread enters / leaves its outermost section (a
    condition wait included): the harness records the sections there."""

    def __init__(
        self,
        sched: Scheduler,
        on_enter: Callable[[], None] | None = None,
        on_exit: Callable[[], None] | None = None,
    ) -> None:
        self.s = sched
        self.owner: Task | None = None
        self.outside = 0  # depth held by an unscheduled thread (set-up and checks, alone)
        self.depth = 0
        self.on_enter = on_enter
        self.on_exit = on_exit
        self.conds: list[SchedCondition] = []

    def _hook(self, fn: Callable[[], None] | None) -> None:
        if fn is not None:
            self.s.quiet += 1
            try:
                fn()
            finally:
                self.s.quiet -= 1

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        me = self.s.me()
        if me is None:  # the harness before or after the scheduled run: nobody else runs
            self.outside += 1
            return True
        if self.owner is me:
            self.depth += 1
            self.s.point("acquire")
            return True
        self.s.point("acquire")
        if self.owner is not None:
            if not blocking:
                return False
            self.s.block(lambda: self.owner is None)
        self.owner, self.depth = me, 1
        self._hook(self.on_enter)
        return True

    def release(self) -> None:
        me = self.s.me()
        if me is None:
            if self.outside <= 0:
                raise RuntimeError("release unlocked lock")
            self.outside -= 1
            return
        if self.owner is not me:
            raise RuntimeError("cannot release un-acquired lock")
        if self.depth == 1:
            self._check_waiters()
            self._hook(self.on_exit)
            self.owner, self.depth = None, 0
        else:
            self.depth -= 1
        self.s.point("release")

    def _check_waiters(self) -> None:
        """A section ends: a waiter whose condition now holds must have been notified."""
        self.s.quiet += 1
        try:
            for c in self.conds:
                for w in c.waiters:
                    if not w.notified and w.ready is not None and w.ready():
                        me = self.s.me()
                        self.s.problems.append(
                            f"lost wake-up: {w.task.name} waits for a condition that holds "
                            f"after a section of {me.name if me else '?'}, and was not notified"
                        )
                        w.ready = None  # reported once
        finally:
            self.s.quiet -= 1

    def locked(self) -> bool:
        return self.owner is not None or self.outside > 0

    def _is_owned(self) -> bool:
        me = self.s.me()
        return self.outside > 0 if me is None else self.owner is me

    __enter__ = acquire

    def __exit__(self, *exc: object) -> None:
        self.release()


class _Waiter:
    def __init__(self, task: Task, ready: Callable[[], bool] | None) -> None:
        self.task = task
        self.ready = ready
        self.notified = False


class SchedCondition:
    """``threading.Condition`` over a :class:`SchedLock`, its waits and notifies switch points."""

    def __init__(self, lock: SchedLock) -> None:
        self.lock = lock
        self.s = lock.s
        self.waiters: deque[_Waiter] = deque()
        lock.conds.append(self)

    def __enter__(self) -> bool:
        return self.lock.acquire()

    def __exit__(self, *exc: object) -> None:
        self.lock.release()

    def wait(self, timeout: float | None = None, ready: Callable[[], bool] | None = None) -> bool:
        lk = self.lock
        me = self.s.me()
        if me is None or lk.owner is not me:
            raise RuntimeError("cannot wait on un-acquired lock")
        w = _Waiter(me, ready)
        self.s.waits += 1
        depth = lk.depth
        lk._check_waiters()
        self.waiters.append(w)
        lk._hook(lk.on_exit)
        lk.owner, lk.depth = None, 0
        self.s.block(lambda: w.notified, timed=timeout is not None)
        if w in self.waiters:
            self.waiters.remove(w)
        self.s.block(lambda: lk.owner is None)
        lk.owner, lk.depth = me, depth
        lk._hook(lk.on_enter)
        return w.notified

    def wait_for(self, predicate: Callable[[], bool], timeout: float | None = None) -> bool:
        result = predicate()
        while not result:
            if not self.wait(timeout, predicate) and timeout is not None:
                return bool(predicate())  # logical time: the timeout has passed
            result = predicate()
        return bool(result)

    def notify(self, n: int = 1) -> None:
        if not self.lock._is_owned():
            raise RuntimeError("cannot notify on un-acquired lock")
        for _ in range(min(n, len(self.waiters))):
            self.waiters.popleft().notified = True
        self.s.point("notify")

    def notify_all(self) -> None:
        self.notify(len(self.waiters))


class SchedQueue:
    """A pipeline's job queue: ``put`` and ``get`` are switch points; an empty ``get`` blocks
    until a put (or, once every caller is done, returns None: the worker's stop signal)."""

    def __init__(self, sched: Scheduler) -> None:
        self.s = sched
        self.items: deque[Any] = deque()

    def put(self, item: Any, block: bool = True, timeout: float | None = None) -> None:
        self.items.append(item)
        self.s.point("put")

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        self.s.point("get")
        if not self.items:
            if self.s.me() is None:
                return None
            self.s.block(lambda: bool(self.items) or self.s.stopping)
        return self.items.popleft() if self.items else None

    def empty(self) -> bool:
        return not self.items

    def qsize(self) -> int:
        return len(self.items)
