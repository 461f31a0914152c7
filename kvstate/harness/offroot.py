"""Imports of an engine (vLLM, SGLang) with this repository off ``sys.path``.

Run from the repository root, its folders shadow packages of the same name an engine imports
(``kernels/`` shadows Hugging Face's ``kernels``, which ``transformers`` imports): while an
engine's modules load, the root is off ``sys.path`` and a ``kernels`` module loaded from it is
dropped from ``sys.modules``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def _shadows(entry: str) -> bool:
    try:
        return Path(entry or os.getcwd()).resolve() == REPO_ROOT
    except OSError:
        return False


@contextmanager
def off_root() -> Iterator[None]:
    """The block runs with the repository off ``sys.path`` (restored after)."""
    saved = list(sys.path)
    sys.path[:] = [p for p in sys.path if not _shadows(p)]
    for name in [n for n in sys.modules if n == "kernels" or n.startswith("kernels.")]:
        path = getattr(sys.modules[name], "__file__", None) or ""
        if path and Path(path).resolve().is_relative_to(REPO_ROOT):
            del sys.modules[name]
    try:
        yield
    finally:
        sys.path[:] = saved


def version(distribution: str) -> str:
    """The installed release of ``distribution``, or ``unknown``."""
    try:
        from importlib.metadata import version as v

        return v(distribution)
    except Exception:  # noqa: BLE001 - not installed as a distribution
        return "unknown"
