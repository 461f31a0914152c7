"""Every table of the corpus gets its expected verdict, with a replayed trace when refuted."""

import pytest

from kvstate.proofs import prove
from kvstate.proofs.corpus import CORPUS, is_subsequence

BROKEN = [c for c in CORPUS if not c.proves]


@pytest.mark.parametrize("case", BROKEN, ids=[c.name for c in BROKEN])
def test_broken_variant_is_refuted_with_expected_trace(case):
    table = case.build()
    report = prove(table, only=case.invariant, kinds=["init", "inductive"], jobs=1)
    assert not report.ok, f"{case.name} was not refuted"
    failing = [r for r in report.failures if r.invariant == case.invariant]
    assert failing, [r.obligation for r in report.failures]
    traced = [r for r in failing if r.status == "violated" and r.trace is not None]
    assert traced, f"no trace from Init for {case.name}: {[r.detail for r in failing]}"
    trace = traced[0].trace
    assert trace.replayed and trace.start is None
    assert any(v.startswith(case.invariant) for v in trace.violated), trace.violated
    actions = trace.actions()
    assert is_subsequence(case.actions, actions), f"{case.actions} not in {actions}"
    if case.predicate is not None:
        assert case.predicate([(s.action, s.params) for s in trace.steps]), trace.render()
    # the failing (invariant, action) pair is named
    assert all(r.action for r in failing)


def test_correct_tables_prove_inductively():
    for case in [c for c in CORPUS if c.proves]:
        report = prove(case.build(), kinds=["init", "inductive"], jobs=2)
        assert report.ok, [(r.obligation, r.status) for r in report.failures]
        inductive = [r for r in report.results if r.kind == "inductive"]
        assert inductive and all(r.unbounded for r in inductive)
