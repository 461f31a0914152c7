"""``python -m kvstate.api_mutants`` runs its killing test on the unmutated copy first: a child
that cannot pass there (here: the harness's entry module broken in the staged copy, as a
missing dependency breaks it) would count every planted bug killed, so the run stops with
status 2 and runs no mutant."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvstate import api_mutants

_STAGE = api_mutants.stage


def _broken_stage() -> Path:
    root = _STAGE()
    run = root / "kvstate" / "targets" / "api" / "run.py"
    run.write_text("raise ImportError('a dependency the child cannot import')\n")
    return root


def test_a_child_that_cannot_pass_unmutated_is_reported() -> None:
    why = api_mutants.baseline(_broken_stage(), "ci", timeout=120)
    assert why is not None and "crash" in why


def test_the_run_stops_before_any_mutant(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(api_mutants, "stage", _broken_stage)
    ran: list[str] = []
    monkeypatch.setattr(api_mutants, "run_one", lambda *a, **k: ran.append(a[1]))
    name = next(m.name for m in api_mutants.MUTANTS if not m.equivalent)
    assert api_mutants.main(["-k", name]) == 2
    assert ran == [] and "fails on the unmutated sources" in capsys.readouterr().err
