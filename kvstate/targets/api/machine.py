"""The API harness's Hypothesis state machine (``kvstate fuzz --target kvstate-api``).

Its rules are the declared operations (:data:`kvstate.targets.api.registry.DECLARED`: one rule
``op_NAME`` per declaration, its arguments drawn from the declaration's strategies); nothing here
names an operation but the initializer's ``pools``.  Hypothesis collects a machine's rules by
name, and the ci walk follows the pinned seed (``CI_SEED`` in :mod:`kvstate.targets.api.explore`),
so the walk moves only when a rule's name or strategy does, or a rule is added.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, rule

from kvstate.harness.trace import TraceStep
from kvstate.spec.table import Table
from kvstate.targets.api.base import Coverage, op
from kvstate.targets.api.declare import Sizes
from kvstate.targets.api.registry import DECLARED, DEFAULT_OPS
from kvstate.targets.api.state import _HARNESS


def build_machine(
    table: Table,
    N: int,
    *,
    ops: frozenset[str] | None = None,
    coverage: Coverage | None = None,
    stats: Counter[str] | None = None,
    seeds: Sequence[Sequence[TraceStep]] = (),
    threads: bool = False,
    harness: Callable[..., Any] | None = None,
) -> type[RuleBasedStateMachine]:
    """A state machine whose rules are the harness operations (``ops``: a subset); ``harness``
    replaces :class:`ApiHarness` (``_Recorder``: a dry run that only keeps the operations)."""
    allowed = DEFAULT_OPS if ops is None else ops
    counts = stats if stats is not None else Counter()
    cov = coverage if coverage is not None else Coverage()
    # The class body's ``ApiHarness`` is this name: the real harness, or (``harness``) the dry
    # run's recorder.  The rules and the seed are the same either way, so both draw the same
    # examples.
    ApiHarness = harness if harness is not None else _HARNESS  # noqa: N806

    class ApiConformance(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.h = ApiHarness(table, N, coverage=cov, threads=threads)

        def do(self, o: TraceStep) -> None:
            counts["(steps)"] += 1
            self.h.apply(o)

        def teardown(self) -> None:
            try:
                self.h.quiesce()
            finally:
                counts["(examples)"] += 1
                self.h.close()

    def add(name: str, **strats: Any) -> None:
        if name not in allowed:
            return

        @rule(**strats)
        def r(self: Any, **kw: int) -> None:
            self.do(op(name, **kw))

        r.__name__ = f"op_{name}"
        setattr(ApiConformance, r.__name__, r)

    sizes = Sizes.of(table, N)
    for d in DECLARED:  # one rule per declared operation (kvstate/targets/api/registry.py)
        if d.rule:
            add(d.name, **d.args(sizes))

    if seeds:
        seed_list = [list(s) for s in seeds]

        # the pools' sizes (kvstate/targets/api/pools.py: the first operation, a no-op elsewhere)
        @initialize(
            w=st.sampled_from(range(-1, len(seed_list))), k=st.integers(0, 4), g=st.integers(0, 3)
        )
        def warm_up(self: Any, w: int, k: int, g: int) -> None:
            if "pools" in allowed and k:
                self.do(op("pools", k=k))
            if "forms" in allowed and g == 1:  # kvstate/targets/api/forms.py
                self.do(op("forms"))
            if "geometry" in allowed and g == 3:  # kvstate/targets/api/geometry.py
                self.do(op("geometry", k=1))
            for o in seed_list[w] if w >= 0 else []:
                if o.name in allowed:
                    self.do(o)

        ApiConformance.warm_up = warm_up  # type: ignore[attr-defined]
    return ApiConformance
