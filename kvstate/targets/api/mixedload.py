"""A load driven by its job and by the table's step-by-step surface in turn, and jobs stepped late.

A disk load has two drivers (``impl/diskreads.py``): its *job* (the harness's ``step`` and
``drain``) reads the whole file in its first step and lands the chunks it read, and the table's
actions fired one at a time (``test_hooks().act("load_progress" | "load_done", rid)``, what a
step-by-step engine calls: :mod:`kvstate.targets.api.stepwise`) read and authenticate each
chunk, and the window's section, on their own.  A load driven by one of them alone never
meets the other's leftovers: chunks the job read landed by an action, a window the actions
did not read installed by the job (read alone, without the chunks), a window section read
ahead by ``load_done``.  Each is its own offset arithmetic and its own authentication, so a
damaged window or chunk read by the path the other driver did not take is never exercised.

* ``step_mixed(k)`` (a ``step`` in every scripted walk that has one): one step of the ``k``-th
  job, where a load's next action goes through ``act`` when its progress and ``k`` have the
  same parity, through its job otherwise.
* ``drain_mixed``: ``drain``, each load driven by both in turn (in the walks below: each
  stored form of an entry damaged, :data:`kvstate.targets.api.damage.PARTS`).
* ``step_stale(k)``: a job the harness saw at an earlier step, stepped again after its load or
  offload ended (a worker holding a job it dequeued before the job's end, or an engine's
  checker stepping a list it took earlier: ``Executor.step_job``).  Its record may be loading
  again under a new job; the stale job must change nothing (the table's ``JOB`` of that record
  is the new job's), which is checked on the whole observation.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from kvstate.spec.phases import CKV
from kvstate.targets.api.base import chain, op
from kvstate.targets.api.damage import PARTS
from kvstate.targets.api.declare import OpDecl
from kvstate.targets.api.faults import _jobs, _step_job

# the jobs a cache's pipelines held at earlier steps (executor name, job), oldest first: for
# the latest caches only (id(cache) -> (cache, jobs); the cache kept so its id is not reused)
_SEEN: dict[int, tuple[Any, list[tuple[str, Any]]]] = {}


def _seen(h: Any) -> list[tuple[str, Any]]:
    got = _SEEN.get(id(h.cache))
    if got is None or got[0] is not h.cache:
        while len(_SEEN) >= 4:
            del _SEEN[next(iter(_SEEN))]
        got = _SEEN[id(h.cache)] = (h.cache, [])
    return got[1]


def _remember(h: Any, jobs: list[tuple[str, Any]]) -> None:
    seen = _seen(h)
    known = {id(j) for _, j in seen}
    seen.extend((e, j) for e, j in jobs if id(j) not in known)
    del seen[:-64]  # (the latest few are enough)


# who drives a load's next action, by the operation's mode: True the table's action (``act``)
MODES = (
    lambda prog, done: prog % 2 == 0,  # in turn, the action first
    lambda prog, done: not done,  # the actions land every chunk, the job installs the window
    lambda prog, done: done,  # the job reads and lands every chunk, ``load_done`` by action
    lambda prog, done: prog > 0,  # the job's one read, then the actions land what it read
)


def _mixed(h: Any, e: str, j: Any, mode: int) -> None:
    """One step of job ``j``: a load's next action through ``act`` or through its job, as
    :data:`MODES` ``[mode]`` says."""
    from kvstate.impl.errors import CorruptEntry

    rid = j.rid
    m = h.view.meta
    # (a job whose step the harness broke, kvstate/targets/api/jobfaults.py, steps itself)
    ours = j.kind == "load" and "step" not in vars(j)
    if ours and m.ckv[rid] == CKV.LOADING and h.view.load_job(rid) is j:
        done = h.view.can("load_done", rid)
        if MODES[mode % len(MODES)](m.prog[rid], done):
            action = "load_done" if done else "load_progress"
            try:
                h.hooks.act(action, rid)
            except CorruptEntry:
                pass  # the load failed (load_fail), as a job's runner absorbs it
            h.cov.add(f"mixed load: {action} by act (mode {mode % len(MODES)})")
            return
        h.cov.add(f"mixed load: a step of its job (mode {mode % len(MODES)})")
    _step_job(h, e, j)


def do_step_mixed(h: Any, o: Any) -> int | None:
    if h.threads:
        return None
    jobs = _jobs(h)
    _remember(h, jobs)
    if jobs:
        e, j = jobs[o.arg("k") % len(jobs)]
        _mixed(h, e, j, o.arg("k"))
    return None


def do_drain_mixed(h: Any, o: Any) -> int | None:
    if h.threads:
        return None
    h.drained = []  # each job step's outcome is explained (as ``drain``'s)
    for _ in range(10_000):
        jobs = _jobs(h)
        if not jobs:
            break
        _remember(h, jobs)
        for e, j in jobs:
            _mixed(h, e, j, o.arg("k"))
            h.drained.append(h.observe())
    return None


def do_step_stale(h: Any, o: Any) -> int | None:
    """Step an earlier job that is no longer its record's: nothing may change."""
    if h.threads:
        return None
    stale = [(e, j) for e, j in _seen(h) if h.view.job(e, j.key) is not j]
    if not stale:
        return None
    e, j = stale[o.arg("k") % len(stale)]
    rid = j.rid
    again = h.view.job(e, j.key) is not None  # its record runs a new job of this pipeline
    before = h.observe()
    _step_job(h, e, j)
    after = h.observe()
    if after != before:
        changed = sorted(k for k in before if before[k] != after.get(k))
        raise h.fail(
            "stale-job",
            [j.kind, "again" if again else "ended"],
            f"{o.render()}: a {j.kind} job of record {rid} that had ended, stepped again"
            f"{' while the record runs a new one' if again else ''}, changed {changed}",
        )
    h.cov.add(
        f"check: a stale {j.kind} job changed nothing{' (record busy again)' if again else ''}"
    )
    return None


