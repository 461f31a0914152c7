"""Readiness in recovery: a ``use`` gives up a pinned hit only when its recovery cannot end.

The table explains a pending admission's ``use`` by ``FINALIZE``: validate, or give the hit up
and admit again at the longest valid prefix (``abort admit match pin validate``).  Both are
refinements, so a library that finalizes *before* its recovery is over (a scan of the pending
jobs that stops early, a rebuild or a load not waited for) is explained too: it truncates a hit
that waiting would have served.  The check: when a ``use`` truncates, the model is run on from
the state before the call by the pipeline jobs alone (``spec/api.py`` ``JOB``: load steps, the
loads' ends as the world allows them -- a sound entry's load completes, a corrupt one's fails --
and the rebuilds and held-back loads they start); if ``validate`` of the request then holds,
the recovery would have served the hit, and the truncation is a finding.  (A host copy whose
tail the harness damaged fails its tail check, which the model does not see: such examples
are left out.)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvstate.spec.state import ConcreteState
from kvstate.targets.api.base import CallCheck

Step = tuple[str, dict[str, int]]
JOBS = ("load_progress", "load_done", "load_fail", "rebuild_start", "rebuild_done", "load_start")


class Readiness(CallCheck):
    def __init__(self) -> None:
        self.tail_damaged = False
        self.forbid: set[tuple[str, int]] = set()
        self.queued: set[int] = set()

    def before(self, h: Any, o: Any) -> None:
        self.tail_damaged |= o.name in ("host_tail", "job_raises")  # (jobfaults.py)
        self.forbid = h._forbid(o)
        # a load starts again only where the I/O cap held it back (a failed one is not retried)
        blocks = {r: b for b, r in enumerate(h.rids)}
        with h.view.lock:
            self.queued = {blocks[r] for r in h.view.io_waiting if r in blocks}

    def after(
        self, h: Any, o: Any, before: ConcreteState, steps: Sequence[Step], end: ConcreteState
    ) -> None:
        if o.name != "use" or self.tail_damaged:
            return
        r = next((p["r"] for n, p in steps if n == "abort"), None)
        if r is None:
            return
        m = h.machine
        s, ran = before, []
        for _ in range(200):
            nxt = next(
                (
                    (n, p)
                    for n, p in m.enabled(s)
                    if n in JOBS
                    and (n, p.get("b")) not in self.forbid
                    and (n != "load_start" or p.get("b") in self.queued)
                ),
                None,
            )
            if nxt is None:
                break
            ran.append(nxt[0])
            s = m.step(s, *nxt)
        if m.is_enabled(s, "validate", {"r": r}):
            raise h.fail(
                "readiness",
                [o.name],
                f"{o.render()} gave up request slot {r}'s hit (truncated) while its recovery "
                f"could still end: after the jobs {ran} validate holds",
            )
        h.cov.add("check: truncations at use against the recovery's end")
