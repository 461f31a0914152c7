"""Importing SGLang's cache from inside this repository, on a machine without a GPU.

Two things stand between ``import sglang.srt.mem_cache...`` and a CPU-only checkout of this
project.  ``transformers`` (which SGLang imports) imports a top-level package named
``kernels`` when one is importable, and run from this repository's root *our* ``kernels/``
folder would be found instead: :func:`load` imports with every ``sys.path`` entry that resolves
to the repository root removed, and drops a ``kernels`` module already imported from it.  And
``sglang.srt.configs`` imports ``torchvision`` at module level for its multimodal configs only;
torchvision's index build pulls a CUDA torch, so it is not installed, and an empty stand-in
module is registered when the real one is missing (the cache never calls it), after
``transformers`` has recorded that torchvision is absent.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import os
import sys
import types
from pathlib import Path
from types import ModuleType

REPO_ROOT = Path(__file__).resolve().parents[3]
CACHE_MODULES = (
    "sglang.srt.mem_cache.unified_radix_cache",
    "sglang.srt.mem_cache.common",
    "sglang.srt.managers.schedule_batch",
)


class SGLangUnavailable(ImportError):
    """SGLang (or the part of it the target drives) cannot be imported here."""


def _shadows(entry: str) -> bool:
    try:
        return Path(entry or os.getcwd()).resolve() == REPO_ROOT
    except OSError:
        return False


def _drop_shadowing_modules() -> None:
    for name in [n for n in sys.modules if n == "kernels" or n.startswith("kernels.")]:
        path = getattr(sys.modules[name], "__file__", None) or ""
        if path and Path(path).resolve().is_relative_to(REPO_ROOT):
            del sys.modules[name]


def _stub_torchvision() -> None:
    """An empty ``torchvision`` (and the submodules SGLang names) when none is installed."""
    if "torchvision" in sys.modules or importlib.util.find_spec("torchvision") is not None:
        return
    # transformers decides once, when first imported, whether torchvision is there: let it
    # decide before the stand-in exists, so that its own image code never uses the stand-in.
    importlib.import_module("transformers.utils.import_utils")
    for name in ("torchvision", "torchvision.transforms", "torchvision.transforms.functional",
                 "torchvision.io", "torchvision.ops"):  # fmt: skip
        mod = types.ModuleType(name)
        mod.__spec__ = importlib.machinery.ModuleSpec(name, None)
        mod.__path__ = []  # a package: its submodules resolve to the stubs above
        mod.__getattr__ = lambda attr, _n=name: _missing(_n, attr)  # type: ignore[attr-defined]
        sys.modules[name] = mod


class _Anything(type):
    """A placeholder class whose every attribute is another placeholder (``T.InterpolationMode
    .NEAREST_EXACT`` as module-level constants read it); never called by the cache."""

    def __getattr__(cls, attr: str) -> object:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Anything(attr, (), {})


def _missing(module: str, attr: str) -> object:
    if attr.startswith("__"):
        raise AttributeError(attr)
    return _Anything(attr, (), {"__module__": module})


def load(*modules: str) -> list[ModuleType]:
    """Import ``modules`` (SGLang's) with this repository off ``sys.path``; raise
    SGLangUnavailable when SGLang or one of its imports is missing."""
    saved = list(sys.path)
    sys.path[:] = [p for p in sys.path if not _shadows(p)]
    _drop_shadowing_modules()
    try:
        _stub_torchvision()
        return [importlib.import_module(m) for m in (modules or CACHE_MODULES)]
    except ImportError as e:
        raise SGLangUnavailable(f"SGLang is not importable here: {e}") from e
    finally:
        sys.path[:] = saved


def version() -> str:
    try:
        from importlib.metadata import version as v

        return v("sglang")
    except Exception:  # noqa: BLE001 - not installed as a distribution
        return "unknown"
