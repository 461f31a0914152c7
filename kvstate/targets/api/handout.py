"""What the library hands out besides reads: CUDA-graph rows and events, checked as received.

* **Graph rows**: a ``use`` refills its request's row of the graph registry's persistent
  buffers (``block_tables``, ``state_ptrs``: what a captured CUDA graph reads), skipping the
  write when the row already holds the same values.  After every ``use`` the row must hold the
  Run's block table (``Run.block_table()``) padded with -1, and the state pointers the table's
  ``state_data_ptrs`` snapshot (``paddr``, as the library shows it) gives each pinned block,
  padded with 0: a stale row (a wrong memo key), a row not re-padded after a longer one, or
  pointers out of order are read by a replay.
* **Events**: every event the cache emits is delivered to every subscriber, in the order
  logged (``HeterogeneousKVCache.events_of``), as an immutable value (a subscriber may keep
  it); a subscriber that raises breaks neither the call nor the delivery to the others (it is
  recorded in ``callback_errors``, the latest 100: docs/library.md).  The harness subscribes
  one that raises on every event, before its own, and compares what its own received with the
  log after every call, and ``callback_errors`` with what it raised (as many, up to 100, the
  latest last).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvstate.spec.state import ConcreteState
from kvstate.targets.api.base import CallCheck

Step = tuple[str, dict[str, int]]


class GraphRows(CallCheck):
    def after(
        self, h: Any, o: Any, before: ConcreteState, steps: Sequence[Step], end: ConcreteState
    ) -> None:
        if o.name != "use":
            return
        lv = h.live[o.arg("i")]
        if lv is None or lv.run is None or lv.req.slot is None:
            return
        row = lv.req.slot.index
        g = h.view.graph
        bt = g.block_tables[row].tolist()
        sp = g.state_ptrs[row].tolist()
        want = lv.run.block_table()
        n = len(want)
        shown = h.observe()["paddr"][row]
        ptrs = [shown[b] for b in range(n)]
        bad = []
        if bt[:n] != want or any(x != -1 for x in bt[n:]):
            bad.append(f"block table row {row} is {bt}, the Run's is {want} (padded with -1)")
        if sp[:n] != ptrs or any(x != 0 for x in sp[n:]):
            bad.append(f"state pointers row {row} are {sp}, state_data_ptrs {ptrs} (padded with 0)")
        if bad:
            raise h.fail("graph-row", [o.name], f"{o.render()}: " + "; ".join(bad))
        h.cov.add("check: graph rows")


class Events(CallCheck):
    def __init__(self, h: Any) -> None:
        self.got: list[tuple[Any, tuple[Any, ...]]] = []
        self._subscribe(h)

    def _subscribe(self, h: Any) -> None:
        ev = h.cache.events
        self.got = []
        self.n = 0
        self.logged = len(ev.events)

        def raising(e: Any) -> None:
            self.n += 1
            raise RuntimeError(f"the harness's subscriber raising on purpose #{self.n}")

        def keep(e: Any) -> None:
            self.got.append((e, tuple(e)))

        ev.subscribe(raising)  # before ``keep``: delivery must go on past it
        ev.subscribe(keep)

    def before(self, h: Any, o: Any) -> None:
        self.got = []
        self.logged = len(h.cache.events.events)

    def _check(self, h: Any, o: Any) -> None:
        log = list(h.cache.events.events)[self.logged :]
        got = [fields for _, fields in self.got]
        bad = []
        if got != [tuple(x) for x in log]:
            bad.append(f"delivered {len(got)} events {got[:4]}..., logged {len(log)} {log[:4]}...")
        for e, fields in self.got:
            if tuple(e) != fields:
                bad.append(f"an event changed after delivery: {fields} -> {tuple(e)}")
            if e.key is not None and not isinstance(e.key, bytes):
                bad.append(f"an event's key is a mutable {type(e.key).__name__}")
        errs = h.cache.events.callback_errors
        if len(errs) != min(self.n, 100) or (errs and not errs[-1].endswith(f'#{self.n}")')):
            bad.append(
                f"callback_errors holds {len(errs)} entries, the last {errs[-1] if errs else None}"
                f", after a subscriber raised {self.n} times (the latest 100 are kept)"
            )
        if bad:
            raise h.fail("events", [o.name], f"{o.render()}: " + "; ".join(bad[:3]))
        if self.n > 100:
            h.cov.add("check: callback_errors past its 100")
        if got:
            h.cov.add("check: events delivered as logged")

    def after(
        self, h: Any, o: Any, before: ConcreteState, steps: Sequence[Step], end: ConcreteState
    ) -> None:
        self._check(h, o)

    def refused(self, h: Any, o: Any) -> None:
        self._check(h, o)

    def restart(self, h: Any) -> None:
        self._subscribe(h)
