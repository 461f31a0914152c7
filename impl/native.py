"""Which modules of the request path run compiled (mypyc), and a guard against stale builds.

``setup.py`` compiles the modules named in :data:`COMPILED` with mypyc and records, in
``_native.json`` beside them, the hash of each source it compiled and of each extension it
wrote.  Python imports an extension module in preference to its source; after an edit (an
editable install keeps the old extensions in the source tree) that would silently run old code.
So before those modules are imported, :func:`install_guard` compares the hashes and, when any
differs or when ``KVSTATE_PURE_PYTHON`` is set, makes Python import their sources instead (with a
warning when the reason is a stale build).  This module is never compiled itself.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

# impl modules compiled by setup.py: the admit/use/finish path and what it calls per step
COMPILED = (
    "gate", "blocks", "recovery", "spills", "diskreads", "requests", "core", "handles", "cache", "coordinator", "meta", "storage", "events", "hashing", "guards", "tiers",
    "groups", "args", "phasecodes", "_aot",
)  # fmt: skip
MANIFEST = "_native.json"
GROUP = "_native"  # mypyc's shared library of the compiled modules: ``<GROUP>__mypyc``
ENV_PURE = "KVSTATE_PURE_PYTHON"
_HERE = Path(__file__).resolve().parent
_PACKAGE = __name__.rpartition(".")[0]


def digest(path: Path) -> str:  # pragma: no cover: stale() only (not pure); test_impl_native
    return hashlib.sha256(path.read_bytes()).hexdigest()


def extensions(folder: Path = _HERE) -> list[Path]:
    """The extension files of the compiled modules (and their shared library) in ``folder``."""
    out = []
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        for name in (*COMPILED, f"{GROUP}__mypyc"):
            p = folder / f"{name}{suffix}"
            if p.exists():
                out.append(p)
    return out


def manifest(  # pragma: no cover: stale() only (not pure); test_impl_native.py
    folder: Path, sources: Path | None = None
) -> dict[str, dict[str, str]]:
    """What a build records: the sources it compiled (in ``sources``, default ``folder``) and
    the extension files it wrote (in ``folder``)."""
    src = folder if sources is None else sources
    return {
        "sources": {m: digest(src / f"{m}.py") for m in COMPILED},
        "extensions": {p.name: digest(p) for p in extensions(folder)},
    }


def pure_requested() -> bool:
    return os.environ.get(ENV_PURE, "") not in ("", "0")


def stale(folder: Path = _HERE) -> list[str]:  # pragma: no cover: not pure; test_impl_native
    """Why the extensions in ``folder`` do not match their sources (empty: they match)."""
    path = folder / MANIFEST
    if not path.exists():
        return [f"no {MANIFEST} (the extensions were not built by this project's setup.py)"]
    try:
        want = json.loads(path.read_text())
        have = manifest(folder)
    except (OSError, ValueError) as exc:
        return [f"unreadable build record: {exc}"]
    why = [f"{m}.py changed since it was compiled" for m, h in have["sources"].items()
           if want.get("sources", {}).get(m) != h]  # fmt: skip
    if have["extensions"] != want.get("extensions"):
        why.append("the extension files are not the ones the build wrote")
    return why


class _SourceFirst(importlib.abc.MetaPathFinder):
    """Imports the named modules from their ``.py`` files, ahead of any extension."""

    def __init__(self, files: dict[str, Path]) -> None:
        self.files = files

    def find_spec(
        self, name: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        f = self.files.get(name)
        return importlib.util.spec_from_file_location(name, f) if f is not None else None


_guard: _SourceFirst | None = None


def install_guard() -> None:
    """Called by the package before it imports the compiled modules (idempotent)."""
    global _guard
    if _guard is not None or not extensions():
        return
    reasons = [] if pure_requested() else stale()
    if not pure_requested() and not reasons:
        return  # pragma: no cover: compiled build only (the coverage run is the pure build)
    if reasons:  # pragma: no cover: a stale build (the coverage run asks for the pure one)
        warnings.warn(
            "kvstate: running the Python sources of the request path, not its stale mypyc "
            f"build ({'; '.join(reasons)}); rebuild with `pip install -e .`",
            RuntimeWarning,
            stacklevel=3,
        )
    _guard = _SourceFirst({f"{_PACKAGE}.{m}": _HERE / f"{m}.py" for m in COMPILED})
    sys.meta_path.insert(0, _guard)


def native_modules() -> tuple[str, ...]:
    """The modules of :data:`COMPILED` this process runs as compiled extensions."""
    out = []
    for m in COMPILED:
        mod = sys.modules.get(f"{_PACKAGE}.{m}")
        if mod is not None and isinstance(
            getattr(mod.__spec__, "loader", None), importlib.machinery.ExtensionFileLoader
        ):
            out.append(m)  # pragma: no cover: compiled build only (coverage runs pure)
    return tuple(out)
