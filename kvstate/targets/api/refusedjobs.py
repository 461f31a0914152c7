"""The pipelines' block actions fired by name where the table refuses them: ``Refused``, nothing
changed.

``act`` (``kvstate/targets/api/single.py``) fires the store's and the request table's actions
by name, and ``act_step`` (``stepwise.py``) a load's *next* action, which the table allows; the
recovery part's own actions (``impl/actions.py``: the loads, offloads, spills, drops and
rebuilds) were never fired where the table refuses them.  Their entry points have paths of
their own before the guard is checked -- a disk load's step reads its chunk, or its window
section, *without* the lock first, and must find the guard refusing there and read nothing
(``DiskReads.read_ahead``, ``read_window_ahead``) -- and an engine driving the cache by the
table's actions (``TestHooks.act``, docs/library.md) reaches them.  ``act_refused(a, b)`` fires
the ``a``-th of those actions at chain block ``b`` where the model refuses it (where the model
allows it, nothing is fired): it must raise ``Refused`` naming the conjuncts the model finds
false there, and change nothing (the harness's refusal check: the state and the events).
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from kvstate.spec.table import ParamKind
from kvstate.targets.api.base import chain, op
from kvstate.targets.api.declare import OpDecl

PART = "recovery"  # impl/actions.py's part of the pipelines' actions
OUTPUTS = (ParamKind.ADDR, ParamKind.FMT)


def actions(table: Any) -> list[Any]:
    """The recovery part's block actions of the table, in the table's order."""
    from kvstate.impl.actions import ACTIONS

    return [
        a
        for a in table.actions
        if ACTIONS[a.name][0] == PART
        and [q.kind for q in a.params if q.kind not in OUTPUTS] == [ParamKind.BLOCK]
    ]


def do_act_refused(h: Any, o: Any) -> int | None:
    from kvstate.impl.errors import KVStateError, Refused

    h.call_override = "read"  # refused: nothing may change
    if h.threads or h.model is None:
        return None
    acts = actions(h.table)
    a = acts[o.arg("a") % len(acts)]
    b = o.arg("b") % h.N
    p = {q.name: (b if q.kind is ParamKind.BLOCK else 0) for q in a.params}
    if h.machine.is_enabled(h.model, a, p):
        return None
    false = h.machine.failed_conjuncts(h.model, a, p)
    try:
        h.hooks.act(a.name, h.rids[b])
    except Refused as exc:
        if exc.action != a.name or (exc.failed and list(exc.failed) != list(false)):
            raise h.fail(
                "act-refused",
                [a.name],
                f"{o.render()}: {a.name} at block {b} raised {exc!r}; the model refuses it "
                f"for {false}",
            ) from exc
        h.cov.add(f"check: act refused {a.name}")
        raise
    except KVStateError as exc:
        raise h.fail(
            "act-refused",
            [a.name],
            f"{o.render()}: {a.name} at block {b} raised {type(exc).__name__} ({exc}); the "
            f"table refuses it here ({', '.join(false)}), which act reports as Refused",
        ) from exc
    raise h.fail(
        "act-not-refused",
        [a.name],
        f"{o.render()}: {a.name} at block {b} was performed, but the table refuses it "
        f"({', '.join(false)})",
    )


def walks(N: int, L: int, lease_max: int) -> dict[str, list[Any]]:
    """Witness: every such action at the chain's last block while the disk loads
    of an admission are under way (before any has stepped)."""
    from kvstate.spec import default_table

    c = chain(N, L, lease_max)
    n = len(actions(default_table()))
    sweep = [op("act_refused", a=a, b=N - 1) for a in range(n)]
    return {
        "the pipelines' actions by name where the table refuses them": [
            *c.to_disk,
            op("request", i=1, n=c.full, life=1),
            op("admit", i=1),
            *sweep,
            op("drain"),
            op("use", i=1),
            op("finish", i=1),
        ]
    }


DECLS = (
    OpDecl(
        "act_refused",
        do_act_refused,
        "read",
        lambda s: {"a": st.integers(0, 15), "b": s.block},
        rule=False,
    ),
)
