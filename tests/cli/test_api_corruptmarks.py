"""The failed loads' corrupt marks and the one read of a disk load, checked by the API harness
(``kvstate/targets/api/corruptmarks.py``, ``onereads.py``): each walk conforms on the library
and reaches the check it was written for."""

from __future__ import annotations

import pytest

from kvstate.spec import default_table
from kvstate.targets.api import Coverage, replay
from kvstate.targets.api.corruptmarks import walks

TABLE = default_table()
N = 4
L = TABLE.consts.L

REACHES = {
    "a disk load fails at its completion: recovered again": (
        "check: a failed load's corrupt mark (sound)"
    ),
    "a host load failed by name (the table's load_fail): recovered again": (
        "act load_fail of a host load (the engine's report of a failed transfer)"
    ),
    "a plan that loads its boundary block alone checks the tail": (
        "hits truncated to the valid prefix"
    ),
}


@pytest.mark.parametrize("name", sorted(REACHES))
def test_walk_conforms_and_reaches_its_check(name: str) -> None:
    cov = Coverage()
    assert replay(TABLE, N, walks(N, L, TABLE.consts.lease_max)[name], coverage=cov) is None
    c = cov.counts
    assert c[REACHES[name]] > 0, dict(c)
    assert c["check: a disk load's one read"] > 0 or "disk" not in name
