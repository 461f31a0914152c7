"""The remote tier's table: the store's environment actions are unguarded, and the cache's two
checks on a remote load (each chunk authenticated at its read, the load complete before use)
are what keep a wrong or partial chunk from being served.  Dropping either is refuted from
Init with a replayed trace."""

import pytest

from kvstate.proofs import prove
from kvstate.spec.default.remote import remote_table

ENVIRONMENT = ("remote_delete", "remote_evict_chunk", "remote_overwrite", "remote_restart")


def test_the_store_s_actions_have_no_guard_the_cache_controls() -> None:
    t = remote_table()
    for name in ENVIRONMENT:
        assert [c.name for c in t.action(name).guard] == ["anytime"], name
    assert {c.name for c in t.action("rload_chunk").guard} >= {"authenticated", "not_done"}
    assert "complete" in {c.name for c in t.action("rload_done").guard}


def test_the_remote_table_proves_inductively() -> None:
    report = prove(remote_table(), kinds=["init", "inductive"], jobs=2)
    assert report.ok, [(r.obligation, r.status, r.detail) for r in report.failures]
    inductive = report.by_kind("inductive")
    assert inductive and all(r.unbounded for r in inductive)


@pytest.mark.parametrize(
    ("action", "conjunct", "invariant", "via"),
    [
        ("rload_chunk", "authenticated", "remote_truth", ENVIRONMENT),
        ("rload_done", "complete", "load_truth", ()),
    ],
)
def test_dropping_a_remote_load_check_is_refuted(
    action: str, conjunct: str, invariant: str, via: tuple[str, ...]
) -> None:
    """The unchecked action's own obligation is refuted by a trace through it; where the
    store must have changed under the cache, one of its environment actions comes first.  Which
    one Z3 picks (an overwrite, or a delete followed by another writer's store) depends on the
    solver's model, so any will do.  Other actions' obligations may be refuted too (a state the
    broken action let in can be carried on by, say, ``admit``): those are not this test's
    subject, so the unchecked action's own failure is the one read."""
    broken = remote_table().derive(name=f"remote-no-{conjunct}", drop_guard=[(action, conjunct)])
    report = prove(broken, only=invariant, kinds=["init", "inductive"], jobs=1)
    assert not report.ok
    traced = [
        r
        for r in report.failures
        if r.invariant == invariant
        and r.action == action
        and r.status == "violated"
        and r.trace is not None
    ]
    assert traced, [(r.obligation, r.status, r.detail) for r in report.failures]
    trace = traced[0].trace
    assert trace.replayed and trace.start is None  # reachable: from Init, replayed concretely
    actions = trace.actions()
    # the unchecked action is in the trace; the search may carry the broken state on a few
    # steps after it (a loaded run once ended the replay with an ``admit``)
    assert action in actions, actions
    last = len(actions) - 1 - actions[::-1].index(action)
    if via:
        assert any(a in actions[:last] for a in via), actions
