"""The short-read fault (``short_read``, declared once in kvstate/targets/api/ops.py): the ci
run injects it, and a library that takes a short disk read for a full one is caught."""

from __future__ import annotations

from kvstate.spec import default_table
from kvstate.targets.api import FAULT_OPS, MAPPING, run_api

TABLE = default_table()
N = 4


def test_short_read_is_declared_as_a_fault() -> None:
    assert FAULT_OPS["short_read"] == ("short_read",)
    assert MAPPING["short_read"] == MAPPING["read_error"] == "fault"


def test_ci_run_injects_short_reads() -> None:
    res = run_api(TABLE, N, profile="ci")
    assert res.finding is None, str(res.finding)
    c = res.coverage.counts
    assert c["fault short_read"] > 0, dict(c)
    assert c["loads failed"] > 0


def test_short_read_taken_for_full_is_caught() -> None:
    """The planted bug ``short_read_accepted`` (impl/disk.py keeps a payload read that came
    back short): the buffer holds the whole block, so the MACs pass and the load completes where
    the read failed.  The ci run finds it, and its minimized trace holds a short read: the
    ``short_read`` fault, or a load driven action by action with a short read
    (kvstate/targets/api/stepwise.py); no other operation makes a read come back short."""
    import shutil

    from kvstate.api_mutants import run_one, stage

    root = stage()
    try:
        r = run_one(root, "short_read_accepted", "ci", 300.0)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    assert r["killed"], r
    trace = str(r.get("trace", ""))
    assert "short_read(" in trace or "short read" in str(r.get("kind", "")), r
