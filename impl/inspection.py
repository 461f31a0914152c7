"""What checkers and tests read of a cache, and the seams they inject faults through.

A checker (``kvstate fuzz``, the impl tests) has to see the table's state and the pools behind
it, and a fault-injection test has to break one thing on purpose.  Both used to reach into the
cache's parts (``cache.core.meta``, ``core.disk._pread``), so every change of a part's layout
broke the checkers, and nothing told a reader which of the parts' names were a contract.  This
module is that contract:

* :meth:`HeterogeneousKVCache.inspect` returns a :class:`CacheView`: read-only, live (it reads
  the cache's own state at each access, no copy), with the block metadata as read-only columns
  (:class:`Column`), the request slots, the pools' counts, the disk entries, the pipelines'
  jobs and the CUDA-graph registry.  Hold ``view.lock`` to read several things consistently.
  Containers come back as read-only views (tuples, ``MappingProxyType``, frozen sets); a part
  comes back wrapped (:class:`ReadOnly`): its public data attributes, its read-only methods,
  no setter.
* :meth:`HeterogeneousKVCache.test_hooks` returns :class:`TestHooks`: the one place where a test
  drives a single table action by name (:meth:`TestHooks.act`, dispatched by the core's action
  map), steps a manual pipeline's job, replaces the disk tier's read or write, replaces the
  lock (schedule exploration), damages a host copy, or crashes the cache.  Nothing here is for
  serving: a server never needs it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import torch

from .errors import InvalidArgument, UnknownRequest

if TYPE_CHECKING:
    from .core import CacheCore
    from .pipelines import Executor, Job

__all__ = ["CacheView", "Column", "ReadOnly", "TestHooks"]


def _frozen(v: Any) -> Any:
    """A container read off a part, as a read-only value (a tensor or a scalar as is)."""
    if isinstance(v, list):
        return tuple(v)
    if isinstance(v, dict):
        return MappingProxyType(v)
    if isinstance(v, set):
        return frozenset(v)
    return v


class Column(Sequence[Any]):
    """One metadata column (a table variable or an implementation field, indexed by record
    id), live and read-only: an element that is a list comes back as a tuple."""

    __slots__ = ("_col",)

    def __init__(self, col: list[Any]) -> None:
        self._col = col

    def __getitem__(self, i: Any) -> Any:
        v = self._col[i]
        return tuple(v) if v.__class__ is list else v

    def __len__(self) -> int:
        return len(self._col)

    def __iter__(self) -> Iterator[Any]:
        return iter(self._col)

    def __repr__(self) -> str:
        return f"Column({self._col!r})"


class ReadOnly:
    """A part of the cache seen read-only: its public, non-callable attributes (containers as
    read-only values) and the read-only methods named in ``methods``; no attribute is set."""

    __slots__ = ("_obj", "_methods")

    def __init__(self, obj: Any, methods: frozenset[str] = frozenset()) -> None:
        object.__setattr__(self, "_obj", obj)
        object.__setattr__(self, "_methods", methods)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(f"{name} is not part of the inspection interface")
        v = getattr(self._obj, name)
        if callable(v) and not isinstance(v, torch.Tensor):
            if name in self._methods:
                return v
            raise AttributeError(
                f"{type(self._obj).__name__}.{name} is not a read-only method of the view"
            )
        return _frozen(v)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("an inspection view is read-only")

    def __repr__(self) -> str:
        return f"ReadOnly({self._obj!r})"


class _MetaView(ReadOnly):
    """The block metadata: each column a :class:`Column`."""

    __slots__ = ()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(f"{name} is not part of the inspection interface")
        v = getattr(self._obj, name)
        if v.__class__ is list:
            return Column(v)
        if callable(v):
            raise AttributeError(f"BlockMeta.{name} is not part of the inspection interface")
        return v


_GROUP_READS = frozenset(
    {"host_index", "build", "dev_index", "make_pages", "free_pages", "free_slots", "map", "decode"}
)
_DISK_READS = frozenset(
    {"read_header", "stem", "new_path", "header_mac", "header_name", "chunk_name", "parse"}
)


class _TiersView(ReadOnly):
    """The tiers: pools (``slots``, ``host_slots``, ``swa_pool``: ``n``, ``free``, ``first``),
    the groups (``csa``, ``hca``, ``indexer``, ``swa``, ``compressor``), ``device_block``."""

    __slots__ = ()

    def __getattr__(self, name: str) -> Any:
        if name == "device_block":
            return self._obj.device_block
        v = ReadOnly.__getattr__(self, name) if name != "groups" else self._obj.groups
        if name == "groups":
            return tuple(ReadOnly(g, _GROUP_READS) for g in v)
        if hasattr(v, "layers") or hasattr(v, "free"):  # a group or a pool
            return ReadOnly(v, _GROUP_READS)
        return v


class CacheView:
    """A read-only, live view of one cache's state (:meth:`HeterogeneousKVCache.inspect`).

    ``meta``: the block metadata, one :class:`Column` per variable or field, indexed by record
    id (``view.meta.ckv[rid]``); ``resolve(chain)`` / ``index`` map a chain's keys to record ids.
    ``slots``: the request slots (the table's request variables, ``rids`` the pins).  The
    table's globals: ``now``, ``io_inflight``, ``pinned_blocks``, ``epoch``, ``graph.phase``.
    ``tiers``: pools and groups; ``disk`` and ``disk_entries``: the disk tier; ``lru`` /
    ``host_lru`` / ``disk_lru`` / ``tombstones``: the recency lists; ``jobs()``, ``busy()``:
    the pipelines; ``io_waiting``, ``want_rebuild``, ``want_tail_check``: recovery's queues.
    ``can(action, rid)`` asks the table's guard without acting.
    """

    __slots__ = ("_core",)

    def __init__(self, core: CacheCore) -> None:
        self._core = core

    # ---- configuration ------------------------------------------------------------------
    @property
    def table(self) -> Any:
        return self._core.table

    @property
    def geometry(self) -> Any:
        return self._core.g

    @property
    def consts(self) -> Any:
        return self._core.k

    @property
    def device_blocks(self) -> int:
        return self._core.device_blocks

    @property
    def host_blocks(self) -> int:
        return self._core.host_blocks

    @property
    def writer(self) -> Any:
        return self._core.writer

    @property
    def lock(self) -> Any:
        """The cache's lock: held, several reads see one state."""
        return self._core.lock

    # ---- the table's state --------------------------------------------------------------
    @property
    def meta(self) -> Any:
        return _MetaView(self._core.meta)

    @property
    def index(self) -> MappingProxyType[bytes, int]:
        return MappingProxyType(self._core.store.index)

    def resolve(self, chain: Any) -> list[int]:
        """The record ids of a chain's blocks (0, the null record, for an unknown key)."""
        return self._core.store.resolve(chain)

    @property
    def slots(self) -> tuple[ReadOnly, ...]:
        return tuple(ReadOnly(s) for s in self._core.requests.slots)

    @property
    def now(self) -> int:
        return self._core.gate.now

    @property
    def io_inflight(self) -> int:
        return self._core.gate.io_inflight

    @property
    def pinned_blocks(self) -> int:
        return self._core.gate.pinned_blocks

    @property
    def epoch(self) -> int:
        return self._core.gate.epoch

    @property
    def graph(self) -> ReadOnly:
        return ReadOnly(self._core.graph)

    def chain_view(self, rids: Sequence[int]) -> Any:
        """The records ``rids`` as one chain in the table's state shape (what the guards and
        hit rules read: ``hit_rule.rule_holds(rule, view, ...)``); hold ``lock`` while reading."""
        return self._core.gate.chain_view(rids)

    @property
    def rule_reads(self) -> Any:
        """The variables the hit rules read (an action writing one moves ``epoch``)."""
        return self._core.gate.rule_reads

    @property
    def hit_search(self) -> Any:
        """The generated longest-hit search this cache runs (its direct form): a twin compiled
        ahead of time (``impl/_aot.py``) for a preset geometry, its own source otherwise."""
        return self._core.gate.coord.search_direct

    def can(self, action: Any, rid: Any) -> bool:
        """Would the table's guard allow the block action now (nothing changes)."""
        return self._core.can(action, rid)

    def refused(self, action: Any, rid: Any) -> list[str]:
        """The conjuncts of the block action's guard that are false now, in the table's order
        (none: :meth:`can` is True); nothing changes."""
        self._core.can(action, rid)  # the arguments checked first (InvalidArgument)
        with self._core.lock:
            return self._core.gate.refused(action, int(rid))

    def stats(self) -> dict[str, Any]:
        return self._core.stats()

    # ---- pools, recency, tiers ----------------------------------------------------------
    @property
    def tiers(self) -> Any:
        return _TiersView(self._core.tiers)

    @property
    def lru(self) -> tuple[int, ...]:
        return tuple(self._core.store.lru)

    @property
    def tombstones(self) -> tuple[int, ...]:
        return tuple(self._core.store.tombstones)

    @property
    def host_lru(self) -> tuple[int, ...]:
        return tuple(self._core.recovery.host_lru)

    @property
    def disk_lru(self) -> tuple[int, ...]:
        return tuple(self._core.recovery.disk_lru)

    @property
    def disk_entries(self) -> MappingProxyType[int, Any]:
        return MappingProxyType(self._core.recovery.disk_entries)

    @property
    def disk(self) -> ReadOnly:
        return ReadOnly(self._core.disk, _DISK_READS)

    # ---- pipelines and recovery ---------------------------------------------------------
    def jobs(self) -> list[tuple[str, Any]]:
        """Every pipeline job now, as (executor name, job), executors in order cpu, io, dma."""
        return [(e.name, j) for e in self._core.pipes.all for j in list(e.jobs.values())]

    def job(self, executor: str, key: int) -> Any:
        """The job of ``executor`` ("cpu", "io", "dma") under ``key`` (a record id), or None."""
        return self._executor(executor).get(key)

    def _executor(self, name: str) -> Executor:
        return {e.name: e for e in self._core.pipes.all}[name]

    def load_job(self, rid: int) -> Any:
        """The load job of a record (on the DMA or the I/O pipeline), or None."""
        return self._core.recovery.load_job(rid)

    def pending(self) -> dict[str, list[int]]:
        return {e.name: e.pending() for e in self._core.pipes.all}

    def busy(self) -> bool:
        return self._core.pipes.busy()

    def pipeline_errors(self) -> list[str]:
        return self._core.pipes.errors()

    @property
    def pipeline_mode(self) -> str:
        return self._core.pipes.mode

    @property
    def io_waiting(self) -> tuple[int, ...]:
        return tuple(self._core.recovery.io_waiting)

    @property
    def want_rebuild(self) -> frozenset[int]:
        return frozenset(self._core.recovery.want_rebuild)

    @property
    def want_tail_check(self) -> frozenset[int]:
        return frozenset(self._core.recovery.want_tail_check)


class TestHooks:
    """Seams for tests and checkers (:meth:`HeterogeneousKVCache.test_hooks`); never needed to
    serve.  Each one is where a fault-injection test breaks one thing on purpose."""

    __test__ = False  # not a pytest class
    __slots__ = ("_core", "_finish_unlocked")

    def __init__(self, core: CacheCore, finish_unlocked: Callable[[Any, bool], None]) -> None:
        self._core = core
        self._finish_unlocked = finish_unlocked

    def act(self, action: str, *args: Any) -> Any:
        """One table action by name, with its arguments (a record id for a block action, a
        slot for a request action, ticks for ``tick``), dispatched by the core's action map;
        :class:`~kvstate.impl.errors.Refused` when the guard refuses.  ``admit`` takes one of
        this cache's requests (another's, or anything else, is refused as ``admit`` refuses it)."""
        if action == "admit" and args:
            self._own(args[0])
        return self._core.act(action, *args)

    def _own(self, request: Any) -> None:
        """A request of this cache, not forgotten (the errors ``admit`` raises otherwise)."""
        cache: Any = getattr(request, "cache", None)
        if getattr(cache, "core", None) is None or not hasattr(request, "owned"):
            raise InvalidArgument(f"expected a Request, got {type(request).__name__}")
        if cache.core is not self._core or not request.owned:
            raise UnknownRequest(f"{request!r} does not belong to this cache")

    def register(self, chain: Any) -> list[int]:
        """Records for every block of a chain (created FREE where unknown)."""
        return self._core.store.register(chain)

    def record(self, key: bytes, tokens: Any, start: int) -> int:
        return self._core.store.record(key, tokens, start)

    def store_run(self, blocks: Sequence[tuple[bytes, Any, int]], ticks: int, end: int = -1) -> int:
        return self._core.store.store_run(blocks, ticks, end)

    def check_tail(self, rid: Any, boundary: Any) -> bool:
        return self._core.check_tail(rid, boundary)

    def inject_load_fault(self, rid: Any) -> None:
        """The next step of this block's load fails as an I/O error would."""
        self._core.recovery.inject_load_fault(self._core.rid(rid))

    def step_job(self, executor: str, job: Job) -> bool:
        """One step of ``job`` on a manual pipeline (True: it is over); a job that raises is
        abandoned (its record back to a consistent phase) and the error re-raised."""
        return CacheView(self._core)._executor(executor).step_job(job)

    def drain(self) -> int:
        """Manual pipelines: every job run to its end; the steps taken."""
        return self._core.pipes.drain()

    def replace_disk_read(self, fn: Callable[..., int] | None) -> Callable[..., int]:
        """Every disk read goes through ``DiskTier.pread(fd, buf, offset, need)``; ``fn``
        replaces it (a failing, short or slow read; None: the tier's own again); the one
        replaced is returned (call it to read for real)."""
        return self.replace_disk_method("pread", fn)

    def replace_disk_write(self, fn: Callable[..., Any] | None) -> Callable[..., Any]:
        """Every disk write goes through ``DiskTier.prepare``; ``fn`` replaces it (a full disk,
        a failing write; None: the tier's own again); the one replaced is returned."""
        return self.replace_disk_method("prepare", fn)

    def replace_disk_method(self, name: str, fn: Callable[..., Any] | None) -> Callable[..., Any]:
        """A public method of the disk tier replaced (``pread``, ``prepare``, ``reap``,
        ``delete``...) by ``fn``, or put back (None); the one replaced is returned."""
        if name.startswith("_") or not callable(getattr(type(self._core.disk), name, None)):
            raise AttributeError(f"{name} is not a public method of the disk tier")
        disk = self._core.disk
        old: Callable[..., Any] = getattr(disk, name)
        if fn is None:
            disk.__dict__.pop(name, None)
        else:
            setattr(disk, name, fn)
        return old

    def set_lock(self, lock: Any, changed: Any) -> None:
        """Every part's lock and the change condition replaced (a recording lock, a scheduled
        one); set before any other thread uses the cache."""
        core = self._core
        core.lock = lock
        core.changed = changed

    def set_pipeline_mode(self, mode: str) -> None:
        """ "threads" or "manual" for every executor; workers are started by ``start_workers``."""
        pipes = self._core.pipes
        pipes.mode = mode
        for e in pipes.all:
            e.mode = mode

    def hand_over_workers(self, make_queue: Callable[[], Any]) -> list[tuple[str, Any]]:
        """Threaded pipelines over queues ``make_queue()`` makes (a scheduled queue), whose
        worker loops the caller runs on threads of its own: (thread name, loop) per worker,
        executors in order cpu, io, dma."""
        pipes = self._core.pipes
        pipes.mode = "threads"
        return [w for e in pipes.all for w in e.hand_over(make_queue())]

    def host_copy(self, group: str, rid: int) -> torch.Tensor:
        """The host copy of a block's pages in ``group`` ("compressor", "csa", ...), writable:
        host memory has no checksum, so a test damages it here."""
        core = self._core
        grp = {g.name: g for g in core.tiers.groups}[group]
        hslot = core.meta.hslot[rid]
        if hslot < 0:
            raise ValueError(f"record {rid} has no host copy")
        return grp.host_data[:, grp.host_index(hslot)]

    def poke(  # pragma: no cover: a test hook (tests plant faults)
        self, column: str, rid: int, value: Any
    ) -> None:
        """One metadata field set directly, no guard, no effect, no lock taken (a test places
        a block at an address, or changes a field behind the lock, to see what the checks say;
        hold ``lock`` around it for a change inside one)."""
        getattr(self._core.meta, column)[rid] = value

    def leak_device_slot(self) -> None:  # pragma: no cover: a test hook (tests plant faults)
        """One device slot taken that no block holds (what a leak looks like to a check)."""
        with self._core.lock:
            self._core.tiers.slots.take(999, -1)

    def device_data(  # pragma: no cover: a test hook (tests plant faults)
        self, group: str
    ) -> torch.Tensor:
        """A group's device pages (``[layers, pages, bytes]``), writable: a test overwrites
        stored bytes behind the cache to see the byte checks catch it."""
        return {g.name: g for g in self._core.tiers.groups}[group].device_data

    def want_rebuild(self, rid: int) -> None:  # pragma: no cover: a test hook (tests plant faults)
        """Mark a block as waiting for an indexer rebuild after its load (no load need be
        running: what a lost follow-up looks like to a check)."""
        with self._core.lock:
            self._core.recovery.want_rebuild.add(rid)

    def finish_unlocked(  # pragma: no cover: a test hook (tests plant faults)
        self, request: Any, store: bool = True
    ) -> None:
        """``finish``'s body run without the cache's lock: a planted race, for the tests of
        the schedule explorer that must find it."""
        self._finish_unlocked(request, store)

    def graph_refill(  # pragma: no cover: a test hook (tests plant faults)
        self, row: int, slots: list[int], ptrs: list[int]
    ) -> None:
        """One row of the CUDA-graph block table refilled directly (its bound checks)."""
        with self._core.lock:
            self._core.graph.refill(row, slots, ptrs)

    def poke_graph(  # pragma: no cover: a test hook (tests plant faults)
        self, field: str, value: Any
    ) -> None:
        """One field of the CUDA-graph registry set directly (``phase``), no guard, no lock: a
        test plants a fault to see what the checks say."""
        if field.startswith("_") or not hasattr(self._core.graph, field):
            raise AttributeError(f"{field} is not a field of the graph registry")
        setattr(self._core.graph, field, value)

    def graph_set_function(self, fn: Callable[[], Any]) -> None:
        """The function a CUDA-graph replay runs (what a capture recorded), replaced by ``fn``:
        a checker records what each replay reads."""
        with self._core.lock:
            self._core.graph.set_function(fn)

    def graph_moved(  # pragma: no cover: a test hook (tests plant faults)
        self, rid: int, old: int, new: int
    ) -> bool:
        """Tell the CUDA-graph registry that a block moved from address ``old`` to ``new``
        (True: a captured graph recorded it and went stale)."""
        return self._core.graph.moved(rid, old, new)

    def fail_load(  # pragma: no cover: a test hook (tests plant faults)
        self, rid: int, job: Any, why: str, corrupt: bool = False
    ) -> None:
        """A load job's failure delivered now (as a late I/O error would), once no chunk is
        being copied into its slot without the lock."""
        with self._core.lock:
            self._core.recovery.await_landing(rid)
            self._core.recovery.fail_load(rid, job, why, corrupt=corrupt)

    def crash(self) -> None:
        """The process dies: its pipelines stop and the kernel drops the directory's lock;
        nothing is cleaned up (open the directory again to see what a restart finds)."""
        self._core.pipes.stop()
        self._core.disk.close()
