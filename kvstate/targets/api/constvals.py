"""The table's constants at other values: a disk load of three steps, one load at a time.

Every table the harness runs has ``load_steps`` 2 and ``io_cap`` 2 (``small()``'s), so what
the allocator computes from them is met at one value only: with two chunks the first is also
the second-to-last, and a read that sizes the payload by ``chunks[1]`` instead of
``chunks[-1]`` reads all of it; with ``io_cap`` 2 the I/O workers number two however they are
counted.  ``consts(k)``, an example's first operation (a no-op anywhere else, like
``geometry``), starts the example over on the table derived for ``small()`` with
``load_steps`` 3 and ``io_cap`` 1 (``Table.derive(geometry=...)``): a fresh cache, its own
model and explainer, every check anew; nothing is restated.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from kvstate.spec.table import Table
from kvstate.targets.api.base import derive_once, first_in_example, renew_on
from kvstate.targets.api.declare import OpDecl

LOAD_STEPS, IO_CAP = 3, 1


def derived(table: Table) -> Table | None:
    """The table on its geometry with the other constants (built once per table and kept)."""
    return derive_once(table, "consts", _make)


def _make(table: Table) -> Table | None:
    g = table.geometry
    if g.name != "small":
        return None
    other_g = dataclasses.replace(g, load_steps=LOAD_STEPS, io_cap=IO_CAP)
    return table.derive(name=f"{table.name}@steps{LOAD_STEPS}io{IO_CAP}", geometry=other_g)


def do_consts(h: Any, o: Any) -> int | None:
    if not first_in_example(h):  # a running cache keeps its table
        return None
    other = derived(h.table)
    if other is None:
        return None
    renew_on(h, other, "check: examples at other constants (load_steps, io_cap)")
    return None


def walks(N: int, L: int, lease_max: int) -> dict[str, list[Any]]:
    """Witness: at the other constants, a chain stored, taken to disk, restored and hit."""
    from kvstate.targets.api.base import chain, op

    c = chain(N, L, lease_max)
    return {
        "other constants: a chain stored, spilled, restored and hit": [
            op("consts"),
            *c.store,
            op("offload", n=N),
            op("drain"),
            op("spill", n=N),
            op("offload", n=N),
            op("drain"),
            op("spill", n=N),
            op("request", i=1, n=c.full, life=1),
            op("admit", i=1),
            op("drain"),
            op("use", i=1),
            op("read", i=1),
            op("finish", i=1),
        ]
    }


DECLS = (OpDecl("consts", do_consts, "read", rule=False),)  # scripted: the walk above
