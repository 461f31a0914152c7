"""The recovery projection and plan: the state once the recovery pipelines have run, from
the table's own transitions, and the jobs that get there.

The table says how its pipelines run (``Table.recovery``: the transitions, in order, the guard
conjuncts that only delay one, the ones the recovery fires itself, the pipeline variables and
what a job on each pipeline restores).  Nothing here restates a guard, an effect or a phase set:

* the shortcut (:meth:`Projector.idle`: no block has a recovery transition enabled) is the
  disjunction of those transitions' guards, compiled into one loop over the blocks;
* the projection applies the transitions' own updates (``spec.apply``) on a one-block state;
* the plan reads the pipelines each transition leaves: a fired transition is a step to run, a
  job that was already running when the projection started and ends in it is a step to wait on.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from kvstate.spec.apply import apply, guard
from kvstate.spec.phases import Pipe
from kvstate.spec.state import ConcreteState, initial_values, req_var_names
from kvstate.spec.table import Scope, Table

from .coordinator import HitSearch
from .errors import InternalError
from .guards import Guards
from .meta import BlockMeta

# per block: the transitions applied, each with the pipeline variables' values it leaves
Trace = dict[int, list[tuple[str, tuple[int, ...]]]]


@dataclass(frozen=True)
class RecoveryStep:
    block: int  # chain block index
    rid: int
    state: str  # the cache state it restores (``Table.recovery.restores`` of its pipeline)
    pipeline: Pipe
    action: str  # a fired transition to run, or (``wait``) the transition that ends a job
    wait: bool = False  # a job already running: the plan waits for it


@dataclass(frozen=True)
class RecoveryPlan:
    steps: tuple[RecoveryStep, ...] = ()
    target: int = 0  # hit length the plan recovers to
    search: HitSearch | None = None  # the search on the projected state
    notes: tuple[str, ...] = field(default=())

    def by_state(self) -> dict[str, list[RecoveryStep]]:
        """The steps grouped by the state they restore (e.g. ``"Indexer State"``), in plan
        order: which of the five states a hit waits for."""
        out: dict[str, list[RecoveryStep]] = {}
        for s in self.steps:
            out.setdefault(s.state, []).append(s)
        return out

    def __bool__(self) -> bool:
        return bool(self.steps)


class Projector:
    """One table's recovery projection over the implementation's block records."""

    def __init__(self, table: Table, guards: Guards, records: Any) -> None:
        self.table = table
        self.records = records  # the record-indexed state the compiled guards read
        rec = table.recovery
        self.actions = [table.action(a) for a in rec.transitions] if rec is not None else []
        self.fired = frozenset(rec.fired) if rec is not None else frozenset()
        self.pipes = rec.pipes if rec is not None else ()
        self.restores = dict(rec.restores) if rec is not None else {}
        deferred = rec.deferred if rec is not None else ()
        self.deferred = {
            a.name: frozenset(c for n, c in deferred if n == a.name) for a in self.actions
        }
        # each transition's guard, its deferred conjuncts aside, chosen once (spec.apply.guard)
        self._guards = [(a, guard(a, self.deferred[a.name])) for a in self.actions]
        parts = tuple((a.name, self.deferred[a.name]) for a in self.actions)
        # the shortcut: one compiled loop, any transition enabled at any block (None: a guard
        # did not compile to such a loop, and the projection runs in full)
        self._enabled = guards.enabled_test(parts) if parts else None
        self._base = initial_values(table, 1)
        self._req_names = req_var_names(table)
        self.columns = [v.name for v in table.vars if v.scope is Scope.BLOCK and not v.ghost]

    def idle(self, meta: BlockMeta, rids: Sequence[int]) -> bool:
        """The fast test: at no block of ``rids`` (corrupt ones aside: they are not
        recovered) is a recovery transition enabled, so the pipelines would change nothing.
        The projection itself is its oracle (tests/impl/test_impl_projection.py)."""
        if not self.actions:
            return True
        enabled = self._enabled
        if enabled is None:
            return False
        corrupt, start = meta.corrupt, 0
        while True:  # (a corrupt block found enabled is skipped: scan on after it)
            k = enabled(self.records, rids if start == 0 else rids[start:])
            if k < 0:
                return True
            if not corrupt[rids[start + k]]:
                return False
            start += k + 1

    def project(
        self,
        meta: BlockMeta,
        rids: Sequence[int],
        *,
        shortcut: bool = True,
        trace: Trace | None = None,
    ) -> dict[str, dict[int, int]]:
        """The metadata the recovery pipelines will produce for ``rids``: each block (not
        corrupt) run through the table's recovery transitions (each applied while its guard
        holds, the deferred conjuncts aside) on a one-block state -- so a disk load comes back
        in the file's stored form, without indexer pages and (under the zero-SWA policy)
        without its window, and a rebuild brings the indexer in sync, exactly as the table
        says.  Returns ``field -> {rid: value}`` for the block columns that change (empty:
        none); into ``trace`` (when given), per block the transitions applied, each with the
        pipeline variables' values it leaves: the recovery plan's input."""
        if shortcut and self.idle(meta, rids):
            return {}
        limit = meta.load_steps + 2 * len(self.actions)
        out: dict[str, dict[int, int]] = {}
        for i in rids:
            if meta.corrupt[i]:
                continue
            vals = dict(self._base)
            before = {name: getattr(meta, name)[i] for name in self.columns}
            for name, v in before.items():
                vals[name] = (v,)
            s = ConcreteState(vals, 1, self.table.consts, self._req_names)
            params = {"b": 0, "a": before.get("addr", 0), "f": meta.disk_fmt[i]}
            p = SimpleNamespace(**params)
            for _ in range(limit):
                a = next((a for a, test in self._guards if test(s, p)), None)
                if a is None:
                    break
                s = apply(a, s, params)
                if trace is not None:
                    left = tuple(int(getattr(s, p)[0]) for p in self.pipes)
                    trace.setdefault(i, []).append((a.name, left))
            else:  # pragma: no cover: an internal invariant (the table's recovery steps terminate)
                raise InternalError(f"recovery of record {i} did not settle in {limit} steps")
            for name in self.columns:
                after = getattr(s, name)[0]
                if after != before[name]:
                    out.setdefault(name, {})[i] = int(after)
        return out

    def plan(
        self, meta: BlockMeta, rids: Sequence[int], blocks: int, trace: Trace
    ) -> list[RecoveryStep]:
        """The jobs that bring the first ``blocks`` chain blocks to the projected state: each
        fired transition the projection applied, on the pipeline it starts (or, ending a job,
        the one it ends), and a wait for each job already running that the projection saw
        end.  Each is labelled with the cache state its pipeline restores."""
        steps: list[RecoveryStep] = []
        pipes = self.pipes
        for b in range(min(blocks, len(rids))):
            i = rids[b]
            now = [int(getattr(meta, p)[i]) for p in pipes]
            running = [v != Pipe.NONE for v in now]  # jobs running before the projection
            for a, left in trace.get(i, ()):
                for k, (old, new) in enumerate(zip(now, left, strict=True)):
                    if old == new:
                        continue
                    pipe = new if new != Pipe.NONE else old
                    if a in self.fired:
                        steps.append(RecoveryStep(b, i, self.restores[pipe], Pipe(pipe), a))
                    elif new == Pipe.NONE and running[k]:
                        steps.append(RecoveryStep(b, i, self.restores[old], Pipe(old), a, True))
                    running[k] = False
                now = list(left)
        return steps
