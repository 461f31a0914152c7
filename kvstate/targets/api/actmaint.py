"""The maintenance actions fired by record through ``TestHooks.act``: offload, spill, drop.

``act`` (kvstate/targets/api/single.py) fires the store's and the request table's actions by
name and leaves the pipelines' out (a job steps them).  The maintenance calls' own actions --
those of ``spec/api.py``'s ``offload``, ``spill`` and ``drop`` calls -- are not job steps: an
engine that manages its tiers block by block fires them on the block it chooses, and the
library's per-record paths behind them (``Recovery.offload``: with every host slot taken, the
LRU host block the table lets spill goes to disk first; ``Recovery.spill``, ``Recovery.drop``)
are reached by nothing else.  ``act_maint(a, b)`` fires the ``a``-th of those actions on block
``b``:

* performed, its change is explained by the call of the same name (``offload`` may spill and
  drop first to make room), an explanation that performs the action on block ``b``;
* refused (``Refused``), nothing changes and the table's guard refuses the action on ``b``
  too; ``OutOfCapacity`` (no host slot and no block the table lets spill: none of the chain's
  may, or the room is refused) and a disk write's failure are the documented exhaustion,
  nothing changed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hypothesis import strategies as st

from kvstate.spec.api import API
from kvstate.spec.state import ConcreteState
from kvstate.targets.api.base import CallCheck, chain, op
from kvstate.targets.api.declare import OpDecl

Step = tuple[str, dict[str, int]]


def _words(call: str) -> set[str]:
    """The table actions a ``spec/api.py`` call's patterns are made of."""
    words = {t.strip("()*?") for p in API[call].patterns for t in p.split()}
    return {w for w in words if w.isidentifier() and not w.isupper()}


# the maintenance calls: ``offload`` (which makes room first) and those made of its actions
CALLS = tuple(sorted(c for c in API if _words(c) and _words(c) <= _words("offload")))


def actions() -> tuple[str, ...]:
    """The actions the calls are made of, each fired alone."""
    return tuple(sorted(set().union(*(_words(c) for c in CALLS))))


_CHOSEN: dict[int, tuple[Any, tuple[str, int] | None]] = {}  # id(harness) -> (harness, chosen)


def do_act_maint(h: Any, o: Any) -> int | None:
    from kvstate.impl.errors import DiskWriteError, OutOfCapacity, Refused

    h.call_override = "read"  # a refusal: nothing may change
    _CHOSEN.pop(id(h), None)
    if h.threads:
        return None
    names = actions()
    a, b = names[o.arg("a") % len(names)], o.arg("b") % h.N
    try:
        h.hooks.act(a, h.rids[b])
    except (OutOfCapacity, DiskWriteError) as exc:
        spill = h.table.action("spill")
        could = [x for x in range(h.N) if not h.machine.failed_conjuncts(h.model, spill, {"b": x})]
        if isinstance(exc, OutOfCapacity) and could and not h.disk_full:
            raise h.fail(
                "act-no-room",
                [a],
                f"{o.render()}: {a} on block {b} ran out of room ({exc}), "
                f"though the table lets block {could[0]} spill to make it",
            ) from None
        h.cov.add(f"act_maint {a}: out of room")
        raise
    except Refused:
        if not h.machine.failed_conjuncts(h.model, h.table.action(a), {"b": b}):
            raise h.fail(
                "act-refused",
                [a],
                f"{o.render()}: {a} on block {b} was refused, but the table allows it here",
            ) from None
        h.cov.add(f"check: act_maint refused {a}")
        raise
    h.call_override = a if a in CALLS else next(c for c in CALLS if a in API[c].patterns[0])
    _CHOSEN[id(h)] = (h, (a, b))
    h.cov.add(f"act_maint {a}")
    return None


class ActMaintCheck(CallCheck):
    """The explanation of a performed ``act_maint`` performs the action on the block chosen."""

    def after(
        self, h: Any, o: Any, before: ConcreteState, steps: Sequence[Step], end: ConcreteState
    ) -> None:
        got = _CHOSEN.pop(id(h), None)
        if o.name != "act_maint" or got is None or got[0] is not h or got[1] is None:
            return
        a, b = got[1]
        if (a, b) not in [(n, p.get("b")) for n, p in steps]:
            raise h.fail(
                "act-other",
                [a],
                f"{o.render()}: asked {a} on block {b}, the change is explained by {steps}",
            )
        if len(steps) > 1:
            h.cov.add(f"check: act_maint {a} made room first")
        h.cov.add("check: act_maint did the action asked")


def walks(N: int, L: int, lease_max: int) -> dict[str, list[Any]]:
    """With the host tier full (``to_host``), each action on each block: an offload by record
    spills a host block first; the others are refused or done as the table says."""
    c = chain(N, L, lease_max)
    n = len(actions())
    return {
        "the maintenance actions by record, the host tier full": [
            *c.to_host,
            *[op("act_maint", a=a, b=b) for b in range(N) for a in range(n)],
            op("act_maint", a=0, b=0),
        ]
    }


# scripted only (the walk above): the declarations' form is kvstate/targets/api/declare.py's
DECLS: tuple[OpDecl, ...] = (
    OpDecl(
        "act_maint",
        do_act_maint,
        "read",
        lambda s: {"a": st.integers(0, 7), "b": s.block},
        rule=False,
    ),
)
