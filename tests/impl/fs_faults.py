"""A file-system shim for the disk tier's tests: chosen ``os`` calls on paths under one directory
fail (an errno: a read-only, full or refusing file system) or stall (a hung disk); everything
else runs as it is.

The shim replaces the functions of the ``os`` module itself for the test (``pathlib`` and
``tempfile`` call them too), so it reaches any file-system call any version of the disk tier
makes, in either build.  A test as root cannot make a directory read-only with ``chmod``; the
shim can.  Calls on a descriptor (``write``, ``fsync``, ``fstat``, ``pread``) carry no path:
a fault on them applies to every call while it is set.
"""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

PATH_CALLS = ("open", "unlink", "rename", "replace", "link", "listdir", "scandir", "mkdir")
FD_CALLS = ("write", "fsync", "fstat", "pread", "preadv", "fdopen")
Predicate = Callable[[str, tuple[Any, ...]], bool]


def creating(name: str, args: tuple[Any, ...]) -> bool:
    """An ``os.open`` that creates a file (a temporary, the key's): what a read-only or full
    directory refuses."""
    return name == "open" and len(args) > 1 and bool(args[1] & os.O_CREAT)


class FaultyOs:
    """``fail(name, errno)`` makes ``os.<name>`` raise, ``stall(name, ev, s)`` makes it wait
    for ``ev`` (at most ``s`` seconds) first; only for paths under ``root`` (a path call) and
    where ``when`` holds.  ``entered`` counts the calls that met a fault."""

    def __init__(self, root: Path) -> None:
        self.root = os.fspath(root)
        self._faults: dict[str, tuple[str, Any, Predicate | None, float]] = {}
        self.entered: dict[str, int] = {}
        self.changed = threading.Condition()

    def fail(self, name: str, code: int, when: Predicate | None = None) -> FaultyOs:
        self._faults[name] = ("fail", code, when, 0.0)
        return self

    def stall(
        self, name: str, until: threading.Event, seconds: float, when: Predicate | None = None
    ) -> FaultyOs:
        self._faults[name] = ("stall", until, when, seconds)
        return self

    def clear(self) -> None:
        self._faults.clear()

    def wait_entered(self, name: str, n: int = 1, timeout: float = 10.0) -> bool:
        with self.changed:
            return self.changed.wait_for(lambda: self.entered.get(name, 0) >= n, timeout)

    def _wrap(self, name: str, real: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kw: Any) -> Any:
            fault = self._faults.get(name)
            if fault is None:
                return real(*args, **kw)
            kind, arg, when, seconds = fault
            if name in PATH_CALLS:
                path = args[0] if args else kw.get("path", "")
                if not isinstance(path, (str, os.PathLike)) or not os.fspath(path).startswith(
                    self.root
                ):
                    return real(*args, **kw)
            if when is not None and not when(name, args):
                return real(*args, **kw)
            with self.changed:
                self.entered[name] = self.entered.get(name, 0) + 1
                self.changed.notify_all()
            if kind == "fail" and name == "fdopen":  # a file whose writes fail (a full disk)
                return _FailingFile(real(*args, **kw), arg)
            if kind == "fail":
                raise OSError(arg, f"{os.strerror(arg)} (injected)")
            arg.wait(seconds)
            return real(*args, **kw)

        return call


class _FailingFile:
    def __init__(self, f: Any, code: int) -> None:
        self._f, self._code = f, code

    def write(self, data: Any) -> int:
        raise OSError(self._code, f"{os.strerror(self._code)} (injected)")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._f, name)

    def __enter__(self) -> _FailingFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self._f.close()


@contextmanager
def faulty_fs(monkeypatch: Any, root: Path) -> Iterator[FaultyOs]:
    """Install a :class:`FaultyOs` over ``os`` for the block (faults set on it apply at once)."""
    shim = FaultyOs(root)
    for name in (*PATH_CALLS, *FD_CALLS):
        monkeypatch.setattr(os, name, shim._wrap(name, getattr(os, name)))
    try:
        yield shim
    finally:
        shim.clear()


REFUSALS = {"EROFS": errno.EROFS, "EACCES": errno.EACCES, "EPERM": errno.EPERM}
