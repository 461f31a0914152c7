"""`kvstate fuzz`: the built-in allocator conforms, and every seeded bug is caught."""

import pytest

from kvstate.cli import main
from kvstate.impl.bugs import BUGS


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
def test_seeded_bug_is_caught(bug, capsys):
    rc = main(["fuzz", "--pool", "2", "--bug", bug])
    out = capsys.readouterr().out
    assert rc == 1, out
    assert "FAILED" in out and "rerun: kvstate fuzz" in out and f"--bug {bug}" in out


def test_bad_target_and_bug_names_exit_2(capsys):
    assert main(["fuzz", "--bug", "no_such_bug"]) == 2
    assert main(["fuzz", "--target", "model", "--bug", "evict_ignores_pins"]) == 2
    assert main(["fuzz", "--target", "nonsense"]) == 2
    assert main(["fuzz", "--examples", "0"]) == 2


def test_model_target_self_check(capsys):
    assert main(["fuzz", "--target", "model", "--examples", "5", "--steps", "10"]) == 0
