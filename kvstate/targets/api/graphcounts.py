"""The graph registry's counters against the graph actions that explain each call.

``view.graph.captures`` and ``replays`` count the captures (``capture`` and ``recapture``
record the addresses the graph saw) and the replays the registry ran: what an engine reads to
see how often its graph was captured again.  Nothing compared them: a registry that counts a
capture twice, or a replay never, passed.  After every call (refused ones change neither),
each counter's change must be the number of the call's explaining steps of those actions
(the table's graph lifecycle, ``graph_actions``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvstate.spec.state import ConcreteState
from kvstate.targets.api.base import CallCheck
from kvstate.targets.api.graphs import graph_actions

Step = tuple[str, dict[str, int]]


class GraphCounts(CallCheck):
    def __init__(self) -> None:
        self.was = (0, 0)

    def _read(self, h: Any) -> tuple[int, int]:
        g = h.view.graph
        return int(g.captures), int(g.replays)

    def before(self, h: Any, o: Any) -> None:
        self.was = self._read(h)

    def after(
        self, h: Any, o: Any, before: ConcreteState, steps: Sequence[Step], end: ConcreteState
    ) -> None:
        if h.threads:
            return
        acts = graph_actions(h.table)
        replay = {a for a in acts if a == "replay"}
        names = [n for n, _ in steps if n in acts]
        want = (
            self.was[0] + sum(1 for n in names if n not in replay),
            self.was[1] + sum(1 for n in names if n in replay),
        )
        got = self._read(h)
        if names:
            h.cov.add("check: the graph registry's counters")
        if got != want:
            raise h.fail(
                "graph-counts",
                [o.name],
                f"{o.render()}: the graph registry counts (captures, replays) {got}, "
                f"{self.was} before a call explained by {names}",
            )

    def restart(self, h: Any) -> None:
        self.was = self._read(h)
