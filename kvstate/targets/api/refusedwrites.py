"""A spill whose writes the file system refuses, each way it can (not as root on tmpfs).

``disk_full`` and ``spill_fills`` (kvstate/targets/api/exhaust.py) refuse a write as a full
disk does: at the temporary's creation (no inode) or at its first write (no block).  A file
system refuses in other places too, and each has its own cleanup in ``DiskTier.prepare`` /
``publish``: the directory not writable (EACCES at ``open``), the temporary's descriptor not
wrapped (``fdopen`` failing: the descriptor must be closed), an I/O error in the middle of the
payload (EIO at the second write: the temporary holds a prefix and must go), and the rename
that publishes the entry refused (EACCES, or EXDEV: the temporary must go, nothing published).
As root on tmpfs none of these happens, so each is injected for one ``spill(n)`` call through
the disk tier's own ``prepare`` seam (``test_hooks().replace_disk_method``), which switches a
per-thread refusal on around the tier's real write.

``spill_refused(n, k)``: ``spill(n)`` with refusal :data:`WAYS` ``[k]`` on every write.  The
call must raise ``DiskWriteError`` (README: it spilled nothing) where the table lets a block
spill, and change nothing (the harness's refusal check: the model's state and the events), and
leave no file behind (its accounting: a temporary left in the directory is a finding).
"""

from __future__ import annotations

import errno
import threading
from typing import Any

from hypothesis import strategies as st

from kvstate.targets.api.declare import OpDecl

_REFUSE = threading.local()  # the refusal in force on this thread's disk writes, or None


def _refused(what: str, code: int) -> OSError:
    return OSError(code, f"{errno.errorcode[code]} (injected at {what})")


class _WriteOnce:
    """A file whose second write fails (EIO): the first write's bytes landed."""

    def __init__(self, f: Any) -> None:
        self.f = f
        self.writes = 0

    def write(self, data: Any) -> int:
        self.writes += 1
        if self.writes > 1:
            raise _refused("a payload write", errno.EIO)
        return int(self.f.write(data))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.f, name)

    def __enter__(self) -> _WriteOnce:
        return self

    def __exit__(self, *exc: object) -> None:
        self.f.close()


class _RefusingOs:
    """``os`` as the disk tier and its directory see it: while this thread's refusal is on,
    the call it names fails; everything else is ``os`` itself."""

    def __init__(self, real: Any) -> None:
        self._real = real

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def open(self, path: Any, flags: int, *a: Any, **k: Any) -> int:
        if getattr(_REFUSE, "way", None) == "create" and flags & self._real.O_CREAT:
            raise _refused("the temporary's creation", errno.EACCES)
        return int(self._real.open(path, flags, *a, **k))

    def fdopen(self, fd: int, *a: Any, **k: Any) -> Any:
        way = getattr(_REFUSE, "way", None)
        if way == "fdopen":
            raise _refused("fdopen", errno.EMFILE)
        f = self._real.fdopen(fd, *a, **k)
        return _WriteOnce(f) if way == "write" else f

    def rename(self, src: Any, dst: Any) -> None:
        way = getattr(_REFUSE, "way", None)
        if way in ("rename", "rename_xdev"):
            raise _refused("the rename", errno.EXDEV if way == "rename_xdev" else errno.EACCES)
        self._real.rename(src, dst)


# the ways a write is refused, in the order ``k`` picks them
WAYS = ("create", "fdopen", "write", "rename", "rename_xdev")


def _install() -> None:
    from kvstate.impl import disk, diskdir

    for mod in (disk, diskdir):
        if not isinstance(mod.os, _RefusingOs):
            mod.os = _RefusingOs(mod.os)  # type: ignore[assignment]


def do_spill_refused(h: Any, o: Any) -> int | None:
    """``spill_refused(n, k)``: ``spill(n)`` with every write refused the ``k``-th way."""
    if h.threads or h.disk_full:
        return None
    way = WAYS[o.arg("k") % len(WAYS)]
    _install()
    real: list[Any] = []
    publish: list[Any] = []

    def prepare(key: bytes, **kw: Any) -> Any:
        _REFUSE.way = way
        try:
            return real[0](key, **kw)
        finally:
            _REFUSE.way = None

    def publish_refused(prepared: Any) -> Any:
        _REFUSE.way = way
        try:
            return publish[0](prepared)
        finally:
            _REFUSE.way = None

    real.append(h.hooks.replace_disk_method("prepare", prepare))
    publish.append(h.hooks.replace_disk_method("publish", publish_refused))
    from kvstate.impl.errors import DiskWriteError

    try:
        h.returned = h.cache.spill(o.arg("n"))
    except DiskWriteError:
        h.cov.add(f"fault a spill's write refused ({way})")
        raise  # (the harness checks that nothing changed)
    finally:
        h.hooks.replace_disk_method("prepare", None)
        h.hooks.replace_disk_method("publish", None)
    m = h.machine
    can = [b for b in range(h.N) if m.is_enabled(h.model, "spill", {"b": b})]
    if can:  # (it returned: a refused write must raise, as a full disk's does)
        raise h.fail(
            "refused-write",
            [way],
            f"{o.render()}: every write refused ({way}) and spill returned {h.returned} "
            f"without DiskWriteError, though the table lets blocks {can} spill",
        )
    return None


# scripted only (kvstate/targets/api/witnesses.py): every way a spill's writes are refused
DECLS = (
    OpDecl(
        "spill_refused",
        do_spill_refused,
        "spill",
        lambda s: {"n": st.integers(0, s.N), "k": st.integers(0, len(WAYS) - 1)},
        rule=False,
    ),
)
