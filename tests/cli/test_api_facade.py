"""The façade's seams and the production writer in the API harness (kvstate/targets/api/facade.py,
handed.py): the witnesses pass on the library, and each check fails on a bug planted in a
running cache's reads or writer."""

from __future__ import annotations

from typing import Any

import pytest

from kvstate.harness.finding import Nonconformance
from kvstate.spec import default_table
from kvstate.targets.api import ApiHarness, witnesses
from kvstate.targets.api.facade import CASES, block_only, guard_line
from kvstate.targets.api.handed import WRITER_CASES

TABLE = default_table()
N = 4
L = TABLE.consts.L
WITNESSES = (
    "the façade's seams refused and answered",
    "hits that end at each block boundary",
    "the production writer: a chain handed, stored, spilled, restored and hit",
)


def _run(name: str) -> tuple[Nonconformance | None, Any]:
    h = ApiHarness(TABLE, N)
    try:
        for o in witnesses(N, L, TABLE.consts.lease_max)[name]:
            h.apply(o)
        h.quiesce()
    except Nonconformance as exc:
        return exc, h.cov.counts
    finally:
        h.close()
    return None, h.cov.counts


@pytest.mark.parametrize("name", WITNESSES)
def test_the_witnesses_pass_and_check(name: str) -> None:
    found, counts = _run(name)
    assert found is None, found
    assert counts["check: guard reads against the model's conjuncts"] > 0
    assert counts["check: inspection reads against the model"] > 0
    if "seams" in name:  # every case answered or refused as documented (two passes)
        done = counts["check: documented refusals of each entry point"]
        alike = counts["check: argument forms answered alike"]
        assert done + alike >= 2 * len(CASES) - 1  # (the tail case needs a hit: second pass)
    if "writer" in name:
        assert counts["check: stores from rows handed (HandedRows)"] > 0
        refusals = [c for c in WRITER_CASES if c[1] == "InvalidArgument"]  # (others: a use)
        assert counts["refused refuse_writer:InvalidArgument"] == len(refusals)


def test_guard_reads_catch_a_refusal_named_by_the_wrong_conjunct(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from kvstate.impl.inspection import CacheView

    real = CacheView.refused
    monkeypatch.setattr(CacheView, "refused", lambda self, a, r: real(self, a, r)[1:])
    found, _ = _run(WITNESSES[1])
    assert found is not None and found.kind == "guard-read", found


def test_inspection_reads_catch_a_resolve_that_misses_a_block(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from kvstate.impl.inspection import CacheView

    real = CacheView.resolve
    monkeypatch.setattr(CacheView, "resolve", lambda self, c: [*real(self, c)[:-1], 0])
    found, _ = _run(WITNESSES[1])
    assert found is not None and found.kind == "inspection", found


def test_the_production_writer_catches_a_row_kept_at_the_wrong_position(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from kvstate.impl.writer import HandedRows

    real = HandedRows.hand
    monkeypatch.setattr(HandedRows, "hand", lambda self, g, s, r: real(self, g, s + 1, r))
    found, _ = _run(WITNESSES[2])
    assert found is not None, "a store from rows one position off went unseen"


def test_the_guard_line_names_what_was_never_seen_both_ways() -> None:
    a = block_only(TABLE)[0]
    c0, *rest = [c.name for c in a.guard]
    counts = {f"guard {a.name}.{c0} true": 3, f"guard {a.name}.{c0} false": 1}
    counts |= {f"guard {a.name}.{c} true": 2 for c in rest}
    line = guard_line(counts)
    assert f"1 of {1 + len(rest)} conjuncts" in line
    assert (f"never false: {a.name}.{rest[0]}" in line) if rest else "never false: none" in line
    assert guard_line({}) == ""


@pytest.mark.parametrize(
    "trace",
    [
        # a disk load failed by a read made outside the lock (the table's load_fail)
        "request(i=0, n=32, life=1); admit(i=0); use(i=0); finish(i=0); tick(t=1); "
        "offload(n=1); drain(); spill(n=1); request(i=1, n=33, life=1); admit(i=1); "
        "act_step(b=1, k=1)",
        # an offload abandoned after its job raised (the table's offload_cancel)
        "request(i=0, n=64, life=1); admit(i=0); use(i=0); finish(i=0); tick(t=1); "
        "offload(n=1); read_error(b=3)",
    ],
)
def test_a_job_that_fails_moves_the_rule_epoch(trace: str) -> None:
    """The API fuzz's findings, replayed: each path that performs a table action without its
    guard (a failed read, an abandoned job) moves the rule epoch as the guarded path does."""
    from kvstate.targets.api import parse_ops

    h = ApiHarness(TABLE, N)
    try:
        for o in parse_ops(trace):
            h.apply(o)
        h.quiesce()
    finally:
        h.close()
