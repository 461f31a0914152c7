"""The windows an ``append`` slides, compared with the spec's window policy asked afresh.

When decoded tokens complete blocks, the blocks that left the sliding window are slid to the
null block, except the windows the device tier's policy keeps (``Geometry.swa_kept_blocks``:
the prefix's end windows and its checkpoints').  The table lets a block's window be slid or kept
(``slide`` is never forced), so refinement cannot see an append that forgets to slide, or
slides from the wrong block on: the window pool then fills with windows no hit can use, and
later stores slide the ones a hit needs.  After every ``append`` that completed a block, each
chain block that left the window during the call and that the policy does not keep must have
been slid, unless the table's ``slide`` guard holds it (pinned, or not READY); the blocks that
left are those the policy kept for the old length (its end windows, the boundary one block
earlier's included) and did not keep for the new one.  Committed blocks
are checked as ``finish``'s are (:mod:`kvstate.targets.api.memo`): kept exactly when the policy keeps
them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvstate.spec.phases import Swa
from kvstate.spec.state import ConcreteState
from kvstate.targets.api.base import CallCheck

Step = tuple[str, dict[str, int]]


class AppendWindows(CallCheck):
    def __init__(self) -> None:
        self.blocks: int | None = None

    def before(self, h: Any, o: Any) -> None:
        lv = h.live[o.arg("i")] if o.name == "append" else None
        self.blocks = lv.req.chain.blocks if lv is not None else None

    def after(
        self, h: Any, o: Any, before: ConcreteState, steps: Sequence[Step], end: ConcreteState
    ) -> None:
        nb = self.blocks
        lv = h.live[o.arg("i")] if nb is not None else None
        if nb is None or lv is None or lv.req.chain.blocks == nb:
            return
        na = lv.req.chain.blocks
        g, W = h.table.geometry, h.table.consts.W
        swa = end.values["swa"]
        # from the first block the policy kept at the old length (its end windows:
        # ``[nb - W - 1, nb)``) to the last the new length's window no longer covers
        lo, hi = max(0, nb - W - 1), min(max(0, na - W), h.N)
        kept = g.swa_kept_blocks(lo, hi, na)
        bad = [
            f"block {b} left the window of a {na}-block request and is not a kept window "
            "(Geometry.swa_kept_blocks), yet it was not slid"
            for b in range(lo, hi)
            if b not in kept
            and swa[b] == Swa.VALID
            and h.machine.is_enabled(end, "slide", {"b": b})
        ]
        for name, p in steps:
            b = p.get("b")
            if name == "commit" and b is not None:
                keep = b in g.swa_kept_blocks(b, b + 1, na)
                if keep != (swa[b] == Swa.VALID):
                    bad.append(
                        f"block {b} committed by the append {'kept' if not keep else 'slid'} "
                        f"its window; the policy {'keeps' if keep else 'slides'} it"
                    )
        if bad:
            raise h.fail("window-policy", [o.name], f"{o.render()}: " + "; ".join(bad))
        h.cov.add("check: windows an append slides against the policy")
