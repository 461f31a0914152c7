"""The table's own transition on a concrete state: a guard's conjuncts and an action's updates.

The model steps through the table this way; an implementation that needs to know what a
sequence of transitions *will* produce (the recovery projection: the state once the queued
loads and rebuilds have run) applies the same updates here instead of writing their effects a
second time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from types import SimpleNamespace
from typing import Any

from .state import ConcreteState
from .table import Action, ParamKind


def holds(
    action: Action, state: ConcreteState, params: Mapping[str, Any], skip: Iterable[str] = ()
) -> bool:
    """Do the action's guard conjuncts (but those named in ``skip``) hold?"""
    return guard(action, skip)(state, SimpleNamespace(**params))


def guard(action: Action, skip: Iterable[str] = ()) -> Callable[[ConcreteState, Any], bool]:
    """:func:`holds` as a function of (state, params namespace), its conjuncts chosen once: a
    caller that asks many states (the recovery projection: every transition at every block of a
    prefix) pays for the choice and the namespace once, not per question."""
    skipped = frozenset(skip)
    fns = tuple(c.fn for c in action.guard if c.name not in skipped)

    def test(state: ConcreteState, p: Any) -> bool:
        for fn in fns:
            if not fn(state, p):
                return False
        return True

    return test


def apply(action: Action, state: ConcreteState, params: Mapping[str, Any]) -> ConcreteState:
    """The successor of ``state`` under ``action``'s updates (every update reads the state
    before the step).  The guard is not checked: that is the caller's business (:func:`holds`)."""
    p = SimpleNamespace(**params)
    new = dict(state._v)
    req = state._req_names
    r = next((params[q.name] for q in action.params if q.kind is ParamKind.REQ), None)
    for name, fn in action.updates.items():
        value = fn(state, p)
        if name in req:
            if r is None:
                raise ValueError(
                    f"{action.name} updates request variable {name!r} without a request"
                )
            row = list(new[name])
            row[r] = value
            new[name] = tuple(row)
        else:
            new[name] = value
    return ConcreteState(new, state.N, state.k, req)
