"""Which free device slot a take gets: the documented order of ``free_slots()``.

A block that is stored or loaded takes a device slot (``SlotPool.take``): the one it prefers
(its address, the slot it last held or was registered with) when that is free, else the least
recently freed unclaimed slot, else a claimed one, whose claimant then moves
(``impl/storage.py``); ``free_slots()`` lists the free slots "in the order ``take`` hands them
out": the unclaimed ones, then the claimed ones.  Which slot a block gets is invisible to the
table (it has no addresses), and the pool-state check (``poolstate.py``) holds only the lists'
contents and the claims, not which slot of them went: a take that steals the most recently
freed claimed slot instead of the least, or picks from the wrong end, moves another block's
address (its captured graph goes stale) and nothing else sees it.

:class:`SlotTakes`, around every call of a single-threaded run: the slots the call took (free
before, in use after), each with its taker (the record that claims it after the call) and the
slot that taker preferred (its address before the call; for a record the call registered, the
slot its registration reserved, ``gaddr``).  The takes that did not get their preferred slot
got, as a set, the first of the free list as it stood before the call (the slots the call's
registrations reserved moved to the end of the claimed ones, as ``claim_free`` files them),
the preferred takes left out.  A call that freed a slot, or after which the free lists are not
the lists before with the taken slots left out (a slot handed back in the call, a claim moved),
or in which a record moved off a free slot it claimed (``unclaim`` files that slot unclaimed,
where a later take of the call may find it), reorders the lists part way and is not checked.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvstate.spec.state import ConcreteState
from kvstate.targets.api.base import CallCheck, op

Step = tuple[str, dict[str, int]]


class SlotTakes(CallCheck):
    def __init__(self) -> None:
        self.on = False
        self.free: tuple[list[int], list[int]] = ([], [])
        self.busy: list[bool] = []
        self.addr: dict[int, int] = {}

    def before(self, h: Any, o: Any) -> None:
        self.on = not h.threads and o.name != "restart"
        if not self.on:
            return
        v = h.view
        pool = v.tiers.slots
        self.free = pool.free_slots()
        self.busy = list(pool.busy)
        addr = v.meta.addr
        self.addr = {rid: addr[rid] for rid in v.index.values()}

    def after(
        self, h: Any, o: Any, before: ConcreteState, steps: Sequence[Step], end: ConcreteState
    ) -> None:
        if not self.on:
            return
        v = h.view
        pool = v.tiers.slots
        if pool.n != len(self.busy):
            return  # another cache (an example started over)
        busy, claim, gaddr = list(pool.busy), list(pool.claim), v.meta.gaddr
        if any(was and not now for was, now in zip(self.busy, busy, strict=True)):
            return  # a slot freed in the call: the lists were reordered part way
        took = [s for s in range(pool.n) if busy[s] and not self.busy[s]]
        if not took:
            return
        unclaimed, claimed = self.free
        # the call's registrations: the records new to the index that hold a reserved slot
        homes = sorted(
            (rid, gaddr[rid])
            for rid in v.index.values()
            if rid not in self.addr and 0 <= gaddr[rid] < pool.n
        )
        reserved = [s for _, s in homes]
        order = [s for s in unclaimed if s not in reserved] + claimed + reserved
        left_u, left_c = pool.free_slots()
        if left_u + left_c != [s for s in order if s not in took]:
            return  # the lists reordered in the call (a slot handed back, a claim moved)
        addr = v.meta.addr
        if any(
            0 <= a < pool.n and not self.busy[a] and addr[rid] != a for rid, a in self.addr.items()
        ):
            return  # a record moved off a free slot it claimed: refiled unclaimed in the call

        def prefers(rid: int) -> int:
            return self.addr[rid] if rid in self.addr else gaddr[rid]

        preferred = {s for s in took if claim[s] and prefers(claim[s]) == s}
        other = [s for s in took if s not in preferred]
        if not other:
            h.cov.add("slot takes: every one got its preferred slot")
            return
        want = [s for s in order if s not in preferred][: len(other)]
        stole = any(s in claimed for s in want)
        h.cov.add(
            "check: slot takes against free_slots()' order"
            + (" (a claimed slot taken)" if stole else "")
        )
        if sorted(other) != sorted(want):
            raise h.fail(
                "slot-order",
                [o.name],
                f"{o.render()} took device slots {sorted(other)} for blocks whose preferred "
                f"slot it did not give them; free_slots() listed {order} (unclaimed, then "
                f"claimed) before the call, {sorted(preferred)} taken by the blocks preferring "
                f"them, so the next {len(other)} in that order are {want}",
            )


def walks(N: int, L: int, lease_max: int) -> dict[str, list[Any]]:
    """Witness: the chain stored, its last two blocks evicted (their slots free and still
    claimed, the deepest first), then another namespace's prompt of one block more than the
    spare slots: its last block takes a claimed slot, the least recently freed."""
    full = N * L + 1
    return {
        "a store that takes a claimed slot": [
            op("request", i=0, n=full, life=1),
            op("admit", i=0),
            op("use", i=0),
            op("finish", i=0),
            op("tick", t=lease_max),
            op("evict", n=2),
            op("foreign", ns=0, n=3 * L + 1),
        ],
    }
