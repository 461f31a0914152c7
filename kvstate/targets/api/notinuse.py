"""Calls that need a request in use, made before its ``use``; appends that complete no block.

``finish`` and ``append`` act on a request in use (the table's ``release`` guard holds on its
slot: docs/library.md).  The harness calls them only inside ``use``, so their refusal of an
admitted request not yet used (validated, or pending its recovery) was never run:

* ``finish_early(i)``: ``finish`` before ``use`` must raise the documented ``Refused`` and change
  nothing, where the table refuses the action that ends ``finish`` (``release``) on its slot;
* ``append_early(i)``: ``append`` before ``use`` must raise ``Refused`` (appending stores the
  request's blocks: a request not in use has no run to append to) and change nothing.

The walks also append a single token, then a block's worth, to a request in use: an append that
completes no block stores nothing and slides no window (the harness explains it as nothing).
"""

from __future__ import annotations

from typing import Any

from kvstate.targets.api.base import chain, op
from kvstate.targets.api.declare import OpDecl


def _admitted(h: Any, o: Any) -> Any:
    """The request ``i`` admitted and not in use, or None (nothing to call: nothing changes)."""
    lv = h.live[o.arg("i")]
    if h.threads or lv is None or lv.ctx is not None or lv.req.slot is None:
        h.call_override = "read"
        return None
    return lv


def do_finish_early(h: Any, o: Any) -> int | None:
    from kvstate.impl.errors import Refused

    lv = _admitted(h, o)
    if lv is None:
        return None
    r = lv.req.slot.index
    release = h.table.action(_release(h))
    if not h.machine.failed_conjuncts(h.model, release, {"r": r}):
        return None  # (the table would release it: not a request out of use)
    try:
        h.cache.finish(lv.req)
    except Refused:
        h.cov.add("check: finish before use refused")
        raise
    raise h.fail(
        "finish-not-in-use",
        ["finish"],
        f"{o.render()}: finish before use was accepted, though the table refuses "
        f"{release.name} on slot {r}",
    )


def _release(h: Any) -> str:
    """The action that ends ``finish``'s pattern (spec/api.py): the one a request in use takes."""
    from kvstate.spec.api import API

    return API["finish"].patterns[0].split()[-1]


def do_append_early(h: Any, o: Any) -> int | None:
    from kvstate.impl.errors import Refused

    lv = _admitted(h, o)
    if lv is None:
        return None
    n = len(lv.req.tokens)
    try:
        h.cache.append(lv.req, h.tokens[n : n + h.L])
    except Refused:
        h.cov.add("check: append before use refused")
        raise
    raise h.fail("append-not-in-use", ["append"], f"{o.render()}: append before use was accepted")


def walks(N: int, L: int, lease_max: int) -> dict[str, list[Any]]:
    c = chain(N, L, lease_max)
    calls = [op("finish_early", i=1), op("append_early", i=1)]
    tail = [
        op("use", i=1),
        op("append", i=1, k=1),
        op("append", i=1, k=L),
        op("read", i=1),
        op("finish", i=1),
    ]
    return {
        "finish and append before use (validated)": [
            *c.finished,
            op("request", i=1, n=(N + 1) * L, life=2),  # a block more than was stored
            op("admit", i=1),
            *calls,
            *tail,
        ],
        "finish and append before use (pending its recovery)": [
            *c.to_host,
            op("request", i=1, n=c.full, life=2),
            op("admit", i=1),
            *calls,
            op("drain"),
            *tail,
        ],
    }


# scripted only (the walks above): the declarations' form is kvstate/targets/api/declare.py's
DECLS: tuple[OpDecl, ...] = (
    # "read": refused, nothing may change (the table's refusal is asked above: ``finish``'s
    # own pattern has no empty way, so a refusal-only operation on it would read as vacuous)
    OpDecl("finish_early", do_finish_early, "read", lambda s: {"i": s.slot}, rule=False),
    OpDecl("append_early", do_append_early, "append", lambda s: {"i": s.slot}, rule=False),
)
