"""Tables the implementation does not serve: refused at construction, naming what differs.

``impl/`` binds a table when a cache is built: its action map (``impl/actions.py``:
``check_actions``) must cover exactly the table's actions, and its block metadata
(``BlockMeta.check_columns``) exactly the table's non-ghost block variables, each phase
variable starting where a new record starts.  A table derived past that (an action removed, a
block variable added, a phase variable's initial value moved) must be refused with
``InvalidArgument`` naming the difference -- not served with an action that does nothing, a
column nobody writes, or records that start in another phase.  The harness only ever builds
caches on the tables it serves, so these refusals never ran.  ``unservable(k)`` builds a cache
over a fresh directory on the ``k``-th such table, derived from the harness's own (the
difference is the derived table's, read back from it, not restated), and checks:

* the construction raises ``InvalidArgument`` whose message names the differing action or
  variable;
* it leaves the directory as it found it: no file, and not locked (a cache on the harness's
  table opens it at once).
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import replace
from typing import Any

from hypothesis import strategies as st

from kvstate.spec.parts import Scope, Var
from kvstate.spec.table import Table
from kvstate.targets.api.base import op
from kvstate.targets.api.declare import OpDecl

KINDS = ("an action removed", "a block variable added", "a phase variable's start moved")
_DERIVED: dict[tuple[int, int], tuple[Table, Table, str]] = {}
_SMALL = dict(executors="manual", device_blocks=2, host_blocks=1, max_requests=1)


def _with_vars(t: Table, vars: list[Var], name: str) -> Table:
    """``t`` over other variables (everything else its own)."""
    return replace(t, name=name, vars=tuple(vars))


def unservable(table: Table, k: int) -> tuple[Table, str]:
    """The ``k``-th table derived past what ``impl/`` serves, and the name it must be refused
    for (kept)."""
    hit = _DERIVED.get((id(table), k))
    if hit is not None and hit[0] is table:
        return hit[1], hit[2]
    if k == 0:  # the table's last action (its action map then has one the table lacks)
        what = table.actions[-1].name
        other = table.derive(name=f"{table.name}@without-{what}", remove_action=[what])
    elif k == 1:  # one more block variable, no action writes it
        what = "unserved"
        extra = Var(what, Scope.BLOCK, lambda k, N, b: 0, doc="a column impl/ does not keep")
        other = _with_vars(table, [*table.vars, extra], f"{table.name}@{what}")
    else:  # the first block phase variable starting one phase later
        v = next(v for v in table.vars if v.scope is Scope.BLOCK and v.domain and not v.ghost)
        what, start = v.name, v.init
        moved = replace(v, init=lambda k, N, b: (int(start(k, N, b)) + 1) % len(v.domain))
        other = _with_vars(
            table, [moved if x is v else x for x in table.vars], f"{table.name}@{what}-moved"
        )
    _DERIVED[(id(table), k)] = (table, other, what)
    return other, what


def do_unservable(h: Any, o: Any) -> int | None:
    from kvstate.impl import HeterogeneousKVCache
    from kvstate.impl.errors import InvalidArgument

    if h.threads:
        return None
    k = o.arg("k") % len(KINDS)
    other, what = unservable(h.table, k)

    def fail(detail: str) -> Exception:
        return h.fail("construct", ["unservable"], f"{o.render()} ({KINDS[k]}): {detail}")

    with tempfile.TemporaryDirectory(prefix="kvstate-unservable-") as d:
        try:
            c = HeterogeneousKVCache(table=other, cache_dir=d, **_SMALL)
        except InvalidArgument as exc:
            if what not in str(exc):
                raise fail(f"refused with {exc!r}, which does not name {what!r}") from exc
        except Exception as exc:
            raise fail(f"raised {type(exc).__name__}: {exc}, not InvalidArgument") from exc
        else:
            c.close()
            raise fail(f"built a cache on table {other.name}, which impl/ does not serve")
        left = os.listdir(d)
        if left:
            raise fail(f"the refused construction left {left}")
        c = HeterogeneousKVCache(table=h.table, cache_dir=d, **_SMALL)  # not locked
        c.close()
    h.cov.add(f"check: unservable table ({KINDS[k]})")
    return None


def walks(N: int, L: int, lease_max: int) -> dict[str, list[Any]]:
    """Witness: each unservable table, beside the example's cache."""
    return {"tables impl/ does not serve": [op("unservable", k=k) for k in range(len(KINDS))]}


DECLS = (
    OpDecl(
        "unservable",
        do_unservable,
        "read",
        lambda s: {"k": st.integers(0, len(KINDS) - 1)},
        rule=False,
    ),
)
