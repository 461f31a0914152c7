"""Schedule exploration of the cache's concurrent paths: the threaded mode under a deterministic
scheduler, each schedule drawn by Hypothesis (so a failing one shrinks and replays).

One schedule: a fresh cache whose prefix already lies on every tier (device, host, disk), two
request threads (request, admit, ``use`` waiting for its recovery, reads byte-checked while
pinned, finish or abort), a maintenance thread (``tick``, ``offload``, ``spill``, ``evict``,
``drop``, ``stats``), a thread aborting the others' requests, and the pipelines' own worker
loops (``Executor._work``: CPU, I/O, DMA) completing loads and offloads.  The scheduler
(:mod:`kvstate.targets.api.sched`) runs them one at a time and switches only at the cache lock's acquire
and release, its condition's wait and notify, and the job queues' put and get, following the
drawn list of choices.  After each schedule the checks are the threaded mode's
(:mod:`kvstate.targets.api.threads`): the lock's sections connect and each is explained on the model
by its thread's call (the lock gives the linearization), a call that raised a documented error
changed nothing, every read returns the request's own bytes while its pins hold, and at
quiescence (every lease run out, everything evicted and dropped through the API) every pool is
free and the harness's accounting holds; plus the scheduler's own: no lost wake-up (a waiter
whose condition holds when a section ends was notified), no deadlock, no job left queued with
every worker idle.

``kvstate fuzz --target kvstate-api --profile ci`` runs :data:`CI_SCHEDULES` of them after the
lockstep run (derandomized: the same schedules every run); ``python -m kvstate.targets.api.schedule``
runs them alone (``--schedules``, ``--seed``, ``--replay CHOICES``).
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kvstate.spec.table import Table

from .base import NAMESPACE
from .sched import Hung, SchedCondition, SchedLock, SchedQueue, Scheduler
from .state import ApiHarness
from .threads import _Recorder, explain_sections

CI_SCHEDULES = 40  # ``--profile ci``: about 10 s of the API target's run (see docs)
PROFILE_SCHEDULES = {"ci": CI_SCHEDULES, "dev": 400, "nightly": 4000}
MAX_PREEMPTIONS = 12  # a schedule's preemptions; past them each thread runs until it blocks
MAX_GAP = 30  # decisions between two preemptions (a schedule has ~50-250 decisions)

# a test's planted bug: called with the harness and the facade's call table once the scheduler
# is in place (it may replace a call, the lock or the condition)
Plant = Callable[[ApiHarness, dict[str, Any]], None]


@dataclass
class ScheduleResult:
    problems: list[str] = field(default_factory=list)
    counts: Counter[str] = field(default_factory=Counter)
    points: int = 0
    switches: int = 0
    waits: int = 0


def _prepare(h: ApiHarness) -> None:
    """Before the threads: the harness's prefix stored, then part of it moved to host and disk,
    so the threads' admissions recover (host loads on the DMA pipeline, disk loads on I/O)."""
    cache, k = h.cache, h.table.consts
    n = h.N * h.L + 1
    req = cache.request(np.array(h.tokens[:n], dtype=np.int64), namespace=NAMESPACE, lifetime=1)
    cache.admit(req)
    with cache.use(req):
        pass
    cache.tick(k.lease_max)
    cache.offload(2)
    h.hooks.drain()
    cache.spill(1)


