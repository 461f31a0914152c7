"""The registry ``kvstate fuzz --target`` reads, and the toolkit's minimizer."""

from __future__ import annotations

from kvstate.harness.ddmin import ddmin
from kvstate.targets import FACTORY, TARGETS, lookup


def test_every_target_row_loads_a_runner() -> None:
    assert list(TARGETS) == ["kvstate-api", "kvstate", "model", "vllm", "vllm-scheduler", "sglang"]
    for entry in TARGETS.values():
        assert callable(entry.load()), entry
    assert lookup("pkg.mod:factory") is FACTORY
    assert lookup("nosuch") is None


def test_ddmin_keeps_only_what_the_failure_needs() -> None:
    # fails when 3 and 7 both occur; a replay keeps the candidate up to the failing step (7)
    def fails(cand: list[int]) -> tuple[list[int], str] | None:
        if 3 in cand and 7 in cand:
            return cand[: cand.index(7) + 1], "failed"
        return None

    kept, why, changed = ddmin(list(range(12)), fails, "failed")
    assert kept == [3, 7] and why == "failed" and changed


def test_ddmin_stops_when_told() -> None:
    kept, _, changed = ddmin([1, 2, 3], lambda c: (c, None), None, over=lambda: True)
    assert kept == [1, 2, 3] and not changed
