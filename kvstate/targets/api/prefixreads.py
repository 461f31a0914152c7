"""A run read at every block boundary of its hit, against the model's windows.

The byte check (:mod:`kvstate.targets.api.bytes`) reads a run at its hit's end, where every
window block is valid (the hit rule requires it).  ``Run.prefix(h)`` reads the same pins as a
hit of the first ``h`` tokens, at any block boundary ``h``, and there the window's arithmetic
(which SWA pages cover ``[h - n_win, h)``, where a block's rows start, rows before position 0,
a window that was slid) is never compared: an off-by-one in ``Tiers.read_window`` that is right
at the hit's end is wrong one block earlier.  Here, after every ``use`` that returned a run,
each boundary ``h`` of its hit (0 included) is read: the block table must be the run's first
``h / L`` rows, and each SWA layer's window the request's own rows for the positions whose
block the model says holds its window (``swa`` VALID) and zeros for the others, byte for byte.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from kvstate.spec.phases import Swa
from kvstate.spec.state import ConcreteState
from kvstate.targets.api.base import CallCheck

Step = tuple[str, dict[str, int]]


def _window(h: Any, tokens: Any, layer: int, hb: int, swa: Sequence[int]) -> torch.Tensor:
    """The window a hit of ``hb`` tokens reads at ``layer``: rows of ``[hb - n_win, hb)``,
    zeros before 0 and where the model's block holds no window."""
    from kvstate.testing.datacheck import _entries

    g = h.view.geometry
    eb, n_win, L = g.entry_bytes, g.n_win, h.L
    out = torch.zeros(n_win, eb, dtype=torch.uint8)
    lo = max(0, hb - n_win)
    if hb > lo:
        rows = _entries("swa", layer, lo, hb, tokens[lo:hb], eb)
        for p in range(lo, hb):
            if swa[p // L] == Swa.VALID:
                out[n_win - (hb - p)] = rows[p - lo]
    return out


class PrefixReads(CallCheck):
    def after(
        self, h: Any, o: Any, before: ConcreteState, steps: Sequence[Step], end: ConcreteState
    ) -> None:
        if o.name != "use":
            return
        lv = h.live[o.arg("i")]
        run = lv.run if lv is not None else None
        if run is None or not run.hit_tokens:
            return
        swa = end.values["swa"]
        table = run.block_table()
        layers = len(h.view.geometry.layers)
        bad: list[str] = []
        for hb in range(0, run.hit_tokens, h.L):
            pre = run.prefix(hb)
            if pre.block_table() != table[: hb // h.L]:
                bad.append(f"prefix({hb}).block_table() is not the run's first {hb // h.L} rows")
            for layer in range(layers):
                if not torch.equal(pre.read_window(layer), _window(h, lv.want, layer, hb, swa)):
                    bad.append(f"prefix({hb}).read_window({layer}) differs")
        if bad:
            raise h.fail(
                "prefix-read",
                [bad[0].split(".")[1].split("(")[0]],
                f"{o.render()}: a run read at its inner boundaries: " + "; ".join(bad),
            )
        h.cov.add("check: a run read at every boundary of its hit")
