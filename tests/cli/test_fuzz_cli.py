"""`kvstate fuzz`: the built-in allocator conforms, and every seeded bug is caught with a short,
replayable trace (minimized by fresh replays), reported with the seed and the commands to rerun."""

import re
import shlex

import pytest

from kvstate.cli import main
from kvstate.spec import default_table
from kvstate.targets.block import Nonconformance, build_state_machine, minimize, replay_trace
from kvstate.testing.adapter import make_target
from kvstate.testing.seeded import BUGS, witness

# The action each planted bug lives in: the minimized trace must still contain it (the trace
# stays about the bug), and the failure must be of this kind.
KEY = {
    "evict_ignores_pins": ({"evict_start"}, {"accepted-disabled"}),
    "skip_indexer_version": ({"index_update", "rebuild_done"}, {"observe"}),
    "swa_offset_by_one_block": ({"validate", "use"}, {"target-error", "data", "observe"}),
    "tail_splice_off_by_one": ({"validate", "use"}, {"target-error", "data", "observe"}),
    "use_before_load_complete": ({"load_done"}, {"accepted-disabled", "observe"}),
    "abort_during_load_double_free": ({"abort"}, {"observe", "target-error"}),
}
TRACE_LINE = re.compile(r"^\s+\d+\. (\w+)\(")


def _report(out: str) -> dict:
    """The fields of a failure report: how it was found, the lengths, the trace, the commands."""
    rep: dict = {
        "trace": [m.group(1) for line in out.splitlines() if (m := TRACE_LINE.match(line))]
    }
    for key in ("found by", "failure", "seed", "blob", "rerun", "reproduce", "replay"):
        m = re.search(rf"^  {key}:\s+(.*)$", out, re.M)
        rep[key] = m.group(1) if m else None
    m = re.search(r"minimized (\d+) -> (\d+) steps", out) or re.search(
        r"shrank it to (\d+) steps; replay-minimized to (\d+)", out
    )
    rep["before"], rep["after"] = (int(m.group(1)), int(m.group(2))) if m else (None, None)
    return rep


def _argv(command: str) -> list[str]:
    argv = shlex.split(command)
    assert argv[:2] == ["kvstate", "fuzz"], command
    return argv[1:]


def test_builtin_allocator_conforms_in_ci_profile(capsys):
    rc = main(["fuzz", "--pool", "2"])
    out = capsys.readouterr().out
    assert rc == 0, out
    counts = {}
    for line in out.split("action counts:")[1].splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit():
            counts[parts[0]] = int(parts[1])
    assert counts and all(v > 0 for v in counts.values()), counts  # every action fired


@pytest.mark.parametrize("bug", sorted(BUGS))
def test_seeded_bug_is_caught_with_a_minimized_trace(bug, capsys):
    rc = main(["fuzz", "--pool", "2", "--bug", bug])
    out = capsys.readouterr().out
    assert rc == 1, out
    rep = _report(out)
    keys, kinds = KEY[bug]
    assert rep["found by"] and rep["before"] is not None, out
    assert 1 <= rep["after"] == len(rep["trace"]) <= rep["before"], out
    assert len(rep["trace"]) <= 12, out  # a short trace, not a random walk
    assert keys & set(rep["trace"]), out
    assert rep["failure"].split(":")[0] in kinds, out
    assert rep["seed"] and rep["blob"] and rep["rerun"] and rep["replay"], out
    assert f"--bug {bug}" in rep["rerun"] and f"--bug {bug}" in rep["replay"]


def test_printed_trace_replays_and_fails_only_with_the_bug(capsys):
    bug = "use_before_load_complete"
    assert main(["fuzz", "--pool", "2", "--bug", bug]) == 1
    first = _report(capsys.readouterr().out)
    assert main(_argv(first["replay"])) == 1
    again = _report(capsys.readouterr().out)
    assert again["failure"] == first["failure"] and again["trace"] == first["trace"]
    # the same steps against the correct allocator conform
    clean = [a for a in _argv(first["replay"]) if a not in ("--bug", bug)]
    assert main(clean) == 0, capsys.readouterr().out


def test_minimizer_removes_noise_and_simplifies_parameters():
    """A failing trace padded with irrelevant steps and large parameters shrinks back to one
    that fails the same way, each candidate replayed on a fresh target and model."""
    t = default_table()
    bug = "evict_ignores_pins"
    core = witness(bug, t.consts.L)  # ... pin(r=0); tick(t=2); evict_start(b=0): not refused
    noise = [
        ("allocate", {"b": 1}),
        ("capture", {}),
        ("tick", {"t": 3}),
        ("commit", {"b": 1}),
        ("replay", {}),
        ("offload", {"b": 1}),
        ("admit", {"r": 1, "t": 4}),
    ]
    padded = []
    for i, step in enumerate(core):
        padded.append(step)
        if i < len(noise):
            padded.append(noise[i])
    cls = build_state_machine(t, 2, lambda table, n: make_target(table, n, bugs=[bug]))
    exc, at, taken = replay_trace(cls, padded)
    assert isinstance(exc, Nonconformance) and exc.kind == "accepted-disabled", exc
    exc.trace = taken
    mini = minimize(cls, exc)
    assert mini.reproduced and mini.complete
    assert mini.before == len(padded) and mini.after <= len(core) - 1 < mini.before
    assert mini.failure.same_as(exc) and mini.steps[-1].action == "evict_start"
    assert not {"capture", "replay", "offload"} & {s.action for s in mini.steps}
    assert all(v == 0 for s in mini.steps for k, v in s.inputs.items() if k in ("b", "r"))
    # deterministic, and the minimized trace fails again from a fresh start
    again, _, _ = replay_trace(cls, [s.step for s in mini.steps])
    assert again is not None and again.same_as(exc)


