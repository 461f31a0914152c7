"""The cache core: the allocator's parts composed, one method per action of the table.

The allocator is cut along the table's own components, the way vLLM's ``v1/core`` is: a
:class:`~kvstate.impl.gate.GuardGate` (the one lock, guard dispatch on the cheapest state a
guard reads, the rule epoch), a :class:`~kvstate.impl.blocks.BlockStore` (records, index,
tombstones, the device LRU, eviction and the write path: Compressed KV, Uncompressed Tail, SWA
Window, the indexer stamp), :class:`~kvstate.impl.recovery.Recovery` (offload, spill, load,
drop and the indexer rebuild, with their pipeline jobs) and a
:class:`~kvstate.impl.requests.RequestTable` (slots, pins, validate, use, release, and the
admission as one transaction).  Every transition has the same shape, under the gate's lock:

1. validate the arguments (:class:`InvalidArgument` for malformed input);
2. evaluate the table's guard conjuncts for the action on this cache's own metadata
   (:class:`Refused` naming the false conjuncts; nothing has changed yet);
3. acquire what the action needs (slots, pages; possibly by evicting or spilling *other*
   blocks, each its own guarded transition), refusing with :class:`OutOfCapacity` if impossible;
4. move the data and apply the action's effects.

The effects are this implementation's own code (storage, pools, pipelines); only the guards and
the hit rules are read from the table, so the model and the implementation are two readings of
one contract and the conformance harness compares them.  :class:`CacheCore` only builds the
parts; which part performs each of the table's actions is one map (:mod:`kvstate.impl.actions`,
checked against the table here), through which :meth:`CacheCore.act` drives an action by name
(the conformance adapter, :class:`~kvstate.impl.inspection.TestHooks`).  The library
(:mod:`kvstate.impl.cache`) calls the parts directly on its request path.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import torch

from kvstate.spec.phases import CKV
from kvstate.spec.table import Table

from .actions import bind, block_actions, check_actions
from .args import MAX_COUNT
from .args import integer as _int
from .blocks import BlockStore
from .disk import DiskTier
from .errors import CacheClosed, InvalidArgument, LayoutError, StorageError
from .events import EventLog
from .gate import GuardGate
from .graphs import GraphRegistry
from .meta import BlockMeta
from .pipelines import Pipelines
from .recovery import Recovery
from .remote import RemoteTier
from .requests import RequestTable, Slot
from .tiers import Tiers, planned_bytes
from .writer import Writer

__all__ = ["CacheCore", "Slot"]


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _graph_blocks(
    g: Any,
    L: int,
    caps: dict[str, int],
    device: torch.device,
    max_model_len: int,
    memory_limit: int,
) -> int:
    """Blocks per request in the CUDA-graph block table (a request is at most
    ``max_model_len`` tokens).  The table (int32 slots + int64 state pointers per entry, a
    device copy on CUDA) is as much a part of the footprint as the tiers: it counts in the
    memory limit (a tier plan over the limit by itself is refused by ``Tiers``)."""
    graph_blocks = _cdiv(max_model_len, L)
    graph_bytes = caps["max_requests"] * graph_blocks * 12 * (2 if device.type == "cuda" else 1)
    dev_b, host_b = planned_bytes(
        g, caps["device_blocks"], caps["host_blocks"], caps["max_requests"], caps.get("swa_blocks")
    )
    if dev_b + host_b <= memory_limit < dev_b + host_b + graph_bytes:
        raise LayoutError(
            f"{caps['max_requests']} requests x {graph_blocks} blocks of CUDA-graph block "
            f"table need {graph_bytes / 2**30:.1f} GiB beside {(dev_b + host_b) / 2**30:.1f} "
            f"GiB of tiers (> memory_limit {memory_limit / 2**30:.1f} GiB); lower "
            "max_requests or max_model_len, or raise memory_limit"
        )
    return graph_blocks


# ``stats()["blocks"]`` keys: each CKV phase's name, the FREE phase's as "tombstones" (a known
# block without a slot), so that it is not read as the pool's free slots (``device_free``)
_STAT_NAMES: dict[int, str] = {
    int(p): "tombstones" if p is CKV.FREE else p.name.lower() for p in CKV
}


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
        swa_blocks: int | None = None,
        remote: Any = None,
    ) -> None:
        g = table.geometry
        self.remote = remote  # a RemoteConfig: the disk tier's entries in a shared store
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
        if swa_blocks is not None:  # at most one block's SWA pages per device slot
            caps["swa_blocks"] = _int("swa_blocks", swa_blocks, 1, caps["device_blocks"])
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
        check_actions(table)  # (before the directory is opened: a refused table leaves nothing)
        graph_blocks = _graph_blocks(
            g, self.L, caps, self.device, _int("max_model_len", max_model_len, 1), memory_limit
        )
        self.tiers = Tiers(
            g,
            device_slots=self.device_blocks,
            host_slots=self.host_blocks,
            device=self.device,
            memory_limit=memory_limit,
            backend=self.backend,
            max_requests=caps["max_requests"],
            swa_blocks=swa_blocks,
        )
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        if cache_dir is None:
            try:
                self._tmp = tempfile.TemporaryDirectory(prefix="kvstate-disk-")
            except OSError as exc:  # a full or read-only temporary directory
                err = StorageError(f"no temporary cache directory: {exc}")
                err.__cause__ = exc
                raise err from exc
            cache_dir = self._tmp.name
        try:
            self._build(table, g, caps, cache_dir, durable, disk_key, mode, writer, graph_blocks)
        except BaseException:
            if getattr(self, "disk", None) is not None:
                self.disk.close()  # the directory's lock goes with a failed construction
            if self._tmp is not None:
                self._tmp.cleanup()
            raise
        self.closed = False  # after ``close``: every transition raises CacheClosed
        self.pipes.start()

    def _build(
        self,
        table: Table,
        g: Any,
        caps: dict[str, int],
        cache_dir: Any,
        durable: bool,
        disk_key: bytes | None,
        mode: str,
        writer: Writer | None,
        graph_blocks: int,
    ) -> None:
        """The parts over the tiers: the disk tier (the directory locked and scanned), the
        pipelines, the graph registry, the gate and the three parts."""
        swa = self.tiers.swa
        layout = [
            (grp.name, li, self.tiers.unit_bytes((grp, li))) for grp, li in self.tiers.units(False)
        ]
        swa_bytes = swa.nl * swa.pages_per_block * swa.page_bytes
        self.disk: DiskTier
        if self.remote is not None:
            self.disk = RemoteTier(
                self.remote,
                self._fingerprint(),
                self.k.load_steps,
                layout=layout,
                swa_bytes=swa_bytes,
            )
        else:
            self.disk = DiskTier(
                cache_dir,
                self._fingerprint(),
                self.k.load_steps,
                durable=durable,
                key=disk_key,
                layout=layout,
                swa_bytes=swa_bytes,
            )
        self.events = EventLog()
        self.pipes = Pipelines(mode, self.k.io_cap)
        # a graph's block table holds any request's pins whole: a request is at most
        # max_model_len tokens long (vLLM sizes its block table the same way)
        self.graph = GraphRegistry(
            self.meta,
            caps["max_requests"],
            graph_blocks,
            self.device,
        )
        maps: dict[str, Any] = {
            grp.state_var: grp.map for grp in (self.tiers.swa, self.tiers.compressor) if grp.remaps
        }
        self.gate = gate = GuardGate(table, self.meta, self.graph, maps)
        self.store = store = BlockStore(
            table,
            gate,
            self.tiers,
            self.pipes,
            self.events,
            writer=writer,
            derive_index=self.derive_index,
            device_blocks=self.device_blocks,
            max_records=4 * (self.device_blocks + self.host_blocks + self.disk_blocks) + 64,
            backend=self.backend,
        )
        self.recovery = recovery = Recovery(
            table,
            gate,
            store,
            self.tiers,
            self.disk,
            self.pipes,
            self.events,
            host_blocks=self.host_blocks,
            disk_blocks=self.disk_blocks,
            backend=self.backend,
        )
        self.requests = RequestTable(
            table, gate, store, recovery, self.tiers, self.events, caps["max_requests"]
        )
        recovery.scan_disk()
        self._actions = bind(table, self)  # checked against the table's actions
        self._block_actions = block_actions(table)

    def _live(self) -> None:
        if self.closed:
            raise CacheClosed("the cache is closed")

    def close(self) -> None:
        self.closed = True
        self.pipes.stop()
        self.disk.reap()  # loaded files a stopped pipeline had not unlinked yet
        self.disk.close()  # the directory's lock: another cache may open it now
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

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

    # ---- the lock (the gate's; every part takes the same one) -----------------------------
    @property
    def lock(self) -> Any:
        return self.gate.lock

    @lock.setter
    def lock(self, lock: Any) -> None:
        """Every part takes the same lock: one replaced here is replaced in all of them (the
        thread harness records the critical sections through its own)."""
        self.gate.lock = self.store.lock = self.recovery.lock = self.requests.lock = lock

    @property
    def changed(self) -> Any:
        return self.gate.changed

    @changed.setter
    def changed(self, changed: Any) -> None:
        self.gate.changed = changed

    # ---- the table's actions, by name (the action map) --------------------------------------
    def act(self, action: Any, *args: Any) -> Any:
        """Perform one table action by name (:data:`kvstate.impl.actions.ACTIONS` says which
        part's method): a block action's first argument is a record id, a request action's a
        slot.  :class:`CacheClosed` on a closed cache, :class:`InvalidArgument` for an unknown
        action or a bad argument, :class:`Refused` when the table's guard refuses."""
        self._live()
        fn = self._actions.get(action) if isinstance(action, str) else None
        if fn is None:
            raise InvalidArgument(f"no action {action!r} (the table's: {sorted(self._actions)})")
        if action in self._block_actions:
            if not args:
                raise InvalidArgument(f"{action} takes a record id")
            rid = args[0]
            try:
                return fn(rid if rid.__class__ is int else self.gate.rid(rid), *args[1:])
            finally:  # a load ended this way is over as a job's end is (without the lock)
                self.recovery.reads.reap_if_idle()
        return fn(*args)

    def rid(self, rid: Any) -> int:
        """A record argument of an open cache (:meth:`GuardGate.rid`)."""
        self._live()
        return self.gate.rid(rid)

    def can(self, action: Any, rid: Any) -> bool:
        """Would the block action be allowed now (jobs ask this to choose their next step)."""
        self._live()
        return self.gate.can(action, rid)

    def stats(self) -> dict[str, Any]:
        """``blocks``: the prefix blocks the cache knows (its key index), counted by the phase
        of their compressed KV; a known block whose slot was freed stays indexed as a
        *tombstone* (``blocks["tombstones"]``, the table's phase FREE) until the index needs
        room.  ``device_free`` / ``host_free``: free slots of the device and host pools.  So
        a new cache has no blocks (no tombstones either) and every device slot free."""
        with self.lock:
            counts = dict.fromkeys(_STAT_NAMES.values(), 0)
            ckv = self.meta.ckv
            for rid in self.store.index.values():
                counts[_STAT_NAMES[ckv[rid]]] += 1
            gate = self.gate
            return {
                "blocks": counts,
                "device_free": self.tiers.slots.free,
                "host_free": self.tiers.host_slots.free,
                "disk_entries": len(self.recovery.disk_entries),
                # files let go of whose unlink is in flight; files a refused unlink left behind
                "disk_unlinking": self.disk.unlinking,
                "disk_orphans": len(self.disk.orphans),
                "pinned_blocks": gate.pinned_blocks,
                "io_inflight": gate.io_inflight,
                "graph": self.graph.phase,
                "now": gate.now,
            }

    def check_tail(self, rid: Any, boundary: Any) -> bool:
        """Does the compressor state saved at the end of record ``rid`` splice at token
        ``boundary``, the record's end (a positive multiple of the block, the record's own when
        it knows its start)?  A failure marks the record corrupt; a bad argument is refused
        (InvalidArgument) before anything is read or marked."""
        rid = self.rid(rid)
        b = _int("boundary", boundary, self.L, MAX_COUNT)
        start = self.meta.start[rid]
        if b % self.L or (start >= 0 and b != start + self.L):
            raise InvalidArgument(
                f"boundary={b} is not the end of record {rid} "
                f"({'a multiple of ' + str(self.L) if start < 0 else start + self.L})"
            )
        return self.recovery.check_tail(rid, b)
