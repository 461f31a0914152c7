"""The allocator state machine: one method per transition of the table, on real storage.

Every method follows the same shape, under one re-entrant lock:

1. validate the arguments (:class:`InvalidArgument` for malformed input);
2. evaluate the table's guard conjuncts for the action on a view of this cache's own metadata
   (:class:`Refused` naming the false conjuncts; nothing has changed yet);
3. acquire what the action needs (slots, pages; possibly by evicting or spilling *other*
   blocks, each its own guarded transition), refusing with :class:`OutOfCapacity` if impossible;
4. move the data and apply the action's effects.

The effects are this implementation's own code (storage, pools, pipelines); only the guards and
the hit rules are read from the table, so the model and the implementation are two readings of
one contract and the conformance harness compares them.  Block actions take a record id
(``rid``); request actions take a request slot.  :mod:`kvstate.impl.cache` builds the user API
(admission, ``use``, decode) on top of these transitions.
"""

from __future__ import annotations

import tempfile
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from kvstate.kernels import KernelError
from kvstate.spec.compile import compile_hit_rule
from kvstate.spec.phases import CKV, Fmt, Indexer, Pipe, Req, Swa, Tail
from kvstate.spec.table import Table

from .args import MAX_COUNT
from .args import integer as _int
from .coordinator import Coordinator, HitSearch, RecoveryStep
from .disk import DiskEntry, DiskTier
from .errors import (
    AlreadyReleased,
    CorruptEntry,
    DiskWriteError,
    InternalError,
    InvalidArgument,
    LayoutError,
    OutOfCapacity,
    Refused,
    UnknownRequest,
)
from .events import EventKind, EventLog
from .graphs import GraphRegistry
from .guards import Guards
from .hashing import Chain
from .meta import NULL_RID, BlockMeta, ChainView, Others, RecordState, SlotState
from .pipelines import LoadJob, OffloadJob, Pipelines, RebuildJob, TailCheckJob
from .testdata import Writer
from .tiers import Tiers, planned_bytes


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _why(exc: BaseException) -> str:
    return str(exc) if isinstance(exc, CorruptEntry) else f"{type(exc).__name__}: {exc}"


# phases as plain ints (the metadata and slots hold ints; int(IntEnum) is a call)
_CKV_FREE, _CKV_WRITING, _CKV_READY, _CKV_EVICTING = (
    int(CKV.FREE), int(CKV.WRITING), int(CKV.READY), int(CKV.EVICTING),
)  # fmt: skip
_CKV_LOADING, _CKV_OFFLOADING = int(CKV.LOADING), int(CKV.OFFLOADING)
_TAIL_NONE, _TAIL_OPEN, _TAIL_SEALED = int(Tail.NONE), int(Tail.OPEN), int(Tail.SEALED)
_SWA_NULL, _SWA_VALID = int(Swa.NULL), int(Swa.VALID)
_IDX_ABSENT, _IDX_PRESENT = int(Indexer.ABSENT), int(Indexer.PRESENT)
# the conjunct of ``load_start`` that is the admission cap on disk loads (named, not restated):
# a load it alone refuses is queued in ``io_waiting`` instead of dropped
IO_CAP = "io_cap"
_IDLE, _WAITING, _MATCHED, _PINNED, _VALIDATED, _USING = (
    int(Req.IDLE), int(Req.WAITING), int(Req.MATCHED), int(Req.PINNED), int(Req.VALIDATED),
    int(Req.USING),
)  # fmt: skip


class Slot:
    """One request slot: the table's per-request variables, and the request occupying it."""

    __slots__ = (
        "index", "phase", "hit", "pinned", "deadline", "pgen", "paddr", "request", "rids", "state",
    )  # fmt: skip

    def __init__(self, index: int) -> None:
        self.index = index
        self.phase = int(Req.IDLE)
        self.hit = 0
        self.pinned = 0
        self.deadline = 0
        self.pgen: tuple[int, ...] = ()
        self.paddr: tuple[int, ...] = ()
        self.request: Any = None  # the Request in this slot (None when free)
        self.rids: list[int] = []  # records this slot pins, in chain order
        self.state = SlotState(self)  # this request alone, for guards of "slot" locality


