"""The exit-code contract: bad usage and malformed input exit 2 with one readable line on stderr,
nothing run; 1 is kept for "a property fails".  And what ``--help`` / ``--version`` tell."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from kvstate.cli import main


def _env(path: Path) -> dict[str, str]:
    """This environment, with ``path`` first on the import path (the specs written there)."""
    import os

    old = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": str(path) + (os.pathsep + old if old else "")}


def _run(argv: list[str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kvstate", *argv],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=_env(tmp_path),
        timeout=300,
    )


@pytest.fixture
def specs(tmp_path: Path) -> Path:
    (tmp_path / "syntax_spec.py").write_text("def table(:\n    pass\n")
    (tmp_path / "raising_spec.py").write_text(
        "def table():\n    raise RuntimeError('no table here')\n"
    )
    (tmp_path / "other_spec.py").write_text("table = 42\n")
    return tmp_path


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["prove", "--spec", "syntax_spec:table"], "syntax error (syntax_spec.py, line 1)"),
        (["prove", "--spec", "raising_spec:table"], "raised RuntimeError: no table here"),
        (["graphs", "--spec", "raising_spec:table"], "raised RuntimeError: no table here"),
        (["mutate", "--spec", "syntax_spec:table"], "syntax error"),
        (["prove", "--spec", "other_spec:table"], "is not a kvstate.spec.Table (got int)"),
        (["fuzz", "--reproduce", "notablob"], "is not a Hypothesis @reproduce_failure blob"),
        (["fuzz", "--pool", "0"], "argument --pool: '0' must be at least 1"),
        (["prove", "-j", "0"], "argument -j/--jobs: '0' must be at least 1"),
        (["mutate", "-j", "0"], "argument -j/--jobs: '0' must be at least 1"),
        (["fuzz", "--examples", "0"], "argument --examples: '0' must be at least 1"),
        (
            ["fuzz", "--target", "nosuch"],
            "targets: kvstate-api, kvstate, model, vllm, vllm-scheduler, sglang, or module:factory",
        ),
        (["fuzz", "--bug", "nosuch"], "known: abort_during_load_double_free"),
        (["mutate", "--operator", "nosuch"], "operators: drop-conjunct, drop-guard"),
        (["mutate", "--min-kill-rate", "2"], "must be within 0..1"),
        (["prove", "--budget", "-1"], "argument --budget"),
        (["prove", "--geometry", "huge"], "invalid choice: 'huge'"),
    ],
)
def test_bad_input_exits_2_with_one_line(argv: list[str], says: str, specs: Path) -> None:
    p = _run(argv, specs)
    assert p.returncode == 2, (p.returncode, p.stderr[-2000:])
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], p.stderr[-2000:]
    assert "Traceback" not in p.stderr and p.stdout == ""


def test_main_returns_the_usage_code_instead_of_raising(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["prove", "--depth", "0"]) == 2
    assert main(["fuzz", "--pool", "0"]) == 2
    assert "must be at least 1" in capsys.readouterr().err


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    from kvstate import __version__

    assert main(["--version"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"kvstate {__version__} ") and "request path:" in out


def _help(*argv: str) -> str:
    p = subprocess.run(
        [sys.executable, "-m", "kvstate", *argv, "--help"], capture_output=True, text=True
    )
    assert p.returncode == 0, p.stderr
    return p.stdout


def test_help_documents_every_option_and_lists_names() -> None:
    import argparse

    from kvstate.cli import build_parser
    from kvstate.proofs.mutate import OPERATORS
    from kvstate.spec.geometry import PRESETS
    from kvstate.testing.seeded import BUGS

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, cmd in sub.choices.items():
        for action in cmd._actions:
            assert action.help, f"kvstate {name} {action.option_strings}: no help text"
    top = _help()
    assert "exit codes:" in top and "3    undecided" in top
    fuzz = _help("fuzz")
    assert all(b in fuzz for b in BUGS) and "kvstate-api" in fuzz and "exit codes:" in fuzz
    mutate = _help("mutate")
    assert all(o in mutate for o in OPERATORS)
    prove = _help("prove")
    assert all(g in prove for g in PRESETS) and "--budget" in prove and "--timeout" in prove
