"""The disk loads the I/O cap holds back wait only for someone: a queued load's block is pinned.

An admission whose recovery needs more disk loads than the I/O cap allows queues the rest
(``Recovery.admit_load``); the table does not see the queue (a ``load_start`` is a step only
once the load starts).  When the requests that wanted a queued block are gone (finished,
aborted, given up), the library drops it from the queue (``Recovery.forget_unwanted``): left
there, it would start later for nobody, spend the I/O cap and device room, and run its
follow-ups (a rebuild, a tail check) for no request.  The check, after every call: each of the
chain's blocks in the queue (``inspect().io_waiting``) is pinned in the model (its ``ref``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvstate.spec.state import ConcreteState
from kvstate.targets.api.base import CallCheck

Step = tuple[str, dict[str, int]]


class QueuedLoads(CallCheck):
    def after(
        self, h: Any, o: Any, before: ConcreteState, steps: Sequence[Step], end: ConcreteState
    ) -> None:
        if h.threads:
            return  # (a worker may be between a load's end and the queue's scan)
        with h.view.lock:
            queued = list(h.view.io_waiting)
        if not queued:
            return
        blocks = {r: b for b, r in enumerate(h.rids)}
        ref = end.values["ref"]
        idle = [blocks[r] for r in queued if r in blocks and ref[blocks[r]] == 0]
        h.cov.add("check: queued loads wait for a pinned block")
        if idle:
            raise h.fail(
                "readiness",
                ["io_waiting"],
                f"after {o.render()}: loads of blocks {idle} stay queued, pinned by no request",
            )