def test_hypothesis_alone_finds_shrinks_and_reproduces(capsys):
    """Without the coverage pass or the witness warm-ups, Hypothesis finds this bug itself (ci
    profile: example 8): the report carries its @reproduce_failure blob, the trace is
    replay-minimized, and --reproduce reruns exactly Hypothesis' example."""
    bug = "skip_indexer_version"
    assert main(["fuzz", "--pool", "2", "--bug", bug, "--no-coverage", "--no-warmup"]) == 1
    out = capsys.readouterr().out
    rep = _report(out)
    assert rep["found by"].startswith("Hypothesis, example"), out
    assert rep["blob"].startswith("@reproduce_failure("), out
    assert rep["failure"] == "observe: iver", out
    assert {"index_update", "rebuild_done"} & set(rep["trace"]), out
    assert rep["after"] <= 4 < rep["before"], out
    assert main(_argv(rep["reproduce"])) == 1
    again = _report(capsys.readouterr().out)
    assert again["failure"] == rep["failure"] and again["trace"] == rep["trace"]


def test_bad_target_and_bug_names_exit_2(capsys):
    assert main(["fuzz", "--bug", "no_such_bug"]) == 2
    assert main(["fuzz", "--target", "model", "--bug", "evict_ignores_pins"]) == 2
    assert main(["fuzz", "--target", "nonsense"]) == 2
    assert main(["fuzz", "--examples", "0"]) == 2
    assert main(["fuzz", "--replay", "allocate(b=99)"]) == 2
    assert main(["fuzz", "--replay", "no_such_action(b=0)"]) == 2
    assert main(["fuzz", "--replay", "allocate()"]) == 2


def test_model_target_self_check(capsys):
    assert main(["fuzz", "--target", "model", "--examples", "5", "--steps", "10"]) == 0


def test_coverage_pass_beside_counts_and_fails_as_in_place():
    """The coverage pass forked beside the exploration adds the counts the pass in place adds,
    and a failing pass there says so (the CLI then replays it in place for the report)."""
    from collections import Counter

    from kvstate.proofs.witnesses import reach_traces
    from kvstate.targets.block import replay_seeds
    from kvstate.targets.block.cli import _CoverageBeside

    t = default_table()
    seeds = reach_traces(t.name)[:6]
    here: Counter[str] = Counter()
    cls = build_state_machine(t, 2, lambda table, n: make_target(table, n), stats=here)
    replay_seeds(cls, t, seeds)
    there: Counter[str] = Counter()
    cls = build_state_machine(t, 2, lambda table, n: make_target(table, n), stats=there)
    beside = _CoverageBeside.start(cls, t, seeds, there)
    if beside is None:
        pytest.skip("one CPU or no fork here: the pass runs in place")
    assert beside.join() == {k: v for k, v in here.items() if v} and not there
    bug = "evict_ignores_pins"
    cls = build_state_machine(t, 2, lambda table, n: make_target(table, n, bugs=[bug]))
    failing = _CoverageBeside.start(cls, t, reach_traces(t.name), Counter())
    assert failing is not None and failing.join() is None
    assert "Nonconformance" in failing.why and "evict_start" in failing.why, failing.why


_FORK_AFTER_OPENMP = """
import sys, torch
from kvstate.targets.block.cli import _CoverageBeside
from kvstate.targets.block import build_state_machine
from kvstate.proofs.witnesses import reach_traces
from kvstate.spec.default import default_table
from kvstate.testing.adapter import make_target

def big_target(table, n):  # a target whose construction runs torch ops in parallel regions
    torch.ones(1 << 22).mul_(2).sum()
    return make_target(table, n)

torch.set_num_threads(2)
torch.ones(1 << 22).mul_(3).sum()  # the parent has used OpenMP before the fork
t = default_table()
cls = build_state_machine(t, 2, big_target)
beside = _CoverageBeside.start(cls, t, reach_traces(t.name)[:2], __import__("collections").Counter())
print("none" if beside is None else ("ok" if beside.join() is not None else beside.why))
"""


def test_coverage_pass_beside_survives_a_parent_that_ran_openmp():
    """A child forked after its parent ran an OpenMP parallel region hangs at its own first one
    (GNU OpenMP is not fork-safe), unless the child runs torch on one thread."""
    import subprocess
    import sys

    got = subprocess.run(
        [sys.executable, "-c", _FORK_AFTER_OPENMP],
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
        check=False,
    )
    out = got.stdout.strip().splitlines()
    assert got.returncode == 0 and out, got.stderr[-2000:]
    if out[-1] == "none":
        pytest.skip("one CPU or no fork here: the pass runs in place")
    assert out[-1] == "ok", got.stdout[-2000:] + got.stderr[-2000:]
