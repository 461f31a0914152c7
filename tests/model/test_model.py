"""The concrete interpreter, the phase graphs and the model-level Hypothesis walk."""

import pytest
from hypothesis import Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from kvstate.model.concrete import GuardError, Machine
from kvstate.model.graph import check_structure, phase_graph, to_dot
from kvstate.proofs.corpus import evict_without_refcount, replay_without_recapture
from kvstate.proofs.witnesses import reach_traces
from kvstate.spec import CKV, LIFECYCLES, Req, SpecError, default_table
from kvstate.targets.block import ModelTarget, build_state_machine, canonical, diff, run_conformance

HAPPY = [
    ("allocate", {"b": 0, "a": 0, "f": 0}),
    ("commit", {"b": 0}),
    ("seal", {"b": 0}),
    ("index_update", {"b": 0}),
    ("admit", {"r": 0, "t": 1}),
    ("touch", {"b": 0, "t": 2}),
    ("match", {"r": 0, "h": 16}),
    ("pin", {"r": 0}),
    ("validate", {"r": 0}),
    ("use", {"r": 0}),
    ("release", {"r": 0}),
]


def test_happy_path_keeps_every_invariant():
    m = Machine(default_table(), 2)
    states = m.run(HAPPY)
    for s in states:
        assert m.violations(s) == []
    assert states[-3].req(0).phase == Req.VALIDATED and states[-3].ref[0] == 1
    assert states[-1].ref == (0, 0)


def test_disabled_step_raises_and_names_the_conjuncts():
    m = Machine(default_table(), 2)
    s = m.run(HAPPY[:8])[-1]
    with pytest.raises(GuardError, match="L1.lease_covers|L3"):
        # the window block of b=0 is fine, but without touch the lease would not cover: drop touch
        m.run([x for x in HAPPY[:9] if x[0] != "touch"])
    with pytest.raises(GuardError, match="unpinned"):
        m.step(s, "evict_start", {"b": 0})
    assert s.ckv[0] == CKV.READY  # unchanged


def test_bad_parameters_are_spec_errors():
    m = Machine(default_table(), 2)
    with pytest.raises(SpecError, match="outside its block domain"):
        m.step(m.init(), "allocate", {"b": 7, "a": 0, "f": 0})
    with pytest.raises(SpecError, match="takes parameters"):
        m.step(m.init(), "allocate", {"b": 0})


def test_violations_are_detected():
    t = evict_without_refcount()
    m = Machine(t, 1)
    s = m.run(HAPPY[:9] + [("tick", {"t": 4}), ("evict_start", {"b": 0})])[-1]
    assert any(v.invariant == "toctou" for v in m.violations(s))


@pytest.mark.parametrize("lc", LIFECYCLES, ids=[lc.component for lc in LIFECYCLES])
def test_phase_graphs_have_no_traps(lc):
    g = phase_graph(default_table(), lc)
    rep = check_structure(g, lc)
    assert rep.ok, rep
    assert "digraph" in to_dot(g, lc)


def test_phase_graph_finds_a_stuck_load():
    t = default_table().derive(remove_action=["load_done", "load_fail"])
    lc = next(x for x in LIFECYCLES if x.component == "Compressed KV")
    rep = check_structure(phase_graph(t, lc), lc)
    assert "LOADING" in rep.traps


def test_model_walk_fires_every_action_in_ci_profile():
    t = default_table()
    counts = run_conformance(t, None, 2, seeds=reach_traces(t.name))
    missing = [a.name for a in t.actions if counts[a.name] == 0]
    assert not missing, missing
    assert counts["(refused)"] > 0


def test_divergent_state_is_caught():
    """A target that behaves like a mutated table must fail conformance with the default one."""
    t = default_table()
    bad = replay_without_recapture()
    # a load that moves the buffer after the capture (allocate may move it too, so the cached
    # witness, which captures before allocating, goes stale in both tables at the allocation)
    moved_after_capture = [
        ("allocate", {"b": 0}),
        ("commit", {"b": 0}),
        ("offload", {"b": 0}),
        ("offload_done", {"b": 0}),
        ("load_start", {"b": 0}),
        ("load_progress", {"b": 0}),
        ("load_progress", {"b": 0}),
        ("capture", {}),
        ("load_done", {"b": 0}),
        ("replay", {}),
    ]
    with pytest.raises(AssertionError, match="diverges from the model"):
        run_conformance(
            t,
            lambda table, n: ModelTarget(bad, n),
            1,
            seeds=[moved_after_capture, *reach_traces(t.name)],
        )


def test_performing_a_refused_action_is_caught():
    t = default_table()
    bad = evict_without_refcount()
    m = build_state_machine(
        t,
        1,
        factory=lambda table, n: ModelTarget(bad, n),
        seed_traces=[HAPPY[:9] + [("tick", {"t": 4})]],
    )
    with pytest.raises(AssertionError, match="performed evict_start"):
        run_state_machine_as_test(
            m,
            # shrinking the failure (minutes under load) is not what this tests
            settings=settings(
                settings.get_profile("ci"),
                max_examples=300,
                stateful_step_count=6,
                phases=(Phase.explicit, Phase.reuse, Phase.generate, Phase.target),
            ),
        )


def test_addresses_are_compared_up_to_renaming():
    t = default_table()
    a = Machine(t, 2).init().values
    renamed = dict(a, addr=(10, 11), gaddr=(10, 11), paddr=((10, 10), (10, 10)))
    assert diff(a, renamed, t) == []
    swapped = dict(a, gaddr=(1, 0))
    assert any(line.startswith("gaddr") for line in diff(a, swapped, t))
    assert canonical(renamed, t)["addr"] == (0, 1)
