"""``kvstate mutate``'s gate never passes on what it did not check; a budgeted or interrupted run
resumes from its session store; JUnit and a JSON schema version for CI."""

from __future__ import annotations

import json
from pathlib import Path
from xml.etree import ElementTree as ET

import pytest

from kvstate.cli import main

# three mutants checked in a few seconds: two killed, one proved equivalent
FEW = ["--operator", "drop-guard", "--only", "replay", "--only", "downgrade", "--only", "abort"]


def test_budget_zero_fails_the_gate(capsys: pytest.CaptureFixture[str]) -> None:
    # Before: "kill rate 100.0%, 0 survivors" and exit 0 with every mutant unchecked.
    rc = main(
        ["mutate", "--budget", "0", "--min-kill-rate", "0.9", "--no-session", "-q", "-j", "1"]
    )
    out = capsys.readouterr().out
    assert rc == 1, out[-2000:]
    assert "checked 0 of 356 mutants" in out and "kill rate 0.0%" in out, out[-2000:]


def test_unchecked_and_unknown_count_against_the_rate() -> None:
    from kvstate.proofs.mutate import MutationReport, Outcome

    def o(v: str) -> Outcome:
        return Outcome(f"m{v}", "drop-guard", "a", "", v)

    rep = MutationReport("t", [o("killed"), o("unknown"), o("unchecked"), o("equivalent")], 0, 1, 0)
    assert rep.kill_rate == pytest.approx(1 / 3) and rep.kill_rate_checked == pytest.approx(1 / 2)
    assert rep.checked == 3 and rep.judged == 3
    assert MutationReport("t", [o("equivalent")], 0, 1, None).kill_rate == 0.0


def test_nothing_to_judge_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(["mutate", "--only", "no-such-mutant", "--min-kill-rate", "0.5", "--no-session"]) == 2
    )
    assert "no mutant to judge" in capsys.readouterr().err


def test_session_resumes_and_reports(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = tmp_path / "s.sqlite"
    argv = ["mutate", *FEW, "--session", str(store), "-q", "-j", "1", "--format", "json"]
    # a run stopped by its budget keeps nothing unchecked in the store, and with no gate its
    # partial report is undecided (3), not a pass ...
    assert main([*argv, "--budget", "0"]) == 3
    first = json.loads(capsys.readouterr().out)
    assert (
        first["schema"] == "kvstate.mutate/1"
        and first["checked"] == 0
        and first["stopped"] == "budget"
    )
    # ... the next run checks them all and keeps each verdict ...
    assert main([*argv, "--min-kill-rate", "0.6"]) == 0
    second = json.loads(capsys.readouterr().out)
    assert second["resumed"] == 0 and second["checked"] == 3 and second["counts"]["killed"] == 2
    # ... and the one after that resumes them instead of checking again
    assert main([*argv, "--min-kill-rate", "0.6"]) == 0
    third = json.loads(capsys.readouterr().out)
    assert third["resumed"] == 3 and third["counts"] == second["counts"]
    assert [m["verdict"] for m in third["mutants"]] == [m["verdict"] for m in second["mutants"]]
    # another setting is another key: nothing resumed
    assert main([*argv, "--timeout-ms", "3999"]) == 0
    assert json.loads(capsys.readouterr().out)["resumed"] == 0


def test_session_key_is_the_table_content(tmp_path: Path) -> None:
    from kvstate.proofs.mutate import mutate
    from kvstate.spec import table_named

    store = tmp_path / "s.sqlite"
    a = table_named("default")
    first = mutate(a, operators=["drop-guard"], only=["replay"], jobs=1, session=store)
    assert first.resumed == 0 and first.checked == 1
    # the same content under another name resumes; other content does not
    renamed = a.derive(name="another name")
    assert (
        mutate(renamed, operators=["drop-guard"], only=["replay"], jobs=1, session=store).resumed
        == 1
    )
    other = a.derive(drop_guard=[("evict_start", "unpinned")])
    assert (
        mutate(other, operators=["drop-guard"], only=["replay"], jobs=1, session=store).resumed == 0
    )


def test_junit(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "m.xml"
    assert (
        main(
            ["mutate", *FEW, "--no-session", "-q", "-j", "1", "--format", "junit", "-o", str(path)]
        )
        == 0
    )
    assert "checked 3 of 3 mutants" in capsys.readouterr().out
    suite = ET.parse(path).getroot()
    assert (
        suite.get("tests") == "3" and suite.get("failures") == "0" and suite.get("skipped") == "1"
    )
    names = {c.get("name") for c in suite.iter("testcase")}
    assert "drop-guard:replay" in names
