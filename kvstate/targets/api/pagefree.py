"""The page pools' free lists against their pages in use, page by page.

The accounting (:mod:`kvstate.targets.api.accounting`) compares each page pool's free *count*
plus what the blocks hold with its size; the device slots' free lists are checked slot by slot
(:mod:`kvstate.targets.api.poolstate`).  The two page pools (``PagePool``, ``impl/storage.py``:
the SWA pages and the host slots) were checked only by count, so a page given back to the free
list while still marked in use (or marked free while still listed, or listed twice, or held by
two blocks at once) balanced the sums and stayed unseen until a later ``take`` handed out a page
a window still reads.  The classes of path this closes: an allocation that runs out partway and
gives back what it took (``untake``), a run's pages freed at once (``release_run``), a slide or
an eviction partway through a run.  After every operation (with the other pool checks) each page
pool must be a partition:

* its free list (``free_pages()``, in the order ``take`` hands pages out) holds each page of
  ``[first, n)`` at most once, and exactly the pages not marked in use;
* the pages the records hold (``meta.swa_pages``, ``meta.hslot``) and a load in flight holds
  (its job's ``swa_pages``) are marked in use, each held once;
* a page marked in use is held by a record or a load (else it is leaked).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from kvstate.targets.api.base import Harness


def partition(name: str, pool: Any, held: list[int]) -> list[str]:
    """``pool``'s free list, its in-use marks and the pages ``held`` (a list: a page held twice
    shows twice) as one partition of ``[first, n)``."""
    first, n = int(pool.first), int(pool.n)
    busy = list(pool.busy)
    free = [int(p) for p in pool.free_pages()]
    out = []
    twice = sorted(p for p, c in Counter(free).items() if c > 1)
    if twice:
        out.append(f"{name}: pages {twice} listed free more than once")
    outside = sorted(p for p in set(free) | set(held) if not first <= p < n)
    if outside:
        out.append(f"{name}: pages {outside} outside [{first}, {n})")
    listed = set(free)
    marked = [p for p in listed if first <= p < n and busy[p]]
    if marked:
        out.append(f"{name}: pages {sorted(marked)} listed free but marked in use")
    unlisted = [p for p in range(first, n) if not busy[p] and p not in listed]
    if unlisted:
        out.append(f"{name}: pages {unlisted} marked free but not on the free list")
    shared = sorted(p for p, c in Counter(held).items() if c > 1)
    if shared:
        out.append(f"{name}: pages {shared} held twice")
    both = sorted(set(held) & listed)
    if both:
        out.append(f"{name}: pages {both} held and listed free")
    leaked = [p for p in range(first, n) if busy[p] and p not in set(held)]
    if leaked:
        out.append(f"{name}: pages {leaked} marked in use, held by no block or load")
    return out


def pages(h: Harness) -> list[str]:
    """The SWA pages and the host slots as partitions (the caller holds the cache's lock)."""
    v = h.view
    m, t = v.meta, v.tiers
    live = list(v.index.values())
    loads = [j for _, j in v.jobs() if getattr(j, "kind", "") == "load"]
    swa = [int(p) for r in live for p in m.swa_pages[r]]
    swa += [int(p) for j in loads for p in j.swa_pages]
    host = [int(m.hslot[r]) for r in live if m.hslot[r] >= 0]
    return partition("SWA pages", t.swa_pool, swa) + partition("host slots", t.host_slots, host)
