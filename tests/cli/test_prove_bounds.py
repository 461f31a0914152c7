"""``kvstate prove`` never goes silent or unbounded: a dead action is reported as such at once, a
budget and a per-obligation timeout end in ``unknown`` verdicts (exit 3: unknown is not a
pass), progress goes to stderr, and a run stopped early (budget, SIGTERM) prints its partial
report in every format."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from xml.etree import ElementTree as ET

import pytest

# A table derived from the default one whose action `offload` can never fire: its guard also
# demands a FREE slot, which its `committed` conjunct excludes.
DEAD_SPEC = """
from dataclasses import replace

from kvstate.spec import CKV, Conjunct, default_table, small


def dead():
    t = default_table(small())
    a = t.action("offload")
    never = Conjunct("never", lambda s, p: s.ckv[p.b] == CKV.FREE)
    return t.derive(name="dead offload", replace_action=[replace(a, guard=(*a.guard, never))])
"""


def _env(path: Path) -> dict[str, str]:
    """This environment, with ``path`` first on the import path (the specs written there)."""
    old = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": str(path) + (os.pathsep + old if old else "")}


def _kvstate(argv: list[str], cwd: Path, **kw: object) -> subprocess.CompletedProcess[str]:
    env = _env(cwd)
    return subprocess.run(
        [sys.executable, "-m", "kvstate", *argv],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=600,
        **kw,  # type: ignore[arg-type]
    )


@pytest.fixture
def dead_spec(tmp_path: Path) -> Path:
    (tmp_path / "deadspec.py").write_text(DEAD_SPEC)
    return tmp_path


def test_a_dead_action_is_reported_dead_quickly(dead_spec: Path) -> None:
    # Before: reach/offload searched by BMC at depths 3..15 on three shapes (23 s here, and
    # without output), then said "no-witness".  Now one Z3 query settles it.
    t0 = time.monotonic()
    p = _kvstate(
        ["prove", "--spec", "deadspec:dead", "--only", "offload", "--format", "json", "-j", "1"],
        dead_spec,
    )
    took = time.monotonic() - t0
    assert p.returncode == 1, p.stderr
    reach = next(r for r in json.loads(p.stdout)["results"] if r["obligation"] == "reach/offload")
    assert reach["status"] == "dead" and "dead action" in reach["detail"], reach
    assert reach["seconds"] < 5.0 and took < 60, (reach["seconds"], took)


def test_budget_gives_a_partial_report_in_every_format(tmp_path: Path) -> None:
    t0 = time.monotonic()
    p = _kvstate(["prove", "--budget", "3", "--format", "json"], tmp_path)
    took = time.monotonic() - t0
    assert p.returncode == 3, (p.returncode, p.stderr[-2000:])  # nothing failed, not all decided
    d = json.loads(p.stdout)
    assert (
        d["schema"] == "kvstate.prove/1"
        and d["verdict"] == "undecided"
        and d["stopped"] == "budget"
    )
    statuses = {r["status"] for r in d["results"]}
    assert "not-run" in statuses and len(d["results"]) >= 151
    assert took < 60, took
    # stderr had progress although it is not a terminal
    assert "units of work" in p.stderr
    junit = tmp_path / "r.xml"
    p = _kvstate(["prove", "--budget", "3", "--format", "junit", "-o", str(junit), "-q"], tmp_path)
    assert p.returncode == 3 and "UNDECIDED" in p.stdout and p.stderr == ""
    suite = ET.parse(junit).getroot()
    assert int(suite.get("skipped", "0")) > 0 and int(suite.get("failures", "0")) == 0
    p = _kvstate(["prove", "--budget", "3"], tmp_path)
    assert p.returncode == 3
    assert "partial report: the --budget of 3 s ran out" in p.stdout
    assert "RESULT: UNDECIDED" in p.stdout


def test_a_unit_past_its_timeout_is_unknown_not_a_pass(tmp_path: Path) -> None:
    # completeness/N=2 is bounded model checking that takes seconds: 0.2 s is not enough
    p = _kvstate(
        ["prove", "--only", "completeness", "--timeout", "0.2", "--format", "json"], tmp_path
    )
    assert p.returncode == 3, (p.returncode, p.stderr[-2000:])
    res = {r["obligation"]: r for r in json.loads(p.stdout)["results"]}
    slow = res["completeness/N=2"]
    assert slow["status"] == "unknown" and not slow["ok"]
    assert "per-obligation timeout (0.2 s)" in slow["detail"]


def test_progress_one_line_per_kind_when_not_a_terminal(tmp_path: Path) -> None:
    p = _kvstate(["prove", "--only", "admission_cap", "-j", "1"], tmp_path)
    assert p.returncode == 0, p.stderr
    lines = p.stderr.strip().splitlines()
    kinds = [ln.split("] ", 1)[1].split(":")[0] for ln in lines[1:]]
    assert sorted(kinds) == sorted(set(kinds)) and "inductive" in kinds, lines
    # the default text shows the summary, not the table of every obligation (-v does)
    assert "RESULT: all obligations hold" in p.stdout and "obligation  " not in p.stdout
    v = _kvstate(["prove", "--only", "admission_cap", "-j", "1", "-q", "-v"], tmp_path)
    assert "inductive/admission_cap/" in v.stdout and v.stderr == ""


def test_sigterm_prints_the_partial_report(tmp_path: Path) -> None:
    env = _env(tmp_path)
    proc = subprocess.Popen(
        [sys.executable, "-m", "kvstate", "prove", "--format", "json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
        env=env,
    )
    assert proc.stderr is not None
    proc.stderr.readline()  # the run has started: its first progress line
    time.sleep(1.0)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, (proc.returncode, err[-2000:])
    assert time.monotonic() - t0 < 20
    d = json.loads(out)
    assert d["stopped"] == "interrupted" and d["verdict"] == "undecided"
