"""The witnesses of kvstate/targets/api/covreach.py conform and reach their paths, and the
signature-forms check finds nothing on the shipped sources (the planted bugs of
kvstate/api_mutants_covreach.py show each failing on a bug in ``impl/``:
``python -m kvstate.api_mutants -k NAME``, minutes, not run here)."""

from __future__ import annotations

import pytest

from kvstate.spec import default_table
from kvstate.targets.api import Coverage, replay, witnesses
from kvstate.targets.api.sigforms import form_differences

TABLE = default_table()
N = 4
L = TABLE.consts.L


@pytest.mark.parametrize(
    ("name", "reached"),
    [
        (
            "the engine fails block 0's disk load by name (load_fail)",
            "act load_fail of a disk load",
        ),
        ("the engine fails block 3's host load by name (load_fail)", "act load_fail of a host"),
        ("a spill on a disk pool full of entries an admission pins", "check: a spill stopped by"),
        ("an offload with every host slot held by a running load", "act_maint offload: out of"),
        (
            "windows not kept on disk: blocks 0, 1 restored from disk, 2, 3 from host, hit",
            "check: examples whose windows are not kept on disk",
        ),
        (
            "a queued disk load short of SWA pages when its turn comes",
            "check: examples at io_cap 1",
        ),
        (
            "a durable cache: a chain spilled, named by name_stem, restored and hit",
            "check: disk entries named by name_stem",
        ),
    ],
)
def test_covreach_witness_conforms_and_reaches_its_path(name: str, reached: str) -> None:
    cov = Coverage()
    w = witnesses(N, L, TABLE.consts.lease_max)[name]
    assert replay(TABLE, N, w, coverage=cov) is None
    assert any(k.startswith(reached) for k in cov.counts), sorted(cov.counts)


def test_signature_forms_agree_with_python() -> None:
    assert form_differences() == []
