"""``Run.verify_pins`` after release, against the table's ``toctou`` invariant.

``verify_pins`` is the documented TOCTOU diagnostic: the blocks of a validated run at which the
table's ``toctou`` invariant fails (a block no longer pinned, not READY, reallocated or moved
since its validation); it "works on a released run too, whose blocks no pin holds any more".
The harness reads it on live runs, where it must say nothing, so a diagnostic that never
reports a block (or reports the wrong ones) passed every check.  Here, when a released run is
read (``read_released``), its answer is compared with the invariant itself, evaluated by the
model on the model's state now with the request as it was when the run was validated (its
slot's request variables taken at its ``use``): the blocks it names must be exactly those
at which ``toctou``'s per-block condition is false.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from kvstate.spec.state import ConcreteState, req_var_names
from kvstate.targets.api.base import CallCheck

Step = tuple[str, dict[str, int]]
_BLOCK = re.compile(r"block (\d+):")


class ReleasedPins(CallCheck):
    def __init__(self) -> None:
        # id of a run -> (the run, its slot, the request's variables at its use)
        self.validated: dict[int, tuple[Any, int, dict[str, Any]]] = {}

    def restart(self, h: Any) -> None:
        self.validated.clear()

    def after(
        self, h: Any, o: Any, before: ConcreteState, steps: Sequence[Step], end: ConcreteState
    ) -> None:
        if h.threads:
            return
        if o.name == "use":
            lv = h.live[o.arg("i")]
            s = lv.req.slot if lv is not None else None
            if lv is None or lv.run is None or s is None or lv.run.hit_tokens == 0:
                return
            names = req_var_names(h.table)
            r = s.index
            self.validated[id(lv.run)] = (lv.run, r, {n: end.values[n][r] for n in names})
            if len(self.validated) > 64:  # an example's runs: the oldest go
                del self.validated[next(iter(self.validated))]
            return
        if o.name != "read_released":
            return
        got = h.released[o.arg("i")]
        kept = self.validated.get(id(got[0])) if got is not None else None
        if kept is None or kept[0] is not got[0]:
            return
        run, r, req = kept
        from kvstate.impl.errors import KVStateError

        try:
            said = run.verify_pins()
        except KVStateError:
            return  # its cache was closed (a crash reopened it): documented
        values = dict(end.values)
        for n, v in req.items():
            col = list(values[n])
            col[r] = v
            values[n] = col
        s = h.machine.state(values)
        inv = next(i for i in h.table.invariants if i.name == "toctou")
        want = [b for b in range(min(run.blocks, h.N)) if not inv.per_block(s, r, b)]
        named = [int(m.group(1)) for m in map(_BLOCK.match, said) if m]
        h.cov.add("check: a released run's verify_pins against the toctou invariant")
        if named[: len(want)] != want or any(b < h.N for b in named[len(want) :]):
            raise h.fail(
                "verify-pins",
                ["toctou"],
                f"{o.render()}: verify_pins() of the released run names blocks {named} "
                f"({said}); the table's toctou invariant fails at blocks {want}",
            )
