"""The declarative transition table: variables, actions, invariants and the hit rule, as data.

A :class:`Table` is frozen.  It is validated when it is built: every update must be inside its
action's ``modifies`` frame, every name must resolve, every guard must be boolean and every
update must have its variable's type.  Errors name the action or invariant at fault.
``Table.derive`` makes a changed copy (drop a guard conjunct, replace or remove an action), which
is how seeded-bug variants and users' own tables are built without editing the default.
The parts a table is made of are declared in :mod:`kvstate.spec.parts` and re-exported here.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from .errors import SpecError
from .geometry import Geometry
from .layers import HitRule
from .parts import (
    Action,
    Completeness,
    Conjunct,
    Consts,
    Invariant,
    Locality,
    Param,
    ParamKind,
    PinnedCoverage,
    ReadSafety,
    Scope,
    Var,
)
from .validate import validate_table

__all__ = [
    "Action", "Completeness", "Conjunct", "Consts", "Invariant", "Locality", "Param", "ParamKind",
    "PinnedCoverage", "ReadSafety", "RecoveryPipelines", "Scope", "Table", "Var", "address_vars",
]  # fmt: skip

Fn = Callable[..., Any]


def address_vars(table: Table) -> tuple[str, ...]:
    """The table's address variables (``Var.address``), in declaration order."""
    return tuple(v.name for v in table.vars if v.address)


@dataclass(frozen=True)
class RecoveryPipelines:
    """How the recovery pipelines drive the table's own transitions (five-state separation).

    An implementation's recovery projection (the state once the pipelines have run) and its
    plan (the jobs to start and wait for) read these instead of restating them:

    * ``transitions`` are tried in this order on each block until none is enabled;
    * ``deferred`` guard conjuncts only delay a transition (a load past the I/O cap queues):
      the projection treats them as holding;
    * ``fired`` transitions are the ones the recovery starts itself; the others are its jobs'
      own steps, which a plan waits for;
    * ``pipes`` are the block variables naming the pipeline a block's job runs in (0: none);
    * ``restores`` maps a pipeline value to the cache state a job on it brings back.

    A block where none of the ``transitions`` is enabled (``deferred`` aside) has nothing to
    recover: that test is compiled from the guards themselves, never written again.
    """

    transitions: tuple[str, ...]
    deferred: tuple[tuple[str, str], ...] = ()
    fired: tuple[str, ...] = ()
    pipes: tuple[str, ...] = ()
    restores: Mapping[int, str] = field(default_factory=dict)

    def check(self, table: Table) -> None:
        """Every name resolves (raises :class:`SpecError` naming the first that does not)."""
        for a in self.transitions:
            table.action(a)
        for a, c in self.deferred:
            table.action(a).conjunct(c)
        for a in self.fired:
            if a not in self.transitions:
                raise SpecError(f"recovery: fired action {a!r} is not one of the transitions")
        for v in self.pipes:
            var = table.var(v)
            if var.scope is not Scope.BLOCK or var.domain is None:
                raise SpecError(f"recovery: pipe {v!r} is not an enumerated block variable")
            for value in self.restores:
                var.domain(value)  # a value of the pipe's domain (raises ValueError)

    def within(self, actions: Mapping[str, Action]) -> RecoveryPipelines | None:
        """This description for a derived table with ``actions`` (None: a transition is gone)."""
        if not all(a in actions for a in self.transitions):
            return None
        kept = {(a.name, c.name) for a in actions.values() for c in a.guard}
        return replace(self, deferred=tuple(d for d in self.deferred if d in kept))


