"""The table loads, derives, and rejects malformed input with errors that name the culprit."""

from dataclasses import replace

import pytest

from kvstate.spec import (
    CKV,
    Conjunct,
    GeometryError,
    SpecError,
    deepseek_v4_flash,
    default_table,
    small,
    table_named,
)
from kvstate.spec.expr import AND, IMPLIES, ITE, NOT, OR


def test_default_table_has_five_states_and_all_actions():
    t = default_table()
    names = {a.name for a in t.actions}
    for required in (
        "allocate",
        "commit",
        "seal",
        "slide",
        "index_update",
        "rebuild_start",
        "offload",
        "load_start",
        "load_progress",
        "load_done",
        "load_fail",
        "match",
        "validate",
        "pin",
        "use",
        "release",
        "evict_start",
        "abort",
        "capture",
        "replay",
        "recapture",
        "admit",
        "downgrade",
    ):
        assert required in names
    comps = {a.component for a in t.actions}
    assert {
        "Compressed KV",
        "Uncompressed Tail",
        "SWA Window",
        "Indexer State",
        "On-disk Prefix",
    } <= comps
    assert {
        "toctou",
        "graph_topology",
        "admission_cap",
        "separation",
        "hit_soundness",
        "refcount",
    } <= {i.name for i in t.invariants}


def test_geometry_presets_keep_the_real_relations():
    f = deepseek_v4_flash()
    assert f.entry_bytes == 584 and f.count("csa") == 21 and f.count("hca") == 20
    assert f.zero_swa_recompute_tokens == 5504 and f.lcm_tokens == 256
    s = small()
    assert s.lcm_tokens == 16 and s.zero_swa_recompute_tokens == 112 and s.csa_tail_rows == 8
    assert small(32).lcm_tokens == 32 and small(32).page_bytes(4) % 16 == 0


@pytest.mark.parametrize(
    "change,msg",
    [
        ({"csa_ratio": 3}, "must divide"),
        ({"device_blocks": 0}, "positive"),
        ({"rope_dims": 8}, "head_dim"),
        ({"swa_disk_policy": "sometimes"}, "swa_disk_policy"),
    ],
)
def test_bad_geometry_is_rejected(change, msg):
    with pytest.raises(GeometryError, match=msg):
        small().with_changes(**change)


def test_connectives_work_on_python_values():
    assert AND(True, True) is True and OR(False, True) is True and NOT(False) is True
    assert IMPLIES(False, False) is True and ITE(True, 1, 2) == 1
    with pytest.raises(TypeError):
        AND(1, True)


def _with_action(t, name, **changes):
    a = t.action(name)
    return t.derive(replace_action=[replace(a, **changes)])


def test_update_outside_frame_names_the_action():
    t = default_table()
    a = t.action("commit")
    with pytest.raises(
        SpecError, match=r"action 'commit': updates 'gen' outside its modifies frame"
    ):
        t.derive(replace_action=[replace(a, updates={**a.updates, "gen": lambda s, p: s.gen})])


def test_unknown_variable_names_the_action():
    t = default_table()
    with pytest.raises(SpecError, match=r"action 'seal': modifies unknown variable 'tails'"):
        _with_action(t, "seal", modifies=frozenset({"tails"}))
    bad = Conjunct("typo", lambda s, p: s.ckvv[p.b] == CKV.READY)
    with pytest.raises(
        SpecError,
        match=r"action 'seal': guard conjunct 'typo' failed: unknown state variable 'ckvv'",
    ):
        _with_action(t, "seal", guard=(bad,))


def test_guard_of_wrong_type_names_the_action():
    t = default_table()
    with pytest.raises(SpecError, match=r"action 'tick': guard conjunct 'always' returned int"):
        t.derive(replace_guard={("tick", "always"): lambda s, p: 1})


def test_update_of_wrong_type_names_the_action():
    t = default_table()
    with pytest.raises(SpecError, match=r"action 'tick'.*'now'.*not a int"):
        t.derive(update={("tick", "now"): lambda s, p: True})
    with pytest.raises(SpecError, match=r"whole array"):
        t.derive(update={("seal", "tail"): lambda s, p: 2})


def test_derive_rejects_unknown_names():
    t = default_table()
    with pytest.raises(SpecError, match="no guard conjunct 'nope'"):
        t.derive(drop_guard=[("evict_start", "nope")])
    with pytest.raises(SpecError, match="unknown action 'evict'"):
        t.derive(drop_guard=[("evict", "unpinned")])
    with pytest.raises(SpecError, match="unknown spec"):
        table_named("nope")


def test_derived_table_is_a_new_value():
    t = default_table()
    d = t.derive(drop_guard=[("evict_start", "unpinned")])
    assert [c.name for c in d.action("evict_start").guard] == [
        "committed",
        "lease_expired",
        "no_cpu_job",
    ]
    assert "unpinned" in [c.name for c in t.action("evict_start").guard]


def test_flash_table_builds():
    t = default_table(deepseek_v4_flash())
    assert t.consts.L == 256 and t.consts.io_cap == 8


def test_address_variables_are_declared_in_the_table() -> None:
    from kvstate.spec.table import address_vars

    t = default_table()
    assert address_vars(t) == ("addr", "gaddr", "paddr", "at")
    assert all(t.var(n).address for n in address_vars(t))


def test_coverage_goals_resolve_and_survive_derivation() -> None:
    from kvstate.spec.errors import SpecError
    from kvstate.spec.table import PinnedCoverage, Table

    t = default_table()
    (cov,) = t.coverage
    assert set(cov.actions) == {"abort", "downgrade"} and cov.var == "ckv"
    assert t.derive(remove_action=["downgrade"]).coverage[0].actions == ("abort",)
    for bad in (
        PinnedCoverage(("nope",), "ckv", (1,)),
        PinnedCoverage(("abort",), "gen", (1,)),  # not a phase variable
        PinnedCoverage(("abort",), "ckv", (99,)),  # not a phase of ckv
    ):
        with pytest.raises(SpecError):
            Table.build(
                t.name, t.geometry, t.vars, t.actions, t.invariants, t.hit_rule, coverage=[bad]
            )
    assert replace(t, coverage=()).coverage == ()


def test_recovery_pipelines_resolve_and_follow_derivation() -> None:
    """``Table.recovery`` names real actions, conjuncts and pipeline variables (else the table
    is refused, naming the culprit); a derived table keeps it while its transitions exist and
    drops a deferred conjunct that was dropped from its guard."""
    from kvstate.spec.table import Table

    t = default_table()
    rec = t.recovery
    assert rec is not None and set(rec.fired) <= set(rec.transitions)
    assert ("load_start", "io_cap") in rec.deferred
    dropped = t.derive(drop_guard=[("load_start", "io_cap")]).recovery
    assert dropped is not None and ("load_start", "io_cap") not in dropped.deferred
    assert t.derive(remove_action=["rebuild_done"]).recovery is None
    for bad, culprit in (
        (replace(rec, transitions=(*rec.transitions, "nope")), "nope"),
        (replace(rec, deferred=(("load_start", "nope"),)), "nope"),
        (replace(rec, fired=("touch",)), "touch"),
        (replace(rec, pipes=("gen",)), "gen"),  # not an enumerated block variable
        (replace(rec, restores={99: "Compressed KV"}), "recovery"),  # not a pipeline value
    ):
        with pytest.raises(SpecError, match=culprit):
            Table.build(
                t.name, t.geometry, t.vars, t.actions, t.invariants, t.hit_rule, recovery=bad
            )
