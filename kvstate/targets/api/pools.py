"""Swarm over the pools' sizes: which pool runs out first, partway through an operation.

The harness's default pools (``ApiHarness._open``: the chain's ``N`` blocks plus two device
slots, ``N`` blocks' SWA pages, two host slots, ``N`` disk entries) make the SWA pages the first
pool to run out.  A pool that runs out *partway* through an operation -- the device slots in
the middle of a store's run or of a recovery's loads, the host slots in an offload, the disk
entries in a spill -- is then rarely met.  ``pools(k)``, an example's first operation (a no-op
anywhere else), reopens the fresh cache with the ``k``-th sizes of :func:`choices`: each makes
another pool the scarce one.  The table's pool is the chain's ``N`` blocks whatever the sizes
(they are the library's, and every call that makes room is explained by ``ROOM``), so the
model and every check are unchanged; the accounting and quiescence checks then see what an
operation cut short left allocated.
"""

from __future__ import annotations

from typing import Any

from kvstate.targets.api.declare import OpDecl


def choices(N: int) -> tuple[dict[str, int], ...]:
    return (
        {},  # the default: the SWA pages run out first
        {"swa_blocks": N + 2},  # pages for every slot: the device slots run out first
        {"device_blocks": N + 1, "swa_blocks": N + 1},  # one slot beside the chain
        {"host_blocks": 1},  # one host slot: offloads wait, spills make room
        {"disk_blocks": N - 1},  # the chain does not fit on disk: spills drop first
    )


def do_pools(h: Any, o: Any) -> int | None:
    if len(h.steps) > 1:  # not the first operation: a running cache is never resized
        h.call_override = "read"
        return None
    sizes = choices(h.N)[o.arg("k") % len(choices(h.N))]
    if sizes:
        h.cache.close()
        h.cache_kwargs.update(sizes)
        h._open()
        for c in h.checks:  # a new cache, as after a restart (its events subscribed again)
            c.restart(h)
        h.cov.add("check: examples with other pool sizes")
    return None


# a fresh cache resized: only the state machine's initializer draws it, as its first
# operation (kvstate/targets/api/machine.py), so it is no rule of its own
DECLS: tuple[OpDecl, ...] = (OpDecl("pools", do_pools, "read", rule=False),)
