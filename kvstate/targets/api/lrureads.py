"""The recency lists the inspection view shows, against the documented orders.

``cache.inspect()`` shows the library's own recency lists: ``lru`` (the device tier's),
``host_lru`` and ``disk_lru`` (record ids, least recently used first).  The order check
(:mod:`kvstate.targets.api.orders`) keeps the documented orders of the chain's blocks from the
table actions that explain each call, and checks a call's *picks* against them; a list that
drifted from them shows only when a later pick goes wrong, and a read of the list that answers
wrongly never.  :class:`RecencyReads`, after every call (once the order check has walked it),
requires each list, restricted to the chain's blocks the reference list holds too, to be in
the reference's order, and every chain block the list holds to be in the model's phase of its
tier (``CKV.READY``, ``HOST``, ``DISK``).  Disk blocks a restart found have no known order
among themselves (the order check's ``unordered``): they are left out of the disk list's order.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvstate.spec.phases import CKV
from kvstate.spec.state import ConcreteState
from kvstate.targets.api.base import CallCheck
from kvstate.targets.api.orders import OrderHook

Step = tuple[str, dict[str, int]]
_LISTS = (("lru", "dev", CKV.READY), ("host_lru", "host", CKV.HOST), ("disk_lru", "disk", CKV.DISK))


class RecencyReads(CallCheck):
    def after(
        self, h: Any, o: Any, before: ConcreteState, steps: Sequence[Step], end: ConcreteState
    ) -> None:
        if h.threads or end is None:
            return
        ref = next((c.check for c in h.checks if isinstance(c, OrderHook)), None)
        if ref is None:
            return
        block_of = {rid: b for b, rid in enumerate(h.rids)}
        ck = end.values["ckv"]
        bad = []
        with h.view.lock:
            shown = {name: getattr(h.view, name) for name, _, _ in _LISTS}
        for name, attr, phase in _LISTS:
            got = [block_of[r] for r in shown[name] if r in block_of]
            wrong = [b for b in got if ck[b] != phase]
            if wrong:
                bad.append(f"{name} holds blocks {wrong}, not {phase.name} in the model")
            want: list[int] = getattr(ref, attr)
            skip = ref.unordered if attr == "disk" else set()
            seen = [b for b in got if b in want and b not in skip]
            order = [b for b in want if b in seen]
            if seen != order:
                bad.append(f"{name} shows the chain's blocks in the order {seen}, not {order}")
        if bad:
            raise h.fail("recency-read", [o.name], f"after {o.render()}: " + "; ".join(bad))
        h.cov.add("check: recency lists against the documented orders")
