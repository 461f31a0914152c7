"""The API harness's Hypothesis state machine (``kvstate fuzz --target kvstate-api``).

Its own module, kept small: Hypothesis derives a derandomized run's examples from the state
machine class's source, which ``inspect.getsource`` finds by parsing the whole module the class
is in, once per run (a module of 1,900 lines: about 35 ms).  The class's text is what it was in
``kvstate/targets/api/``, so the digest, and the examples ``--profile ci`` draws, are the same.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, rule

from kvstate.spec.table import Table
from kvstate.targets.api.base import Coverage, Op, op
from kvstate.targets.api.ops import OPS
from kvstate.targets.api.state import _HARNESS
from kvstate.targets.api.stored import FORGERIES


def build_machine(
    table: Table,
    N: int,
    *,
    ops: frozenset[str] | None = None,
    coverage: Coverage | None = None,
    stats: Counter[str] | None = None,
    seeds: Sequence[Sequence[Op]] = (),
    threads: bool = False,
    harness: Callable[..., Any] | None = None,
) -> type[RuleBasedStateMachine]:
    """A state machine whose rules are the harness operations (``ops``: a subset); ``harness``
    replaces :class:`ApiHarness` (``_Recorder``: a dry run that only keeps the operations)."""
    allowed = frozenset(OPS) if ops is None else ops
    L, R, lm = table.consts.L, table.consts.R, table.consts.lease_max
    counts = stats if stats is not None else Counter()
    cov = coverage if coverage is not None else Coverage()
    ii = st.integers(0, R - 1)
    # The class body's ``ApiHarness`` is this name: the real harness, or (``harness``) the dry
    # run's recorder.  The class's source stays the same either way, and Hypothesis derives the
    # derandomized walk from that source, so both draw the same examples.
    ApiHarness = harness if harness is not None else _HARNESS  # noqa: N806

    class ApiConformance(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.h = ApiHarness(table, N, coverage=cov, threads=threads)

        def do(self, o: Op) -> None:
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

    add(
        "request",
        i=ii,
        n=st.sampled_from([L + 1, 2 * L + 1, N * L + 1, N * L, 3 * L + 5, 2 * L]),
        life=st.integers(1, lm),
    )
    add("admit", i=ii)
    add("use", i=ii)
    add("finish", i=ii)
    add("abort", i=ii)
    add("append", i=ii, k=st.sampled_from([1, L, 2 * L]))
    add("read", i=ii)
    add("read_released", i=ii)
    add("mutate_tokens", i=ii)
    add("abort_in_use", i=ii)
    add("foreign", ns=st.integers(0, 1), n=st.sampled_from([2 * L + 1, N * L + 1]))
    add("bad_input", k=st.integers(0, 63))
    add("variant", p=st.integers(0, 1), n=st.sampled_from([2 * L + 1, N * L + 1]))
    add("refuse_arg", k=st.integers(0, 127))
    add("tick", t=st.integers(1, lm))
    add("tick_np", t=st.integers(1, lm))
    add("tick_default", t=st.just(1))
    for m in ("evict", "offload", "spill", "drop"):
        add(m, n=st.integers(1, N))
        add(f"{m}_np", n=st.integers(1, N))
        add(f"{m}_default")
    add("step", k=st.integers(0, 3))
    add("drain")
    add("corrupt", b=st.integers(0, N - 1), kind=st.integers(0, 2))
    add("read_error", b=st.integers(0, N - 1))
    add("damage", b=st.integers(0, N - 1), part=st.integers(0, 4))
    add("forge", b=st.integers(0, N - 1), k=st.integers(0, len(FORGERIES) - 1))
    add("host_tail", b=st.integers(0, N - 1))
    add("disk_full", on=st.integers(0, 1))
    add("spill_fills", n=st.integers(1, N))
    add("restart")
    add("act", a=st.integers(0, 31), k=st.integers(0, 15), on=st.integers(0, 3))  # single.py
    from kvstate.targets.api.graphs import graph_actions

    for g in graph_actions(table):  # kvstate/targets/api/graphs.py
        add(g)

    if seeds:
        seed_list = [list(s) for s in seeds]

        # the pools' sizes (kvstate/targets/api/pools.py: the first operation, a no-op elsewhere)
        @initialize(
            w=st.sampled_from(range(-1, len(seed_list))), k=st.integers(0, 4), g=st.integers(0, 3)
        )
        def warm_up(self: Any, w: int, k: int, g: int) -> None:
            if "pools" in allowed and k:
                self.do(op("pools", k=k))
            if "geometry" in allowed and g == 3:  # kvstate/targets/api/geometry.py
                self.do(op("geometry", k=1))
            for o in seed_list[w] if w >= 0 else []:
                if o.name in allowed:
                    self.do(o)

        ApiConformance.warm_up = warm_up  # type: ignore[attr-defined]
    return ApiConformance
