"""Exploration and minimization: the Hypothesis profiles and settings, the state machine
(:mod:`kvstate.targets.api.machine`) built over the harness, one replay of a trace on a fresh cache,
delta debugging of a finding, the coverage pass of the witnesses, and the vacuity check of a
run that found nothing.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from hypothesis import settings

from kvstate.examples_db import run_machine
from kvstate.harness.ddmin import shrink
from kvstate.harness.finding import Nonconformance
from kvstate.harness.profiles import NAMES, SIZES
from kvstate.harness.trace import TraceStep
from kvstate.spec.table import Table
from kvstate.targets.api.base import Coverage
from kvstate.targets.api.registry import MAPPING
from kvstate.targets.api.state import ApiHarness, _explainer, _machine

# The seed of the derandomized ci walks, pinned (printed in the run's header): the digest
# Hypothesis derived from the machine's source when the seed was pinned (an in-process run's);
# an edit of the machine's text no longer moves the walk.
CI_SEED = int(
    "887d42d893975d333cda46f79c8717c383fa23a4db0a989b3b71062b446bfdcd"
    "141865e39263df8b64a955de745807ac",
    16,
)

# The profiles' sizes are the target's entry in kvstate/harness/profiles.py, not restated here.
PROFILES: dict[str, dict[str, Any]] = {
    name: {
        "derandomize": name == "ci",
        "max_examples": SIZES["kvstate-api"][name][0],
        "stateful_step_count": SIZES["kvstate-api"][name][1],
    }
    for name in NAMES
}


# ---- replay and minimization ------------------------------------------------------------------
def replay(
    table: Table,
    N: int,
    ops: Sequence[TraceStep],
    *,
    coverage: Coverage | None = None,
    quiesce: bool = True,
) -> Nonconformance | None:
    """Replay ``ops`` on a fresh cache and model (then quiesce); the finding, or None."""
    h = ApiHarness(table, N, coverage=coverage)
    try:
        for o in ops:
            h.apply(o)
        if quiesce:
            h.quiesce()
    except Nonconformance as exc:
        return exc
    finally:
        h.close()
    return None


def minimize_ops(
    table: Table, N: int, failure: Nonconformance, *, max_seconds: float = 60.0
) -> tuple[list[TraceStep], Nonconformance, int]:
    """The toolkit's minimizer (:func:`kvstate.harness.ddmin.shrink`: delta debugging over
    operations, then smaller arguments, one round), each candidate replayed on a fresh cache
    and kept only if it fails the same way (:meth:`Nonconformance.same_as`), cut after its
    failing operation."""
    started = time.monotonic()
    replays = 0

    def over() -> bool:
        return time.monotonic() - started > max_seconds

    def fails(cand: list[TraceStep]) -> tuple[list[TraceStep], Nonconformance] | None:
        nonlocal replays
        replays += 1
        got = replay(table, N, cand)
        if got is None or not got.same_as(failure):
            return None
        return cand[: len(got.trace)] or cand, got  # cut after its failure

    def simpler(o: TraceStep) -> Iterator[TraceStep]:
        for k, v in o.inputs.items():
            for smaller in range(0, v):
                yield TraceStep(o.name, {**o.inputs, k: smaller})

    # one round: a replay here is a whole cache and model, and a finding's trace is short
    # after one (the block target runs to a fixpoint)
    cur, best, _ = shrink(list(failure.trace), fails, failure, simpler=simpler, over=over, rounds=1)
    return cur, best, replays


def _vacuity(table: Table, N: int, cov: Coverage) -> Nonconformance | None:
    """A run that found nothing but never reached what it checks (kvstate/targets/api/refusals.py)
    is a failed run: its counters say so."""
    from kvstate.targets.api.refusals import vacuous

    ex = _explainer(_machine(table, N))
    empty = {c for c, (nfa, s, a) in ex.nfas.items() if a in nfa.closure([s])}
    gaps = vacuous(cov.counts, MAPPING, empty)
    if not gaps:
        return None
    f = Nonconformance(
        "vacuous",
        [gaps[0].split(" (")[0]],
        "the run checked nothing on its essential paths: " + "; ".join(gaps),
    )
    return f


def explore_settings(
    profile: str, examples: int | None = None, steps: int | None = None, seed: int | None = None
) -> settings:
    """Hypothesis' settings for a run of ``profile`` (no shrinking: findings are minimized by
    fresh replays)."""
    from hypothesis import HealthCheck, Phase

    kw = dict(PROFILES[profile])
    if examples is not None:
        kw["max_examples"] = examples
    if steps is not None:
        kw["stateful_step_count"] = steps
    if seed is not None:
        kw["derandomize"] = False
    return settings(
        deadline=None,
        database=None,
        print_blob=True,
        suppress_health_check=list(HealthCheck),
        phases=tuple(p for p in Phase if p is not Phase.shrink),
        **kw,
    )


def _hypothesis(cls: Any, prof: settings, key: bytes = b"") -> tuple[Nonconformance | None, str]:
    """``cls`` run by Hypothesis under ``prof`` (examples filed under ``key`` in its database):
    its finding (or None) and what it printed."""
    import contextlib
    import io

    buf = io.StringIO()
    try:
        with contextlib.redirect_stdout(buf):
            run_machine(cls, prof, key or b"kvstate-api")
    except Nonconformance as exc:
        return exc, buf.getvalue()
    return None, buf.getvalue()


def _coverage_pass(
    table: Table,
    N: int,
    wit: Mapping[str, Sequence[TraceStep]],
    cov: Coverage,
    stats: Counter[str],
    lo: int = 0,
    hi: int | None = None,
) -> tuple[Nonconformance | None, str]:
    """Every witness (``lo`` to ``hi``: some) replayed on a fresh cache, then quiesced: the
    first finding, and where."""
    for idx, (name, w) in list(enumerate(wit.items()))[lo:hi]:
        h = ApiHarness(table, N, coverage=cov)
        try:
            for o in w:
                stats["(steps)"] += 1
                h.apply(o)
            h.quiesce()
        except Nonconformance as exc:
            return exc, f"coverage pass (witness {idx + 1} of {len(wit)}: {name})"
        finally:
            h.close()
    return None, ""


def _example(
    table: Table, N: int, ops: Sequence[TraceStep], cov: Coverage, stats: Counter[str]
) -> None:
    """One recorded Hypothesis example, run as the state machine runs it: a fresh cache, each
    operation counted and applied, quiescence, the example counted, the cache closed."""
    h = ApiHarness(table, N, coverage=cov)
    try:
        for o in ops:
            stats["(steps)"] += 1
            h.apply(o)
        h.quiesce()
    finally:
        stats["(examples)"] += 1
        h.close()


class _Recorder:
    """Stands in for :class:`ApiHarness` in the exploration's dry run: it keeps the operations
    each example applies and checks nothing (the rules draw their arguments from strategies
    alone, with no precondition or bundle, so what Hypothesis draws does not depend on what the
    harness does; an example that passes leaves the walk where a dry one does)."""

    def __init__(self, sink: list[list[TraceStep]]) -> None:
        self.ops: list[TraceStep] = []
        sink.append(self.ops)

    def apply(self, o: TraceStep) -> None:
        self.ops.append(o)

    def quiesce(self) -> None:
        pass

    def close(self) -> None:
        pass
