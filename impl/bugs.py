"""Seeded bugs: test-only switches that plant one known defect at the exact spot it would live.

A checker's power is measured by the bugs it catches.  Each switch below reproduces a bug class
reported against a public engine (README, "Real bug classes"); the conformance fuzzer and the
impl tests must catch every one.  Production code never sets them: a cache is built with ``bugs=()`` unless
a test passes names explicitly or wraps construction in :func:`planted`.

========================== ===========================================================  ==========
name                       what the planted code does                                    bug class
========================== ===========================================================  ==========
evict_ignores_pins         eviction skips the ``unpinned`` guard conjunct: a block a      1
                           validated request holds can be evicted and reallocated
skip_indexer_version       indexer writes (inline and rebuilt) do not stamp the           5
                           compressed-KV version they were built from
swa_offset_by_one_block    the SWA group maps chain block ``b`` to block ``b + 1``:        6
                           the window checked and restored is one block late
tail_splice_off_by_one     the compressor group reads the state saved after block         2 (tail)
                           ``nb`` instead of ``nb - 1`` at a hit boundary
use_before_load_complete   load completion skips the ``complete`` conjunct: a block is    4
                           marked ready before all of its chunks landed
abort_during_load_double_  abort frees the request's blocks whose load is still in       2
free                       flight; the load later writes into / frees them again
========================== ===========================================================  ==========
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterable, Iterator

from .errors import InvalidArgument

BUGS: dict[str, str] = {
    "evict_ignores_pins": "eviction ignores reference counts (TOCTOU: vLLM 33775, SGLang 21406)",
    "skip_indexer_version": "indexer pages are not stamped with the KV version (SGLang 30057)",
    "swa_offset_by_one_block": "SWA window mapped one block late (LMCache 2845, ATOM 1417)",
    "tail_splice_off_by_one": "compressor state read at the wrong boundary (splice discontinuity)",
    "use_before_load_complete": "load completes before its chunks landed (SGLang 22811)",
    "abort_during_load_double_free": "abort frees blocks mid-load (vLLM 32255, 46283, 56089)",
}

_lock = threading.Lock()
_planted: frozenset[str] = frozenset()


def check_names(names: Iterable[str]) -> frozenset[str]:
    """The names as a frozenset; an unknown name raises so a typo cannot plant nothing."""
    out = frozenset(names)
    unknown = sorted(n for n in out if n not in BUGS)
    if unknown:
        raise InvalidArgument(f"unknown seeded bug(s) {unknown}; known: {sorted(BUGS)}")
    return out


def currently_planted() -> frozenset[str]:
    """Bugs planted by an enclosing :func:`planted` block (read once, at cache construction)."""
    return _planted


@contextlib.contextmanager
def planted(*names: str) -> Iterator[frozenset[str]]:
    """Caches *constructed* inside this block carry the named bugs (process-wide, test-only)."""
    global _planted
    add = check_names(names)
    with _lock:
        before = _planted
        _planted = before | add
    try:
        yield add
    finally:
        with _lock:
            _planted = before


class Bugs:
    """The set of bugs one cache carries; ``bugs.on(name)`` sits at the spot of each bug."""

    __slots__ = ("names",)

    def __init__(self, names: Iterable[str] = ()) -> None:
        self.names = check_names(names) | currently_planted()

    def on(self, name: str) -> bool:
        return name in self.names

    def __bool__(self) -> bool:
        return bool(self.names)

    def __repr__(self) -> str:
        return f"Bugs({sorted(self.names)})"


Step = tuple[str, dict[str, int]]


def _build(b: int) -> list[Step]:
    return [
        ("allocate", {"b": b}),
        ("commit", {"b": b}),
        ("seal", {"b": b}),
        ("index_update", {"b": b}),
    ]


_HIT0: list[Step] = [
    *_build(0),
    ("touch", {"b": 0, "t": 1}),
    ("admit", {"r": 0, "t": 1}),
    ("match", {"r": 0, "h": -1}),  # h = one LCM block: filled in by witness()
    ("pin", {"r": 0}),
    ("validate", {"r": 0}),
]
_HOST0: list[Step] = [*_build(0), ("offload", {"b": 0}), ("offload_done", {"b": 0})]

# A short walk per bug (blocks 0..1, request 0) whose last step diverges when the bug is
# planted: usable as warm-up ``seed_traces`` for the conformance fuzzer, and replayed by the
# impl tests.  Steps the model refuses are part of the witness (the target must refuse them too).
WITNESSES: dict[str, list[Step]] = {
    "evict_ignores_pins": [*_HIT0, ("tick", {"t": 2}), ("evict_start", {"b": 0})],
    "skip_indexer_version": _build(0),
    "swa_offset_by_one_block": _HIT0,
    "tail_splice_off_by_one": _HIT0,
    "use_before_load_complete": [*_HOST0, ("load_start", {"b": 0}), ("load_done", {"b": 0})],
    "abort_during_load_double_free": [
        *_HOST0,
        ("admit", {"r": 0, "t": 1}),
        ("match", {"r": 0, "h": -1}),
        ("pin", {"r": 0}),
        ("load_start", {"b": 0}),
        ("abort", {"r": 0}),
        ("load_progress", {"b": 0}),
        ("load_progress", {"b": 0}),
        ("load_done", {"b": 0}),
    ],
}


def witness(name: str, lcm_tokens: int) -> list[Step]:
    """The witness walk of bug ``name`` with hit lengths of one LCM block of ``lcm_tokens``."""
    check_names([name])
    return [
        (a, {k: (lcm_tokens if k == "h" and v == -1 else v) for k, v in p.items()})
        for a, p in WITNESSES[name]
    ]
