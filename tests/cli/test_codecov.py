"""``kvstate fuzz --coverage``: branch coverage of impl/ as a fuzz run's output."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from kvstate.codecov import EXCLUDE, CoverageUnavailable, Measure

ROOT = Path(__file__).resolve().parents[2]
pytest.importorskip("coverage")


def test_pyproject_excludes_what_the_fuzz_excludes() -> None:
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["coverage"]
    assert cfg["report"]["exclude_lines"] == [EXCLUDE]
    assert cfg["run"]["omit"] == ["impl/_aot.py"]


def test_every_exclusion_in_impl_gives_its_reason() -> None:
    """A line is left out of the figures only with its reason on it: a bare pragma (which the
    configuration does not honour, so it would only mislead a reader) is refused here."""
    bare = []
    for path in sorted((ROOT / "impl").glob("*.py")):
        for k, line in enumerate(path.read_text().splitlines(), 1):
            if "pragma: no cover" in line and not re.search(EXCLUDE, line):
                bare.append(f"{path.name}:{k}")
    assert not bare, f"'# pragma: no cover' without ': <reason>': {bare}"
    assert re.search(EXCLUDE, "x = 1  # pragma: no cover: the platform has no O_DIRECT")
    assert not re.search(EXCLUDE, "x = 1  # pragma: no cover")


def test_only_kvstate_targets_are_measured() -> None:
    with pytest.raises(CoverageUnavailable, match="kvstate's own targets"):
        Measure("vllm")


def test_fuzz_prints_per_module_coverage_and_writes_its_json(tmp_path: Path) -> None:
    out = tmp_path / "cov.json"
    env = {k: v for k, v in os.environ.items() if k != "KVSTATE_PURE_PYTHON"}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "kvstate",
            "fuzz",
            "--target",
            "kvstate-api",
            "--examples",
            "2",
            "--steps",
            "6",
            "--no-coverage",
            "--coverage",
            "--coverage-json",
            str(out),
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    m = re.search(r"code coverage of impl/ \(pure build.*?\): ([\d.]+)%", proc.stdout)
    assert m is not None, proc.stdout
    assert 10 < float(m.group(1)) < 100
    assert re.search(r"per module: .*cache \d+%.*recovery \d+%", proc.stdout)
    data = json.loads(out.read_text())
    names = {Path(p).name for p in data["files"]}
    assert "cache.py" in names and "_aot.py" not in names
    # the pure build ran: every line of a compiled module would count as missed
    assert data["files"][next(p for p in data["files"] if p.endswith("cache.py"))]["summary"][
        "covered_lines"
    ]
