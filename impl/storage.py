"""Slot and page allocators for the device and host tiers.

:class:`SlotPool` hands out device slots (one per cached LCM block; every full-history group
stores its pages at that slot's index).  A record *claims* the slot it last held, and a later
allocation of the same record prefers it, so a block that is evicted and re-stored keeps its
device address and a captured CUDA graph stays valid.  Loads take the least recently freed
*unclaimed* slot first, so they do not steal another block's address while spare slots exist.
:class:`PagePool` is a plain free list (SWA pages, host slots).  Both detect double frees: a
slot released twice is an :class:`~kvstate.impl.errors.InternalError`, never a silent reuse.
"""

from __future__ import annotations

from collections import OrderedDict, deque

from .errors import InternalError


class SlotPool:
    def __init__(self, n: int) -> None:
        self.n = n
        # a list, not a bytearray: compiled, a list's items are read and set natively, a
        # bytearray's through generic item calls (a store run sets one per page it takes)
        self.busy: list[bool] = [False] * n
        self.claim = [0] * n  # rid that prefers this slot (0: none)
        self.displaced = 0  # the claim the last ``take`` replaced (for ``untake``)
        self._unclaimed: OrderedDict[int, None] = OrderedDict((s, None) for s in range(n))
        self._claimed: OrderedDict[int, None] = OrderedDict()

    @property
    def free(self) -> int:
        return len(self._unclaimed) + len(self._claimed)

    def free_slots(self) -> tuple[list[int], list[int]]:
        """The free slots in the order ``take`` hands them out: the unclaimed ones, then the
        claimed ones (copies; read by the inspection view)."""
        return list(self._unclaimed), list(self._claimed)

    def claim_free(self, rid: int) -> int:
        """Reserve a preferred slot for a new record without taking it (-1 when none spare)."""
        if not self._unclaimed:
            return -1
        slot, _ = self._unclaimed.popitem(False)  # (positional: no keyword call)
        self.claim[slot] = rid
        self._claimed[slot] = None
        return slot

    def take(self, rid: int, prefer: int) -> int:
        """Take ``prefer`` if it is free (-1: no preference), else the least recently freed
        unclaimed slot, else a claimed one (its claimant will move).  The slot becomes claimed
        by ``rid``.  -1: full."""
        if 0 <= prefer < self.n and not self.busy[prefer]:
            slot = prefer
            self._claimed.pop(slot, None)
            self._unclaimed.pop(slot, None)
        elif self._unclaimed:
            slot, _ = self._unclaimed.popitem(False)  # (positional: no keyword call)
        elif self._claimed:
            slot, _ = self._claimed.popitem(False)  # (positional: no keyword call)
        else:
            return -1
        self.busy[slot] = True
        self.displaced = self.claim[slot]
        self.claim[slot] = rid
        return slot

    def untake(self, slot: int, claimant: int) -> None:
        """Give back a slot :meth:`take` just handed out, claimed again by ``claimant`` (the
        ``displaced`` it read): an allocation that failed after its slot leaves the claims as
        they were, so no slot stays claimed by a record whose address is elsewhere."""
        self.busy[slot] = False
        self.claim[slot] = claimant
        (self._claimed if claimant else self._unclaimed)[slot] = None

    def release(self, slot: int) -> None:
        if not 0 <= slot < self.n:  # pragma: no cover: a bad free (unit-tested)
            raise InternalError(f"release of device slot {slot} outside [0, {self.n})")
        if not self.busy[slot]:  # pragma: no cover: a bad free (unit-tested)
            raise InternalError(f"device slot {slot} released twice (double free)")
        self.busy[slot] = False
        (self._claimed if self.claim[slot] else self._unclaimed)[slot] = None

    def unclaim(self, slot: int, rid: int) -> None:
        """Drop ``rid``'s preference for ``slot`` (the record moved or was forgotten)."""
        if 0 <= slot < self.n and self.claim[slot] == rid:
            self.claim[slot] = 0
            if not self.busy[slot]:
                self._claimed.pop(slot, None)
                self._unclaimed[slot] = None


class PagePool:
    """Free list of page ids ``[first, n)``; ids below ``first`` are reserved (the null page)."""

    def __init__(self, n: int, first: int = 0) -> None:
        self.n = n
        self.first = first
        # a list, not a bytearray: compiled, a list's items are read and set natively, a
        # bytearray's through generic item calls (a store run sets one per page it takes)
        self.busy: list[bool] = [False] * n
        self._free: deque[int] = deque(range(first, n))

    def free_pages(self) -> list[int]:
        """The free pages in the order they will be handed out (a copy)."""
        return list(self._free)

    @property
    def free(self) -> int:
        return len(self._free)

    def take(self, count: int = 1) -> list[int] | None:
        """``count`` pages, all or nothing."""
        free = self._free
        if len(free) < count:
            return None
        pop = free.popleft  # bound once: a method lookup per page is most of the cost compiled
        out = [pop() for _ in range(count)]
        busy = self.busy
        for p in out:
            busy[p] = True
        return out

    def untake(self, pages: list[int]) -> None:
        """Give back pages just taken and not used, to the front of the free list, in their
        order: the pool is as if they had never been taken."""
        busy = self.busy
        for p in pages:
            busy[p] = False
        self._free.extendleft(reversed(pages))

    def release(self, pages: list[int] | tuple[int, ...]) -> None:
        first, n, busy = self.first, self.n, self.busy
        for p in pages:
            if not first <= p < n:  # pragma: no cover: a bad free (unit-tested)
                raise InternalError(f"release of page {p} outside [{first}, {n})")
            if not busy[p]:  # pragma: no cover: a bad free (unit-tested)
                raise InternalError(f"page {p} released twice (double free)")
        for p in pages:
            busy[p] = False
        self._free.extend(pages)  # one call, same order as an append per page

    def release_run(self, pages: list[int]) -> None:
        """``release`` of several blocks' pages, concatenated in order: the free list ends as
        after one ``release`` per block.  A page given twice in the run is a double free, as it
        would be on the second call, and nothing is released then."""
        first, n, busy = self.first, self.n, self.busy
        for k, p in enumerate(pages):
            if not first <= p < n or not busy[p]:  # pragma: no cover: a bad free (unit-tested)
                for q in pages[:k]:  # undo: the pool is as before the call
                    busy[q] = True
                if not first <= p < n:
                    raise InternalError(f"release of page {p} outside [{first}, {n})")
                raise InternalError(f"page {p} released twice (double free)")
            busy[p] = False  # cleared as checked: a repeat later in the run is caught
        self._free.extend(pages)