@dataclass(frozen=True)
class Table:
    """The whole specification.  Build with :func:`Table.build` so it is validated."""

    name: str
    geometry: Geometry
    vars: tuple[Var, ...]
    actions: tuple[Action, ...]
    invariants: tuple[Invariant, ...]
    hit_rule: HitRule
    consts: Consts = field(compare=False)
    # Mutants of this table (ids as ``kvstate mutate`` names them) that change nothing the
    # properties can see, each with a one-line argument; ``kvstate mutate`` reports them as
    # equivalent instead of surviving.  Kept next to the table so the argument is reviewed with it.
    equivalent: Mapping[str, str] = field(default_factory=dict, compare=False)
    reads: tuple[ReadSafety, ...] = field(default=(), compare=False)
    completeness: Completeness | None = field(default=None, compare=False)
    locality: tuple[Locality, ...] = field(default=(), compare=False)
    recovery: RecoveryPipelines | None = field(default=None, compare=False)
    coverage: tuple[PinnedCoverage, ...] = field(default=(), compare=False)

    @staticmethod
    def build(
        name: str,
        geometry: Geometry,
        vars: Iterable[Var],
        actions: Iterable[Action],
        invariants: Iterable[Invariant],
        hit_rule: HitRule,
        equivalent: Mapping[str, str] | None = None,
        reads: Iterable[ReadSafety] = (),
        completeness: Completeness | None = None,
        locality: Iterable[Locality] = (),
        recovery: RecoveryPipelines | None = None,
        coverage: Iterable[PinnedCoverage] = (),
    ) -> Table:
        t = Table(
            name=name,
            geometry=geometry,
            vars=tuple(vars),
            actions=tuple(
                replace(
                    a, updates=MappingProxyType(dict(a.updates)), modifies=frozenset(a.modifies)
                )
                for a in actions
            ),
            invariants=tuple(invariants),
            hit_rule=hit_rule,
            consts=Consts.from_geometry(geometry),
            equivalent=MappingProxyType(dict(equivalent or {})),
            reads=tuple(reads),
            completeness=completeness,
            locality=tuple(locality),
            recovery=recovery,
            coverage=tuple(coverage),
        )
        validate_table(t)
        for loc in t.locality:
            t.action(loc.action)  # names a real action (raises SpecError)
        if recovery is not None:
            try:
                recovery.check(t)
            except ValueError as exc:
                raise SpecError(f"table {name!r}: recovery: {exc}") from exc
        for cov in t.coverage:  # real actions, a block phase variable, phases of its domain
            for a_name in cov.actions:
                t.action(a_name)
            v = t.var(cov.var)
            if v.scope is not Scope.BLOCK or v.domain is None:
                raise SpecError(f"coverage: {cov.var!r} is not a block phase variable")
            bad = [ph for ph in cov.phases if ph not in set(v.domain)]
            if bad:
                raise SpecError(f"coverage: {bad} are not phases of {cov.var!r}")
        return t

    # ---- lookup -------------------------------------------------------------------------
    @functools.cached_property
    def _vars_by_name(self) -> dict[str, Var]:
        # the fuzzers look variables and actions up per step; a frozen table never changes
        return {v.name: v for v in reversed(self.vars)}  # the first of a name, as before

    @functools.cached_property
    def _actions_by_name(self) -> dict[str, Action]:
        return {a.name: a for a in reversed(self.actions)}

    def var(self, name: str) -> Var:
        v = self._vars_by_name.get(name)
        if v is not None:
            return v
        raise SpecError(f"table {self.name!r}: unknown variable {name!r}")

    def action(self, name: str) -> Action:
        a = self._actions_by_name.get(name)
        if a is not None:
            return a
        raise SpecError(
            f"table {self.name!r}: unknown action {name!r}; actions: {', '.join(a.name for a in self.actions)}"
        )

    def invariant(self, name: str) -> Invariant:
        for i in self.invariants:
            if i.name == name:
                return i
        raise SpecError(f"table {self.name!r}: unknown invariant {name!r}")

    # ---- derivation ---------------------------------------------------------------------
    def derive(
        self,
        *,
        name: str | None = None,
        drop_guard: Iterable[tuple[str, str]] = (),
        replace_guard: Mapping[tuple[str, str], Fn] | None = None,
        replace_action: Iterable[Action] = (),
        remove_action: Iterable[str] = (),
        add_action: Iterable[Action] = (),
        update: Mapping[tuple[str, str], Fn] | None = None,
        geometry: Geometry | None = None,
    ) -> Table:
        """A validated copy with changes.

        ``drop_guard`` removes named conjuncts, ``replace_guard`` swaps a conjunct's callable,
        ``update`` maps (action, var) to a new update callable (the var must be in the frame).
        """
        actions = {a.name: a for a in self.actions}
        for a_name, c_name in drop_guard:
            a = self.action(a_name)
            a.conjunct(c_name)
            actions[a_name] = replace(
                actions[a_name], guard=tuple(c for c in actions[a_name].guard if c.name != c_name)
            )
        for (a_name, c_name), fn in (replace_guard or {}).items():
            a = actions.get(a_name) or self.action(a_name)
            a.conjunct(c_name)
            actions[a_name] = replace(
                a, guard=tuple(replace(c, fn=fn) if c.name == c_name else c for c in a.guard)
            )
        for new in replace_action:
            self.action(new.name)
            actions[new.name] = new
        for a_name in remove_action:
            self.action(a_name)
            del actions[a_name]
        for new in add_action:
            if new.name in actions:
                raise SpecError(f"table {self.name!r}: action {new.name!r} already exists")
            actions[new.name] = new
        for (a_name, v_name), fn in (update or {}).items():
            found = actions.get(a_name)
            if found is None:
                raise SpecError(f"table {self.name!r}: unknown action {a_name!r}")
            ups = dict(found.updates)
            ups[v_name] = fn
            actions[a_name] = replace(found, updates=ups)
        return Table.build(
            name or f"{self.name}*",
            geometry or self.geometry,
            self.vars,
            actions.values(),
            self.invariants,
            self.hit_rule,
            self.equivalent,
            [x for x in self.reads if x.action in actions],
            replace(
                self.completeness,
                disturbing=tuple(a for a in self.completeness.disturbing if a in actions),
            )
            if self.completeness is not None
            and all(
                a in actions for a in (*self.completeness.write_path, *self.completeness.read_path)
            )
            else None,
            [x for x in self.locality if x.action in actions],
            self.recovery.within(actions) if self.recovery is not None else None,
            [
                replace(x, actions=tuple(a for a in x.actions if a in actions))
                for x in self.coverage
            ],
        )

    def with_geometry(self, geometry: Geometry) -> Table:
        return self.derive(name=self.name, geometry=geometry)
