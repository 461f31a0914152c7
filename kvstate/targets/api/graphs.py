"""CUDA-graph capture, replay and recapture in the API harness, and the rows a replay reads.

An engine that runs its step as a CUDA graph captures it over the graph registry's persistent
buffers (``block_tables``, ``state_ptrs``), replays it every step, and recaptures it when a
recovery moved a block's state buffer (the registry turns the graph STALE; the table's
``replay`` guard then refuses).  The operations ``capture``, ``replay`` and ``recapture`` call
the cache's graph protocol (``cache.test_hooks().act``: the cache has no method of its own for it); each is
explained by the table action of the same name (``spec/api.py``), so the graph's phase and the
addresses it recorded (``graph``, ``gaddr``) are compared with the model after every call, and a
move that stales the graph is seen where it happens (a load into another slot, an eviction and
a store) together with its ``stale_graph`` event.

What the table does not show, checked here after every operation (refused ones included):

* **the rows a replay reads**: only a ``use`` refills a row (its request's), so every row holds
  what the last successful ``use`` of its request slot wrote, padded (-1 / 0), whatever
  happened since (stores, slides, appends, finishes, evictions and loads of other requests);
  a row written by another call, into another slot, or left half padded is what a replay of
  the captured graph would read;
* **a replay runs the captured work once** (the registry's function, eagerly on a CPU), and
  reads exactly those rows.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kvstate.spec.state import ConcreteState
from kvstate.targets.api.base import CallCheck
from kvstate.targets.api.declare import OpDecl

Step = tuple[str, dict[str, int]]
Row = tuple[list[int], list[int]]


def graph_actions(table: Any) -> tuple[str, ...]:
    """The table's actions of the lifecycle whose phases are ``Graph`` (capture, replay,
    recapture): the operations this module drives, read off the table, not listed here."""
    from kvstate.spec.phases import LIFECYCLES, Graph

    comp = next(lc.component for lc in LIFECYCLES if lc.phases is Graph)
    return tuple(a.name for a in table.actions if a.component == comp)


def staled(s: ConcreteState, nxt: ConcreteState) -> bool:
    """Whether the step from ``s`` to ``nxt`` staled a captured graph (its ``stale_graph``
    event): the graph's phase left CAPTURED."""
    from kvstate.spec.phases import Graph

    return bool(nxt.mapping["graph"] != s.mapping["graph"] == Graph.CAPTURED)


@dataclass(frozen=True)
class StaleAt:
    """The explanation search's rule (:class:`kvstate.model.apimap.Steer`) for a call whose
    ``stale_graph`` events name ``blocks``: only a step at one of them may stale the graph.
    A store that moves several blocks while a graph is captured stales it at the first one
    it moves; the table lets the blocks be stored in any order, and the end state is the
    same in each, so only the event tells which order the library took."""

    blocks: frozenset[int]

    def allows(
        self, cur: ConcreteState, name: str, p: Mapping[str, int], new: ConcreteState
    ) -> bool:
        return p.get("b") in self.blocks or not staled(cur, new)


def _rows(h: Any) -> list[Row]:
    g = h.view.graph
    return list(zip(g.block_tables.tolist(), g.state_ptrs.tolist(), strict=True))


def do_capture(h: Any, o: Any) -> int | None:
    h.hooks.act("capture")
    return None


def do_replay(h: Any, o: Any) -> int | None:
    h.hooks.act("replay")
    return None


def do_recapture(h: Any, o: Any) -> int | None:
    h.hooks.act("recapture")
    return None


# the graph protocol's calls, each explained by the table action of its name
DECLS: tuple[OpDecl, ...] = (
    OpDecl("capture", do_capture, "capture"),
    OpDecl("replay", do_replay, "replay"),
    OpDecl("recapture", do_recapture, "recapture"),
)


class GraphProtocol(CallCheck):
    def __init__(self, h: Any) -> None:
        self.want: list[Row] = []
        self.read: list[list[Row]] = []
        self.restart(h)

    def restart(self, h: Any) -> None:
        """A new cache: fresh buffers (all padding), and the harness's work registered."""
        self.want = [(list(bt), list(sp)) for bt, sp in _rows(h)]
        pad = any(x != -1 for bt, _ in self.want for x in bt) or any(
            x != 0 for _, sp in self.want for x in sp
        )
        if pad:
            raise h.fail(
                "graph-row", ["open"], f"a new cache's graph rows are not padding: {self.want}"
            )
        self.read = []
        h.hooks.graph_set_function(lambda: self.read.append(_rows(h)))

    def before(self, h: Any, o: Any) -> None:
        self.read = []

    def after(
        self, h: Any, o: Any, before: ConcreteState, steps: Sequence[Step], end: ConcreteState
    ) -> None:
        if o.name in ("foreign", "variant"):  # whole requests of their own: admit, use, end
            busy = {lv.req.slot.index for lv in h.live if lv is not None and lv.req.slot}
            have = _rows(h)
            self.want = [w if r in busy else have[r] for r, w in enumerate(self.want)]
        if o.name == "use":
            lv = h.live[o.arg("i")]
            if lv is not None and lv.run is not None and lv.req.slot is not None:
                # api_handout.GraphRows checked this row against the Run and state_data_ptrs
                self.want[lv.req.slot.index] = _rows(h)[lv.req.slot.index]
        self._check(h, o)
        if o.name == "replay":
            if len(self.read) != 1:
                raise h.fail(
                    "graph-replay", [o.name], f"{o.render()} ran the work {len(self.read)} times"
                )
            h.cov.add("check: graph replays read the rows")
        elif o.name in graph_actions(h.table):
            h.cov.add(f"call {o.name} (graph)")

    def refused(self, h: Any, o: Any) -> None:
        self._check(h, o)
        if o.name == "replay" and self.read:
            raise h.fail("graph-replay", [o.name], f"refused {o.render()} ran the work anyway")

    def _check(self, h: Any, o: Any) -> None:
        have = _rows(h)
        bad = [
            f"row {r} holds {have[r]}, the last use of its slot wrote {self.want[r]}"
            for r in range(len(have))
            if have[r] != self.want[r]
        ]
        bad += [f"a replay read {rows}" for rows in self.read if rows != self.want]
        if bad:
            raise h.fail("graph-row", [o.name], f"after {o.render()}: " + "; ".join(bad[:2]))
        h.cov.add("check: graph rows between uses")
