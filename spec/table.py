"""The declarative transition table: variables, actions, invariants and the hit rule, as data.

A :class:`Table` is frozen.  It is validated when it is built: every update must be inside its
action's ``modifies`` frame, every name must resolve, every guard must be boolean and every
update must have its variable's type.  Errors name the action or invariant at fault.
``Table.derive`` makes a changed copy (drop a guard conjunct, replace or remove an action), which
is how seeded-bug variants and users' own tables are built without editing the default.
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from .errors import SpecError
from .geometry import Geometry

if TYPE_CHECKING:
    from .layers import HitRule

Fn = Callable[..., Any]


class Scope(enum.Enum):
    """Where a variable lives: one value, one per pool block, one per request, or both."""

    GLOBAL = "global"
    BLOCK = "block"
    REQ = "request"
    REQ_BLOCK = "request x block"


class ParamKind(enum.Enum):
    """Typed action parameters; the interpreters know each kind's domain."""

    BLOCK = "block"  # 0 <= b < N
    REQ = "request"  # 0 <= r < R (expanded per request by the encoder)
    TOKENS = "tokens"  # 0 <= h <= N * L
    ADDR = "address"  # a buffer address, >= 0
    TICKS = "ticks"  # 1 <= t <= lease_max
    FMT = "format"  # a Fmt value


@dataclass(frozen=True)
class Var:
    """A state variable.  ``domain`` (an IntEnum) makes it an enumerated phase variable."""

    name: str
    scope: Scope
    init: Fn  # init(k, b) for block-scoped vars, init(k) otherwise; k = Consts
    domain: type[enum.IntEnum] | None = None
    is_bool: bool = False
    nonneg: bool = False
    ghost: bool = False
    doc: str = ""
    # an address (a buffer's location): its values are names, not quantities; a target chooses
    # its own, so a fuzzer compares them up to renaming and translates the model's ghost ones
    address: bool = False


def address_vars(table: Table) -> tuple[str, ...]:
    """The table's address variables (``Var.address``), in declaration order."""
    return tuple(v.name for v in table.vars if v.address)


@dataclass(frozen=True)
class Param:
    name: str
    kind: ParamKind


@dataclass(frozen=True)
class Conjunct:
    """One named conjunct of a guard, so that it can be dropped, reported and cited."""

    name: str
    fn: Fn  # fn(s, p) -> bool
    doc: str = ""


@dataclass(frozen=True)
class Action:
    """A transition: typed parameters, a guard of named conjuncts, updates within a frame."""

    name: str
    params: tuple[Param, ...]
    guard: tuple[Conjunct, ...]
    updates: Mapping[str, Fn]  # var name -> fn(s, p); request-scoped vars are those of p.r
    modifies: frozenset[str]
    component: str
    doc: str = ""

    def conjunct(self, name: str) -> Conjunct:
        for c in self.guard:
            if c.name == name:
                return c
        raise SpecError(f"action {self.name!r} has no guard conjunct {name!r}")

    @property
    def request_scoped(self) -> bool:
        return any(p.kind is ParamKind.REQ for p in self.params)


@dataclass(frozen=True)
class Invariant:
    """``forall b. per_block(s, [r,] b)`` and ``scalar(s, [r])``; per-request ones for every r.

    ``kind`` is "safeguard" (the seed's four), "safety" (basic properties) or "aux" (strengthening
    needed for induction).  ``protected_by`` lists the guard conjuncts whose removal must break
    it (anti-vacuity).  ``bounded`` marks a property that relates a ghost counter to a count over
    blocks: it is checked by BMC and by the concrete interpreter, not proved for any pool size.
    """

    name: str
    doc: str
    kind: str
    per_block: Fn | None = None
    scalar: Fn | None = None
    per_request: bool = False
    protected_by: tuple[tuple[str, str], ...] = ()
    bounded: bool = False
    # (action, conjunct) pairs that refuse *only* what would break this invariant: with the
    # action's other conjuncts holding and this one failing, firing it anyway breaks the
    # invariant (a cap that is exactly the capacity, not one less).  Proved as ``tight``
    # obligations; a stricter conjunct (an off-by-one that refuses one step too many) fails.
    tight: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class ReadSafety:
    """What an action reads (or promises not to take away), and the property that makes it safe.

    Proved as an *action-level* obligation: in every state satisfying the invariants where the
    action's guard holds, ``per_block(s, p, b)`` holds at every block (and ``scalar(s, p)``).
    An action that changes no state (``replay``) is invisible to state invariants; this ties its
    guard to the safety it provides.  ``protected_by`` lists guard conjuncts whose removal must
    break it (anti-vacuity: a reachable state where the weakened guard allows an unsafe read).
    """

    action: str
    name: str
    doc: str
    per_block: Fn | None = None  # per_block(s, p, b)
    scalar: Fn | None = None  # scalar(s, p)
    protected_by: tuple[str, ...] = ()
    tight: tuple[str, ...] = ()  # the action's conjuncts that refuse only where this fails


