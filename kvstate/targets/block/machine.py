"""A Hypothesis state machine generated from the table, driving the model and a target in lockstep.

One rule per action, with "some parameters satisfy the guard" as its precondition and the
parameters drawn among those that do; one rule that draws a *disabled* action and checks the
target refuses it without changing state; and an invariant that, after every step, checks
every table invariant and compares ``target.observe()`` with the model.

The target is pluggable: ``ModelTarget`` (the reference interpreter itself, for model-level
random walks) or any object with one method per action plus ``observe()`` -- the adapter
protocol of ``kvstate fuzz``.  Each example gets a fresh target from the factory, so nothing
carries over between examples.

Findings are raised as the toolkit's :class:`Nonconformance` (a kind and details: which
invariant, which ``observe()`` fields, which refused action and conjunct) carrying the steps
that led to them.  The model's answers per state are kept on the walk's machine
(``_LockstepMachine``, a ``KeptMachine``): the class's ``enabled_inputs``, ``near_misses``,
``complete_prefix`` and the completeness check run once per distinct model state (and set of
disturbed blocks), and the rules' strategies are built once per state and shared by states
with the same options.  The ci walks follow :data:`CI_SEED`, pinned, not the class's source.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from hypothesis import event, target
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from kvstate.harness.finding import Nonconformance
from kvstate.harness.trace import TraceStep
from kvstate.spec.errors import ActionRefused
from kvstate.spec.phases import Req
from kvstate.spec.state import ConcreteState
from kvstate.spec.table import Action, ParamKind, Table

from .observe import canonical, diff, with_ghosts
from .target import (
    OUTPUT_KINDS,
    ModelTarget,
    TargetFactory,
    _inputs,
    _LockstepMachine,
    _ObservedTarget,
)

# The seed of the derandomized ci walks, pinned (printed in the run's header): the one
# Hypothesis derived from this machine's source before the seed was pinned, so ci runs draw
# the examples they drew then (``kvstate fuzz --target kvstate --profile ci``: 3173 steps).
CI_SEED = int(
    "6bce815092478ef20b14bbffc076fdfb863b314faa78d47dec512a78d04a39a8"
    "f7962b8b8f82a1b72cde765271691852",
    16,
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

        # -- the model's answers, kept per state value ------------------------------------
        # Pure functions of the model state (and the blocks a disturbing action touched), kept
        # on the machine (``_LockstepMachine``) and run once per distinct state; callers only
        # read them (the rules draw from them, ``perform`` and ``expect_refusal`` copy what
        # they take).  A completeness check is skipped where it passed on the same (a failing
        # one raises and is never kept: it fails afresh).
        def enabled_inputs(self, a: Action) -> list[dict[str, int]]:
            kept = machine.answers_for(self.model)
            key = ("enabled_inputs", a.name)
            got = kept.get(key)
            if got is None:
                got = kept[key] = self._enabled_inputs(a)
            return got  # type: ignore[no-any-return]

        def near_misses(self) -> list[tuple[str, tuple[tuple[str, int], ...]]]:
            kept = machine.answers_for(self.model)
            got = kept.get(("near_misses",))
            if got is None:
                got = kept["near_misses",] = self._near_misses()
            return got  # type: ignore[no-any-return]

        def complete_prefix(self) -> tuple[int, int]:
            kept = machine.answers_for(self.model)
            key = ("complete_prefix", frozenset(self.disturbed))
            got = kept.get(key)
            if got is None:
                got = kept[key] = self._complete_prefix()
            return got  # type: ignore[no-any-return]

        def check_completeness(self) -> None:
            kept = machine.answers_for(self.model)
            key = ("completeness checked", frozenset(self.disturbed))
            if key not in kept:
                self._check_completeness()
                kept[key] = True

        # -- completeness (the table's rule: the write path enables the read path) -----------
        def _complete_prefix(self) -> tuple[int, int]:
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

        def _check_completeness(self) -> None:
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

        def _enabled_inputs(self, a: Action) -> list[dict[str, int]]:
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

        def _near_misses(self) -> list[tuple[str, tuple[tuple[str, int], ...]]]:
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
