"""The library's own drivers of manual pipelines, and the paths of a recovery they reach.

An engine on manual pipelines drives them through the cache's public ``pipelines``
(``README.md``: ``cache.pipelines.drain()``; one job by its record: ``cache.pipelines.io.step(rid)``,
``dma``, ``cpu``).  The harness's own ``step`` and ``drain`` step the jobs it lists
(``TestHooks.step_job``), so the library's loops were never run:

* ``drain_lib``: ``cache.pipelines.drain()``, explained by ``spec/api.py``'s ``drain`` (its job
  steps); a job that raises inside it (``job_raises``, kvstate/targets/api/jobfaults.py) must
  be abandoned as a worker thread abandons it, and the drain goes on: afterwards no job, no
  load in flight and no follow-up may be left (:func:`accounting.drained_idle`), and the
  count it returns is the job steps it ran (counted at each executor's step);
* ``step_key(k)``, ``run_key(k)``: the ``k``-th listed job stepped (``step``), or run to its
  end (``run``), by its record through its executor (explained by ``step``, ``drain``); a job
  that raises is abandoned and its error reaches the caller (the error the harness injected,
  nothing else).

The walks add the moments a random walk rarely meets: a load's failure injected once every
chunk has landed (it fails at its completion, ``load_done``); offload jobs that ended under an
admission that took their blocks back, stepped again (a stale offload changes nothing); a
recovering request whose deadline runs out before its ``use`` (not even the truncated hit
validates: the admission is downgraded to a recompute).
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from kvstate.targets.api.accounting import drained_idle
from kvstate.targets.api.base import chain, op
from kvstate.targets.api.declare import OpDecl
from kvstate.targets.api.faults import _InjectedJobError, _jobs


def do_drain_lib(h: Any, o: Any) -> int | None:
    if h.threads:
        return None
    pipes = h.cache.pipelines
    taken = [0]  # the job steps the drain takes, counted at each executor's step (README:
    # drain() returns the steps taken): a busy drain's count, not only an idle one's 0

    def counting(real: Any) -> Any:
        def step(job: Any) -> bool:
            taken[0] += 1
            return bool(real(job))

        return step

    for e in pipes.all:
        e._step = counting(e._step)
    try:
        steps = pipes.drain()
    finally:
        for e in pipes.all:
            del e._step  # the class's own again
    bad = drained_idle(h)
    again = pipes.drain()  # nothing left: no step taken (README: the steps taken)
    if again != 0 or steps != taken[0]:
        bad.append(
            f"drain count: {steps} steps where {taken[0]} job steps ran, then {again} on idle "
            "pipelines (0)"
        )
    if bad:
        raise h.fail(
            "accounting", [b.split(":")[0] for b in bad], f"after {o.render()}: {'; '.join(bad)}"
        )
    h.cov.add("check: the library's drain left nothing")
    return None


def do_step_key(h: Any, o: Any) -> int | None:
    from kvstate.impl.errors import KVStateError

    if h.threads:
        return None
    jobs = _jobs(h)
    if not jobs:
        return None
    e, j = jobs[o.arg("k") % len(jobs)]
    try:
        getattr(h.cache.pipelines, e).step(j.key)
    except (KVStateError, _InjectedJobError):
        h.cov.add(f"step_key: a {j.kind} job raised, abandoned")
    return None


def do_run_key(h: Any, o: Any) -> int | None:
    """The ``k``-th listed job run to its end by its record (``Executor.run``)."""
    from kvstate.impl.errors import KVStateError

    if h.threads:
        return None
    jobs = _jobs(h)
    if not jobs:
        return None
    e, j = jobs[o.arg("k") % len(jobs)]
    try:
        getattr(h.cache.pipelines, e).run(j.key)
    except (KVStateError, _InjectedJobError):
        h.cov.add(f"run_key: a {j.kind} job raised, abandoned")
    return None


def walks(N: int, L: int, lease_max: int, load_steps: int = 2) -> dict[str, list[Any]]:
    """Witnesses (see the module doc); ``load_steps``: the table's chunks per load."""
    c = chain(N, L, lease_max)
    full, store, to_host, to_disk = c.full, c.store, c.to_host, c.to_disk
    out: dict[str, list[Any]] = {}
    # a job armed to raise, stepped by its record (``step``), another under the library's
    # drain (a host recovery); every load armed, one run by its record (``run``), then a tail
    # check armed under the drain (a disk recovery)
    out["jobs raise under step and the library's drain (host recovery)"] = [
        *to_host,
        op("request", i=1, n=full, life=2),
        op("admit", i=1),
        op("job_raises", b=N - 1, w=0),
        op("step_key", k=1),
        op("job_raises", b=N - 2, w=0),
        op("drain_lib"),
        op("use", i=1),
        op("read", i=1),
        op("finish", i=1),
    ]
    out["jobs raise under run and the library's drain (disk recovery)"] = [
        *to_disk,
        op("request", i=1, n=full, life=2),
        op("admit", i=1),
        *[op("job_raises", b=b, w=0) for b in range(N)],
        op("run_key", k=0),
        op("job_raises", b=N - 1, w=1),
        op("drain_lib"),
        op("use", i=1),
        op("read", i=1),
        op("finish", i=1),
    ]
    # a one-block hit's load, its failure injected after each number of landed chunks (the
    # last: every chunk landed, the failure at its completion)
    out["a host load fails once every chunk has landed"] = [
        *to_host,
        op("request", i=1, n=full, life=2),
        op("admit", i=1),
        *[op("step_key", k=0) for _ in range(load_steps)],  # the first listed load's chunks
        op("read_error", b=N - 2),
        op("read_error", b=N - 1),
        op("drain_lib"),
        op("use", i=1),
        op("read", i=1),
        op("finish", i=1),
    ]
    # offload jobs taken back by an admission, then stepped again
    # (then offloaded anew: the old jobs stepped beside their records' new offload jobs)
    stale = [op("step_stale", k=k) for k in range(2 * N)]
    out["offloads cancelled by an admission, their jobs stepped again"] = [
        *store,
        op("offload", n=N),
        op("step_mixed", k=0),
        op("request", i=1, n=full, life=1),
        op("admit", i=1),
        *stale,
        op("drain_lib"),
        op("use", i=1),
        op("finish", i=1),
        op("tick", t=lease_max),
        op("offload", n=N),
        *stale,
        op("drain_lib"),
    ]
    # a recovering request whose deadline runs out before its use
    out["a recovering request's deadline runs out, a load fails: downgraded at its use"] = [
        *to_host,
        op("request", i=1, n=full, life=1),
        op("admit", i=1),
        op("tick", t=lease_max),
        op("read_error", b=N - 1),  # a load fails: the admission truncates at its use
        op("run_key", k=0),  # (the other load, run by its record through all its chunks)
        op("drain_lib"),
        op("use", i=1),
        op("read", i=1),
        op("finish", i=1),
    ]
    return out


# scripted only (the walks above): the declarations' form is kvstate/targets/api/declare.py's
DECLS: tuple[OpDecl, ...] = (
    OpDecl("drain_lib", do_drain_lib, "drain", rule=False),
    OpDecl("step_key", do_step_key, "step", lambda s: {"k": st.integers(0, 3)}, rule=False),
    OpDecl("run_key", do_run_key, "drain", lambda s: {"k": st.integers(0, 3)}, rule=False),
)
