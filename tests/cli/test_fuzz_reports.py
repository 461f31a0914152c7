"""`kvstate fuzz`'s CI reports (JSON with a schema, JUnit, SARIF, GitHub annotations, ITF
traces with the model's states) and the trace reader (``ast``)."""

from __future__ import annotations

import inspect
import json
import os
from xml.etree import ElementTree as ET

import pytest

from kvstate.calls import parse_calls
from kvstate.cli import main
from kvstate.fuzz_report import SCHEMA, api_states, spec_location
from kvstate.spec import default_table, small
from kvstate.targets.api import op, parse_ops

BUG = "use_before_load_complete"  # the coverage pass finds it in ~1 s (docs/fuzz.md)


def _line(fn) -> tuple[str, int]:
    return os.path.relpath(inspect.getsourcefile(fn)), inspect.getsourcelines(fn)[1]


def test_a_finding_in_every_report(tmp_path, capsys):
    paths = {k: str(tmp_path / f"r.{k}") for k in ("json", "junit", "sarif", "itf")}
    argv = ["fuzz", "--pool", "2", "--bug", BUG, "--github-annotations"]
    assert main(argv + [a for k, p in paths.items() for a in (f"--{k}", p)]) == 1
    out = capsys.readouterr().out
    table = default_table(small())
    # the guard conjunct the target ignored, where the table writes it
    path, line = _line(table.action("load_done").conjunct("complete").fn)

    rep = json.load(open(paths["json"]))
    assert rep["schema"] == SCHEMA and rep["ok"] is False and rep["target"] == "kvstate"
    f = rep["finding"]
    assert f["signature"] == "accepted-disabled: load_done[complete]"
    assert f["trace"][-1] == "load_done(b=0)" and "--replay" in f["commands"]["replay"]
    assert f["location"] == {
        "path": path,
        "line": line,
        "what": "guard conjunct load_done.complete",
    }

    case = ET.parse(paths["junit"]).getroot().find("testcase")
    failure = case.find("failure")
    assert failure is not None and failure.get("message") == f["signature"]
    assert "load_done(b=0)" in failure.text

    sarif = json.load(open(paths["sarif"]))
    assert sarif["version"] == "2.1.0"
    (result,) = sarif["runs"][0]["results"]
    where = result["locations"][0]["physicalLocation"]
    assert (where["artifactLocation"]["uri"], where["region"]["startLine"]) == (path, line)

    assert f"::error file={path},line={line},title=kvstate fuzz%3A accepted-disabled" in out

    itf = json.load(open(paths["itf"]))
    assert itf["#meta"]["format"] == "ITF" and itf["vars"] == [v.name for v in table.vars]
    states = itf["states"]
    # Init, then the model's state after each step; the last step is refused by the model
    taken = [s["mbt::actionTaken"] for s in states]
    assert taken == ["init", *[t.split("(")[0] for t in f["trace"][:-1]], "refused load_done"]
    assert all(set(itf["vars"]) <= set(s) for s in states)
    assert states[0]["ckv"] != states[-1]["ckv"]  # states, not only actions
    assert states[-1]["ckv"] == states[-2]["ckv"]  # a refusal changes nothing
    assert states[1]["mbt::nondetPicks"]["b"] == 0


def test_a_clean_run_reports_ok(tmp_path, capsys):
    j, x = str(tmp_path / "r.json"), str(tmp_path / "r.xml")
    argv = ["fuzz", "--target", "model", "--examples", "3", "--steps", "5"]
    assert main(argv + ["--json", j, "--junit", x, "--github-annotations"]) == 0
    rep = json.load(open(j))
    assert rep["schema"] == SCHEMA and rep["ok"] is True and rep["finding"] is None
    assert rep["steps"] > 0 and rep["examples"] == 3
    assert ET.parse(x).getroot().get("failures") == "0"
    assert "::error" not in capsys.readouterr().out


def test_spec_locations_of_each_kind_of_finding():
    table = default_table(small())
    refcount = table.invariant("refcount")
    got = spec_location(table, "observed-invariant", ["refcount"])
    assert (got.path, got.line) == _line(refcount.per_block or refcount.scalar)
    got = spec_location(table, "observe", ["iver"], "index_update")
    assert (got.path, got.line) == _line(table.action("index_update").updates["iver"])
    assert got.what == "update of iver by index_update"
    got = spec_location(table, "target-error", ["validate:Refused"])
    assert got is not None and got.what.endswith("by validate")
    assert spec_location(table, "data", ["SWA window"]) is None  # names no line of the spec


def test_api_trace_states():
    table = default_table(small())
    ops = [op("request", i=0, n=2 * table.consts.L + 1, life=1)]
    ops.append(op("admit", i=0))
    states = api_states(table, 4, ops)
    assert [s[0] for s in states] == ["init", "request", "admit", "quiesce"]
    assert states[0][2]["phase"] != states[2][2]["phase"]  # admission moved the request


def test_traces_are_read_as_python_calls():
    text = """
      1. allocate(b=0)             # target chose a=0, f=0
      2. commit(b=0); offload(b=-1)
    """
    assert parse_calls(text) == [
        ("allocate", [("b", 0)]),
        ("commit", [("b", 0)]),
        ("offload", [("b", -1)]),
    ]
    assert parse_ops("request(i=0, n=49, life=2); admit(i=0)") == [
        op("request", i=0, n=49, life=2),
        op("admit", i=0),
    ]
    for bad in ("allocate(0)", "allocate(b=x)", "allocate(b=1.5)", "a.b(c=1)", "x = 1",
                "allocate(b=True)", "allocate(b=0", "allocate(**k)", "f(b=1, b=2)"):  # fmt: skip
        with pytest.raises(ValueError):
            parse_calls(bad)
    with pytest.raises(ValueError):
        parse_ops("no_such_op(i=0)")
    assert main(["fuzz", "--replay", "allocate(b=0) commit(b=0)"]) == 2


def test_prove_json_report_has_a_schema_version():
    from kvstate.proofs import render_json
    from kvstate.proofs.runner import Report

    rep = json.loads(render_json(Report("t", "small", [], 0.0, 1)))
    assert rep["schema"] == "kvstate.prove/1"


def test_api_target_reports(tmp_path):
    """An API-target finding in the reports: its operations as calls, the model's states."""
    import argparse
    from collections import Counter

    from kvstate.fuzz_report import api_outcome, emit
    from kvstate.harness.finding import Nonconformance
    from kvstate.targets.api import Coverage, RunResult

    table = default_table(small())
    ops = parse_ops(f"request(i=0, n={2 * table.consts.L + 1}, life=1); admit(i=0)")
    found = Nonconformance("observe", ["phase"], "a planted finding")
    res = RunResult(found, Coverage(), Counter({"(steps)": 7}), 1.5, "coverage pass", ops, seed=3)
    args = argparse.Namespace(
        profile="dev", json=str(tmp_path / "a.json"), itf=str(tmp_path / "a.itf")
    )
    emit(args, api_outcome(args, table, 4, res, {"replay": "kvstate fuzz ... --replay ..."}))
    rep = json.load(open(args.json))
    assert rep["schema"] == SCHEMA and rep["target"] == "kvstate-api" and rep["seed"] == 3
    assert rep["finding"]["trace"] == [o.render() for o in ops]
    assert rep["finding"]["signature"] == "observe: phase"
    itf = json.load(open(args.itf))
    assert [s["mbt::actionTaken"] for s in itf["states"]] == ["init", "request", "admit", "quiesce"]
