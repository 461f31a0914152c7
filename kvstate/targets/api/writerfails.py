"""A writer that raises partway through the store of ``finish``.

``finish`` stores a request's new blocks through the cache's writer, then releases its pins.
Where the writer raises at some block, the library documents (``WriterFailed``) that the
failing block is discarded, the blocks before it stay stored, and the request is released all
the same.  ``spec/api.py`` explains such a call by ``finish_writer_failed``: the stores that
completed, the failing block's (and the run's later blocks') allocations given back, the
release.  ``finish_fails(i, k)`` finishes request ``i`` with the test writer armed to raise at
its ``k``-th call of the call (a call per group and block: ``k`` picks how far the run gets),
and checks that the call raised ``WriterFailed`` (or stored everything, when the run made fewer
calls); the harness then explains the change by the table and checks the pools' accounting (a
slot the failed run took and kept is a leak) and the bytes of every later read.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hypothesis import strategies as st

from kvstate.harness.trace import TraceStep
from kvstate.spec.phases import CKV, Req
from kvstate.spec.state import ConcreteState
from kvstate.targets.api.base import CallCheck, Harness, op
from kvstate.targets.api.declare import OpDecl
from kvstate.targets.api.storeroom import EVICT, SLIDE, past_gap

Step = tuple[str, dict[str, int]]
# the actions that make room for a store (kvstate/targets/api/storeroom.py, from the table's
# ROOM macro): a block evicted frees its slot (and its window's pages), a window slid its pages
_ROOM = (EVICT, SLIDE)


class _WriterBroke(RuntimeError):
    """The failure the harness injects into the writer."""


def do_finish_fails(h: Harness, o: TraceStep) -> int | None:
    from kvstate.impl.errors import WriterFailed
    from kvstate.impl.testdata import DeterministicWriter

    i, k = o.arg("i"), o.inputs.get("k", 0)
    lv, w = h.live[i], h.view.writer
    s = lv.req.slot if lv is not None else None
    if lv is None or lv.ctx is None or s is None or s.phase != Req.USING:
        h.call_override = "read"
        return None
    if type(w) is not DeterministicWriter:  # another example's writer (handed.py)
        h.call_override = "read"
        return None
    r = s.index
    real, calls = w.rows, [0]

    def rows(*a: Any, **kw: Any) -> Any:
        if calls[0] == k:
            raise _WriterBroke(f"the writer's call {k} fails (injected)")
        calls[0] += 1
        return real(*a, **kw)

    w.rows = rows  # type: ignore[method-assign]
    failed = False
    try:
        h.cache.finish(lv.req)  # the entry point itself (its default: store); the ``with``
        lv.ctx.__exit__(None, None, None)  # block's exit then does nothing more
    except WriterFailed as exc:
        failed = True
        if not isinstance(exc.__cause__, _WriterBroke):
            raise h.fail(
                "api", ["finish"], f"{o.render()}: WriterFailed without the writer's exception"
            ) from exc
    finally:
        del w.rows
    h.writer_failed = failed  # (FinishStores below)
    if not failed and calls[0] > k:
        raise h.fail("api", ["finish"], f"{o.render()}: the writer raised, finish did not")
    h.cov.add("fault writer raises in finish" if failed else "finish without reaching the fault")
    if lv.req.slot is not None:
        raise h.fail("api", ["finish"], f"{o.render()}: the request still holds its slot")
    if lv.run is not None:
        h.released[i] = (lv.run, lv.want[: len(lv.req.tokens)].copy())
    h.live[i] = None
    h.done[i] = lv
    h.ended = lv
    return r


class FinishStores(CallCheck):
    """A ``finish`` that stores (the default) and does not fail stores every full block of
    its request that is stored nowhere, where the device had a free slot and SWA pages for
    each (free before the call, or of blocks the table let it evict and windows it let it
    slide) (``HeterogeneousKVCache.finish``: the run makes room, the least
    recently used first, and stops only where capacity runs out).  The
    table lets ``finish`` store none of them (``STORE* release``): a library that skips the
    store, or stops its run early, is explained, and only this check sees it."""

    def __init__(self) -> None:
        self.want: list[int] = []
        self.room = 0
        self.pages = 0
        self.others: dict[str, int] = {}
        self.paged: set[int] = set()

    def before(self, h: Any, o: Any) -> None:
        self.want = []
        h.writer_failed = False
        if o.name not in ("finish", "finish_fails"):
            return
        lv = h.live[o.arg("i")]
        s = lv.req.slot if lv is not None else None
        if lv is None or lv.ctx is None or s is None or s.phase != Req.USING:
            return
        free = int(CKV.FREE)
        full = min(len(lv.req.tokens) // h.L, h.N)
        ckv = h.model.values["ckv"]
        self.want = [b for b in range(full) if ckv[b] == free]
        view = h.view
        self.room = int(view.stats()["device_free"])
        self.pages = int(view.tiers.swa_pool.free)
        # another prompt's blocks (outside the modelled chain): the cache's guard reads, which
        # facade.py checks against the model on the chain's blocks
        chain = set(h.rids)
        others = [rid for rid in view.index.values() if rid not in chain]
        # a window kept in a host copy or a disk entry holds no device pages: sliding it makes
        # no room, so only the windows that hold pages now count toward SWA room
        pages = view.meta.swa_pages
        self.paged = {b for b in range(h.N) if pages[h.rids[b]]}
        self.others = {
            a: sum(1 for rid in others if view.can(a, rid) and (a != SLIDE or pages[rid]))
            for a in _ROOM
        }

    def after(
        self, h: Any, o: Any, before: ConcreteState, steps: Sequence[Step], end: ConcreteState
    ) -> None:
        if not self.want or h.writer_failed:
            return
        free = int(CKV.FREE)
        left = [b for b in self.want if end.values["ckv"][b] == free]
        past_gap(h, o, self.want, left)
        # room the call could make: a slot for each block, free or of a block the table lets
        # evict; SWA pages for its window, free or of a window the table lets slide (the
        # chain's blocks, before the call, and another prompt's: the store pins none of them,
        # and the release only unpins)
        per = int(h.view.tiers.swa_pages_per_block)
        m = h.machine

        def may(action: str) -> int:
            chain = sum(
                1
                for b in range(h.N)
                if (action != SLIDE or b in self.paged) and m.is_enabled(before, action, {"b": b})
            )
            return chain + self.others.get(action, 0)

        if self.room + may(EVICT) < len(self.want):
            h.cov.add("a finish short of device slots (its stores not required)")
            return
        if self.pages + per * may(SLIDE) < per * len(self.want):
            h.cov.add("a finish short of SWA pages (its stores not required)")
            return
        h.cov.add("check: a finish stored what the device had room for")
        if left:
            raise h.fail(
                "finish-stores",
                ["finish"],
                f"{o.render()} left blocks {left} of its request stored nowhere, with "
                f"{self.room} device slots free for {len(self.want)} blocks, and room the table "
                "let it make (blocks to evict, windows to slide) left untaken",
            )


DECLS: tuple[OpDecl, ...] = (
    OpDecl(
        "finish_fails",
        do_finish_fails,
        "finish_writer_failed",
        lambda s: {"i": s.slot, "k": st.integers(0, 6)},
        faults=("writer",),
        rule=False,  # scripted (walks below; the warm-up may start an example with one)
    ),
)


def walks(N: int, L: int, lease_max: int) -> dict[str, list[Any]]:
    """Witnesses: the writer raises at the first, a middle and a late block of a finish's
    run; with the chain's head stored before (the run starts past a hit) and with the device
    full of another namespace's blocks (the run makes room first); each followed by a hit
    over what was stored, its bytes checked."""
    full = N * L + 1
    hit = [
        op("request", i=1, n=full, life=1),
        op("admit", i=1),
        op("use", i=1),
        op("read", i=1),
        op("finish", i=1),
    ]
    out: dict[str, list[Any]] = {}
    for k in (0, 2, 5):
        out[f"the writer raises at call {k} of a finish"] = [
            op("request", i=0, n=full, life=lease_max),
            op("admit", i=0),
            op("use", i=0),
            op("finish_fails", i=0, k=k),
            *hit,
        ]
    out["the writer raises in a finish past a hit, the device full"] = [
        op("request", i=0, n=L + 1, life=lease_max),
        op("admit", i=0),
        op("use", i=0),
        op("finish", i=0),
        op("foreign", ns=0, n=full),
        op("tick", t=lease_max),
        op("request", i=0, n=full, life=1),
        op("admit", i=0),
        op("use", i=0),
        op("finish_fails", i=0, k=3),
        *hit,
    ]
    return out
