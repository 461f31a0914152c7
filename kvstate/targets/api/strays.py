"""A file under a temporary's name that the restart's scan cannot read: left alone.

The scan deletes what a crash left of kvstate's (a temporary that carries its magic) and must
leave everything else, whatever it holds; a file whose first bytes cannot be read (``EIO``)
cannot be shown to be kvstate's, so it stays (``DiskTier._ours``).  The harness's strays
(:mod:`kvstate.targets.api.stored`) are all readable, so a scan that deleted an unreadable one
was never seen.  ``stray(k=0)`` plants, under a temporary's name, a file that starts with
kvstate's magic but whose reads fail, among the harness's foreign files (never deleted, never
rewritten: checked after every operation); after the restart, ``stray(k=1)`` requires it to be
there still, then takes it away.  Neither call changes anything the table sees
(``spec/api.py``'s ``fault``).
"""

from __future__ import annotations

import os
from typing import Any

from kvstate.targets.api.base import op
from kvstate.targets.api.declare import OpDecl
from kvstate.targets.api.shortreads import installed

_NAME = f".{'e0' * 16}.kvb.stray.tmp"


def do_stray(h: Any, o: Any) -> int | None:
    from kvstate.impl import disk

    if h.threads or getattr(h, "dir", None) is None:
        return None
    path = os.path.realpath(os.path.join(h.dir, _NAME))
    w = installed(disk)
    if not o.arg("k"):
        data = disk.MAGIC_FAMILY + b"\0" * 8
        with open(path, "wb") as f:
            f.write(data)
        w.failing.add(path)
        h.foreign_files[_NAME] = data  # never deleted, never rewritten (accounting.py)
        return None
    if path not in w.failing:
        return None
    w.failing.discard(path)
    h.foreign_files.pop(_NAME, None)
    if not os.path.exists(path):
        raise h.fail(
            "stored",
            ["an unreadable stray"],
            f"{o.render()}: the scan deleted {_NAME}, a file it could not read (not shown "
            "to be kvstate's: left alone)",
        )
    os.unlink(path)
    h.cov.add("check: the scan left an unreadable stray alone")
    return None


def walks(to_disk: list[Any], hit: list[Any]) -> dict[str, list[Any]]:
    return {
        "a stray the restart's scan cannot read": [
            *to_disk,
            op("stray", k=0),
            op("restart"),
            op("stray", k=1),
            *hit,
        ]
    }


DECLS: tuple[OpDecl, ...] = (
    OpDecl("stray", do_stray, "fault", faults=("stray",), rule=False),  # scripted: the walk
)
