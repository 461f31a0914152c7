"""The admission cap reached: an example on the table derived for a geometry that lets fewer
blocks be pinned at once than one request's hit.

The default geometry pins up to 48 blocks at once; the harness's chain has four, so ``pin``'s
``pin_cap`` conjunct is never false and an admission is never downgraded at the cap
(``admit``'s second pattern, ``admit touch* match downgrade``, in ``spec/api.py``): the code
of that path -- the refusal named from the table's conjuncts, the hit given up, the
``Admission`` marked "downgraded" with its reason, the request recomputed -- never runs.
``pincap``, an example's first operation (a no-op anywhere else, like ``geometry``), rebuilds
the example on the same table derived for the same geometry with ``pin_cap_blocks`` one block
short of the chain (``Table.derive(geometry=...)``): a fresh cache, model and explainer, every
check anew (an admission's public fields against the model's request:
``kvstate/targets/api/recoveryhit.py``).  The cap is the geometry's, read by the table's own
conjunct; nothing is restated.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from kvstate.spec.table import Table
from kvstate.targets.api.base import derive_once, first_in_example, op, renew_on
from kvstate.targets.api.declare import OpDecl

Step = tuple[str, dict[str, int]]


def capped(table: Table, blocks: int) -> Table:
    """The table on its geometry with at most ``blocks`` blocks pinned at once (kept)."""
    return derive_once(
        table,
        ("pin_cap", blocks),
        lambda t: t.derive(
            name=f"{t.name}@pin_cap{blocks}",
            geometry=replace(t.geometry, pin_cap_blocks=blocks),
        ),
    )


def do_pincap(h: Any, o: Any) -> int | None:
    if not first_in_example(h):  # a running cache keeps its table
        return None
    renew_on(h, capped(h.table, max(1, h.N - 1)), "check: examples at a small admission cap")
    return None


def walks(N: int, L: int, lease_max: int) -> dict[str, list[Any]]:
    """Witnesses at a cap of ``N - 1`` blocks: a whole-chain hit given up at the cap, alone
    and beside a request that holds a hit at the cap."""
    if N < 3:
        return {}
    full = N * L + 1
    return {
        "the admission cap: a hit longer than the cap is given up": [
            op("pincap"),
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
        "the admission cap: a hit at the cap held, a longer one given up beside it": [
            op("pincap"),
            op("request", i=0, n=full, life=lease_max),
            op("admit", i=0),
            op("use", i=0),
            op("finish", i=0),
            op("request", i=1, n=(N - 1) * L + 1, life=lease_max),
            op("admit", i=1),
            op("request", i=0, n=full, life=1),
            op("admit", i=0),
            op("use", i=1),
            op("read", i=1),
            op("use", i=0),
            op("read", i=0),
            op("finish", i=0),
            op("finish", i=1),
        ],
    }


# an example's first operation, scripted by its witnesses (not a rule; the warm-up may start an
# example with one of them)
DECLS = (OpDecl("pincap", do_pincap, "read", rule=False),)
