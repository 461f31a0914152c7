"""The cache directory the disk tier writes in: its lock, its key file, and when its files go.

Why a module of its own: what the directory is (who may use it, which secret it keeps, how a
file in it is created and removed) is independent of the entry format the disk tier writes
(``impl/disk.py``), and it is where the file-system's refusals are turned into documented
errors or fallbacks (README, "The disk tier: threat model").

* Created 0700 (``DIR_MODE``; an existing directory keeps the mode its owner gave it) and
  locked for the cache's lifetime: an exclusive ``flock`` on the directory itself (no lock file,
  so a read-only directory locks too), dropped by :meth:`Directory.close` or by the kernel when
  the process dies.  Another holder, in this process or another, is :class:`DirectoryInUse`.
* The per-directory secret ``.kvstate-key``: 32 random bytes created atomically with mode 0600
  (a private temporary linked into place), refused when it is a symlink, not a regular file,
  not owned by this user or readable by others.
* Files the cache lets go of are *doomed* (:meth:`Directory.doom`: no file-system call, so the
  cache's lock may be held) and unlinked by :meth:`Directory.reap`, which runs after that lock
  is released.  An unlink the file system refuses (a read-only mount) leaves the file in
  ``orphans``: the cache goes on without it.
* Every call goes through this module's ``os`` (no ``pathlib`` or ``tempfile`` file-system call
  of its own): the tests' file-system faults (``tests/impl/fs_faults.py``) reach all of them.
"""

from __future__ import annotations

import errno
import fcntl
import os
import secrets
import stat
import threading
from pathlib import Path

from .errors import DirectoryInUse, InvalidArgument, StorageError

KEY_FILE = ".kvstate-key"
KEY_BYTES = 32
DIR_MODE = 0o700  # a created cache directory: nobody else lists it
OPEN_FLAGS = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
_CREATE_FLAGS = (
    os.O_WRONLY
    | os.O_CREAT
    | os.O_EXCL
    | getattr(os, "O_NOFOLLOW", 0)
    | getattr(os, "O_CLOEXEC", 0)
)


def storage_error(what: str, exc: OSError) -> StorageError:
    err = StorageError(f"{what}: {exc}")
    err.__cause__ = exc  # (kept when a compiled caller re-raises it)
    return err


def create_private(root: Path, prefix: str, suffix: str) -> tuple[int, Path]:
    """A private new file in ``root`` (``mkstemp``'s guarantees: created exclusively, no
    symlink followed, mode 0600, an unpredictable name)."""
    for _ in range(16):
        path = root / f"{prefix}{secrets.token_hex(8)}{suffix}"
        try:
            return os.open(path, _CREATE_FLAGS, 0o600), path
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, "no fresh temporary name", str(root))


def load_key(root: Path) -> bytes:
    """The directory's secret: created (atomically, mode 0600) when absent, else checked.
    Raises InvalidArgument for a key file that is not one (a symlink, another owner's, readable
    by others), StorageError when the file system refuses to create or read it."""
    path = root / KEY_FILE
    for _ in range(3):
        try:
            fd = os.open(path, OPEN_FLAGS)
        except FileNotFoundError:
            try:
                _create_key(root, path)
            except OSError as exc:  # a read-only or full file system
                raise storage_error(f"cache_dir key {path} cannot be created", exc) from exc
            continue
        except OSError as exc:  # ELOOP: a symlink planted at the key's name
            raise InvalidArgument(f"cache_dir key {path} cannot be opened safely: {exc}") from exc
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise InvalidArgument(f"cache_dir key {path} is not a regular file")
            if st.st_uid != os.geteuid():
                raise InvalidArgument(f"cache_dir key {path} is not owned by this user")
            if st.st_mode & 0o077:
                raise InvalidArgument(f"cache_dir key {path} is readable by others (not 0600)")
            key = os.pread(fd, KEY_BYTES + 1, 0)
        except OSError as exc:
            raise storage_error(f"cache_dir key {path} cannot be read", exc) from exc
        finally:
            os.close(fd)
        if len(key) != KEY_BYTES:
            raise InvalidArgument(f"cache_dir key {path} is not {KEY_BYTES} bytes")
        return key
    raise InvalidArgument(f"cache_dir key {path} keeps disappearing")


def _create_key(root: Path, path: Path) -> None:
    fd, tmp = create_private(root, ".kvstate-key.", ".new")  # 0600
    try:
        os.write(fd, secrets.token_bytes(KEY_BYTES))
        os.fsync(fd)
        os.close(fd)
        fd = -1
        try:
            os.link(tmp, path)  # atomic and exclusive: a concurrent opener's key wins
        except FileExistsError:
            pass
    finally:
        if fd >= 0:
            os.close(fd)
        try:
            os.unlink(tmp)
        except OSError:  # (the error that brought us here is the one to report)
            pass


