"""Witnesses of the device's SWA pages running out partway through an operation.

The harness's caches hold ``N`` blocks' worth of SWA pages (or ``N + 1``, ``N + 2``: the
``pools`` sizes), and a prefix keeps its windows only where the policy does
(``Geometry.swa_kept_blocks``), so taking pages always finds a free page or an unpinned window
to slide (``BlockStore.take_swa``): an allocation never fails *after* its device slot was
taken.  ``swa_scarce(k)``, a walk's first operation, reopens the fresh cache with ``k`` blocks'
worth of SWA pages (``pools``' way: the table's pool and every check are unchanged), so the
pages run out while a request pins every window that holds them:

* a ``finish`` whose store run needs a window for its last block: the pages of the whole run
  cannot be taken at once, the blocks are allocated one by one, the last one gets its slot
  and then finds no page and no window the table lets slide; the slot goes back with its
  former claim (``SlotPool.untake``) and the run stores the blocks before it (with ``k``
  blocks' worth of pages, the run stops at block ``k``: each position of the run);
* the same store while the pinned prefix's own window is the LRU's only page holder, after
  the request's decode slid the others (``slide_lru`` passes over blocks without pages);
* another namespace's store (``foreign``) and a single ``allocate`` (``act``) in the same
  squeeze: refused with ``OutOfCapacity`` where nothing is left to slide.

What is checked is the harness's own after every operation: the pools' accounting (every SWA
page free or held by a block whose phase holds one), the device slots' free lists and claims
against the records (``kvstate/targets/api/poolstate.py``: a slot left claimed by a record
whose address is elsewhere), the lockstep with the model (a block left FREE is recomputed),
and the bytes every later hit reads.
"""

from __future__ import annotations

from typing import Any

from kvstate.targets.api.base import op
from kvstate.targets.api.declare import OpDecl


def do_swa_scarce(h: Any, o: Any) -> int | None:
    """Reopen the fresh cache with ``k`` blocks' worth of SWA pages (the first operation only:
    a running cache is never resized)."""
    if len(h.steps) > 1:
        h.call_override = "read"
        return None
    h.cache.close()
    h.cache_kwargs.update(swa_blocks=max(1, int(o.arg("k"))))
    h._open()
    for c in h.checks:  # a new cache, as after a restart (its events subscribed again)
        c.restart(h)
    h.cov.add("check: examples with scarce SWA pages")
    return None


def walks(N: int, L: int, lease_max: int) -> dict[str, list[Any]]:
    """Witnesses: the SWA pages run out with every window that holds them pinned."""
    if N < 3:
        return {}
    from kvstate.spec import default_table
    from kvstate.targets.api.single import actions

    allocate = next(i for i, a in enumerate(actions(default_table())) if a.name == "allocate")
    full = N * L + 1

    def first(k: int) -> list[Any]:
        # block 0 stored with its window: one of the k blocks' worth of pages it holds
        return [
            op("swa_scarce", k=k),
            op("request", i=0, n=L + 1, life=lease_max),
            op("admit", i=0),
            op("use", i=0),
            op("finish", i=0),
        ]

    pinned = [  # a request over the whole chain pins block 0 (its window's pages)
        op("request", i=1, n=full, life=1),
        op("admit", i=1),
        op("use", i=1),
    ]
    return {
        # the store run of blocks 1.. finds pages for k - 1 of them: it stops at each position
        **{
            f"the SWA pages run out at block {k} of a store, every window pinned": [
                *first(k),
                *pinned,
                op("read", i=1),
                op("finish", i=1),
                op("request", i=0, n=full, life=1),
                op("admit", i=0),
                op("drain"),
                op("use", i=0),
                op("read", i=0),
                op("finish", i=0),
            ]
            for k in range(1, N)
        },
        "the SWA pages run out for another prompt and an allocation, every window pinned": [
            *first(1),
            *pinned,
            op("foreign", ns=0, n=2 * L + 1),
            op(
                "act", a=allocate, k=0, on=1
            ),  # a FREE block of the chain: no page, nothing to slide
            op("read", i=1),
            op("finish", i=1),
            op("foreign", ns=1, n=full),
        ],
        "the SWA pages run out after a decode slid the pinned prefix's windows": [
            *first(1),
            *pinned,
            op("append", i=1, k=L),
            op("append", i=1, k=2 * L),
            op("read", i=1),
            op("finish", i=1),
            op("request", i=1, n=full, life=1),
            op("admit", i=1),
            op("drain"),
            op("use", i=1),
            op("read", i=1),
            op("finish", i=1),
        ],
    }


# a fresh cache with scarce SWA pages: scripted (the witnesses above), never drawn
DECLS: tuple[OpDecl, ...] = (OpDecl("swa_scarce", do_swa_scarce, "read", rule=False),)
