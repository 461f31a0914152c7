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
The handles it gives out (:class:`Request`, :class:`Admission`, :class:`Run`, :class:`UseContext`)
and its decode and completion path are in :mod:`kvstate.impl.handles`.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator, Sequence
from operator import itemgetter
from os import PathLike
from typing import Annotated as Checked
from typing import Any, Final, Literal

import numpy as np
import torch

from kvstate.spec.default import default_table
from kvstate.spec.errors import GeometryError
from kvstate.spec.geometry import Geometry, small
from kvstate.spec.table import Table

from . import args
from .core import CacheCore
from .errors import (
    InvalidArgument,
    LayoutError,
    NotReady,
    Refused,
    StaleAdmission,
    UnknownRequest,
)
from .events import Event, EventKind, EventLog
from .handles import Admission, Explanation, Pin, Request, RequestPath, Run, UseContext
from .hashing import Chain, as_tokens
from .inspection import CacheView, TestHooks
from .remote import RemoteConfig
from .requests import Admitted
from .writer import HandedRows, Writer

__all__ = [
    "MAX_MODEL_LEN", "Admission", "Explanation", "HeterogeneousKVCache", "Pin", "Request", "Run",
    "UseContext",
]  # fmt: skip

_DEFAULT_WRITER: Final = args.Default("a new HandedRows")
MAX_MODEL_LEN: Final = 1 << 40  # no token id reaches it either (hashing.MAX_TOKEN_ID)


class HeterogeneousKVCache(RequestPath):
    """A verified heterogeneous KV cache (CSA, HCA, indexer, SWA and compressor groups over
    device, host and disk tiers).  See the module docstring for the request path.

    ``writer`` fills a stored block's pages (default: a new :class:`~kvstate.impl.writer.
    HandedRows`, which stores the rows its caller computed and handed over, nothing else; tests
    pass :class:`~kvstate.impl.testdata.DeterministicWriter`, content they can check).  With
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

    ``remote`` (a :class:`RemoteConfig`) keeps the offloaded blocks in a store a fleet shares
    (Redis) instead of ``cache_dir``: the same entries, loads and checks (docs/remote.md).
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
        remote: Checked[Any, RemoteConfig | None] = None,
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
        if remote is not None and not isinstance(remote, RemoteConfig):
            raise InvalidArgument(
                f"remote must be a RemoteConfig or None, got {type(remote).__name__}"
            )
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
            writer=HandedRows() if writer is _DEFAULT_WRITER else writer,
            kernel_backend=backend,
            memory_limit=memory_limit,
            durable=durable,
            derive_index=derive_index,
            max_model_len=max_model_len,
            disk_key=disk_key,
            swa_blocks=caps["swa_blocks"],
            remote=remote,
        )
        self.events: EventLog = self.core.events
        self.pipelines = self.core.pipes
        # the core's parts the request path calls directly (no hop through the core)
        self.store = self.core.store
        self.recovery = self.core.recovery
        self.req_table = self.core.requests
        # weak: a request the caller dropped (after finishing it) is forgotten by itself
        self._requests = weakref.WeakValueDictionary()
        self._closed = False

    # ---- lifecycle ----------------------------------------------------------------------
    def close(self) -> None:
        """Stop the pipelines and release the cache directory (a temporary one is deleted).
        Closing twice is a no-op; every other call then raises :class:`CacheClosed`."""
        if getattr(self, "core", None) is None:  # pragma: no cover: no caller holds a failed init
            return
        with self.core.lock:
            self._closed = True
        self.core.close()

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
                raise requests.refusal("admit", req.slot, f"{req!r} is already admitted")
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
            # the truncation, one transaction: the longest valid hit, re-pinned, and its cut
            found, cut, why = self.req_table.truncate(
                s, adm.hit_tokens, rids, tc is not None and tc.ok is False
            )
            adm.explanation.truncations.append(cut)
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
                raise self.req_table.refusal(
                    "use", req.slot, f"{req!r} was admitted again since", StaleAdmission
                )
            adm: Admission | None = admission
        else:
            req = self._own(admission)
            adm = req.admission
        store = args.flag("store", store)
        wait = args.timeout("timeout", timeout) if timeout is not None else None
        if adm is not None and adm.state == "pending" and req.slot is not None:
            self._finalize(adm, timeout=wait)
        return UseContext(self, req, store, adm)

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
