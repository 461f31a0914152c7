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

The same ``use`` matched its hit again at a cut (``RequestTable.truncate``: the longest valid
hit within the pending one); :meth:`Readiness.longest_cut` holds that cut to the longest
whole-block hit the model matches, pins and validates there, the blocks and boundaries the
world damaged left out.
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
        self.pending = 0  # the pending admission's hit before a ``use``

    def before(self, h: Any, o: Any) -> None:
        self.tail_damaged |= o.name in ("host_tail", "job_raises")  # (jobfaults.py)
        lv = h.live[o.arg("i")] if o.name == "use" else None
        adm = lv.req.admission if lv is not None else None
        self.pending = adm.hit_tokens if adm is not None and adm.state == "pending" else 0
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
        self.longest_cut(h, o, before, steps, r)

    def longest_cut(
        self, h: Any, o: Any, before: ConcreteState, steps: Sequence[Step], r: int
    ) -> None:
        """The hit a truncation admits again is the longest sound one within the pending hit
        (``RequestTable.truncate``: the longest valid hit within it, cut a block further only
        where a boundary's restored tail fails its check): no whole-block hit longer than the
        one matched, up to the pending hit, whose blocks and end boundary the world left whole,
        is one the model matches, pins and validates from the state the re-admission matched
        in (a cut at a wrong boundary cuts further than needed)."""
        at = max((i for i, (n, _) in enumerate(steps) if n == "abort"), default=-1)
        k = next((i for i, (n, _) in enumerate(steps) if i > at and n == "match"), None)
        if k is None:
            return
        pending = self.pending
        if not pending:
            return
        m, L = h.machine, h.L
        s = before
        for n, p in steps[:k]:
            s = m.step(s, n, p)
        chosen = steps[k][1]["h"]
        broken = set(h.corrupt) | h.read_error | h.tail_damaged
        for hit in range(pending - pending % L, chosen, -L):
            if broken & set(range(hit // L)):
                continue
            t = s
            for n, p in (("match", {"r": r, "h": hit}), ("pin", {"r": r}), ("validate", {"r": r})):
                if not m.is_enabled(t, n, p):
                    break
                t = m.step(t, n, p)
            else:
                raise h.fail(
                    "short-cut",
                    [o.name],
                    f"{o.render()} cut the pending hit of {pending} tokens to {chosen}, but the "
                    f"model validates {hit} (its blocks and boundary whole)",
                )
        h.cov.add("check: a truncation's cut against the longest sound hit")