def run_schedule(
    table: Table,
    N: int,
    choices: Sequence[int],
    *,
    seed: int = 0,
    plant: Plant | None = None,
) -> ScheduleResult:
    """One schedule (``choices``) of one scenario (``seed``); the problems found."""
    from kvstate.impl.errors import KVStateError
    from kvstate.testing.datacheck import verify_run

    res = ScheduleResult()
    h = ApiHarness(table, N, cache_kwargs={"executors": "manual"})
    try:
        _prepare(h)
        cache = h.cache
        rec = _Recorder(h)
        sched = Scheduler(choices, on_idle=lambda: _idle_problems(h))
        lock = SchedLock(sched, rec.enter, rec.exit)
        h.hooks.set_lock(lock, SchedCondition(lock))
        # the real worker loops, over scheduled queues
        workers = h.hooks.hand_over_workers(lambda: SchedQueue(sched))
        calls: dict[str, Any] = {
            name: getattr(cache, name)
            for name in (
                "request",
                "admit",
                "use",
                "finish",
                "abort",
                "tick",
                "offload",
                "spill",
                "evict",
                "drop",
                "stats",
            )
        }
        if plant is not None:
            plant(h, calls)
        _scenario(h, sched, rec, calls, seed, res, verify_run, KVStateError)
        # after the callers: a blocked caller hands the turn to the aborter first, then the
        # others, then the workers
        for name, loop in workers:
            sched.spawn(name, loop, primary=False)
        try:
            sched.run()
        except Hung as exc:
            res.problems.append(str(exc))
            return res
        finally:
            res.points, res.switches, res.waits = sched.points, sched.switches, sched.waits
            res.problems.extend(sched.problems)
        errs = h.view.pipeline_errors()
        if errs:
            res.problems.append(f"a pipeline job raised: {errs[0][-400:]}")
        if res.problems:
            return res
        _quiesce(h, res)
        explain_sections(h, rec.sections, res.problems, res.counts)
    finally:
        h.close()
    return res


def _idle_problems(h: ApiHarness) -> list[str]:
    """Every caller done and every worker waiting on an empty queue: no job may be left."""
    busy = {name: sorted(keys) for name, keys in h.view.pending().items() if keys}
    if busy:
        return [f"jobs left with every worker idle (a lost submit or wake-up): {busy}"]
    return []


def _quiesce(h: ApiHarness, res: ScheduleResult) -> None:
    """Through the API: every lease runs out, everything is evicted and dropped; pools free."""
    cache, core, N = h.cache, h.view, h.N
    h.hooks.set_pipeline_mode("manual")
    cache.tick(h.table.consts.lease_max)
    cache.evict(4 * N + 8)
    cache.drop(4 * N + 8)
    t = core.tiers
    if t.slots.free != t.slots.n or t.host_slots.free != t.host_slots.n or core.pinned_blocks:
        res.problems.append(
            f"leak at quiescence: device {t.slots.n - t.slots.free}, host "
            f"{t.host_slots.n - t.host_slots.free}, pinned {core.pinned_blocks}"
        )
    res.problems.extend(h.accounting())


