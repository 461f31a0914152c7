"""The registry of ahead-of-time twins: compiled functions that stand in for generated sources.

``kvstate.spec.compile.define`` runs a generated function's source; the implementation's
compiled build carries twins of the sources its default tables generate (``impl/_aot.py``,
written by ``kvstate/buildtools/aotgen.py``).  The registry is the implementation's, not the spec's: this
module installs one hook into ``define`` (:func:`kvstate.spec.compile.set_define_hook`) that
answers with the twin of exactly the asked source, keyed by :func:`source_key` (the SHA-256 of
the source), and records every source asked for inside :func:`recording` (what ``aotgen``
emits).  A changed table, a mutant or another geometry hashes differently and runs its own
source.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from typing import Any

from kvstate.spec.compile import set_define_hook

# ahead-of-time twins of generated functions, by the hash of the exact source they were built
# from (``register_twins``; the compiled build registers impl/_aot.py's)
_TWINS: dict[str, Callable[..., Any]] = {}
# open ``recording()`` blocks: every source ``define`` is asked for, by its hash
_RECORDING: list[dict[str, tuple[str, str, tuple[str, ...]]]] = []


def source_key(src: str) -> str:
    """The key of a generated function's source: its SHA-256, hex."""
    return hashlib.sha256(src.encode()).hexdigest()


def _lookup(name: str, src: str, env: tuple[str, ...]) -> Callable[..., Any] | None:
    """``define``'s hook: record the source, and answer with its twin if one is registered
    (no hashing while there is neither a twin nor a recording)."""
    if not _TWINS and not _RECORDING:
        return None
    key = source_key(src)
    for rec in _RECORDING:
        rec[key] = (name, src, env)
    return _TWINS.get(key)


set_define_hook(_lookup)


def register_twins(twins: Mapping[str, Callable[..., Any]]) -> None:
    """Functions compiled ahead of time from generated sources, keyed by :func:`source_key` of
    the very source each was made from.  ``define`` returns a twin instead of running a source
    only when the source it is asked for hashes to that key: byte for byte the source the twin
    was made from (so a changed table or generator, or a custom table, runs its own source).
    A twin's source must read no name of ``env``: it runs without it."""
    _TWINS.update(twins)


@contextmanager
def using_twins(twins: Mapping[str, Callable[..., Any]]) -> Iterator[None]:
    """The registry is exactly ``twins`` while the block runs, and as before after it: the
    build's other form of the generated sources, for a cache built inside the block (the API
    fuzz builds some examples' caches on it, so that both forms answer under the model's
    eye in either build: kvstate/targets/api/forms.py)."""
    kept = dict(_TWINS)
    _TWINS.clear()
    _TWINS.update(twins)
    set_define_hook(_lookup)  # (the spec's memo of built functions is not served across it)
    try:
        yield
    finally:
        _TWINS.clear()
        _TWINS.update(kept)
        set_define_hook(_lookup)


def suspend_twins() -> AbstractContextManager[None]:
    """Every source ``define`` is asked for while the block runs is run as generated (a test of
    the generated sources themselves; tracebacks into a twin show ``impl/_aot.py``)."""
    return using_twins({})


def shipped_twins() -> dict[str, Callable[..., Any]]:
    """The twins ``impl/_aot.py`` holds (the compiled build registers them at import; the
    pure build runs its sources unless a block of :func:`using_twins` asks for them)."""
    from . import _aot

    return dict(_aot.TWINS)


@contextmanager
def recording() -> Iterator[dict[str, tuple[str, str, tuple[str, ...]]]]:
    """Record every source ``define`` is asked for while the block runs: key -> (name,
    source, the ``env`` names it was given)."""
    out: dict[str, tuple[str, str, tuple[str, ...]]] = {}
    _RECORDING.append(out)
    try:
        yield out
    finally:
        _RECORDING.remove(out)
