"""Every remote load's outcome explained by the remote table (``spec/default/remote.py``).

The harness explains each call of a cache with a remote tier by the default table (to which a
remote load is a disk load).  This check replays the same explanation on the remote table, in
lockstep, with the store's own state (``remote``, ``rmac`` and the ghost ``scid``/``forged``)
kept between calls and changed only by the store's actions the fault operations perform
(:mod:`kvstate.targets.api.remote`).  Each step is taken by the remote table's action that
agrees with it on the default table's variables, the remote table's own actions first: a spill
is ``rspill``, a remote load's chunk ``rload_chunk`` (guarded by ``authenticated``), its end
``rload_done`` (guarded by ``complete``).  A step no action of the remote table takes (a chunk
landed while the store's bytes no longer verify), or a state that breaks one of the remote
table's invariants (``remote_truth``), is a finding.  Nothing here names a guard: the remote
table's guards decide, and its refusals are quoted in the finding.

Content identities are names, numbered in one sequence (``wseq``); the store's writers take
names from it too (``remote_overwrite``: bytes no content of the cache is), which the default
model never sees.  So the two are compared up to a renaming: every name the default model gave
is the same in the remote table's state, and the names the store's writers took (the store's
identities above the model's ``wseq``; ``wbump`` of them) are kept above every name the model
gives, past and future.  A step is taken with the writers' names moved up by the names the
default model's step gives, from the model's own ``wseq``: the content a cache action writes
gets the name the default model gives it, never one a writer's bytes already carry.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvstate.model.concrete import GuardError, Machine
from kvstate.spec.default.remote import REMOTE_VARS, environment_actions, remote_table
from kvstate.spec.state import ConcreteState
from kvstate.spec.table import Table
from kvstate.targets.api.base import CallCheck, Step

_MACHINES: dict[tuple[str, int], Machine] = {}
STORE_ACTIONS = frozenset(a.name for a in environment_actions())  # the store's own actions
REMOTE_NAMES = tuple(v.name for v in REMOTE_VARS)
STORE_IDENTITY = "scid"  # the remote variable that holds a content identity (the store's bytes')


def remote_machine(table: Table, N: int) -> Machine:
    """The remote table over ``table``'s geometry, one machine per (geometry, pool) and process."""
    key = (table.geometry.name, N)
    m = _MACHINES.get(key)
    if m is None:
        m = _MACHINES[key] = Machine(remote_table(table.geometry), N)
    return m


class RemoteOutcomes(CallCheck):
    """The remote table in lockstep with the harness's model (see the module's docstring)."""

    def __init__(self, h: Any) -> None:
        self.m = remote_machine(h.table, h.N)
        mine = frozenset(a.name for a in h.table.actions)
        self.own = tuple(a.name for a in self.m.table.actions if a.name not in mine | STORE_ACTIONS)
        self.params = {a.name: tuple(q.name for q in a.params) for a in self.m.table.actions}
        self.shared = tuple(h.machine.init().values)
        init = self.m.init().values
        self.rvars = {n: init[n] for n in REMOTE_NAMES}
        self.wbump = 0  # identities the store's writers handed out (remote_overwrite)
        self.top = 0  # the default model's wseq the store's state was kept over

    def lift(self, s: ConcreteState) -> ConcreteState:
        """The remote table's state over the default model's ``s`` and the store's state (the
        writers' names moved above the names ``s`` gave since it was kept)."""
        w = s.values["wseq"]
        return self._over(s, self.rvars, self.top, w - self.top, w + self.wbump)

    def _over(
        self, d: ConcreteState, rvars: dict[str, Any], top: int, up: int, wseq: int
    ) -> ConcreteState:
        """``d``'s values with the store's ``rvars`` (kept over the model's ``wseq`` ``top``),
        the writers' names (those above ``top``) moved up by ``up``, and ``wseq``."""
        vals = dict(d.values)
        vals.update(rvars)
        vals[STORE_IDENTITY] = tuple(x + up if x > top else x for x in rvars[STORE_IDENTITY])
        vals["wseq"] = wseq
        return self.m.state(vals)

    def keep(self, h: Any, t: ConcreteState, s: ConcreteState) -> None:
        self.rvars = {n: t.values[n] for n in REMOTE_NAMES}
        self.top = s.values["wseq"]
        self.wbump = t.values["wseq"] - s.values["wseq"]
        bad = self.m.violations(t)
        if bad:
            raise h.fail(
                "remote-invariant",
                [v.invariant for v in bad][:1],
                f"the remote table's invariant broken: {', '.join(map(str, bad))}",
            )

    def store_acts(self, h: Any, name: str, **p: int) -> list[int]:
        """The store performed its action ``name`` (a fault operation drove it through the
        server): the blocks whose remote copy no longer verifies because of it."""
        s = self.lift(h.model)
        t = self.m.step(s, name, p)
        self.keep(h, t, h.model)
        h.cov.add(f"remote: {name}")
        return [
            b
            for b in range(h.N)
            if s.values["rmac"][b] != t.values["rmac"][b] and t.values["remote"][b]
        ]

    def verifies(self, b: int) -> bool:
        return bool(self.rvars["rmac"][b])

    def after(
        self, h: Any, o: Any, before: ConcreteState, steps: Sequence[Step], end: ConcreteState
    ) -> None:
        s, d = self.lift(before), before
        for name, p in steps:
            d2 = h.machine.step(d, name, p)
            s = self._step(h, o, s, d, d2, name, p)
            d = d2
        self.keep(h, s, end)

    def _step(
        self,
        h: Any,
        o: Any,
        s: ConcreteState,
        d: ConcreteState,
        d2: ConcreteState,
        name: str,
        p: dict[str, int],
    ) -> ConcreteState:
        """The remote table's action that takes the default model's step ``d`` -> ``d2`` from
        ``s`` (the remote state over ``d``), and the state it leads to (over ``d2``)."""
        # from the model's own wseq (the names the step gives are the model's), the writers'
        # names moved above them (``s`` agrees with ``d`` on every other shared variable)
        w, w2 = d.values["wseq"], d2.values["wseq"]
        base = self._over(d, {n: s.values[n] for n in REMOTE_NAMES}, w, w2 - w, w)
        refused: list[str] = []
        for cand in (*self.own, name):
            if cand != name and set(self.params[cand]) != set(p):
                continue
            try:
                t = self.m.step(base, cand, p)
            except GuardError as exc:
                refused.append(f"{cand}: {exc}")
                continue
            if all(t.values[v] == d2.values[v] for v in self.shared):
                if cand != name:
                    h.cov.add(f"remote: {cand}")
                return self.m.state({**t.values, "wseq": t.values["wseq"] + self.wbump})
        raise h.fail(
            "remote-unexplained",
            [name],
            f"{o.render()}: the step {name}{p} is taken by no action of the remote table "
            f"(spec/default/remote.py) from the store's state "
            f"rmac={list(s.values['rmac'])} remote={list(s.values['remote'])}:\n  "
            + "\n  ".join(refused),
        )
