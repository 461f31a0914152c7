"""What a ``use`` waits for: the jobs of its own recovery, no more and no less.

A pending admission's ``use`` (and ``Admission.wait``) waits while its recovery runs and then
validates or truncates (``docs/library.md``).  Two jobs sit outside the table, so refinement
cannot rule on either edge of that wait:

* **waiting for nothing.**  On manual pipelines ``use`` refuses with ``NotReady`` ("recovery
  jobs are queued: drive the manual pipelines").  Said while no pipeline holds a job, it is a
  wait nothing will end: no ``drain`` changes the answer, and the request stays pinned until
  it is aborted.
* **not waiting for the tail check.**  A plan that loads its boundary block checks the tail
  restored there (a ``tail_check`` job on the CPU pipeline, after the block's load lands).  A
  hit served *at that boundary* before the check ended (``ok`` still None), or after it
  failed (``ok`` False: the truncation cuts a block further), serves a compressor state no one
  verified; the tail check sees bytes the model has no variable for (a damaged tail reads as
  wrong bytes only where a later read happens to look).

Both read the library's own jobs through the inspection view and the admission's public
fields (``tail_check``, ``hit_tokens``), not the library's predicate for "pending".
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvstate.spec.state import ConcreteState
from kvstate.targets.api.base import CallCheck

Step = tuple[str, dict[str, int]]


class Waits(CallCheck):
    def refused(self, h: Any, o: Any) -> None:
        from kvstate.impl.errors import NotReady

        if o.name != "use" or h.threads or not isinstance(h.refusal, NotReady):
            return
        if not h.view.busy():
            raise h.fail(
                "wait-for-nothing",
                [o.name],
                f"{o.render()} refused with NotReady ({h.refusal}) while no pipeline holds a "
                f"job (I/O cap queue {list(h.view.io_waiting)}): no drain can end the wait",
            )
        h.cov.add("check: a NotReady use waits for a queued job")

    def after(
        self, h: Any, o: Any, before: ConcreteState, steps: Sequence[Step], end: ConcreteState
    ) -> None:
        if o.name != "use":
            return
        lv = h.live[o.arg("i")]
        run = lv.run if lv is not None else None
        adm = lv.req.admission if lv is not None else None
        if run is None or adm is None or adm.state != "validated":
            return
        tc = adm.tail_check
        if tc is None or run.hit_tokens != tc.boundary:
            return
        if tc.ok is not True:
            raise h.fail(
                "unchecked-boundary",
                [o.name],
                f"{o.render()} served a hit of {run.hit_tokens} tokens at the boundary whose "
                f"restored tail "
                + ("is still being checked" if tc.ok is None else "failed its check"),
            )
        h.cov.add("check: a hit served at a loaded boundary after its tail check passed")
