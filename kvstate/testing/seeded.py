"""Seeded bugs: six known defects, each planted by a source edit in a staged copy of ``impl/``.

A checker's power is measured by the bugs it catches.  Each bug below reproduces a bug class
reported against a public engine (docs/fuzz.md, "Real bug classes"); the conformance fuzzer and the
impl tests must catch every one.  The allocator users import carries none of them, not even a
switch: a bug is an exact edit of ``impl/``'s sources (``Edit(path, old, new)``, the form of
:mod:`kvstate.api_mutants`), and a cache with bugs planted comes from a staged copy of the
package with those edits applied (:func:`cache`, :func:`package`).

================================ ========================================================  ==========
name                             what the planted code does                                bug class
================================ ========================================================  ==========
``evict_ignores_pins``           eviction skips the ``unpinned`` guard conjunct: a block a  1
                                 validated request holds can be evicted and reallocated
``skip_indexer_version``         indexer writes (inline and rebuilt) do not stamp the      5
                                 compressed-KV version they were built from
``swa_offset_by_one_block``      the SWA group maps chain block ``b`` to block ``b + 1``:   6
                                 the window checked and restored is one block late
``tail_splice_off_by_one``       the compressor group reads the state saved after block    2 (tail)
                                 ``nb`` instead of ``nb - 1`` at a hit boundary
``use_before_load_complete``     load completion skips the ``complete`` conjunct: a block  4
                                 is marked ready before all of its chunks landed
``abort_during_load_double_``    abort frees the request's blocks whose load is still in   2
``free``                         flight; the load later writes into / frees them again
================================ ========================================================  ==========

The staged package (one per bug set per process, cached) is a sibling of ``kvstate.impl``
named ``kvstate._seeded_<names>``, its ``__path__`` a temporary folder of patched sources:

* Only the edited modules and the ``impl/`` modules that import them (directly or not, type-only
  imports included) are staged.  They are **plain Python even when ``kvstate.impl`` runs
  compiled** (mypyc): a seeded cache is slower than the production one, and its tracebacks show
  the patched source.
* Every other module of the staged package *is* the real one (the same module object, under the
  staged name too), so the error classes (``pytest.raises(Refused)``, ``isinstance``),
  ``EventKind``, ``Chain``, the writers and the coordinator's results are the real classes, and a
  compiled module never meets an object of a staged class it was compiled against.
* ``impl/`` imports its own modules relatively and the other packages absolutely
  (``kvstate.spec``, ``kvstate.kernels``): the staged copy resolves those to the real packages.
  An absolute ``kvstate.impl`` import in a staged module is rewritten to the staged name.

The production path never imports this module (``tests/test_import_layers.py``).
"""

from __future__ import annotations

import ast
import atexit
import importlib.util
import os
import re
import shutil
import sys
import tempfile
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, cast

import kvstate.impl
from kvstate.impl.cache import HeterogeneousKVCache
from kvstate.impl.errors import InvalidArgument

IMPL = "kvstate.impl"
PREFIX = "kvstate._seeded_"


@dataclass(frozen=True)
class Edit:
    """One exact replacement: ``old`` must occur exactly once in ``path`` (relative to the
    repository root, under ``impl/``) when the edit is applied."""

    path: str
    old: str
    new: str


@dataclass(frozen=True)
class Seeded:
    name: str
    bug_class: str  # the number in docs/fuzz.md's "Real bug classes"
    engines: str  # the public engines' reports of the class
    does: str  # what the planted code does
    edits: tuple[Edit, ...]

    @property
    def summary(self) -> str:
        return f"{self.does} ({self.engines})"


_BLOCKS = "impl/blocks.py"
_RECOVERY = "impl/recovery.py"
_REQUESTS = "impl/requests.py"
_GATE = "impl/gate.py"
_GROUPS = "impl/groups.py"


def _late_map(why: str) -> str:
    """A group's ``map`` that reads block ``b``'s pages from the record of ``b + 1``."""
    return (
        "\n    remaps = True  # seeded bug: map() is not the identity\n\n"
        "    def map(self, rids: Sequence[int]) -> Sequence[int]:\n"
        f"        from .meta import NULL_RID  # seeded bug: {why}\n\n"
        "        return list(rids[1:]) + [NULL_RID]\n"
    )


