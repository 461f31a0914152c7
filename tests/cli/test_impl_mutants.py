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

from kvstate.impl_mutants import main  # noqa: E402

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
    triage.write_text(json.dumps({"calc.py:6:NumberReplacer#0": "equivalent: counts from 1"}))
    out_json = tmp_path / "s.json"
    assert main(["report", *scratch, "--triage", str(triage), "--json", str(out_json)]) == 0
    s = json.loads(out_json.read_text())
    assert s["equivalent"] == 1 and s["counted"] == s["measured"] - 1 - s["verdicts"].get(
        "incompetent", 0
    )
    assert len(before) < s["measured"]
