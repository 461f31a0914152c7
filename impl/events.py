"""Cache events for metrics and for the test harness (vLLM's KV events, extended to tiers).

Events are appended to a bounded list and handed to callbacks synchronously, inside the cache's
lock, so a callback sees them in transition order; callbacks must be quick and must not call
back into the cache.  A callback that raises does not break the call that emitted the event (a
store half done: committed blocks never sealed, reported as the writer's failure): its
exception is recorded in :attr:`EventLog.callback_errors` and delivery goes on.
"""

from __future__ import annotations

import enum
import threading
from collections import deque
from collections.abc import Callable
from typing import Any, Final, NamedTuple


class EventKind(enum.Enum):
    """What happened to a block or a request; an engine's own index (a KV-aware router, a
    metrics exporter) follows the cache through these instead of polling ``stats()``."""

    STORED = "stored"  # a block's content became available in a tier (device/host/disk)
    REMOVED = "removed"  # a cached entry was deleted (dropped, or rejected as corrupt)
    LOADED = "loaded"  # a host/disk copy finished loading back to the device
    EVICTED = "evicted"  # the device copy of a block was reclaimed (evict or offload)
    DOWNGRADED = "downgraded"  # a request gave up its hit and recomputes
    LOAD_FAILED = "load_failed"  # a load failed; the hit is truncated and recomputed
    STALE_GRAPH = "stale_graph"  # a recovery moved an address a captured graph recorded


class Event(NamedTuple):
    """One event (a named tuple: a stored block emits one or two on the request path)."""

    kind: EventKind
    key: bytes | None  # the block's chain hash, when the event concerns one block
    tier: str = ""  # "device" / "host" / "disk"
    detail: str = ""
    request: int | None = None  # request id, for request events


Callback = Callable[[Event], None]
_tuple_new: Final[Any] = tuple.__new__


Raw = tuple[EventKind, bytes | None, str, str, int | None]  # an Event's fields


class EventLog:
    """Recent events (``maxlen`` of them) plus subscribers.

    The log keeps each event as a plain tuple of its fields and makes the :class:`Event` when
    one is read (``of``) or delivered to a subscriber: building a named tuple costs a few
    thousand instructions even compiled (its ``__new__`` is interpreted, ``tuple.__new__``
    parses its arguments), and a stored block logs two events, most never read."""

    def __init__(self, maxlen: int = 100_000) -> None:
        self.events: deque[Raw] = deque(maxlen=maxlen)
        self._callbacks: list[Callback] = []
        self._lock = threading.Lock()
        # what raising callbacks raised (the latest 100): never into the emitting call
        self.callback_errors: deque[str] = deque(maxlen=100)

    def subscribe(self, cb: Callback) -> Callable[[], None]:
        """Register ``cb``; returns a function that unsubscribes it."""
        with self._lock:
            self._callbacks.append(cb)

        def unsubscribe() -> None:
            with self._lock:
                if cb in self._callbacks:
                    self._callbacks.remove(cb)

        return unsubscribe

    def emit(
        self,
        kind: EventKind,
        key: bytes | None = None,
        tier: str = "",
        detail: str = "",
        request: int | None = None,
    ) -> None:
        """Log one event and deliver it to the subscribers (kept as a plain tuple: the
        :class:`Event` is made only when someone reads or receives it)."""
        raw = (kind, key, tier, detail, request)
        self.events.append(raw)
        if self._callbacks:
            self._deliver(_tuple_new(Event, raw))

    def emit_run(self, kind: EventKind, keys: list[bytes | None], tier: str) -> None:
        """One event per key, in order, as ``emit`` one by one would log and deliver them: a
        store or an eviction run reports its blocks once its loop is over (one deque extend,
        where a call per block was a third of a stored block's cost in the compiled build)."""
        if not keys:
            return
        raws = [(kind, key, tier, "", None) for key in keys]
        self.events.extend(raws)
        if self._callbacks:
            for raw in raws:
                self._deliver(_tuple_new(Event, raw))

    def _deliver(self, ev: Event) -> None:
        for cb in list(self._callbacks):
            try:
                cb(ev)
            except Exception as exc:  # noqa: BLE001 - a subscriber's bug, not the cache's
                self.callback_errors.append(f"{cb!r} on {ev.kind.value}: {exc!r}")

    def of(self, kind: EventKind) -> list[Event]:
        """The logged events of one kind, oldest first (the log keeps the latest ``maxlen``)."""
        new = _tuple_new
        return [new(Event, e) for e in self.events if e[0] is kind]

    def clear(self) -> None:
        """Forget the logged events (subscribers stay subscribed)."""
        self.events.clear()