@dataclass(frozen=True)
class Locality:
    """The guard of ``action`` reads the pool's blocks only where ``within(s, p, b)`` holds.

    A hit is judged by the hit's own blocks: a guard that also reads one block past its scope
    (an off-by-one in a range) refuses hits for reasons outside them.  Proved as a ``local``
    obligation: changing every block variable at one block outside the scope never changes
    the guard's verdict (any pool size).
    """

    action: str
    doc: str
    within: Fn  # within(s, p, b) -> bool


@dataclass(frozen=True)
class PinnedCoverage:
    """A coverage goal: each of ``actions`` (which give up a request's pins) fires while the
    request holds a pin on a block whose phase variable ``var`` is in each of ``phases``.

    Proved as ``reach`` obligations (a witness trace per action and phase, replayed
    concretely); the fuzzer replays the witnesses, so an action's effects on a pinned block in
    each of those phases are exercised."""

    actions: tuple[str, ...]
    var: str  # a block phase variable (one with a ``domain``)
    phases: tuple[int, ...]
    doc: str = ""


@dataclass(frozen=True)
class Completeness:
    """The write path enables the read path (a liveness rule, stated once for every reader).

    After the ``write_path`` actions stored, sealed and indexed the first ``n`` blocks of a
    prefix -- ``stored(s, n)``, stated over ghost truth -- and with none of the ``disturbing``
    actions in between, a new request for the same prefix is validated at the full LCM-aligned
    length: the ``read_path`` steps (:meth:`probe`) are all enabled.  The prover checks it by
    bounded model checking over traces of write-path actions; ``kvstate fuzz`` checks it on the
    block-level target whenever the model's state satisfies ``stored``; a vLLM target projects
    it through :meth:`expected_hit`.
    """

    doc: str
    write_path: tuple[str, ...]  # actions that store, seal, index a prefix (and keep it resident)
    disturbing: tuple[str, ...]  # actions after which the rule promises nothing (evict, fault...)
    read_path: tuple[str, ...]  # admit, match, pin, validate: a new request's steps
    stored: Fn  # stored(s, n) -> bool: blocks [0, n) stored, sealed and indexed (ghost truth)

    @staticmethod
    def expected_hit(stored_tokens: int, geometry: Geometry) -> int:
        """Tokens a new request for a stored prefix of ``stored_tokens`` must hit: every whole
        LCM block (the hit rule's L1 alignment), nothing of a partial last block."""
        if stored_tokens < 0:
            raise SpecError(f"stored_tokens must be >= 0, got {stored_tokens}")
        L = geometry.lcm_tokens
        return stored_tokens // L * L

    def probe(
        self, n_blocks: int, geometry: Geometry, r: int = 0
    ) -> list[tuple[str, dict[str, int]]]:
        """The read path for a new request ``r`` over ``n_blocks`` stored blocks, as steps."""
        h = self.expected_hit(n_blocks * geometry.lcm_tokens, geometry)
        params = {"admit": {"r": r, "t": 1}, "match": {"r": r, "h": h}}
        return [(a, params.get(a, {"r": r})) for a in self.read_path]


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
class Consts:
    """Geometry-derived constants the callables read as ``s.k``."""

    L: int  # LCM block, tokens
    W: int  # SWA window, in LCM blocks
    R: int  # requests in the abstract model
    io_cap: int
    pin_cap: int  # blocks
    load_steps: int
    lease_max: int
    swa_restored_from_disk: bool
    supported_fmts: tuple[int, ...]
    align: int
    csa_ratio: int
    hca_ratio: int
    entry_bytes: int
    page_bytes: tuple[int, ...]
    block_tokens: int

    @staticmethod
    def from_geometry(g: Geometry) -> Consts:
        from .layers import supported_formats

        return Consts(
            L=g.lcm_tokens,
            W=g.window_lcm_blocks,
            R=g.model_requests,
            io_cap=g.io_cap,
            pin_cap=min(g.pin_cap_blocks, 10**9),
            load_steps=g.load_steps,
            lease_max=g.lease_max,
            swa_restored_from_disk=g.swa_disk_policy != "zero",
            supported_fmts=supported_formats(g),
            align=g.align_bytes,
            csa_ratio=g.csa_ratio,
            hca_ratio=g.hca_ratio,
            entry_bytes=g.entry_bytes,
            page_bytes=(g.page_bytes(g.csa_ratio), g.page_bytes(g.hca_ratio)),
            block_tokens=g.compressed_block_tokens,
        )


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
        from .validate import validate_table

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
