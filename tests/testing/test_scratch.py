"""The fuzz entry points' RAM scratch folder: opt-outs win, and it really moves tempfile."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from kvstate.testing import scratch


@pytest.fixture
def restore_tempdir():  # type: ignore[no-untyped-def]
    before = tempfile.tempdir
    yield
    tempfile.tempdir = before


def test_tmpdir_and_opt_out_win(monkeypatch: pytest.MonkeyPatch, restore_tempdir: None) -> None:
    monkeypatch.setenv("TMPDIR", "/tmp")
    assert scratch.ram_scratch() is None
    monkeypatch.delenv("TMPDIR")
    monkeypatch.setenv("KVSTATE_SCRATCH", "disk")
    assert scratch.ram_scratch() is None


def test_moves_tempfile_to_ram(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, restore_tempdir: None
) -> None:
    monkeypatch.delenv("TMPDIR", raising=False)
    monkeypatch.delenv("KVSTATE_SCRATCH", raising=False)
    monkeypatch.setattr(scratch, "RAM", tmp_path)  # any writable folder stands in for tmpfs
    got = scratch.ram_scratch()
    assert got is not None and got.parent == tmp_path
    assert Path(tempfile.mkdtemp()).parent == got


def test_no_ram_folder(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, restore_tempdir: None
) -> None:
    monkeypatch.delenv("TMPDIR", raising=False)
    monkeypatch.delenv("KVSTATE_SCRATCH", raising=False)
    monkeypatch.setattr(scratch, "RAM", tmp_path / "absent")
    assert scratch.ram_scratch() is None
