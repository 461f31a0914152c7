"""The library users import: a heterogeneous KV cache with verified admission.

Typical engine loop::

    cache = HeterogeneousKVCache(small(), cache_dir="/var/cache/kv")
    req = cache.request(prompt_tokens, namespace="tenant-a", lifetime=4)
    adm = cache.admit(req)              # longest valid hit, pinned, with explanation and plan
    with cache.use(adm) as run:         # pins guaranteed until the block exits
        kv = run.read_compressed("csa", 0)
        run.append(decoded_tokens)      # seal the tail, slide the window, update the indexer
    # leaving the block stores the new blocks and releases the pins (abort on exception)

``admit`` runs the spec's hit rules as data (:mod:`kvstate.impl.coordinator`) on the cache's
own metadata, takes the pins (reference counts on the hit's blocks) and validates *under* them,
recording each block's generation and address (its ``state_data_ptrs``).  A hit that needs
recovery (blocks on host or disk, a stale indexer) is pinned at the recoverable length and the
recovery jobs are started; ``use`` waits for them (threaded pipelines) or refuses with
:class:`NotReady` (manual pipelines: drive them first), then validates again and truncates to the
longest valid prefix if a load failed.  Every step is a guarded transition of
:class:`~kvstate.impl.core.CacheCore`, so the library obeys the same table the proofs check.
"""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from operator import itemgetter
from os import PathLike
from types import TracebackType
from typing import Annotated as Checked
from typing import Any, Final, Literal, NamedTuple

import numpy as np
import torch
from mypy_extensions import mypyc_attr

from kvstate.kernels import gather_blocks
from kvstate.spec.default import default_table
from kvstate.spec.errors import GeometryError
from kvstate.spec.geometry import Geometry, small
from kvstate.spec.phases import CKV, Req, Swa
from kvstate.spec.table import Table

from . import args
from .coordinator import HitSearch, Shortening
from .core import CacheCore
from .errors import (
    AlreadyReleased,
    CacheClosed,
    InvalidArgument,
    KVStateError,
    LayoutError,
    NotReady,
    Refused,
    RunReleased,
    StaleAdmission,
    UnknownRequest,
    WriterFailed,
)
from .events import Event, EventKind, EventLog
from .hashing import Chain, as_tokens
from .inspection import CacheView, TestHooks
from .pipelines import TailCheckJob
from .projection import RecoveryPlan
from .requests import Admitted, Slot
from .testdata import DeterministicWriter, Writer

_ids = itertools.count(1)
# immutable: one shared empty plan for every hit that needs none
_NO_RECOVERY: Final = RecoveryPlan()
_DEFAULT_WRITER: Final = args.Default("a new DeterministicWriter")
_SLOT_GROUPS: Final = ("csa", "hca", "indexer", "compressor")
# phases as plain ints: ``Req.X`` is read off the (interpreted) enum class at run time, and
# compared to an int through the enum's rich comparison (~1k instructions a use, compiled)
_REQ_RECOMPUTE: Final = int(Req.RECOMPUTE)
_SWA_VALID: Final = int(Swa.VALID)
MAX_MODEL_LEN: Final = 1 << 40  # no token id reaches it either (hashing.MAX_TOKEN_ID)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


class Pin(NamedTuple):
    """One entry of a request's ``state_data_ptrs``: what it was validated against.  (A named
    tuple: one is built per pinned block on every admission.)"""

    block: int
    key: bytes
    rid: int
    gen: int
    addr: int  # device slot of the compressed groups
    slot: int  # device slot held at validation (== addr for a validated block)
    bases: tuple[tuple[str, int, int], ...]  # per slot group: (name, base address, slot stride)

    @property
    def data_ptrs(self) -> dict[str, int]:
        """Group -> device address of the block's first page (layer 0), as validated."""
        return {name: base + self.slot * stride for name, base, stride in self.bases}


_FRESH: Final = args.Default("a new list")  # the field's ``default_factory=list``


@dataclass(init=False)  # the dataclasses-made __init__ runs interpreted: one per admission
class Explanation:
    """Why the hit is as long as it is: every shortening, recovery failure and rejection."""

    requested: int
    immediate: HitSearch
    after_recovery: HitSearch | None = None
    # the projected search when recovery would not lengthen the hit (e.g. under the zero SWA
    # disk policy the window does not come back from disk): why the planner gave up
    unrecoverable: HitSearch | None = None
    truncations: list[Shortening] = field(default_factory=list)
    rejection: str | None = None

    def __init__(
        self,
        requested: int,
        immediate: HitSearch,
        after_recovery: HitSearch | None = None,
        unrecoverable: HitSearch | None = None,
        truncations: Checked[Any, list[Shortening]] = _FRESH,
        rejection: str | None = None,
    ) -> None:
        """The dataclass's own fields and defaults (``truncations``: a new list each)."""
        self.requested = requested
        self.immediate = immediate
        self.after_recovery = after_recovery
        self.unrecoverable = unrecoverable
        self.truncations = [] if truncations is _FRESH else truncations
        self.rejection = rejection

    @property
    def shortenings(self) -> list[Shortening]:
        """Every cut of the final hit: the search's (after recovery, if it ran) and the
        truncations of a failed recovery."""
        final = self.after_recovery or self.immediate
        return [*final.shortenings, *self.truncations]

    def lines(self) -> list[str]:
        """The explanation as readable lines, one per cut (``str()`` joins them)."""
        out = [f"requested {self.requested} tokens"]
        out += [f"shortened: {s}" for s in self.immediate.shortenings]
        if self.after_recovery is not None:
            out.append(f"recoverable to {self.after_recovery.hit} tokens")
            out += [f"after recovery: {s}" for s in self.after_recovery.shortenings]
        if self.unrecoverable is not None:
            out.append(f"not recoverable beyond {self.immediate.hit} tokens")
            out += [f"even after recovery: {s}" for s in self.unrecoverable.shortenings]
        out += [f"truncated: {s}" for s in self.truncations]
        if self.rejection:
            out.append(f"rejected: {self.rejection}")
        return out

    def __str__(self) -> str:
        return "\n".join(self.lines())


