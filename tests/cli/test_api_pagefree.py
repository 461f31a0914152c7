"""The page pools' partition check of the API harness (kvstate/targets/api/pagefree.py): each
way a free list, its in-use marks and the pages held can disagree is reported, a consistent
pool is not, and the witness whose store run gives back pages it took conforms with the check
on.  The planted bugs of kvstate/api_mutants_blockpaths2.py show it failing on the cache itself
(``python -m kvstate.api_mutants -k page_``, a minute: not run here)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from kvstate.spec import default_table
from kvstate.targets.api import Coverage, replay, witnesses
from kvstate.targets.api.pagefree import partition


def _pool(free: list[int], busy: list[bool], first: int = 1) -> SimpleNamespace:
    return SimpleNamespace(first=first, n=len(busy), busy=busy, free_pages=lambda: list(free))


def test_a_consistent_pool_passes() -> None:
    # pages 1..4: 1 and 3 free, 2 and 4 held (page 0 reserved)
    assert partition("p", _pool([3, 1], [False, False, True, False, True]), [2, 4]) == []


@pytest.mark.parametrize(
    ("free", "busy", "held", "said"),
    [
        ([1, 1, 3], [False, False, True, False], [2], "listed free more than once"),
        ([1, 3], [False, False, True, True], [2], "listed free but marked in use"),
        ([1], [False, False, True, False], [2], "marked free but not on the free list"),
        ([1, 3], [False, False, True, False], [2, 2], "held twice"),
        ([1, 3], [False, False, True, False], [2, 3], "held and listed free"),
        ([1], [False, False, True, True], [2], "held by no block or load"),
        ([1, 3, 7], [False, False, True, False], [2], "outside [1, 4)"),
    ],
)
def test_each_disagreement_is_reported(
    free: list[int], busy: list[bool], held: list[int], said: str
) -> None:
    assert any(said in p for p in partition("p", _pool(free, busy), held))


def test_a_store_run_that_gives_back_pages_conforms() -> None:
    table = default_table()
    w = witnesses(4, table.consts.L, table.consts.lease_max)
    name = "the device runs out partway through a store"
    assert replay(table, 4, w[name], coverage=Coverage()) is None
