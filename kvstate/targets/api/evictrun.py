"""Witnesses of a store run's eviction when the least recently used block may not go.

A store run that needs ``count`` device slots evicts the LRU's first ``count`` blocks in one
step when the table lets every one of them go (``BlockStore._evict_run``), and otherwise one by
one, each time the least recently used block the table lets go (``evict_lru``).  The random
walk meets the fallback only where it runs out of evictable blocks (it stops early); these
walks meet it where it must pass over the LRU's head and evict exactly ``count`` others:

* the chain's first block, stored with the longest lease, is the LRU's head; another
  namespace's request then stores ``N`` blocks behind it (lifetime 1), time passes until
  their leases end but not the chain block's, and a second one needs more slots than are
  free.  The head's ``evict_start`` guard refuses (its lease is live), so the run falls back
  and evicts the other namespace's blocks.  What is checked is the harness's own: the chain
  block stays READY in the model's lockstep (its eviction would not be explained by the
  table: ``evict_start`` refuses it), the pools' accounting, and the documented order over
  the chain's blocks (``kvstate/targets/api/orders.py``);
* the same with the chain's head pinned by a request in use (the guard refuses a pinned
  block whatever its lease), the request finished afterwards and its blocks then hit.
"""

from __future__ import annotations

from typing import Any

from kvstate.targets.api.base import op
from kvstate.targets.api.declare import OpDecl


def walks(N: int, L: int, lease_max: int) -> dict[str, list[Any]]:
    """Witnesses: the run's eviction passes over a protected LRU head (needs ``N >= 3`` blocks
    and a lease longer than the tick that ends a lifetime-1 lease)."""
    if N < 3 or lease_max <= 2:
        return {}
    others = [
        op("foreign", ns=0, n=N * L + 1),  # N blocks behind the chain's head (one slot free)
        op("tick", t=2),  # their leases (lifetime 1) are over; the chain block's is not
        op("foreign", ns=1, n=3 * L + 1),  # three slots needed: two evicted, one by one
    ]
    return {
        "a store run's eviction passes over the LRU head its lease protects": [
            op("request", i=0, n=L + 1, life=lease_max),
            op("admit", i=0),
            op("use", i=0),
            op("finish", i=0),
            *others,
            op("request", i=1, n=L + 1, life=1),
            op("admit", i=1),
            op("use", i=1),
            op("read", i=1),
            op("finish", i=1),
        ],
        "a store run's eviction passes over the LRU head a request pins": [
            op("request", i=0, n=L + 1, life=1),
            op("admit", i=0),
            op("use", i=0),
            op("finish", i=0),
            op("request", i=1, n=L + 1, life=1),
            op("admit", i=1),
            op("use", i=1),  # pins the chain's head (moved to the LRU's end: the only block)
            *others,
            op("read", i=1),
            op("finish", i=1),
        ],
    }


DECLS: tuple[OpDecl, ...] = ()  # witnesses only: the operations are the library's own
