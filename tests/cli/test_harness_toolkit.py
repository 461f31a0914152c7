"""The toolkit every target shares (``kvstate/harness/``): one minimizer, one finding type, one
report.  The block and API targets keep their own Hypothesis loops (ARCHITECTURE.md says why);
what a finding is, how it is cut down and how it is printed must still be the toolkit's."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from kvstate.harness.ddmin import shrink
from kvstate.harness.finding import Nonconformance
from kvstate.harness.report import field_lines, finding_lines, seed_text
from kvstate.harness.trace import TraceStep

ROOT = Path(__file__).resolve().parents[2]


def test_shrink_removes_lowers_and_rewrites_to_a_fixpoint() -> None:
    """A list fails while it holds an item >= 3 after an item 1: ddmin keeps two items, the
    simpler values lower the large one to 3, and a rewrite (sorting) is kept when it fails."""
    calls = 0

    def fails(cand: list[int]) -> tuple[list[int], str] | None:
        nonlocal calls
        calls += 1
        ok = any(x == 1 and any(y >= 3 for y in cand[i + 1 :]) for i, x in enumerate(cand))
        return (cand, "same") if ok else None

    items = [5, 1, 0, 2, 9, 4, 7]
    got, res, complete = shrink(
        items,
        fails,
        "same",
        simpler=lambda x: range(x),
        rewrites=[sorted],
    )
    assert got == [1, 3] and res == "same" and complete
    assert calls < 100


def test_shrink_stops_when_over_and_says_so() -> None:
    got, _, complete = shrink(
        [3, 2, 1], lambda c: (c, None) if c else None, None, over=lambda: True
    )
    assert got == [3, 2, 1] and not complete


def test_every_target_minimizes_through_the_toolkit() -> None:
    """No target module imports :func:`ddmin` itself: each minimizes with :func:`shrink`."""
    users: dict[str, set[str]] = {}
    for p in sorted((ROOT / "kvstate").rglob("*.py")):
        rel = p.relative_to(ROOT).as_posix()
        if rel.startswith("kvstate/harness/"):
            continue
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").endswith("harness.ddmin"):
                users[rel] = {a.name for a in node.names}
    assert users, "no target minimizes"
    assert all(names == {"shrink"} for names in users.values()), users
    for rel in ("kvstate/targets/block/replay.py", "kvstate/targets/api/explore.py"):
        assert rel in users


def test_an_api_finding_carries_its_trace_in_the_toolkit_field() -> None:
    """The API target's finding is the toolkit's :class:`Nonconformance` with its ``trace``."""
    from kvstate.spec.default import default_table
    from kvstate.targets.api.base import op
    from kvstate.targets.api.state import ApiHarness

    table = default_table()
    n, L = 4, table.consts.L
    h = ApiHarness(table, n)
    ops = [op("request", i=0, n=n * L + 1, life=1), op("tick", t=1)]
    try:
        h.apply(ops[0])
        h.hooks.leak_device_slot()
        with pytest.raises(Nonconformance) as info:
            h.apply(ops[1])
    finally:
        h.close()
    f = info.value
    assert [s.call() for s in f.trace] == [s.call() for s in ops]
    assert not hasattr(f, "api_trace")


def test_the_report_lines_are_the_toolkits() -> None:
    f = Nonconformance("vacuous", ["x"], "nothing checked")
    f.origin = "the run's own counters"
    lines = finding_lines(f, "minimized 0 -> 0", [], empty="found at the run's end")
    assert lines[0] == "  found by:  the run's own counters; minimized 0 -> 0"
    assert lines[-1] == "      (none: found at the run's end)"
    step = TraceStep("admit", {"i": 0})
    assert finding_lines(f, "", [step])[-1] == "      1. admit(i=0)"
    assert field_lines({"seed": seed_text(7, 1, "dev"), "reproduce": "cmd"}) == [
        "  seed:      7",
        "  reproduce: cmd",
    ]
    assert seed_text(None, 255, "ci") == "255 (pinned; profile ci: the same examples every run)"


def test_shrink_stops_after_its_rounds() -> None:
    """One round: ddmin and one pass of simpler values, no second ddmin after the lowering."""

    def fails(cand: list[int]) -> tuple[list[int], None] | None:
        return (cand, None) if sum(cand) >= 4 else None

    got, _, complete = shrink([2, 9, 2], fails, None, simpler=lambda x: range(x), rounds=1)
    assert got == [4] and complete is False
    got, _, complete = shrink([2, 9, 2], fails, None, simpler=lambda x: range(x))
    assert got == [4] and complete