SEEDED: tuple[Seeded, ...] = (
    Seeded(
        "evict_ignores_pins",
        "1",
        "TOCTOU: vLLM 33775, SGLang 21406",
        "eviction ignores reference counts: a block a validated request holds can be evicted",
        (
            Edit(
                _BLOCKS,
                "            try:  # the head of the LRU is usually evictable: its guard is evaluated once\n"
                '                gate.check_block("evict_start", rid)\n',
                "            try:  # the head of the LRU is usually evictable: its guard is evaluated once\n"
                '                gate.check_block("evict_start", rid, ("unpinned",))  # seeded bug\n',
            ),
            Edit(
                _BLOCKS,
                "        if len(victims) < count or run is None or run(",
                "        # seeded bug: the run test would check the pins, so the victims go one by one\n"
                "        if len(victims) < count or run is None or True or run(",
            ),
            Edit(
                _BLOCKS,
                '            self.gate.check_block("evict_start", rid)\n            self.fx_evict_start(rid)\n',
                '            self.gate.check_block("evict_start", rid, ("unpinned",))  # seeded bug\n'
                "            self.fx_evict_start(rid)\n",
            ),
        ),
    ),
    Seeded(
        "skip_indexer_version",
        "5",
        "SGLang 30057",
        "indexer pages are not stamped with the compressed-KV version they were built from",
        (
            Edit(
                _BLOCKS,
                "        m.idx[rid] = IDX_PRESENT\n        m.iver[rid] = m.ver[rid]\n",
                "        m.idx[rid] = IDX_PRESENT  # seeded bug: the version stamp is skipped\n",
            ),
        ),
    ),
    Seeded(
        "swa_offset_by_one_block",
        "6",
        "LMCache 2845, ATOM 1417",
        "the SWA window is mapped one block late",
        (
            Edit(
                _GROUPS,
                '    state_var = "swa"\n    NULL_PAGE = 0\n',
                '    state_var = "swa"\n    NULL_PAGE = 0\n'
                + _late_map("the window's block table starts one block late"),
            ),
        ),
    ),
    Seeded(
        "tail_splice_off_by_one",
        "2 (tail)",
        "splice discontinuity",
        "the compressor state is read at the wrong boundary",
        (
            Edit(
                _GROUPS,
                '    state_var = "tail"\n',
                '    state_var = "tail"\n'
                + _late_map("the state of boundary nb is read for nb - 1"),
            ),
        ),
    ),
    Seeded(
        "use_before_load_complete",
        "4",
        "SGLang 22811",
        "a load completes before its chunks landed",
        (
            Edit(
                _RECOVERY,
                '            self.gate.check_block("load_done", rid)\n',
                '            self.gate.check_block("load_done", rid, ("complete",))  # seeded bug\n',
            ),
            Edit(
                _GATE,
                '            return self.guards.allows(action, state, {"b": b})\n',
                "            return self.guards.allows(  # seeded bug\n"
                '                action, state, {"b": b}, ("complete",) if action == "load_done" else ()\n'
                "            )\n",
            ),
        ),
    ),
    Seeded(
        "abort_during_load_double_free",
        "2",
        "vLLM 32255, 46283, 56089",
        "abort frees the request's blocks whose load is still in flight",
        (
            Edit(
                _REQUESTS,
                '            gate.guard("abort", gate.req_state("abort", s, ()), {"r": 0}, exc=exc)\n',
                '            gate.guard("abort", gate.req_state("abort", s, ()), {"r": 0}, exc=exc)\n'
                "            # seeded bug: the request's blocks still being loaded are freed with it\n"
                "            from kvstate.spec.phases import CKV\n\n"
                "            for rid in s.rids:\n"
                "                if self.meta.ckv[rid] == CKV.LOADING:\n"
                "                    self.tiers.slots.release(self.recovery.load_job(rid).dst)\n"
                "                    self.store.freed(rid)\n",
            ),
        ),
    ),
)

BY_NAME: dict[str, Seeded] = {s.name: s for s in SEEDED}
# name -> one line (what it does, the engines' reports): the menu ``kvstate fuzz --bug`` offers
BUGS: dict[str, str] = {s.name: s.summary for s in SEEDED}


class SeededEditError(RuntimeError):
    """A seeded edit no longer applies: its ``old`` text moved or changed in ``impl/``."""


def check_names(names: Iterable[str]) -> frozenset[str]:
    """The names as a frozenset; an unknown name raises so a typo cannot plant nothing."""
    if isinstance(names, str) or not all(isinstance(n, str) for n in names):
        raise InvalidArgument(f"bugs must be a collection of bug names, got {names!r}")
    out = frozenset(names)
    unknown = sorted(n for n in out if n not in BY_NAME)
    if unknown:
        raise InvalidArgument(f"unknown seeded bug(s) {unknown}; known: {sorted(BY_NAME)}")
    return out


# ---- staging ----------------------------------------------------------------------------------
def impl_dir() -> Path:
    """The folder the real ``kvstate.impl`` is imported from (its sources are the base)."""
    return Path(kvstate.impl.__file__).resolve().parent


def patched_sources(names: Iterable[str], root: Path | None = None) -> dict[str, str]:
    """module -> patched source of every ``impl/`` module a bug set edits (the bugs' edits in
    name order, each checked to apply exactly once)."""
    folder = impl_dir() if root is None else root
    out: dict[str, str] = {}
    for name in sorted(check_names(names)):
        for e in BY_NAME[name].edits:
            top, _, rest = e.path.partition("/")
            if top != "impl" or "/" in rest or not rest.endswith(".py"):
                raise SeededEditError(f"seeded bug {name}: {e.path} is not a module of impl/")
            mod = rest[:-3]
            src = out.get(mod)
            if src is None:
                src = (folder / rest).read_text()
            n = src.count(e.old)
            if n != 1:
                raise SeededEditError(
                    f"seeded bug {name}: its edit's old text occurs {n} times in {e.path} "
                    f"(it must occur once; move the edit to where the code now lives): {e.old!r}"
                )
            out[mod] = src.replace(e.old, e.new)
    return out


