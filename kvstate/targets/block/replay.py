"""Replays of the block-level target: the coverage pass over the proofs' witnesses, one trace on a
fresh target and model, and the minimizer (the toolkit's delta debugging, then simpler
parameters and canonical block / request names, to a fixpoint)."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine

from kvstate.harness.ddmin import shrink
from kvstate.harness.finding import Nonconformance
from kvstate.harness.profiles import pin, seed_only
from kvstate.harness.trace import Step, TraceStep
from kvstate.model.concrete import Machine
from kvstate.spec.table import ParamKind, Table

from .machine import CI_SEED, build_state_machine
from .target import TargetFactory, _inputs


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

    The toolkit's minimizer (:func:`kvstate.harness.ddmin.shrink`): delta debugging over the
    steps, then each parameter lowered, then blocks/requests renamed 0, 1, ..., to a fixpoint.  Every
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

    def fails(cand: list[Step]) -> tuple[list[Step], tuple[Nonconformance, list[TraceStep]]] | None:
        r = check(cand)
        return None if r is None else (r[0], (r[1], r[2]))

    def simpler(step: Step) -> Iterator[Step]:
        """Each input parameter lowered, one at a time, smallest value first."""
        name, params = step
        for q in _inputs(table.action(name)):
            if q.name in params:
                for v in _simpler(machine, q.kind, params[q.name]):
                    yield (name, {**params, q.name: v})

    canonical = [partial(_relabel, table=table, kind=k) for k in (ParamKind.BLOCK, ParamKind.REQ)]
    cur, (exc, taken), complete = shrink(
        first[0], fails, (first[1], first[2]), simpler=simpler, rewrites=canonical, over=over
    )
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
    prof = profile or settings.get_profile("ci")
    if prof.derandomize:
        pin(cls, CI_SEED)
    with seed_only():
        run_state_machine_as_test(cls, settings=prof)
    return counts
