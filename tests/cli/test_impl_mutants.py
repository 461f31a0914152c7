"""``python -m kvstate.impl_mutants`` on a scratch package: kills, survivors and hangs are told
apart, a run resumes, and an edited file's mutants run again.

The scratch package has one function the killing test checks (its mutants die), one it never
calls (its mutants survive: the report cannot be a constant), and a loop that a mutant turns
into a hang (a timeout, reported apart from a kill)."""

from __future__ import annotations

import json
import os
import sys
import textwrap
from pathlib import Path

import pytest

if os.environ.get("CI") == "true":  # installed by the dev extra: missing is a failure there
    import cosmic_ray  # noqa: F401
else:
    pytest.importorskip("cosmic_ray", reason="the mutants extra: pip install -e '.[mutants]'")

from kvstate.impl_mutants import enumerate_mutants, main, migrate  # noqa: E402
from kvstate.mutant_runner import Target  # noqa: E402

CALC = """\
def add(a, b):
    return a + b


def count_to(n):
    i = 0
    while i != n:
        i += 1
    return i


def unused(x):
    return x - 5
"""

KILLER = """\
def killer(profile):
    from scratchpkg.calc import add, count_to

    ok = add(2, 3) == 5 and count_to(3) == 3
    return {"killed": not ok, "kind": "" if ok else "wrong answer", "seconds": 0.001}
"""


@pytest.fixture
def scratch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    pkg = tmp_path / "scratchpkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "calc.py").write_text(CALC)
    (tmp_path / "scratchkill.py").write_text(KILLER)
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [m for m in sys.modules if m.startswith("scratch")]:
        monkeypatch.delitem(sys.modules, name)
    return [
        "--folder", str(pkg), "--package", "scratchpkg", "--killer", "scratchkill:killer",
        "--store", str(tmp_path / "store"),
    ]  # fmt: skip


def _verdicts(args: list[str], tmp_path: Path) -> tuple[dict[str, str], dict[str, object]]:
    out = tmp_path / "summary.json"
    assert main(["report", *args, "--json", str(out)]) == 0
    summary = json.loads(out.read_text())
    store = Path(args[args.index("--store") + 1])
    from cosmic_ray.work_db import WorkDB, use_db

    with use_db(str(store / "results-ci.sqlite"), WorkDB.Mode.open) as db:
        verdicts = {j.split("@")[0]: json.loads(r.output)["verdict"] for j, r in db.results}
    return verdicts, summary


def test_kills_survivors_and_hangs_are_told_apart(
    scratch: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["run", *scratch, "--timeout", "1.5"]) == 0
    verdicts, summary = _verdicts(scratch, tmp_path)
    assert verdicts["calc.py:2:ReplaceBinaryOperator_Add_Sub#0"] == "killed"
    assert verdicts["calc.py:7:ReplaceComparisonOperator_NotEq_Eq#0"] == "killed"
    # i += 1 -> i += 2 steps over n = 3: the loop never ends
    assert verdicts["calc.py:8:NumberReplacer#2"] == "timeout"
    assert verdicts["calc.py:13:ReplaceBinaryOperator_Sub_Add#0"] == "survived"
    survivors = {s["id"]: s for s in summary["survivors"]}  # type: ignore[attr-defined]
    assert set(survivors) == {k for k, v in verdicts.items() if v == "survived"}
    unused = survivors["calc.py:13:ReplaceBinaryOperator_Sub_Add#0"]
    assert unused["reached"] is False and "+    return x + 5" in unused["diff"]
    # i = 0 -> i = 1 still counts to 3: reached, and survives (an equivalent mutant here)
    assert survivors["calc.py:6:NumberReplacer#0"]["reached"] is True
    n_survived = sum(v == "survived" for v in verdicts.values())
    assert summary["timeouts"] >= 1 and summary["killed"] >= 2  # type: ignore[operator]
    assert summary["kill_rate"] == pytest.approx(1 - n_survived / len(verdicts))
    assert summary["median_catch_s"] == pytest.approx(0.001)

    capsys.readouterr()
    assert main(["run", *scratch, "--timeout", "1.5"]) == 0  # resumes: nothing left to run
    assert f"{len(verdicts)} already measured on these sources, 0 to run" in capsys.readouterr().out


def test_an_edited_file_runs_again_and_equivalents_are_not_counted(
    scratch: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["run", *scratch, "--timeout", "1.5"]) == 0
    before, _ = _verdicts(scratch, tmp_path)
    calc = tmp_path / "scratchpkg" / "calc.py"
    calc.write_text(CALC + textwrap.dedent(KILLER.replace("killer", "also_unused")))
    capsys.readouterr()
    assert main(["run", *scratch, "--timeout", "1.5"]) == 0
    out = capsys.readouterr().out
    assert "0 already measured on these sources" in out  # the file's digest changed
    triage = tmp_path / "triage.json"
    triage.write_text(json.dumps({"calc.py::NumberReplacer#0::i = 0": "equivalent: counts from 1"}))
    out_json = tmp_path / "s.json"
    assert main(["report", *scratch, "--triage", str(triage), "--json", str(out_json)]) == 0
    s = json.loads(out_json.read_text())
    assert s["equivalent"] == 1 and s["counted"] == s["measured"] - 1 - s["verdicts"].get(
        "incompetent", 0
    )
    assert len(before) < s["measured"]