class Directory:
    """One cache's directory, created if missing and locked (see the module docstring)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._lock_fd = -1
        self._doomed: list[Path] = []  # files to unlink once the cache's lock is released
        self._in_flight = 0  # unlinks running now (``unlinking`` counts them)
        self._reaping = threading.Lock()  # guards the two above; no file-system call under it
        self._alone = threading.Lock()  # held by the one reaper a bounded reap lets run
        # files whose unlink the file system refused (a read-only mount): left behind, with why
        self.orphans: list[tuple[Path, str]] = []
        self._lock()

    def _lock(self) -> None:
        """Create the directory (0700) if it is missing and take its lock (held until
        :meth:`close` or the process's end).  Another holder is :class:`DirectoryInUse`."""
        root = self.root
        try:
            os.makedirs(root, mode=DIR_MODE, exist_ok=True)
        except (FileExistsError, NotADirectoryError) as exc:  # a file where a directory goes
            raise InvalidArgument(f"cache_dir {root} is not a directory: {exc}") from exc
        except OSError as exc:
            raise storage_error(f"cache_dir {root} cannot be created", exc) from exc
        flags = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0)
        try:
            fd = os.open(root, flags)
        except NotADirectoryError as exc:
            raise InvalidArgument(f"cache_dir {root} is not a directory: {exc}") from exc
        except OSError as exc:
            raise storage_error(f"cache_dir {root} cannot be opened", exc) from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            os.close(fd)
            err = DirectoryInUse(
                f"cache_dir {root} is in use by another cache (this or another process holds "
                "its lock); two caches never share a directory: give each its own, or close "
                "the other first"
            )
            err.__cause__ = exc
            raise err from exc
        except OSError as exc:  # a file system without locks (ENOLCK, EOPNOTSUPP)
            os.close(fd)
            raise storage_error(f"cache_dir {root} cannot be locked", exc) from exc
        self._lock_fd = fd

    def close(self) -> None:
        """Release the directory's lock (the files stay)."""
        fd, self._lock_fd = self._lock_fd, -1
        if fd >= 0:
            os.close(fd)

    def __del__(self) -> None:
        # a cache dropped without ``close`` (a test's crash) still lets the directory go
        try:
            self.close()
        except (OSError, AttributeError):
            pass

    def listing(self) -> list[str]:
        """The directory's names, sorted; StorageError when it cannot be listed."""
        try:
            return sorted(os.listdir(self.root))
        except OSError as exc:
            raise storage_error(f"cache_dir {self.root} cannot be listed", exc) from exc

    def remove(self, path: Path) -> bool:
        """Unlink ``path`` now (a file of this cache's, or the lock holder's scan); a refusal
        leaves it in ``orphans``.  True when it is gone."""
        try:
            os.unlink(path)
        except FileNotFoundError:
            return True
        except OSError as exc:
            self.orphans.append((path, f"{type(exc).__name__}: {exc}"))
            return False
        return True

    def doom(self, path: Path) -> None:
        """A file to unlink at the next :meth:`reap` (no file-system call here)."""
        self._doomed.append(path)

    def reap(self, alone: bool = False) -> None:
        """Unlink the doomed files (any thread, never under the cache's lock).  ``alone``: only
        if no other ``alone`` reap runs, and only the files doomed when it started.  A bounded
        reap in the middle of a recovery is ``alone``: when every loader that ended joined it,
        all the I/O workers were unlinking at once (about 200 ms per 256 files of a 1M
        recovery, each unlink taking the directory's lock and reading metadata from the disk)
        and no read was in flight meanwhile."""
        if alone:
            if not self._alone.acquire(blocking=False):
                return
            try:
                with self._reaping:
                    n = len(self._doomed)
                self._unlink(n)
            finally:
                self._alone.release()
        else:
            self._unlink(-1)

    def _unlink(self, n: int) -> None:
        """Unlink up to ``n`` doomed files (all of them, those doomed meanwhile too, if < 0)."""
        doomed = self._doomed
        while n:
            with self._reaping:  # (never held over a file-system call)
                if not doomed:
                    return
                path = doomed.pop()
                self._in_flight += 1
            n -= 1
            try:
                self.remove(path)  # (refused: left in orphans)
            finally:
                with self._reaping:
                    self._in_flight -= 1

    @property
    def doomed(self) -> tuple[str, ...]:
        """The names of the files :meth:`reap` has not taken yet."""
        with self._reaping:
            return tuple(p.name for p in self._doomed)

    @property
    def unlinking(self) -> int:
        """Doomed files not yet unlinked (an unlink in flight counts until it returns)."""
        with self._reaping:
            return len(self._doomed) + self._in_flight
