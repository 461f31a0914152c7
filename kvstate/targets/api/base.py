"""The pieces every module of the API harness shares, so none of them imports another back.

An operation (:func:`op`: the toolkit's :class:`~kvstate.harness.trace.TraceStep`), a harness request's live state (:class:`Live`), the
coverage counters (:class:`Coverage`), the cache namespaces, the chain's block events of each
action, and the hook protocol of the checks around every call (:class:`CallCheck`).  The
harness itself (:class:`kvstate.targets.api.state.ApiHarness`) reaches the operations and checks as
``h``, typed :data:`Harness` here: a module below the harness cannot name its class without
importing it, which is the cycle this module exists to prevent.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kvstate.harness.trace import Step, TraceStep
from kvstate.spec.state import ConcreteState

NAMESPACE = "kvstate-api-harness"
OTHER_NAMESPACE = "kvstate-api-other"


# ---- operations: the toolkit's trace type ------------------------------------------------------
def op(name: str, **args: int) -> TraceStep:
    """One harness operation: a public call (or a fault) with its integer arguments."""
    return TraceStep(name, dict(args))


@dataclass(frozen=True)
class Chain:
    """The scripted walks' common start: request 0 stores the whole chain (``N * L + 1`` tokens:
    every block can be hit) and its lease runs out (``store``); then every block offloaded to
    the host (``to_host``); then, the host tier holding two blocks, those spilled and the rest
    offloaded and spilled (``to_disk``: every block on disk)."""

    full: int
    finished: list[TraceStep]  # stored and finished, the lease not yet run out
    store: list[TraceStep]
    to_host: list[TraceStep]
    to_disk: list[TraceStep]


def chain(N: int, L: int, lease_max: int) -> Chain:
    """:class:`Chain` for a pool of ``N`` blocks of ``L`` tokens."""
    full = N * L + 1
    finished = [op("request", i=0, n=full, life=1), op("admit", i=0), op("use", i=0)]
    finished.append(op("finish", i=0))
    store = [*finished, op("tick", t=lease_max)]
    to_host = [*store, op("offload", n=N), op("drain")]
    to_disk = [*to_host, op("spill", n=N), op("offload", n=N), op("drain"), op("spill", n=N)]
    return Chain(full, finished, store, to_host, to_disk)


@dataclass
class Live:
    """A request the harness (the "engine") holds."""

    req: Any
    want: np.ndarray  # the tokens the caller meant: a private copy
    buf: np.ndarray  # the caller's own buffer (the request got a view of it)
    ctx: Any = None
    run: Any = None


@dataclass
class Coverage:
    counts: Counter[str] = field(default_factory=Counter)

    def add(self, k: str, n: int = 1) -> None:
        self.counts[k] += n


# the chain's block events each action emits: (kind, tier), the tier "load" (the load's
# pipeline's: disk or host) or "drop" (where the dropped copy was)
_EVENTS_OF: dict[str, tuple[tuple[str, str], ...]] = {
    "commit": (("stored", "device"),),
    "evict_done": (("evicted", "device"),),
    "offload_done": (("evicted", "device"), ("stored", "host")),
    "spill": (("stored", "disk"),),
    "load_done": (("loaded", "load"),),
    "load_fail": (("load_failed", "load"),),
    "drop": (("removed", "drop"),),
}

# The harness (:class:`kvstate.targets.api.state.ApiHarness`) as the operations, checks and fault
# installers see it: they take it as ``h`` and never import it back (no import cycle).
Harness = Any


# ---- the hook protocol: the checks around every operation (kvstate/targets/api/checks.py) --------------
class CallCheck:
    def before(self, h: Any, o: Any) -> None:
        pass

    def after(
        self, h: Any, o: Any, before: ConcreteState, steps: Sequence[Step], end: ConcreteState
    ) -> None:
        pass

    def refused(self, h: Any, o: Any) -> None:
        pass

    def restart(self, h: Any) -> None:
        pass


def derive_once(table: Any, tag: Any, make: Any) -> Any:
    """``make(table)``, made once per (table, ``tag``) and kept: a derived table compiles its
    guards anew, which costs more than the example it starts.  Keyed by the table's id and
    checked by identity (an id is reused once its table is gone)."""
    hit = _DERIVED_TABLES.get((id(table), tag))
    if hit is not None and hit[0] is table:
        return hit[1]
    out = make(table)
    _DERIVED_TABLES[(id(table), tag)] = (table, out)
    return out


_DERIVED_TABLES: dict[tuple[int, Any], tuple[Any, Any]] = {}


def first_in_example(h: Any) -> bool:
    """Whether the operation being applied is its example's first (after ``pools``): only
    then may it start the example over on another table (a running cache keeps its own)."""
    if any(s.name != "pools" for s in h.steps[:-1]):
        h.call_override = "read"
        return False
    return True


def renew_on(h: Any, other: Any, what: str) -> None:
    """Start the example over on ``other``, a table derived from the harness's: the cache and
    the harness's own state anew (its operation log, coverage, threads and cache arguments
    kept); :class:`kvstate.targets.api.geometry.NewModel` then takes the new table's model."""
    steps, cov, threads, kw = h.steps, h.cov, h.threads, dict(h.cache_kwargs)
    h.close()
    h.renew(other, threads=threads, coverage=cov, cache_kwargs=kw)
    h.steps = steps
    h.cov.add(what)
