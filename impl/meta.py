"""Per-block metadata (struct of arrays) and the read-only view the table's callables read.

Each cached LCM block is a *record* (an integer ``rid``) whose fields live in parallel Python
lists, one per variable.  Record 0 is the null record: it stands for a block no one has stored
(an unknown key), is FREE forever and is never allocated, so a chain can be viewed without
branching on "is it cached?".

:class:`ChainView` presents the records of one chain in exactly the shape of
:class:`kvstate.spec.state.ConcreteState` (``s.ckv[b]``, ``s.req(r).deadline``, ``s.k``,
``s.forall_blocks``), so the spec's guard conjuncts and hit rules run unchanged on the
implementation's own state.  Columns are gathered lazily, on first access, so a view costs only
the columns a rule actually reads.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from operator import itemgetter
from typing import Any, Final

import numpy as np
from mypy_extensions import mypyc_attr

from .errors import InternalError
from .phasecodes import (
    CKV_FREE,
    FMT_PRIMARY,
    IDX_ABSENT,
    PIPE_NONE,
    REQ_IDLE,
    REQ_PINNED,
    SWA_NULL,
    TAIL_NONE,
)

VIEW_FIELDS: tuple[str, ...] = (
    "ckv", "gen", "ref", "ver", "idx", "iver", "tail", "swa", "lease",
    "addr", "gaddr", "prog", "fmt", "ldpipe", "ixpipe",
)  # fmt: skip

NULL_RID: Final = 0


class BlockMeta:
    """Parallel lists indexed by record id; grown on demand, ids of purged records reused."""

    def __init__(self, load_steps: int) -> None:
        self.load_steps = load_steps
        # the abstract state (names as in the table)
        self.ckv: list[int] = []
        self.gen: list[int] = []
        self.ref: list[int] = []
        self.ver: list[int] = []
        self.idx: list[int] = []
        self.iver: list[int] = []
        self.tail: list[int] = []
        self.swa: list[int] = []
        self.lease: list[int] = []
        self.addr: list[int] = []  # device slot of the compressed groups (last one, if released)
        self.gaddr: list[int] = []  # address the captured graph recorded
        self.prog: list[int] = []
        self.fmt: list[int] = []
        self.ldpipe: list[int] = []
        self.ixpipe: list[int] = []
        # implementation-only
        self.slot: list[int] = []  # device slot currently held (-1: none)
        self.hslot: list[int] = []  # host slot (-1: none)
        self.swa_pages: list[tuple[int, ...]] = []  # device SWA pages (empty: the null block)
        self.on_disk: list[bool] = []
        self.disk_fmt: list[int] = []
        self.corrupt: list[bool] = []
        self.key: list[bytes | None] = []
        self.tokens: list[np.ndarray | None] = []
        self.start: list[int] = []
        self._free: list[int] = []
        self.new(None, None, -1)  # the null record

    def check_columns(self, table: Any) -> None:
        """The columns are spelled out above for speed (typed attributes, one append each), so
        they are bound to the table here: exactly its non-ghost block variables, and a new
        record starts in each phase variable's initial phase.  (Numbers such as ``addr`` are
        the implementation's own: a new record has no slot yet.)"""
        from kvstate.spec.state import initial_state
        from kvstate.spec.table import Scope

        from .errors import InvalidArgument

        block = [v for v in table.vars if v.scope is Scope.BLOCK and not v.ghost]
        names = {v.name for v in block}
        if names != set(VIEW_FIELDS):
            raise InvalidArgument(
                f"table {table.name!r}: block variables {sorted(names ^ set(VIEW_FIELDS))} differ "
                "from the implementation's block metadata"
            )
        init = initial_state(table, 2)
        probe = BlockMeta(self.load_steps)
        rid = probe.new(None, None, 0)
        for v in block:
            want, got = getattr(init, v.name)[1], getattr(probe, v.name)[rid]
            if v.domain is not None and want != got:
                raise InvalidArgument(
                    f"table {table.name!r}: {v.name} starts at {v.domain(want).name}, the "
                    f"implementation's new record at {got}"
                )

    def __len__(self) -> int:
        return len(self.ckv)

    def new(self, key: bytes | None, tokens: np.ndarray | None, start: int) -> int:
        if self._free:
            rid = self._free.pop()
            self.key[rid], self.tokens[rid], self.start[rid] = key, tokens, start
            self.corrupt[rid] = False
            self.disk_fmt[rid] = FMT_PRIMARY
            return rid
        rid = len(self.ckv)
        # one append per column, spelled out: a loop over (name, value) pairs with getattr
        # costs ~30k instructions per record in the compiled build, this a few hundred
        self.ckv.append(CKV_FREE)
        self.gen.append(0)
        self.ref.append(0)
        self.ver.append(0)
        self.idx.append(IDX_ABSENT)
        self.iver.append(0)
        self.tail.append(TAIL_NONE)
        self.swa.append(SWA_NULL)
        self.lease.append(0)
        self.addr.append(-1)
        self.gaddr.append(-1)
        self.prog.append(self.load_steps)
        self.fmt.append(FMT_PRIMARY)
        self.ldpipe.append(PIPE_NONE)
        self.ixpipe.append(PIPE_NONE)
        self.slot.append(-1)
        self.hslot.append(-1)
        self.swa_pages.append(())
        self.on_disk.append(False)
        self.disk_fmt.append(FMT_PRIMARY)
        self.corrupt.append(False)
        self.key.append(key)
        self.tokens.append(tokens)
        self.start.append(start)
        return rid

    def retire(self, rid: int) -> None:
        """Forget a FREE record (a tombstone); its id (and generation counter) is reused."""
        if rid == NULL_RID or self.ckv[rid] != CKV_FREE or self.ref[rid]:
            raise InternalError(  # pragma: no cover: purge_tombstones retires only tombstones
                f"retiring record {rid} that is not a free tombstone"
            )
        self.key[rid] = None
        self.tokens[rid] = None
        self._free.append(rid)


