"""Memoized answers inside the library, compared with fresh ones from the spec.

The store keeps the device tier's SWA window policy per span (``BlockStore.policy_slid``:
the spec's ``Geometry.swa_kept_blocks`` runs interpreted, so its answers are memoized).  The
table's ``STORE`` lets a stored block's window be slid or kept (``slide?``), so refinement
cannot see a memo that answers for the wrong span; the policy can.  After every ``finish``,
each block the call committed keeps its window (VALID) exactly when the spec's policy, asked
afresh for that block in a prefix of the request's chain length, keeps it.  (The graph rows'
memo is checked in :mod:`kvstate.targets.api.handout`: a row is compared with the Run after every use.)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvstate.spec.phases import Swa
from kvstate.spec.state import ConcreteState
from kvstate.targets.api.base import CallCheck

Step = tuple[str, dict[str, int]]


class WindowPolicy(CallCheck):
    def __init__(self) -> None:
        self.chain_blocks: int | None = None

    def before(self, h: Any, o: Any) -> None:
        lv = h.live[o.arg("i")] if o.name == "finish" else None
        self.chain_blocks = lv.req.chain.blocks if lv is not None else None

    def after(
        self, h: Any, o: Any, before: ConcreteState, steps: Sequence[Step], end: ConcreteState
    ) -> None:
        n = self.chain_blocks
        if n is None:
            return
        g = h.table.geometry
        swa = end.values["swa"]
        bad = []
        for name, p in steps:
            b = p.get("b")
            if name != "commit" or b is None:
                continue
            keep = b in g.swa_kept_blocks(b, b + 1, n)
            if keep != (swa[b] == Swa.VALID):
                bad.append(
                    f"block {b} of a {n}-block prefix {'kept' if swa[b] == Swa.VALID else 'slid'}"
                    f" its window; the policy (Geometry.swa_kept_blocks) "
                    f"{'keeps' if keep else 'slides'} it"
                )
        if bad:
            raise h.fail("window-policy", [o.name], f"{o.render()}: " + "; ".join(bad))
        h.cov.add("check: stored windows against the policy")
