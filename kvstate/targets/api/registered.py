"""Other prompts' blocks registered beside the chain, until no device slot is spare.

``HeterogeneousKVCache.register(chain)`` creates a record for each block of a prefix and
reserves it a preferred device slot (``SlotPool.claim_free``: an unclaimed free slot, or none
when every free slot is claimed), so the blocks' device addresses are distinct and stable from
the start (README: the CUDA-graph block table).  The harness registers only its own chain, no
longer than the device, so the reservation never ran out.  ``register_other(ns)`` registers the
whole chain's tokens in another namespace (``foreign``'s, so its later requests store over
those records); the model's chain is untouched (``spec/api.py``'s ``read``).  Checked at the
call: the records that had no address get, in the chain's order, the unclaimed free slots in
the order ``free_slots()`` lists them, one each, and no address once those are spent; a
record that had one keeps it.  After every operation the pool-state check
(``kvstate/targets/api/poolstate.py``) then holds the claims against the records as they
are stored, evicted and forgotten.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from kvstate.targets.api.base import OTHER_NAMESPACE, op
from kvstate.targets.api.declare import OpDecl


def do_register_other(h: Any, o: Any) -> int | None:
    if h.threads:
        return None
    h.call_override = "read"
    ns = o.arg("ns")
    chain = h.cache.chain(h.tokens[: h.N * h.L], namespace=f"{OTHER_NAMESPACE}-{ns}")
    v = h.view
    index, addr = v.index, v.meta.addr
    had = [addr[index[k]] if k in index else -1 for k in chain.keys]
    spare = list(v.tiers.slots.free_slots()[0])
    rids = h.cache.register(chain)
    addr = v.meta.addr
    want: list[int] = []
    for a in had:
        if a >= 0:
            want.append(a)
        else:
            want.append(spare.pop(0) if spare else -1)
    got = [addr[r] for r in rids]
    if got != want:
        raise h.fail(
            "register",
            ["register_other"],
            f"{o.render()}: the registered blocks' addresses are {got}; with the unclaimed free "
            f"slots {list(v.tiers.slots.free_slots()[0])} left, each block without an address "
            f"takes the next unclaimed one, none when they are spent: {want}",
        )
    h.cov.add("check: registered addresses against the unclaimed slots")
    if -1 in got:
        h.cov.add("registered with no spare slot")
    return None


def walks(N: int, L: int, lease_max: int) -> dict[str, list[Any]]:
    """Witnesses: two other prompts registered (more blocks than device slots), then stored,
    evicted and hit beside the chain."""
    full = N * L + 1
    return {
        "prompts registered past the device's spare slots": [
            op("register_other", ns=0),
            op("register_other", ns=1),
            op("register_other", ns=0),
            op("foreign", ns=1, n=full),
            op("request", i=0, n=full, life=1),
            op("admit", i=0),
            op("use", i=0),
            op("finish", i=0),
            op("foreign", ns=0, n=full),
            op("evict", n=N),
            op("register_other", ns=1),
            op("request", i=1, n=full, life=1),
            op("admit", i=1),
            op("use", i=1),
            op("read", i=1),
            op("finish", i=1),
        ],
    }


DECLS: tuple[OpDecl, ...] = (
    OpDecl(
        "register_other",
        do_register_other,
        "read",
        lambda s: {"ns": st.integers(0, 1)},
        rule=False,  # scripted (the walk above)
    ),
)
