"""``kvstate mutate``: the mutants the properties used to miss are killed, and a weakened
property lets one survive (so these tests can fail)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from kvstate.cli import main
from kvstate.proofs.mutate import OPERATORS, check_mutant, mutants
from kvstate.spec import SpecError, table_named
from kvstate.spec.table import Conjunct
from kvstate.targets.block import build_state_machine, replay_trace

TABLE = table_named("default")
MUTANTS = {m.id: m for m in mutants(TABLE)}

# Each survived every safety obligation before the ghost truth, the read-safety obligations and
# the completeness rule existed (issue 15); each must now be killed, by the kind named.
FORMERLY_SURVIVING = {
    "drop-guard:replay": "action-safety",
    "forget-update:load_start.prog": "inductive",
    "forget-update:index_update.iver": "completeness",
    "forget-update:rebuild_done.iver": "completeness",
    "skip-reset:drop.swa": "inductive",
    "forget-update:load_done.addr": "inductive",
    "forget-update:match.hit": "completeness",
    "drop-guard:downgrade": "inductive",
}


def test_every_operator_generates_mutants() -> None:
    ops = {m.operator for m in MUTANTS.values()}
    assert ops == set(OPERATORS)
    assert len(MUTANTS) == len(mutants(TABLE))  # ids are unique


@pytest.mark.parametrize("mid", sorted(FORMERLY_SURVIVING))
def test_formerly_surviving_mutant_is_killed(mid: str) -> None:
    o = check_mutant(TABLE, MUTANTS[mid], timeout_ms=8000)
    assert o.verdict == "killed", o
    assert o.killed_by[0].startswith(FORMERLY_SURVIVING[mid]), o.killed_by


def test_weakened_properties_let_mutants_survive() -> None:
    # Without the read-safety declaration, nothing ties replay's guard to what it reads.
    no_reads = replace(TABLE, reads=())
    assert check_mutant(no_reads, MUTANTS["drop-guard:replay"]).verdict == "survived"
    # Without the completeness rule, an indexer write that never stamps its version is "safe".
    no_completeness = replace(TABLE, completeness=None)
    o = check_mutant(no_completeness, MUTANTS["forget-update:index_update.iver"])
    assert o.verdict == "survived", o


def test_equivalent_mutants_are_reported_as_such() -> None:
    # the default table argues some mutants equivalent; an empty list would be a regression
    assert TABLE.equivalent, "the default table lists no equivalent mutant"
    mid = next(iter(TABLE.equivalent))
    o = check_mutant(TABLE, MUTANTS[mid], timeout_ms=8000)
    assert o.verdict == "equivalent" and o.reason == TABLE.equivalent[mid], o


def test_cli_json_and_kill_rate_threshold(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["mutate", "--only", "drop-guard:replay", "-j", "1", "--format", "json", "--no-session"]
    assert main([*argv, "--min-kill-rate", "1"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["counts"]["killed"] == 1 and data["kill_rate"] == 1.0
    assert data["mutants"][0]["killed_by"][0].startswith("action-safety/replay")
    assert main(["mutate", "--operator", "no-such-op"]) == 2
    assert main(["mutate", "--min-kill-rate", "2"]) == 2


def test_guards_may_not_read_ghost_truth() -> None:
    with pytest.raises(SpecError, match="ghost"):
        TABLE.derive(replace_guard={("commit", "writing"): lambda s, p: s.cid[p.b] == 0})
    # a mechanism update that reads a ghost is refused too
    with pytest.raises(SpecError, match="ghost"):
        TABLE.derive(update={("commit", "ver"): lambda s, p: s.cid})
    assert isinstance(TABLE.action("commit").guard[0], Conjunct)


def test_fuzz_checks_completeness_on_the_model() -> None:
    # A table whose inline indexer write forgets to stamp its version: the prefix is stored,
    # sealed and indexed (ghost truth), yet a new request is refused.
    broken = MUTANTS["forget-update:index_update.iver"].make(TABLE)
    steps = [
        ("allocate", {"b": 0}),
        ("commit", {"b": 0}),
        ("seal", {"b": 0}),
        ("index_update", {"b": 0}),
        ("touch", {"b": 0, "t": 2}),
    ]
    found, _, _ = replay_trace(build_state_machine(broken, 1), steps)
    assert found is not None and found.kind == "incomplete", found
    assert "validate[L3.indexer_synced]" in found.detail
    ok, _, _ = replay_trace(build_state_machine(TABLE, 1), steps)
    assert ok is None, ok


# Killed since the tight, enabled and residency-promise obligations (issue 15, part 2): each a
# class that survived every safety obligation before, with the kind that must kill it now.
NEWLY_KILLED = {
    "off-by-one-compare:pin.pin_cap[k.pin_cap-1]": "tight/admission_cap",
    "off-by-one-compare:load_start.io_cap[io_inflight+1]": "tight/admission_cap",
    "off-by-one-compare:load_progress.not_done[prog+1]": "tight/load_integrity",
    "off-by-one-compare:drop.unpinned[ref+1]": "enabled",
    "off-by-one-compare:slide.unpinned[ref+1]": "enabled",
    "off-by-one-compare:evict_start.lease_expired[lease+1]": "tight/read:evict_start",
    "drop-conjunct:drop.lease_expired": "action-safety/drop.promise_kept",
    "off-by-one-update:touch.lease": "inductive/mechanism_truth",
    "drop-conjunct:seal.open": "action-safety/seal.rows_pending",
    "forget-update:spill.ckv": "inductive/mechanism_truth",
    "swap-phase:load_fail.ckv[HOST<->DISK]": "inductive/mechanism_truth",
    "off-by-one-compare:validate.L3.disk_loaded[hit+1]": "local/validate",
    # needs more pinned blocks than a small pool holds: refuted with the caps scaled to 1
    "off-by-one-compare:pin.pin_cap[k.pin_cap+1]": "inductive/admission_cap",
}


@pytest.mark.parametrize("mid", sorted(NEWLY_KILLED))
def test_newly_killed_mutant_is_killed(mid: str) -> None:
    o = check_mutant(TABLE, MUTANTS[mid], timeout_ms=8000, liveness=False)
    assert o.verdict == "killed", o
    assert o.killed_by[0].startswith(NEWLY_KILLED[mid]), o.killed_by


def test_without_tight_conjuncts_a_stricter_cap_survives() -> None:
    invs = tuple(replace(i, tight=()) for i in TABLE.invariants)
    o = check_mutant(
        replace(TABLE, invariants=invs),
        MUTANTS["off-by-one-compare:pin.pin_cap[k.pin_cap-1]"],
        timeout_ms=8000,
        liveness=False,
    )
    assert o.verdict == "survived", o


def test_guard_equivalence_is_proved_not_assumed() -> None:
    # hit-1 spans the same blocks as hit because L1 makes the hit LCM-aligned: proved
    mid = "off-by-one-compare:validate.L3.ckv_ready[hit-1]"
    assert mid not in TABLE.equivalent
    o = check_mutant(TABLE, MUTANTS[mid], timeout_ms=8000, liveness=False)
    assert o.verdict == "equivalent" and o.reason.startswith("proved"), o
    # hit+1 spans one block more: not equivalent (and the proof must not say it is)
    from kvstate.proofs.engine import check_guard_equivalence

    stricter = MUTANTS["off-by-one-compare:validate.L3.disk_loaded[hit+1]"].make(TABLE)
    assert check_guard_equivalence(TABLE, stricter, "validate", 8000) != "proved"


def test_a_timeout_is_not_a_kill() -> None:
    # with 1 ms per query every Z3 obligation times out: nothing may count as killed
    o = check_mutant(
        TABLE, MUTANTS["off-by-one-compare:pin.pin_cap[hit+1]"], timeout_ms=1, liveness=False
    )
    assert o.verdict == "unknown", o
    assert not o.killed_by


def test_a_stricter_layer_is_killed_by_completeness_only() -> None:
    # refusing a synced indexer page is safe; only the completeness rule (--liveness) sees it
    m = MUTANTS["off-by-one-compare:validate.L3.indexer_synced[ver+1]"]
    assert check_mutant(TABLE, m, timeout_ms=8000, liveness=False).verdict == "survived"
    o = check_mutant(TABLE, m, timeout_ms=8000, liveness=True)
    assert o.verdict == "killed" and o.killed_by[0].startswith("completeness"), o


def test_fuzz_finds_the_spec_mutants_the_implementation_disagrees_with() -> None:
    # ``kvstate mutate --fuzz``: the capture that leaves the graph STALE is harmless to the
    # properties (argued equivalent), yet the allocator captures for real: the fuzz tells them
    # apart; a mutant proved equivalent behaves like the table on every path.
    from types import SimpleNamespace

    from kvstate.proofs.mutate import Outcome
    from kvstate.targets.block.cli import fuzz_spec_mutants

    ids = ["swap-phase:capture.graph[CAPTURED<->STALE]", "drop-conjunct:match.in_pool"]
    rep = SimpleNamespace(
        outcomes=[Outcome(i, MUTANTS[i].operator, MUTANTS[i].action, "", "equivalent") for i in ids]
    )
    out = fuzz_spec_mutants(TABLE, rep, examples=3)
    assert out[ids[0]].startswith("implementation disagrees"), out
    assert out[ids[1]].startswith("implementation agrees"), out
