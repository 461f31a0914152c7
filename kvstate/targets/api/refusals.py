"""A documented refusal must be one the table requires, and a run must reach what it checks.

The harness checks that a call which raised a documented refusal (``Refused`` and its kinds)
changed nothing.  That alone accepts a library that refuses what the table allows: a mutant
whose ``admit`` refuses every idle request passes a ci run whose every admission is refused.
:class:`RefusalRequired` asks the model (``model/apirefuse.py``) whether the table would
refuse the call in the state before it: a call with a way through its patterns whose every
guard holds is not one the library may refuse (a refusal naming an action the call's patterns
never take comes from a part of the call outside the model, and is left alone).  ``NotReady`` is left out: it says "not yet"
(a recovery job still runs, the splice check of a restored tail among them, which the table
does not model), and a ``use`` that gives up waiting is checked by ``kvstate/targets/api/ready.py``.
:func:`vacuous` fails a run whose own counters show it never reached what it checks.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvstate.model.apirefuse import a_way
from kvstate.targets.api.base import CallCheck


class RefusalRequired(CallCheck):
    def refused(self, h: Any, o: Any) -> None:
        from kvstate.impl.errors import NotReady, Refused

        exc, call = h.refusal, h.refusal_call
        nfa = h.explainer.nfas.get(call)
        if not isinstance(exc, Refused) or nfa is None or h.threads:
            return
        if isinstance(exc, NotReady):
            return  # "not yet": a wait, not a refusal of the call (see the module doc)
        if exc.action not in {tok for edges in nfa[0].edges for tok, _ in edges}:
            return  # refused in a part of the call the mapping leaves out (``foreign``'s own
            # admission: another namespace's request, outside the modelled chain)
        req = None
        if "i" in o.inputs:
            lv = h.live[o.arg("i")]
            if lv is not None and lv.req.slot is not None:
                req = lv.req.slot.index
            elif call != "admit":
                h.cov.add("check: refusals the table requires")
                return  # the call names no request slot: the table has no action for it
        way = a_way(h.explainer, call, h.model, req=req, ticks=h._ticks(call, o))
        if way is not None:
            raise h.fail(
                "refusal-not-required",
                [f"{o.name}:{type(exc).__name__}"],
                f"{o.render()} raised {type(exc).__name__}: {exc}, but the table allows "
                f"'{call}' here: {' '.join(n for n, _ in way) or '(nothing to do)'} "
                f"({', '.join(f'{n}{p}' for n, p in way)})",
            )
        h.cov.add("check: refusals the table requires")


def vacuous(counts: Mapping[str, int], calls: Mapping[str, str], empty: set[str]) -> list[str]:
    """What a run that found nothing never reached, from its own counters: an operation whose
    every call was refused (its table call has no empty way, so none was a success doing
    nothing), and a run that used no hit or checked no read (its bytes unchecked).
    ``calls``: operation -> its table call; ``empty``: calls whose patterns accept nothing."""
    out = []
    for op in sorted({k[8:].split(":")[0] for k in counts if k.startswith("refused ")}):
        if counts.get(f"call {op}", 0) == 0 and calls.get(op) not in empty:
            out.append(f"every {op} was refused ({_refusals(counts, op)})")
    for path in ("hits used", "reads checked"):
        if counts.get(path, 0) == 0:
            out.append(f"{path} 0")
    return out


def _refusals(counts: Mapping[str, int], op: str) -> str:
    return ", ".join(
        f"{k[8:]} {v}" for k, v in sorted(counts.items()) if k.startswith(f"refused {op}:")
    )
