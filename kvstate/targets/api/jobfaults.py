"""A recovery job that raises, and what its abandonment must leave: the pipelines' error path.

A job that raises is abandoned by its executor (``impl/pipelines.py``: ``Executor.fail``, as a
worker thread or ``drain`` does): its ``abandon`` puts its record back in a consistent phase.
The harness's ``read_error`` makes a load's *read* fail (``CorruptEntry``, handled inside the
load) and an offload's copy raise; the other jobs' abandonment was never run.  Here
``job_raises(b, w)`` makes the next step of block ``b``'s job of kind :data:`KINDS` ``[w]``
raise an error no file system raises (a bug in a kernel or a copy):

* a load's: abandoned as a failed load (the table's ``load_fail``; the world then rules its
  completion out, as for ``read_error``), its slot and pages given back (the accounting);
* a tail check's (``TailCheckJob``, the splice check of a recovered boundary): the boundary is
  unverified, so the admission waiting for it must not serve a hit that ends there
  (:class:`UnverifiedTail`: the hit ``use`` serves is compared with the boundary).

An indexer rebuild's abandonment (``RecoveryCore.abandon_rebuild``: the indexer absent again)
is not a transition of the table (``rebuild_done`` is the only way out of ``REBUILDING``: the
keys are recomputed from resident KV, which cannot fail), so it is not injected here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hypothesis import strategies as st

from kvstate.spec.state import ConcreteState
from kvstate.targets.api.base import CallCheck, chain, op
from kvstate.targets.api.declare import OpDecl
from kvstate.targets.api.faults import _InjectedJobError, _jobs

KINDS = ("load", "tail_check")
Step = tuple[str, dict[str, int]]

# id(cache) -> (cache, {boundary in tokens: block}) of tail checks abandoned, for the latest
# caches only (the cache kept so its id is not reused)
_UNVERIFIED: dict[int, tuple[Any, dict[int, int]]] = {}


def unverified(h: Any) -> dict[int, int]:
    got = _UNVERIFIED.get(id(h.cache))
    if got is None or got[0] is not h.cache:
        while len(_UNVERIFIED) >= 4:
            del _UNVERIFIED[next(iter(_UNVERIFIED))]
        got = _UNVERIFIED[id(h.cache)] = (h.cache, {})
    return got[1]


def do_job_raises(h: Any, o: Any) -> int | None:
    if h.threads:
        return None
    b, kind = o.arg("b"), KINDS[o.arg("w") % len(KINDS)]
    rid = h.rids[b]
    job = next((j for _, j in _jobs(h) if j.rid == rid and j.kind == kind), None)
    if job is None or job.over:
        return None

    def broken() -> bool:
        raise _InjectedJobError(f"injected failure in the {kind} job of record {rid}")

    job.step = broken
    if kind == "load":
        h.read_error.add(b)  # the world: this load fails
    else:
        unverified(h)[job.boundary] = b
    h.cov.add(f"fault {kind} job raises")
    return None


class UnverifiedTail(CallCheck):
    """A hit served at a boundary whose tail check was abandoned (never verified)."""

    def after(
        self, h: Any, o: Any, before: ConcreteState, steps: Sequence[Step], end: ConcreteState
    ) -> None:
        marks = unverified(h)
        if not marks or o.name != "use":
            return
        for n, p in steps:
            if n != "use":
                continue
            served = end.values["pinned"][p["r"]]
            if served in marks:
                raise h.fail(
                    "unverified-tail",
                    [o.name],
                    f"{o.render()} served a hit of {served} tokens, though the tail check of "
                    f"block {marks[served]} at that boundary raised (never verified)",
                )
            h.cov.add("check: no hit served at an unverified boundary")
            marks.clear()

    def restart(self, h: Any) -> None:
        unverified(h).clear()


def walks(N: int, L: int, lease_max: int) -> dict[str, list[Any]]:
    """Witnesses: each kind of job raising at each step of a disk recovery and a host one."""
    c = chain(N, L, lease_max)
    full, to_host, to_disk = c.full, c.to_host, c.to_disk
    out = {}
    for where, base in (("disk", to_disk), ("host", to_host)):
        for w, kind in enumerate(KINDS):
            out[f"a {kind} job raises at a step of a {where} recovery"] = [
                *base,
                op("request", i=1, n=full, life=2),
                op("admit", i=1),
                *[
                    x
                    for j in range(12 + 12 * w)
                    for x in (op("job_raises", b=(N - 1 - j * (1 - w)) % N, w=w), op("step", k=0))
                ],
                op("drain"),
                op("use", i=1),
                op("read", i=1),
                op("finish", i=1),
            ]
    return out


# scripted only (the walks above): the declarations' form is kvstate/targets/api/declare.py's
DECLS: tuple[OpDecl, ...] = (
    OpDecl(
        "job_raises",
        do_job_raises,
        "fault",
        lambda s: {"b": s.block, "w": st.integers(0, len(KINDS) - 1)},
        faults=("job_raises",),
        rule=False,
    ),
)
