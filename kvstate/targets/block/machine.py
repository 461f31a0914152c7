"""A Hypothesis state machine generated from the table, driving the model and a target in lockstep.

One rule per action, with "some parameters satisfy the guard" as its precondition and the
parameters drawn among those that do; one rule that draws a *disabled* action and checks the
target refuses it without changing state; and an invariant that, after every step, checks
every table invariant and compares ``target.observe()`` with the model.

The target is pluggable: ``ModelTarget`` (the reference interpreter itself, for model-level
random walks) or any object with one method per action plus ``observe()`` -- the adapter
protocol of ``kvstate fuzz``.  Each example gets a fresh target from the factory, so nothing
carries over between examples.

Findings are raised as :class:`Nonconformance` (a kind and details: which invariant, which
``observe()`` fields, which refused action and conjunct) carrying the steps that led to them;
:func:`replay_seeds` is the deterministic coverage pass, and :func:`minimize` shrinks any
finding by delta debugging, replaying every candidate trace on a fresh target and model.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Protocol

from hypothesis import event, settings, target
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from kvstate.spec.errors import ActionRefused
from kvstate.spec.phases import Req
from kvstate.spec.state import ConcreteState
from kvstate.spec.table import Action, ParamKind, Scope, Table, address_vars

from kvstate.model.concrete import GuardError, KeptMachine, Machine

OUTPUT_KINDS = (ParamKind.ADDR, ParamKind.FMT)  # chosen by the target, fed to the model

# Each profile derives from Hypothesis' built-in "default", not from whatever profile is loaded
# when this module is imported: registered under a loaded ``ci`` (HYPOTHESIS_PROFILE=ci, a
# plugin), ``dev`` would inherit ``derandomize=True`` and lose its example database.
_BASE = settings.get_profile("default")
settings.register_profile(
    "ci",
    _BASE,
    derandomize=True,
    max_examples=60,
    stateful_step_count=40,
    deadline=None,
    print_blob=True,
)
settings.register_profile(
    "dev", _BASE, max_examples=300, stateful_step_count=50, deadline=None, print_blob=True
)
settings.register_profile(
    "nightly", _BASE, max_examples=5000, stateful_step_count=100, deadline=None, print_blob=True
)


class Target(Protocol):
    """The adapter protocol: one method per action (keyword params) plus ``observe()``.

    A method returns ``None``, or for actions with output parameters (address, format) a dict
    of the values the target chose.  A disabled action raises :class:`ActionRefused` and
    changes nothing.  Optionally, ``check_data() -> list[str]`` verifies the bytes running
    requests read; the harness calls it after every step and fails on any problem.
    """

    def observe(self) -> Mapping[str, Any]: ...


TargetFactory = Callable[[Table, int], Any]


class _ObservedTarget:
    """A target whose ``observe()`` is answered from its last observation while nothing but
    ``observe()`` has called it since (any other call, action or hook, drops it first).

    A refusal check observes before and after the refused call; the next check's "before" is
    then the previous "after", with no call to the target in between, so it is not asked again.
    The observation is returned as a read-only snapshot (a copy the target cannot edit).
    """

    __slots__ = ("_target", "_last", "_calls")

    def __init__(self, target: Any) -> None:
        self._target = target
        self._last: Mapping[str, Any] | None = None
        # name -> (the target's attribute, its wrapper): made once per name, and remade if the
        # target's attribute is another object now (its methods are bound anew at every read)
        self._calls: dict[str, tuple[Any, Callable[..., Any]]] = {}

    def observe(self) -> Mapping[str, Any]:
        if self._last is None:  # a private read-only copy: nobody can edit it behind our back
            self._last = MappingProxyType(dict(self._target.observe()))
        return self._last

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._target, name)
        if not callable(attr):
            return attr
        kept = self._calls.get(name)
        if kept is not None and kept[0] == attr:  # the same method of the same target
            return kept[1]

        def call(*args: Any, **kwargs: Any) -> Any:
            self._last = None
            return attr(*args, **kwargs)

        self._calls[name] = (attr, call)
        return call


class ModelTarget:
    """The reference interpreter wrapped as a target (model-only fuzzing, and a self-check)."""

    def __init__(self, table: Table, N: int) -> None:
        self.m = Machine(table, N)
        self.s = self.m.init()

    def __getattr__(self, name: str) -> Callable[..., Any]:
        if name.startswith("_") or name not in {a.name for a in self.m.table.actions}:
            raise AttributeError(name)
        action = self.m.table.action(name)

        def do(**params: int) -> dict[str, int] | None:
            outs = {}
            for q in action.params:
                if q.kind in OUTPUT_KINDS and q.name not in params:
                    # a fresh address each time: a buffer placed anew always moves
                    self._placed = getattr(self, "_placed", 0) + (q.kind is ParamKind.ADDR)
                    params[q.name] = outs[q.name] = (
                        0 if q.kind is ParamKind.FMT else 3 * self.m.N + self._placed
                    )
            try:
                self.s = self.m.step(self.s, action, params)
            except GuardError as exc:
                raise ActionRefused(str(exc)) from exc
            return outs or None

        return do

    def observe(self) -> dict[str, Any]:
        return self.s.values


_canonical_last: list[Any] = [None, None, None]  # (values, table, result) of the last call


class _LockstepMachine(KeptMachine):
    """The model as the lockstep machine walks it.

    The machine enumerates each action's inputs and skips every combination whose target-chosen
    outputs (an address, a format) are not 0: those are filled in from the target's answer.
    Leaving them out of the space here gives the same lists with a twelfth of the work for
    ``allocate`` (its address ranges over ``4N`` values).  Guard answers and successors are
    kept per state value (:class:`KeptMachine`): the ``ci`` run asks about 3227 state objects
    holding 317 distinct values.
    """

    def param_space(
        self, action: Action, *, tokens_step: int | None = None
    ) -> Iterator[dict[str, Any]]:
        key = ("lockstep:" + action.name, tokens_step)  # beside the full spaces
        space = self._spaces.get(key)
        if space is None:
            outs = [q.name for q in action.params if q.kind in OUTPUT_KINDS]
            space = self._spaces[key] = tuple(
                p
                for p in super().param_space(action, tokens_step=tokens_step)
                if not any(p[name] for name in outs)
            )
        for params in space:
            yield dict(params)


def canonical(values: Mapping[str, Any], table: Table) -> dict[str, Any]:
    """Addresses renamed by order of first appearance: equal iff equal up to a bijection."""
    if not isinstance(values, MappingProxyType):
        return _canonical(values, table)
    # A read-only snapshot (_ObservedTarget's): the same object is the same observation, and a
    # refusal check's "before" is the previous check's "after".
    last = _canonical_last
    if values is not last[0] or table is not last[1]:
        last[:] = [values, table, _canonical(values, table)]
    return dict(last[2])


class _Facts:
    """Per table, computed once (each observation needs them)."""

    __slots__ = ("table", "addresses", "names", "mechanism_first", "mechanism", "ghosts")

    def __init__(self, table: Table) -> None:
        names = {v.name for v in table.vars}
        self.table = table
        # the address variables with their scopes
        self.addresses = tuple(
            (var, table.var(var).scope) for var in address_vars(table) if var in names
        )
        # the names ``observe()`` must report (every non-ghost variable)
        self.names = frozenset(v.name for v in table.vars if not v.ghost)
        ghost = [table.var(var).ghost for var, _ in self.addresses]
        # no ghost address is renamed before a mechanism one: equal mechanism values are then
        # equal up to renaming too (see ``diff``)
        self.mechanism_first = ghost == sorted(ghost)
        # ``with_ghosts``: the mechanism's address variables (flattened when per request and
        # block), and each ghost with whether it is a per-block address (translated)
        self.mechanism = tuple(
            (var, scope is Scope.REQ_BLOCK)
            for var, scope in self.addresses
            if not table.var(var).ghost
        )
        addresses = address_vars(table)
        self.ghosts = tuple(
            (v.name, v.name in addresses and v.scope is Scope.BLOCK) for v in table.vars if v.ghost
        )


_facts_memo: dict[int, _Facts] = {}


def _facts_of(table: Table) -> _Facts:
    hit = _facts_memo.get(id(table))
    if hit is None or hit.table is not table:
        hit = _facts_memo[id(table)] = _Facts(table)
    return hit


def _canonical(values: Mapping[str, Any], table: Table) -> dict[str, Any]:
    names: dict[int, int] = {}

    def rn(x: int) -> int:
        return names.setdefault(x, len(names))

    out = dict(values)
    for var, scope in _facts_of(table).addresses:
        if var not in values:
            continue
        v = values[var]
        if scope is Scope.BLOCK:
            out[var] = tuple(rn(x) for x in v)
        elif scope is Scope.REQ_BLOCK:
            out[var] = tuple(tuple(rn(x) for x in row) for row in v)
    return out


_PLAIN = (dict, MappingProxyType)


def diff(model: Mapping[str, Any], observed: Mapping[str, Any], table: Table) -> list[str]:
    facts = _facts_of(table)
    names, mechanism_first = facts.names, facts.mechanism_first
    if model is observed or (
        len(model) == len(observed)
        and (
            model == observed  # dicts and their read-only views compare item by item, uncopied
            if type(model) in _PLAIN and type(observed) in _PLAIN
            else dict(model) == dict(observed)
        )
    ):  # equal as they stand (a refusal check's before and after): equal up to renaming too
        if names <= observed.keys():
            return []
    elif mechanism_first and names <= observed.keys() and names <= model.keys():
        # The model has ghosts the target lacks.  Every variable the target shows equal as it
        # stands: ``_diff`` would find no difference, because the renaming (by first
        # appearance, address variables in table order) meets the same values in the same
        # order on both sides until the first ghost address, and every mechanism address
        # variable comes before it (``mechanism_first``).
        if all(model[n] == observed[n] for n in names):
            return []
    return _diff(model, observed, table)


def _diff(model: Mapping[str, Any], observed: Mapping[str, Any], table: Table) -> list[str]:
    a, b = canonical(model, table), canonical(observed, table)
    out = []
    for v in table.vars:
        if v.ghost:  # ghost truth lives in the model only
            continue
        if v.name not in b:
            out.append(f"{v.name}: missing from observe()")
        elif a[v.name] != b[v.name]:
            out.append(f"{v.name}: model {a[v.name]!r} != target {b[v.name]!r}")
    return out


def with_ghosts(
    model: Mapping[str, Any], observed: Mapping[str, Any], table: Table
) -> dict[str, Any]:
    """The observed state completed with the model's ghost truth (the target has none), so the
    invariants over ghosts can be checked on it.  Ghost addresses are translated into the
    target's address names through the mechanism's address variables, which ``diff`` has just
    found equal up to a bijection."""
    out = dict(observed)
    facts = _facts_of(table)
    if not facts.ghosts:
        return out
    to_target: dict[int, int] = {}
    for var, flat in facts.mechanism:
        if var in observed:
            a, b = model[var], observed[var]
            if flat:
                a = tuple(x for row in a for x in row)
                b = tuple(x for row in b for x in row)
            if a == b:  # each x pairs with itself (the first pairing of an x stands)
                for x in a:
                    to_target.setdefault(x, x)
                continue
            for x, y in zip(a, b, strict=False):
                to_target.setdefault(x, y)
    # a ghost address not named by the mechanism keeps its name, as one paired with itself
    renames = any(x != y for x, y in to_target.items())
    for name, translate in facts.ghosts:
        val = model[name]
        if translate and renames:
            val = tuple(to_target.get(x, x) for x in val)
        out[name] = val
    return out


def _inputs(action: Action) -> list[Any]:
    return [q for q in action.params if q.kind not in OUTPUT_KINDS]


Step = tuple[str, dict[str, int]]  # (action, its input parameters): one replayable step


@dataclass
class TraceStep:
    """One step a run took: an action it fired, or a disabled action whose refusal it checked."""

    action: str
    inputs: dict[str, int]
    refused: bool = False  # the model's guard was false: the target had to refuse it
    failed: tuple[str, ...] = ()  # the false guard conjuncts (refused steps)
    outputs: dict[str, int] = field(default_factory=dict)  # parameters the target chose

    @property
    def step(self) -> Step:
        return (self.action, dict(self.inputs))

    def call(self) -> str:
        return f"{self.action}({', '.join(f'{k}={v}' for k, v in self.inputs.items())})"

    def render(self) -> str:
        if self.refused:
            note = f"guard false ({', '.join(self.failed)}): the target must refuse it"
        elif self.outputs:
            note = "target chose " + ", ".join(f"{k}={v}" for k, v in self.outputs.items())
        else:
            return self.call()
        return f"{self.call():<24}  # {note}"


class Nonconformance(AssertionError):
    """A finding, classified so that a minimized trace can be checked to fail *the same way*.

    ``kind`` is one of ``model-invariant``, ``observe`` (``detail``: the fields of ``observe()``
    that differ from the model), ``observed-invariant`` (the invariants the observed state
    breaks), ``data`` (the states whose bytes are wrong), ``accepted-disabled`` (the target
    performed an action whose guard is false; ``detail``: ``action[conjuncts]``),
    ``refusal-changed-state``, ``refusal-error`` (raised something other than ``ActionRefused``),
    ``target-error`` (failed an allowed action), ``missing-output``.  ``trace`` holds the steps
    of the run up to and including the failing one; ``origin`` says who found it.
    """

    def __init__(self, kind: str, detail: Sequence[str], message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.detail = tuple(detail)
        self.trace: list[TraceStep] = []
        self.origin = ""

    @property
    def signature(self) -> str:
        return f"{self.kind}: {', '.join(self.detail)}"

    def same_as(self, original: Nonconformance) -> bool:
        """Same kind, and ``original``'s primary detail among ours: the same refused action and
        conjuncts, the same first mismatched field (table order), the same first invariant."""
        return self.kind == original.kind and (
            not original.detail or original.detail[0] in self.detail
        )


def _data_subject(problem: str) -> str:
    """``'request 0: SWA window: layer 1 rows differ'`` -> ``'SWA window'``."""
    return re.sub(r"^request \d+: ", "", problem).split(":")[0].strip()


def build_state_machine(
    table: Table,
    N: int | None = None,
    factory: TargetFactory | None = None,
    *,
    stats: Counter[str] | None = None,
    check_refusals: bool = True,
    seed_traces: Sequence[Sequence[tuple[str, Mapping[str, int]]]] = (),
    on_example_end: Callable[[int], None] | None = None,
) -> type[RuleBasedStateMachine]:
    """A RuleBasedStateMachine class for ``table`` against targets from ``factory``.

    ``seed_traces`` (e.g. the proofs' reachability witnesses) are optional warm-up walks: an
    example may start by replaying one, so deep phases (a completed disk load, a validated
    hit) are reached in every run rather than by luck.  Steps whose guard is false are checked
    to be refused.  Every instance records its steps (``.steps``) and raises
    :class:`Nonconformance` (carrying them) on a finding; ``stats`` gets the per-action counts,
    ``(examples)``, ``(refused)``, and ``(first failure)`` / ``(first failure steps)``: the
    Hypothesis example that first failed and its length before shrinking.
    """
    n = N if N is not None else table.geometry.model_blocks
    new_target = factory or (lambda t, k: ModelTarget(t, k))

    def make(t: Table, k: int) -> Any:
        return _ObservedTarget(new_target(t, k))

    # Speed lives outside the class below: Hypothesis derandomizes (the ci profile) with a seed
    # taken from the class's source, so any edit of its body changes the ci walks.
    machine = _LockstepMachine(table, n, memo=True)
    counts = stats if stats is not None else Counter()

    class Conformance(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.model = machine.init()
            self.target = make(table, n)
            self._enabled: dict[str, list[dict[str, int]]] | None = None
            self.trace: list[str] = []  # performed actions, with the target's outputs
            self.steps: list[TraceStep] = []  # everything the run did, refusal checks included
            self.in_hypothesis = True  # events may be recorded only inside a Hypothesis test
            self.disturbed: set[int] = set()  # blocks a completeness-disturbing action touched

        # -- completeness (the table's rule: the write path enables the read path) -----------
        def complete_prefix(self) -> tuple[int, int]:
            """(n, r): the longest undisturbed prefix the ghost truth says is stored, sealed
            and indexed, and an idle request to probe it with; (0, -1) when there is none."""
            c = table.completeness
            if c is None:
                return 0, -1
            idle = [r for r in range(table.consts.R) if self.model.req(r).phase == Req.IDLE]
            if not idle:
                return 0, -1
            limit = min([n, *self.disturbed])
            for k in range(limit, 0, -1):
                if c.stored(self.model, k):
                    return k, idle[0]
            return 0, -1

        def check_completeness(self) -> None:
            """The model itself must accept the read path over a complete prefix."""
            k, r = self.complete_prefix()
            if k == 0:
                return
            assert table.completeness is not None
            s = self.model
            for a_name, params in table.completeness.probe(k, table.geometry, r):
                a = table.action(a_name)
                failed = machine.failed_conjuncts(s, a, params)
                if failed:
                    raise self.fail(
                        "incomplete",
                        [f"{a_name}[{','.join(failed)}]"],
                        f"the first {k} blocks are stored, sealed and indexed (ghost truth) but "
                        f"a new request is refused {a_name}({params}): {list(failed)} "
                        f"(after {self.recent()})",
                    )
                s = machine.step(s, a, params)
            want = table.completeness.expected_hit(k * table.consts.L, table.geometry)
            if s.req(r).hit != want:
                raise self.fail(
                    "incomplete",
                    [f"hit {s.req(r).hit} != {want}"],
                    f"the first {k} blocks are stored, sealed and indexed (ghost truth) but a new "
                    f"request is validated at {s.req(r).hit} tokens, not {want} "
                    f"(after {self.recent()})",
                )

        # -- helpers ------------------------------------------------------------------------
        def recent(self) -> str:
            return " ; ".join(self.trace[-8:]) or "Init"

        def fail(self, kind: str, detail: Sequence[str], message: str) -> Nonconformance:
            exc = Nonconformance(kind, detail, message)
            exc.trace = [
                TraceStep(s.action, dict(s.inputs), s.refused, s.failed, dict(s.outputs))
                for s in self.steps
            ]
            if self.in_hypothesis and "(first failure)" not in counts:
                counts["(first failure)"] = counts["(examples)"] + 1
                counts["(first failure steps)"] = len(self.steps)
            return exc

        def enabled_inputs(self, a: Action) -> list[dict[str, int]]:
            if self._enabled is None:
                self._enabled = {}
            if a.name not in self._enabled:
                inputs = _inputs(a)
                outs = {q.name: 0 for q in a.params if q.kind in OUTPUT_KINDS}
                res = []
                for params in machine.param_space(a):
                    if any(
                        q.name in params and params[q.name] != 0
                        for q in a.params
                        if q.kind in OUTPUT_KINDS
                    ):
                        continue
                    if machine.is_enabled(self.model, a, {**params, **outs}):
                        res.append({q.name: params[q.name] for q in inputs})
                self._enabled[a.name] = res
            return self._enabled[a.name]

        def near_misses(self) -> list[tuple[str, tuple[tuple[str, int], ...]]]:
            out = []
            for a in table.actions:
                outs = {q.name: 0 for q in a.params if q.kind in OUTPUT_KINDS}
                for params in machine.param_space(a, tokens_step=table.consts.L):
                    if any(params.get(q.name, 0) != 0 for q in a.params if q.kind in OUTPUT_KINDS):
                        continue
                    if len(machine.failed_conjuncts(self.model, a, {**params, **outs})) == 1:
                        out.append((a.name, tuple((q.name, params[q.name]) for q in _inputs(a))))
            return out

        def attempt(self, a: Action, inputs: dict[str, int]) -> bool:
            """Fire ``a`` if the model allows it; otherwise the target must refuse it unchanged.

            Returns False (and does nothing) for inputs outside this pool's domains.
            """
            if any(inputs.get(q.name) not in machine.domain(q.kind) for q in _inputs(a)):
                return False  # a seed step for a larger pool than this run's
            if inputs in self.enabled_inputs(a):
                self.perform(a, inputs)
            else:
                self.expect_refusal(a, inputs)
            return True

        def expect_refusal(self, a: Action, inputs: dict[str, int]) -> None:
            outs = {q.name: 0 for q in a.params if q.kind in OUTPUT_KINDS}
            failed = tuple(machine.failed_conjuncts(self.model, a, {**inputs, **outs}))
            self.steps.append(TraceStep(a.name, dict(inputs), refused=True, failed=failed))
            before = self.target.observe()
            try:
                getattr(self.target, a.name)(**inputs)
            except ActionRefused:
                pass
            except Exception as exc:  # noqa: BLE001 - the protocol says: raise ActionRefused
                raise self.fail(
                    "refusal-error",
                    [a.name],
                    f"target raised {type(exc).__name__}: {exc} instead of ActionRefused on "
                    f"{a.name}({inputs}), whose guard {list(failed)} is false "
                    f"(after {self.recent()})",
                ) from exc
            else:
                raise self.fail(
                    "accepted-disabled",
                    [f"{a.name}[{','.join(failed)}]"],
                    f"target performed {a.name}({inputs}) although its guard "
                    f"{list(failed)} is false (after {self.recent()})",
                )
            after = self.target.observe()
            d = diff(before, after, table)
            if d:
                raise self.fail(
                    "refusal-changed-state",
                    [a.name],
                    f"refused {a.name} still changed state:\n  " + "\n  ".join(d),
                )
            counts["(refused)"] += 1

        def perform(self, a: Action, inputs: dict[str, int]) -> None:
            step = TraceStep(a.name, dict(inputs))
            self.steps.append(step)
            method = getattr(self.target, a.name)
            try:
                out = method(**inputs) or {}
            except Exception as exc:  # noqa: BLE001 - any target failure on an allowed step is a finding
                raise self.fail(
                    "target-error",
                    [f"{a.name}:{type(exc).__name__}"],
                    f"target failed {a.name}({inputs}), which the model allows, after "
                    f"{self.recent()}: {type(exc).__name__}: {exc}",
                ) from exc
            params = dict(inputs)
            for q in a.params:
                if q.kind in OUTPUT_KINDS:
                    if q.name not in out:
                        raise self.fail(
                            "missing-output",
                            [f"{a.name}.{q.name}"],
                            f"target's {a.name} did not return output parameter {q.name!r}",
                        )
                    params[q.name] = step.outputs[q.name] = int(out[q.name])
            self.model = machine.step(self.model, a, params)
            c = table.completeness
            if c is not None and "b" in params:
                if a.name in c.disturbing:
                    self.disturbed.add(params["b"])
                elif a.name == c.write_path[0]:  # the slot starts afresh
                    self.disturbed.discard(params["b"])
            self._enabled = None
            counts[a.name] += 1
            if self.in_hypothesis:
                event(f"action {a.name}")
            self.trace.append(f"{a.name}({', '.join(f'{k}={v}' for k, v in params.items())})")

        # -- invariants ---------------------------------------------------------------------
        @invariant()
        def conforms(self) -> None:
            viol = machine.violations(self.model)
            if viol:
                raise self.fail(
                    "model-invariant",
                    list(dict.fromkeys(v.invariant for v in viol)),
                    f"model invariant broken: {', '.join(map(str, viol))}",
                )
            self.check_completeness()
            try:
                observed = self.target.observe()
            except Exception as exc:  # noqa: BLE001 - observe() must not fail
                raise self.fail(
                    "target-error",
                    [f"observe:{type(exc).__name__}"],
                    f"target's observe() failed after {self.recent()}: {exc}",
                ) from exc
            d = diff(self.model.values, observed, table)
            if d:
                raise self.fail(
                    "observe",
                    [line.split(":")[0] for line in d],
                    "implementation diverges from the model after "
                    + self.recent()
                    + ":\n  "
                    + "\n  ".join(d),
                )
            obs_state = ConcreteState(
                canonical(with_ghosts(self.model.values, observed, table), table),
                n,
                table.consts,
                self.model._req_names,
            )
            bad = machine.violations(obs_state)
            if bad:
                raise self.fail(
                    "observed-invariant",
                    list(dict.fromkeys(v.invariant for v in bad)),
                    f"observed state breaks {', '.join(map(str, bad))}",
                )
            check_data = getattr(self.target, "check_data", None)
            if callable(check_data):
                problems = check_data()
                if problems:
                    raise self.fail(
                        "data",
                        list(dict.fromkeys(_data_subject(p) for p in problems)),
                        "data read by a running request is wrong after "
                        + self.recent()
                        + ":\n  "
                        + "\n  ".join(problems),
                    )

        def teardown(self) -> None:
            # Steer towards long, varied walks: distinct actions fired in this example.
            if self.in_hypothesis:
                target(float(len({t.split("(")[0] for t in self.trace})), label="distinct actions")
                counts["(examples)"] += 1
                if on_example_end is not None:
                    on_example_end(counts["(examples)"])
            close = getattr(self.target, "close", None)
            if callable(close):
                close()

    # The model's answers per state, kept by value on the machine (``_LockstepMachine``): the
    # class's own ``enabled_inputs`` and ``near_misses`` (their source above is what seeds the
    # ci walks, so they stay as written) are pure functions of the model state and run once
    # per distinct state; an instance then gets the kept lists.  Callers only read them (the
    # rules draw from them, ``perform`` and ``expect_refusal`` copy what they take).
    body_enabled_inputs = Conformance.enabled_inputs
    body_near_misses = Conformance.near_misses

    def enabled_inputs(self: Any, a: Action) -> list[dict[str, int]]:
        kept = machine.answers_for(self.model)
        key = ("enabled_inputs", a.name)
        got = kept.get(key)
        if got is None:
            got = kept[key] = body_enabled_inputs(self, a)
        return got  # type: ignore[no-any-return]

    def near_misses(self: Any) -> list[tuple[str, tuple[tuple[str, int], ...]]]:
        kept = machine.answers_for(self.model)
        got = kept.get(("near_misses",))
        if got is None:
            got = kept["near_misses",] = body_near_misses(self)
        return got  # type: ignore[no-any-return]

    Conformance.enabled_inputs = enabled_inputs  # type: ignore[method-assign]
    Conformance.near_misses = near_misses  # type: ignore[method-assign]

    # The completeness rule likewise: ``complete_prefix`` and ``check_completeness`` read the
    # model state and the blocks a disturbing action touched, nothing else.  The prefix is kept
    # per (state value, disturbed blocks); a check is skipped where it passed on the same
    # (a failing one raises, and is never kept: it fails afresh).  The precondition of the
    # probe rule asks for the prefix at every rule choice.
    body_complete_prefix = Conformance.complete_prefix
    body_check_completeness = Conformance.check_completeness

    def complete_prefix(self: Any) -> tuple[int, int]:
        kept = machine.answers_for(self.model)
        key = ("complete_prefix", frozenset(self.disturbed))
        got = kept.get(key)
        if got is None:
            got = kept[key] = body_complete_prefix(self)
        return got  # type: ignore[no-any-return]

    def check_completeness(self: Any) -> None:
        kept = machine.answers_for(self.model)
        key = ("completeness checked", frozenset(self.disturbed))
        if key not in kept:
            body_check_completeness(self)
            kept[key] = True

    Conformance.complete_prefix = complete_prefix  # type: ignore[method-assign]
    Conformance.check_completeness = check_completeness  # type: ignore[method-assign]

    # One strategy per distinct list of options (many states enable the same inputs): a new
    # strategy object is validated at its first draw, and equal ones draw alike.
    strategies: dict[tuple[Any, ...], st.SearchStrategy[Any]] = {}

    def inputs_strategy(a: Action, options: list[dict[str, int]]) -> st.SearchStrategy[Any]:
        key = (a.name, *(tuple(o.items()) for o in options))
        got = strategies.get(key)
        if got is None:
            got = strategies[key] = _inputs_strategy(a, options)
        return got

    def _inputs_strategy(a: Action, options: list[dict[str, int]]) -> st.SearchStrategy[Any]:
        # Whole-LCM-block hit lengths are the interesting ones; keep a few ragged ones too.
        aligned = [
            o
            for o in options
            if all(o[q.name] % table.consts.L == 0 for q in a.params if q.kind is ParamKind.TOKENS)
        ]
        pool = st.sampled_from(aligned) if aligned and len(aligned) < len(options) else None
        return (
            st.sampled_from(options)
            if pool is None
            else st.one_of(pool, pool, pool, st.sampled_from(options))
        )

    def make_rule(a: Action) -> Callable[..., None]:
        key = ("enabled_inputs", a.name)

        def has_inputs(self: Any) -> bool:
            # ``bool(self.enabled_inputs(a))``, the kept list read directly.  A named function:
            # Hypothesis describes a precondition at every check, a lambda by its source.
            got = machine.answers_for(self.model).get(key)
            return bool(got if got is not None else self.enabled_inputs(a))

        has_inputs.__name__ = f"has_inputs_{a.name}"

        @precondition(has_inputs)
        @rule(data=st.data())
        def step(self: Any, data: st.DataObject) -> None:
            # The strategy is kept with the state's answers: a new strategy object is validated
            # afresh by every draw (a tenth of Hypothesis' own time), the same one once.
            kept = machine.answers_for(self.model)
            strategy = kept.get(("strategy", a.name))
            if strategy is None:
                strategy = kept["strategy", a.name] = inputs_strategy(a, self.enabled_inputs(a))
            inputs = data.draw(strategy, label=a.name)
            self.perform(a, inputs)

        step.__name__ = f"do_{a.name}"
        return step

    for a in table.actions:
        setattr(Conformance, f"do_{a.name}", make_rule(a))

    if table.completeness is not None:

        def has_complete_prefix(self: Any) -> bool:
            return self.complete_prefix()[0] > 0  # type: ignore[no-any-return]

        @precondition(has_complete_prefix)
        @rule()
        def probe_completeness(self: Any) -> None:
            # The target must accept a new request's read path over a complete prefix (the
            # model accepts it: conforms() checked that); a refusal is a target-error.
            k, r = self.complete_prefix()
            assert table.completeness is not None
            counts["(completeness probes)"] += 1
            for a_name, params in table.completeness.probe(k, table.geometry, r):
                self.perform(table.action(a_name), dict(params))

        Conformance.probe_completeness = probe_completeness  # type: ignore[attr-defined]

    seeds = [[(name, dict(params)) for name, params in tr] for tr in seed_traces]
    if seeds:

        @initialize(data=st.data())
        def warm_up(self: Any, data: st.DataObject) -> None:
            i = data.draw(st.sampled_from(range(-1, len(seeds))), label="warm-up witness")
            for name, params in seeds[i] if i >= 0 else []:
                a = table.action(name)
                if self.attempt(
                    a, {q.name: params[q.name] for q in _inputs(a) if q.name in params}
                ):
                    self.conforms()  # every step checked, as in a replay of the trace

        Conformance.warm_up = warm_up  # type: ignore[attr-defined]

    if check_refusals:
        # built once (a strategy is validated at its first draw): the same draws as building
        # them per call from the same lists
        any_action = st.sampled_from([x.name for x in table.actions])
        any_value = {kind: st.sampled_from(list(machine.domain(kind))) for kind in ParamKind}

        @rule(data=st.data())
        def refuses_disabled(self: Any, data: st.DataObject) -> None:
            # Near misses first: actions whose guard fails on exactly one conjunct are where an
            # implementation that forgets one check (a seeded bug, a real one) would accept.
            near = self.near_misses()
            if near and data.draw(st.booleans(), label="near miss"):
                kept = machine.answers_for(self.model)
                among = kept.get(("near strategy",))
                if among is None:
                    among = kept["near strategy",] = st.sampled_from(near)
                a_name, inputs = data.draw(among, label="disabled action")
                self.expect_refusal(table.action(a_name), dict(inputs))
                return
            a = table.action(data.draw(any_action, label="disabled action"))
            inputs = {}
            for q in _inputs(a):
                inputs[q.name] = data.draw(any_value[q.kind], label=q.name)
            outs = {q.name: 0 for q in a.params if q.kind in OUTPUT_KINDS}
            if machine.is_enabled(self.model, a, {**inputs, **outs}):
                return
            self.expect_refusal(a, inputs)

        Conformance.refuses_disabled = refuses_disabled  # type: ignore[attr-defined]

    Conformance.__name__ = f"Conformance_{table.name}"
    Conformance.table = table  # type: ignore[attr-defined]
    Conformance.machine = machine  # type: ignore[attr-defined]
    return Conformance


def _close(m: Any) -> None:
    close = getattr(m.target, "close", None)
    if callable(close):
        close()


def replay_seeds(
    machine_cls: type[RuleBasedStateMachine],
    table: Table,
    seeds: Sequence[Sequence[tuple[str, Mapping[str, int]]]],
) -> None:
    """Deterministic coverage pass: each seed trace in lockstep from Init, checked every step.

    Like Hypothesis' ``@example`` for state machines: it guarantees every seeded path (e.g. every
    reachability witness) is exercised in every run, before the random exploration starts.
    After every step, every near miss (an action whose guard is false on exactly one conjunct)
    must be refused.  A finding is raised as :class:`Nonconformance` whose ``trace`` is the
    witness up to the failing step (a failing near-miss check is its last step; passing checks
    change nothing and are left out); :func:`minimize` shrinks it.
    """
    for idx, trace in enumerate(seeds):
        m: Any = machine_cls()
        m.in_hypothesis = False
        sweep = False
        try:
            m.conforms()
            for name, params in trace:
                a = table.action(name)
                m.attempt(a, {q.name: params[q.name] for q in _inputs(a) if q.name in params})
                m.conforms()
                sweep = True
                for a_name, inputs in m.near_misses():
                    done = len(m.steps)
                    m.expect_refusal(table.action(a_name), dict(inputs))
                    del m.steps[done:]
                sweep = False
        except Nonconformance as exc:
            exc.origin = f"coverage pass (witness trace {idx + 1} of {len(seeds)}" + (
                ", near-miss refusal sweep)" if sweep else ")"
            )
            raise
        finally:
            _close(m)


def replay_trace(
    machine_cls: type[RuleBasedStateMachine], steps: Sequence[Step]
) -> tuple[Nonconformance | None, int, list[TraceStep]]:
    """Replay ``steps`` from Init on a FRESH target and model, checking after every step.

    Each step is fired if the model allows it, else the target must refuse it.  Returns the
    finding (or None), the index of the step it arose at (-1: at Init; the last index when
    none), and the steps the run took.
    """
    table: Table = machine_cls.table  # type: ignore[attr-defined]
    m: Any = machine_cls()
    m.in_hypothesis = False
    at = -1
    try:
        m.conforms()
        for name, params in steps:
            at += 1
            a = table.action(name)
            m.attempt(a, {q.name: params[q.name] for q in _inputs(a) if q.name in params})
            m.conforms()
    except Nonconformance as exc:
        return exc, at, m.steps
    finally:
        _close(m)
    return None, len(steps) - 1, m.steps


@dataclass
class Minimized:
    """The outcome of :func:`minimize`."""

    steps: list[TraceStep]  # the minimized trace, as its final fresh replay took it
    failure: Nonconformance  # the failure that replay raised
    before: int  # steps in the trace it started from
    replays: int  # fresh replays tried
    seconds: float
    reproduced: bool  # the starting trace failed the same way on a fresh replay
    complete: bool  # a fixpoint: no single step can be removed or parameter lowered

    @property
    def after(self) -> int:
        return len(self.steps)


def _simpler(machine: Machine, kind: ParamKind, v: int) -> list[int]:
    """Smaller values for a parameter, smallest first (whole LCM blocks first for tokens)."""
    lower = [x for x in machine.domain(kind) if x < v]
    if kind is ParamKind.TOKENS:
        step = machine.table.consts.L
        return [x for x in lower if x % step == 0] + [x for x in lower if x % step]
    return lower


def _relabel(steps: list[Step], table: Table, kind: ParamKind) -> list[Step]:
    """Rename the block (request) indices by order of first appearance: 0, 1, ..."""
    names: dict[int, int] = {}
    out = []
    for name, params in steps:
        p = dict(params)
        for q in table.action(name).params:
            if q.kind is kind and q.name in p:
                p[q.name] = names.setdefault(p[q.name], len(names))
        out.append((name, p))
    return out


def minimize(
    machine_cls: type[RuleBasedStateMachine],
    failure: Nonconformance,
    *,
    max_replays: int = 400,
    max_seconds: float = 60.0,
) -> Minimized:
    """Shrink ``failure.trace`` to a short trace that fails *the same way*.

    Delta debugging over the steps (remove chunks, halving down to single steps), then lower
    each parameter (and rename blocks/requests to 0, 1, ...), repeated to a fixpoint.  Every
    candidate is replayed from Init on a fresh target and model (:func:`replay_trace`: no
    state carries over between replays) and kept only if it raises a :class:`Nonconformance`
    that is :meth:`~Nonconformance.same_as` the original (same kind; same refused action and
    conjuncts, same first mismatched field, same first invariant); steps after the failing one
    are dropped.
    """
    table: Table = machine_cls.table  # type: ignore[attr-defined]
    machine: Machine = machine_cls.machine  # type: ignore[attr-defined]
    original = [s.step for s in failure.trace]
    started = time.monotonic()
    replays = 0

    def over() -> bool:
        return replays >= max_replays or time.monotonic() - started > max_seconds

    def check(cand: list[Step]) -> tuple[list[Step], Nonconformance, list[TraceStep]] | None:
        nonlocal replays
        replays += 1
        exc, i, taken = replay_trace(machine_cls, cand)
        if exc is None or not exc.same_as(failure):
            return None
        return cand[: i + 1], exc, taken

    first = check(original)
    if first is None:
        return Minimized(
            failure.trace, failure, len(original), replays, 0.0, reproduced=False, complete=False
        )
    cur, exc, taken = first
    complete = False
    while not over():
        changed = False
        # 1. delta debugging: try removing each of n chunks, refining n up to single steps
        n = 2
        while cur and not over():
            size = -(-len(cur) // n)
            for k in range(0, len(cur), size):
                r = check(cur[:k] + cur[k + size :])
                if r is not None:
                    cur, exc, taken = r
                    n, changed = max(n - 1, 2), True
                    break
                if over():
                    break
            else:
                if size == 1:
                    break
                n = min(2 * n, len(cur))
        # 2. simpler parameters, one at a time, then canonical block / request names
        j = 0
        while j < len(cur) and not over():
            name, params = cur[j]
            for q in _inputs(table.action(name)):
                if q.name not in params:
                    continue
                for v in _simpler(machine, q.kind, params[q.name]):
                    cand = list(cur)
                    cand[j] = (name, {**params, q.name: v})
                    r = check(cand)
                    if r is not None:
                        cur, exc, taken = r
                        changed = True
                        break
                    if over():
                        break
                if j >= len(cur) or over():
                    break
                params = cur[j][1]
            j += 1
        for kind in (ParamKind.BLOCK, ParamKind.REQ):
            cand = _relabel(cur, table, kind)
            if cand != cur and not over():
                r = check(cand)
                if r is not None:
                    cur, exc, taken = r
                    changed = True
        if not changed:
            complete = not over()
            break
    exc.origin = failure.origin
    return Minimized(taken, exc, len(original), replays, time.monotonic() - started, True, complete)


def run_conformance(
    table: Table,
    factory: TargetFactory | None = None,
    N: int | None = None,
    *,
    profile: settings | None = None,
    seeds: Sequence[Sequence[tuple[str, Mapping[str, int]]]] = (),
    stats: Counter[str] | None = None,
) -> Counter[str]:
    """The seeded coverage pass, then Hypothesis' random walks; raises on the first divergence."""
    from hypothesis.stateful import run_state_machine_as_test

    counts: Counter[str] = stats if stats is not None else Counter()
    cls = build_state_machine(table, N, factory, stats=counts, seed_traces=seeds)
    replay_seeds(cls, table, seeds)
    run_state_machine_as_test(cls, settings=profile or settings.get_profile("ci"))
    return counts