def walks(N: int, L: int, lease_max: int) -> dict[str, list[Any]]:
    """Witnesses: each stored form damaged under a recovery driven both ways; a hit's loads,
    ended, then run again under new jobs while the old ones are stepped."""
    c = chain(N, L, lease_max)
    full, store, to_host, to_disk = c.full, c.store, c.to_host, c.to_disk
    # N - 1 blocks: each comes back from disk with its window (Geometry.swa_kept_blocks)
    short = [
        op("request", i=0, n=(N - 1) * L + 1, life=1),
        *store[1:],
        op("offload", n=N),
        op("drain"),
        *to_disk[len(to_host) :],
    ]

    def hit(k: int) -> list[Any]:
        return [
            op("request", i=1, n=full, life=1),
            op("admit", i=1),
            op("drain_mixed", k=k),
            op("use", i=1),
            op("read", i=1),
            op("finish", i=1),
        ]

    def again(drain: str, k: int) -> list[Any]:
        # loads of the same blocks under new jobs, the old jobs stepped around them
        return [
            op("request", i=1, n=full, life=2),
            op("admit", i=1),
            op("step_mixed", k=k),
            *stale,
            op(drain, k=k) if drain == "drain_mixed" else op(drain),
            *stale,
            op("use", i=1),
            op("read", i=1),
            op("finish", i=1),
            *stale,
        ]

    to_host_again = [op("tick", t=lease_max), op("offload", n=N), op("drain")]
    to_disk_again = [*to_host_again, op("spill", n=N), op("offload", n=N), op("drain")]
    to_disk_again.append(op("spill", n=N))
    stale = [op("step_stale", k=k) for k in range(2 * N)]
    out: dict[str, list[Any]] = {
        f"damaged {part} section, a recovery driven by jobs and actions, mode {mode} ({pre})": [
            *base,
            op("damage", b=b, part=k),
            *hit(mode),
        ]
        for k, part in enumerate(PARTS)
        for pre, base, b, mode in (
            ("full", to_disk, N - 1, 0),
            ("windows kept", short, N - 2, 1),
            ("windows kept", short, N - 2, 3),
        )
    }
    out["loads ended, run again, their old jobs stepped"] = [
        *to_host,
        *again("drain", 1),
        *to_host_again,
        *again("drain_mixed", 2),
        *to_disk_again,
        *again("drain", 1),
        *to_disk_again,
        *again("drain_mixed", 1),
    ]
    return out


# scripted only (kvstate/targets/api/witnesses.py: ``walks``; ``step_mixed`` also in place of
# every scripted ``step``): the declarations' form is kvstate/targets/api/declare.py's
DECLS: tuple[OpDecl, ...] = (
    OpDecl(
        "step_mixed",
        do_step_mixed,
        "step",
        lambda s: {"k": st.integers(0, 3)},
        rule=False,
        like="step",
    ),
    OpDecl("drain_mixed", do_drain_mixed, "drain", lambda s: {"k": st.integers(0, 3)}, rule=False),
    OpDecl(
        "step_stale",
        do_step_stale,
        "step",
        lambda s: {"k": st.integers(0, 7)},
        rule=False,
    ),
)
