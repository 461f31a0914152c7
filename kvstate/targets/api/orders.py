"""The API harness's check of the orders the library documents and the table leaves open.

The table lets an eviction, an offload, a spill or a drop take *any* block its guard allows,
so refinement alone cannot see a library that takes the wrong one.  The library documents which
(``HeterogeneousKVCache.evict``/``offload``/``spill``/``drop``: the least recently used first;
the disk loads the I/O cap held back start in the order they were queued), and these orders are
observable: a bug there evicts the block a later request needed, or the head of a prefix before
its tail.  This module keeps the reference orders from the *table actions* that explain each
call (the harness's explanation) and checks each call's picks against them:

* **device recency**: a block joins at the end when it becomes READY (``commit``,
  ``load_done``, ``offload_cancel``); a ``pin`` moves the blocks it pins to the end in chain
  order; an unpin (``abort``, ``downgrade``) moves them in reverse chain order (the deepest
  block is then evicted first, the prefix's head last), and ``release`` does so for the whole
  chain of the finished request (it also stored its new blocks);
* **host recency**: ``offload_done`` or a failed host load puts a block at the end;
  **disk recency**: ``spill`` or a failed disk load (blocks a restart found have no known
  order among themselves);
* a call that evicted (offloaded, spilled, dropped) a set ``E`` of the chain's blocks left no
  block behind that comes earlier in the order and that the table's guard for the same action
  allowed both before and after the call (the guard, the model's, read at the call's two ends:
  a block pinned or touched in between is not a candidate);
* the disk loads held back by the I/O cap start as a prefix of their queue.

Membership follows the model's phases (READY, HOST, DISK); only the order is kept here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from kvstate.spec.phases import CKV
from kvstate.spec.state import ConcreteState
from kvstate.targets.api.base import CallCheck

Step = tuple[str, dict[str, int]]
# the actions whose picks the library documents, and the recency list each one takes from
# (drop: the disk entries first, then the host copies)
_PICKS = {
    "evict_start": ("dev",),
    "offload": ("dev",),
    "spill": ("host",),
    "drop": ("disk", "host"),
}


def _move_end(order: list[int], blocks: Sequence[int]) -> None:
    for b in blocks:
        if b in order:
            order.remove(b)
            order.append(b)


class OrderCheck:
    """Reference recency orders of the chain's blocks, updated from each call's explanation."""

    def __init__(self, machine: Any, N: int, L: int) -> None:
        self.m = machine
        self.N = N
        self.L = L
        self.dev: list[int] = []  # least recently used first
        self.host: list[int] = []
        self.disk: list[int] = []
        self.unordered: set[int] = set()  # disk blocks a restart found (no known order)
        self.queue: list[int] = []  # the chain's disk loads held back, as queued (before a call)

    # -- the reference orders -------------------------------------------------------------
    def _sync(self, s: ConcreteState) -> None:
        """Membership from the model's phases (order kept; new members at the end)."""
        ck = s.values["ckv"]
        for order, ph in ((self.dev, CKV.READY), (self.host, CKV.HOST), (self.disk, CKV.DISK)):
            order[:] = [b for b in order if ck[b] == ph]
            order.extend(b for b in range(self.N) if ck[b] == ph and b not in order)
        self.unordered &= set(self.disk)

    def _blocks(self, s: ConcreteState, r: int) -> list[int]:
        return list(range(min(-(-s.values["pinned"][r] // self.L), self.N)))

    def walk(
        self,
        before: ConcreteState,
        steps: Sequence[Step],
        events: Sequence[tuple[str, int, str]],
        chain_blocks: Callable[[int], int | None],
    ) -> None:
        """Update the orders along the call: ``steps``, its explanation from ``before``;
        ``events``, the chain's block events it emitted, in the order emitted.  A block joins
        a tier's list in its event's order (the explanation orders actions of one kind in a
        call as it likes); then the moves of pins and unpins follow in the steps' order (no
        call both joins blocks and pins: a finish stores, then releases its whole chain).
        ``chain_blocks(r)``: the blocks of the chain of the request at slot ``r`` (a release
        moves them all), or None."""
        s = before
        self._sync(s)
        states = []
        for name, p in steps:
            states.append(s)
            s = self.m.step(s, name, p)
        self._sync(s)
        for kind, b, tier in events:
            if kind == "stored":
                order = {"device": self.dev, "host": self.host, "disk": self.disk}[tier]
            elif kind == "loaded":
                order = self.dev
            elif kind == "load_failed":
                order = self.disk if tier == "disk" else self.host
            else:
                continue
            if order is self.disk:
                self.unordered.discard(b)
            _move_end(order, [b])
        for (name, p), t in zip(steps, states, strict=True):
            at, r = p.get("b"), p.get("r")
            if name == "offload_cancel" and at is not None:
                _move_end(self.dev, [at])
            elif name == "pin" and r is not None:
                _move_end(self.dev, self._blocks(self.m.step(t, name, p), r))
            elif name == "release" and r is not None:
                n = chain_blocks(r)
                held = self._blocks(t, r) if n is None else list(range(min(n, self.N)))
                _move_end(self.dev, held[::-1])
            elif name in ("abort", "downgrade") and r is not None:
                _move_end(self.dev, self._blocks(t, r)[::-1])

    def restart(self, s: ConcreteState) -> None:
        """After a crash: the device and host tiers are gone; the disk entries the scan found
        have no order among themselves."""
        self.dev, self.host, self.disk = [], [], []
        self._sync(s)
        self.unordered = set(self.disk)

    # -- the checks -----------------------------------------------------------------------
    def picks(self, before: ConcreteState, steps: Sequence[Step], end: ConcreteState) -> list[str]:
        """The call's picks against the orders as they stood when it began (call this before
        :meth:`walk`): a block passed over must not have been allowed at both ends."""
        out = []
        for action, lists in _PICKS.items():
            took = {p["b"] for n, p in steps if n == action and "b" in p}
            if not took:
                continue
            order = [b for lst in lists for b in getattr(self, lst)]
            for k, b in enumerate(order):
                if b not in took:
                    continue
                for c in order[:k]:
                    if c in took or (c in self.unordered and b in self.unordered):
                        continue
                    if self._candidate(action, c, before) and self._candidate(action, c, end):
                        out.append(
                            f"{action} took block {b} but not block {c}, which comes before "
                            f"it in the documented order {order} and which the table let go "
                            "throughout the call"
                        )
        return out

    def _candidate(self, action: str, b: int, s: ConcreteState) -> bool:
        if not self.m.is_enabled(s, action, {"b": b}):
            return False
        if action == "offload":  # offload(n): "blocks whose lease expired" (its docstring)
            return bool(s.values["lease"][b] <= s.values["now"])
        return True

    def queued_first(self, steps: Sequence[Step], waiting: Sequence[int]) -> list[str]:
        """The held-back disk loads that started in the call form a prefix of the queue
        (``self.queue``, read before the call); ``waiting``: the queue after it."""
        seq = [p["b"] for n, p in steps if n == "load_start" and p.get("b") in self.queue]
        started = set(seq)
        out = []
        want = [b for b in self.queue if b in started]
        if seq != want:
            out.append(
                f"the held-back disk loads started in the order {seq}, not in the order they "
                f"were queued ({want})"
            )
        for k, b in enumerate(self.queue):
            if b in started:
                left = [c for c in self.queue[:k] if c in waiting]
                if left:
                    out.append(
                        f"the held-back disk load of block {b} started before those of blocks "
                        f"{left}, queued earlier (queue {self.queue})"
                    )
        return out


class OrderHook(CallCheck):
    """:class:`OrderCheck` around the harness's calls (:mod:`kvstate.targets.api.checks`)."""

    def __init__(self, h: Any) -> None:
        self.check = OrderCheck(h.machine, h.N, h.L)
        self.chains: dict[int, int] = {}

    def _queue(self, h: Any) -> list[int]:
        blocks = {r: b for b, r in enumerate(h.rids)}
        with h.view.lock:
            return [blocks[r] for r in h.view.io_waiting if r in blocks]

    def before(self, h: Any, o: Any) -> None:
        self.check.queue = self._queue(h)
        self.chains = {
            lv.req.slot.index: lv.req.chain.blocks
            for lv in h.live
            if lv is not None and lv.req.slot is not None
        }

    def after(
        self, h: Any, o: Any, before: ConcreteState, steps: Sequence[Step], end: ConcreteState
    ) -> None:
        # an ``act`` picks its block by name (kvstate/targets/api/single.py, actmaint.py): no policy
        bad = self.check.picks(before, steps, end) if o.name not in ("act", "act_maint") else []
        bad += self.check.queued_first(steps, self._queue(h))
        if bad:
            raise h.fail("order", [o.name], f"{o.render()}: " + "; ".join(bad))
        if any(n in _PICKS for n, _ in steps):
            h.cov.add("check: picks against the documented order")
        self.check.walk(before, steps, h.call_events, self.chains.get)

    def restart(self, h: Any) -> None:
        self.check.restart(h.model)
