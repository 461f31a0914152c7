"""The API fuzz run shared with a forked process (``kvstate/targets/api/beside.py``, ``_run_beside``).

The split must check and count exactly what the run in place does, and report every finding
exactly as the run in place reports it (found, numbered and blobbed by Hypothesis itself, or by
the coverage pass in this process).
"""

from __future__ import annotations

import os
from collections import Counter
from typing import Any

import pytest

import kvstate.targets.api.beside as ah
from kvstate.harness.finding import Nonconformance
from kvstate.harness.trace import TraceStep
from kvstate.spec import default_table
from kvstate.targets.api import (
    DEFAULT_OPS,
    ApiHarness,
    Coverage,
    RunResult,
    build_machine,
    explore_settings,
    run_api,
    witnesses,
)

TABLE = default_table()
N = 4
L = TABLE.consts.L

pytestmark = pytest.mark.skipif(
    not ah._second_cpu(), reason="the split needs os.fork and a second CPU"
)


def _same_report(a: RunResult, b: RunResult) -> None:
    fa, fb = a.finding, b.finding
    assert (fa is None) == (fb is None), (fa, fb)
    if fa is not None and fb is not None:
        assert (fa.kind, fa.detail, str(fa)) == (fb.kind, fb.detail, str(fb))
        assert fa.trace == fb.trace
    assert (a.origin, a.blob, a.found_len) == (b.origin, b.blob, b.found_len)
    assert a.coverage.counts == b.coverage.counts
    assert a.stats == b.stats


def test_the_split_run_checks_and_counts_what_the_run_in_place_does() -> None:
    split = run_api(TABLE, N, profile="ci")
    here = run_api(TABLE, N, profile="ci", beside=False)
    assert split.shared and not here.shared
    assert split.finding is None
    _same_report(split, here)
    assert split.stats["(examples)"] > 0 and split.coverage.counts["bytes compared"] > 0


def test_the_dry_run_records_what_the_state_machine_applies() -> None:
    """The recorder draws the examples the real run applies, operation for operation (the
    rules' draws do not depend on what the harness does), example for example."""
    wit = list(witnesses(N, L, TABLE.consts.lease_max).values())
    prof = explore_settings("ci")
    applied: list[list[TraceStep]] = []

    class Logged(ApiHarness):
        def __init__(self, *a: Any, **k: Any) -> None:
            self.log: list[TraceStep] = []
            applied.append(self.log)
            super().__init__(*a, **k)

        def apply(self, o: TraceStep) -> None:
            if not getattr(self, "_inner", False):  # quiesce's own calls are not the rules'
                self.log.append(o)
            super().apply(o)

        def quiesce(self) -> None:
            self._inner = True
            try:
                super().quiesce()
            finally:
                self._inner = False

    recorded: list[list[TraceStep]] = []
    for harness in (
        Logged,
        lambda *a, **k: ah._Recorder(recorded),
    ):
        cls = build_machine(
            TABLE, N, stats=Counter(), coverage=Coverage(), seeds=wit, harness=harness
        )
        found, _ = ah._hypothesis(cls, prof)
        assert found is None
    assert len(recorded) > 10 and recorded == applied


def _plant(monkeypatch: pytest.MonkeyPatch, when: Any) -> None:
    """A bug the harness reports as a finding, on the operations ``when`` picks (the forked
    process inherits it)."""
    real = ApiHarness.apply

    def apply(self: ApiHarness, o: TraceStep) -> None:
        real(self, o)
        if when(o):
            raise self.fail("observe", ["planted"], f"planted failure at {o.render()}")

    monkeypatch.setattr(ApiHarness, "apply", apply)


def test_a_finding_in_an_example_is_reported_as_hypothesis_reports_it_in_place(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # no witness corrupts block 0 (they corrupt blocks 2 and 3): Hypothesis' examples do
    _plant(monkeypatch, lambda o: o.name == "corrupt" and o.arg("b") == 0)
    split = run_api(TABLE, N, profile="ci", minimize=False)
    here = run_api(TABLE, N, profile="ci", minimize=False, beside=False)
    assert split.shared and split.finding is not None
    assert split.origin.startswith("Hypothesis, example") and split.blob
    # found past the first example: the examples before it passed beside and were not run again
    assert int(split.origin.rsplit(" ", 1)[1]) > 1
    _same_report(split, here)


@pytest.mark.parametrize("when", ["host_tail", "offload"])
def test_a_finding_in_a_witness_is_reported_as_the_coverage_pass_reports_it(
    monkeypatch: pytest.MonkeyPatch, when: str
) -> None:
    """After the fork (``host_tail``: witness 9) and before it (``offload``: witness 1)."""
    _plant(monkeypatch, lambda o: o.name == when)
    split = run_api(TABLE, N, profile="ci", minimize=False)
    here = run_api(TABLE, N, profile="ci", minimize=False, beside=False)
    assert split.shared and split.origin.startswith("coverage pass (witness")
    _same_report(split, here)


def test_a_crashed_child_leaves_the_exploration_to_this_process(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    parent = os.getpid()
    real = ah._work_queue

    def work_queue(*a: Any, **k: Any) -> Any:
        if os.getpid() != parent:
            os._exit(3)
        return real(*a, **k)

    monkeypatch.setattr(ah, "_work_queue", work_queue)
    split = run_api(TABLE, N, profile="ci")
    here = run_api(TABLE, N, profile="ci", beside=False)
    _same_report(split, here)


def test_an_example_that_fails_only_in_the_split_is_an_error_not_a_pass(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def example(*a: Any) -> None:
        raise Nonconformance("observe", ["planted"], "only in the split")

    monkeypatch.setattr(ah, "_example", example)
    with pytest.raises(RuntimeError, match="not in Hypothesis' run"):
        run_api(TABLE, N, profile="ci", ops=DEFAULT_OPS)