class CacheCore:
    def __init__(
        self,
        table: Table,
        *,
        device_blocks: int | None = None,
        host_blocks: int | None = None,
        disk_blocks: int | None = None,
        device: torch.device | str | None = None,
        cache_dir: str | Path | None = None,
        mode: str = "threads",
        max_requests: int | None = None,
        writer: Writer | None = None,
        kernel_backend: str | None = None,
        memory_limit: int = 8 * 2**30,
        durable: bool = False,
        derive_index: bool | None = None,
        max_model_len: int = 1 << 20,
        disk_key: bytes | None = None,
    ) -> None:
        g = table.geometry
        self.table = table
        self.g = g
        self.k = table.consts
        self.L = self.k.L
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = torch.device(device)
        self.backend = (
            kernel_backend
            if kernel_backend is not None
            else (None if self.device.type == "cuda" else "torch")
        )
        caps = {
            "device_blocks": g.device_blocks if device_blocks is None else device_blocks,
            "host_blocks": g.host_blocks if host_blocks is None else host_blocks,
            "disk_blocks": g.disk_blocks if disk_blocks is None else disk_blocks,
            "max_requests": g.max_requests if max_requests is None else max_requests,
        }
        for name, v in caps.items():
            _int(name, v, 1, 1 << 30)
        self.device_blocks = caps["device_blocks"]
        self.host_blocks = caps["host_blocks"]
        self.disk_blocks = caps["disk_blocks"]
        self.writer = writer
        # the write path derives the indexer pages from the compressed entries when this cache
        # writes the block's content (a writer); with ``writer=None`` the engine's kernels write
        # every group's pages, the indexer's included, and ``index_update`` only stamps the
        # version.  Recovery (a rebuild after a disk load) always derives them.
        self.derive_index = writer is not None if derive_index is None else bool(derive_index)
        self.meta = BlockMeta(self.k.load_steps)
        self.meta.check_columns(table)
        # the CUDA-graph block table (int32 slots + int64 state pointers per entry, a device
        # copy on CUDA) is as much a part of the footprint as the tiers: count it in the limit
        graph_blocks = _cdiv(_int("max_model_len", max_model_len, 1), self.L)
        graph_bytes = (
            caps["max_requests"] * graph_blocks * 12 * (2 if self.device.type == "cuda" else 1)
        )
        dev_b, host_b = planned_bytes(g, self.device_blocks, self.host_blocks)
        if dev_b + host_b <= memory_limit < dev_b + host_b + graph_bytes:  # (else Tiers says)
            raise LayoutError(
                f"{caps['max_requests']} requests x {graph_blocks} blocks of CUDA-graph block "
                f"table need {graph_bytes / 2**30:.1f} GiB beside {(dev_b + host_b) / 2**30:.1f} "
                f"GiB of tiers (> memory_limit {memory_limit / 2**30:.1f} GiB); lower "
                "max_requests or max_model_len, or raise memory_limit"
            )
        self.tiers = Tiers(
            g,
            device_slots=self.device_blocks,
            host_slots=self.host_blocks,
            device=self.device,
            hit_rule=table.hit_rule,
            memory_limit=memory_limit,
            backend=self.backend,
        )
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        if cache_dir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="kvstate-disk-")
            cache_dir = self._tmp.name
        swa = self.tiers.swa
        self.disk = DiskTier(
            cache_dir,
            self._fingerprint(),
            self.k.load_steps,
            durable=durable,
            key=disk_key,
            layout=[
                (grp.name, li, self.tiers.unit_bytes((grp, li)))
                for grp, li in self.tiers.units(False)
            ],
            swa_bytes=swa.nl * swa.pages_per_block * swa.page_bytes,
        )
        self.events = EventLog()
        self.lock = threading.RLock()
        self.changed = threading.Condition(self.lock)
        self.waiters = 0  # threads in ``wait_changed``: only they need a notification
        self.pipes = Pipelines(mode, self.k.io_cap)
        self.slots = [Slot(i) for i in range(caps["max_requests"])]
        # a graph's block table holds any request's pins whole: a request is at most
        # max_model_len tokens long (vLLM sizes its block table the same way)
        self.graph = GraphRegistry(
            self.meta,
            caps["max_requests"],
            graph_blocks,
            self.device,
        )
        self.index: dict[bytes, int] = {}
        self.lru: OrderedDict[int, None] = OrderedDict()  # READY on device, least recent first
        self.host_lru: OrderedDict[int, None] = OrderedDict()
        self.disk_lru: OrderedDict[int, None] = OrderedDict()
        self.tombstones: OrderedDict[int, None] = OrderedDict()  # FREE records still indexed
        self.disk_entries: dict[int, DiskEntry] = {}
        self.want_rebuild: set[int] = set()  # start an indexer rebuild when this load lands
        self.want_tail_check: dict[
            int, TailCheckJob
        ] = {}  # verify the restored tail when this load lands
        self.io_waiting: OrderedDict[int, None] = OrderedDict()  # disk loads queued by io_cap
        self.now = 0
        self.io_inflight = 0
        self.pinned_blocks = 0
        self.vk = replace(self.k, R=2)  # views: the acting request + the aggregate of the others
        # the SWA and compressor groups read their state through their own block mapping (the
        # identity unless a seeded bug's edit shifts it: only non-identity mappings are applied)
        self._maps: dict[str, Any] = {
            grp.state_var: grp.map for grp in (self.tiers.swa, self.tiers.compressor) if grp.remaps
        }
        mapped = frozenset(self._maps)
        self.guards = Guards(table, self.vk, mapped)
        # guards that read a block only at its own parameter (or nothing but globals) evaluate on
        # the record-indexed metadata; those that read only the acting request, on its slot
        self._actions = frozenset(a.name for a in table.actions)
        self._records = RecordState(self.meta, self)
        self._by_record = frozenset(
            a for a, kind in self.guards.locality.items() if kind in ("block", "global")
        )
        self._by_slot = frozenset(a for a, kind in self.guards.locality.items() if kind == "slot")
        self._accept, self._accept_direct = self.guards.accept_tests()
        # block guards that one call checks for a whole run of blocks (a store, an eviction)
        self._run_tests: dict[str, Any] = {}
        for a in self._by_record:
            run = self.guards.run_test(a)
            if run is not None:
                self._run_tests[a] = run
        compiled = compile_hit_rule(table.hit_rule, table, self.vk, mapped)
        self.coord = Coordinator(table.hit_rule, compiled)
        # rule epoch: bumped by every transition whose frame meets what the hit rules read (off
        # their Z3 terms), so a hit search is still a proof of the rules while it has not moved
        reads = compiled.reads
        self.rule_reads = reads
        self.epoch = 0
        self._neutral = frozenset(
            a.name for a in table.actions if reads is not None and not (a.modifies & reads)
        )
        qualnames = {r.qualname for r in table.hit_rule.rules}
        self._rule_conjuncts = (
            frozenset(c.name for c in table.action("validate").guard if c.name in qualnames)
            if self.guards.has("validate")
            else frozenset()
        )
        self._others: dict[int, Others] = {}
        # validate under a search's proof evaluates only its non-rule conjuncts: on the slot
        # alone when those read nothing but the request (the default table: its phase)
        self._validate_rest_by_slot = (
            self.guards.locality_without("validate", self._rule_conjuncts) == "slot"
        )
        # ... and that remainder as one compiled accept test (None: evaluated conjunct-wise)
        self._validate_rest = (
            self.guards.fused_without("validate", self._rule_conjuncts)
            if self._validate_rest_by_slot
            else None
        )
        self.max_records = 4 * (self.device_blocks + self.host_blocks + self.disk_blocks) + 64
        self._scan_disk()
        self.pipes.start()

    def close(self) -> None:
        self.pipes.stop()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def wait_changed(self, ready: Callable[[], bool], timeout: float | None) -> bool:
        """Wait (the lock held) until ``ready()``, woken by every state change; False on timeout."""
        self.waiters += 1
        try:
            return self.changed.wait_for(ready, timeout)
        finally:
            self.waiters -= 1

    def notify_changed(self) -> None:
        """A state change (the lock held) some waiter may be waiting for; free when none waits
        (every request's release comes here)."""
        if self.waiters:
            self.changed.notify_all()

    def _fingerprint(self) -> dict[str, Any]:
        g = self.g
        return {
            "geometry": g.name,
            "layers": list(g.layers),
            "L": self.L,
            "entry_bytes": g.entry_bytes,
            "pages": [g.page_bytes(g.csa_ratio), g.page_bytes(g.hca_ratio)],
            "compressed_block_tokens": g.compressed_block_tokens,
            "swa_block_tokens": g.swa_block_tokens,
            "head_dim": g.head_dim,
            "csa_ratio": g.csa_ratio,
            "load_steps": self.k.load_steps,
        }

    # ---- views and guards ---------------------------------------------------------------
    def block_view(self, rid: int) -> ChainView:
        return ChainView(
            self.meta,
            (rid,),
            self.vk,
            now=self.now,
            graph=self.graph.phase,
            io_inflight=self.io_inflight,
        )

    def chain_view(
        self, rids: Sequence[int], slot: Slot | None = None, overrides: dict[str, Any] | None = None
    ) -> ChainView:
        """A request's chain as the table sees it; the SWA and compressor groups supply their own
        columns (their block mapping), ``overrides`` a projected state."""
        reqs: tuple[Any, ...] = ()
        if slot is not None:
            others = self.pinned_blocks - (-(-slot.pinned // self.L))
            agg = self._others.get(others)
            if agg is None:  # read-only aggregates, one per value
                agg = self._others[others] = Others(self.L * others)
            reqs = (slot, agg)
        return ChainView(
            self.meta,
            rids,
            self.vk,
            now=self.now,
            graph=self.graph.phase,
            io_inflight=self.io_inflight,
            reqs=reqs,
            overrides=overrides,
            maps=self._maps,
        )

    def _guard(
        self,
        action: str,
        view: Any,  # a ChainView, or the RecordState / SlotState of a local guard
        params: dict[str, int],
        skip: Sequence[str] = (),
        exc: type[Refused] = Refused,
    ) -> None:
        """Refuse unless the table's guard holds; the caller then performs the transition.
        The accept path is one call of the action's fused guard (the form that reads ``view``);
        the conjuncts are evaluated one by one only to name a refusal, or under ``skip``."""
        ok = None if skip else (self._accept_direct if view._direct else self._accept).get(action)
        if ok is None or not ok(view, params):
            self.guards.check(action, view, params, skip, exc)
        self._admitted(action, 1)

    def _admitted(self, action: str, n: int) -> None:
        """The one place the rule epoch moves: ``n`` transitions of ``action`` passed their
        guard.  Unless the action's frame misses every variable the hit rules read
        (``_neutral``), a search made before it is no longer a proof of the rules."""
        if action not in self._neutral:
            self.epoch += n

    def _block_state(self, action: str, rid: Any) -> tuple[Any, int]:
        """The state a block action's guard reads, and the value of its block parameter."""
        if action in self._by_record:
            return self._records, rid
        return self.block_view(rid), 0

    def _global_state(self, action: str) -> Any:
        return self._records if action in self._by_record else self.block_view(NULL_RID)

    def _check_block(self, action: str, rid: Any, skip: Sequence[str] = (), **params: int) -> None:
        if rid.__class__ is not int or not 0 < rid < len(self.meta.ckv):
            self._rid(rid)  # raises InvalidArgument (an int subclass is checked there too)
        if not skip and action in self._by_record:  # the common case, inline
            params["b"] = rid
            if self._accept[action](self._records, params):
                self._admitted(action, 1)
                return
        state, b = self._block_state(action, rid)
        params["b"] = b
        self._guard(action, state, params, skip)

    def _check_run(self, action: str, rids: Sequence[int], **params: int) -> None:
        """The guard of a block action for every block of ``rids``, before any of them moves:
        one call of the table's guard over the run where that equals a check per block
        (:meth:`Guards.run_test`), else a check per block.  A refusal is named by the per-block
        check of the first refused block (nothing has moved yet)."""
        run = self._run_tests.get(action)
        if run is None:
            for rid in rids:
                self._check_block(action, rid, (), **params)
            return
        params["b"] = NULL_RID
        bad = run(self._records, params, rids)
        if bad >= 0:
            self._check_block(action, rids[bad], (), **params)  # raises, naming the conjuncts
            raise InternalError(f"{action}: the run check and the block check disagree")
        self._admitted(action, len(rids))

    def can(self, action: Any, rid: Any) -> bool:
        """Would the block action be allowed now (jobs ask this to choose their next step)."""
        if not isinstance(action, str) or action not in self._actions:
            raise InvalidArgument(f"no block action {action!r}")
        if rid.__class__ is not int or not 0 <= rid < len(self.meta):  # 0: the null record
            raise InvalidArgument(f"no block record {rid!r}")
        with self.lock:
            state, b = self._block_state(action, rid)
            return self.guards.allows(action, state, {"b": b})

    def _rid(self, rid: Any) -> int:
        if rid.__class__ is not int or not 0 < rid < len(self.meta):
            raise InvalidArgument(f"no block record {rid!r}")
        return rid

    def _slot(self, slot: Any) -> Slot:
        if isinstance(slot, Slot):
            return slot
        if not isinstance(slot, int) or isinstance(slot, bool) or not 0 <= slot < len(self.slots):
            raise UnknownRequest(f"no request slot {slot!r} (slots 0..{len(self.slots) - 1})")
        return self.slots[slot]

    # ---- records ----------------------------------------------------------------------------
    def record(self, key: bytes, tokens: np.ndarray | None, start: int) -> int:
        """The record of a block key (a FREE one is created for an unknown key)."""
        rid = self.index.get(key)
        if rid is None:
            self._purge_tombstones()
            rid = self.meta.new(key, tokens, start)
            self.index[key] = rid
            self.tombstones[rid] = None
        elif tokens is not None:
            self.meta.tokens[rid] = tokens
            self.meta.start[rid] = start
        return rid

    def register(self, chain: Chain) -> list[int]:
        """Records for every block of ``chain``, each with a preferred device slot reserved, so
        their device addresses are distinct and stable from the start."""
        with self.lock:
            rids = []
            for k, key in enumerate(chain.keys):
                rid = self.record(key, chain.block_tokens_of(k), k * self.L)
                if self.meta.addr[rid] < 0:
                    home = self.tiers.slots.claim_free(rid)
                    self.meta.addr[rid] = home
                    self.meta.gaddr[rid] = home
                rids.append(rid)
            return rids

    def resolve(self, chain: Chain) -> list[int]:
        get = self.index.get
        return [get(k, NULL_RID) for k in chain.keys]

    def _purge_tombstones(self) -> None:
        while len(self.index) >= self.max_records and self.tombstones:
            rid, _ = self.tombstones.popitem(last=False)
            key = self.meta.key[rid]
            if key is not None:
                self.index.pop(key, None)
            self.tiers.slots.unclaim(self.meta.addr[rid], rid)
            self.meta.addr[rid] = -1
            self.meta.gaddr[rid] = -1
            self.meta.retire(rid)

    def _scan_disk(self) -> None:
        """Adopt the entries a previous process left in the cache directory (valid ones only)."""
        good, bad = self.disk.scan()
        for path, why in bad:
            self.events.emit(EventKind.REMOVED, None, "disk", f"rejected {path.name}: {why}")
        m = self.meta
        for e in good[: self.disk_blocks]:
            rid = self.record(e.key, None, -1)
            self.tombstones.pop(rid, None)
            m.ckv[rid], m.ver[rid], m.gen[rid] = int(CKV.DISK), e.ver, e.gen
            m.fmt[rid] = m.disk_fmt[rid] = e.fmt
            m.tail[rid], m.swa[rid], m.idx[rid] = e.tail, e.swa, _IDX_ABSENT
            m.on_disk[rid] = True
            self.disk_entries[rid] = e
            self.disk_lru[rid] = None
        for e in good[self.disk_blocks :]:
            self.disk.delete(e)

    # ---- capacity -------------------------------------------------------------------------
    def _take_slot(self, rid: int, prefer: int) -> int:
        slot = self.tiers.slots.take(rid, prefer)
        while slot < 0:
            if not self._evict_one():
                raise OutOfCapacity(
                    "allocate", (), f"all {self.device_blocks} device slots are pinned or leased"
                )
            slot = self.tiers.slots.take(rid, prefer)
        return slot

    def _take_swa(self) -> list[int]:
        n = self.tiers.swa_pages_per_block
        pages = self.tiers.swa_pool.take(n)
        while pages is None:
            if not self._evict_one():
                raise OutOfCapacity("allocate", (), "no free SWA pages and nothing evictable")
            pages = self.tiers.swa_pool.take(n)
        return pages

    def _evict_one(self) -> bool:
        """Evict the least recently used block the table allows to be evicted: evict_start then
        evict_done, each its guard and then its effects (the lock is held)."""
        for rid in self.lru:
            try:  # the head of the LRU is usually evictable: its guard is evaluated once
                self._check_block("evict_start", rid)
            except Refused:
                continue
            self._fx_evict_start(rid)
            self._check_block("evict_done", rid)
            self._fx_evict_done(rid)
            return True
        return False

    def _evict_run(self, count: int) -> None:
        """Evict ``count`` blocks at once (fewer if fewer are evictable): the LRU's first
        ``count`` blocks when the table lets every one of them go (one evict_start check over
        them, their effects, one evict_done check, its effects); otherwise one by one."""
        if count <= 0:
            return
        lru = self.lru
        victims = [rid for rid, _ in zip(lru, range(count), strict=False)]
        run = self._run_tests.get("evict_start")
        if len(victims) < count or run is None or run(self._records, {"b": NULL_RID}, victims) >= 0:
            for _ in range(count):
                if not self._evict_one():
                    return
            return
        self._admitted("evict_start", count)
        for rid in victims:
            self._fx_evict_start(rid)
        self._check_run("evict_done", victims)
        for rid in victims:
            self._fx_evict_done(rid)

    def _take_host(self) -> int:
        got = self.tiers.host_slots.take(1)
        while got is None:
            victim = next((r for r in self.host_lru if self.can("spill", r)), None)
            if victim is None:
                raise OutOfCapacity("offload", (), f"all {self.host_blocks} host slots are busy")
            self.spill(victim)
            got = self.tiers.host_slots.take(1)
        return got[0]

    def _make_disk_room(self) -> None:
        while len(self.disk_entries) >= self.disk_blocks:
            victim = next((r for r in self.disk_lru if self.can("drop", r)), None)
            if victim is None:
                raise OutOfCapacity("spill", (), f"all {self.disk_blocks} disk entries are in use")
            self.drop(victim)

    def _free_device(self, rid: int) -> None:
        m = self.meta
        if m.slot[rid] >= 0:
            self.tiers.slots.release(m.slot[rid])
            m.slot[rid] = -1
        if m.swa_pages[rid]:
            self.tiers.swa_pool.release(m.swa_pages[rid])
            m.swa_pages[rid] = ()

    def _moved(self, rid: int, new: int) -> None:
        """The record's state buffer is now at device slot ``new`` (a graph may go stale)."""
        m = self.meta
        old = m.addr[rid]
        if new != old:
            if old >= 0:
                self.tiers.slots.unclaim(old, rid)
            if self.graph.moved(rid, old, new):
                self.events.emit(
                    EventKind.STALE_GRAPH, m.key[rid], "device", f"slot {old} -> {new}"
                )
            m.addr[rid] = new

    def _freed(self, rid: int) -> None:
        """Common effects of a block becoming FREE."""
        m = self.meta
        m.ckv[rid] = _CKV_FREE
        m.tail[rid] = _TAIL_NONE
        m.swa[rid] = _SWA_NULL
        m.idx[rid] = _IDX_ABSENT
        self.lru.pop(rid, None)
        self.tombstones[rid] = None

    # ---- Compressed KV: write path ----------------------------------------------------------
    @property
    def write_fmt(self) -> int:
        """The stored form (``Fmt``) of the blocks the writer produces (read at each store: a
        writer may change it)."""
        return int(getattr(self.writer, "fmt", Fmt.PRIMARY))

    def allocate(self, rid: Any) -> int:
        """Take a device slot for the block's new content; returns the stored form (``Fmt``)
        the writer produces, which the kernel-ABI rule later checks."""
        with self.lock:
            fmt = self.write_fmt
            self._check_block("allocate", rid, f=fmt)
            return self._fx_allocate(rid, fmt)

    def _fx_allocate(self, rid: int, fmt: int) -> int:
        """Effects: a device slot and SWA pages (evicting the LRU blocks the table lets go)."""
        m = self.meta
        slot = self._take_slot(rid, m.addr[rid])
        try:
            pages = self._take_swa()
        except OutOfCapacity:
            self.tiers.slots.release(slot)
            raise
        self._moved(rid, slot)
        m.slot[rid], m.swa_pages[rid] = slot, tuple(pages)
        m.ckv[rid] = _CKV_WRITING
        m.gen[rid] += 1
        m.tail[rid] = _TAIL_OPEN
        m.swa[rid] = _SWA_NULL
        m.idx[rid] = _IDX_ABSENT
        m.fmt[rid] = fmt
        self.tombstones.pop(rid, None)
        return fmt

    def store_run(self, blocks: Sequence[tuple[bytes, np.ndarray | None, int]], ticks: int) -> int:
        """Store a run of a chain's blocks, ``(key, tokens, start)`` each, skipping those already
        cached (dedup); returns how many were stored.  The caller holds the lock.

        The table's write path for each block is allocate, commit, seal, index_update and touch
        (and, to make room, evict_start and evict_done of other blocks).  Each of these guards
        reads a block only at its own block, and each transition writes only its own block, so
        every block's sequence is independent of the others': here each action's guard is
        checked once over the whole run and then its effects applied to every block, in table
        order.  The eviction of the blocks to make room happens up front, the least recently
        used first, as the allocations one by one would have chosen them (the run's own blocks
        are never candidates: WRITING is not evictable).  Where capacity runs out, the first
        blocks of the run are stored and the rest left to be recomputed."""
        m = self.meta
        todo: list[int] = []
        for key, tokens, start in blocks:
            rid = self.record(key, tokens, start)
            if m.ckv[rid] == _CKV_FREE and rid not in todo[-1:]:
                todo.append(rid)
                self.tombstones.pop(rid, None)  # not purged by a later record() of the run
        if not todo:
            return 0
        fmt = self.write_fmt
        self._check_run("allocate", todo, f=fmt)
        self._evict_run(len(todo) - self.tiers.slots.free)
        got = 0
        for rid in todo:
            try:
                self._fx_allocate(rid, fmt)
            except OutOfCapacity:
                break  # the rest is recomputed next time; the cache is full of pinned blocks
            got += 1
        for rid in todo[got:]:
            self.tombstones[rid] = None
        todo = todo[:got]
        done = 0
        try:
            self._check_run("commit", todo)
            for rid in todo:
                self._fx_commit(rid)
                done += 1
        except Exception:
            for rid in todo[done:]:
                self.discard(rid)
            self._seal_run(todo[:done], ticks)
            raise
        self._seal_run(todo, ticks)
        return len(todo)

    def _seal_run(self, rids: list[int], ticks: int) -> None:
        """seal, index_update and touch of committed blocks: each guard once over the run."""
        self._check_run("seal", rids)
        for rid in rids:
            self._fx_seal(rid)
        self._check_run("index_update", rids)
        if self.derive_index:
            self.tiers.build_index_run([self.meta.slot[rid] for rid in rids])
        for rid in rids:
            self._stamp_index(rid, False)
        self._check_run("touch", rids, t=ticks)
        lease, until = self.meta.lease, self.now + ticks
        for rid in rids:
            if lease[rid] < until:
                lease[rid] = until

    def commit(self, rid: Any) -> None:
        with self.lock:
            self._check_block("commit", rid)
            self._fx_commit(rid)

    def _fx_commit(self, rid: int) -> None:
        """Effects (the caller holds the lock and has checked the guard)."""
        m = self.meta
        if self.writer is not None:
            tokens = m.tokens[rid]
            if tokens is None or len(tokens) != self.L:
                raise InvalidArgument(f"record {rid} has no token block to write")
            self.tiers.write_block(m.slot[rid], m.swa_pages[rid], m.start[rid], tokens, self.writer)
        m.ckv[rid] = _CKV_READY
        m.ver[rid] += 1
        m.swa[rid] = _SWA_VALID
        self.lru[rid] = None
        self.events.emit(EventKind.STORED, m.key[rid], "device")

    def discard(self, rid: Any) -> None:
        with self.lock:
            self._check_block("discard", rid)
            m = self.meta
            self._free_device(rid)
            m.ckv[rid] = _CKV_FREE
            m.tail[rid] = _TAIL_NONE
            self.tombstones[rid] = None

    def seal(self, rid: Any) -> None:
        with self.lock:
            self._check_block("seal", rid)
            self._fx_seal(rid)

    def _fx_seal(self, rid: int) -> None:
        """Effects (the caller holds the lock and has checked the guard)."""
        m = self.meta
        if self.writer is not None:
            tokens = m.tokens[rid]
            if tokens is None:
                raise InvalidArgument(f"record {rid} has no token block to write")
            try:
                self.tiers.write_tail(m.slot[rid], m.start[rid], tokens, self.writer, self.backend)
            except KernelError as exc:
                raise InternalError(
                    f"compressor state at block {rid} does not splice: {exc}"
                ) from exc
        m.tail[rid] = _TAIL_SEALED
        m.ver[rid] += 1  # the tail's rows became compressed entries: the indexer must follow

    def slide(self, rid: Any) -> None:
        with self.lock:
            self._check_block("slide", rid)
            m = self.meta
            if m.swa_pages[rid]:
                self.tiers.swa_pool.release(m.swa_pages[rid])
                m.swa_pages[rid] = ()
            job = self.pipes.dma.get(rid) or self.pipes.io.get(rid)
            if isinstance(job, LoadJob) and job.swa_pages:
                self.tiers.swa_pool.release(job.swa_pages)
                job.swa_pages = ()
            m.swa[rid] = _SWA_NULL

    # ---- Indexer State ----------------------------------------------------------------------
    def _stamp_index(self, rid: int, build: bool = True) -> None:
        m = self.meta
        if build:
            self.tiers.build_index(m.slot[rid])
        m.idx[rid] = _IDX_PRESENT
        m.iver[rid] = m.ver[rid]

    def index_update(self, rid: Any) -> None:
        with self.lock:
            self._check_block("index_update", rid)
            self._stamp_index(rid, self.derive_index)

    def rebuild_start(self, rid: Any) -> None:
        with self.lock:
            self._check_block("rebuild_start", rid)
            m = self.meta
            m.idx[rid] = int(Indexer.REBUILDING)
            m.ixpipe[rid] = int(Pipe.CPU)
            self.pipes.cpu.submit(RebuildJob(self, rid))

    def rebuild_done(self, rid: Any) -> None:
        with self.lock:
            self._check_block("rebuild_done", rid)
            m = self.meta
            self._stamp_index(rid)
            m.ixpipe[rid] = int(Pipe.NONE)
            self.pipes.cpu.forget(rid)
            self.notify_changed()

    # ---- offload: device -> host -> disk ----------------------------------------------------
    def offload(self, rid: Any) -> None:
        with self.lock:
            self._check_block("offload", rid)
            m = self.meta
            hslot = self._take_host()
            m.hslot[rid] = hslot
            m.ckv[rid] = int(CKV.OFFLOADING)
            m.ldpipe[rid] = int(Pipe.DMA)
            self.lru.pop(rid, None)
            self.pipes.dma.submit(OffloadJob(self, rid, hslot))

    def offload_done(self, rid: Any) -> None:
        with self.lock:
            self._check_block("offload_done", rid)
            m = self.meta
            pages = m.swa_pages[rid] if m.swa[rid] == Swa.VALID else ()
            self.tiers.to_host(m.slot[rid], pages, m.hslot[rid])
            self._free_device(rid)
            m.ckv[rid] = int(CKV.HOST)
            m.ldpipe[rid] = int(Pipe.NONE)
            self.host_lru[rid] = None
            self.pipes.dma.forget(rid)
            self.events.emit(EventKind.EVICTED, m.key[rid], "device", "offloaded to host")
            self.events.emit(EventKind.STORED, m.key[rid], "host")
            self.notify_changed()

    def offload_cancel(self, rid: Any) -> None:
        with self.lock:
            self._check_block("offload_cancel", rid)
            self._fx_offload_cancel(rid)

    def _fx_offload_cancel(self, rid: int) -> None:
        m = self.meta
        self.tiers.host_slots.release([m.hslot[rid]])
        m.hslot[rid] = -1
        m.ckv[rid] = _CKV_READY
        m.ldpipe[rid] = int(Pipe.NONE)
        self.lru[rid] = None
        self.pipes.dma.forget(rid)
        self.notify_changed()

    def spill(self, rid: Any) -> None:
        """The table's ``spill`` in one step, the file written under the lock (the conformance
        adapter and ``_take_host``); :meth:`spill_some` writes without it."""
        with self.lock:
            self._check_block("spill", rid)
            self._make_disk_room()
            snap = self._spill_snapshot(rid)
            self._fx_spill(rid, self.disk.write(snap[0], **snap[1]))

    def _spill_snapshot(self, rid: int) -> tuple[bytes, dict[str, Any], tuple[int, ...]]:
        """What a spill writes (copies of the host pages), and the record's state it was taken
        at: (key, the entry's fields, (gen, ver, hslot, ckv))."""
        m = self.meta
        key = m.key[rid]
        if key is None:
            raise InternalError(f"record {rid} has no key to name its disk entry")
        with_swa = m.swa[rid] == Swa.VALID and self.k.swa_restored_from_disk
        units, swa = self.tiers.host_payload(m.hslot[rid], with_swa)
        fields: dict[str, Any] = {
            "ver": m.ver[rid],
            "gen": m.gen[rid],
            "fmt": m.fmt[rid],
            "tail": m.tail[rid],
            "swa": m.swa[rid],
            "units": units,
            "swa_data": swa,
        }
        return key, fields, self._spill_state(rid)

    def _spill_state(self, rid: int) -> tuple[int, ...]:
        m = self.meta
        return (m.gen[rid], m.ver[rid], m.hslot[rid], m.ckv[rid], m.swa[rid])

    def offload_some(self, n: int) -> int:
        """Start offloading up to ``n`` LRU device blocks whose lease expired to host."""
        done = 0
        with self.lock:
            for rid in list(self.lru):
                if done >= n:
                    break
                if (
                    self.meta.lease[rid] <= self.now
                    and self.can("offload", rid)
                    and self.tiers.host_slots.free
                ):
                    self.offload(rid)
                    done += 1
        return done

    def drop_some(self, n: int) -> int:
        """Delete up to ``n`` LRU (or corrupt) disk, then host, entries the table lets go."""
        done = 0
        with self.lock:
            for rid in [*list(self.disk_lru), *list(self.host_lru)]:
                if done >= n:
                    break
                if self.can("drop", rid):
                    self.drop(rid)
                    done += 1
        return done

    def stats(self) -> dict[str, Any]:
        with self.lock:
            counts = {p.name.lower(): 0 for p in CKV}
            for rid in self.index.values():
                counts[CKV(self.meta.ckv[rid]).name.lower()] += 1
            return {
                "blocks": counts,
                "device_free": self.tiers.slots.free,
                "host_free": self.tiers.host_slots.free,
                "disk_entries": len(self.disk_entries),
                "pinned_blocks": self.pinned_blocks,
                "io_inflight": self.io_inflight,
                "graph": self.graph.phase,
                "now": self.now,
            }

    def spill_some(self, n: int) -> int:
        """Spill up to ``n`` LRU host blocks, each file written *without* the lock (a slow disk
        blocks no other work): the payload is copied under the lock, written to a private
        temporary, and published only if the block is still the same host copy (generation,
        version, host slot, phase) and the table still allows the spill; else discarded."""
        done = 0
        tried: set[int] = set()
        while done < n:
            snap = self._next_spill(tried)
            if snap is None:
                break
            rid, key, fields, state = snap
            try:
                prepared = self.disk.prepare(key, **fields)  # the write: no lock held
            except OSError as exc:  # a full disk: the temporary is gone, nothing published
                if done:
                    return done
                err = DiskWriteError(f"spill of record {rid}: {exc}")
                err.__cause__ = exc  # set by hand: compiled code drops `raise ... from`
                raise err from exc
            done += self._publish_spill(rid, key, state, prepared)
        return done

    def _next_spill(
        self, tried: set[int]
    ) -> tuple[int, bytes, dict[str, Any], tuple[int, ...]] | None:
        """The next LRU host block the table lets spill, and its snapshot (under the lock)."""
        with self.lock:
            rid = next((r for r in self.host_lru if r not in tried and self.can("spill", r)), None)
            if rid is None:
                return None
            tried.add(rid)
            key, fields, state = self._spill_snapshot(rid)
            return rid, key, fields, state

    def _publish_spill(
        self, rid: int, key: bytes, state: tuple[int, ...], prepared: tuple[Path, DiskEntry]
    ) -> int:
        """Publish a spill written without the lock if its block is still the same host copy
        and the table still allows it (1); else throw the file away (0)."""
        with self.lock:
            still = self.meta.key[rid] == key and self._spill_state(rid) == state
            if still:
                try:
                    self._check_block("spill", rid)
                    self._make_disk_room()
                except Refused:
                    still = False
            if not still:
                self.disk.discard(prepared)
                return 0
            self._fx_spill(rid, self.disk.publish(prepared))
            return 1

    def _fx_spill(self, rid: int, entry: DiskEntry) -> None:
        m = self.meta
        self.tiers.host_slots.release([m.hslot[rid]])
        m.hslot[rid] = -1
        m.ckv[rid] = int(CKV.DISK)
        m.on_disk[rid] = True
        m.disk_fmt[rid] = m.fmt[rid]
        self.disk_entries[rid] = entry
        self.host_lru.pop(rid, None)
        self.disk_lru[rid] = None
        self.events.emit(EventKind.STORED, entry.key, "disk")

    # ---- recovery: loads --------------------------------------------------------------------
    def load_start(self, rid: Any) -> None:
        with self.lock:
            self._check_block("load_start", rid)
            m = self.meta
            from_disk = m.ckv[rid] == CKV.DISK
            src: Any
            if from_disk:
                src = self.disk_entries.get(rid)
                if src is None:
                    raise InternalError(f"record {rid} is on disk without an entry")
            else:
                src = m.hslot[rid]
            restore_swa = m.swa[rid] == Swa.VALID and (
                not from_disk or self.k.swa_restored_from_disk
            )
            dst = self._take_slot(rid, -1)
            swa_pages: tuple[int, ...] = ()
            if restore_swa:
                try:
                    swa_pages = tuple(self._take_swa())
                except OutOfCapacity:
                    self.tiers.slots.release(dst)
                    raise
            pipe = Pipe.IO if from_disk else Pipe.DMA
            m.ckv[rid] = int(CKV.LOADING)
            m.ldpipe[rid] = int(pipe)
            m.prog[rid] = 0
            self.io_inflight += int(from_disk)
            (self.disk_lru if from_disk else self.host_lru).pop(rid, None)
            self.io_waiting.pop(rid, None)
            self.pipes.for_pipe(pipe).submit(LoadJob(self, rid, pipe, dst, src, swa_pages))

    def _load_job(self, rid: int) -> LoadJob:
        job = self.pipes.io.get(rid) or self.pipes.dma.get(rid)
        if not isinstance(job, LoadJob):
            raise InternalError(f"record {rid} is LOADING without a load job")
        return job

    def _chunk(self, job: LoadJob, k: int, data: torch.Tensor | None) -> None:
        """Land chunk ``k`` of the load (``data``: its bytes, already read and authenticated
        without the lock; else a disk source is read here)."""
        if job.fault:
            job.fault = False
            raise CorruptEntry(f"injected I/O fault while loading record {job.rid}")
        if job.pipe is Pipe.IO:
            entry: DiskEntry = job.src
            ulo, uhi = entry.chunks[k][0], entry.chunks[k][1]
            if data is None:
                data = self.disk.read_chunk(entry, k)
            self.tiers.land_bytes(self.tiers.units(False)[ulo:uhi], data, job.dst)
        else:
            units = self.tiers.units(True)
            n = len(units)
            chunk = units[k * n // self.k.load_steps : (k + 1) * n // self.k.load_steps]
            self.tiers.land_host(chunk, job.src, job.dst)

    def load_progress(self, rid: Any, data: torch.Tensor | None = None) -> None:
        with self.lock:
            self._check_block("load_progress", rid)
            job = self._load_job(rid)
            try:
                self._chunk(job, self.meta.prog[rid], data)
            except Exception as exc:  # any failure is a failed load: nothing stays LOADING
                self._fail_load(rid, job, _why(exc), corrupt=True)
                if isinstance(exc, CorruptEntry):
                    raise
                raise CorruptEntry(f"loading record {rid}: {_why(exc)}") from exc
            self.meta.prog[rid] += 1

    def owns(self, job: LoadJob) -> bool:
        """Is ``job`` still the load of its record (the lock held)?"""
        rid = job.rid
        return self.meta.ckv[rid] == _CKV_LOADING and self.pipes.for_pipe(job.pipe).get(rid) is job

    def disk_load_step(self, job: LoadJob) -> bool:
        """One step of a disk load, its read and verification *without* the lock (a stalled
        disk blocks nothing else): decide under the lock, read, then land the bytes only if the
        job still owns its record at the same progress.  True when the job is over."""
        rid = job.rid
        with self.lock:
            if not self.owns(job):
                return True
            entry: DiskEntry = job.src
            if self.can("load_done", rid):
                if not job.swa_pages or job.swa_data is not None or job.fault:
                    self.load_done(rid)
                    return True
                k = -1  # the window's section, read before load_done
            elif job.fault:
                self.load_progress(rid)  # fails the load (CorruptEntry)
                return False
            else:
                k = self.meta.prog[rid]
        try:
            data = self.disk.read_swa(entry) if k < 0 else self.disk.read_chunk(entry, k)
        except Exception as exc:
            with self.lock:
                if self.owns(job):
                    self._fail_load(rid, job, _why(exc), corrupt=True)
            return True
        with self.lock:
            if not self.owns(job):
                return True
            if k < 0:
                job.swa_data = data
            elif self.meta.prog[rid] == k:
                self.load_progress(rid, data)
            return False

    def abandon_load(self, job: LoadJob, why: str) -> None:
        """A load job raised: fail its load (the table's ``load_fail`` effects) if it still
        owns its record, so nothing stays LOADING, no slot or page leaks."""
        with self.lock:
            if self.owns(job):
                self._fail_load(job.rid, job, why, corrupt=True)

    def abandon_offload(self, job: OffloadJob) -> None:
        """An offload job raised: cancel it (the device copy stays, the host slot is freed)."""
        with self.lock:
            rid = job.rid
            if self.meta.ckv[rid] == _CKV_OFFLOADING and self.pipes.dma.get(rid) is job:
                self._fx_offload_cancel(rid)

    def abandon_rebuild(self, job: RebuildJob) -> None:
        """A rebuild job raised: the indexer is absent again (a later admission rebuilds it;
        a waiting one truncates)."""
        with self.lock:
            rid = job.rid
            m = self.meta
            if m.idx[rid] == int(Indexer.REBUILDING) and self.pipes.cpu.get(rid) is job:
                m.idx[rid] = _IDX_ABSENT
                m.ixpipe[rid] = int(Pipe.NONE)
                self.pipes.cpu.forget(rid)
                self.notify_changed()

    def start_recovery(
        self, steps: Sequence[RecoveryStep], rids: Sequence[int], hit: int
    ) -> TailCheckJob | None:
        """Start a recovery plan's steps as far as the table and the pipelines allow now: a load
        past the I/O cap queues (``io_waiting``), a rebuild waits on its block's load
        (``want_rebuild``), a load that cannot find device room ends the plan (the admission
        truncates at use).  A load of the hit's last block brings the compressor state saved at
        that boundary with it: the splice check returned runs when the load lands."""
        with self.lock:
            loads_boundary = False
            nb = -(-hit // self.L)
            for st in steps:
                rid = st.rid
                if st.action == "offload_cancel" and self.can("offload_cancel", rid):
                    self.offload_cancel(rid)
                elif st.action == "load_start":
                    loads_boundary |= st.block == nb - 1
                    state, b = self._block_state("load_start", rid)
                    refused = self.guards.failed("load_start", state, {"b": b})
                    if refused == [IO_CAP]:  # the table's admission cap: queue, start later
                        self.io_waiting[rid] = None
                    elif not refused:
                        try:
                            self.load_start(rid)
                        except OutOfCapacity:  # no device room now: truncated at use
                            break
                elif st.action == "rebuild_start":
                    if self.can("rebuild_start", rid):  # kv_on_device: once its load lands
                        self.rebuild_start(rid)
                    else:
                        self.want_rebuild.add(rid)
            # follow-ups wait only on loads that started or are queued: a load that could not
            # start (no device room) leaves none behind
            for st in steps:
                if st.rid in self.want_rebuild and not self.load_pending(st.rid):
                    self.want_rebuild.discard(st.rid)
            if loads_boundary and nb > 0 and self.load_pending(rids[nb - 1]):
                tc = TailCheckJob(self, rids[nb - 1], hit)
                self.want_tail_check[tc.rid] = tc
                return tc
            return None

    def recovery_pending(self, steps: Sequence[RecoveryStep], tc: TailCheckJob | None) -> bool:
        """Is any job of a recovery plan still queued or running?"""
        m = self.meta
        for st in steps:
            rid = st.rid
            # (a wanted rebuild waits on its load: pending exactly while the load is)
            if (
                m.ckv[rid] == CKV.LOADING
                or m.idx[rid] == Indexer.REBUILDING
                or rid in self.io_waiting
            ):
                return True
        if tc is not None and tc.ok is None:
            # queued or running, or its block still loading (the load submits it when it lands)
            return (
                tc.key in self.pipes.cpu.jobs
                or m.ckv[tc.rid] == CKV.LOADING
                or tc.rid in self.io_waiting
            )
        return False

    def load_pending(self, rid: int) -> bool:
        """Is a load of this record in flight or queued by the I/O cap?"""
        return self.meta.ckv[rid] == _CKV_LOADING or rid in self.io_waiting

    def drop_wants(self, rid: int) -> None:
        """Follow-ups (rebuild, tail check) of a load that will not happen: an admission
        waiting for them validates what is there and truncates instead of waiting forever."""
        self.want_rebuild.discard(rid)
        self.want_tail_check.pop(rid, None)
        self.notify_changed()

    def load_done(self, rid: Any) -> tuple[int, int]:
        """Install the loaded block; returns (device address, stored form) it came back in.
        (A disk load's window section is read here unless its job read it without the lock.)"""
        with self.lock:
            self._check_block("load_done", rid)
            m = self.meta
            job = self._load_job(rid)
            from_disk = job.pipe is Pipe.IO
            if job.fault:
                job.fault = False
                self._fail_load(rid, job, "injected I/O fault at completion", corrupt=False)
                raise CorruptEntry(f"injected I/O fault while completing record {rid}")
            if job.swa_pages:
                try:
                    if from_disk:
                        data = job.swa_data
                        if data is None:
                            data = self.disk.read_swa(job.src)
                        self.tiers.swa_from_bytes(data, job.swa_pages)
                    else:
                        self.tiers.swa_from_host(job.src, job.swa_pages)
                except Exception as exc:  # any failure is a failed load
                    self._fail_load(rid, job, _why(exc), corrupt=True)
                    if isinstance(exc, CorruptEntry):
                        raise
                    raise CorruptEntry(f"loading record {rid}: {_why(exc)}") from exc
            self._moved(rid, job.dst)
            m.slot[rid] = job.dst
            m.swa_pages[rid] = job.swa_pages
            m.ckv[rid] = _CKV_READY
            m.ldpipe[rid] = int(Pipe.NONE)
            if from_disk:
                self.io_inflight -= 1
                m.idx[rid] = _IDX_ABSENT
                if not self.k.swa_restored_from_disk:
                    m.swa[rid] = _SWA_NULL
                m.fmt[rid] = job.src.fmt
                self.disk.delete(job.src)
                self.disk_entries.pop(rid, None)
                m.on_disk[rid] = False
            else:
                self.tiers.host_slots.release([job.src])
                m.hslot[rid] = -1
            self.lru[rid] = None
            self.pipes.for_pipe(job.pipe).forget(rid)
            self.events.emit(EventKind.LOADED, m.key[rid], "disk" if from_disk else "host")
            self._after_load(rid, from_disk)
            self.notify_changed()
            return m.addr[rid], m.fmt[rid]

    def _after_load(self, rid: int, from_disk: bool) -> None:
        check = self.want_tail_check.pop(rid, None)
        if check is not None:
            self.pipes.cpu.submit(check)
        if rid in self.want_rebuild:
            self.want_rebuild.discard(rid)
            if self.can("rebuild_start", rid):
                self.rebuild_start(rid)
        if from_disk:
            self._start_waiting_io()

    def _start_waiting_io(self) -> None:
        """Disk loads queued by the I/O cap start as earlier ones finish."""
        for rid in list(self.io_waiting):
            if self.io_inflight >= self.k.io_cap:
                break
            self.io_waiting.pop(rid, None)
            started = False
            if self.can("load_start", rid):
                try:
                    self.load_start(rid)
                    started = True
                except OutOfCapacity:  # no device room now: its admission truncates
                    pass
            if not started:
                self.drop_wants(rid)

    def load_fail(self, rid: Any) -> None:
        with self.lock:
            self._check_block("load_fail", rid)
            self._fail_load(rid, self._load_job(rid), "load failed", corrupt=False)

    def _fail_load(self, rid: int, job: LoadJob, why: str, *, corrupt: bool) -> None:
        m = self.meta
        self.tiers.slots.release(job.dst)
        self.tiers.slots.unclaim(job.dst, rid)
        if job.swa_pages:
            self.tiers.swa_pool.release(job.swa_pages)
            job.swa_pages = ()
        from_disk = job.pipe is Pipe.IO
        m.ckv[rid] = int(CKV.DISK if from_disk else CKV.HOST)
        m.ldpipe[rid] = int(Pipe.NONE)
        m.prog[rid] = self.k.load_steps
        if from_disk:
            self.io_inflight -= 1
            self.disk_lru[rid] = None
        else:
            self.host_lru[rid] = None
        if corrupt:
            m.corrupt[rid] = True
        self.want_rebuild.discard(rid)
        self.want_tail_check.pop(rid, None)
        self.pipes.for_pipe(job.pipe).forget(rid)
        self.events.emit(EventKind.LOAD_FAILED, m.key[rid], "disk" if from_disk else "host", why)
        if from_disk:
            self._start_waiting_io()
        self.notify_changed()

    def inject_load_fault(self, rid: Any) -> None:
        """Test hook: the next step of this block's load fails as an I/O error would."""
        with self.lock:
            self._load_job(self._rid(rid)).fault = True

    def drop(self, rid: Any) -> None:
        with self.lock:
            self._check_block("drop", rid)
            m = self.meta
            tier = "host" if m.ckv[rid] == CKV.HOST else "disk"
            if tier == "host":
                self.tiers.host_slots.release([m.hslot[rid]])
                m.hslot[rid] = -1
                self.host_lru.pop(rid, None)
            else:
                entry = self.disk_entries.pop(rid, None)
                if entry is not None:
                    self.disk.delete(entry)
                m.on_disk[rid] = False
                self.disk_lru.pop(rid, None)
            m.corrupt[rid] = False
            self._freed(rid)
            self.events.emit(EventKind.REMOVED, m.key[rid], tier)

    # ---- eviction and residency -------------------------------------------------------------
    def evict_start(self, rid: Any) -> None:
        with self.lock:
            self._check_block("evict_start", rid)
            self._fx_evict_start(rid)

    def _fx_evict_start(self, rid: int) -> None:
        self.meta.ckv[rid] = _CKV_EVICTING
        self.lru.pop(rid, None)

    def evict_done(self, rid: Any) -> None:
        with self.lock:
            self._check_block("evict_done", rid)
            self._fx_evict_done(rid)

    def _fx_evict_done(self, rid: int) -> None:
        self._free_device(rid)
        self._freed(rid)
        self.events.emit(EventKind.EVICTED, self.meta.key[rid], "device")

    def touch_prefix(self, rids: Sequence[int], blocks: int, ticks: int) -> None:
        """``touch`` the first ``blocks`` blocks of a chain up to the first absent one: the
        table's guard over the whole prefix in one call where it allows that (a touch changes no
        input of another block's touch guard), else per block on one view."""
        with self.lock:
            t = _int("ticks", ticks, 1, self.k.lease_max)
            lease, now = self.meta.lease, self.now
            run = self._run_tests.get("touch")
            if run is not None:  # one guard call over the prefix: touching moves no guard input
                head = rids[: min(blocks, len(rids))]
                stop = run(self._records, {"b": NULL_RID, "t": t}, head)
                until = now + t
                for rid in head[: len(head) if stop < 0 else stop]:
                    if lease[rid] < until:
                        lease[rid] = until
                self._admitted("touch", 1)
                return
            if "touch" in self._by_record:
                state: Any = self._records
                at: Any = rids
            else:
                state, at = self.chain_view(rids), range(len(rids))
            ok = (self._accept_direct if state._direct else self._accept).get("touch")
            allows = self.guards.allows
            p = {"b": 0, "t": t}
            for b in range(min(blocks, len(rids))):
                p["b"] = at[b]
                if not (ok(state, p) if ok is not None else allows("touch", state, p)):
                    break
                rid = rids[b]
                lease[rid] = max(lease[rid], now + t)
            self._admitted("touch", 1)

    def touch(self, rid: Any, ticks: Any) -> None:
        with self.lock:
            t = _int("ticks", ticks, 1, self.k.lease_max)
            self._check_block("touch", rid, t=t)
            self._fx_touch(rid, t)

    def _fx_touch(self, rid: int, t: int) -> None:
        lease = self.meta.lease
        lease[rid] = max(lease[rid], self.now + t)

    def tick(self, ticks: Any = 1) -> None:
        with self.lock:
            t = _int("ticks", ticks, 1, MAX_COUNT)
            self._guard("tick", self._global_state("tick"), {"t": t})
            self.now += t

    # ---- CUDA graph -------------------------------------------------------------------------
    def capture(self) -> None:
        with self.lock:
            self._guard("capture", self._global_state("capture"), {})
            self.graph.record()

    def replay(self) -> None:
        with self.lock:
            self._guard("replay", self._global_state("replay"), {})
            self.graph.replay()

    def recapture(self) -> None:
        with self.lock:
            self._guard("recapture", self._global_state("recapture"), {})
            self.graph.record()

    # ---- requests ---------------------------------------------------------------------------
    def free_slot(self) -> Slot:
        for s in self.slots:
            if s.phase == Req.IDLE and s.request is None:
                return s
        raise OutOfCapacity("admit", (), f"all {len(self.slots)} request slots are busy")

    def _req_state(
        self, action: str, slot: Slot, rids: Sequence[int], view: ChainView | None = None
    ) -> Any:
        """The state a request action's guard reads: the slot alone for "slot" guards, else
        ``view`` (a caller's direct view of this very chain and slot, shared across the steps of
        one admission) or a new view."""
        if action in self._by_slot:
            return slot.state
        return view if view is not None else self.chain_view(rids, slot)

    def _req_check(
        self,
        action: str,
        slot: Slot,
        rids: Sequence[int],
        view: ChainView | None = None,
        **params: int,
    ) -> None:
        self._guard(action, self._req_state(action, slot, rids, view), {"r": 0, **params})

    def begin(self, request: Any, ticks: Any, slot: Any = None) -> Slot:
        """The table's ``admit``: the request takes a slot and a deadline ``now + ticks``."""
        with self.lock:
            t = _int("ticks", ticks, 1, MAX_COUNT)
            s = self.free_slot() if slot is None else self._slot(slot)
            if s.request is not None and s.phase != Req.IDLE:
                raise Refused("admit", ("idle",), f"slot {s.index} is busy")
            self._req_check("admit", s, (), t=t)
            self._fx_admit(s, request, t)
            return s

    # Each request transition's effects, for a caller that holds the lock and has checked the
    # action's guard (the public methods below, and the library's admission path, which checks
    # each guard with ``_guard`` on the state of its kind and then applies these).
    def _fx_admit(self, s: Slot, request: Any, t: int) -> None:
        s.request = request
        s.phase = _WAITING
        s.deadline = self.now + t
        s.hit = 0
        request.slot = s

    def _fx_match(self, s: Slot, h: int) -> None:
        s.hit = h
        s.phase = _MATCHED

    def _fx_pin(self, s: Slot, rids: Sequence[int], view: ChainView | None) -> None:
        held = list(rids[: -(-s.hit // self.L)])
        ref, lru = self.meta.ref, self.lru
        for rid in held:
            ref[rid] += 1
            if rid in lru:
                lru.move_to_end(rid)
        s.rids = held
        s.pinned = s.hit
        self.pinned_blocks += len(held)
        s.phase = _PINNED
        if view is not None:
            view.refresh()

    def _fx_use(self, s: Slot) -> None:
        s.phase = _USING

    # The request table's steps for a caller that already holds the lock (the library's
    # admission and release run several as one critical section): the action's guard on the
    # cheapest state its locality allows, then its effects.  The public methods below are the
    # same steps, each taking the lock itself.
    def admit_locked(self, s: Slot, request: Any, t: int) -> None:
        self._guard("admit", self._req_state("admit", s, ()), {"r": 0, "t": t})
        self._fx_admit(s, request, t)

    def match_locked(self, s: Slot, h: int, rids: Sequence[int], view: ChainView | None) -> None:
        self._guard("match", self._req_state("match", s, rids, view), {"r": 0, "h": h})
        self._fx_match(s, h)

    def pin_locked(self, s: Slot, rids: Sequence[int], view: ChainView | None) -> None:
        self._guard("pin", self._req_state("pin", s, rids, view), {"r": 0})
        self._fx_pin(s, rids, view)

    def validate_locked(
        self, s: Slot, rids: Sequence[int], view: ChainView, proof: tuple[HitSearch, int] | None
    ) -> None:
        self._validate_checked(s, rids, view, proof)

    def use_locked(self, s: Slot) -> None:
        self._guard("use", self._req_state("use", s, ()), {"r": 0})
        self._fx_use(s)

    def release_locked(self, s: Slot) -> None:
        self._guard("release", self._req_state("release", s, ()), {"r": 0})
        self._fx_release(s)

    def abortable(self, s: Slot) -> bool:
        """Does the table's ``abort`` guard hold for this slot (the table in use decides which
        phases a request can be aborted from, not a list written here)."""
        return self.guards.allows("abort", self._req_state("abort", s, ()), {"r": 0}, ())

    def in_use(self, s: Slot) -> bool:
        return s.phase == _USING

    def waiting(self, s: Slot) -> bool:
        return s.phase == _WAITING

    def evict_one(self) -> bool:
        """Evict the least recently used evictable device block; False when none is."""
        with self.lock:
            return self._evict_one()

    def _fx_release(self, s: Slot) -> None:
        self._unpin(s)
        s.phase = _IDLE
        self._detach(s)

    def match(
        self,
        slot: Any,
        h: Any,
        rids: Sequence[int] | None = None,
        view: ChainView | None = None,
    ) -> None:
        with self.lock:
            s = self._slot(slot)
            h = _int("hit tokens", h, 0)
            req = s.request
            if req is None:
                raise Refused("match", ("waiting",), f"slot {s.index} holds no request")
            if h > len(req.chain.tokens):
                raise InvalidArgument(
                    f"hit of {h} tokens is longer than the request ({len(req.chain.tokens)})"
                )
            rids = self.resolve(req.chain) if rids is None else rids
            self._req_check("match", s, rids, view, h=h)
            self._fx_match(s, h)

    def pin(
        self, slot: Any, rids: Sequence[int] | None = None, view: ChainView | None = None
    ) -> None:
        with self.lock:
            s = self._slot(slot)
            if s.request is None:
                raise Refused("pin", ("matched",), f"slot {s.index} holds no request")
            rids = self.resolve(s.request.chain) if rids is None else rids
            self._req_check("pin", s, rids, view)
            self._fx_pin(s, rids, view)

    def search(
        self, slot: Slot, rids: Sequence[int], h_max: int, overrides: dict[str, Any] | None = None
    ) -> tuple[HitSearch, int]:
        """Longest valid hit (the coordinator on this cache's view) and the rule epoch it holds at."""
        with self.lock:
            return self.coord.search(self.chain_view(rids, slot, overrides), 0, h_max), self.epoch

    def validate(
        self,
        slot: Any,
        rids: Sequence[int] | None = None,
        proof: tuple[HitSearch, int] | None = None,
        view: ChainView | None = None,
    ) -> None:
        """The table's ``validate``.  ``proof`` is a search from :meth:`search`: while no
        transition since then could change what the rules read (same rule epoch) and it found
        this very hit, the rule conjuncts are known to hold and only the others are evaluated."""
        with self.lock:
            s = self._slot(slot)
            if s.request is None:
                raise Refused("validate", ("pinned",), f"slot {s.index} holds no request")
            rids = self.resolve(s.request.chain) if rids is None else rids
            self._validate_checked(s, rids, view or self.chain_view(rids, s), proof)

    def _validate_checked(
        self,
        s: Slot,
        rids: Sequence[int],
        view: ChainView,
        proof: tuple[HitSearch, int] | None,
    ) -> None:
        """``validate``'s guard (all of it, or under a current proof only the conjuncts that
        are not hit rules) and its effects: the state_data_ptrs snapshot."""
        skip: frozenset[str] = frozenset()
        if (
            proof is not None
            and proof[1] == self.epoch
            and proof[0].hit == s.hit
            and proof[0].rejected is None
        ):
            skip = self._rule_conjuncts
        state = s.state if skip and self._validate_rest_by_slot else view
        rest = self._validate_rest if skip and state is s.state else None
        bad: list[str] | None = [] if rest is not None and rest(state, {"r": 0}) else None
        if bad is None:
            bad = self.guards.failed("validate", state, {"r": 0}, skip)
        if bad:
            why = (
                "; ".join(str(x) for x in self.coord.failures(view, 0, s.hit))
                if s.phase == Req.PINNED
                else ""
            )
            raise Refused("validate", bad, why)
        gen, addr = self.meta.gen, self.meta.addr
        s.pgen = tuple([gen[i] for i in rids])
        s.paddr = tuple([addr[i] for i in rids])
        s.phase = _VALIDATED
        self._admitted("validate", 1)

    def use(self, slot: Any) -> None:
        with self.lock:
            s = self._slot(slot)
            self._req_check("use", s, ())
            self._fx_use(s)

    def _unpin(self, s: Slot) -> None:
        """Drop a slot's pins, freeing in reverse order: the deepest block of the prefix returns
        to the LRU first, so it is evicted before the blocks the prefix depends on."""
        ref, lru = self.meta.ref, self.lru
        for rid in reversed(s.rids):
            ref[rid] -= 1
            if ref[rid] < 0:
                raise InternalError(f"reference count of record {rid} went negative")
            if rid in lru:
                lru.move_to_end(rid)
        self.pinned_blocks -= len(s.rids)
        s.rids = []
        s.pinned = 0
        s.hit = 0

    def used(self, rids: Sequence[int]) -> None:
        """A request is done with these blocks (chain order): they become the most recently used,
        in reverse order, so the deepest is evicted first and the shared head of the prefix last."""
        with self.lock:
            lru = self.lru
            for rid in reversed(rids):
                if rid in lru:
                    lru.move_to_end(rid)

    def release(self, slot: Any) -> None:
        with self.lock:
            s = self._slot(slot)
            exc = AlreadyReleased if s.phase == Req.IDLE else Refused
            self._guard("release", self._req_state("release", s, ()), {"r": 0}, exc=exc)
            self._fx_release(s)

    def abort(self, slot: Any) -> None:
        with self.lock:
            s = self._slot(slot)
            exc = AlreadyReleased if s.phase == Req.IDLE else Refused
            self._guard("abort", self._req_state("abort", s, ()), {"r": 0}, exc=exc)
            self._unpin(s)
            s.phase = int(Req.IDLE)
            self._detach(s)

    def downgrade(self, slot: Any) -> None:
        with self.lock:
            s = self._slot(slot)
            self._req_check("downgrade", s, ())
            self._unpin(s)
            s.phase = int(Req.RECOMPUTE)
            req = s.request
            self.events.emit(EventKind.DOWNGRADED, None, "", "", getattr(req, "id", None))

    def _detach(self, s: Slot) -> None:
        req = s.request
        s.request = None
        if req is not None:
            req.slot = None
            for rid in list(self.io_waiting):  # queued loads nobody is waiting for any more
                if self.meta.ref[rid] == 0:
                    self.io_waiting.pop(rid, None)
        self.notify_changed()

    # ---- verification -----------------------------------------------------------------------
    def check_tail(self, rid: Any, boundary: Any) -> bool:
        """Does the compressor state saved at ``boundary`` (the end of record ``rid``) splice?
        A failure marks the record corrupt (it is not served at that boundary again)."""
        with self.lock:
            m = self.meta
            grp = self.tiers.compressor
            if m.slot[rid] < 0:
                return False
            pages = grp.device_data[:, grp.dev_index(m.slot[rid])]
            try:
                for li in range(grp.nl):
                    state, pos = grp.decode(pages[li])
                    grp.check(state, pos, boundary, self.backend)
            except KernelError:
                m.corrupt[rid] = True
                return False
            return True
