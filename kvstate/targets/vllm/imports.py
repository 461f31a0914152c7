"""Importing vLLM from inside this repository, and adapting to its release by signature.

vLLM imports ``transformers``, which imports a top-level package named ``kernels`` (the Hugging
Face kernels hub) when one is importable.  Run from this repository's root (``python -m pytest``,
``python -c``) the working directory is on ``sys.path``, and *our* ``kernels/`` folder would be
found instead: vLLM then runs with the wrong module under that name.  :func:`load` imports vLLM
with every ``sys.path`` entry that resolves to the repository root removed, and drops a
``kernels`` module already imported from it, so the name resolves as it would anywhere else.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from kvstate.harness import offroot
from kvstate.harness.offroot import off_root


class VLLMUnavailable(ImportError):
    """vLLM (or the part of it the target drives) cannot be imported here."""


def load(*modules: str) -> list[ModuleType]:
    """Import ``modules`` (vLLM's) with this repository off ``sys.path``; raise VLLMUnavailable."""
    try:
        with off_root():
            return [importlib.import_module(m) for m in modules]
    except ImportError as e:
        raise VLLMUnavailable(f"vLLM is not importable here: {e}") from e


def version() -> str:
    return offroot.version("vllm")


def call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Call ``fn`` with only the keyword arguments its signature accepts.

    Releases differ in which knobs ``KVCacheManager`` and ``allocate_slots`` take (0.20 has no
    ``scheduler_block_size`` or ``full_sequence_must_fit``); a knob a release lacks is one it
    does not have, so it is dropped rather than special-cased by version number.
    """
    params = inspect.signature(fn).parameters
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return fn(*args, **kwargs)
    return fn(*args, **{k: v for k, v in kwargs.items() if k in params})


def accepts(fn: Callable[..., Any], name: str) -> bool:
    return name in inspect.signature(fn).parameters


def hit_of(result: Any) -> tuple[Any, int]:
    """``get_computed_blocks`` returns (blocks, n) before 0.2x and (blocks, n, boundary) after."""
    return result[0], int(result[1])


# The modules whose code decides what the target checks; their digest names the code that ran.
DRIVEN = (
    "vllm.v1.core.kv_cache_manager",
    "vllm.v1.core.block_pool",
    "vllm.v1.core.kv_cache_coordinator",
    "vllm.v1.core.single_type_kv_cache_manager",
    "vllm.v1.core.kv_cache_utils",
)


def loaded() -> str:
    """The vLLM release whose code runs in this process, read from the loaded modules.

    ``vllm.__version__`` and where the package was imported from, and a digest (sha256, 12 hex
    digits) of the driven modules' source files as loaded (``__spec__.origin`` of each module
    in ``sys.modules``), so two runs name the same code only if they ran the same files.  The
    installed distribution's metadata is named too when it disagrees (a ``PYTHONPATH`` copy
    shadowing the installed release, an edited tree).
    """
    import hashlib

    mods = load("vllm", *DRIVEN)
    pkg = mods[0]
    h = hashlib.sha256()
    for m in mods[1:]:
        origin = getattr(m.__spec__, "origin", None) or getattr(m, "__file__", None)
        try:
            h.update(Path(origin).read_bytes() if origin else b"?")
        except OSError:
            h.update(b"?")
    ver = str(getattr(pkg, "__version__", "unknown"))
    where = Path(getattr(pkg, "__file__", "") or ".").parent
    meta = version()
    also = f", installed metadata says {meta}" if meta != ver else ""
    return f"{ver} (from {where}, kv_cache_manager & co. sha256 {h.hexdigest()[:12]}{also})"