@mypyc_attr(native_class=False)  # weakly referenced by its cache's id table
class Request:
    """A prompt in one namespace; grows with decoded tokens (``append``)."""

    def __init__(
        self, cache: HeterogeneousKVCache, tokens: np.ndarray, namespace: str, lifetime: int
    ) -> None:
        self.id = next(_ids)
        self.cache = cache
        self.owned = True  # in its cache's id table (until ``forget``)
        self.namespace = namespace
        self.lifetime = lifetime
        self.chain = Chain(tokens, cache.L, namespace)
        self.slot: Slot | None = None
        # The current admission, while the request holds a slot: a pending one is finalized
        # through it.  Dropped at release, so a finished request and its admission are freed by
        # reference counting, never left as a cycle for the garbage collector (a server's GC
        # pauses grow with every cycle left behind).  ``admissions`` numbers them: an older
        # Admission, Run or use() context is told apart by its number, not by identity.
        self.admission: Admission | None = None
        self.admissions = 0
        self.stored = 0  # chain blocks already stored (or found cached) by this request
        self._buf = np.array(tokens, dtype="<i8")
        self._n = len(tokens)

    @property
    def phase(self) -> Req:
        """The request's phase in the table (``Req.IDLE`` when it holds no slot)."""
        return Req(self.slot.phase) if self.slot is not None else Req.IDLE

    @property
    def tokens(self) -> np.ndarray:
        """The prompt and the appended tokens (read-only: the keys were computed from them)."""
        return self.chain.tokens

    def _extend(self, new: np.ndarray) -> None:
        need = self._n + len(new)
        if need > len(self._buf):
            grown = np.empty(max(need, 2 * len(self._buf), 16), dtype="<i8")
            grown[: self._n] = self._buf[: self._n]
            self._buf = grown
        self._buf[self._n : need] = new
        self._n = need
        view = self._buf[:need]
        view.flags.writeable = False
        self.chain.extend(view)
        self._buf.flags.writeable = True

    def __repr__(self) -> str:
        return f"Request(id={self.id}, tokens={self._n}, phase={self.phase.name})"


@dataclass(init=False)  # the dataclasses-made __init__ runs interpreted: one per admission
class Admission:
    """What ``admit`` gave a request: the hit (``hit_tokens``; ``state`` "validated", "pending"
    a recovery, or "downgraded" to a recompute), why it is that long (``explanation``), and
    the recovery plan a pending one waits for (``recovery``)."""

    request: Request
    requested: int
    hit_tokens: int
    state: str  # "validated" | "pending" | "downgraded"
    explanation: Explanation
    recovery: RecoveryPlan = field(default_factory=lambda: _NO_RECOVERY)
    rids: list[int] = field(default_factory=list)
    tail_check: TailCheckJob | None = None
    # the state_data_ptrs snapshot taken at validation (records, keys, generations, addresses,
    # slots); the Pin objects are built from it on first read
    _snapshot: tuple[Any, ...] | None = field(default=None, repr=False)
    _pins: tuple[Pin, ...] | None = field(default=None, repr=False)
    # which admission of its request this is (``Request.admissions``): stale once it differs
    seq: int = field(default=0, repr=False)

    def __init__(
        self,
        request: Request,
        requested: int,
        hit_tokens: int,
        state: str,
        explanation: Explanation,
        recovery: RecoveryPlan = _NO_RECOVERY,
        rids: Checked[Any, list[int]] = _FRESH,
        tail_check: TailCheckJob | None = None,
        _snapshot: tuple[Any, ...] | None = None,
        _pins: tuple[Pin, ...] | None = None,
        seq: int = 0,
    ) -> None:
        """The dataclass's own fields and defaults (``recovery``: the shared empty plan,
        ``rids``: a new list each)."""
        self.seq = seq
        self.request = request
        self.requested = requested
        self.hit_tokens = hit_tokens
        self.state = state
        self.explanation = explanation
        self.recovery = recovery
        self.rids = [] if rids is _FRESH else rids
        self.tail_check = tail_check
        self._snapshot = _snapshot
        self._pins = _pins

    @property
    def pins(self) -> tuple[Pin, ...]:
        """One :class:`Pin` per pinned block, as validated."""
        if self._pins is None:
            snap = self._snapshot
            if snap is None:
                self._pins = ()
            else:
                rids, keys, gens, addrs, slots, bases = snap
                self._pins = tuple(
                    Pin(b, keys[b] or b"", rids[b], gens[b], addrs[b], slots[b], bases)
                    for b in range(len(rids))
                )
        return self._pins

    @property
    def ready(self) -> bool:
        """Not waiting for a recovery: ``use`` will not block on this admission."""
        return self.state != "pending"

    def wait(self, timeout: Checked[Any, float | None] = None) -> Admission:
        """Block until recovery completes (threaded pipelines); then validated or truncated."""
        cache = self.request.cache
        wait = args.timeout("timeout", timeout)
        cache._own(self.request)
        cache._finalize(self, timeout=wait)
        return self


