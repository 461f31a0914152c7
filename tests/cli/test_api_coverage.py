"""The coverage classes of the API harness: each witness conforms and reaches its path
(kvstate/targets/api/storerun.py, viewcontract.py, unservable.py, rowmemo.py, refusedjobs.py),
and the checks fail on a fault planted in the harness's view of the library; the planted bugs of
kvstate/api_mutants_coverage.py show each check failing on a bug in ``impl/``
(``python -m kvstate.api_mutants -k NAME``, minutes: not run here)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from kvstate.harness.finding import Nonconformance
from kvstate.spec import default_table
from kvstate.targets.api import ApiHarness, Coverage, op, parse_ops, replay, witnesses

TABLE = default_table()
N = 4
L = TABLE.consts.L


@pytest.mark.parametrize(
    ("name", "reached"),
    [
        ("a store run refused partway (its run test)", "check: a store run refused partway"),
        ("a store run refused partway (block by block)", "check: a store run refused partway"),
        ("the inspection view's contract", "check: view device_block"),
        ("tables impl/ does not serve", "check: unservable table (a block variable added)"),
        ("the test writer's memos against fresh answers", "check: the test writer's memos"),
        (
            "the pipelines' actions by name where the table refuses them",
            "check: act refused load_done",
        ),
    ],
)
def test_coverage_witness_conforms_and_reaches_its_path(name: str, reached: str) -> None:
    cov = Coverage()
    w = witnesses(N, L, TABLE.consts.lease_max)[name]
    assert replay(TABLE, N, w, coverage=cov) is None
    assert any(k.startswith(reached) for k in cov.counts), sorted(cov.counts)


def _finding(ops: list[Any], patch: Any) -> Nonconformance | None:
    h = ApiHarness(TABLE, N)
    try:
        patch(h)
        for o in ops:
            h.apply(o)
    except Nonconformance as exc:
        return exc
    finally:
        h.close()
    return None


class _Hooks:
    """The cache's test hooks, but ``store_run`` stores one block fewer than asked."""

    def __init__(self, hooks: Any) -> None:
        self._hooks = hooks

    def __getattr__(self, name: str) -> Any:
        return getattr(self._hooks, name)

    def store_run(self, blocks: Any, ticks: int, end: int = -1) -> int:
        return int(self._hooks.store_run(blocks[:-1], ticks, end))


def test_a_store_run_that_stops_short_is_a_finding() -> None:
    def patch(h: Any) -> None:
        h.hooks = _Hooks(h.hooks)

    found = _finding([op("store_blocks", lo=0, hi=3, w=1)], patch)
    assert found is not None and "returned 2" in str(found), found


def test_a_memo_that_answers_other_rows_is_a_finding(monkeypatch: pytest.MonkeyPatch) -> None:
    from kvstate.impl import testdata

    real = testdata.expected_rows

    def wrong(group: str, *a: Any) -> torch.Tensor:
        return real(group, *a) ^ 1

    monkeypatch.setattr(testdata, "expected_rows", wrong)
    found = _finding([op("row_memo", b=0)], lambda h: None)
    assert found is not None and "the memo's answer is not the computed one" in str(found), found


def test_a_finish_short_of_pages_beside_windows_on_disk_is_not_a_finding() -> None:
    """``FinishStores`` counts as room only the windows that hold device pages: the chain's
    windows kept in its disk entries (which the table lets slide) free no page, so a finish
    that stops where the SWA pages run out is not required to store more."""
    trace = parse_ops(
        "swa_scarce(k=1); request(i=0, n=65, life=1); admit(i=0); use(i=0); finish(i=0); "
        "tick(t=4); offload(n=4); drain(); spill(n=4); offload(n=4); drain(); spill(n=4); "
        "request(i=0, n=17, life=4); admit(i=0); drain(); use(i=0); "
        "request(i=1, n=65, life=1); admit(i=1); drain(); use(i=1); read(i=1); "
        "finish(i=1); finish(i=0)"
    )
    assert replay(TABLE, N, trace, coverage=Coverage()) is None
