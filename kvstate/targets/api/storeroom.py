"""A store of a prompt outside the modelled chain makes the room the table lets it make.

``finish`` (and a ``use`` block's exit) stores a request's new blocks, evicting the least
recently used blocks the table lets go and sliding the windows it lets slide to make room; the
run stops only where capacity runs out (``HeterogeneousKVCache.finish``; ``BlockStore.take_swa``,
``BlockStore._evict_run``).  For the chain's requests ``kvstate/targets/api/writerfails.py``
checks this against the model.  The other prompts (``foreign``: another namespace; ``variant``:
a prompt differing early) are outside the model, so a library that gives up their store early
(an empty slide loop, an eviction fallback that evicts nothing) is explained by the table and
seen by nothing else; yet their stores are where the chain's windows and blocks make room.

:class:`OutsideStores`: after such a request was used and released (``read_outside_chain``
keeps it as ``h.outside_req``), every block of its chain is stored (indexed and not FREE),
wherever the device had room for each block that was not on the device before the call: free
slots and the blocks the table let evict, free SWA pages and the windows it let slide (the
cache's guard reads, which ``kvstate/targets/api/facade.py`` checks against the model on the
chain's blocks), the request's own blocks not counted (its admission pins them).
:func:`past_gap` (this check and ``writerfails.py``'s): the blocks a run stored are the
first of its blocks (``BlockStore.store_run``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvstate.spec.api import MACROS
from kvstate.spec.phases import CKV
from kvstate.spec.state import ConcreteState
from kvstate.targets.api.base import CallCheck
from kvstate.targets.api.single import _words

Step = tuple[str, dict[str, int]]
_OUTSIDE = ("foreign", "variant")
# the steps ``spec/api.py``'s ROOM macro makes room with: an eviction's first action (it frees
# the block's slot and its window's pages) and the other alternative, a window slid (its pages)
EVICT = _words(MACROS["EVICT"])[0]
SLIDE = next(w for w in _words(MACROS["ROOM"]) if w != EVICT)


def past_gap(h: Any, o: Any, want: Sequence[int], left: Sequence[int]) -> None:
    """A store run that stops stores its first blocks and leaves the rest
    (``BlockStore.store_run``: where capacity runs out, the rest is recomputed next time): a
    block stored past one it left (``want`` in chain order, ``left`` among them) is a finding,
    a hole no hit can reach that holds a slot."""
    if left and any(b > left[0] for b in want if b not in left):
        raise h.fail(
            "store-gap",
            ["finish"],
            f"{o.render()} stored blocks {[b for b in want if b not in left]} of {list(want)} "
            f"past block {left[0]}, which it left stored nowhere",
        )
    h.cov.add("check: a store run's blocks stored as a prefix")


class OutsideStores(CallCheck):
    def __init__(self) -> None:
        self.on = False
        self.evict: set[int] = set()
        self.slide: set[int] = set()
        self.resident: set[int] = set()
        self.room = 0
        self.pages = 0

    def before(self, h: Any, o: Any) -> None:
        h.outside_req = None
        self.on = o.name in _OUTSIDE and not h.threads
        if not self.on:
            return
        view = h.view
        ckv, rids = view.meta.ckv, list(view.index.values())
        self.evict = {rid for rid in rids if view.can(EVICT, rid)}
        self.slide = {rid for rid in rids if view.can(SLIDE, rid)}
        self.resident = {rid for rid in rids if ckv[rid] == CKV.READY}
        self.room = int(view.stats()["device_free"])
        self.pages = int(view.tiers.swa_pool.free)

    def after(
        self, h: Any, o: Any, before: ConcreteState, steps: Sequence[Step], end: ConcreteState
    ) -> None:
        req = getattr(h, "outside_req", None)
        if not self.on or req is None:
            return  # not such a request, or one given up (nothing read, nothing stored)
        view = h.view
        rids = view.resolve(req.chain)
        own = set(rids)
        need = sum(1 for rid in rids if rid not in self.resident)
        per = int(view.tiers.swa_pages_per_block)
        slots = self.room + len(self.evict - own)
        pages = self.pages + per * len(self.slide - own)
        ckv = view.meta.ckv
        left = [b for b, rid in enumerate(rids) if rid == 0 or ckv[rid] == CKV.FREE]
        past_gap(h, o, list(range(len(rids))), left)
        if slots < need or pages < per * need:
            h.cov.add("an outside store short of room (its stores not required)")
            return
        h.cov.add("check: an outside store made the room the table let it")
        if left:
            raise h.fail(
                "outside-stores",
                ["finish"],
                f"{o.render()} left blocks {left} of its {len(rids)} stored nowhere, with "
                f"{self.room} device slots free and {len(self.evict - own)} blocks the table "
                f"let it evict for {need} blocks, {self.pages} SWA pages free and "
                f"{len(self.slide - own)} windows it let it slide ({per} pages a block)",
            )
