"""A second geometry: an example's cache, model and harness on the table derived for it.

The harness's table is the default one on the ``small`` geometry (LCM blocks of 16 tokens).
Everything the allocator computes from the geometry -- page and unit sizes, tail rows, the
window policy's spans, the fused forms' strides, the disk entries' sections, the CUDA-graph
table's width -- is then met at one size only, and a slip that holds at 16 tokens (a stride
written for one ratio, a cached answer keyed without the block size) is invisible.
``geometry(k)``, an example's first operation (a no-op anywhere else, like ``pools``), rebuilds
the example on the same table derived for the geometry's other test size (``small(32)``:
``Table.derive(geometry=...)``): a fresh cache over a fresh directory, its own model and
explainer, every check anew.  Nothing is restated: the table, its guards and its invariants
are the derived table's own, and the operations' arguments scale with its block.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvstate.spec.geometry import Geometry, small
from kvstate.spec.state import ConcreteState
from kvstate.spec.table import Table
from kvstate.targets.api.base import CallCheck, derive_once, first_in_example, renew_on
from kvstate.targets.api.declare import OpDecl

Step = tuple[str, dict[str, int]]


def other_geometry(g: Geometry) -> Geometry | None:
    """The geometry's other test size (``small``'s LCM block doubled), or None."""
    if g.name != "small":
        return None
    return small(2 * g.compressed_block_tokens)


def derived(table: Table) -> Table | None:
    """The table on :func:`other_geometry` (built once per table and kept)."""
    return derive_once(table, "geometry", _make)


def _make(table: Table) -> Table | None:
    g = other_geometry(table.geometry)
    if g is None:
        return None
    return table.derive(name=f"{table.name}@{g.name}{g.compressed_block_tokens}", geometry=g)


def do_geometry(h: Any, o: Any) -> int | None:
    if not first_in_example(h):  # a running cache keeps its geometry
        return None
    other = derived(h.table) if o.arg("k") else None
    if other is None:
        return None
    L0 = h.L
    renew_on(h, other, "check: examples on another geometry")
    h.scale = max(1, h.L // L0)  # requests and appends drawn for L0-token blocks, scaled
    return None


def renewed(h: Any, o: Any, before: ConcreteState | None) -> bool:
    """Whether ``o`` started the example over on a derived table (``base.renew_on``): then
    the library's state must be that table's initial one (its constants may differ from the
    old table's: ``constvals``), not a change explained from the old model."""
    from kvstate.model.apimap import state_diff

    if before is None or before.k is h.machine.k:
        return False
    h.model = h.machine.init()
    d = state_diff(h.model.values, h.observe(), h.table)
    if d:
        raise h.fail(
            "renew", [x.split(":")[0] for x in d], f"after {o.render()}:\n  " + "\n  ".join(d)
        )
    h.cov.add(f"call {o.name}")
    return True


class NewModel(CallCheck):
    """After an operation that started the example over on a derived table (``renew_on``:
    ``geometry``, ``pincap``, ``interpreted``): the example's model is that table's initial
    state (the call was explained from the old table's, which is the same value on the same
    chain)."""

    def after(
        self, h: Any, o: Any, before: ConcreteState, steps: Sequence[Step], end: ConcreteState
    ) -> None:
        if h.model is not None and h.model.k is not h.machine.k:
            h.model = h.machine.init()


def walks(N: int, L: int, lease_max: int) -> dict[str, list[Any]]:
    """Witness: on the other geometry, a chain stored, taken to disk, restored and hit."""
    from kvstate.targets.api.base import chain, op

    c = chain(N, L, lease_max)
    full, store = c.full, c.store
    return {
        "another geometry: a chain stored, spilled, restored and hit": [
            op("geometry", k=1),
            *store,
            op("offload", n=N),
            op("drain"),
            op("spill", n=N),
            op("offload", n=N),
            op("drain"),
            op("spill", n=N),
            op("request", i=1, n=full, life=1),
            op("admit", i=1),
            op("drain"),
            op("use", i=1),
            op("append", i=1, k=L),
            op("read", i=1),
            op("finish", i=1),
        ]
    }


# drawn by the machine's warm-up (kvstate/targets/api/machine.py), not as a rule
DECLS = (OpDecl("geometry", do_geometry, "read", rule=False),)
