"""A disk that fills partway through a spill, and the counts the maintenance calls return.

The harness's ``disk_full`` fills the disk for every write, so a ``spill(n)`` either writes
everything it picks or nothing: what a spill does when its disk runs out *after* some blocks
were written (README, errors: ``spill(n)`` returns what it spilled before the failure and raises
``DiskWriteError`` only when it spilled nothing) is never exercised, and the count a call
returns is never compared with what it did.  Here:

* ``spill_fills(n)``: ``spill(n)`` over a disk that takes one more entry and is then full (the
  harness's own full-disk fault, armed after the first write, or, every other time, a file
  system out of inodes: creating the temporary fails).  The call must not raise once
  it spilled a block, and the disk's later refusals must leave nothing behind.
* :class:`Counts`: ``spill`` and ``drop`` return the number of blocks they wrote or dropped,
  which must be the number of ``spill`` / ``drop`` actions explaining the call (at least that
  many while the cache holds blocks outside the modelled chain: another prompt's, or a
  request's grown past the chain); and a ``spill``
  on a full disk that the table would let write a block must raise ``DiskWriteError`` (it
  spilled nothing), never return 0 as if nothing were spillable; one that did fewer than ``n``
  left no block that the table let it take at both ends of the call ("up to n").
"""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Sequence
from typing import Any

from hypothesis import strategies as st

from kvstate.spec.state import ConcreteState
from kvstate.targets.api.base import CallCheck
from kvstate.targets.api.declare import OpDecl

Step = tuple[str, dict[str, int]]
COUNTED = {
    "spill": "spill",
    "drop": "drop",
    "spill_fills": "spill",
    "offload": "offload",
    "evict": "evict_start",
}
EXHAUSTIVE = ("spill", "drop", "evict")

_NO_CREATE = threading.local()  # on: this thread's new files are refused (no inode left)


class _NoCreateOs:
    """``os`` as the cache directory sees it: while ``_NO_CREATE.on``, creating a file fails
    as on a file system out of inodes (ENOSPC at ``open``); everything else is ``os``."""

    def __init__(self, real: Any) -> None:
        self._real = real

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def open(self, path: Any, flags: int, *a: Any, **k: Any) -> int:
        if getattr(_NO_CREATE, "on", False) and flags & os.O_CREAT:
            raise OSError(errno.ENOSPC, "No space left on device (injected: no inode)", path)
        return self._real.open(path, flags, *a, **k)


def do_spill_fills(h: Any, o: Any) -> int | None:
    from kvstate.impl import diskdir
    from kvstate.targets.api.faults import _FULL, _install_full_disk

    if h.disk_full or h.threads:
        return None
    kept: list[Any] = []  # the tier's own prepare, put back after the spill
    writes = [0]
    # the disk runs out of blocks (the temporary's writes fail) or of inodes (its creation
    # fails), alternately by the trace's length
    flag = _FULL if len(h.steps) % 2 else _NO_CREATE

    def fills(key: bytes, **kw: Any) -> Any:
        writes[0] += 1
        flag.on = writes[0] > 1  # the first entry fits; the disk is full after it
        try:
            return kept[0](key, **kw)
        finally:
            flag.on = False

    _install_full_disk()
    if not isinstance(diskdir.os, _NoCreateOs):
        diskdir.os = _NoCreateOs(diskdir.os)  # type: ignore[assignment]
    kept.append(h.hooks.replace_disk_method("prepare", fills))
    try:
        h.returned = h.cache.spill(o.arg("n"))
    finally:
        h.hooks.replace_disk_method("prepare", None)
    if writes[0] > 1:
        h.cov.add(
            f"fault the disk fills partway through a spill ({flag is _FULL and 'blocks' or 'inodes'})"
        )
    return None


# the disk full after one write (kvstate/targets/api/declare.py: the form)
DECLS: tuple[OpDecl, ...] = (
    OpDecl(
        "spill_fills",
        do_spill_fills,
        "spill",
        lambda s: {"n": st.integers(1, s.N)},
        faults=("disk_fills",),
    ),
)


def _off_chain(h: Any) -> bool:
    """Does the cache hold a block outside the modelled chain (another prompt's, or a request's
    grown past the chain's N blocks)?  The one read of the cache's records in this module."""
    from kvstate.spec.phases import CKV

    view = h.view
    chain = set(h.rids)
    with view.lock:
        ckv = view.meta.ckv
        return any(r not in chain and ckv[r] != CKV.FREE for r in view.index.values())


def _disk_pool_kept(h: Any, end: ConcreteState) -> bool:
    """Is the library's disk pool full of chain blocks the table lets none of drop at the end
    of the call?  (Its size is the library's, not the table's: ``pools`` makes it smaller than
    the chain, so a spill needs an entry dropped first, ``ROOM``, and none may be.)"""
    view = h.view
    with view.lock:
        entries = set(view.disk_entries)
    rid_of = {r: b for b, r in enumerate(h.rids)}
    if len(entries) < h.open_kwargs()["disk_blocks"] or not entries <= set(rid_of):
        return False
    drop = h.table.action("drop")
    return not any(h.machine.is_enabled(end, drop, {"b": rid_of[r]}) for r in entries)


class Counts(CallCheck):
    def __init__(self) -> None:
        self.others = False

    def before(self, h: Any, o: Any) -> None:
        h.returned = None
        self.others = o.name in COUNTED and _off_chain(h)

    def after(
        self, h: Any, o: Any, before: ConcreteState, steps: Sequence[Step], end: ConcreteState
    ) -> None:
        action = COUNTED.get(o.name)
        if action is None or h.returned is None:
            return
        did = sum(1 for n, _ in steps if n == action)
        # blocks outside the chain count too: the model has not them
        if h.returned < did or h.returned != did and not self.others:
            raise h.fail(
                "returned-count",
                [o.name],
                f"{o.render()} returned {h.returned}, but {did} '{action}' actions explain it",
            )
        h.cov.add(f"check: {o.name} returned what it did")
        m = h.machine
        # (not offload: it starts offloads while a host slot is free, and makes no host room)
        if o.name in EXHAUSTIVE and not h.disk_full and h.returned < o.arg("n"):
            # "up to n": one that did fewer left none behind that the table let it take at
            # both ends of the call (a block touched in between is no candidate)
            left = [
                b
                for b in range(h.N)
                if m.is_enabled(before, action, {"b": b}) and m.is_enabled(end, action, {"b": b})
            ]
            if left and o.name == "spill" and _disk_pool_kept(h, end):
                left = []  # the library's disk pool, smaller than the chain, holds no room
                h.cov.add("check: a spill stopped by a disk pool whose entries the table keeps")
            if left:
                raise h.fail(
                    "stopped-early",
                    [o.name],
                    f"{o.render()} did {h.returned} and stopped, though the table lets blocks "
                    f"{left} '{action}' before and after the call",
                )
            h.cov.add(f"check: {o.name} did all it could")
        if o.name == "spill" and h.disk_full and not did:
            can = [b for b in range(h.N) if m.is_enabled(before, "spill", {"b": b})]
            if can:
                raise h.fail(
                    "full-disk-spill",
                    [o.name],
                    f"{o.render()} on a full disk returned 0 without DiskWriteError, though the "
                    f"table lets blocks {can} spill (README: it raises when it spilled nothing)",
                )
            h.cov.add("check: a spill on a full disk with nothing to spill")
