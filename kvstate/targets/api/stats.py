"""``cache.stats()`` against the model, after every call.

``stats()`` is what an operator's dashboard reads: the blocks the cache knows counted by the
phase of their compressed KV, the disk entries, the disk loads in flight, the clock, the graph's
phase.  Nothing else in the harness reads it, so a count that drifts from the blocks' phases (a
disk entry left counted after its load, a phase named wrong) goes unseen.  After every call it
is compared with the model's state: each phase but FREE (a forgotten block may leave the key
index: tombstones are not counted) has as many blocks as the model's chain has in it, the disk
entries are the model's blocks on disk (``DISK``, or ``LOADING`` on the I/O pipeline: an
entry is let go of only when its load lands), and ``io_inflight``, ``now`` and ``graph`` are
the model's.  Only while the cache holds no block outside the modelled chain (another prompt's:
the model has not them).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from kvstate.spec.phases import CKV, Pipe
from kvstate.spec.state import ConcreteState
from kvstate.targets.api.base import CallCheck
from kvstate.targets.api.exhaust import _off_chain

Step = tuple[str, dict[str, int]]


class StatsCheck(CallCheck):
    def after(
        self, h: Any, o: Any, before: ConcreteState, steps: Sequence[Step], end: ConcreteState
    ) -> None:
        if h.threads or _off_chain(h):
            return
        got = h.cache.stats()
        v = end.values
        ckv = Counter(CKV(x) for x in v["ckv"])
        bad = [
            f"blocks[{p.name.lower()!r}] = {got['blocks'].get(p.name.lower())}, the model has "
            f"{ckv[p]}"
            for p in CKV
            if p is not CKV.FREE and got["blocks"].get(p.name.lower()) != ckv[p]
        ]
        on_disk = sum(
            1
            for c, pipe in zip(v["ckv"], v["ldpipe"], strict=True)
            if c == CKV.DISK or c == CKV.LOADING and pipe == Pipe.IO
        )
        want = {"disk_entries": on_disk, "io_inflight": v["io_inflight"], "now": v["now"]}
        want["graph"] = v["graph"]
        bad += [f"{k} = {got[k]}, the model has {w}" for k, w in want.items() if got[k] != w]
        if bad:
            raise h.fail("stats", [bad[0].split(" ")[0]], f"after {o.render()}: " + "; ".join(bad))
        h.cov.add("check: stats() against the model")
