"""The main job: `kvstate prove` on the default spec proves every obligation."""

from kvstate.proofs import prove
from kvstate.spec import CKV, default_table
from kvstate.spec.compile import invariant_reads


def test_default_prove_holds_everywhere():
    report = prove(default_table(), jobs=2)
    assert report.ok, [(r.obligation, r.status, r.detail) for r in report.failures]
    kinds = {r.kind for r in report.results}
    assert kinds == {
        "structure",
        "init",
        "enabled",
        "inductive",
        "k-induction",
        "bmc",
        "reach",
        "anti-vacuity",
        "action-safety",
        "completeness",
        "tight",
        "local",
    }
    t = default_table()
    # what replay and use read is proved safe, and what evict_start, offload_done and drop take
    # away is no longer promised, for any pool size; completeness is bounded
    assert {r.action for r in report.by_kind("action-safety")} == {
        "replay",
        "use",
        "evict_start",
        "offload_done",
        "drop",
        "seal",
    }
    assert all(r.unbounded for r in report.by_kind("action-safety"))
    # the caps, the load's last chunk and the lease checks refuse no more than they must; pin
    # and validate judge a hit by its own blocks (any pool size)
    tight = {r.obligation.split("/", 2)[2] for r in report.by_kind("tight")}
    assert {"pin.pin_cap", "load_start.io_cap", "load_progress.not_done"} <= tight
    assert {"evict_start.lease_expired", "offload_done.lease_expired"} <= tight
    assert {r.action for r in report.by_kind("local")} == {"pin", "validate"}
    assert all(r.unbounded for r in report.by_kind("tight") + report.by_kind("local"))
    assert report.by_kind("completeness") and not any(
        r.unbounded for r in report.by_kind("completeness")
    )
    # the read-safety declarations take part in anti-vacuity
    assert {"replay", "use"} <= {
        r.action for r in report.by_kind("anti-vacuity") if r.invariant is None
    }
    # one inductive result per (invariant, action) pair, every pair unbounded
    inductive = report.by_kind("inductive")
    assert len(inductive) == sum(1 for i in t.invariants if not i.bounded) * len(t.actions)
    assert all(r.unbounded for r in inductive)
    # every action has a replayed witness; every protecting conjunct is shown to matter
    assert {r.action for r in report.by_kind("reach")} == {a.name for a in t.actions}
    assert {r.action for r in report.by_kind("enabled")} == {a.name for a in t.actions}
    for r in report.by_kind("reach") + report.by_kind("anti-vacuity"):
        assert r.trace is not None and r.trace.replayed


def test_frame_rule_uses_the_read_set():
    t = default_table()
    assert invariant_reads(t, t.invariant("graph_topology")) == {"addr", "gaddr", "graph"}


def test_the_pinned_phase_units_come_from_the_table_s_coverage_goals() -> None:
    from dataclasses import replace

    from kvstate.proofs.obligations import Config, plan

    t = default_table()
    names = {u.name for u in plan(t, Config()) if "@" in u.name}
    (cov,) = t.coverage
    assert names == {
        f"reach/{a}@{CKV(ph).name}" for a in ("abort", "downgrade") for ph in cov.phases
    }
    assert not any("@" in u.name for u in plan(replace(t, coverage=()), Config()))
