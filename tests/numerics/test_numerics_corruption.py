"""Negative tests: breaking any one of the five states changes the logits of a resume (vs the
full recompute) far beyond float noise, while the intact state reproduces them bit for bit;
the structural check catches every break except a correctly labelled but misplaced window."""

from __future__ import annotations

import pytest

from kvstate.numerics import (
    CORRUPTIONS,
    TOL,
    Corruption,
    StateError,
    build_state,
    check_state,
    drop_compressed_block,
    drop_tail,
    partial_load,
    pieces_equal,
    state_problems,
)
from kvstate.numerics.corrupt import apply
from kvstate.numerics.scenario import Scenario, default_scenario


@pytest.fixture(scope="module")
def sc() -> Scenario:
    return default_scenario(0)


def test_intact_state_is_bit_exact(sc: Scenario) -> None:
    pieces = sc.state_at(sc.h)
    check_state(build_state(pieces))
    assert sc.resume_diff(pieces) == 0.0
    logits, _ = sc.model.resume(pieces, sc.tokens[sc.h :], check=True)
    assert logits.equal(sc.reference[sc.h :])


@pytest.mark.parametrize("kind", CORRUPTIONS)
def test_each_broken_state_changes_the_output(sc: Scenario, kind: Corruption) -> None:
    original = sc.state_at(sc.h)
    bad = apply(kind, original, sc.state_at)
    assert pieces_equal(sc.state_at(sc.h), original)  # corruption does not touch its input
    assert not pieces_equal(bad, original)
    assert sc.resume_diff(bad) > TOL


@pytest.mark.parametrize("kind", CORRUPTIONS)
def test_check_catches_every_break_but_a_relabelled_window(sc: Scenario, kind: Corruption) -> None:
    bad = apply(kind, sc.state_at(sc.h), sc.state_at)
    if kind == "offset_window":
        # Labels say [h - n_win, h), contents are from one SWA block earlier: no structural
        # check can see it; only the numerics (previous test) do.  The allocator's block table
        # must prevent it.
        assert state_problems(build_state(bad)) == []
        return
    with pytest.raises(StateError):
        sc.model.resume(bad, sc.tokens[sc.h :])


def test_problem_messages_name_the_state(sc: Scenario) -> None:
    p = sc.state_at(sc.h)
    msgs = {
        "drop_tail": "tail holds",
        "stale_indexer": "indexer version",
        "drop_compressed_block": "not loaded",
        "partial_load": "not loaded",
    }
    for kind, text in msgs.items():
        problems = state_problems(build_state(apply(kind, p, sc.state_at)))  # type: ignore[arg-type]
        assert problems and all(text in m for m in problems), (kind, problems)


def test_single_layer_breaks_also_show(sc: Scenario) -> None:
    """One CSA layer's tail, one HCA layer's oldest block, half of one CSA page: each visible."""
    p = sc.state_at(sc.h)
    g = sc.model.geometry
    csa = g.layers.index("csa")
    hca = g.layers.index("hca")
    assert sc.resume_diff(drop_tail(p, layer=csa)) > TOL
    assert sc.resume_diff(drop_compressed_block(p, layer=hca, block=0)) > TOL
    assert sc.resume_diff(partial_load(p, layer=csa, fraction=0.5)) > TOL


def test_hca_tail_is_empty_at_an_lcm_boundary(sc: Scenario) -> None:
    """At a boundary aligned to the LCM block, HCA has folded every row: dropping its tail is
    harmless (the allocator need not store it), while CSA's tail (2m overlap) is not."""
    p = sc.state_at(sc.h)
    for li, lp in enumerate(p.layers):
        if lp.kind == "hca":
            assert lp.tail_pos is not None and lp.tail_pos.numel() == 0
            assert sc.resume_diff(drop_tail(p, layer=li)) == 0.0
        if lp.kind == "csa":
            assert lp.tail_pos is not None
            assert lp.tail_pos.tolist() == list(range(sc.h - g_m(sc), sc.h))


def g_m(sc: Scenario) -> int:
    return sc.model.geometry.csa_ratio


def test_corruption_arguments_are_validated(sc: Scenario) -> None:
    p = sc.state_at(sc.h)
    with pytest.raises(StateError):
        drop_tail(p, layer=0)  # an SWA layer has no tail
    with pytest.raises(StateError):
        drop_compressed_block(p, block=sc.h)  # past the end
