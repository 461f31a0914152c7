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


class _Opaque:
    """A block's device address, passed through the projection unread: every use of its value
    (a comparison with anything but itself, arithmetic, a truth test, a hash) raises
    :class:`_ValueRead`.  A projection that finishes with it never read the address, so its
    result holds for every address: the memo's key leaves the address out (the one column that
    differs between the blocks of a recovered prefix; 80 us a block projected one by one, 0.4 s
    of a 1M recovery's admission before its first disk read)."""

    __slots__ = ()

    def _read(self, *_: Any) -> Any:
        raise _ValueRead

    def __eq__(self, other: object) -> bool:  # the address equals itself, whatever it is
        if other is self:
            return True
        raise _ValueRead

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)

    __lt__ = __le__ = __gt__ = __ge__ = _read
    __hash__ = __bool__ = __int__ = __index__ = _read  # type: ignore[assignment]
    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __floordiv__ = __mod__ = _read


class _ValueRead(Exception):
    """A transition read the opaque address's value."""


_ADDR = _Opaque()
_MEMO_MAX = 4096  # distinct one-block states remembered (a prefix has a handful)


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
        # one block's projection by its columns but the address (and its stored form): the
        # columns that change and the transitions applied; None where the transitions read
        # the address or move it (then every such block is projected on its own)
        self._limit = 0  # set per call (the block state's load_steps)
        self._memo: dict[tuple[int, ...], tuple[Any, Any] | None] = {}

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
        self._limit = meta.load_steps + 2 * len(self.actions)
        out: dict[str, dict[int, int]] = {}
        columns, memo = self.columns, self._memo
        for i in rids:
            if meta.corrupt[i]:
                continue
            before = {name: getattr(meta, name)[i] for name in columns}
            key = (*[v for n, v in before.items() if n != "addr"], meta.disk_fmt[i])
            if key in memo:
                got = memo[key]
            else:  # not projected yet: try once with the address opaque
                if len(memo) >= _MEMO_MAX:
                    memo.clear()
                try:
                    got = self._one(i, {**before, "addr": _ADDR}, meta.disk_fmt[i])
                except _ValueRead:
                    got = None
                memo[key] = got
            if got is None:  # the transitions read the address: this block's own projection
                got = self._one(i, before, meta.disk_fmt[i])
            changes, applied = got
            for name, v in changes:
                out.setdefault(name, {})[i] = v
            if trace is not None and applied:
                trace[i] = list(applied)
        return out

    def _one(self, i: int, before: dict[str, Any], fmt: int) -> tuple[Any, Any]:
        """One block's projection: (the columns that change, with their values; the
        transitions applied, each with the pipeline variables' values it leaves)."""
        vals = dict(self._base)
        for name, v in before.items():
            vals[name] = (v,)
        s = ConcreteState(vals, 1, self.table.consts, self._req_names)
        params = {"b": 0, "a": before.get("addr", 0), "f": fmt}
        p = SimpleNamespace(**params)
        applied: list[tuple[str, tuple[int, ...]]] = []
        for _ in range(self._limit):
            a = next((a for a, test in self._guards if test(s, p)), None)
            if a is None:
                break
            s = apply(a, s, params)
            applied.append((a.name, tuple(int(getattr(s, p)[0]) for p in self.pipes)))
        else:  # pragma: no cover: an internal invariant (the table's recovery steps terminate)
            raise InternalError(f"recovery of record {i} did not settle in {self._limit} steps")
        changes = []
        for name in self.columns:  # (the opaque address moved anywhere is a read: _ValueRead)
            after, old = getattr(s, name)[0], before[name]
            if after is not old and after != old:
                changes.append((name, int(after)))
        return tuple(changes), tuple(applied)

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