def _scenario(
    h: ApiHarness,
    sched: Scheduler,
    rec: _Recorder,
    calls: dict[str, Any],
    seed: int,
    res: ScheduleResult,
    verify_run: Any,
    KVStateError: type[Exception],
) -> None:
    """The callers' threads, their choices read off ``seed`` (the schedule is the scheduler's)."""
    N, L = h.N, h.L
    problems = res.problems
    live: dict[int, Any] = {}
    targeted: set[int] = set()  # requests some thread called abort on

    def still_own(k: int, req: Any, where: str) -> None:
        """A request loses its slot only by a call on it: one released behind its back (another
        request's abort landing on its slot) has no sequential explanation."""
        if req.slot is None and id(req) not in targeted:
            problems.append(f"user {k}: its request lost its slot {where}, yet no call released it")

    def api(name: str, *a: Any, **kw: Any) -> Any:
        rec.local.call, rec.local.sections = name, []
        try:
            out = calls[name](*a, **kw)
            res.counts[f"call {name}"] += 1
            return out
        except KVStateError as exc:
            changed = [s for s in rec.local.sections if s.after is not None and s.after != s.before]
            if changed:
                problems.append(f"{name} raised {type(exc).__name__}: {exc}, yet changed state")
            res.counts[f"refused {name}"] += 1
            raise
        finally:
            rec.local.call, rec.local.sections = None, None

    def user(k: int) -> None:
        rng = random.Random(seed * 100 + k)
        for _ in range(2):
            n = rng.choice([L + 1, 2 * L + 1, N * L + 1])
            want = np.array(h.tokens[:n], dtype=np.int64)
            req, admitted, ended = None, False, False
            try:
                req = api("request", want.copy(), namespace=NAMESPACE, lifetime=rng.randint(1, 2))
                api("admit", req)
                admitted = True
                live[k] = req  # the aborter may abort it from here on (inside use included)
                ctx = api("use", req, timeout=5.0)
                rec.local.call = "use"
                run = ctx.__enter__()
                rec.local.call = None
                still_own(k, req, "after use")
                if req.slot is not None:
                    bad = verify_run(run, want)
                    res.counts["reads checked"] += 1
                    if bad and req.slot is not None:
                        problems.append(f"user {k}: wrong bytes while pinned: {bad[0]}")
                live.pop(k, None)
                still_own(k, req, "after its reads")
                if req.slot is not None:
                    end = "finish" if rng.random() < 0.8 else "abort"
                    if end == "abort":
                        targeted.add(id(req))
                    ended = True
                    api(end, req)
            except KVStateError:
                res.counts["user refusals"] += 1
                if admitted and not ended:
                    still_own(k, req, "when a call on it was refused")
            finally:
                live.pop(k, None)

    def maint() -> None:
        rng = random.Random(seed * 100 + 99)
        for _ in range(4):
            name = rng.choice(["tick", "offload", "spill", "evict", "drop", "stats"])
            try:
                api(name) if name == "stats" else api(name, rng.randint(1, N))
            except KVStateError:
                pass

    done: set[int] = set()

    def aborter() -> None:
        """Waits (a scheduled wait, no switch point of the cache) until a request is in use,
        then aborts it or lets it be; three times, or until the users are done."""
        rng = random.Random(seed * 100 + 77)
        for _ in range(3):
            sched.block(lambda: bool(live) or len(done) == 2)
            if not live:
                return
            req = list(live.values())[rng.randrange(len(live))]
            if rng.random() < 0.6 and req.slot is not None:
                targeted.add(id(req))
                try:
                    api("abort", req)
                    res.counts["abort from another thread"] += 1
                except KVStateError:
                    pass
            else:
                calls["stats"]()
            sched.point("aborter")

    def user_thread(k: int) -> None:
        try:
            user(k)
        finally:
            done.add(k)

    sched.spawn("aborter", aborter)
    sched.spawn("user-0", lambda: user_thread(0))
    sched.spawn("user-1", lambda: user_thread(1))
    sched.spawn("maint", maint)


# ---- exploration --------------------------------------------------------------------------
@dataclass
class Exploration:
    schedules: int = 0
    seconds: float = 0.0
    to_first: float | None = None  # seconds to the first failing schedule
    failing: tuple[list[int], int] | None = None  # the shrunk (choices, scenario)
    problems: list[str] = field(default_factory=list)
    counts: Counter[str] = field(default_factory=Counter)


class _Failed(Exception):
    pass


def _flat(pairs: list[tuple[int, int]]) -> list[int]:
    return [x for p in pairs for x in p]


