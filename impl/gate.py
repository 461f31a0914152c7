"""The guard gate: the one lock, the table's guards on the cheapest state they read, the epoch.

Every transition of the block store, the recovery pipelines and the request table passes here
first.  The gate holds what a guard reads beside the block records -- the table's global
scalars (``now``, ``io_inflight``, the pinned-block total) and the CUDA graph's phase -- so it
is the one place that builds the states the compiled guards run on: the record-indexed
metadata (``block``/``global`` locality), a request's slot (``slot`` locality) or a view of a
chain.  A refusal names the table's own conjuncts; nothing here restates one.

The rule epoch also lives here, and moves in exactly one method (:meth:`GuardGate.admitted`):
a hit search made at epoch ``e`` is still a proof of the hit rules while the epoch is ``e``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from kvstate.spec.table import Table

from .args import MAX_COUNT, integer
from .coordinator import Coordinator
from .errors import InternalError, InvalidArgument, Refused
from .fastforms import compile_search
from .graphs import GraphRegistry
from .guards import Guards
from .meta import NULL_RID, BlockMeta, ChainView, Others, RecordState


class GuardGate:
    def __init__(
        self,
        table: Table,
        meta: BlockMeta,
        graph: GraphRegistry,
        maps: dict[str, Any],
    ) -> None:
        self.table = table
        self.meta = meta
        self.graph = graph
        self.L = table.consts.L
        self.lock = threading.RLock()
        self.changed = threading.Condition(self.lock)
        # what the threads in ``wait_changed`` wait for: only they need a notification, and
        # only once what one of them waits for holds
        self.waiting: list[Callable[[], bool]] = []
        # the table's global scalars the guards read (the parts update them under the lock)
        self.now = 0
        self.io_inflight = 0
        self.pinned_blocks = 0
        self.vk = replace(table.consts, R=2)  # views: the acting request + the others' aggregate
        # the SWA and compressor groups read their state through their own block mapping (the
        # identity unless a seeded bug's edit shifts it: only non-identity mappings are applied)
        self.maps = maps
        mapped = frozenset(maps)
        self.guards = Guards(table, self.vk, mapped)
        # guards that read a block only at its own parameter (or nothing but globals) evaluate on
        # the record-indexed metadata; those that read only the acting request, on its slot
        self.actions = frozenset(a.name for a in table.actions)
        self.records = RecordState(meta, self)
        self.by_record = frozenset(
            a for a, kind in self.guards.locality.items() if kind in ("block", "global")
        )
        self.by_slot = frozenset(a for a, kind in self.guards.locality.items() if kind == "slot")
        self.accept, self.accept_direct = self.guards.accept_tests()
        # block guards that one call checks for a whole run of blocks (a store, an eviction)
        self.run_tests: dict[str, Any] = {}
        for a in self.by_record:
            run = self.guards.run_test(a)
            if run is not None:
                self.run_tests[a] = run
        compiled = compile_search(table.hit_rule, table, self.vk, mapped)
        self.coord = Coordinator(table.hit_rule, compiled)
        # rule epoch: bumped by every transition whose frame meets what the hit rules read (off
        # their Z3 terms), so a hit search is still a proof of the rules while it has not moved
        reads = compiled.reads
        self.rule_reads = reads
        self.epoch = 0
        self.neutral = frozenset(
            a.name for a in table.actions if reads is not None and not (a.modifies & reads)
        )
        self.others: dict[int, Others] = {}

    # ---- waiting for change ---------------------------------------------------------------
    def wait_changed(self, ready: Callable[[], bool], timeout: float | None) -> bool:
        """Wait (the lock held) until ``ready()``, woken by a state change that makes it hold
        (:meth:`notify_changed`); False on timeout."""
        self.waiting.append(ready)
        try:
            return self.changed.wait_for(ready, timeout)
        finally:
            self.waiting.remove(ready)

    def notify_changed(self) -> None:
        """A state change (the lock held) some waiter may be waiting for: the waiters are woken
        where what one of them waits for holds now (asked here, under the lock the change
        holds).  A waiting ``use`` was woken by every load's end and every rebuild's, and took
        the lock back each time to find its recovery still pending: two context switches and
        a lock hand-off per block, beside the I/O workers that need the lock.  Free when none
        waits (every request's release comes here)."""
        for ready in self.waiting:
            try:
                if not ready():
                    continue
            except Exception:  # noqa: BLE001 - the waiter asks again, and sees it raise
                pass
            self.changed.notify_all()
            return

    # ---- the states guards read -----------------------------------------------------------
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
        self, rids: Sequence[int], slot: Any = None, overrides: dict[str, Any] | None = None
    ) -> ChainView:
        """A request's chain as the table sees it; the SWA and compressor groups supply their own
        columns (their block mapping), ``overrides`` a projected state."""
        reqs: tuple[Any, ...] = ()
        if slot is not None:
            others = self.pinned_blocks - (-(-slot.pinned // self.L))
            agg = self.others.get(others)
            if agg is None:  # read-only aggregates, one per value
                agg = self.others[others] = Others(self.L * others)
            reqs = (slot, agg)
        # positionally (a view per admission: parsing keywords costs ~1k instructions)
        nfree = 0
        return ChainView(
            self.meta,
            rids,
            self.vk,
            self.now,
            self.graph.phase,
            self.io_inflight,
            nfree,
            reqs,
            overrides,
            self.maps,
        )

    def block_state(self, action: str, rid: Any) -> tuple[Any, int]:
        """The state a block action's guard reads, and the value of its block parameter."""
        if action in self.by_record:
            return self.records, rid
        return self.block_view(rid), 0

    def global_state(self, action: str) -> Any:
        return self.records if action in self.by_record else self.block_view(NULL_RID)

    def req_state(self, action: str, slot: Any, rids: Sequence[int], view: Any = None) -> Any:
        """The state a request action's guard reads: the slot alone for "slot" guards, else
        ``view`` (a caller's direct view of this very chain and slot, shared across the steps of
        one admission) or a new view."""
        if action in self.by_slot:
            return slot.state
        return view if view is not None else self.chain_view(rids, slot)

    # ---- guard dispatch -------------------------------------------------------------------
    def accept_tests(self, state: Any) -> dict[str, Any]:
        """Each action's whole guard as one accept test, in the form that reads ``state``: the
        direct form for a direct view (live lists through the chain's record ids), the plain
        form for record-indexed, slot and gathered states."""
        return self.accept_direct if state._direct else self.accept

    def guard(
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
        ok = None if skip else (self.accept_direct if view._direct else self.accept).get(action)
        if ok is None or not ok(view, params):
            self.guards.check(action, view, params, skip, exc)
        self.admitted(action, 1)

    def admitted(self, action: str, n: int) -> None:
        """The one place the rule epoch moves: ``n`` transitions of ``action`` passed their
        guard.  Unless the action's frame misses every variable the hit rules read
        (``neutral``), a search made before it is no longer a proof of the rules."""
        if action not in self.neutral:
            self.epoch += n

    def check_block(self, action: str, rid: Any, skip: Sequence[str] = (), **params: int) -> None:
        if rid.__class__ is not int or not 0 < rid < len(self.meta.ckv):
            rid = self.rid(rid)  # InvalidArgument, or a NumPy (or int subclass) record as int
        if not skip and action in self.by_record:  # the common case, inline
            params["b"] = rid
            if self.accept[action](self.records, params):
                self.admitted(action, 1)
                return
        state, b = self.block_state(action, rid)
        params["b"] = b
        self.guard(action, state, params, skip)

    def check_run(self, action: str, rids: Sequence[int], **params: int) -> None:
        """The guard of a block action for every block of ``rids``, before any of them moves:
        one call of the table's guard over the run where that equals a check per block
        (:meth:`Guards.run_test`), else a check per block.  A refusal is named by the per-block
        check of the first refused block (nothing has moved yet)."""
        run = self.run_tests.get(action)
        if run is None:
            for rid in rids:
                self.check_block(action, rid, (), **params)
            return
        params["b"] = NULL_RID
        bad = run(self.records, params, rids)
        if bad >= 0:
            self.check_block(action, rids[bad], (), **params)  # raises, naming the conjuncts
            raise InternalError(  # pragma: no cover: a run test that disagrees with its guard
                f"{action}: the run check and the block check disagree"
            )
        self.admitted(action, len(rids))

    def first_refused(self, action: str, rids: Sequence[int], **params: int) -> int:
        """The position in ``rids`` of the first block whose guard refuses ``action`` now
        (each judged before any of them moves, as :meth:`check_run` does), -1 if none."""
        run = self.run_tests.get(action)
        if run is not None:
            params["b"] = NULL_RID
            return int(run(self.records, params, rids))
        for i, rid in enumerate(rids):
            state, b = self.block_state(action, rid)
            params["b"] = b
            if not self.guards.allows(action, state, params):
                return i
        return -1  # pragma: no cover: asked only of a run check_run refused (some block refuses)

    def refused(self, action: str, rid: int) -> list[str]:
        """The conjuncts of a block action's guard that are false now (none: allowed)."""
        state, b = self.block_state(action, rid)
        return self.guards.failed(action, state, {"b": b})

    def can(self, action: Any, rid: Any) -> bool:
        """Would the block action be allowed now (jobs ask this to choose their next step)."""
        if not isinstance(action, str) or action not in self.actions:
            raise InvalidArgument(f"no block action {action!r}")
        if rid.__class__ is not int:  # a NumPy integer is an int; a bool is not (args.integer)
            rid = integer("record", rid)
        if not 0 <= rid < len(self.meta):  # 0: the null record
            raise InvalidArgument(f"no block record {rid!r}")
        with self.lock:
            state, b = self.block_state(action, rid)
            return self.guards.allows(action, state, {"b": b})

    # ---- the global actions: time and the CUDA graph (the guard, then the effect) ---------
    def tick(self, ticks: Any = 1) -> None:
        with self.lock:
            t = integer("ticks", ticks, 1, MAX_COUNT)
            self.guard("tick", self.global_state("tick"), {"t": t})
            self.now += t

    def capture(self) -> None:
        with self.lock:
            self.guard("capture", self.global_state("capture"), {})
            self.graph.record()

    def replay(self) -> None:
        """The CUDA-graph topology safeguard: the table's ``replay`` guard refuses a graph whose
        recorded addresses went stale (a block moved since capture: ``BlockStore.moved``)."""
        with self.lock:
            self.guard("replay", self.global_state("replay"), {})
            self.graph.replay()

    def recapture(self) -> None:
        with self.lock:
            self.guard("recapture", self.global_state("recapture"), {})
            self.graph.record()

    def rid(self, rid: Any) -> int:
        """A record argument: an int (a NumPy integer too, never a bool: :func:`integer`)
        naming a record (not the null record 0)."""
        if rid.__class__ is not int:
            rid = integer("record", rid)
        if not 0 < rid < len(self.meta):
            raise InvalidArgument(f"no block record {rid!r}")
        return rid
