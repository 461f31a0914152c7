"""The file system's own refusals at a cache directory's open, for the restart's refusal check.

:data:`kvstate.targets.api.stored.REFUSALS` builds directories a cache must refuse (a key that
is not one, a file where the directory goes, a lock held).  What the file system itself
refuses is left out there: a scratch folder on tmpfs, as root, refuses nothing.  Here each
refusal of docs/library.md's ``StorageError`` row (the directory cannot be created, opened,
locked or listed; its key cannot be created, synced or read) is injected into the directory's
own ``os``/``fcntl`` for the constructor's duration (``impl/diskdir.py``), plus a key that
keeps disappearing (another process deleting it at every try: ``InvalidArgument``).  The check
is ``stored._refused_open``'s: the documented error, the directory's files as they were, its
lock let go.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from typing import Any

Setup = tuple[Any, Callable[[], None]]


class _RefusingOs:
    """``os`` (or ``fcntl``) as ``impl/diskdir.py`` sees it, with the named calls refused as
    ``refuse(name, args)`` says (an ``OSError`` to raise, or None: the real call)."""

    def __init__(self, real: Any, refuse: Callable[[str, tuple[Any, ...]], OSError | None]):
        self._real, self._refuse = real, refuse

    def __getattr__(self, name: str) -> Any:
        fn = getattr(self._real, name)
        if not callable(fn):
            return fn

        def call(*a: Any, **k: Any) -> Any:
            exc = self._refuse(name, a)
            if exc is not None:
                raise exc
            return fn(*a, **k)

        return call


def _install(
    module: str, refuse: Callable[[str, tuple[Any, ...]], OSError | None]
) -> Callable[[], None]:
    from kvstate.impl import diskdir

    real = getattr(diskdir, module)
    setattr(diskdir, module, _RefusingOs(real, refuse))
    return lambda: setattr(diskdir, module, real)


def _is_key(path: Any) -> bool:
    from kvstate.impl.disk import KEY_FILE

    return os.path.basename(str(path)) == KEY_FILE


def _err(code: int, what: str) -> OSError:
    return OSError(code, f"{os.strerror(code)} (injected: {what})")


def _refuse(name: str, code: int, when: Callable[[tuple[Any, ...]], bool] = lambda a: True):
    def setup(h: Any) -> Setup:
        def refuse(call: str, a: tuple[Any, ...]) -> OSError | None:
            return _err(code, call) if call == name and when(a) else None

        return h.dir, _install("fcntl" if name == "flock" else "os", refuse)

    return setup


def _key_absent(then: str, code: int) -> Callable[[Any], Setup]:
    """The key's open finds no file (another process just deleted it); then ``then`` (the
    creation's calls) is refused with ``code``, or, with ``then`` empty, the key is never
    there however often it is created."""

    def setup(h: Any) -> Setup:
        def refuse(call: str, a: tuple[Any, ...]) -> OSError | None:
            if call == "open" and a and _is_key(a[0]):
                return FileNotFoundError(errno.ENOENT, "No such file (injected)", str(a[0]))
            if then and call == then:
                return _err(code, call)
            return None

        return h.dir, _install("os", refuse)

    return setup


# descriptors a refused open left open (the lowest one, which a daemon without stdin hands
# out): ``stored._refused_open`` reports and clears them
LEAKS: list[str] = []


def _key_sync_fails_on_fd0(h: Any) -> Setup:
    """As ``_key_absent("fsync", EIO)``, with descriptor 0 free when the key's temporary is
    created (a process without stdin): the temporary is descriptor 0, and the failed creation
    must close it as it closes any other (``0`` is a descriptor, not "none")."""
    saved = os.dup(0)
    closed = [False]

    def refuse(call: str, a: tuple[Any, ...]) -> OSError | None:
        if call == "open" and a and _is_key(a[0]):
            return FileNotFoundError(errno.ENOENT, "No such file (injected)", str(a[0]))
        if (
            call == "open"
            and a
            and not closed[0]
            and ".kvstate-key." in os.path.basename(str(a[0]))
        ):
            os.close(0)  # (the real open that follows gets descriptor 0)
            closed[0] = True
        if call == "fsync":
            return _err(errno.EIO, call)
        return None

    uninstall = _install("os", refuse)

    def undo() -> None:
        uninstall()
        if closed[0]:
            try:
                os.fstat(0)
                LEAKS.append("descriptor 0 (the key's temporary) left open")
            except OSError:
                pass
        os.dup2(saved, 0)
        os.close(saved)

    return h.dir, undo


def _root_open(a: tuple[Any, ...]) -> bool:
    return bool(a) and not _is_key(a[0]) and bool(a[1] & getattr(os, "O_DIRECTORY", 0))


# (name, the documented error, setup), as stored.REFUSALS
FS_REFUSALS: tuple[tuple[str, str, Callable[[Any], Setup]], ...] = (
    ("the directory cannot be created (EACCES)", "StorageError", _refuse("makedirs", errno.EACCES)),
    (
        "the directory cannot be opened (EACCES)",
        "StorageError",
        _refuse("open", errno.EACCES, _root_open),
    ),
    ("the directory cannot be locked (ENOLCK)", "StorageError", _refuse("flock", errno.ENOLCK)),
    ("the directory cannot be listed (EIO)", "StorageError", _refuse("listdir", errno.EIO)),
    ("the key cannot be read (EIO)", "StorageError", _refuse("pread", errno.EIO)),
    ("the key cannot be created (EROFS)", "StorageError", _key_absent("link", errno.EROFS)),
    ("the new key cannot be synced (EIO)", "StorageError", _key_absent("fsync", errno.EIO)),
    (
        "the new key cannot be synced (EIO), descriptor 0 free",
        "StorageError",
        _key_sync_fails_on_fd0,
    ),
    ("the key keeps disappearing", "InvalidArgument", _key_absent("", 0)),
)
