"""The request table: slots, pins, validation, use and release (the table's Request actions).

Each request occupies a :class:`Slot` holding the table's per-request variables.  The pins (a
reference count on each block of the hit) are what keeps a validated hit's blocks from being
evicted, and ``validate`` records each block's generation and address (its ``state_data_ptrs``)
under them; :meth:`RequestTable.validate_checked` is the one place that snapshot is taken.

:meth:`RequestTable.admit_locked` is a whole admission as one transaction under one hold of the
lock: admit, the hit search (and the search on the state recovery would produce), match, pin,
validate or start the recovery.  The façade calls it once and only dresses the result.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

import numpy as np

from kvstate.spec.table import Table

from .args import MAX_COUNT
from .args import integer as _int
from .blocks import BlockStore
from .coordinator import HitSearch, Shortening, failed_recovery, recovery_cut
from .errors import (
    AlreadyReleased,
    InternalError,
    InvalidArgument,
    OutOfCapacity,
    Refused,
    UnknownRequest,
)
from .events import EventKind, EventLog
from .gate import GuardGate
from .meta import NULL_RID, ChainView, SlotState
from .phasecodes import (
    REQ_IDLE,
    REQ_MATCHED,
    REQ_PINNED,
    REQ_RECOMPUTE,
    REQ_USING,
    REQ_VALIDATED,
    REQ_WAITING,
)
from .pipelines import TailCheckJob
from .projection import Projector, RecoveryPlan, Trace
from .recovery import Recovery
from .tiers import Tiers

# (``Final``: C statics in the compiled build, see phasecodes.py)
_ACTING: Final = {"r": 0}  # a guard's parameters on a slot or view: the acting request is r = 0
# immutable: one shared empty plan for every hit that needs none
_NO_RECOVERY: Final = RecoveryPlan()


class Slot:
    """One request slot: the table's per-request variables, and the request occupying it."""

    __slots__ = (
        "index", "phase", "hit", "pinned", "deadline", "pgen", "paddr", "request", "rids", "state",
    )  # fmt: skip

    def __init__(self, index: int) -> None:
        self.index = index
        self.phase = REQ_IDLE
        self.hit = 0
        self.pinned = 0
        self.deadline = 0
        self.pgen: tuple[int, ...] = ()
        self.paddr: tuple[int, ...] = ()
        self.request: Any = None  # the Request in this slot (None when free)
        self.rids: list[int] = []  # records this slot pins, in chain order
        self.state = SlotState(self)  # this request alone, for guards of "slot" locality


class Admitted:
    """What one admission transaction did (:meth:`RequestTable.admit_locked`).  (A native class, not
    a named tuple: one is built per admission, and the compiled build makes a named tuple
    through interpreted code.)"""

    def __init__(
        self,
        slot: Slot,
        rids: list[int],
        immediate: HitSearch,
        projected: HitSearch | None,
        plan: RecoveryPlan,
        target: int,
        rejection: str | None,
        tail_check: TailCheckJob | None,
    ) -> None:
        self.slot = slot
        self.rids = rids
        self.immediate = immediate  # the search on the state as it is
        self.projected = projected  # the search on the state recovery would produce (if run)
        self.plan = plan  # empty: the hit needs no recovery
        self.target = target  # the hit matched and pinned (0 when downgraded)
        self.rejection = rejection  # why the hit was given up (the pin refused: the admission cap)
        self.tail_check = tail_check  # the splice check of a recovered boundary


def overlay(base: list[int], changed: dict[int, int], mapping: Any = None) -> Any:
    """A view column builder: ``base`` with projected values, read through a group's mapping."""

    def build(rids: Sequence[int]) -> list[int]:
        src = mapping(rids) if mapping is not None else rids
        return [changed.get(i, base[i]) for i in src]

    return build


