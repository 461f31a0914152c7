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
import sys
import types
from types import ModuleType

from kvstate.harness import offroot
from kvstate.harness.offroot import off_root

CACHE_MODULES = (
    "sglang.srt.mem_cache.unified_radix_cache",
    "sglang.srt.mem_cache.common",
    "sglang.srt.managers.schedule_batch",
)


class SGLangUnavailable(ImportError):
    """SGLang (or the part of it the target drives) cannot be imported here."""


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
    try:
        with off_root():
            _stub_torchvision()
            return [importlib.import_module(m) for m in (modules or CACHE_MODULES)]
    except ImportError as e:
        raise SGLangUnavailable(f"SGLang is not importable here: {e}") from e


def version() -> str:
    return offroot.version("sglang")