def explore(
    table: Table,
    N: int = 4,
    *,
    schedules: int = CI_SCHEDULES,
    seed: int | None = None,
    plant: Plant | None = None,
    shrink: bool = True,
) -> Exploration:
    """``schedules`` schedules drawn by Hypothesis (derandomized without ``seed``); a failing
    one is shrunk (fewer switches, a smaller scenario) and kept with its problems."""
    from hypothesis import HealthCheck, Phase, example, given, settings
    from hypothesis import seed as hseed
    from hypothesis import strategies as st

    out = Exploration()
    t0 = time.monotonic()

    phases = [Phase.explicit, Phase.generate] + ([Phase.shrink] if shrink else [])

    pairs = st.tuples(st.integers(0, MAX_GAP), st.integers(1, 9))

    @settings(
        max_examples=schedules,
        deadline=None,
        database=None,
        derandomize=seed is None,
        phases=phases,
        suppress_health_check=list(HealthCheck),
        print_blob=False,
        report_multiple_bugs=False,
    )
    @given(st.lists(pairs, max_size=MAX_PREEMPTIONS).map(_flat), st.integers(0, 15))
    @example([], 0)  # no preemption: each thread runs until it blocks or ends
    @example([0, 1] * MAX_PREEMPTIONS, 0)  # the first thread whenever it can run
    @example([1, 2] * MAX_PREEMPTIONS, 1)
    def prop(choices: list[int], scen: int) -> None:
        r = run_schedule(table, N, choices, seed=scen, plant=plant)
        out.schedules += 1
        out.counts.update(r.counts)
        out.counts["switch points"] += r.points
        out.counts["switches"] += r.switches
        out.counts["waits"] += r.waits
        if r.problems:
            if out.to_first is None:
                out.to_first = time.monotonic() - t0
            out.failing = (list(choices), scen)
            out.problems = r.problems
            raise _Failed("; ".join(r.problems))

    test = prop if seed is None else hseed(seed)(prop)
    from kvstate.harness.profiles import seed_only

    try:
        with seed_only():
            test()
    except _Failed:
        pass
    out.seconds = time.monotonic() - t0
    return out


def summary(x: Exploration) -> list[str]:
    c = x.counts
    if x.failing is not None:
        choices, scen = x.failing
        return [
            f"kvstate fuzz: FAILED (threads, schedule exploration, first failing schedule after "
            f"{x.to_first:.1f} s)",
            *(f"  {p}" for p in x.problems[:5]),
            f"  schedule:  scenario {scen}, choices {','.join(map(str, choices)) or '(none)'}",
            "  replay:    python -m kvstate.targets.api.schedule --scenario "
            f"{scen} --replay '{','.join(map(str, choices))}'",
        ]
    return [
        f"  threads: {x.schedules} schedules explored in {x.seconds:.1f} s ({c['switches']} "
        f"switches at {c['switch points']} switch points), {c['sections checked']} critical "
        f"sections explained in lock order, {c['reads checked']} reads byte-checked, "
        f"{c['abort from another thread']} aborts from another thread, no lost wake-up, "
        "no deadlock, nothing leaked"
    ]


def run_profile(table: Table, N: int, profile: str, seed: int | None) -> tuple[bool, list[str]]:
    """``kvstate fuzz --target kvstate-api``'s schedule exploration after its lockstep run:
    the profile's number of schedules; (whether one failed, the lines to print)."""
    x = explore(table, N, schedules=PROFILE_SCHEDULES[profile], seed=seed)
    if x.failing is not None:
        return True, summary(x)
    from .workers import run_workers  # the cache's own worker threads, started and stopped

    w = run_workers(table, N)
    return bool(w.problems), w.lines() if w.problems else summary(x) + w.lines()


def main(argv: list[str] | None = None) -> int:
    from kvstate.spec import default_table

    ap = argparse.ArgumentParser(prog="python -m kvstate.targets.api.schedule", description=__doc__)
    ap.add_argument("--schedules", type=int, default=CI_SCHEDULES)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--pool", type=int, default=4)
    ap.add_argument("--replay", default=None, help="one schedule: comma-separated choices")
    ap.add_argument("--scenario", type=int, default=0)
    a = ap.parse_args(argv)
    table = default_table()
    if a.replay is not None:
        choices = [int(c) for c in a.replay.split(",") if c.strip()]
        r = run_schedule(table, a.pool, choices, seed=a.scenario)
        for p in r.problems:
            print(f"  {p}")
        print(f"{'FAILED' if r.problems else 'ok'}: {r.switches} switches at {r.points} points")
        return 1 if r.problems else 0
    x = explore(table, a.pool, schedules=a.schedules, seed=a.seed)
    print("\n".join(summary(x)) if x.failing else "kvstate fuzz: ok\n" + summary(x)[0])
    return 1 if x.failing else 0


if __name__ == "__main__":
    sys.exit(main())
