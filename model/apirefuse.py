"""Would the table refuse a call?  A way through a call's patterns whose every guard holds.

A library may refuse a public call only where the table refuses it: where no sequence of the
call's patterns (``spec/api.py``) can be taken from the current state, each action's guard
holding when it fires.  :func:`a_way` searches for one such sequence on the reference model
(depth first, few states: the first way found is enough); ``None`` means the guards refuse
every way the call could go, so a refusal is required.  The search is over the table's own
actions and parameter domains, so no guard is written here.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from kvstate.spec.state import ConcreteState
from kvstate.spec.table import Action, ParamKind

from .apimap import Explainer, _frozen_items

Step = tuple[str, dict[str, Any]]


def _params(
    ex: Explainer, a: Action, req: int | None, ticks: int | None
) -> Iterator[dict[str, Any]]:
    """The action's parameters, the acting request and the call's ticks binding held fixed."""
    fixed = {
        p.name: v
        for p in a.params
        for v in (
            (req if p.kind is ParamKind.REQ else ticks if p.kind is ParamKind.TICKS else None),
        )
        if v is not None
    }
    for params in ex.m.param_space(a):
        if all(params[k] == v for k, v in fixed.items()):
            yield params


def a_way(
    ex: Explainer,
    call: str,
    before: ConcreteState,
    *,
    req: int | None = None,
    ticks: int | None = None,
    max_nodes: int = 400,
) -> list[Step] | None:
    """A word of ``call``'s patterns the model can take from ``before`` (the empty word where
    the patterns accept it), or ``None`` when the guards refuse every way within the bound.
    ``req``: the request slot the call acts on (``None``: any); ``ticks``: the value of every
    ticks parameter (the call's binding, ``ApiCall.ticks``)."""
    nfa, start, accept = ex.nfas[call]
    m = ex.m
    stack: list[tuple[ConcreteState, frozenset[int], list[Step]]] = [
        (before, nfa.closure([start]), [])
    ]
    seen: set[tuple[Any, frozenset[int]]] = set()
    nodes = 0
    while stack and nodes < max_nodes:
        s, states, path = stack.pop()
        if accept in states:
            return path
        key = (_frozen_items(s.mapping), states)
        if key in seen:
            continue
        seen.add(key)
        nodes += 1
        kids = [
            (m.step(s, a, p), nxt, [*path, (name, p)])
            for name, nxt in nfa.moves(states).items()
            for a in (ex.table.action(name),)
            for p in _params(ex, a, req, ticks)
            if m.is_enabled(s, a, p)
        ]
        stack.extend(reversed(kids))  # the first parameters are tried first
    return None
