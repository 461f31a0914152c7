"""Witness: the index full of records, its tombstones purged and their record ids reused.

The block index keeps a record for every key it has seen, FREE ones (evicted, never stored) on
the tombstones, up to a bound (``BlockStore.max_records``, a multiple of the pools' sizes);
past it, each new key purges the oldest tombstone: the record is forgotten (its key, its claim
on a device slot, the addresses a captured CUDA graph recorded) and its id reused for the new
key.  The random walk's prompts are the chain and two other namespaces' copies of it, a few
dozen keys: the bound is never met, and a purge that forgets too little (a claim left on a
slot, a graph address carried over to the key that reuses the id) is never run.

Here the chain is first taken to disk (its records stay out of the tombstones: a purge never
forgets a block the cache still holds), requests in ever new namespaces store ``N`` blocks
each (a graph is captured after the first two, whose records are the first purged) until the
index has passed its bound several blocks over; then the chain is hit from disk and the graph replayed.  What is checked is the harness's own,
after every step: the device slots' claims (:mod:`kvstate.targets.api.poolstate`: a forgotten
record claims nothing), the graph's phase and addresses against the model, every read's bytes.
"""

from __future__ import annotations

from typing import Any

from kvstate.targets.api.base import op
from kvstate.targets.api.declare import OpDecl

# requests in namespaces of their own, each N new keys; the index's bound is
# 4 * (device + host + disk blocks) + 64 records (impl/core.py), 112 at the harness's pools:
# enough of them to pass it at N = 4 and to keep purging for a few more
NAMESPACES = 32


def walks(N: int, L: int, lease_max: int) -> dict[str, list[Any]]:
    full = N * L + 1
    to_disk = [
        op("request", i=0, n=full, life=1),
        op("admit", i=0),
        op("use", i=0),
        op("finish", i=0),
        op("tick", t=lease_max),
        op("offload", n=N),
        op("drain"),
        op("spill", n=N),
        op("offload", n=N),
        op("drain"),
        op("spill", n=N),
    ]
    churn = [
        s
        for ns in range(2, 2 + NAMESPACES)
        for s in (op("foreign", ns=ns, n=full), op("tick", t=2))
    ]
    return {
        "the index past its bound: tombstones purged, their ids reused": [
            *to_disk,
            *churn[:4],  # the first records to be purged exist when the graph is captured
            op("capture"),
            *churn[4:],
            op("replay"),
            op("request", i=1, n=full, life=1),
            op("admit", i=1),
            op("drain"),
            op("use", i=1),
            op("read", i=1),
            op("finish", i=1),
            op("replay"),
        ]
    }


DECLS: tuple[OpDecl, ...] = ()  # witnesses only: the operations are the library's own