class RequestTable:
    def __init__(
        self,
        table: Table,
        gate: GuardGate,
        store: BlockStore,
        recovery: Recovery,
        tiers: Tiers,
        events: EventLog,
        max_requests: int,
    ) -> None:
        self.table = table
        self.gate = gate
        self.store = store
        self.recovery = recovery
        self.meta = gate.meta
        self.tiers = tiers
        self.events = events
        self.L = table.consts.L
        self.lock = gate.lock
        self.slots = [Slot(i) for i in range(max_requests)]
        self._idle = Slot(-1)  # never taken: the state of a request that holds no slot
        guards = gate.guards
        self.projector = Projector(table, guards, gate.records)
        self._failed = failed_recovery(table)  # the fields of :meth:`truncate`'s cut
        # the release guard as one accept test on the slot, where it reads nothing else
        self._release_by_slot: Any = (
            gate.accept.get("release") if "release" in gate.by_slot else None
        )
        qualnames = {r.qualname for r in table.hit_rule.rules}
        self._rule_conjuncts = (
            frozenset(c.name for c in table.action("validate").guard if c.name in qualnames)
            if guards.has("validate")
            else frozenset()
        )
        # validate under a search's proof evaluates only its non-rule conjuncts: on the slot
        # alone when those read nothing but the request (the default table: its phase)
        self._validate_rest_by_slot = (
            guards.locality_without("validate", self._rule_conjuncts) == "slot"
        )
        # the TOCTOU safeguard as the table states it (a table without it: nothing to check)
        names = {inv.name for inv in table.invariants}
        self._toctou = table.invariant("toctou").per_block if "toctou" in names else None
        # ... and that remainder as one compiled accept test (None: evaluated conjunct-wise)
        self._validate_rest = (
            guards.fused_without("validate", self._rule_conjuncts)
            if self._validate_rest_by_slot
            else None
        )

    def slot(self, slot: Any) -> Slot:
        """A request-slot argument: a :class:`Slot`, or its index as an int (a NumPy integer
        too, never a bool: the rule of :func:`kvstate.impl.args.integer`)."""
        if isinstance(slot, Slot):
            return slot
        if isinstance(slot, np.integer) and not isinstance(slot, np.bool_):
            slot = int(slot)
        if not isinstance(slot, int) or isinstance(slot, bool) or not 0 <= slot < len(self.slots):
            raise UnknownRequest(f"no request slot {slot!r} (slots 0..{len(self.slots) - 1})")
        return self.slots[slot]

    def free_slot(self) -> Slot:
        for s in self.slots:
            if s.phase == REQ_IDLE and s.request is None:  # an int: no IntEnum comparison per slot
                return s
        raise OutOfCapacity("admit", (), f"all {len(self.slots)} request slots are busy")

    def _check(
        self,
        action: str,
        slot: Slot,
        rids: Sequence[int],
        view: ChainView | None = None,
        **params: int,
    ) -> None:
        gate = self.gate
        gate.guard(action, gate.req_state(action, slot, rids, view), {"r": 0, **params})

    def _refusal(self, action: str, s: Slot, detail: str, **params: int) -> Refused:
        """The refusal of ``action`` for a slot that is busy or holds no request, named by the
        conjuncts of the table's guard that are false on the slot's own state (its chain
        empty): the table names them, not this module.  Never empty: the caller refuses only
        where the slot's phase is one the guard refuses."""
        gate = self.gate
        failed = gate.guards.failed(action, gate.req_state(action, s, ()), {"r": 0, **params})
        if not failed:  # pragma: no cover: invariant: only phases the guard refuses
            raise InternalError(f"{action}: refused a slot the table's guard allows ({detail})")
        return Refused(action, failed, detail)

    # ---- the admission, one transaction -----------------------------------------------------
    def admit_locked(
        self, request: Any, ticks: int, h_max: int, lease: int, recover: bool
    ) -> Admitted:
        """A whole admission; the caller holds the lock (the façade's admission: taking the
        reentrant lock again costs ~1k instructions).  The table's ``admit`` (a free slot),
        ``touch`` of the prefix, the longest valid hit now and (``recover``) on the state the
        recovery pipelines would produce, ``match`` of the longer, ``pin`` (refused by the
        admission cap: ``downgrade``, the hit given up), then ``validate`` under the search's
        proof, or the recovery started.  Each step is the table's guard on the cheapest state
        it reads, then its effects; on an exception the request is aborted where the table
        allows it, and the exception propagates."""
        gate = self.gate
        s = self.free_slot()
        gate.guard("admit", gate.req_state("admit", s, ()), {"r": 0, "t": ticks})
        self._fx_admit(s, request, ticks)
        try:
            return self._admit(s, request, h_max, lease, recover)
        except BaseException:
            if request.slot is s and self.abortable(s):
                self.abort(s)
            raise

    def _admit(self, s: Slot, request: Any, h_max: int, lease: int, recover: bool) -> Admitted:
        gate, store, m, L = self.gate, self.store, self.meta, self.L
        rids = store.resolve(request.chain)
        nb_max = -(-h_max // L)
        store.touch_prefix_locked(rids, nb_max, lease)  # (the caller holds the lock)
        view = gate.chain_view(rids, s)  # one direct view for the steps of this admission
        now, epoch = self._sound_search(view, rids, h_max), gate.epoch
        target, plan = now.hit, _NO_RECOVERY
        ext: HitSearch | None = None
        trace: Trace = {}
        # a block that is not stored cannot be recovered: a hit that stops where only absent
        # blocks follow cannot grow (a miss, and a full-prefix hit, skip the projection)
        grows = any(r != NULL_RID for r in rids[now.hit // L : nb_max])
        proj = (
            self.projector.project(m, rids[:nb_max], trace=trace)
            if recover and now.hit < h_max and grows
            else {}
        )
        # an empty projection is the current state, where the search would find ``now`` again
        # (a full hit is cut to whole blocks by L1 alone: nothing to recover)
        if any(proj.values()):
            over = {
                name: overlay(getattr(m, name), vals)
                for name, vals in proj.items()
                if name != "swa"
            }
            if proj.get("swa"):
                over["swa"] = overlay(m.swa, proj["swa"], self.tiers.swa.map)
            ext = self._sound_search(gate.chain_view(rids, s, over), rids, h_max)
            if ext.hit > now.hit:
                steps = self.projector.plan(m, rids, -(-ext.hit // L), trace)
                plan = RecoveryPlan(tuple(steps), ext.hit, ext)
                target = ext.hit
        gate.guard("match", gate.req_state("match", s, rids, view), {"r": 0, "h": target})
        self._fx_match(s, target)
        try:
            gate.guard("pin", gate.req_state("pin", s, rids, view), {"r": 0})
        except Refused as exc:  # admission cap: give the hit up and recompute
            self.downgrade(s)
            return Admitted(s, rids, now, ext, _NO_RECOVERY, 0, f"admission cap: {exc}", None)
        self._fx_pin(s, rids, view)
        tc: TailCheckJob | None = None
        if plan.steps:  # (not ``if plan``: RecoveryPlan.__bool__ runs interpreted)
            tc = self.recovery.start_recovery(plan.steps, rids, target)
        else:
            self.validate_checked(s, rids, view, (now, epoch))
        return Admitted(s, rids, now, ext, plan, target, None, tc)

    def _sound_search(self, view: ChainView, rids: Sequence[int], h_max: int) -> HitSearch:
        """The longest valid hit within ``h_max`` that does not end at a record marked corrupt:
        a record whose restored compressor state failed its splice check
        (``Recovery.check_tail``) stays on the device with sound compressed rows, but the tail
        saved at its end boundary is not served again, to this admission or any later one (a
        hit ending there is cut by one block, as the admission that ran the check is)."""
        L, corrupt, search = self.L, self.meta.corrupt, self.gate.coord.search
        found = search(view, 0, h_max)
        cuts: list[Shortening] = []
        while found.hit > 0:
            nb = -(-found.hit // L)
            rid = rids[nb - 1]
            if rid == NULL_RID or not corrupt[rid]:
                break
            was = found
            found = search(view, 0, (nb - 1) * L)
            # the explanation accounts for this cut as it does for the check's own admission's
            # (:meth:`truncate`): the table's failed recovery, from the hit to the shorter one
            cuts += [*was.shortenings, recovery_cut(self._failed, was.hit, found.hit)]
        if not cuts:
            return found
        return HitSearch(h_max, found.hit, (*cuts, *found.shortenings), found.rejected)

    def truncate(
        self, s: Slot, hit: int, rids: Sequence[int], boundary_failed: bool
    ) -> tuple[HitSearch, Shortening, str | None]:
        """Cut a pending admission of ``hit`` tokens whose recovery failed, in one transaction:
        the longest valid hit within ``hit`` (within its blocks but the last when
        ``boundary_failed``: the compressor state saved at its end failed its check), then
        abort, admit again in the same slot (the deadline it had left), match, pin and validate
        it.  Returns that search, the cut as the table names a failed recovery, and, when not
        even the shorter hit passes and the request was downgraded to a recompute instead, the
        refusal (None: validated)."""
        L = self.L
        cap = min(hit, (-(-hit // L) - 1) * L) if boundary_failed else hit
        with self.lock:
            gate = self.gate
            found = gate.coord.search(gate.chain_view(rids, s), 0, cap)
            # the boundary cut back to may hold a compressor state this recovery restored too,
            # never checked (the plan checks the hit's end only): check it now, and on a
            # failure (the record is marked corrupt) cut one block further
            while 0 < found.hit < hit:
                nb = -(-found.hit // L)
                if self.recovery.check_tail(rids[nb - 1], nb * L):
                    break
                found = gate.coord.search(gate.chain_view(rids, s), 0, (nb - 1) * L)
            cut = recovery_cut(self._failed, hit, found.hit)
            ticks = max(1, s.deadline - gate.now)
            req = s.request
            self.abort(s)
            s = self.begin(req, ticks, slot=s.index)
            try:
                self.match(s, found.hit, rids)
                self.pin(s, rids)
                self.validate(s, rids)
            except Refused as exc:
                self.give_up(s)
                return found, cut, str(exc)
            return found, cut, None

    def give_up(self, s: Slot) -> None:
        """Downgrade a request to a recompute (hit 0, nothing pinned)."""
        with self.lock:
            if s.phase == REQ_WAITING:
                self.match(s, 0, [])
            self.downgrade(s)

    # ---- the table's request actions --------------------------------------------------------
    def begin(self, request: Any, ticks: Any, slot: Any = None) -> Slot:
        """The table's ``admit``: the request takes a slot and a deadline ``now + ticks``
        (``request``: a :class:`~kvstate.impl.cache.Request`, anything with a ``slot``)."""
        if request is None or request.__class__ is bool or not hasattr(request, "slot"):
            raise InvalidArgument(f"request must be a Request, got {type(request).__name__}")
        with self.lock:
            t = _int("ticks", ticks, 1, MAX_COUNT)
            s = self.free_slot() if slot is None else self.slot(slot)
            if s.request is not None and s.phase != REQ_IDLE:
                raise self._refusal("admit", s, f"slot {s.index} is busy", t=t)
            self._check("admit", s, (), t=t)
            self._fx_admit(s, request, t)
            return s

    # Each request transition's effects, for a caller that holds the lock and has checked the
    # action's guard.
    def _fx_admit(self, s: Slot, request: Any, t: int) -> None:
        s.request = request
        s.phase = REQ_WAITING
        s.deadline = self.gate.now + t
        s.hit = 0
        request.slot = s

    def _fx_match(self, s: Slot, h: int) -> None:
        s.hit = h
        s.phase = REQ_MATCHED

    def _fx_pin(self, s: Slot, rids: Sequence[int], view: ChainView | None) -> None:
        held = list(rids[: -(-s.hit // self.L)])
        ref, lru = self.meta.ref, self.store.lru
        for rid in held:
            ref[rid] += 1
            if rid in lru:
                lru.move_to_end(rid)
        s.rids = held
        s.pinned = s.hit
        self.gate.pinned_blocks += len(held)
        s.phase = REQ_PINNED
        if view is not None:
            view.refresh()

    def use_locked(self, s: Slot) -> None:
        """``use`` for a caller that holds the lock (``cache.use``'s enter, which refills the
        CUDA graph's buffers in the same critical section)."""
        gate = self.gate
        gate.guard("use", gate.req_state("use", s, ()), {"r": 0})
        s.phase = REQ_USING

    def release_locked(self, s: Slot) -> None:
        gate = self.gate
        gate.guard("release", gate.req_state("release", s, ()), {"r": 0})
        self._fx_release(s)

    def abortable(self, s: Slot) -> bool:
        """Does the table's ``abort`` guard hold for this slot (the table in use decides which
        phases a request can be aborted from, not a list written here)."""
        gate = self.gate
        return gate.guards.allows("abort", gate.req_state("abort", s, ()), {"r": 0}, ())

    def in_use(self, s: Slot) -> bool:
        """May ``s`` be released now (the table's ``release`` guard, on the slot): what the
        façade calls a request in use (decode, finish, a live run)."""
        accept = self._release_by_slot
        if accept is not None:  # the guard reads the slot alone: its one compiled test
            return bool(accept(s.state, _ACTING))
        gate = self.gate
        return not gate.guards.failed("release", gate.req_state("release", s, ()), _ACTING)

    def refusal(
        self,
        action: str,
        s: Slot | None,
        detail: str,
        exc: type[Refused] = Refused,
        call: str | None = None,
    ) -> Refused:
        """A façade's refusal of ``action`` (reported as ``call``, a public call that is not one
        of the table's actions), named by the conjuncts of the table's guard of ``action`` that
        are false on the request's slot; a request that holds no slot (``s`` None) is, to the
        table, an idle one (a free slot's state).  Empty where the guard holds and the refusal
        is the façade's own (an admission its request no longer holds)."""
        gate = self.gate
        slot = s if s is not None else self._idle
        failed = gate.guards.failed(action, gate.req_state(action, slot, ()), _ACTING)
        return exc(call if call is not None else action, failed, detail)

    def not_in_use(
        self, call: str, s: Slot | None, detail: str, exc: type[Refused] = Refused
    ) -> Refused:
        """The refusal of a public ``call`` that needs its request in use (:meth:`in_use`: the
        table's ``release`` guard)."""
        return self.refusal("release", s, detail, exc, call)

    def unvalidatable(self, s: Slot) -> list[str]:
        """The ``validate`` guard's conjuncts other than the hit rules that refuse ``s`` now
        (the default table: its phase is PINNED): a pending admission is validated, or
        truncated and re-pinned, only while none does."""
        gate = self.gate
        state = gate.req_state("validate", s, s.rids)
        return gate.guards.failed("validate", state, {"r": 0}, self._rule_conjuncts)

    def _fx_release(self, s: Slot) -> None:
        self._unpin(s)
        s.phase = REQ_IDLE
        self._detach(s)

    def match(
        self,
        slot: Any,
        h: Any,
        rids: Sequence[int] | None = None,
        view: ChainView | None = None,
    ) -> None:
        with self.lock:
            s = self.slot(slot)
            h = _int("hit tokens", h, 0)
            req = s.request
            if req is None:
                raise self._refusal("match", s, f"slot {s.index} holds no request", h=h)
            if h > len(req.chain.tokens):
                raise InvalidArgument(
                    f"hit of {h} tokens is longer than the request ({len(req.chain.tokens)})"
                )
            rids = self.store.resolve(req.chain) if rids is None else rids
            self._check("match", s, rids, view, h=h)
            self._fx_match(s, h)

    def pin(
        self, slot: Any, rids: Sequence[int] | None = None, view: ChainView | None = None
    ) -> None:
        with self.lock:
            s = self.slot(slot)
            if s.request is None:
                raise self._refusal("pin", s, f"slot {s.index} holds no request")
            rids = self.store.resolve(s.request.chain) if rids is None else rids
            self._check("pin", s, rids, view)
            self._fx_pin(s, rids, view)

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
            s = self.slot(slot)
            if s.request is None:
                raise self._refusal("validate", s, f"slot {s.index} holds no request")
            rids = self.store.resolve(s.request.chain) if rids is None else rids
            self.validate_checked(s, rids, view or self.gate.chain_view(rids, s), proof)

    def validate_checked(
        self,
        s: Slot,
        rids: Sequence[int],
        view: ChainView,
        proof: tuple[HitSearch, int] | None,
    ) -> None:
        """The TOCTOU safeguard's check: ``validate``'s guard (all of it, or under a current
        proof only the conjuncts that are not hit rules) and its effects, the state_data_ptrs
        snapshot (each pinned block's generation and address) that the table's ``toctou``
        invariant holds the pinned blocks to."""
        gate = self.gate
        skip: frozenset[str] = frozenset()
        if (
            proof is not None
            and proof[1] == gate.epoch
            and proof[0].hit == s.hit
            and proof[0].rejected is None
        ):
            skip = self._rule_conjuncts
        state = s.state if skip and self._validate_rest_by_slot else view
        rest = self._validate_rest if skip and state is s.state else None
        bad: list[str] | None = [] if rest is not None and rest(state, {"r": 0}) else None
        if bad is None:
            bad = gate.guards.failed("validate", state, {"r": 0}, skip)
        if bad:
            why = (
                "; ".join(str(x) for x in gate.coord.failures(view, 0, s.hit))
                if s.phase == REQ_PINNED
                else ""
            )
            raise Refused("validate", bad, why)
        gen, addr = self.meta.gen, self.meta.addr
        s.pgen = tuple([gen[i] for i in rids])
        s.paddr = tuple([addr[i] for i in rids])
        s.phase = REQ_VALIDATED
        gate.admitted("validate", 1)

    def stale_pins(
        self, rids: Sequence[int], pgen: Sequence[int], paddr: Sequence[int]
    ) -> list[int]:
        """The TOCTOU safeguard on a snapshot (a diagnostic): the positions of the blocks at
        which the table's ``toctou`` invariant fails for a request validated with these
        state_data_ptrs (generations ``pgen``, addresses ``paddr``) over the chain ``rids`` --
        a block no longer pinned, not READY, reallocated or moved since.  The lock held."""
        check = self._toctou
        if check is None or not rids:
            return []
        probe = Slot(-1)  # a validated request holding exactly this snapshot
        probe.phase, probe.hit = REQ_VALIDATED, len(rids) * self.L
        probe.pgen, probe.paddr = tuple(pgen), tuple(paddr)
        view = self.gate.chain_view(rids, probe)
        return [b for b in range(len(rids)) if not check(view, 0, b)]

    def use(self, slot: Any) -> None:
        with self.lock:
            s = self.slot(slot)
            self.use_locked(s)

    def _unpin(self, s: Slot) -> None:
        """Drop a slot's pins, freeing in reverse order: the deepest block of the prefix returns
        to the LRU first, so it is evicted before the blocks the prefix depends on."""
        ref, lru = self.meta.ref, self.store.lru
        for rid in reversed(s.rids):
            ref[rid] -= 1
            if ref[rid] < 0:  # pragma: no cover: an internal invariant (each pin is released once)
                raise InternalError(f"reference count of record {rid} went negative")
            if rid in lru:
                lru.move_to_end(rid)
        self.gate.pinned_blocks -= len(s.rids)
        s.rids = []
        s.pinned = 0
        s.hit = 0

    def release(self, slot: Any) -> None:
        with self.lock:
            s = self.slot(slot)
            exc = AlreadyReleased if s.phase == REQ_IDLE else Refused
            gate = self.gate
            gate.guard("release", gate.req_state("release", s, ()), {"r": 0}, exc=exc)
            self._fx_release(s)

    def abort(self, slot: Any) -> None:
        with self.lock:
            s = self.slot(slot)
            exc = AlreadyReleased if s.phase == REQ_IDLE else Refused
            gate = self.gate
            gate.guard("abort", gate.req_state("abort", s, ()), {"r": 0}, exc=exc)
            self._unpin(s)
            s.phase = REQ_IDLE
            self._detach(s)

    def downgrade(self, slot: Any) -> None:
        with self.lock:
            s = self.slot(slot)
            self._check("downgrade", s, ())
            self._unpin(s)
            s.phase = REQ_RECOMPUTE
            req = s.request
            self.events.emit(EventKind.DOWNGRADED, None, "", "", getattr(req, "id", None))

    def _detach(self, s: Slot) -> None:
        req = s.request
        s.request = None
        if req is not None:
            req.slot = None
            if self.recovery.io_waiting:  # queued loads nobody is waiting for any more
                self.recovery.forget_unwanted()
        self.gate.notify_changed()
