"""Build hook: compile the allocator's request path with mypyc (optional, on by default).

The metadata path of an admission (``impl/core.py``, ``impl/cache.py``) is plain typed Python;
mypyc compiles those same files to C extension modules, which Python imports in place of the
sources.  Nothing else changes: the sources stay the reference, and everything runs without the
extensions.  ``KVSTATE_PURE_PYTHON=1`` at install time skips the compilation; a build that
fails (no C compiler, say) is skipped with a warning, and the install goes on in pure Python.
``kvstate.impl.native_modules()`` tells which modules a process runs compiled.

mypyc names a module after its path, and this project maps folders to packages (``impl/`` is
``kvstate.impl``), so the files are compiled through a staging tree of symlinks laid out as
the import names (``build/mypyc-src/kvstate/impl -> impl``).
"""

from __future__ import annotations

import json
import os
import runpy
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
# which modules, and how a build is recorded, are defined once, by the guard that reads them
NATIVE = runpy.run_path(str(ROOT / "impl" / "native.py"), run_name="kvstate_native_setup")
STAGE = Path("build") / "mypyc-src"
# what the compiled modules import is read for its types only; third-party stubs are skipped
# (their values are ``Any`` to the compiled code), which keeps the build to about a minute
MYPY_CONFIG = """\
[mypy]
python_version = 3.11
ignore_missing_imports = True
follow_imports = normal
warn_unused_ignores = False
[mypy-torch.*,z3.*,numba.*,numba_cuda.*,hypothesis.*,networkx.*]
follow_imports = skip
"""


def _stage() -> list[str]:
    """The staging tree: ``kvstate/<pkg>`` links to each mapped folder."""
    pkg = STAGE / "kvstate"
    pkg.mkdir(parents=True, exist_ok=True)
    for src in (ROOT / "kvstate").glob("*.py"):
        _link(pkg / src.name, src)
    for folder in ("spec", "model", "proofs", "impl", "kernels", "numerics"):
        _link(pkg / folder, ROOT / folder)
    (STAGE / "mypy.ini").write_text(MYPY_CONFIG)
    return [str(pkg / "impl" / f"{m}.py") for m in NATIVE["COMPILED"]]


def _link(at: Path, to: Path) -> None:
    if at.is_symlink() or at.exists():
        if at.is_symlink() and at.resolve() == to.resolve():
            return
        at.unlink()
    at.symlink_to(to)


class BuildFailed(SystemExit):
    """The install stops: the compiled build failed and the pure one was not asked for."""


def build_failed(what: str, exc: BaseException) -> BuildFailed:
    """The error that stops the install, saying what failed and the two ways on."""
    return BuildFailed(
        f"kvstate: {what}: {type(exc).__name__}: {exc}\n"
        "kvstate: the request path is compiled with mypyc by default (gcc and the Python "
        "headers, e.g. apt-get install gcc python3-dev); to install the pure-Python build "
        "instead (the same code, several times slower per admission), set "
        "KVSTATE_PURE_PYTHON=1: KVSTATE_PURE_PYTHON=1 pip install -e ."
    )


class CompiledBuildExt(build_ext):
    """The compiled request path; a failure stops the install (see the module's docstring)."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:  # noqa: BLE001 - any build failure, said and stopped
            raise build_failed("the mypyc build failed", exc) from exc
        if self.extensions:  # record what was compiled, for the stale-build guard
            out = Path(self.get_ext_fullpath(self.extensions[0].name)).parent
            record = NATIVE["manifest"](out, ROOT / "impl")
            (out / NATIVE["MANIFEST"]).write_text(json.dumps(record, indent=1) + "\n")


def _docstrings(extensions: list) -> None:  # type: ignore[type-arg]
    """The C that mypyc generated gets each compiled function's, class's and property's
    docstring (without them the build runs the same, but ``help()`` shows bare signatures)."""
    try:
        add = runpy.run_path(str(ROOT / "kvstate" / "buildtools" / "mypyc_docs.py"))[
            "add_docstrings"
        ]
        c_files = {Path(src) for ext in extensions for src in ext.sources if src.endswith(".c")}
        modules = [(f"kvstate.impl.{m}", ROOT / "impl" / f"{m}.py") for m in NATIVE["COMPILED"]]
        placed = add(sorted(c_files), modules)
        print(f"kvstate: {placed} docstrings placed in the compiled modules", file=sys.stderr)
    except Exception as exc:  # noqa: BLE001
        print(f"kvstate: WARNING: compiling without docstrings ({exc})", file=sys.stderr)


def ext_modules() -> list:  # type: ignore[type-arg]
    if os.environ.get("KVSTATE_PURE_PYTHON", "") not in ("", "0"):
        print(
            "kvstate: KVSTATE_PURE_PYTHON is set: installing the pure-Python build", file=sys.stderr
        )
        return []
    try:
        from mypyc.build import mypycify

        paths = _stage()
        exts = mypycify(
            ["--config-file", str(STAGE / "mypy.ini"), *paths],
            opt_level="3",
            group_name=f"kvstate.impl.{NATIVE['GROUP']}",
        )
    except BaseException as exc:  # noqa: BLE001 - mypyc exits on a type error
        raise build_failed("mypyc could not compile the request path", exc) from exc
    _docstrings(exts)
    _tracebacks_to_sources(exts)
    return exts


def _tracebacks_to_sources(exts: list) -> None:  # type: ignore[type-arg]
    """A compiled module's traceback names the file mypyc was given: the staging tree's
    ``build/mypyc-src/kvstate/impl/x.py``, relative to the build's folder, where no reader
    finds the source.  The generated C names it only in its traceback strings, so those are
    rewritten to the real source file (``<root>/impl/x.py``): tracebacks then show the lines.
    (For a wheel built in a temporary folder the path is that folder's, as before.)"""
    staged = f'"{STAGE.as_posix()}/kvstate/impl/'
    real = '"' + (ROOT / "impl").as_posix().replace("\\", "\\\\").replace('"', '\\"') + "/"
    for ext in exts:
        for src in ext.sources:
            path = Path(src)
            if path.suffix == ".c" and path.exists():
                text = path.read_text()
                if staged in text:
                    path.write_text(text.replace(staged, real))


if __name__ == "__main__":  # setuptools runs this file as __main__; tests load its parts
    setup(ext_modules=ext_modules(), cmdclass={"build_ext": CompiledBuildExt})
