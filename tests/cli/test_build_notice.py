"""The pure-Python build of the request path is never silent: ``kvstate`` says so once on
stderr when it runs the allocator from its sources, and a failed mypyc build stops the install
(pip shows a build's output only when it fails) instead of going on without the extensions."""

from __future__ import annotations

import os
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

from kvstate.cli.common import build_state
from kvstate.impl.testdata import DeterministicWriter

ROOT = Path(__file__).resolve().parents[2]
NOTICE = "kvstate: running the pure-Python build of the request path"


def _replay(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kvstate", "fuzz", "--replay", "allocate(b=0); commit(b=0)"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


def test_pure_build_notice_once_on_stderr() -> None:
    env = {**os.environ, "KVSTATE_PURE_PYTHON": "1"}
    p = _replay(env)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stderr.count(NOTICE) == 1 and "KVSTATE_PURE_PYTHON=1 is set" in p.stderr
    assert NOTICE not in p.stdout
    v = subprocess.run(
        [sys.executable, "-m", "kvstate", "--version"], capture_output=True, text=True, env=env
    )
    assert "request path: pure Python, KVSTATE_PURE_PYTHON=1 is set" in v.stdout


def test_no_notice_when_the_compiled_build_runs() -> None:
    env = {k: v for k, v in os.environ.items() if k != "KVSTATE_PURE_PYTHON"}
    compiled, _ = build_state()
    p = _replay(env)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stderr.count(NOTICE) == (0 if compiled else 1)


def test_prove_does_not_run_the_allocator_and_says_nothing() -> None:
    env = {**os.environ, "KVSTATE_PURE_PYTHON": "1"}
    p = subprocess.run(
        [sys.executable, "-m", "kvstate", "prove", "--only", "admission_cap", "-q", "-j", "1"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert p.returncode == 0 and NOTICE not in p.stderr


def test_a_failed_mypyc_build_stops_the_install(monkeypatch: pytest.MonkeyPatch) -> None:
    """``CC=/bin/false pip install -e .`` used to exit 0 with no extension and no word."""
    from setuptools import Distribution
    from setuptools.command.build_ext import build_ext

    ns = runpy.run_path(str(ROOT / "setup.py"), run_name="kvstate_setup_test")

    def fails(self: build_ext) -> None:
        raise RuntimeError("command '/bin/false' failed with exit code 1")

    monkeypatch.setattr(build_ext, "run", fails)
    cmd = ns["CompiledBuildExt"](Distribution())
    with pytest.raises(SystemExit) as err:
        cmd.run()
    text = str(err.value.code)
    assert "the mypyc build failed" in text and "/bin/false" in text
    assert "KVSTATE_PURE_PYTHON=1 pip install -e ." in text
    # the pure build, asked for, builds nothing and says so
    monkeypatch.setenv("KVSTATE_PURE_PYTHON", "1")
    assert ns["ext_modules"]() == []


def test_compiled_tracebacks_name_the_source_file() -> None:
    """A compiled module's frames named ``build/mypyc-src/kvstate/impl/...`` (the staging
    tree, relative to the build folder: no lines shown); now the source file itself."""
    import traceback

    import kvstate.impl as impl
    from kvstate.spec import small

    if "cache" not in impl.native_modules():
        pytest.skip("the request path runs its sources here (no compiled build)")
    c = impl.HeterogeneousKVCache(small(), executors="manual", writer=DeterministicWriter())
    c.close()
    from kvstate.impl.errors import CacheClosed

    with pytest.raises(CacheClosed) as err:
        c.stats()
    frames = [f for f in traceback.extract_tb(err.value.__traceback__) if "impl" in f.filename]
    assert frames and all(Path(f.filename).is_file() for f in frames), frames
    assert frames[0].filename == str(ROOT / "impl" / "cache.py") and frames[0].line
