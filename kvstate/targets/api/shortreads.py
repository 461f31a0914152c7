"""A file system whose reads come back short: a few KiB per call, as POSIX allows.

``os.preadv`` may return fewer bytes than asked before the end of a file (a network or FUSE
file system, a signal); the disk tier's one read (``DiskTier.pread``) then goes on from where
the last call stopped.  The harness's file system answers every read whole, so that loop's
second turn never ran: a continuation from the wrong offset, or a read that stops at the
first short answer, was invisible.  ``short_reads`` makes the cache's file system answer each
read of its directory with at most :data:`PIECE` bytes from now on (a multiple of the direct
I/O alignment, so that a direct read may go on); the call changes nothing the table sees
(``spec/api.py``'s ``fault``).  No block joins the world's failing reads: every later header
read and disk load must complete, and its bytes are compared with the writer's as every
load's are.  (Not ``short_read`` of ops.py: there the file ends early and the load must fail.)
"""

from __future__ import annotations

import errno
import os
import weakref
from typing import Any

from kvstate.targets.api.base import op
from kvstate.targets.api.declare import OpDecl

PIECE = 4096  # bytes one call answers at most (the direct I/O alignment: impl/disk.py)


class _ShortOs:
    """``os`` as the disk tier sees it: ``preadv`` on a file of a shortened cache's directory
    answers at most :data:`PIECE` bytes; everything else is ``os``."""

    def __init__(self, real: Any) -> None:
        self._real = real
        # (directory, the harness, the cache whose reads come back short): the next
        # example's cache in the same directory reads whole again
        self.short: list[tuple[str, Any, Any]] = []
        # files whose reads fail (EIO): kvstate/targets/api/strays.py
        self.failing: set[str] = set()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def _applies(self, fd: int) -> bool:
        try:
            p = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            return False
        for root, ref, cache in self.short:
            h = ref()
            if h is not None and h.cache is cache and p.startswith(root):
                return True
        return False

    def pread(self, fd: int, n: int, offset: int) -> bytes:
        try:
            p = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            p = ""
        if p in self.failing:
            raise OSError(errno.EIO, "Input/output error (injected: an unreadable file)")
        return bytes(self._real.pread(fd, n, offset))

    def preadv(self, fd: int, buffers: Any, offset: int, *a: Any) -> int:
        if len(buffers) == 1 and self._applies(fd):
            b = memoryview(buffers[0])
            if b.nbytes > PIECE:
                got = int(self._real.preadv(fd, [b.cast("B")[:PIECE]], offset, *a))
                h = self.short[-1][1]()
                if h is not None:
                    h.cov.add("fault a short read (the read goes on)")
                return got
        return int(self._real.preadv(fd, buffers, offset, *a))


def installed(disk: Any) -> _ShortOs:
    """The wrapper, installed once around the disk module's ``os`` (inside any other wrapper a
    fault put there: each wraps only when its own kind is outermost)."""
    holder: Any = disk
    o: Any = disk.os
    while True:
        if isinstance(o, _ShortOs):
            return o
        inner = getattr(o, "_real", None)
        if inner is None:
            break
        holder, o = o, inner
    w = _ShortOs(o)
    if holder is disk:
        disk.os = w
    else:
        object.__setattr__(holder, "_real", w)
    return w


def do_short_reads(h: Any, o: Any) -> int | None:
    from kvstate.impl import disk

    if h.threads or getattr(h, "dir", None) is None:
        return None
    w = installed(disk)
    w.short = [r for r in w.short if r[1]() is not None and r[1]().cache is r[2]]
    w.short.append((os.path.realpath(os.fspath(h.dir)), weakref.ref(h), h.cache))
    return None


def walks(to_disk: list[Any], hit: list[Any]) -> dict[str, list[Any]]:
    """Witnesses: a hit over the chain restored from disk with short reads, and a restart's
    scan (every entry's header read) with them."""
    return {
        "a disk load when every read comes back short": [
            *to_disk,
            op("short_reads"),
            *hit,
            op("finish", i=1),
        ],
        "a restart's scan and a disk load when every read comes back short": [
            *to_disk,
            op("short_reads"),
            op("restart"),
            op("short_reads"),
            *hit,
            op("finish", i=1),
        ],
    }


DECLS: tuple[OpDecl, ...] = (
    OpDecl(
        "short_reads", do_short_reads, "fault", faults=("short_reads",), rule=False
    ),  # scripted: the walks above
)
