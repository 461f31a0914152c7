"""Guards that do not compile: an example on the table derived so that no guard conjunct
translates to the fast forms, and the implementation checks every guard through the table's own
callables.

``impl/`` compiles each guard conjunct from its Z3 term (``kvstate.spec.compile``); a conjunct
that does not translate is kept as the table's callable, and then the action has no fused accept
test, no check over a run of blocks (``Guards.run_test``) and no record-indexed locality: the
gate checks a run block by block (``Gate.check_run``), reads a block or global guard on a
one-block view (``Gate.block_state``, ``Gate.global_state``) and names every refusal conjunct
by conjunct (``Guards.failed``).  The default table compiles whole, so those fallbacks never run on it.
``interpreted``, an example's first operation (a no-op anywhere else, like ``pincap``), rebuilds
the example on the same table derived with each conjunct's callable wrapped so that it answers
the same on concrete values but cannot be evaluated on symbolic ones (``Table.derive
(replace_guard=...)``): nothing is restated, the guards are the table's own, and every check of
the harness compares the fallbacks with the model.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import z3

from kvstate.spec.table import Table
from kvstate.targets.api.base import derive_once, first_in_example, op, renew_on
from kvstate.targets.api.declare import OpDecl

Step = tuple[str, dict[str, int]]


def _concrete(fn: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    """``fn`` on concrete values; on symbolic ones it raises, so the compiler keeps the callable
    interpreted (``bool()`` would not do: Z3 answers it for an equation, structurally)."""

    def conj(s: Any, p: Any) -> Any:
        out = fn(s, p)
        if z3.is_expr(out):
            raise TypeError(
                "a guard conjunct kept interpreted (kvstate/targets/api/interpreted.py)"
            )
        return out

    return conj


def interpreted(table: Table) -> Table:
    """``table`` with every guard conjunct kept as an interpreted callable (kept)."""
    return derive_once(
        table,
        "interpreted",
        lambda t: t.derive(
            name=f"{t.name}@interpreted",
            replace_guard={(a.name, c.name): _concrete(c.fn) for a in t.actions for c in a.guard},
        ),
    )


def do_interpreted(h: Any, o: Any) -> int | None:
    if not first_in_example(h):  # a running cache keeps its table
        return None
    renew_on(h, interpreted(h.table), "check: examples whose guards stay interpreted")
    return None


def walks(N: int, L: int, lease_max: int) -> dict[str, list[Any]]:
    """Witnesses on the interpreted table: a chain stored, hit and read back; a CUDA graph
    captured, staled, recaptured and replayed (the global guards)."""
    full = N * L + 1
    return {
        "guards interpreted: a chain stored, hit and read back": [
            op("interpreted"),
            op("request", i=0, n=full, life=lease_max),
            op("admit", i=0),
            op("use", i=0),
            op("finish", i=0),
            op("request", i=1, n=full, life=1),
            op("admit", i=1),
            op("use", i=1),
            op("read", i=1),
            op("finish", i=1),
        ],
        "guards interpreted: a graph captured, staled by a store, recaptured, replayed": [
            op("interpreted"),
            op("capture"),
            op("replay"),
            op("request", i=0, n=full, life=lease_max),
            op("admit", i=0),
            op("use", i=0),
            op("replay"),
            op("recapture"),
            op("replay"),
            op("finish", i=0),
        ],
    }


DECLS = (OpDecl("interpreted", do_interpreted, "read", rule=False),)