def _mutants(folder: Path) -> dict[str, object]:
    return {m.id: m for m in enumerate_mutants(Target("scratchpkg", folder, "scratchkill:killer"))}


def test_a_triage_key_survives_an_edit_elsewhere_in_the_file(
    scratch: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pkg = tmp_path / "scratchpkg"
    before = _mutants(pkg)
    sub = before["calc.py:13:ReplaceBinaryOperator_Sub_Add#0"]
    assert sub.key == "calc.py::ReplaceBinaryOperator_Sub_Add#0::return x - 5"  # type: ignore[attr-defined]
    # an edit above it renumbers the id (line and occurrence) but leaves the key
    (pkg / "calc.py").write_text("def other(a, b):\n    return a - b\n\n\n" + CALC)
    after = _mutants(pkg)
    assert "calc.py:13:ReplaceBinaryOperator_Sub_Add#0" not in after
    moved = after["calc.py:17:ReplaceBinaryOperator_Sub_Add#1"]
    assert moved.key == sub.key  # type: ignore[attr-defined]
    # identical lines are told apart; keys are unique
    keys = [m.key for m in after.values()]  # type: ignore[attr-defined]
    assert len(keys) == len(set(keys))
    # the report attaches a keyed argument to its mutant on the edited sources; an entry still
    # keyed by an old id is not used (it may name another mutant now)
    assert main(["run", *scratch, "--timeout", "6"]) == 0
    triage = tmp_path / "triage.json"
    triage.write_text(
        json.dumps(
            {sub.key: "equivalent: an argument", "calc.py:6:NumberReplacer#0": "equivalent: x"}
        )  # type: ignore[attr-defined]
    )
    out_json = tmp_path / "s.json"
    capsys.readouterr()
    assert main(["report", *scratch, "--triage", str(triage), "--json", str(out_json)]) == 0
    assert "1 entries keyed by old mutant ids are not used" in capsys.readouterr().err
    s = json.loads(out_json.read_text())
    assert s["equivalent"] == 1
    [eq] = [sv for sv in s["survivors"] if sv["triage"]]
    assert eq["id"] == "calc.py:17:ReplaceBinaryOperator_Sub_Add#1"


def test_migration_rekeys_what_still_matches_and_drops_the_rest(tmp_path: Path) -> None:
    pkg = tmp_path / "scratchpkg"
    pkg.mkdir()
    (pkg / "calc.py").write_text(CALC)
    old = _mutants(pkg)
    # the ids a report recorded on these sources, with their diffs (docs/generated-mutants.md)
    evidence = "\n".join(
        [
            "- `calc.py:13:ReplaceBinaryOperator_Sub_Add#0` (unused) `- return x - 5` / `+ return x + 5`: x",
            "- `calc.py:6:NumberReplacer#0` (count_to) `- i = 0` / `+ i = 1`: x",
            "- `calc.py:2:ReplaceBinaryOperator_Add_Sub#0` (add) `- return a + b` / `+ return a - b`: x",
        ]
    )
    triage = {
        "calc.py:13:ReplaceBinaryOperator_Sub_Add#0": "equivalent: unused",
        "calc.py:6:NumberReplacer#0": "equivalent: counts from 1",
        "calc.py:2:ReplaceBinaryOperator_Add_Sub#0": "args: gone",
        "calc.py:99:AddNot#3": "tooling: no such mutant, no evidence",
    }
    # the file is edited: a function above renumbers everything, ``add`` is rewritten
    (pkg / "calc.py").write_text(
        "def other(a, b):\n    return a - b\n\n\n" + CALC.replace("return a + b", "return b + a")
    )
    now = list(_mutants(pkg).values())
    text = (pkg / "calc.py").read_text()

    def mutated_line(m: object) -> str:
        from kvstate.impl_mutants import mutated_source

        _, mutated = mutated_source(Target("scratchpkg", pkg, ""), m)  # type: ignore[arg-type]
        return (mutated or text).splitlines()[m.line - 1]  # type: ignore[attr-defined]

    new, moved, dropped = migrate(triage, now, evidence, mutated_line)  # type: ignore[arg-type]
    assert sorted(moved) == [
        "calc.py:13:ReplaceBinaryOperator_Sub_Add#0",
        "calc.py:6:NumberReplacer#0",
    ]
    assert sorted(dropped) == ["calc.py:2:ReplaceBinaryOperator_Add_Sub#0", "calc.py:99:AddNot#3"]
    assert new == {
        old["calc.py:13:ReplaceBinaryOperator_Sub_Add#0"].key: "equivalent: unused",  # type: ignore[attr-defined]
        old["calc.py:6:NumberReplacer#0"].key: "equivalent: counts from 1",  # type: ignore[attr-defined]
    }
    # a migrated file migrates to itself
    assert migrate(new, now, evidence, mutated_line) == (new, [], [])
