"""The action map: each action of the table, and the part's method that performs it.

The table names 32 actions; the allocator performs each in exactly one part (the block store,
recovery, the request table, or the guard gate for time and the CUDA graph).  This map is the
one place that says which, so a caller driving the allocator by the table's action names (the
conformance adapter, :meth:`kvstate.impl.inspection.TestHooks.act`) reaches the part's method
directly, without a pass-through per action in between.  :func:`check_actions` binds it to the
table when a cache is built, as :meth:`BlockMeta.check_columns` binds the metadata columns: an
action the table declares and nothing performs, or a performer of no declared action, is
refused before anything runs.
"""

from __future__ import annotations

from typing import Any, Final

from kvstate.spec.table import ParamKind

from .errors import InvalidArgument

# action name -> (part, method): ``part`` an attribute of CacheCore
ACTIONS: Final[dict[str, tuple[str, str]]] = {
    # the write path and the device LRU (Compressed KV, Uncompressed Tail, SWA, indexer stamp)
    "allocate": ("store", "allocate"),
    "commit": ("store", "commit"),
    "discard": ("store", "discard"),
    "seal": ("store", "seal"),
    "slide": ("store", "slide"),
    "index_update": ("store", "index_update"),
    "evict_start": ("store", "evict_start"),
    "evict_done": ("store", "evict_done"),
    "touch": ("store", "touch"),
    # recovery: offload, spill, load, drop, the indexer rebuild
    "rebuild_start": ("recovery", "rebuild_start"),
    "rebuild_done": ("recovery", "rebuild_done"),
    "offload": ("recovery", "offload"),
    "offload_done": ("recovery", "offload_done"),
    "offload_cancel": ("recovery", "offload_cancel"),
    "spill": ("recovery", "spill"),
    "load_start": ("recovery", "load_start"),
    "load_progress": ("recovery", "load_progress"),
    "load_done": ("recovery", "load_done"),
    "load_fail": ("recovery", "load_fail"),
    "drop": ("recovery", "drop"),
    # time and the CUDA graph
    "tick": ("gate", "tick"),
    "capture": ("gate", "capture"),
    "replay": ("gate", "replay"),
    "recapture": ("gate", "recapture"),
    # the request table
    "admit": ("requests", "begin"),  # a slot taken (the façade admits in one call)
    "match": ("requests", "match"),
    "pin": ("requests", "pin"),
    "validate": ("requests", "validate"),
    "use": ("requests", "use"),
    "release": ("requests", "release"),
    "abort": ("requests", "abort"),
    "downgrade": ("requests", "downgrade"),
}


def check_actions(table: Any) -> None:
    """The map covers exactly the table's actions (:class:`InvalidArgument` otherwise)."""
    names = {a.name for a in table.actions}
    if names != set(ACTIONS):
        raise InvalidArgument(
            f"table {table.name!r}: actions {sorted(names ^ set(ACTIONS))} differ from the "
            "implementation's action map (impl/actions.py)"
        )


def block_actions(table: Any) -> frozenset[str]:
    """The actions whose first argument is a record id: those with a block parameter."""
    return frozenset(
        a.name for a in table.actions if any(p.kind is ParamKind.BLOCK for p in a.params)
    )


def bind(table: Any, parts: Any) -> dict[str, Any]:
    """Each action's bound method on ``parts`` (the core), checked against the table first."""
    check_actions(table)
    return {name: getattr(getattr(parts, part), meth) for name, (part, meth) in ACTIONS.items()}
