"""A file system that refuses direct I/O, at open or at read time.

The disk tier reads an entry's payload with ``O_DIRECT`` where the file system allows it
(``DiskTier._open_payload``) and falls back to buffered reads for good when it refuses: at
``open`` (``EINVAL``: tmpfs, some network file systems) or at the read itself (``EINVAL``
from ``pread``: an alignment the device does not take).  The harness's directory takes
direct I/O, so the fallback never ran.  ``direct_io(on)`` makes the cache's file system refuse
it from now on, at open (``on=0``) or at read time (``on=1``); the call changes nothing the
table sees (``spec/api.py``'s ``fault``).  No block joins the world's failing reads
(``read_error``): every later load from disk must complete, and its bytes are compared with
the writer's as every load's are, so a fallback that fails the load, loops, or reads the
wrong span is a finding.
"""

from __future__ import annotations

import errno
import fcntl
import os
import weakref
from typing import Any

from kvstate.targets.api.base import op
from kvstate.targets.api.declare import OpDecl

_O_DIRECT = getattr(os, "O_DIRECT", 0)


class _RefusingOs:
    """``os`` as the disk tier sees it: an ``O_DIRECT`` open under a refusing cache's
    directory fails with ``EINVAL``; everything else is ``os``."""

    def __init__(self, real: Any) -> None:
        self._real = real
        # (directory, the harness, the cache that refuses): a later cache in the same
        # directory (the next example's) takes direct I/O again
        self.refusing: list[tuple[str, Any, Any]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def open(self, path: Any, flags: int, *a: Any, **k: Any) -> int:
        if flags & _O_DIRECT:
            p = os.fspath(path)
            for root, ref, cache in self.refusing:
                h = ref()
                if h is not None and h.cache is cache and p.startswith(root):
                    raise OSError(errno.EINVAL, "Invalid argument (injected: no direct I/O)", p)
        return self._real.open(path, flags, *a, **k)


def _installed(disk: Any) -> _RefusingOs:
    """The wrapper, installed once around the disk module's ``os`` (inside any other wrapper a
    fault put there, e.g. ``faults``' full disk: it wraps only when its own kind is outermost)."""
    holder: Any = disk
    o: Any = disk.os
    while True:
        if isinstance(o, _RefusingOs):
            return o
        inner = getattr(o, "_real", None)
        if inner is None:
            break
        holder, o = o, inner
    w = _RefusingOs(o)
    if holder is disk:
        disk.os = w
    else:
        object.__setattr__(holder, "_real", w)
    return w


def do_direct_io(h: Any, o: Any) -> int | None:
    from kvstate.impl import disk

    if not _O_DIRECT or h.threads:
        return None
    if o.arg("on"):  # refused at read time: a read on a direct descriptor fails

        def refusing(fd: int, buf: Any, offset: int, need: int | None = None) -> int:
            if fcntl.fcntl(fd, fcntl.F_GETFL) & _O_DIRECT:
                h.cov.add("fault direct I/O refused at read time")
                raise OSError(errno.EINVAL, "Invalid argument (injected: no direct I/O)")
            return int(real(fd, buf, offset, need))

        real = h.hooks.replace_disk_method("pread", refusing)
        return None
    rs = _installed(disk)
    rs.refusing = [r for r in rs.refusing if r[1]() is not None and r[1]().cache is r[2]]
    rs.refusing.append((os.fspath(h.dir), weakref.ref(h), h.cache))
    h.cov.add("fault direct I/O refused at open")
    return None


def walks(
    N: int, L: int, lease_max: int, to_disk: list[Any], hit: list[Any]
) -> dict[str, list[Any]]:
    """Witnesses: a hit over the chain restored from disk after direct I/O is refused."""
    return {
        f"a disk load when the file system refuses direct I/O at {at}": [
            *to_disk,
            op("direct_io", on=on),
            *hit,
            op("finish", i=1),
        ]
        for on, at in ((0, "open"), (1, "read time"))
    }


DECLS: tuple[OpDecl, ...] = (
    OpDecl(
        "direct_io", do_direct_io, "fault", faults=("direct_io",), rule=False
    ),  # scripted: the walks above
)
