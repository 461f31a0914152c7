"""The token arrays the cache hands out refuse writes, as documented.

``Request.tokens`` is documented read-only ("the keys were computed from them"): the cache
keeps the array it returns (the records' token blocks are slices of it), so a caller who writes
into it changes what the cache will write and check for blocks already keyed.  The harness's
``token_reuse`` fault mutates the caller's *own* buffer after the call (the cache must have
copied it); the array the cache hands back was never written to.  Here, after each ``request``
and ``append``, writing a token of ``Request.tokens`` back in place must raise (numpy's
``ValueError`` for a read-only array); the value written is the one there, so nothing changes
either way.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvstate.spec.state import ConcreteState
from kvstate.targets.api.base import CallCheck

Step = tuple[str, dict[str, int]]


class ReadOnlyTokens(CallCheck):
    def after(
        self, h: Any, o: Any, before: ConcreteState, steps: Sequence[Step], end: ConcreteState
    ) -> None:
        if o.name not in ("request", "append") or h.threads:
            return
        lv = h.live[o.arg("i")]
        if lv is None:
            return
        t = lv.req.tokens
        if not len(t):
            return
        try:
            t[-1] = t[-1]
        except ValueError:
            h.cov.add("check: a request's tokens refuse writes")
            return
        raise h.fail(
            "read-only",
            ["tokens"],
            f"{o.render()}: Request.tokens (documented read-only) accepted a write",
        )