def _imports(src: str) -> set[str]:
    """The ``impl`` modules a source imports (anywhere: functions and type-only imports too)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, ast.ImportFrom):
            if node.level == 1:
                if node.module:
                    out.add(node.module.split(".")[0])
                else:
                    out.update(a.name for a in node.names)
            elif node.level == 0 and node.module is not None:
                if node.module == IMPL:
                    out.update(a.name for a in node.names)
                elif node.module.startswith(IMPL + "."):
                    out.add(node.module[len(IMPL) + 1 :].split(".")[0])
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith(IMPL + "."):
                    out.add(a.name[len(IMPL) + 1 :].split(".")[0])
    return out


def staged_modules(edited: Iterable[str], root: Path | None = None) -> frozenset[str]:
    """The edited modules and every ``impl/`` module that imports one of them (transitively):
    those must be re-executed to see the edits; the package's ``__init__`` always is."""
    folder = impl_dir() if root is None else root
    deps = {p.stem: _imports(p.read_text()) for p in folder.glob("*.py")}
    out = set(edited) | {"__init__"}
    grew = True
    while grew:
        grew = False
        for mod, uses in deps.items():
            if mod not in out and uses & out:
                out.add(mod)
                grew = True
    return frozenset(out)


_ABSOLUTE = re.compile(r"^(\s*(?:from|import)\s+)kvstate\.impl\b", re.MULTILINE)


def _rewrite(src: str, package: str) -> str:
    """Absolute imports of ``kvstate.impl`` name the staged package instead."""
    return _ABSOLUTE.sub(lambda m: m.group(1) + package, src)


def package_name(names: frozenset[str]) -> str:
    return PREFIX + "__".join(sorted(names))


_lock = threading.Lock()
_packages: dict[frozenset[str], ModuleType] = {}
_folders: list[str] = []
_owner = os.getpid()


def _cleanup() -> None:
    if os.getpid() == _owner:  # not in a forked child: the parent still runs the sources
        for folder in _folders:
            shutil.rmtree(folder, ignore_errors=True)


atexit.register(_cleanup)


def package(bugs: Iterable[str]) -> ModuleType:
    """The staged package with ``bugs`` planted (built once per bug set per process).  With no
    bug it is ``kvstate.impl`` itself."""
    names = check_names(bugs)
    if not names:
        return kvstate.impl
    with _lock:
        pkg = _packages.get(names)
        if pkg is None:
            pkg = _stage(names)
            _packages[names] = pkg
        return pkg


def _stage(names: frozenset[str]) -> ModuleType:
    src = impl_dir()
    patched = patched_sources(names, src)
    staged = staged_modules(patched, src)
    name = package_name(names)
    folder = Path(tempfile.mkdtemp(prefix="kvstate-seeded-"))
    _folders.append(str(folder))
    for mod in sorted(staged):
        text = patched.get(mod)
        if text is None:
            text = (src / f"{mod}.py").read_text()
        (folder / f"{mod}.py").write_text(_rewrite(text, name))
    spec = importlib.util.spec_from_file_location(
        name, folder / "__init__.py", submodule_search_locations=[str(folder)]
    )
    if spec is None or spec.loader is None:  # pragma: no cover - a file location always loads
        raise SeededEditError(f"cannot stage {name}")
    pkg = importlib.util.module_from_spec(spec)
    shared = sorted(p.stem for p in src.glob("*.py") if p.stem not in staged)
    sys.modules[name] = pkg
    try:
        for mod in shared:  # the real module object, under the staged name too
            real = importlib.import_module(f"{IMPL}.{mod}")
            sys.modules[f"{name}.{mod}"] = real
            setattr(pkg, mod, real)
        spec.loader.exec_module(pkg)
    except BaseException:
        for key in [k for k in sys.modules if k == name or k.startswith(name + ".")]:
            del sys.modules[key]
        raise
    setattr(sys.modules["kvstate"], name.rpartition(".")[2], pkg)
    return pkg


# ---- what tests and the fuzzer build ----------------------------------------------------------
def cache(geometry: Any = None, *, bugs: Iterable[str], **kwargs: Any) -> HeterogeneousKVCache:
    """A :class:`~kvstate.impl.HeterogeneousKVCache` with ``bugs`` planted (the arguments are the
    constructor's, but ``writer`` is the test content the checks recompute,
    ``DeterministicWriter``, unless given).  Its class is the staged package's (plain Python),
    not ``kvstate.impl``'s, unless ``bugs`` is empty."""
    pkg = package(bugs)
    kwargs.setdefault("writer", pkg.DeterministicWriter())
    return cast(HeterogeneousKVCache, pkg.HeterogeneousKVCache(geometry, **kwargs))


def module(bugs: Iterable[str], name: str) -> ModuleType:
    """One module of the staged package (``module(bugs, "core").CacheCore``)."""
    pkg = package(bugs)
    return importlib.import_module(f"{pkg.__name__}.{name}")


# ---- witnesses --------------------------------------------------------------------------------
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
