"""The pools' own state: their sizes against the cache's arguments, and the device slots' claims.

The accounting (:mod:`kvstate.targets.api.accounting`) compares each pool's free count plus what
the blocks hold with the pool's *own* size, so a pool built one page short (or one slot long)
balances and is never noticed: the cache then runs out earlier than its arguments promise, or
hands out a page that is not there.  :func:`sizes` compares each pool's capacity with the
arguments the cache was opened with (``device_blocks`` slots, ``host_blocks`` host slots,
``swa_blocks`` blocks' worth of SWA pages, the documented meaning of each argument), and the
memory plan ``memory_limit`` is checked against with the bytes the tiers then allocate.

The device slots carry a *claim* (``impl/storage.py``): a record prefers the slot it last held,
so a block evicted and stored again keeps its device address (a captured CUDA graph stays
valid), and a load takes an unclaimed slot first, so it does not steal another block's address
while spare slots exist.  Which slot a block gets is invisible to refinement (the table has no
addresses), and a claim left behind, dropped or filed under the wrong list only shows later, as
a graph staled for nothing or a block that moved when it need not.  :func:`claims` checks what
the documented policy rests on, read through the inspection view after every operation and at
the end of every threaded schedule:

* the free slots, in the order ``take`` hands them out (``free_slots()``: the unclaimed ones,
  then the claimed ones), are exactly the slots not busy, each once; an unclaimed free slot has
  no claimant, a claimed one has one;
* a claimant is a record of the index whose address (``meta.addr``, the slot it prefers) is
  that slot, or the slot its load in flight lands in (it moves there when the load is done):
  a record that moved or was forgotten claims nothing any more;
* a device block's address is the slot it holds (it moved there);
* a record's device slot and address are each a slot of the pool or -1, the documented
  "none" (``BlockMeta.slot``): a freed block's slot reset to another negative value reads as
  no slot to the library's own ``>= 0`` tests, and as an index from the end to anything else.
"""

from __future__ import annotations

from typing import Any

from kvstate.targets.api.base import Harness

# the last cache whose opening arguments were read, and them: one entry, the cache itself (an
# ``id`` alone may be a later example's cache at a freed one's address, opened otherwise)
_OPENED: list[Any] = [None, (0, 0, 0)]


def _opened(h: Harness) -> tuple[int, int, int]:
    """``device_blocks``, ``host_blocks``, ``swa_blocks`` of the harness's cache (those of its
    last opening, ``pools``/``geometry``)."""
    if _OPENED[0] is not h.cache:
        kw = h.open_kwargs()
        sizes = (int(kw["device_blocks"]), int(kw["host_blocks"]), int(kw["swa_blocks"]))
        _OPENED[:] = [h.cache, sizes]
    return _OPENED[1]


def sizes(h: Harness) -> list[str]:
    """Each pool's capacity against the argument that sizes it."""
    t = h.view.tiers
    dev, host, swa = _opened(h)
    out = []
    if t.slots.n != dev:
        out.append(f"device slots: pool of {t.slots.n}, opened with device_blocks={dev}")
    if t.host_slots.n - t.host_slots.first != host:
        out.append(
            f"host slots: pool of {t.host_slots.n - t.host_slots.first}, opened with "
            f"host_blocks={host}"
        )
    want = swa * t.swa_pages_per_block
    if t.swa_pool.n - t.swa_pool.first != want:
        out.append(
            f"SWA pages: pool of {t.swa_pool.n - t.swa_pool.first}, opened with "
            f"swa_blocks={swa} ({want} pages)"
        )
    if _PLANNED[0] is not h.cache:  # once per cache: its tiers never grow
        _PLANNED[0] = h.cache
        out.extend(planned(h))
    return out


_PLANNED: list[Any] = [None]  # the cache whose memory plan was compared last


def planned(h: Harness) -> list[str]:
    """The memory plan (``planned_bytes``: what ``memory_limit`` is checked against before
    anything is allocated) against the bytes the tiers hold, device and host."""
    from kvstate.impl.tiers import planned_bytes

    v = h.view
    t = v.tiers
    dev = sum(g.device_data.nbytes for g in t.groups)
    host = sum(g.host_data.nbytes for g in t.groups)
    plan = planned_bytes(v.geometry, t.slots.n, t.host_slots.n, None, t.swa_blocks)
    if plan != (dev, host):
        return [f"memory plan {plan} (device, host bytes) != the tiers' tensors ({dev}, {host})"]
    return []


def claims(h: Harness) -> list[str]:
    """The device slots' free lists and claims against the records (the caller holds the lock)."""
    v = h.view
    pool = v.tiers.slots
    m = v.meta
    unclaimed, claimed = pool.free_slots()
    busy, claim = list(pool.busy), list(pool.claim)
    out = []
    free = [s for s in range(pool.n) if not busy[s]]
    if sorted(unclaimed + claimed) != free:
        out.append(
            f"device slots: free lists {unclaimed} (unclaimed) + {claimed} (claimed) are not "
            f"the slots not in use {free}"
        )
    wrong = [s for s in unclaimed if claim[s]] + [s for s in claimed if not claim[s]]
    if wrong:
        out.append(
            f"device slots {wrong} filed under the wrong free list (claims "
            f"{[claim[s] for s in wrong]}; unclaimed {unclaimed}, claimed {claimed})"
        )
    live = set(v.index.values())
    lands = {j.rid: j.dst for _, j in v.jobs() if getattr(j, "kind", "") == "load"}
    for s, c in enumerate(claim):
        if c and (c not in live or m.addr[c] != s) and lands.get(c, -1) != s:
            where = m.addr[c] if c in live else "none: not a record of the index"
            out.append(f"device slot {s} claimed by record {c}, whose address is {where}")
    for r in live:
        if m.slot[r] >= 0 and m.addr[r] != m.slot[r]:
            out.append(f"record {r} holds device slot {m.slot[r]} but its address is {m.addr[r]}")
        for name, col in (("device slot", m.slot), ("address", m.addr)):
            if not -1 <= col[r] < pool.n:
                out.append(
                    f"record {r}'s {name} is {col[r]}: neither a slot of the pool's {pool.n} "
                    "nor -1 (none)"
                )
    return out


def pool_state(h: Harness) -> list[str]:
    """:func:`sizes`, :func:`claims` and the page pools' partitions (the caller holds the
    cache's lock)."""
    from kvstate.targets.api.pagefree import pages

    return sizes(h) + claims(h) + pages(h)
