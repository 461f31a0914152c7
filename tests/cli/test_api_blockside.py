"""The block side's declared-form, slot-order, at-once and cut checks of the API harness
(kvstate/targets/api/admform.py, slotorder.py, recoveryhit.py, ready.py): each new witness
conforms and reaches its check, and the declared-form check fails on an admission that lost
its dataclass form; the planted bugs of kvstate/api_mutants_blockside.py show each check
failing on a bug in ``impl/`` (``python -m kvstate.api_mutants -k NAME``: not run here)."""

from __future__ import annotations

from typing import Any

import pytest

from kvstate.impl import HeterogeneousKVCache
from kvstate.impl.testdata import DeterministicWriter
from kvstate.spec import default_table, small
from kvstate.targets.api import Coverage, replay, witnesses
from kvstate.targets.api.admform import form_problems
from kvstate.targets.api.witnesses import COVERAGE_ONLY

TABLE = default_table()
N = 4
L = TABLE.consts.L


@pytest.mark.parametrize(
    ("name", "reached"),
    [
        (
            f"{COVERAGE_ONLY}a store that takes a claimed slot",
            "check: slot takes against free_slots()' order (a claimed slot taken)",
        ),
        (
            f"{COVERAGE_ONLY}single actions: a hit of every token of the request",
            "check: an admission's repr and equality, as declared",
        ),
    ],
)
def test_blockside_witness_conforms_and_reaches_its_check(name: str, reached: str) -> None:
    cov = Coverage()
    w = witnesses(N, L, TABLE.consts.lease_max)[name]
    assert replay(TABLE, N, w, coverage=cov) is None
    assert cov.counts[reached] > 0, sorted(cov.counts)


def test_the_ci_checks_run() -> None:
    """The at-once and cut checks run on the witnesses of recovery (a truncation at use)."""
    cov = Coverage()
    w = witnesses(N, L, TABLE.consts.lease_max)["corrupt entry: truncated to the valid prefix"]
    assert replay(TABLE, N, w, coverage=cov) is None
    assert cov.counts["check: a truncation's cut against the longest sound hit"] > 0
    assert cov.counts["check: an admission validated at once against the longest recovery serves"]


def test_declared_form_of_a_real_admission_and_of_one_without_it() -> None:
    with HeterogeneousKVCache(small(), executors="manual", writer=DeterministicWriter()) as c:
        req = c.request(list(range(1, 2 * L + 2)))
        adm = c.admit(req)
        assert form_problems(adm) == [] and form_problems(adm.explanation) == []

        class Admission:  # the same fields, no dataclass: identity equality, object repr
            def __init__(self, other: Any) -> None:
                self.__dict__.update({k: getattr(other, k) for k in ("request", "hit_tokens")})
                self.requested, self.state = other.requested, other.state
                self.explanation, self.recovery = other.explanation, other.recovery
                self.rids, self.tail_check = other.rids, other.tail_check

        bad = form_problems(Admission(adm))
        assert any("repr" in b for b in bad) and any("not a dataclass" in b for b in bad), bad
        c.abort(req)
