"""The threaded mode's schedule exploration (kvstate/targets/api/schedule.py, kvstate/targets/api/sched.py):
the unplanted library passes, a planted lock omission, a planted lost wake-up and a planted
atomicity violation (a check and its act in two sections) are caught,
a schedule replays exactly, and the scheduler itself finds a lock-order deadlock."""

from __future__ import annotations

import time
from typing import Any

import pytest

from kvstate.spec import default_table
from kvstate.targets.api import ApiHarness
from kvstate.targets.api.sched import SchedCondition, SchedLock, Scheduler
from kvstate.targets.api.schedule import explore, run_schedule

TABLE = default_table()


def test_unplanted_library_passes_its_schedules() -> None:
    x = explore(TABLE, 4, schedules=6, shrink=False)
    assert x.failing is None, x.problems
    c = x.counts
    # the schedules did something: sections explained, bytes read, waits and switches
    assert x.schedules >= 6
    assert c["sections checked"] > 0 and c["reads checked"] > 0
    assert c["switches"] > 0 and c["waits"] > 0


def _unlocked_finish(h: ApiHarness, calls: dict[str, Any]) -> None:
    """Planted: the façade's ``finish`` runs its body without the cache lock."""
    hooks = h.hooks
    calls["finish"] = lambda req, store=True: hooks.finish_unlocked(req, store)


class _DroppingCondition(SchedCondition):
    """Planted: a notify from a pipeline worker (a load or offload completing) is dropped."""

    def notify(self, n: int = 1) -> None:
        me = self.s.me()
        if me is not None and me.name.startswith("kvstate-"):
            if not self.lock._is_owned():
                raise RuntimeError("cannot notify on un-acquired lock")
            return
        super().notify(n)


def _lost_wakeup(h: ApiHarness, calls: dict[str, Any]) -> None:
    h.hooks.set_lock(h.view.lock, _DroppingCondition(h.view.lock))


def _split_abort(h: ApiHarness, calls: dict[str, Any]) -> None:
    """Planted: ``abort`` reads the request's slot in one section and aborts it in another (the
    façade does both in one): the slot may be another request's by then."""
    from kvstate.impl.errors import AlreadyReleased

    cache, core = h.cache, h.view

    def abort(req: Any) -> None:
        with core.lock:
            s = req.slot
        with core.lock:
            if s is None:
                raise AlreadyReleased("abort", ("active",), f"{req!r} was already released")
            cache.req_table.abort(s)
            req.admission = None

    calls["abort"] = abort


@pytest.mark.parametrize(
    ("plant", "expect"),
    [
        # its changes land outside every section, or its notify finds the lock not held
        (_unlocked_finish, ("outside the lock", "un-acquired lock")),
        (_lost_wakeup, ("lost wake-up",)),
        (_split_abort, ("lost its slot",)),
    ],
    ids=["lock_omission", "lost_wakeup", "atomicity_violation"],
)
def test_planted_concurrency_bug_is_caught(plant: Any, expect: tuple[str, ...]) -> None:
    t0 = time.monotonic()
    x = explore(TABLE, 4, schedules=40, plant=plant, shrink=False)
    took = time.monotonic() - t0
    assert x.failing is not None, f"planted bug not caught in {x.schedules} schedules"
    assert any(e in p for p in x.problems for e in expect), x.problems
    print(f"caught after {x.to_first:.1f} s ({x.schedules} schedules, {took:.1f} s in all)")
    # the failing schedule replays: the same problem from the same choices
    choices, scen = x.failing
    again = run_schedule(TABLE, 4, choices, seed=scen, plant=plant)
    assert any(e in p for p in again.problems for e in expect), again.problems


def test_the_atomicity_violation_needs_a_preemption() -> None:
    """The split abort passes the schedule without preemptions: only exploring finds it."""
    assert not run_schedule(TABLE, 4, [], seed=0, plant=_split_abort).problems


def test_a_schedule_replays_exactly() -> None:
    choices = [3, 1, 0, 2, 5, 4, 1, 1, 2, 0, 3] * 6
    a = run_schedule(TABLE, 4, choices, seed=3)
    b = run_schedule(TABLE, 4, choices, seed=3)
    assert not a.problems and not b.problems, a.problems + b.problems
    assert (a.points, a.switches, a.counts) == (b.points, b.switches, b.counts)
    other = run_schedule(TABLE, 4, [], seed=3)
    assert (other.points, other.switches) != (a.points, a.switches)


def test_scheduler_finds_a_lock_order_deadlock_and_not_without_a_switch() -> None:
    def run(choices: list[int]) -> list[str]:
        s = Scheduler(choices)
        a, b = SchedLock(s), SchedLock(s)

        def one(x: SchedLock, y: SchedLock) -> None:
            with x:
                with y:
                    pass

        s.spawn("t1", lambda: one(a, b))
        s.spawn("t2", lambda: one(b, a))
        s.run(guard_s=10)
        return s.problems

    assert run([]) == []  # t1 runs to its end first: no deadlock
    every = [[i, j, k] for i in range(3) for j in range(3) for k in range(3)]
    found = [c for c in every if run(c)]
    assert found and all("deadlock" in run(c)[0] for c in found)
