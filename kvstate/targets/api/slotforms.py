"""A request action fired through ``TestHooks.act`` with its slot in every form.

``act`` (kvstate/targets/api/single.py) names a request slot by a plain int.  The request
table's slot argument also takes a NumPy integer (never a bool: the rule of
``kvstate.impl.args.integer``) and refuses anything else, or an index outside the slots, with
``UnknownRequest`` (docs/library.md).  ``slot_forms`` fires, on an idle slot, each request
action of the table that takes the slot alone and whose guard the model refuses there:

* with the slot as an int and as ``np.int64``: the same documented refusal, word for word;
* with the slot out of range, negative, a bool or a string: ``UnknownRequest``;

each changing nothing (the whole observation compared before and after).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kvstate.spec.table import ParamKind
from kvstate.targets.api.declare import OpDecl


def _refused_here(h: Any, r: int) -> list[str]:
    """The request actions of the slot alone that the model refuses on slot ``r``."""
    out = []
    for a in h.table.actions:
        if [p.kind for p in a.params] == [ParamKind.REQ]:
            if h.machine.failed_conjuncts(h.model, a, {"r": r}):
                out.append(a.name)
    return out


def _outcome(h: Any, name: str, slot: Any) -> tuple[str, str]:
    from kvstate.impl.errors import KVStateError

    try:
        h.hooks.act(name, slot)
    except KVStateError as exc:
        return type(exc).__name__, str(exc)
    return "performed", ""


def do_slot_forms(h: Any, o: Any) -> int | None:
    h.call_override = "read"  # every form is refused: nothing may change
    if h.threads:
        return None
    idle = [r for r, s in enumerate(h.view.slots[: h.R]) if s.request is None]
    if not idle:
        return None
    r = idle[0]
    before = h.observe()
    for name in _refused_here(h, r):
        plain = _outcome(h, name, r)
        forms = {"np.int64": _outcome(h, name, np.int64(r))}
        for label, bad in (
            ("out of range", h.R),
            ("negative", -1),
            ("a bool", True),
            ("a str", "0"),
        ):
            forms[label] = _outcome(h, name, bad)
        wrong = {
            k: v
            for k, v in forms.items()
            if (v != plain if k == "np.int64" else v[0] != "UnknownRequest")
        }
        if plain[0] == "performed" or wrong:
            raise h.fail(
                "slot-forms",
                [name],
                f"{o.render()}: {name} on idle slot {r} ({plain[0]}: {plain[1]}); other forms "
                f"of the slot: {wrong}",
            )
        h.cov.add(f"check: {name}'s slot forms")
    after = h.observe()
    if after != before:
        changed = sorted(k for k in before if before[k] != after.get(k))
        raise h.fail("slot-forms", ["changed"], f"{o.render()}: refusals changed {changed}")
    return None


# scripted only (kvstate/targets/api/slotsfull.py's walk): the declarations' form is kvstate/targets/api/declare.py's
DECLS: tuple[OpDecl, ...] = (OpDecl("slot_forms", do_slot_forms, "read", rule=False),)
