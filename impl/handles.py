"""What a cache hands out and what those handles call back into.

:class:`Request`, :class:`Admission` (with its :class:`Explanation` and :class:`Pin` entries),
:class:`Run` (the pinned block tables and data readers) and :class:`UseContext` (``with
cache.use(adm) as run``) are made by :class:`~kvstate.impl.cache.HeterogeneousKVCache`; they
call back into it through :class:`RequestPath`, the part of the cache they need: the ownership
check, decode (``append``) and completion (``finish``, ``abort``).  The cache subclasses it and
adds construction and admission, so the handles never import the module that makes them.
"""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Annotated as Checked
from typing import Any, Final, Literal, NamedTuple

import numpy as np
import torch
from mypy_extensions import mypyc_attr

from kvstate.kernels import gather_blocks
from kvstate.spec.phases import CKV, Req, Swa
from kvstate.spec.table import Table

from . import args
from .blocks import BlockStore
from .coordinator import HitSearch, Shortening
from .core import CacheCore
from .errors import (
    AlreadyReleased,
    CacheClosed,
    InvalidArgument,
    KVStateError,
    RunReleased,
    StaleAdmission,
    UnknownRequest,
    WriterFailed,
)
from .hashing import Chain, as_tokens
from .pipelines import TailCheckJob
from .projection import RecoveryPlan
from .requests import RequestTable, Slot

_ids = itertools.count(1)
# immutable: one shared empty plan for every hit that needs none
_NO_RECOVERY: Final = RecoveryPlan()
_SLOT_GROUPS: Final = ("csa", "hca", "indexer", "compressor")
# phases as plain ints: ``Swa.X`` is read off the (interpreted) enum class at run time, and
# compared to an int through the enum's rich comparison (~1k instructions a use, compiled)
_SWA_VALID: Final = int(Swa.VALID)


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
        self, cache: RequestPath, tokens: np.ndarray, namespace: str, lifetime: int
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
        cache: RequestPath,
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
        # a run is made once ``use`` moved the slot to USING; a downgraded request's pins were
        # dropped when it gave up its hit (``pinned`` 0), so the pins are the hit either way
        self.hit_tokens = slot.pinned
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
            s = self.request.slot
            raise self.cache.req_table.not_in_use(
                "use",
                s if s is self._slot else None,
                f"{what}: {self.request!r} released the pins of this run",
                RunReleased,
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
        return -(-self.hit_tokens // self.cache.L)  # ceiling

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
        cache: RequestPath,
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
                raise cache.req_table.refusal(
                    "use", None, f"{req!r} holds no slot", AlreadyReleased
                )
            if req.admissions != self.seq:
                raise cache.req_table.refusal(
                    "use", slot, f"{req!r} was admitted again", StaleAdmission
                )
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


class RequestPath:
    """The part of :class:`~kvstate.impl.cache.HeterogeneousKVCache` its handles call back
    into: the ownership check, decode and completion.  The cache's ``__init__`` sets these
    fields; it overrides ``_finalize`` (admission's, what :meth:`Admission.wait` runs)."""

    table: Table
    L: int
    max_model_len: int
    core: CacheCore
    store: BlockStore
    req_table: RequestTable
    _requests: weakref.WeakValueDictionary[int, Request]
    _closed: bool

    def _open(self) -> None:
        if self._closed:
            raise CacheClosed("the cache is closed")

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

    def _finalize(self, adm: Admission, timeout: float | None = None) -> None:
        """A pending admission whose recovery is over: validated, or truncated and re-pinned
        (the cache's admission does it)."""
        raise NotImplementedError  # pragma: no cover: abstract: the cache (impl/cache.py) defines it

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
                raise self.req_table.not_in_use("append", req.slot, f"{req!r} is not in use")
            before = req.chain.blocks
            req._extend(new)
            self._store_checked(req)
            n = req.chain.blocks
            if n == before:
                return  # no block completed: the window did not move past one
            W = self.table.consts.W
            store = self.store
            # from the first block the policy kept for the prefix's old end: its window and the
            # boundary one block earlier's (``swa_kept_blocks``: ``[before - W - 1, before)``)
            store.slide_passed(store.resolve(req.chain), max(0, before - W - 1), max(0, n - W), n)

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
            raise requests.refusal(
                "release", None, f"{req!r} was already released", AlreadyReleased
            )
        if not requests.in_use(s):
            raise requests.refusal("release", s, f"{req!r} is {Req(s.phase).name}, not in use")
        if store and req.stored < req.chain.blocks:
            try:
                self._store_checked(req)
            except BaseException:
                # the blocks stored before the failure are used like any others: the same
                # recency order as a finish that stored everything (``used_locked``)
                self._release_used(req, s)
                raise
        self._release_used(req, s)

    def _release_used(self, req: Request, s: Slot) -> None:
        rids = self.store.resolve(req.chain)
        if rids != s.rids:  # else releasing the pins moves exactly these blocks, likewise
            self.store.used_locked(rids)
        self.req_table.release_locked(s)
        req.admission = None  # released: see Request.admission

    def abort(self, request: Checked[Any, Request]) -> None:
        """Abort at any point; in-flight loads finish in their pipelines (nothing is reused
        mid-write, nothing leaks)."""
        req = self._own(request)
        with self.core.lock:  # the slot read and the abort as one step (other threads)
            s = req.slot
            if s is None:
                raise self.req_table.refusal(
                    "abort", None, f"{req!r} was already released", AlreadyReleased
                )
            self.req_table.abort(s)
            req.admission = None  # released: see Request.admission
