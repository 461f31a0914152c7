"""What refusals state, reads answered in pieces, an unreadable stray, a refused open's
descriptors (kvstate/targets/api/stated.py, shortreads.py, strays.py, stored.py, fsrefusals.py):
the ci run makes each, and the planted bug of a class is caught by it."""

from __future__ import annotations

import shutil

import pytest

from kvstate.spec import default_table
from kvstate.targets.api import FAULT_OPS, MAPPING, run_api

TABLE = default_table()
N = 4


def test_declared_once() -> None:
    assert FAULT_OPS["short_reads"] == ("short_reads",)
    assert FAULT_OPS["stray"] == ("stray",)
    assert MAPPING["stated"] == "read"


def test_ci_run_makes_each() -> None:
    res = run_api(TABLE, N, profile="ci")
    assert res.finding is None, str(res.finding)
    c = res.coverage.counts
    for form in (
        "the tiers over the memory limit",
        "the CUDA-graph table's bytes",
        "an unknown request",
    ):
        assert c[f"check: what a refusal states ({form})"] > 0, dict(c)
    assert c["fault a short read (the read goes on)"] > 0, dict(c)
    assert c["check: the scan left an unreadable stray alone"] > 0, dict(c)
    assert c["fault refused open: the new key cannot be synced (EIO), descriptor 0 free"] > 0
    assert c["fault refused open: the key executable by others"] > 0


@pytest.mark.parametrize(
    ("name", "found"),
    [
        ("short_read_refills_buffer_start", "short_reads("),
        ("key_mode_ignores_execute_bits", "restart("),
    ],
)
def test_planted_bug_is_caught(name: str, found: str) -> None:
    from kvstate.api_mutants import run_one, stage

    root = stage()
    try:
        r = run_one(root, name, "ci", 300.0)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    assert r["killed"], r
    assert found in str(r.get("trace", "")), r
