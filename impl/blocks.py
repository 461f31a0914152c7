"""The block store: records, the key index, tombstones, the device LRU and eviction, and the
write path (the table's Compressed KV, Uncompressed Tail, SWA Window and indexer-stamp actions).

Each public method is one transition: its guard through the :class:`~kvstate.impl.gate.GuardGate`
under the gate's lock, then its effects on the records (:class:`~kvstate.impl.meta.BlockMeta`)
and the storage (:class:`~kvstate.impl.tiers.Tiers`).  The ``fx_*`` methods are those effects
alone, for a caller that holds the lock and has checked the guard (a store run, an eviction).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Any, Final

import numpy as np

from kvstate.kernels import KernelError
from kvstate.spec.geometry import swa_kept_blocks
from kvstate.spec.table import Table

from .args import integer as _int
from .errors import InternalError, InvalidArgument, OutOfCapacity, Refused
from .events import EventKind, EventLog
from .gate import GuardGate
from .hashing import Chain
from .meta import NULL_RID
from .phasecodes import (
    CKV_EVICTING,
    CKV_FREE,
    CKV_READY,
    CKV_WRITING,
    FMT_PRIMARY,
    IDX_ABSENT,
    IDX_PRESENT,
    SWA_NULL,
    SWA_VALID,
    TAIL_NONE,
    TAIL_OPEN,
    TAIL_SEALED,
)
from .pipelines import LoadJob, Pipelines
from .tiers import Tiers
from .writer import Writer

# ``Final``: compiled, a final module constant is a C static (see phasecodes.py)
_KEPT_MEMO: Final = 256  # window-policy answers kept (``policy_slid``); cleared when full


class BlockStore:
    def __init__(
        self,
        table: Table,
        gate: GuardGate,
        tiers: Tiers,
        pipes: Pipelines,
        events: EventLog,
        *,
        writer: Writer | None,
        derive_index: bool,
        device_blocks: int,
        max_records: int,
        backend: str | None,
    ) -> None:
        self.table = table
        self.gate = gate
        self.meta = gate.meta
        self.tiers = tiers
        self.pipes = pipes
        self.events = events
        self.k = table.consts
        self.L = self.k.L
        self.writer = writer
        self.derive_index = derive_index
        self.device_blocks = device_blocks
        self.max_records = max_records
        self.backend = backend
        self.lock = gate.lock
        self.index: dict[bytes, int] = {}
        self.lru: OrderedDict[int, None] = OrderedDict()  # READY on device, least recent first
        self.tombstones: OrderedDict[int, None] = OrderedDict()  # FREE records still indexed
        self.registered: set[int] = set()  # registered chains' records: never purged
        g = table.geometry  # the window policy (spec/geometry.py swa_kept_blocks), its
        self.swa_policy = (g.window_lcm_blocks, g.checkpoint_blocks)  # constants read once
        # the policy's answer per (first, stop, end): the spec's function is interpreted (~9k
        # instructions a store run), and a server stores the same spans again and again
        self._kept: dict[tuple[int, int, int], set[int]] = {}

    # ---- records ----------------------------------------------------------------------------
    def record(self, key: bytes, tokens: np.ndarray | None, start: int) -> int:
        """The record of a block key (a FREE one is created for an unknown key)."""
        rid = self.index.get(key)
        if rid is None:
            rid = self._new_record(key, tokens, start)
            self.tombstones[rid] = None
        elif tokens is not None:
            self.meta.tokens[rid] = tokens
            self.meta.start[rid] = start
        return rid

    def _new_record(self, key: bytes, tokens: np.ndarray | None, start: int) -> int:
        """A FREE record for an unknown key, indexed; the caller tombstones it (a store run
        does not: it takes the record off the tombstones at once)."""
        self.purge_tombstones()
        rid = self.meta.new(key, tokens, start)
        self.index[key] = rid
        return rid

    def register(self, chain: Chain) -> list[int]:
        """Records for every block of ``chain``, each with a preferred device slot reserved, so
        their device addresses are distinct and stable from the start: never purged, or a FREE
        one's id would go to another key and its address (a graph's too) be forgotten."""
        with self.lock:
            rids = []
            for k, key in enumerate(chain.keys):
                rid = self.record(key, chain.block_tokens_of(k), k * self.L)
                if self.meta.addr[rid] < 0:
                    home = self.tiers.slots.claim_free(rid)
                    self.meta.addr[rid] = home
                    self.meta.gaddr[rid] = home
                self.registered.add(rid)
                rids.append(rid)
            return rids

    def resolve(self, chain: Chain) -> list[int]:
        # the values as objects: typed ``int`` each record id would be unboxed and boxed again
        # (a new int object per block beyond the small ints) on its way into the list
        index: dict[bytes, Any] = self.index
        return [index.get(k, NULL_RID) for k in chain.keys]

    def purge_tombstones(self) -> None:
        """Forget the oldest tombstones while the index is full (registered ones put back)."""
        kept: list[int] = []
        while len(self.index) >= self.max_records and self.tombstones:
            rid, _ = self.tombstones.popitem(False)  # (positional: no keyword call)
            if rid in self.registered:
                kept.append(rid)
                continue
            key = self.meta.key[rid]
            if key is not None:
                self.index.pop(key, None)
            self.tiers.slots.unclaim(self.meta.addr[rid], rid)
            self.meta.addr[rid] = -1
            self.meta.gaddr[rid] = -1
            self.meta.retire(rid)
        self.tombstones.update(dict.fromkeys(kept))

    # ---- capacity -------------------------------------------------------------------------
    def take_slot(self, rid: int, prefer: int) -> int:
        slot = self.tiers.slots.take(rid, prefer)
        while slot < 0:
            if not self.evict_lru():
                raise OutOfCapacity(
                    "allocate", (), f"all {self.device_blocks} device slots are pinned or leased"
                )
            slot = self.tiers.slots.take(rid, prefer)
        return slot

    def take_swa(self) -> list[int]:
        """One block's SWA pages.  An empty pool first slides the least recently used block
        the table lets slide (``slide``: a VALID, unpinned window), which keeps its compressed
        KV (its prefix still hits up to an earlier checkpoint); eviction would free no pages
        where no block can slide (a block the table lets go is unpinned, and an unpinned
        READY block's window is NULL once it cannot slide), so then there is no room."""
        n = self.tiers.swa_pages_per_block
        pages = self.tiers.swa_pool.take(n)
        while pages is None:
            if not self.slide_lru():
                raise OutOfCapacity("allocate", (), "no free SWA pages and no window to slide")
            pages = self.tiers.swa_pool.take(n)
        return pages

    def slide_lru(self) -> bool:
        """Slide the least recently used device block that holds SWA pages and that the table
        lets slide (its guard, then its effects; the lock is held)."""
        pages = self.meta.swa_pages
        gate = self.gate
        for rid in self.lru:
            if not pages[rid]:
                continue
            try:
                gate.check_block("slide", rid)
            except Refused:
                continue
            self.fx_slide(rid)
            return True
        return False

    def evict_lru(self) -> bool:
        """Evict the least recently used block the table allows to be evicted: evict_start then
        evict_done, each its guard and then its effects (the lock is held)."""
        gate = self.gate
        for rid in self.lru:
            try:  # the head of the LRU is usually evictable: its guard is evaluated once
                gate.check_block("evict_start", rid)
            except Refused:
                continue
            self.fx_evict_start(rid)
            gate.check_block("evict_done", rid)
            self.fx_evict_done(rid)
            return True
        return False

    def evict_one(self) -> bool:
        """Evict the least recently used evictable device block; False when none is."""
        with self.lock:
            return self.evict_lru()

    def _evict_run(self, count: int) -> None:
        """Evict ``count`` blocks at once (fewer if fewer are evictable): the LRU's first
        ``count`` blocks when the table lets every one of them go (one evict_start check over
        them, their effects, one evict_done check, its effects); otherwise one by one."""
        if count <= 0:
            return
        lru = self.lru
        gate = self.gate
        victims = [rid for rid, _ in zip(lru, range(count), strict=False)]
        run = gate.run_tests.get("evict_start")
        if len(victims) < count or run is None or run(gate.records, {"b": NULL_RID}, victims) >= 0:
            for _ in range(count):
                if not self.evict_lru():
                    return
            return
        gate.admitted("evict_start", count)
        for rid in victims:
            self.fx_evict_start(rid)
        gate.check_run("evict_done", victims)
        key = self.meta.key
        self._free_run(victims)
        for rid in victims:
            self.freed(rid, False)  # evict_start took each off the LRU
        self.events.emit_run(EventKind.EVICTED, [key[rid] for rid in victims], "device")

    def free_device(self, rid: int) -> None:
        m = self.meta
        if m.slot[rid] >= 0:
            self.tiers.slots.release(m.slot[rid])
            m.slot[rid] = -1
        if m.swa_pages[rid]:
            self.tiers.swa_pool.release(m.swa_pages[rid])
            m.swa_pages[rid] = ()

    def _free_run(self, rids: list[int]) -> None:
        """``free_device`` of several blocks: their SWA pages go back in one call, in the
        order one call per block would give them back."""
        m = self.meta
        slots = self.tiers.slots
        pages: list[int] = []
        try:
            for rid in rids:
                if m.slot[rid] >= 0:
                    slots.release(m.slot[rid])
                    m.slot[rid] = -1
                if m.swa_pages[rid]:
                    pages.extend(m.swa_pages[rid])
                    m.swa_pages[rid] = ()
        finally:  # a double free raised above: the pages already taken off still go back
            if pages:
                self.tiers.swa_pool.release_run(pages)

    def moved(self, rid: int, new: int) -> str:
        """The record's state buffer is now at device slot ``new``; returns why a captured
        graph went stale ("" if it did not).  The caller reports it (:meth:`stale`) once the
        record is whole: a subscriber that recaptures on ``STALE_GRAPH`` must record the new
        address and find the block in its new phase."""
        m = self.meta
        old = m.addr[rid]
        if new == old:
            return ""
        if old >= 0:
            self.tiers.slots.unclaim(old, rid)
        m.addr[rid] = new
        graph = self.gate.graph
        if graph.captured and graph.moved(rid, old, new):
            return f"slot {old} -> {new}"
        return ""

    def stale(self, rid: int, why: str) -> None:
        """Report what :meth:`moved` returned (nothing when the graph did not go stale)."""
        if why:
            self.events.emit(EventKind.STALE_GRAPH, self.meta.key[rid], "device", why)

    def freed(self, rid: int, in_lru: bool = True) -> None:
        """Common effects of a block becoming FREE; ``in_lru=False``: the caller knows the block
        is off the LRU already (evict_start took it off)."""
        m = self.meta
        m.ckv[rid] = CKV_FREE
        m.tail[rid] = TAIL_NONE
        m.swa[rid] = SWA_NULL
        m.idx[rid] = IDX_ABSENT
        if in_lru:
            self.lru.pop(rid, None)
        self.tombstones[rid] = None

    # ---- Compressed KV: write path ----------------------------------------------------------
    @property
    def write_fmt(self) -> int:
        """The stored form (``Fmt``) of the blocks the writer produces (read at each store: a
        writer may change it)."""
        w = self.writer
        if w is None:  # (getattr with a default would raise and catch AttributeError: ~5k
            return FMT_PRIMARY  # instructions per store in the compiled build)
        return int(getattr(w, "fmt", FMT_PRIMARY))

    def allocate(self, rid: Any) -> int:
        """Take a device slot for the block's new content; returns the stored form (``Fmt``)
        the writer produces, which the kernel-ABI rule later checks."""
        with self.lock:
            fmt = self.write_fmt
            self.gate.check_block("allocate", rid, f=fmt)
            return self.fx_allocate(rid, fmt)

    def fx_allocate(self, rid: int, fmt: int, window: bool = True) -> int:
        """Effects: a device slot and SWA pages (evicting the LRU blocks the table lets go);
        ``window=False``: no SWA pages, the block is slid in the same store run (the caller
        checks ``slide``'s guard once it is committed), so its pages would go back at once."""
        m = self.meta
        slot = self.take_slot(rid, m.addr[rid])
        claimant = self.tiers.slots.displaced
        try:
            pages = self.take_swa() if window else []
        except OutOfCapacity:
            self.tiers.slots.untake(slot, claimant)
            raise
        self._allocated(rid, slot, tuple(pages), fmt)
        self.tombstones.pop(rid, None)
        return fmt

    def _allocated(self, rid: int, slot: int, pages: tuple[int, ...], fmt: int) -> None:
        """allocate's effects on the record, once its slot and SWA pages are taken."""
        m = self.meta
        why = self.moved(rid, slot)
        m.slot[rid], m.swa_pages[rid] = slot, pages
        m.ckv[rid] = CKV_WRITING
        m.gen[rid] += 1
        m.tail[rid] = TAIL_OPEN
        m.swa[rid] = SWA_NULL
        m.idx[rid] = IDX_ABSENT
        m.fmt[rid] = fmt
        self.stale(rid, why)

    def _allocate_run(self, todo: list[int], fmt: int, slid: set[int]) -> int:
        """fx_allocate of a run's blocks in order; how many got their slot and pages (none for
        the blocks of ``slid``: the run slides them once committed).  The SWA pages of the
        whole run are taken in one call when the pool holds them all (they are then the very
        pages the per-block takes would have got: pages freed meanwhile go to the back of the
        free list); else block by block, sliding or evicting as each needs."""
        n = self.tiers.swa_pages_per_block
        pool = self.tiers.swa_pool
        pages = pool.take(n * (len(todo) - len(slid)))
        got = 0
        if pages is None:
            for rid in todo:
                try:
                    self.fx_allocate(rid, fmt, rid not in slid)
                except OutOfCapacity:
                    break  # the rest is recomputed next time; the cache is full of pinned blocks
                got += 1
            return got
        addr = self.meta.addr
        used = 0
        for rid in todo:
            try:
                slot = self.take_slot(rid, addr[rid])
            except OutOfCapacity:
                pool.untake(pages[used:])  # as if the rest had never been taken
                break
            if rid in slid:
                self._allocated(rid, slot, (), fmt)
            else:
                self._allocated(rid, slot, tuple(pages[used : used + n]), fmt)
                used += n
            got += 1
        return got

    def store_run(
        self,
        blocks: Sequence[tuple[bytes, np.ndarray | None, int]],
        ticks: int,
        end: int,
    ) -> int:
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
        blocks of the run are stored and the rest left to be recomputed.

        ``end`` (chain blocks; -1: no policy): the length of the prefix being stored.  The
        run's blocks that the window policy does not keep at that length
        (:meth:`Geometry.swa_kept`: outside the last window and every checkpoint's) are slid
        once committed (``slide``'s guard once over them, in the run's table order: allocate,
        commit, slide, seal, ...), and take no SWA pages on the way, since they would give
        them back at once."""
        m = self.meta
        gate = self.gate
        todo: list[int] = []
        index = self.index
        for key, tokens, start in blocks:
            rid = index.get(key)
            if rid is None:  # a new record: FREE, and off the tombstones from the start
                todo.append(self._new_record(key, tokens, start))
                continue
            if tokens is not None:
                m.tokens[rid] = tokens
                m.start[rid] = start
            if m.ckv[rid] == CKV_FREE and rid not in todo[-1:]:
                todo.append(rid)
                self.tombstones.pop(rid, None)  # not purged by a later record of the run
        if not todo:
            return 0
        fmt = self.write_fmt
        slid = self.policy_slid(todo, end)
        try:
            gate.check_run("allocate", todo, f=fmt)
        except Refused:
            # one by one, the blocks before the refused one would have been stored, and it and
            # the rest left FREE: tombstoned (reclaimable), as every FREE record of the index
            at = gate.first_refused("allocate", todo, f=fmt)
            at = at if at >= 0 else 0
            self._tombstone_free(todo[at:])
            if at:  # the prefix stored ends where the refused block starts
                head = todo[:at]
                cut = m.start[todo[at]] // self.L if end >= 0 else -1
                self._store_allowed(head, fmt, ticks, self.policy_slid(head, cut))
            raise
        except BaseException:  # pragma: no cover: check_run raises Refused (else a bug)
            self._tombstone_free(todo)
            raise
        return self._store_allowed(todo, fmt, ticks, slid)

    def policy_slid(self, todo: list[int], end: int) -> set[int]:
        """The run's blocks the window policy does not keep for a prefix of ``end`` chain
        blocks (-1: no policy): one call for the run's span of the chain."""
        if end < 0 or not todo:
            return set()
        starts, L = self.meta.start, self.L
        kept = self.kept_blocks(starts[todo[0]] // L, starts[todo[-1]] // L + 1, end)
        return {rid for rid in todo if starts[rid] // L not in kept}

    def kept_blocks(self, first: int, stop: int, end: int) -> Any:
        """The chain blocks among ``[first, stop)`` whose windows the policy keeps for a prefix
        of ``end`` blocks (``swa_kept_blocks``), memoized: asked again at every store and every
        decode step over the same spans.  Read only."""
        span = (first, stop, end)
        kept = self._kept.get(span)
        if kept is None:
            w, p = self.swa_policy
            kept = swa_kept_blocks(w, p, first, stop, end)
            if len(self._kept) >= _KEPT_MEMO:
                self._kept.clear()
            self._kept[span] = kept  # read only: never changed once kept
        return kept

    def slide_passed(self, rids: Sequence[int], lo: int, hi: int, end: int) -> None:
        """Decode moved the window of a prefix of ``end`` blocks (``rids``) past blocks
        ``[lo, hi)``: each the policy does not keep is slid where the table's guard allows
        (the caller holds the lock)."""
        kept = self.kept_blocks(lo, hi, end)
        can = self.gate.can
        for b in range(lo, hi):
            rid = rids[b]
            if b not in kept and can("slide", rid):
                self.fx_slide(rid)

    def _tombstone_free(self, rids: Sequence[int]) -> None:
        """Put the FREE records among ``rids`` (back) on the tombstones: a run that stops
        early leaves none of its records FREE and off them (indexed for good: leaked)."""
        ckv, tombstones = self.meta.ckv, self.tombstones
        for rid in rids:
            if ckv[rid] == CKV_FREE:
                tombstones[rid] = None

    def _store_allowed(self, todo: list[int], fmt: int, ticks: int, slid: set[int]) -> int:
        """``store_run`` once the allocate guard allowed every block of ``todo``: evict to make
        room, allocate, commit, slide (``slid``: the blocks outside the window policy), seal,
        index_update and touch; a block left FREE (no room, or an exception part way) goes
        back on the tombstones."""
        gate = self.gate
        try:
            self._evict_run(len(todo) - self.tiers.slots.free)
            got = self._allocate_run(todo, fmt, slid)
        except BaseException:
            self._tombstone_free(todo)
            raise
        for rid in todo[got:]:
            self.tombstones[rid] = None
        todo = todo[:got]
        done = 0
        try:
            gate.check_run("commit", todo)
            for rid in todo:
                self.fx_commit(rid, False)
                done += 1
        except Exception:
            self._stored(todo[:done])
            for rid in todo[done:]:
                self.discard(rid)
            self._slide_stored(todo[:done], slid)
            self._seal_run(todo[:done], ticks)
            raise
        self._stored(todo)
        self._slide_stored(todo, slid)
        self._seal_run(todo, ticks)
        return len(todo)

    def _slide_stored(self, rids: list[int], slid: set[int]) -> None:
        """slide of a run's committed blocks that took no SWA pages: the guard once over them
        (a block the run just allocated is unpinned: pinned blocks are never FREE), then the
        effect (the window phase; there are no pages to give back)."""
        if not slid:
            return
        run = [rid for rid in rids if rid in slid]
        self.gate.check_run("slide", run)
        swa = self.meta.swa
        for rid in run:
            swa[rid] = SWA_NULL

    def _stored(self, rids: list[int]) -> None:
        """The STORED events of a run's committed blocks, in commit order."""
        key = self.meta.key
        self.events.emit_run(EventKind.STORED, [key[rid] for rid in rids], "device")

    def _seal_run(self, rids: list[int], ticks: int) -> None:
        """seal, index_update and touch of committed blocks: each guard once over the run."""
        gate = self.gate
        gate.check_run("seal", rids)
        for rid in rids:
            self.fx_seal(rid)
        gate.check_run("index_update", rids)
        if self.derive_index:
            self.tiers.build_index_run([self.meta.slot[rid] for rid in rids])
        for rid in rids:
            self.stamp_index(rid, False)
        gate.check_run("touch", rids, t=ticks)
        lease, until = self.meta.lease, gate.now + ticks
        for rid in rids:
            if lease[rid] < until:
                lease[rid] = until

    def commit(self, rid: Any) -> None:
        with self.lock:
            self.gate.check_block("commit", rid)
            self.fx_commit(rid)

    def fx_commit(self, rid: int, emit: bool = True) -> None:
        """Effects (the caller holds the lock and has checked the guard); ``emit=False``: the
        caller reports the STORED event itself (a run: :meth:`_stored`)."""
        m = self.meta
        if self.writer is not None:
            tokens = m.tokens[rid]
            if tokens is None or len(tokens) != self.L:
                raise InvalidArgument(f"record {rid} has no token block to write")
            self.tiers.write_block(m.slot[rid], m.swa_pages[rid], m.start[rid], tokens, self.writer)
        m.ckv[rid] = CKV_READY
        m.ver[rid] += 1
        m.swa[rid] = SWA_VALID
        self.lru[rid] = None
        if emit:
            self.events.emit(EventKind.STORED, m.key[rid], "device")

    def discard(self, rid: Any) -> None:
        with self.lock:
            self.gate.check_block("discard", rid)
            m = self.meta
            self.free_device(rid)
            m.ckv[rid] = CKV_FREE
            m.tail[rid] = TAIL_NONE
            self.tombstones[rid] = None

    def seal(self, rid: Any) -> None:
        with self.lock:
            self.gate.check_block("seal", rid)
            self.fx_seal(rid)

    def fx_seal(self, rid: int) -> None:
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
        m.tail[rid] = TAIL_SEALED
        m.ver[rid] += 1  # the tail's rows became compressed entries: the indexer must follow

    def slide(self, rid: Any) -> None:
        with self.lock:
            self.gate.check_block("slide", rid)
            self.fx_slide(rid)

    def fx_slide(self, rid: int) -> None:
        """Effects (the caller holds the lock and has checked the guard): the pages go back,
        a load's reserved ones too, and the window is the null block."""
        m = self.meta
        if m.swa_pages[rid]:
            self.tiers.swa_pool.release(m.swa_pages[rid])
            m.swa_pages[rid] = ()
        job = self.pipes.dma.get(rid) or self.pipes.io.get(rid)
        if isinstance(job, LoadJob):
            pages = job.give_back_window()
            if pages:
                self.tiers.swa_pool.release(pages)
        m.swa[rid] = SWA_NULL

    # ---- Indexer State ----------------------------------------------------------------------
    def stamp_index(self, rid: int, build: bool = True) -> None:
        m = self.meta
        if build:
            self.tiers.build_index(m.slot[rid])
        m.idx[rid] = IDX_PRESENT
        m.iver[rid] = m.ver[rid]

    def index_update(self, rid: Any) -> None:
        with self.lock:
            self.gate.check_block("index_update", rid)
            self.stamp_index(rid, self.derive_index)

    # ---- eviction and residency -------------------------------------------------------------
    def evict_start(self, rid: Any) -> None:
        with self.lock:
            self.gate.check_block("evict_start", rid)
            self.fx_evict_start(rid)

    def fx_evict_start(self, rid: int) -> None:
        self.meta.ckv[rid] = CKV_EVICTING
        self.lru.pop(rid, None)

    def evict_done(self, rid: Any) -> None:
        with self.lock:
            self.gate.check_block("evict_done", rid)
            self.fx_evict_done(rid)

    def fx_evict_done(self, rid: int, emit: bool = True) -> None:
        """Effects; ``emit=False``: the caller reports the EVICTED event (a run)."""
        self.free_device(rid)
        self.freed(rid)
        if emit:
            self.events.emit(EventKind.EVICTED, self.meta.key[rid], "device")

    def touch_prefix_locked(self, rids: Sequence[int], blocks: int, ticks: int) -> None:
        """``touch`` the first ``blocks`` blocks of a chain up to the first absent one: the
        table's guard over the whole prefix in one call where it allows that (a touch changes no
        input of another block's touch guard), else per block on one view.  The caller holds
        the lock (an admission: taking the reentrant lock again costs ~1k instructions)."""
        gate = self.gate
        t = _int("ticks", ticks, 1, self.k.lease_max)
        lease, now = self.meta.lease, gate.now
        run = gate.run_tests.get("touch")
        if run is not None:  # one guard call over the prefix: touching moves no guard input
            head = rids[: min(blocks, len(rids))]
            stop = run(gate.records, {"b": NULL_RID, "t": t}, head)
            until = now + t
            for rid in head[: len(head) if stop < 0 else stop]:
                if lease[rid] < until:
                    lease[rid] = until
            gate.admitted("touch", 1)
            return
        if "touch" in gate.by_record:
            state: Any = gate.records
            at: Any = rids
        else:
            state, at = gate.chain_view(rids), range(len(rids))
        ok = gate.accept_tests(state).get("touch")
        allows = gate.guards.allows
        p = {"b": 0, "t": t}
        for b in range(min(blocks, len(rids))):
            p["b"] = at[b]
            if not (ok(state, p) if ok is not None else allows("touch", state, p)):
                break
            rid = rids[b]
            lease[rid] = max(lease[rid], now + t)
        gate.admitted("touch", 1)

    def touch(self, rid: Any, ticks: Any) -> None:
        with self.lock:
            t = _int("ticks", ticks, 1, self.k.lease_max)
            self.gate.check_block("touch", rid, t=t)
            lease = self.meta.lease
            lease[rid] = max(lease[rid], self.gate.now + t)

    def used_locked(self, rids: Sequence[int]) -> None:
        """A request is done with these blocks (chain order): they become the most recently used,
        in reverse order, so the deepest is evicted first and the shared head of the prefix last
        (the caller holds the lock)."""
        lru = self.lru
        for rid in reversed(rids):
            if rid in lru:
                lru.move_to_end(rid)
