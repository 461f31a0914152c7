"""The three SWA disk policies rebuild the exact state at the boundary (bit for bit), the zero
policy's recompute bound is tight, and the demo table reports every case as expected."""

from __future__ import annotations

import pytest

from kvstate.numerics import (
    TOL,
    StateError,
    checkpoint_boundary,
    disk_copy,
    export_pieces,
    max_diff,
    pieces_equal,
    restore_from_disk,
    swa_snapshot,
    zero_min_exact_tokens,
    zero_recompute_start,
)
from kvstate.numerics.__main__ import main
from kvstate.numerics.scenario import Scenario, default_scenario


@pytest.fixture(scope="module")
def sc() -> Scenario:
    return default_scenario(0)


def _resume_diff(sc: Scenario, state: object) -> float:
    logits, _ = sc.model.resume(state, sc.tokens[sc.h :])  # type: ignore[arg-type]
    return max_diff(logits, sc.reference[sc.h :])


def test_disk_copy_holds_no_window_or_tail(sc: Scenario) -> None:
    disk = disk_copy(sc.state_at(sc.h))
    for lp in disk.layers:
        assert lp.window_pos.numel() == 0
        assert lp.tail_pos is None or lp.tail_pos.numel() == 0


@pytest.mark.parametrize("policy", ["full", "checkpoint", "zero"])
def test_each_policy_restores_the_exact_state(sc: Scenario, policy: str) -> None:
    g, h = sc.model.geometry, sc.h
    disk = disk_copy(sc.state_at(h))
    swa = None
    if policy == "full":
        swa = swa_snapshot(sc.state_at(h))
    elif policy == "checkpoint":
        c = checkpoint_boundary(h, g.swa_checkpoint_tokens)
        assert 0 < h - c  # the scenario really recomputes forward
        swa = swa_snapshot(sc.state_at(c))
    else:
        assert zero_recompute_start(sc.model, h) == h - g.n_win * len(g.layers) > 0
    state = restore_from_disk(sc.model, disk, sc.tokens[:h], policy, swa=swa)  # type: ignore[arg-type]
    assert pieces_equal(export_pieces(state), sc.state_at(h))
    assert _resume_diff(sc, state) == 0.0


def test_zero_policy_bound_is_tight(sc: Scenario) -> None:
    """(L-1)(n_win-1)+n_win tokens rebuild the state exactly; one fewer does not; n_win alone
    moves the logits."""
    g, h = sc.model.geometry, sc.h
    disk = disk_copy(sc.state_at(h))
    n = zero_min_exact_tokens(sc.model)
    assert n == 106 and n <= g.zero_swa_recompute_tokens
    ok = restore_from_disk(sc.model, disk, sc.tokens[:h], "zero", recompute_tokens=n)
    assert pieces_equal(export_pieces(ok), sc.state_at(h))
    short = restore_from_disk(sc.model, disk, sc.tokens[:h], "zero", recompute_tokens=n - 1)
    assert not pieces_equal(export_pieces(short), sc.state_at(h))
    tiny = restore_from_disk(sc.model, disk, sc.tokens[:h], "zero", recompute_tokens=g.n_win)
    assert _resume_diff(sc, tiny) > TOL


def test_zero_policy_on_a_short_prompt_recomputes_everything(sc: Scenario) -> None:
    h = 2 * sc.model.geometry.lcm_tokens  # 32 < n_win * L: s = 0
    assert zero_recompute_start(sc.model, h) == 0
    state = restore_from_disk(sc.model, disk_copy(sc.state_at(h)), sc.tokens[:h], "zero")
    assert pieces_equal(export_pieces(state), sc.state_at(h))


def test_policies_refuse_missing_or_misplaced_snapshots(sc: Scenario) -> None:
    h = sc.h
    disk = disk_copy(sc.state_at(h))
    with pytest.raises(StateError):
        restore_from_disk(sc.model, disk, sc.tokens[:h], "full")
    with pytest.raises(StateError):  # a snapshot that is not the last checkpoint
        restore_from_disk(
            sc.model, disk, sc.tokens[:h], "checkpoint", swa=swa_snapshot(sc.state_at(h - 8))
        )
    with pytest.raises(StateError):
        restore_from_disk(sc.model, disk, sc.tokens[: h - 1], "zero")
    with pytest.raises(StateError):  # full policy without a window: check_state refuses
        sc.model.resume(disk, sc.tokens[h:])


def test_demo_reports_every_case_as_expected(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 0
    out = capsys.readouterr().out
    for name in (
        "chunked prefill",
        "token-by-token decode",
        "drop_tail",
        "offset_window",
        "stale_indexer",
        "drop_compressed_block",
        "partial_load",
        "disk: full",
        "disk: checkpoint",
        "disk: zero",
    ):
        assert name in out
    assert "all cases as expected" in out
