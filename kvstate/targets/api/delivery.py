"""Events checked at the moment a subscriber receives them, and the event log's readers.

The harness compares the multiset of a call's block events with the actions that explain the
call (``ApiHarness._check_events``) once the call is over, and :mod:`kvstate.targets.api.handout`
checks that each delivered value stays as delivered.  Neither sees *when* an event arrives: a
subscriber (a KV-aware router, a metrics exporter) acts on an event as it receives it, so a
``stored`` event delivered before the block's content is committed, or an ``evicted`` one
before the slot is free, sends it to a block that is not there yet (or still there).

* **at delivery**: a subscriber records, for each event of a chain block, the block's phase as
  the library shows it at that moment (``ckv``); after the call, each event is matched, in
  order, with the action of the explanation that emits it, and the phase it saw must be one
  the model's block takes *after* that action within the call (a later action of the same
  call may have moved it on, as a store run reports its blocks once its loop is over);
* **the log's readers**: ``HeterogeneousKVCache.events_of(kind)`` is the log's events of that
  kind in order, compared with the log itself after every call that emitted any; and a
  subscriber unsubscribed receives nothing more (one is subscribed and unsubscribed at once
  for every new cache).

The threaded mode is left out (a worker thread delivers while the call goes on).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvstate.spec.phases import Graph
from kvstate.spec.state import ConcreteState
from kvstate.targets.api.base import CallCheck

Step = tuple[str, dict[str, int]]


def _log(h: Any) -> Any:
    """The one read of the cache's internals here: the raw event log (``EventLog.events``)."""
    return h.cache.events


class Delivery(CallCheck):
    def __init__(self, h: Any) -> None:
        self.seen: list[tuple[str, int, int]] = []  # (kind, block, ckv shown at delivery)
        self.gone: list[Any] = []
        self.restart(h)

    def restart(self, h: Any) -> None:
        log = _log(h)
        self.seen = []
        self.gone = []
        log.subscribe(self._at_delivery(h))
        log.subscribe(self.gone.append)()  # unsubscribed at once: it must receive nothing

    def _at_delivery(self, h: Any) -> Any:
        def at(ev: Any) -> None:
            b = h._blocks.get(ev.key)
            if b is not None and not h.threads:
                self.seen.append((ev.kind.value, b, h.observe()["ckv"][b]))

        return at

    def before(self, h: Any, o: Any) -> None:
        self.seen = []

    def refused(self, h: Any, o: Any) -> None:
        self._gone(h, o)

    def after(
        self, h: Any, o: Any, before: ConcreteState, steps: Sequence[Step], end: ConcreteState
    ) -> None:
        from kvstate.targets.api.base import _EVENTS_OF

        self._gone(h, o)
        if h.threads or not self.seen:
            return
        # the model's block phases after each step, and the steps that emit each event
        states = [before]
        for name, p in steps:
            states.append(h.machine.step(states[-1], name, p))
        emits: dict[tuple[str, int], list[int]] = {}
        for j, (name, p) in enumerate(steps):
            b = p.get("b")
            if b is None:
                continue
            kinds = [k for k, _ in _EVENTS_OF.get(name, ())]
            g0, g1 = states[j].values["graph"], states[j + 1].values["graph"]
            if g0 == Graph.CAPTURED and g1 != g0:
                kinds.append("stale_graph")
            for k in kinds:
                emits.setdefault((k, b), []).append(j)
        bad = []
        for kind, b, ckv in self.seen:
            at = emits.get((kind, b))
            if not at:
                continue  # not the explanation's (the harness's own event check reports it)
            j = at.pop(0)
            later = {s.values["ckv"][b] for s in states[j + 1 :]}
            if ckv not in later:
                bad.append(
                    f"'{kind}' of block {b} delivered while it was in phase {ckv}, not one its "
                    f"'{steps[j][0]}' leads to in this call ({sorted(later)})"
                )
        if bad:
            raise h.fail("events", [o.name], f"{o.render()}: " + "; ".join(bad[:3]))
        h.cov.add("check: events at delivery")
        log = list(_log(h).events)
        kinds = {e[0] for e in log}
        for kind in kinds:
            want = [tuple(e) for e in log if e[0] is kind]
            got = [tuple(e) for e in h.cache.events_of(kind)]
            if got != want:
                raise h.fail(
                    "events", [o.name], f"after {o.render()}: events_of({kind}) is {got[:3]}..."
                )

    def _gone(self, h: Any, o: Any) -> None:
        if self.gone:
            raise h.fail(
                "events", [o.name], f"{o.render()}: an unsubscribed subscriber got {self.gone[:2]}"
            )
