"""The model's side of what the library shows but no action explains: a state rebuilt from the
library's observation (ghost truth at its initial values), and the state after a process crash
and restart over the same cache directory (``spec/api.py``'s ``RESTART_*``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvstate.spec.api import RESTART_KEEPS, RESTART_PHASE, RESTART_SURVIVES
from kvstate.spec.state import ConcreteState
from kvstate.spec.table import Scope

from .concrete import Machine


def with_ghosts(machine: Machine, observed: Mapping[str, Any]) -> ConcreteState:
    """A model state from what the library shows, ghost truth (which it cannot show) at its
    initial values: enough to search for the steps explaining a change, since guards never
    read a ghost and only non-ghost variables are compared."""
    init = machine.init().values
    vals = {v.name: init[v.name] for v in machine.table.vars if v.ghost}
    vals.update(observed)
    return machine.state(vals)


def after_restart(
    machine: Machine, s: ConcreteState, published: Mapping[int, Mapping[str, int]] | None = None
) -> ConcreteState:
    """The model's state after a process crash and restart over the same cache directory.

    ``published``: per surviving block, the kept variables as its entry was written (a window
    that slid while the block sat on disk is still in the file; without it, the model's
    current values are used)."""
    init = machine.init().values
    vals = s.values
    out = dict(init)
    survivors = [
        b
        for b in range(machine.N)
        if any(all(vals[n][b] == v for n, v in cond.items()) for cond in RESTART_SURVIVES)
    ]
    for name in ("ckv", *RESTART_KEEPS):
        col = list(out[name])
        for b in survivors:
            pub = (published or {}).get(b, {})
            col[b] = RESTART_PHASE if name == "ckv" else pub.get(name, vals[name][b])
        out[name] = tuple(col)
    if "nfree" in out:
        out["nfree"] = machine.N - len(survivors)
    # Ghost truth survives with the entry: what a surviving block holds (its content identity,
    # occupant, what its window and tail were built from) is what its file holds, and every
    # identity handed out stays handed out.  The ghosts that mirror a mechanism variable (where
    # the bytes are, their form, the chunks still missing) follow the restarted values.
    table = machine.table
    k = table.consts
    for v in table.vars:
        if not v.ghost:
            continue
        if v.scope is Scope.GLOBAL:
            out[v.name] = vals[v.name]
        elif v.scope is Scope.BLOCK:
            col = list(out[v.name])
            for b in survivors:
                col[b] = vals[v.name][b]
            out[v.name] = tuple(col)
    for ghost, mirror in (("at", "addr"), ("form", "fmt"), ("promised", "lease")):
        if ghost in out and mirror in out:
            out[ghost] = tuple(out[mirror])
    if "missing" in out and "prog" in out:
        out["missing"] = tuple(k.load_steps - x for x in out["prog"])
    return machine.state(out)
