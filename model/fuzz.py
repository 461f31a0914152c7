"""A Hypothesis state machine generated from the table, driving the model and a target in lockstep.

One rule per action, with "some parameters satisfy the guard" as its precondition and the
parameters drawn among those that do; one rule that draws a *disabled* action and checks the
target refuses it without changing state; and an invariant that, after every step, checks
every table invariant and compares ``target.observe()`` with the model.

The target is pluggable: ``ModelTarget`` (the reference interpreter itself, for model-level
random walks) or any object with one method per action plus ``observe()`` -- the adapter
protocol of ``kvstate fuzz``.  Each example gets a fresh target from the factory, so nothing
carries over between examples.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from hypothesis import event, settings, target
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from kvstate.spec.errors import ActionRefused
from kvstate.spec.state import ConcreteState
from kvstate.spec.table import Action, ParamKind, Scope, Table

from .concrete import GuardError, Machine

OUTPUT_KINDS = (ParamKind.ADDR, ParamKind.FMT)  # chosen by the target, fed to the model
ADDRESS_VARS = ("addr", "gaddr", "paddr")

settings.register_profile(
    "ci", derandomize=True, max_examples=60, stateful_step_count=40, deadline=None, print_blob=True
)
settings.register_profile(
    "dev", max_examples=300, stateful_step_count=50, deadline=None, print_blob=True
)
settings.register_profile(
    "nightly", max_examples=5000, stateful_step_count=100, deadline=None, print_blob=True
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
                    params[q.name] = outs[q.name] = (
                        0 if q.kind is ParamKind.FMT else 3 * self.m.N + 1
                    )
            try:
                self.s = self.m.step(self.s, action, params)
            except GuardError as exc:
                raise ActionRefused(str(exc)) from exc
            return outs or None

        return do

    def observe(self) -> dict[str, Any]:
        return self.s.values


def canonical(values: Mapping[str, Any], table: Table) -> dict[str, Any]:
    """Addresses renamed by order of first appearance: equal iff equal up to a bijection."""
    names: dict[int, int] = {}

    def rn(x: int) -> int:
        return names.setdefault(x, len(names))

    out = dict(values)
    for var in ADDRESS_VARS:
        if var not in values:
            continue
        scope = table.var(var).scope
        v = values[var]
        if scope is Scope.BLOCK:
            out[var] = tuple(rn(x) for x in v)
        elif scope is Scope.REQ_BLOCK:
            out[var] = tuple(tuple(rn(x) for x in row) for row in v)
    return out


def diff(model: Mapping[str, Any], observed: Mapping[str, Any], table: Table) -> list[str]:
    a, b = canonical(model, table), canonical(observed, table)
    out = []
    for v in table.vars:
        if v.name not in b:
            out.append(f"{v.name}: missing from observe()")
        elif a[v.name] != b[v.name]:
            out.append(f"{v.name}: model {a[v.name]!r} != target {b[v.name]!r}")
    return out


def _inputs(action: Action) -> list[Any]:
    return [q for q in action.params if q.kind not in OUTPUT_KINDS]


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
    hit) are reached in every run rather than by luck.  Steps whose guard is false are skipped.
    """
    n = N if N is not None else table.geometry.model_blocks
    make = factory or (lambda t, k: ModelTarget(t, k))
    machine = Machine(table, n)
    counts = stats if stats is not None else Counter()

    class Conformance(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.model = machine.init()
            self.target = make(table, n)
            self._enabled: dict[str, list[dict[str, int]]] | None = None
            self.trace: list[str] = []
            self.in_hypothesis = True  # events may be recorded only inside a Hypothesis test

        # -- helpers ------------------------------------------------------------------------
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

        def attempt(self, a: Action, inputs: dict[str, int]) -> None:
            """Fire ``a`` if the model allows it; otherwise the target must refuse it unchanged."""
            if any(inputs.get(q.name) not in machine.domain(q.kind) for q in _inputs(a)):
                return  # a seed step for a larger pool than this run's
            if inputs in self.enabled_inputs(a):
                self.perform(a, inputs)
                return
            self.expect_refusal(a, inputs)

        def expect_refusal(self, a: Action, inputs: dict[str, int]) -> None:
            outs = {q.name: 0 for q in a.params if q.kind in OUTPUT_KINDS}
            before = self.target.observe()
            try:
                getattr(self.target, a.name)(**inputs)
            except ActionRefused:
                pass
            else:
                raise AssertionError(
                    f"target performed {a.name}({inputs}) although its guard "
                    f"{machine.failed_conjuncts(self.model, a, {**inputs, **outs})} is false"
                    f" (after {' ; '.join(self.trace[-8:]) or 'Init'})"
                )
            after = self.target.observe()
            assert diff(before, after, table) == [], f"refused {a.name} still changed state"
            counts["(refused)"] += 1

        def perform(self, a: Action, inputs: dict[str, int]) -> None:
            method = getattr(self.target, a.name)
            try:
                out = method(**inputs) or {}
            except Exception as exc:  # noqa: BLE001 - any target failure on an allowed step is a finding
                raise AssertionError(
                    f"target failed {a.name}({inputs}), which the model allows, after "
                    f"{' ; '.join(self.trace[-8:]) or 'Init'}: {type(exc).__name__}: {exc}"
                ) from exc
            params = dict(inputs)
            for q in a.params:
                if q.kind in OUTPUT_KINDS:
                    if q.name not in out:
                        raise AssertionError(
                            f"target's {a.name} did not return output parameter {q.name!r}"
                        )
                    params[q.name] = int(out[q.name])
            self.model = machine.step(self.model, a, params)
            self._enabled = None
            counts[a.name] += 1
            if self.in_hypothesis:
                event(f"action {a.name}")
            self.trace.append(f"{a.name}({', '.join(f'{k}={v}' for k, v in params.items())})")

        # -- invariants ---------------------------------------------------------------------
        @invariant()
        def conforms(self) -> None:
            viol = machine.violations(self.model)
            assert not viol, f"model invariant broken: {', '.join(map(str, viol))}"
            observed = self.target.observe()
            d = diff(self.model.values, observed, table)
            assert not d, (
                "implementation diverges from the model after "
                + (" ; ".join(self.trace[-8:]) or "Init")
                + ":\n  "
                + "\n  ".join(d)
            )
            obs_state = ConcreteState(
                canonical(observed, table), n, table.consts, self.model._req_names
            )
            bad = machine.violations(obs_state)
            assert not bad, f"observed state breaks {', '.join(map(str, bad))}"
            check_data = getattr(self.target, "check_data", None)
            if callable(check_data):
                problems = check_data()
                assert not problems, (
                    "data read by a running request is wrong after "
                    + (" ; ".join(self.trace[-8:]) or "Init")
                    + ":\n  "
                    + "\n  ".join(problems)
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

    def make_rule(a: Action) -> Callable[..., None]:
        @precondition(lambda self: bool(self.enabled_inputs(a)))
        @rule(data=st.data())
        def step(self: Any, data: st.DataObject) -> None:
            options = self.enabled_inputs(a)
            # Whole-LCM-block hit lengths are the interesting ones; keep a few ragged ones too.
            aligned = [
                o
                for o in options
                if all(
                    o[q.name] % table.consts.L == 0 for q in a.params if q.kind is ParamKind.TOKENS
                )
            ]
            pool = st.sampled_from(aligned) if aligned and len(aligned) < len(options) else None
            strategy = (
                st.sampled_from(options)
                if pool is None
                else st.one_of(pool, pool, pool, st.sampled_from(options))
            )
            inputs = data.draw(strategy, label=a.name)
            self.perform(a, inputs)

        step.__name__ = f"do_{a.name}"
        return step

    for a in table.actions:
        setattr(Conformance, f"do_{a.name}", make_rule(a))

    seeds = [[(name, dict(params)) for name, params in tr] for tr in seed_traces]
    if seeds:

        @initialize(data=st.data())
        def warm_up(self: Any, data: st.DataObject) -> None:
            i = data.draw(st.sampled_from(range(-1, len(seeds))), label="warm-up witness")
            for name, params in seeds[i] if i >= 0 else []:
                a = table.action(name)
                self.attempt(a, {q.name: params[q.name] for q in _inputs(a) if q.name in params})

        Conformance.warm_up = warm_up  # type: ignore[attr-defined]

    if check_refusals:

        @rule(data=st.data())
        def refuses_disabled(self: Any, data: st.DataObject) -> None:
            # Near misses first: actions whose guard fails on exactly one conjunct are where an
            # implementation that forgets one check (a seeded bug, a real one) would accept.
            near = self.near_misses()
            if near and data.draw(st.booleans(), label="near miss"):
                a_name, inputs = data.draw(st.sampled_from(near), label="disabled action")
                self.expect_refusal(table.action(a_name), dict(inputs))
                return
            a = table.action(
                data.draw(st.sampled_from([x.name for x in table.actions]), label="disabled action")
            )
            inputs = {}
            for q in _inputs(a):
                dom = machine.domain(q.kind)
                inputs[q.name] = data.draw(st.sampled_from(list(dom)), label=q.name)
            outs = {q.name: 0 for q in a.params if q.kind in OUTPUT_KINDS}
            if machine.is_enabled(self.model, a, {**inputs, **outs}):
                return
            self.expect_refusal(a, inputs)

        Conformance.refuses_disabled = refuses_disabled  # type: ignore[attr-defined]

    Conformance.__name__ = f"Conformance_{table.name}"
    return Conformance


def replay_seeds(
    machine_cls: type[RuleBasedStateMachine],
    table: Table,
    seeds: Sequence[Sequence[tuple[str, Mapping[str, int]]]],
) -> None:
    """Deterministic coverage pass: each seed trace in lockstep from Init, checked every step.

    Like Hypothesis' ``@example`` for state machines: it guarantees every seeded path (e.g. every
    reachability witness) is exercised in every run, before the random exploration starts.
    """
    for trace in seeds:
        m: Any = machine_cls()
        m.in_hypothesis = False
        try:
            m.conforms()
            for name, params in trace:
                a = table.action(name)
                m.attempt(a, {q.name: params[q.name] for q in _inputs(a) if q.name in params})
                m.conforms()
                # Refusal sweep: every near miss (guard false on exactly one conjunct) must be refused.
                for a_name, inputs in m.near_misses():
                    m.expect_refusal(table.action(a_name), dict(inputs))
        finally:
            close = getattr(m.target, "close", None)
            if callable(close):
                close()


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
