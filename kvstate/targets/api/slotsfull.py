"""An admission when every request slot is busy: the request table's exhaustion.

The harness holds at most as many requests as the cache has request slots, so an admission
never found them all taken.  ``admit_full`` admits one request more while every slot is busy
(the harness's requests admitted and not yet finished): the documented ``OutOfCapacity``
("no free slot", docs/library.md) must be raised, nothing may change (the harness's refusal
check), and the request must hold no slot afterwards (it may be admitted once one frees).
The table agrees: its ``admit`` guard holds on no slot of the model.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kvstate.targets.api.base import NAMESPACE, op
from kvstate.targets.api.declare import OpDecl


def do_admit_full(h: Any, o: Any) -> int | None:
    from kvstate.impl.errors import OutOfCapacity

    h.call_override = "read"  # refused: nothing may change
    if h.threads or any(s.request is None for s in h.view.slots):
        return None
    admit = h.table.action("admit")
    free = [
        r for r in range(h.R) if not h.machine.failed_conjuncts(h.model, admit, {"r": r, "t": 1})
    ]
    if free:
        return None  # a slot the table would admit into (the harness's own view says busy)
    req = h.cache.request(np.array(h.tokens[: h.L + 1], dtype=np.int64), namespace=NAMESPACE)
    try:
        h.cache.admit(req)
    except OutOfCapacity:
        if req.slot is not None:
            raise h.fail(
                "slots-full", ["admit"], f"{o.render()}: refused, yet the request holds a slot"
            ) from None
        h.cov.add("check: an admission with every request slot busy")
        raise
    except Exception as exc:  # another error, documented or not: not the one documented here
        raise h.fail(
            "slots-full",
            ["admit"],
            f"{o.render()}: every request slot busy, admit raised {type(exc).__name__}: {exc} "
            "(docs/library.md: OutOfCapacity)",
        ) from exc
    raise h.fail("slots-full", ["admit"], f"{o.render()}: admitted with every request slot busy")


def walks(N: int, L: int, lease_max: int) -> dict[str, list[Any]]:
    return {
        "an admission with every request slot busy": [
            op("slot_forms"),  # (kvstate/targets/api/slotforms.py: while the slots are idle)
            op("request", i=0, n=L + 1, life=2),
            op("admit", i=0),
            op("request", i=1, n=2 * L + 1, life=2),
            op("admit", i=1),
            op("admit_full"),
            op("use", i=1),
            op("admit_full"),
            op("finish", i=1),
            op("abort", i=0),
        ]
    }


# scripted only (the walk above): the declarations' form is kvstate/targets/api/declare.py's
DECLS: tuple[OpDecl, ...] = (OpDecl("admit_full", do_admit_full, "read", rule=False),)
