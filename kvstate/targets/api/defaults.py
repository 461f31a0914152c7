"""The default and NumPy-integer forms of the maintenance calls do all they can, like the
plain ones.

``evict()``, ``spill()`` and ``drop()`` take ``n=1`` by default (``evict(np.int32(n))`` a NumPy
count): "up to n".  The plain calls' check (:mod:`kvstate.targets.api.exhaust`) holds a call
that did fewer than asked to the blocks the table let it take at both ends; the other forms
(``evict_default``, ``spill_np``, ... in :mod:`kvstate.targets.api.args`) were compared only
with their own explanation, so a default of 0, or a count misread, did nothing and was
explained.  The check: such a call that did fewer than its ``n`` left no block behind that the
table's guard allowed before and after the call (outside a full disk).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvstate.spec.state import ConcreteState
from kvstate.targets.api.base import CallCheck
from kvstate.targets.api.exhaust import COUNTED, EXHAUSTIVE

Step = tuple[str, dict[str, int]]


class DefaultForms(CallCheck):
    def after(
        self, h: Any, o: Any, before: ConcreteState, steps: Sequence[Step], end: ConcreteState
    ) -> None:
        done = getattr(h, "maint_done", None)
        if done is None or o.name in COUNTED or h.disk_full:
            return
        name, n, returned = done
        if name not in EXHAUSTIVE or not isinstance(returned, int) or returned >= n:
            return
        m, action = h.machine, COUNTED[name]
        left = [
            b
            for b in range(h.N)
            if m.is_enabled(before, action, {"b": b}) and m.is_enabled(end, action, {"b": b})
        ]
        h.cov.add("check: a maintenance call's other forms did all they could")
        if left:
            raise h.fail(
                "stopped-early",
                [o.name],
                f"{o.render()} did {returned} of {n} and stopped, though the table lets blocks "
                f"{left} '{action}' before and after the call",
            )
