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
from pathlib import Path
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
    _unregistered_image_processors()


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


def _unregistered_image_processors() -> None:
    """Where transformers (before 5.25) made ``AutoImageProcessor`` a placeholder that raises
    without torchvision, SGLang's multimodal configs fail at import when they register their
    image processors with it (``sglang.srt.configs.utils.register_image_processor``).  That
    module is loaded first, on its own, with the registration skipped when it raises: the
    cache never uses an image processor."""
    import transformers

    name = "sglang.srt.configs.utils"
    if name in sys.modules:
        return
    try:
        transformers.AutoImageProcessor.register  # noqa: B018 - the placeholder raises here
        return
    except ImportError:
        pass
    import sglang.srt

    path = Path(sglang.srt.__path__[0]) / "configs" / "utils.py"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        return
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    register = mod.register_image_processor

    def tolerant(config: object, processor: object) -> None:
        try:
            register(config, processor)
        except ImportError:  # no torchvision: this multimodal processor is not registered
            pass

    mod.register_image_processor = tolerant
    sys.modules[name] = mod


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