@mypyc_attr(native_class=False)  # columns set by name
class RecordState:
    """The whole metadata in the table's state shape, indexed by *record id*: every column is
    the live list itself.  A guard whose compiled term reads block variables only at its block
    parameter (``"block"``/``"global"`` locality, :mod:`kvstate.impl.fastforms`) evaluates on it
    with ``b`` = the record id exactly as on a one-block view, without building one; the
    scalars are read from ``source`` (the cache core) when the guard asks."""

    _direct = False  # record-indexed already: the plain compiled forms read it as it is

    def __init__(self, meta: BlockMeta, source: Any) -> None:
        for name in VIEW_FIELDS:
            setattr(self, name, getattr(meta, name))
        self._src = source
        self.k = getattr(source, "vk", None)

    @property
    def now(self) -> int:
        return int(self._src.now)

    @property
    def graph(self) -> int:
        return int(self._src.graph.phase)

    @property
    def io_inflight(self) -> int:
        return int(self._src.io_inflight)

    def req(self, r: int) -> Any:  # pragma: no cover: only guards that read no request get one
        raise InternalError("a record-indexed state has no requests: build a view")


class SlotState:
    """One request slot as the only request of a state (``req(0)``), for guards of ``"slot"``
    locality (they read nothing but the acting request's own fields)."""

    __slots__ = ("_slot",)
    _direct = False

    def __init__(self, slot: Any) -> None:
        self._slot = slot

    def req(self, r: int) -> Any:
        if r != 0:  # pragma: no cover: only guards that read the acting request alone get one
            raise InternalError("a slot state has only the acting request: build a view")
        return self._slot


class Others:
    """All requests but the acting one, aggregated: the request dimension of a view.

    The table reads other requests only through ``pinned_blocks_total`` (a sum of
    ``cdiv(pinned, L)``); one aggregate whose ``pinned`` is ``L * (their pinned blocks)`` gives the
    same sum in O(1), where a loop over every request slot would cost O(max_requests) per pin.
    """

    __slots__ = ("pinned", "hit", "phase", "deadline", "pgen", "paddr")

    def __init__(self, pinned_tokens: int) -> None:
        self.pinned = pinned_tokens
        self.hit = pinned_tokens
        self.phase = REQ_PINNED if pinned_tokens else REQ_IDLE
        self.deadline = 0
        self.pgen: tuple[int, ...] = ()
        self.paddr: tuple[int, ...] = ()


