"""Unlinks the file system refuses, or finds already done.

The disk tier unlinks a file it let go of (a dropped entry, one loaded back, a spill's file not
adopted, a crash's leftover) after the cache's lock is released (``Directory.reap``,
``Directory.remove``).  A refused unlink (a read-only mount: ``EROFS``) leaves the file behind
and lists it in ``DiskTier.orphans`` (README: "only space"); an unlink that finds the file gone
(another cleaner was first: ``ENOENT``) is done.  The harness's directory never refused one, so
neither path ran.  ``unlink_fault(on)`` makes the cache's unlinks, from now on, refused
(``on=0``) or find the file already removed (``on=1``); the call changes nothing the table sees
(``spec/api.py``'s ``fault``).  :class:`Orphans` checks after every operation that the tier's
``orphans`` are exactly the files whose unlink was refused, each still in the directory, and
that a file found gone is not listed; the lockstep with the model checks the rest (a refused
unlink changes no block's phase).
"""

from __future__ import annotations

import errno
import os
import weakref
from collections.abc import Sequence
from typing import Any

from kvstate.spec.state import ConcreteState
from kvstate.targets.api.base import CallCheck, op
from kvstate.targets.api.declare import OpDecl

Step = tuple[str, dict[str, int]]


class _UnlinkOs:
    """``os`` as the cache directory sees it: an unlink under an armed cache's directory is
    refused (``EROFS``) or finds the file already gone; everything else is ``os``."""

    def __init__(self, real: Any) -> None:
        self._real = real
        # id(harness) -> (the harness, the armed cache, "refuse" | "gone", paths refused)
        self.armed: dict[int, tuple[Any, Any, str, set[str]]] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def unlink(self, path: Any, *a: Any, **k: Any) -> None:
        p = os.fspath(path)
        for ref, cache, how, refused in list(self.armed.values()):
            h = ref()
            if h is None or h.cache is not cache or not p.startswith(os.fspath(h.dir)):
                continue
            if how == "refuse":
                refused.add(p)
                h.cov.add("fault an unlink refused (EROFS)")
                raise OSError(errno.EROFS, "Read-only file system (injected)", p)
            self._real.unlink(path, *a, **k)  # another cleaner was first
            h.cov.add("fault an unlink finds the file gone")
            raise FileNotFoundError(errno.ENOENT, "No such file or directory (injected)", p)
        self._real.unlink(path, *a, **k)


def _installed() -> _UnlinkOs:
    """The wrapper, installed once around the directory module's ``os`` (inside any other
    wrapper a fault put there, e.g. ``exhaust``'s: it wraps only its own kind once)."""
    from kvstate.impl import diskdir

    holder: Any = diskdir
    o: Any = diskdir.os
    while True:
        if isinstance(o, _UnlinkOs):
            return o
        inner = getattr(o, "_real", None)
        if inner is None:
            break
        holder, o = o, inner
    w = _UnlinkOs(o)
    if holder is diskdir:
        diskdir.os = w  # type: ignore[assignment]
    else:
        object.__setattr__(holder, "_real", w)
    return w


def _armed(h: Any) -> tuple[str, set[str]] | None:
    from kvstate.impl import diskdir

    o: Any = diskdir.os
    while o is not None and not isinstance(o, _UnlinkOs):
        o = getattr(o, "_real", None)
    if o is None:
        return None
    got = o.armed.get(id(h))
    if got is None or got[0]() is not h or got[1] is not h.cache:
        return None
    return got[2], got[3]


def do_unlink_fault(h: Any, o: Any) -> int | None:
    if h.threads:
        return None
    w = _installed()
    w.armed = {k: v for k, v in w.armed.items() if v[0]() is not None and v[0]().cache is v[1]}
    how = "gone" if o.arg("on") else "refuse"
    w.armed[id(h)] = (weakref.ref(h), h.cache, how, set())
    return None


class Orphans(CallCheck):
    """The tier's ``orphans``: the files whose unlink was refused, each still there."""

    def after(
        self, h: Any, o: Any, before: ConcreteState, steps: Sequence[Step], end: ConcreteState
    ) -> None:
        armed = _armed(h)
        if armed is None:
            return
        how, refused = armed
        listed = {os.fspath(p) for p, _ in h.view.disk.orphans}
        if listed != refused:
            raise h.fail(
                "orphans",
                [o.name],
                f"{o.render()}: the disk tier's orphans {sorted(listed)} are not the files whose "
                f"unlink the file system refused {sorted(refused)}",
            )
        gone = [p for p in refused if not os.path.exists(p)]
        if gone:
            raise h.fail("orphans", [o.name], f"{o.render()}: orphans {gone} are not on disk")
        h.cov.add(f"check: orphans against the refused unlinks ({how})")


def walks(to_disk: list[Any], hit: list[Any]) -> dict[str, list[Any]]:
    """Witnesses: entries loaded back and dropped (their files let go) while unlinks fail."""
    return {
        f"disk files let go while the file system {why}": [
            *to_disk,
            op("unlink_fault", on=on),
            *hit,
            op("finish", i=1),
            op("spill", n=2),
            op("offload", n=2),
            op("drain"),
            op("spill", n=2),
            op("drop", n=2),
            *hit,
            op("finish", i=1),
        ]
        for on, why in ((0, "refuses unlinks"), (1, "finds them done"))
    }


DECLS: tuple[OpDecl, ...] = (
    OpDecl("unlink_fault", do_unlink_fault, "fault", faults=("unlink",), rule=False),
)
