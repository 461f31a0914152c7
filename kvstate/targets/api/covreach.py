"""Witnesses of paths the other walks leave out, each checked by the harness's own checks.

* The engine's report that a transfer failed: ``act_step``'s world :data:`~kvstate.targets.api.
  stepwise.FAIL` fires ``load_fail`` by name through ``test_hooks().act`` at a disk load and at
  a host load (``impl/recovery.py``'s ``load_fail``: its guard, then the failure's effects);
  the harness explains the change by ``load_fail`` alone and the admission waiting on the load
  truncates at ``use`` (the read checks compare what it serves with the request's tokens).
"""

from __future__ import annotations

from typing import Any

from kvstate.targets.api.base import chain, op
from kvstate.targets.api.stepwise import FAIL


def walks(N: int, L: int, lease_max: int) -> dict[str, list[Any]]:
    c = chain(N, L, lease_max)
    out: dict[str, list[Any]] = {}
    for tier, there, blocks in (("disk", c.to_disk, (0, 1)), ("host", c.to_host, (0,))):
        for b in blocks:  # (a host load's first block alone runs before the drain)
            out[f"the engine fails block {b}'s {tier} load by name (load_fail)"] = [
                *there,
                op("request", i=1, n=c.full, life=1),
                op("admit", i=1),
                op("act_step", b=b, k=0),
                op("act_step", b=b, k=FAIL),
                op("drain"),
                op("use", i=1),
                op("read", i=1),
                op("finish", i=1),
            ]
    return out