@mypyc_attr(native_class=False)  # a descriptor caching into the view's __dict__
class _Column:
    """A view column, gathered on first read and then cached in the instance (a non-data
    descriptor, so later reads are plain instance-dict lookups).  A class-level descriptor costs
    a fraction of ``__getattr__``, which Python only reaches after a failed lookup."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __get__(self, view: Any, owner: Any = None) -> Any:
        if view is None:  # pragma: no cover: read off the class (introspection: help(ChainView))
            return self
        name = self.name
        build = view._over.get(name)
        if build is not None:
            col = build(view.rids)
        else:
            arr = getattr(view.meta, name)
            rids = view.rids_of(name)
            if len(rids) > 1:  # one C call per column
                gather: Callable[[Any], Any] | None = None
                if rids is view.rids:
                    gather = view._gather
                    if gather is None:  # built on the first gathered column, kept for the rest
                        gather = view._gather = itemgetter(*rids)
                else:
                    gather = itemgetter(*rids)
                col = gather(arr)
            else:
                col = tuple(arr[i] for i in rids)
        view.__dict__[name] = col
        view._cached.append(name)
        return col


@mypyc_attr(native_class=False)  # columns are class descriptors (below)
class ChainView:
    """Read-only ConcreteState-shaped view of a chain of records (block ``b`` -> ``rids[b]``).

    Columns are gathered from the metadata on first read.  ``maps`` names columns a group
    manager reads through its own block mapping (``rids -> rids``: the SWA window's and the
    compressor's), ``overrides`` replaces a column with a builder ``rids -> list`` (a projected
    recovery state).  A view without overrides is *direct*: the compiled direct forms
    (:mod:`kvstate.impl.fastforms`) read the live lists ``meta.X`` through ``rids`` /
    ``rids_of(X)`` instead of gathering columns: ``meta`` (the block metadata) and ``rids`` (the
    chain's record ids, by position) are the view's public reading surface for generated code.
    (No table variable can shadow them: ``BlockMeta.check_columns`` admits only its columns.)

    A view is made per admission (about 8k instructions, mostly the call of a non-native
    class), so its own fields are slots: no instance dict is made or grown for them.  The
    ``__dict__`` slot holds the gathered columns only, made on the first one (a direct view's
    forms never gather).
    """

    __slots__ = (
        "meta", "rids", "_gather", "_over", "_maps", "_direct", "_cached", "_reqs",
        "N", "k", "now", "graph", "io_inflight", "nfree", "req", "__dict__",
    )  # fmt: skip
    # ``req(r)``: the requests' own ``__getitem__``, bound at construction.  The generated
    # guards and search call ``v.req(n)`` per request they read (several per admission); a
    # method of this (non-native) class costs ~1k instructions a call from compiled code, a
    # bound C method a fraction of it
    req: Callable[[int], Any]

    def __init__(
        self,
        meta: BlockMeta,
        rids: Sequence[int],
        k: Any,
        now: int,
        graph: int,
        io_inflight: int,
        nfree: int = 0,
        reqs: Sequence[Any] = (),
        overrides: dict[str, Callable[[Sequence[int]], list[Any]]] | None = None,
        maps: dict[str, Callable[[Sequence[int]], Sequence[int]]] | None = None,
    ) -> None:
        self.meta = meta
        self.rids = rids
        # built on first use (``_Column``): the direct forms of a direct view never gather
        self._gather: Callable[[Any], Any] | None = None
        self._over = overrides or {}
        self._maps = maps or {}
        self._direct = not overrides
        self._cached: list[str] = []  # gathered columns (snapshots), dropped by refresh()
        self._reqs = reqs
        self.req = reqs.__getitem__
        self.N = len(rids)
        self.k = k
        self.now = now
        self.graph = graph
        self.io_inflight = io_inflight
        self.nfree = nfree

    # (no ``__getattr__`` for a friendlier message: defining one makes every attribute read of
    # the generated guards and search, which read the view from interpreted code, go through
    # Python's slower lookup hook; an unknown name still raises AttributeError)

    def refresh(self) -> None:
        """Forget gathered columns: the metadata changed under a view that is kept (one view
        serves the steps of an admission; the direct forms read live lists anyway)."""
        d = self.__dict__
        for name in self._cached:
            d.pop(name, None)
        self._cached.clear()

    def rids_of(self, column: str) -> Sequence[int]:
        """The records column ``column`` is read from, by chain position."""
        m = self._maps.get(column)
        return self.rids if m is None else m(self.rids)

    def forall_blocks(self, lo: Any, hi: Any, body: Callable[[Any], Any]) -> bool:
        for b in range(max(lo, 0), min(hi, self.N)):
            if not body(b):
                return False
        return True

    def array(self, body: Callable[[Any], Any]) -> Any:  # pragma: no cover: guards build no array
        raise TypeError("a ChainView is read-only: the implementation applies its own updates")

    def store(  # pragma: no cover: updates never run on a view (impl applies its own)
        self, arr: Any, index: Any, value: Any
    ) -> Any:
        raise TypeError("a ChainView is read-only: the implementation applies its own updates")


for _name in VIEW_FIELDS:
    setattr(ChainView, _name, _Column(_name))
del _name
