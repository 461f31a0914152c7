"""Whether a failed load marks its record corrupt: the mark later admissions plan around.

The table's ``load_fail`` leaves the source where it was (``spec/default/tiers.py``) and says
nothing of why the load failed, so refinement accepts any answer to the question the library
asks next: may this record be recovered again?  The library keeps that answer in the record's
corrupt mark (``impl/recovery.py``'s ``fail_load``): a record whose bytes were read and failed
(a damaged entry, a read that failed partway, a job that raised while landing them) is marked,
and no later recovery plans it (``impl/projection.py`` skips it, so an admission's hit stops
before it); a load failed only at its completion, after every chunk landed and was
authenticated, leaves the entry as sound as it was, unmarked, and a later admission recovers
it again.  A wrong mark either way changes only which hit a later admission picks, and only
where the walk happens to admit that prefix again, so the mark is compared here at the failure
itself, against what the world did to the load (known before the call):

* an injected fault armed (``read_error``) while chunks remain: the next chunk fails, marked;
* one armed once every chunk has landed (the load's progress at ``load_steps``): the
  completion fails, not marked;
* the load's job made to raise (``job_raises``): abandoned as a corrupt load, marked;
* the entry's stored bytes damaged by the harness (not its header, which the scan rejects
  before any load): marked;
* the table's ``load_fail`` asked by name (``act_step`` in the world ``stepwise.FAIL``:
  ``test_hooks().act``, the block-level surface): not marked.

A failure with none of these causes (a read refused in ``act_step``, a short read) is left
unchecked here: its verdict is the load's outcome, which the harness already rules on.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvstate.spec.phases import CKV
from kvstate.spec.state import ConcreteState
from kvstate.targets.api.base import CallCheck, chain, op
from kvstate.targets.api.stepwise import FAIL, fails_by_name
from kvstate.targets.api.stepwise import fails as stepwise_fails

Step = tuple[str, dict[str, int]]


def expected_marks(h: Any) -> dict[int, bool]:
    """Per loading block, the corrupt mark its load's failure must leave (what the world did
    to it before the call); blocks whose cause is unknown are left out."""
    m, steps = h.view.meta, h.table.consts.load_steps
    out: dict[int, bool] = {}
    for b in range(h.N):
        rid = h.rids[b]
        if m.ckv[rid] != CKV.LOADING:
            continue
        job = h.view.load_job(rid)
        if job is None:
            continue
        if job.fault:
            out[b] = m.prog[rid] < steps  # a chunk fails (read or landed), or the completion
        elif "step" in vars(job):
            out[b] = True  # the job raises: abandoned as a corrupt load (jobfaults.py)
        elif h.corrupt.get(b, "header") != "header":
            out[b] = True  # its stored bytes are damaged: the read fails its MAC or parse
    return out


class CorruptMarks(CallCheck):
    def __init__(self) -> None:
        self.want: dict[int, bool] = {}

    def before(self, h: Any, o: Any) -> None:
        self.want = {} if h.threads else expected_marks(h)
        if fails_by_name(o):  # the table's load_fail by name: nothing read wrong
            self.want = {b: False for b in stepwise_fails(h, o)}

    def after(
        self, h: Any, o: Any, before: ConcreteState, steps: Sequence[Step], end: ConcreteState
    ) -> None:
        if not self.want:
            return
        meta = h.view.meta
        for n, p in steps:
            b = p.get("b")
            if n != "load_fail" or b not in self.want:
                continue
            got, want = bool(meta.corrupt[h.rids[b]]), self.want[b]
            h.cov.add(f"check: a failed load's corrupt mark ({'marked' if want else 'sound'})")
            if got != want:
                raise h.fail(
                    "corrupt-mark",
                    ["load_fail"],
                    f"{o.render()}: block {b}'s load failed "
                    + (
                        "after its bytes were read and failed"
                        if want
                        else "only at its completion, every chunk landed and authenticated"
                    )
                    + f", yet its record is {'not ' if not got else ''}marked corrupt "
                    + (
                        "(a later admission recovers it again)"
                        if not got
                        else "(never recovered again)"
                    ),
                )


def walks(N: int, L: int, lease_max: int) -> dict[str, list[Any]]:
    """A disk load whose every chunk landed (two table steps: ``load_steps`` at the default
    table) failed at its completion, and a host load failed by the table's ``load_fail`` asked
    by name: neither entry is damaged, so neither is marked, and the next admission of the
    prefix recovers each again (its hit compared with the longest served, recoveryhit.py)."""
    c = chain(N, L, lease_max)
    again = [
        op("drain"),
        op("use", i=1),
        op("finish", i=1),
        op("admit", i=1),
        op("drain"),
        op("use", i=1),
        op("read", i=1),
    ]
    return {
        # the chain's first blocks on the device, its last two on host (the host's room), the
        # saved tail of block N - 2 damaged: a hit of N - 1 blocks loads its boundary block
        # alone, and that load brings the boundary's tail, which must be checked (a failed
        # check marks the record: the hit is cut there)
        "a plan that loads its boundary block alone checks the tail": [
            *c.to_host,
            op("host_tail", b=N - 2),
            op("request", i=1, n=(N - 1) * L + 1, life=1),
            op("admit", i=1),
            op("drain"),
            op("use", i=1),
            op("read", i=1),
        ],
        "a disk load fails at its completion: recovered again": [
            *c.to_disk,
            op("request", i=1, n=c.full, life=1),
            op("admit", i=1),
            op("act_step", b=0, k=0),
            op("act_step", b=0, k=0),
            op("read_error", b=0),
            *again,
        ],
        "a host load failed by name (the table's load_fail): recovered again": [
            *c.to_host,
            op("request", i=1, n=c.full, life=1),
            op("admit", i=1),
            op("act_step", b=0, k=FAIL),
            *again,
        ],
    }
