"""The compiled request path (mypyc, see impl/native.py and setup.py).

* A stale build is detected: an edited source, a replaced extension, a missing build record.
* CI runs the compiled modules (a build that silently fell back to Python would otherwise go
  unnoticed there), and the pure-Python sources behave the same: the derandomized conformance
  fuzz run gives identical lockstep counts in both.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from kvstate.impl import native


def _fake_build(folder: Path) -> None:
    src = Path(native.__file__).parent
    for m in native.COMPILED:
        shutil.copy(src / f"{m}.py", folder / f"{m}.py")
        (folder / f"{m}{native.importlib.machinery.EXTENSION_SUFFIXES[0]}").write_bytes(
            f"compiled {m}".encode()
        )
    (folder / native.MANIFEST).write_text(json.dumps(native.manifest(folder)))


def test_a_matching_build_is_not_stale(tmp_path: Path) -> None:
    _fake_build(tmp_path)
    assert native.stale(tmp_path) == []


def test_an_edited_source_makes_the_build_stale(tmp_path: Path) -> None:
    _fake_build(tmp_path)
    with open(tmp_path / "core.py", "a") as f:
        f.write("\n# edited\n")
    assert native.stale(tmp_path) == ["core.py changed since it was compiled"]


def test_a_replaced_extension_or_a_missing_record_is_stale(tmp_path: Path) -> None:
    _fake_build(tmp_path)
    ext = native.extensions(tmp_path)[0]
    ext.write_bytes(b"another build")
    assert native.stale(tmp_path) == ["the extension files are not the ones the build wrote"]
    (tmp_path / native.MANIFEST).unlink()
    assert native.stale(tmp_path) and "no _native.json" in native.stale(tmp_path)[0]


def _run(args: list[str], pure: bool) -> str:
    env = dict(os.environ)
    env.pop(native.ENV_PURE, None)
    if pure:
        env[native.ENV_PURE] = "1"
    out = subprocess.run(
        [sys.executable, "-W", "error::RuntimeWarning", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, f"{args} (pure={pure}) failed:\n{out.stdout}\n{out.stderr}"
    return out.stdout


def test_ci_runs_the_compiled_modules_and_pure_python_can_be_forced() -> None:
    code = "import kvstate.impl as I; print(','.join(I.native_modules()))"
    if os.environ.get("CI"):  # the install must have compiled them, and not stale
        assert _run(["-c", code], pure=False).strip() == ",".join(native.COMPILED)
    assert _run(["-c", code], pure=True).strip() == ""


def _fuzz_result(pure: bool) -> str:
    """The fuzz run's verdict and action counts, without its timings."""
    out = _run(["-m", "kvstate", "fuzz", "--pool", "2", "--profile", "ci"], pure)
    verdict = out[out.index("kvstate fuzz: ok") :]
    verdict = re.sub(r"^throughput: .*\n", "", verdict, flags=re.M)  # steps/s: a timing
    return re.sub(r", [\d.]+ s$", "", verdict, flags=re.M)


def test_pure_python_and_compiled_fuzz_identically() -> None:
    pure, compiled = _fuzz_result(pure=True), _fuzz_result(pure=False)
    assert "lockstep steps" in pure and "action counts" in pure
    assert pure == compiled