class Run:
    """What a request computes from while it is in use: pinned block tables and data readers.

    A run is valid only while its request holds the pins it was made under (inside its
    ``with use()`` block, before ``finish`` or ``abort``).  Every reader checks that *under the
    cache's lock* and reads while holding it, so a release from another thread cannot free,
    evict or overwrite a block in the middle of a read: a read either returns the validated
    bytes or raises :class:`RunReleased`.
    """

    def __init__(
        self,
        cache: HeterogeneousKVCache,
        request: Request,
        prefix: tuple[int, list[int]] | None = None,
    ) -> None:
        self.cache = cache
        self.request = request
        self._admission = request.admission  # its pins (no cycle: nothing points back)
        self._seq = request.admissions
        self._slot = request.slot
        if prefix is not None:  # a view of the first blocks of a run (see ``prefix``)
            self.hit_tokens, self.rids = prefix
            return
        slot = request.slot
        assert slot is not None
        self.hit_tokens = slot.pinned if slot.phase != _REQ_RECOMPUTE else 0
        self.rids = list(slot.rids)

    @property
    def live(self) -> bool:
        """Does the request still hold the pins this run was made under?"""
        req = self.request
        s = req.slot
        return (
            s is not None
            and s is self._slot
            and self.cache.req_table.in_use(s)
            and req.admissions == self._seq
            and not self.cache._closed
        )

    def _check(self, what: str) -> None:
        """Refuse unless live; the caller holds the core's lock (and reads under it)."""
        if not self.live:
            if self.cache._closed:
                raise CacheClosed(f"{what}: the cache is closed")
            raise RunReleased(
                "use", ("using",), f"{what}: {self.request!r} released the pins of this run"
            )

    def prefix(self, h: Checked[Any, int]) -> Run:
        """This run read as a hit of its first ``h`` tokens (whole blocks, ``h <= hit_tokens``)."""
        L = self.cache.L
        h = args.integer("h", h, 0, self.hit_tokens)
        if h % L:
            raise InvalidArgument(f"boundary {h} is not a block boundary within {self.hit_tokens}")
        with self.cache.core.lock:
            self._check("prefix")
            run = Run(self.cache, self.request, (h, self.rids[: h // L]))
            run._admission, run._seq, run._slot = self._admission, self._seq, self._slot
            return run

    @property
    def pins(self) -> tuple[Pin, ...]:
        """The pins this run was validated under (its admission's ``state_data_ptrs``)."""
        return self._admission.pins if self._admission is not None else ()

    @property
    def blocks(self) -> int:
        """How many LCM blocks the hit covers (the last may be partial)."""
        return _cdiv(self.hit_tokens, self.cache.L)

    def block_table(self) -> list[int]:
        """Device slots of the hit's blocks (full-history groups), in chain order."""
        with self.cache.core.lock:
            self._check("block_table")
            return self._block_table()

    def _block_table(self) -> list[int]:
        slot = self.cache.core.meta.slot
        return [slot[r] for r in self.rids]

    def read_compressed(
        self,
        group: Checked[Any, Literal["csa", "hca", "indexer", "compressor"]],
        layer: Checked[Any, int],
    ) -> torch.Tensor:
        """Pages ``[blocks * pages_per_block, page_bytes]`` of one layer of a slot group."""
        tiers = self.cache.core.tiers
        name = args.choice("group", group, _SLOT_GROUPS)
        grp = {
            "csa": tiers.csa,
            "hca": tiers.hca,
            "indexer": tiers.indexer,
            "compressor": tiers.compressor,
        }[name]
        li = args.index("layer", layer, grp.device_data.shape[0])
        ppl = grp.pages_per_block
        with self.cache.core.lock:
            self._check("read_compressed")
            table = torch.tensor(
                [s * ppl + i for s in self._block_table() for i in range(ppl)],
                dtype=torch.int64,
                device=grp.device_data.device,
            )
            return gather_blocks(grp.device_data[li], table, backend=self.cache.core.backend)

    def read_window(self, layer: Checked[Any, int]) -> torch.Tensor:
        """The SWA rows of positions ``[h - n_win, h)`` of model layer ``layer`` (zeros before 0)."""
        core = self.cache.core
        tiers = core.tiers
        li = args.index("layer", layer, tiers.swa.device_data.shape[0])
        with core.lock:
            self._check("read_window")
            m, h = core.meta, self.hit_tokens
            rids = core.store.resolve(self.request.chain) if h else []
            return tiers.read_window(li, rids, h, m.swa_pages, m.swa, _SWA_VALID, core.backend)

    def read_tail(self, layer: Checked[Any, int]) -> torch.Tensor:
        """The compressor state of CSA layer ``layer`` at the hit boundary, checked by the tail
        splice kernel (raises ``TailDiscontinuityError`` if it is not the state of this boundary)."""
        core = self.cache.core
        grp = core.tiers.compressor
        li = args.index("layer", layer, grp.device_data.shape[0])
        h = self.hit_tokens
        with core.lock:
            self._check("read_tail")
            if h == 0:
                return torch.zeros(grp.ring, grp.width)
            rid = grp.map(core.store.resolve(self.request.chain))[self.blocks - 1]
            state, pos = core.tiers.tail_state(li, rid, core.meta.slot[rid])  # a copy
        return grp.check(state, pos, h, core.backend)

    def verify_pins(self) -> list[str]:
        """TOCTOU check: every pinned block still holds as the table's ``toctou`` invariant says
        of a validated request -- pinned, READY, the generation and address validated (a
        diagnostic: it reads metadata only, and works on a released run too, whose blocks no
        pin holds any more)."""
        core = self.cache.core
        m = core.meta
        pins = self.pins
        with core.lock:
            if self.cache._closed:
                raise CacheClosed("verify_pins: the cache is closed")
            bad = self.cache.req_table.stale_pins(
                [p.rid for p in pins], [p.gen for p in pins], [p.addr for p in pins]
            )
            now = [
                (pins[b], m.gen[pins[b].rid], m.addr[pins[b].rid], m.ckv[pins[b].rid]) for b in bad
            ]
        return [
            f"block {p.block}: gen {p.gen}->{gen}, addr {p.addr}->{addr}, phase {CKV(ckv).name}"
            for p, gen, addr, ckv in now
        ]

    def append(self, tokens: Checked[Any, np.ndarray | torch.Tensor | Sequence[int]]) -> None:
        """Decode ``tokens`` into this run's request (see :meth:`HeterogeneousKVCache.append`);
        refused with :class:`RunReleased` once the run's pins are gone."""
        with self.cache.core.lock:
            self._check("append")
            self.cache.append(self.request, tokens)


class UseContext:
    """``with cache.use(adm) as run``: pins held until exit; finish on success, abort on error."""

    def __init__(
        self,
        cache: HeterogeneousKVCache,
        request: Request,
        store: bool,
        admission: Admission | None = None,
    ) -> None:
        self.cache = cache
        self.request = request
        self.store = store
        self.seq = request.admissions if admission is None else admission.seq
        self.run: Run | None = None

    def __enter__(self) -> Run:
        cache = self.cache
        core = cache.core
        with core.lock:
            if cache._closed:
                raise CacheClosed("use: the cache is closed")
            req = self.request
            slot = req.slot
            if slot is None:
                raise AlreadyReleased("use", ("checked",), f"{req!r} holds no slot")
            if req.admissions != self.seq:
                raise StaleAdmission("use", ("checked",), f"{req!r} was admitted again")
            cache.req_table.use_locked(slot)
            self.run = run = Run(cache, req)
            addr = core.meta.addr
            core.graph.refill(slot.index, run._block_table(), [addr[r] for r in run.rids])
        return run

    def finish(self) -> None:
        """Finish the request now (store its new blocks unless ``store=False``); exiting the
        ``with`` block afterwards does nothing more."""
        self.cache.finish(self.request, store=self.store)

    def abort(self) -> None:
        """Abort the request now, storing nothing; exiting the block afterwards does nothing."""
        self.cache.abort(self.request)

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        run = self.run
        with self.cache.core.lock:  # the check and the release as one step (other threads)
            if run is None or not run.live:
                return  # already finished or aborted (inside the block, or by another thread)
            if et is None:  # ``finish`` without taking the lock again (``store``: checked)
                cache = self.cache
                cache._finish_locked(cache._own(self.request), self.store)
            else:
                self.abort()


class HeterogeneousKVCache:
    """A verified heterogeneous KV cache (CSA, HCA, indexer, SWA and compressor groups over
    device, host and disk tiers).  See the module docstring for the request path.

    ``writer`` fills a stored block's pages (default: deterministic test content).  With
    ``writer=None`` the engine's own kernels write every group's pages, and the cache only
    tracks them; then storing a block does not derive its indexer pages either (the engine's
    indexer wrote them), unless ``derive_index=True``.  Recovery (an indexer rebuild after a
    disk load) always derives them.

    ``max_model_len`` is the longest request in tokens (default 2**20, DeepSeek-V4's context);
    it sizes the CUDA-graph block table, which always holds a request's pins whole.

    ``swa_blocks`` (default: ``Geometry.swa_pool_blocks``, the windows the device can need at
    once) is how many blocks' worth of SWA pages the device tier holds, at most
    ``device_blocks``.  A stored prefix keeps its SWA pages only at its end window and its
    checkpoints (``Geometry.swa_kept_blocks``); when the pool runs out, the least recently
    used unpinned window is slid (its prefix then hits up to an earlier kept boundary).

    ``disk_key`` (16 to 64 bytes) authenticates the disk tier's entries; by default a private
    per-directory key in ``cache_dir`` (see README, the disk tier's threat model).
    """

    def __init__(
        self,
        geometry: Checked[Any, Geometry | None] = None,
        *,
        table: Checked[Any, Table | None] = None,
        cache_dir: Checked[Any, str | PathLike[str] | None] = None,
        device: Checked[Any, str | torch.device | None] = None,
        executors: Checked[Any, Literal["threads", "manual"]] = "threads",
        max_requests: Checked[Any, int | None] = None,
        device_blocks: Checked[Any, int | None] = None,
        host_blocks: Checked[Any, int | None] = None,
        disk_blocks: Checked[Any, int | None] = None,
        writer: Checked[Any, Writer | None] = _DEFAULT_WRITER,
        kernel_backend: Checked[Any, Literal["cuda", "simulator", "torch"] | None] = None,
        memory_limit: Checked[Any, int] = 8 * 2**30,
        max_model_len: Checked[Any, int] = 1 << 20,
        durable: Checked[Any, bool] = False,
        derive_index: Checked[Any, bool | None] = None,
        disk_key: Checked[Any, bytes | bytearray | None] = None,
        swa_blocks: Checked[Any, int | None] = None,
    ) -> None:
        # every argument is checked before anything is built (InvalidArgument / LayoutError)
        self._closed = True  # until built: a half-built cache serves nothing
        if geometry is not None and not isinstance(geometry, Geometry):
            raise InvalidArgument(f"geometry must be a Geometry, got {type(geometry).__name__}")
        if table is not None and not isinstance(table, Table):
            raise InvalidArgument(f"table must be a Table, got {type(table).__name__}")
        if cache_dir is not None and not isinstance(cache_dir, (str, PathLike)):
            raise InvalidArgument(f"cache_dir must be a path, got {type(cache_dir).__name__}")
        dev = args.device(device)
        executors = args.choice("executors", executors, ("threads", "manual"))
        caps = {
            name: args.optional_integer(name, v, 1, 1 << 30)
            for name, v in (
                ("max_requests", max_requests),
                ("device_blocks", device_blocks),
                ("host_blocks", host_blocks),
                ("disk_blocks", disk_blocks),
                ("swa_blocks", swa_blocks),
            )
        }
        if (
            writer is not _DEFAULT_WRITER
            and writer is not None
            and not callable(getattr(writer, "rows", None))
        ):
            raise InvalidArgument(f"writer must be a Writer or None, got {type(writer).__name__}")
        backend = args.kernel_backend(kernel_backend)
        memory_limit = args.integer("memory_limit", memory_limit, 1, args.MAX_COUNT)
        max_model_len = args.integer("max_model_len", max_model_len, 1, MAX_MODEL_LEN)
        durable = args.flag("durable", durable)
        derive_index = args.optional_flag("derive_index", derive_index)
        if isinstance(disk_key, bytearray):
            disk_key = bytes(disk_key)
        if disk_key is not None and not isinstance(disk_key, bytes):
            raise InvalidArgument(f"disk_key must be bytes or None, got {type(disk_key).__name__}")
        try:
            if table is None:
                table = default_table(geometry or small())
            elif geometry is not None and geometry != table.geometry:
                table = table.with_geometry(geometry)
        except GeometryError as exc:
            raise LayoutError(str(exc)) from exc
        self.table = table
        self.geometry = table.geometry
        self.L = table.consts.L
        self.max_model_len = max_model_len
        self.core = CacheCore(
            table,
            device_blocks=caps["device_blocks"],
            host_blocks=caps["host_blocks"],
            disk_blocks=caps["disk_blocks"],
            device=dev,
            cache_dir=cache_dir,  # type: ignore[arg-type]  # any os.PathLike
            mode=executors,
            max_requests=caps["max_requests"],
            writer=DeterministicWriter() if writer is _DEFAULT_WRITER else writer,
            kernel_backend=backend,
            memory_limit=memory_limit,
            durable=durable,
            derive_index=derive_index,
            max_model_len=max_model_len,
            disk_key=disk_key,
            swa_blocks=caps["swa_blocks"],
        )
        self.events: EventLog = self.core.events
        self.pipelines = self.core.pipes
        # the core's parts the request path calls directly (no hop through the core)
        self.store = self.core.store
        self.recovery = self.core.recovery
        self.req_table = self.core.requests
        # weak: a request the caller dropped (after finishing it) is forgotten by itself
        self._requests: weakref.WeakValueDictionary[int, Request] = weakref.WeakValueDictionary()
        self._closed = False

    # ---- lifecycle ----------------------------------------------------------------------
    def close(self) -> None:
        """Stop the pipelines and release the cache directory (a temporary one is deleted).
        Closing twice is a no-op; every other call then raises :class:`CacheClosed`."""
        if getattr(self, "core", None) is None:
            return
        with self.core.lock:
            self._closed = True
        self.core.close()

    def _open(self) -> None:
        if self._closed:
            raise CacheClosed("the cache is closed")

    def __enter__(self) -> HeterogeneousKVCache:
        self._open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- requests -----------------------------------------------------------------------
    def chain(
        self,
        tokens: Checked[Any, np.ndarray | torch.Tensor | Sequence[int]],
        namespace: Checked[Any, str] = "",
    ) -> Chain:
        """The chained per-block prefix keys of ``tokens`` in ``namespace``, without a request
        (what :meth:`register` takes, and what an engine's router compares)."""
        self._open()
        namespace = args.text("namespace", namespace)
        return Chain(as_tokens(tokens, max_len=self.max_model_len), self.L, namespace)

    def request(
        self,
        tokens: Checked[Any, np.ndarray | torch.Tensor | Sequence[int]],
        *,
        namespace: Checked[Any, str] = "",
        lifetime: Checked[Any, int | None] = None,
    ) -> Request:
        """A new request; ``lifetime`` (ticks it will live, default ``lease_max``) sets its
        deadline when admitted, which every block's residency lease must cover (layer L1).
        The tokens are copied: the caller may reuse its buffer at once."""
        self._open()
        life = (
            self.table.consts.lease_max
            if lifetime is None
            else args.integer("lifetime", lifetime, 1, args.MAX_COUNT)
        )
        namespace = args.text("namespace", namespace)
        req = Request(self, as_tokens(tokens, max_len=self.max_model_len), namespace, life)
        self._requests[req.id] = req
        return req

    def get_request(self, request_id: Checked[Any, int]) -> Request:
        """The live request with this ``Request.id`` (:class:`UnknownRequest` otherwise)."""
        self._open()
        rid = args.integer("request_id", request_id)
        req = self._requests.get(rid)
        if req is None:
            raise UnknownRequest(f"unknown request id {rid!r}")
        return req

    def _own(self, request: Any) -> Request:
        # a Request is made by one cache (``request()``) and stays in its id table until
        # ``forget``: the two fields say so without a lookup in the weak table
        if request.__class__ is not Request or request.cache is not self or not request.owned:
            if not isinstance(request, Request):
                raise InvalidArgument(f"expected a Request, got {type(request).__name__}")
            if self._requests.get(request.id) is not request:
                raise UnknownRequest(f"{request!r} does not belong to this cache")
        if self._closed:
            raise CacheClosed("the cache is closed")
        return request

    def register(self, chain: Checked[Any, Chain]) -> list[int]:
        """Pre-register a prefix's blocks (records with reserved device slots; see core)."""
        self._open()
        if not isinstance(chain, Chain) or chain.block_tokens != self.L:
            raise InvalidArgument(f"expected a Chain of this cache (see chain()), got {chain!r}")
        return self.store.register(chain)

    def max_hit(self, request: Checked[Any, Request]) -> int:
        """The longest hit a request could use: every token but the last, which is computed for
        the logits.  The search cuts it to whole LCM blocks (and says so: L1.lcm_aligned)."""
        return max(len(self._own(request).tokens) - 1, 0)

    def admit(
        self, request: Checked[Any, Request], *, recover: Checked[Any, bool] = True
    ) -> Admission:
        """Longest valid hit for ``request``: pinned, validated (or recovering), explained."""
        req = self._own(request)
        recover = args.flag("recover", recover)
        requests = self.req_table
        with self.core.lock:
            if req.slot is not None:
                raise Refused("admit", ("idle",), f"{req!r} is already admitted")
            h_max = self.max_hit(req)
            # the admission, one transaction of the request table (``t``: checked by request())
            got = requests.admit_locked(
                req, req.lifetime, h_max, min(req.lifetime, self.table.consts.lease_max), recover
            )
            s = got.slot
            try:
                return self._admitted(req, h_max, got)
            except BaseException:
                if req.slot is s and requests.abortable(s):
                    requests.abort(s)
                raise

    def _admitted(self, req: Request, h_max: int, got: Admitted) -> Admission:
        """The façade's side of an admission: the explanation, the Admission, and (with a
        recovery plan) the wait for it set up."""
        expl = Explanation(h_max, got.immediate)
        ext = got.projected
        if ext is not None:
            if got.plan.steps:  # (not ``if got.plan``: its __bool__ runs interpreted)
                expl.after_recovery = ext
            else:
                expl.unrecoverable = ext
        if got.rejection is not None:
            expl.rejection = got.rejection
            req.admissions += 1
            adm = Admission(req, h_max, 0, "downgraded", expl, seq=req.admissions)
            req.admission = adm
            return adm
        req.admissions += 1
        adm = Admission(
            req, h_max, got.target, "pending", expl, got.plan, rids=got.rids, seq=req.admissions
        )
        req.admission = adm
        if got.plan.steps:
            adm.tail_check = got.tail_check
            if not self._pending(adm):
                self._finalize(adm)
        else:
            self._validated(adm)
        return adm

    def _pending(self, adm: Admission) -> bool:
        return self.recovery.recovery_pending(adm.recovery.steps, adm.tail_check)

    def _finalize(self, adm: Admission, timeout: float | None = None) -> None:
        """A pending admission whose recovery is over: validate, or truncate and re-pin."""
        core = self.core
        with core.lock:
            if adm.state != "pending":
                return
            if core.pipes.mode == "threads":
                if not core.gate.wait_changed(lambda: not self._pending(adm), timeout):
                    raise NotReady("use", (), "recovery still running after the timeout")
            elif self._pending(adm):
                raise NotReady("use", (), "recovery jobs are queued: drive the manual pipelines")
            s = adm.request.slot
            bad = ["released"] if s is None else self.req_table.unvalidatable(s)
            if bad:
                raise Refused("use", tuple(bad), f"{adm.request!r} is no longer pinned")
            assert s is not None
            rids = core.store.resolve(adm.request.chain)
            tc = adm.tail_check
            if tc is None or tc.ok is not False:
                try:
                    self.req_table.validate(s, rids)
                    self._validated(adm)
                    return
                except Refused:
                    pass
            cap = adm.hit_tokens
            if tc is not None and tc.ok is False:
                cap = min(cap, (_cdiv(adm.hit_tokens, self.L) - 1) * self.L)
            # the truncation, one transaction: the longest valid hit within ``cap``, re-pinned
            found, why = self.req_table.truncate(s, cap, rids)
            adm.explanation.truncations.append(
                Shortening(
                    "recovery",
                    "L3",
                    "On-disk Prefix",
                    "disk",
                    None,
                    adm.hit_tokens,
                    found.hit,
                    "a recovery job failed; truncated to the longest valid prefix, the rest is recomputed",
                )
            )
            adm.explanation.truncations.extend(found.shortenings)
            if why is not None:
                # not even the truncated hit passes now (e.g. the request's deadline ran out
                # while it waited, so no lease covers it: L1.lease_covers): the request table
                # downgraded it to a recompute, as the table's ``downgrade`` allows for a
                # failed load, instead of refusing with the request left pinned
                self._gave_up(adm, f"after a failed recovery: {why}")
                return
            adm.hit_tokens = found.hit
            self._validated(adm)

    def _gave_up(self, adm: Admission, why: str) -> None:
        """A re-admitted request was downgraded to a recompute (hit 0, nothing pinned)."""
        adm.explanation.rejection = why
        adm.hit_tokens = 0
        adm.state = "downgraded"
        adm.rids = []
        adm._snapshot = None
        adm._pins = None

    def _validated(self, adm: Admission) -> None:
        core = self.core
        m = core.meta
        s = adm.request.slot
        assert s is not None
        held = tuple(s.rids)
        cols: tuple[Any, ...]
        if len(held) > 1:
            g = itemgetter(*held)
            cols = (g(m.key), g(m.gen), g(m.addr), g(m.slot))
        elif held:
            (i,) = held
            cols = ((m.key[i],), (m.gen[i],), (m.addr[i],), (m.slot[i],))
        else:
            cols = ((), (), (), ())
        adm._snapshot = (held, *cols, core.tiers.slot_bases)
        adm._pins = None
        adm.hit_tokens = s.hit
        adm.state = "validated"
        req = adm.request
        req.stored = max(req.stored, len(s.rids))  # found cached: nothing to store for them

    def use(
        self,
        admission: Checked[Any, Admission | Request],
        *,
        store: Checked[Any, bool] = True,
        timeout: Checked[Any, float | None] = 30.0,
    ) -> UseContext:
        """Context manager: the request computes from its pinned hit inside the block.

        ``admission`` is the request's current :class:`Admission` (an older one, from before
        the request was admitted again, raises :class:`StaleAdmission`) or the request itself.
        A pending admission is finalized first (waiting up to ``timeout`` seconds, None: as
        long as it takes): validated, truncated after a failed recovery, or, when not even the
        truncated hit passes, downgraded to a recompute (``state == "downgraded"``)."""
        if isinstance(admission, Admission):
            req = self._own(admission.request)
            if req.admissions != admission.seq:
                raise StaleAdmission("use", ("checked",), f"{req!r} was admitted again since")
            adm: Admission | None = admission
        else:
            req = self._own(admission)
            adm = req.admission
        store = args.flag("store", store)
        wait = args.timeout("timeout", timeout) if timeout is not None else None
        if adm is not None and adm.state == "pending" and req.slot is not None:
            self._finalize(adm, timeout=wait)
        return UseContext(self, req, store, adm)

    # ---- decode and completion ------------------------------------------------------------
    def append(
        self,
        request: Checked[Any, Request],
        tokens: Checked[Any, np.ndarray | torch.Tensor | Sequence[int]],
    ) -> None:
        """Decode ``tokens``: completed blocks are stored (committed, indexed, tail sealed) and
        blocks that left the sliding window are slid to the null block, except the windows
        of checkpoint boundaries (:meth:`Geometry.swa_kept`, the store's policy)."""
        req = self._own(request)
        new = as_tokens(tokens, max_len=self.max_model_len - len(req.tokens))
        core = self.core
        with core.lock:
            if req.slot is None or not self.req_table.in_use(req.slot):
                raise Refused("append", ("using",), f"{req!r} is not in use")
            before = req.chain.blocks
            req._extend(new)
            self._store_checked(req)
            n = req.chain.blocks
            if n == before:
                return  # no block completed: the window did not move past one
            W = self.table.consts.W
            store = self.store
            store.slide_passed(store.resolve(req.chain), max(0, before - W), max(0, n - W), n)

    def _store(self, req: Request) -> None:
        """Store the request's full blocks not cached yet (dedup: a block another request
        already stored is left alone): one run (``CacheCore.store_run``), whose blocks outside
        the window policy's (the last window of the request's length, the checkpoints') are
        slid as they are stored.  The caller holds the core's lock."""
        chain, L = req.chain, self.L
        ticks = min(req.lifetime, self.table.consts.lease_max)
        keys = chain.keys
        run: list[tuple[bytes, np.ndarray | None, int]]
        if self.store.writer is None:  # the engine writes the pages: no record needs its tokens
            run = [(keys[k], None, k * L) for k in range(req.stored, chain.blocks)]
        else:
            run = [
                (keys[k], chain.block_tokens_of(k), k * L) for k in range(req.stored, chain.blocks)
            ]
        self.store.store_run(run, ticks, chain.blocks)
        req.stored = chain.blocks

    def _store_checked(self, req: Request) -> None:
        """``_store``, with a writer's exception reported as :class:`WriterFailed` (the
        failing block discarded, the ones before it stored)."""
        try:
            self._store(req)
        except KVStateError:
            raise
        except Exception as exc:
            err = WriterFailed(f"storing {req!r}: the writer raised {exc!r}")
            err.__cause__ = exc  # (set by hand: compiled code drops ``raise ... from``)
            raise err from exc

    def finish(self, request: Checked[Any, Request], *, store: Checked[Any, bool] = True) -> None:
        """The request is done: store its new blocks and release its pins.  If storing fails
        (:class:`WriterFailed`, or no device room left) the pins are released all the same."""
        req = self._own(request)
        store = args.flag("store", store)
        with self.core.lock:
            self._finish_locked(req, store)

    def _finish_locked(self, req: Request, store: bool) -> None:
        """:meth:`finish` of a checked request for a caller that holds the lock (a ``use``
        block's exit: taking the reentrant lock again costs ~1k instructions)."""
        requests = self.req_table
        s = req.slot
        if s is None:
            raise AlreadyReleased("release", ("using",), f"{req!r} was already released")
        if not requests.in_use(s):
            raise Refused("release", ("using",), f"{req!r} is {Req(s.phase).name}, not in use")
        if store and req.stored < req.chain.blocks:
            try:
                self._store_checked(req)
            except BaseException:
                requests.release_locked(s)
                req.admission = None  # released: see Request.admission
                raise
        rids = self.store.resolve(req.chain)
        if rids != s.rids:  # else releasing the pins moves exactly these blocks, likewise
            self.store.used_locked(rids)
        requests.release_locked(s)
        req.admission = None

    def abort(self, request: Checked[Any, Request]) -> None:
        """Abort at any point; in-flight loads finish in their pipelines (nothing is reused
        mid-write, nothing leaks)."""
        req = self._own(request)
        with self.core.lock:  # the slot read and the abort as one step (other threads)
            s = req.slot
            if s is None:
                raise AlreadyReleased("abort", ("active",), f"{req!r} was already released")
            self.req_table.abort(s)
            req.admission = None  # released: see Request.admission

    # ---- time, maintenance ----------------------------------------------------------------
    def tick(self, ticks: Checked[Any, int] = 1) -> None:
        """Advance the cache's clock: leases and request deadlines are counted in ticks, so a
        block becomes evictable only once the lease covering its last reader has run out."""
        self._open()
        self.core.gate.tick(args.integer("ticks", ticks, 1, args.MAX_COUNT))

    def evict(self, n: Checked[Any, int] = 1) -> int:
        """Evict up to ``n`` least recently used unpinned, lease-expired device blocks."""
        self._open()
        n = args.integer("n", n, 0)
        done = 0
        with self.core.lock:
            while done < n and self.store.evict_one():
                done += 1
        return done

    def offload(self, n: Checked[Any, int] = 1) -> int:
        """Start offloading up to ``n`` LRU device blocks to host (DMA pipeline)."""
        self._open()
        n = args.integer("n", n, 0)
        return self.recovery.offload_some(n)

    def spill(self, n: Checked[Any, int] = 1) -> int:
        """Write up to ``n`` LRU host blocks to disk."""
        self._open()
        return self.recovery.spill_some(args.integer("n", n, 0))

    def drop(self, n: Checked[Any, int] = 1) -> int:
        """Delete up to ``n`` LRU (or corrupt) host/disk entries whose lease expired."""
        self._open()
        n = args.integer("n", n, 0)
        return self.recovery.drop_some(n)

    def stats(self) -> dict[str, Any]:
        """A snapshot of the pools, tiers, pipelines and counters, for monitoring."""
        self._open()
        return self.core.stats()

    def inspect(self) -> CacheView:
        """A read-only, live view of the cache's state for checkers and tests: the block
        metadata by record, the request slots, pools, disk entries, pipeline jobs
        (:class:`~kvstate.impl.inspection.CacheView`).  Reading through it never changes the
        cache; hold ``view.lock`` to read several things at one instant.  A view taken while
        the cache was open reads on after ``close`` (what it left behind)."""
        self._open()
        return CacheView(self.core)

    def test_hooks(self) -> TestHooks:
        """The seams tests and checkers inject faults through (one table action by name, a
        job step, the disk tier's read or write replaced, a crash:
        :class:`~kvstate.impl.inspection.TestHooks`).  A server never needs them."""
        self._open()
        return TestHooks(self.core, lambda req, store: self._finish_locked(self._own(req), store))

    def events_of(self, kind: Checked[Any, EventKind]) -> list[Event]:
        """The logged events of one kind, oldest first (``events.subscribe`` for a stream)."""
        self._open()
        if not isinstance(kind, EventKind):
            raise InvalidArgument(f"kind must be an EventKind, got {kind!r}")
        return self.events.of(kind)

    def requests(self) -> Iterator[Request]:
        """The requests this cache knows (a copy: the caller may finish them while iterating)."""
        self._open()
        return iter(list(self._requests.values()))

    def forget(self, request: Checked[Any, Request]) -> None:
        """Drop a finished request from the id table (its slot must be released)."""
        req = self._own(request)
        if req.slot is not None:
            raise Refused("forget", (), f"{req!r} still holds a slot")
        del self._requests[req.id]
        req.owned = False
