"""The exceptions the library raises, one hierarchy rooted at :class:`KVStateError`.

Every public entry point validates its input and the current state *before* it changes anything
(check, then mutate: TRT-LLM 15931 mutated state before a fallible allocation), so catching one of
these always leaves the cache as it was.  Two families matter to callers:

* :class:`InvalidArgument` / :class:`UnknownRequest` / :class:`LayoutError`: the call itself is
  wrong (negative or absurd lengths, an unknown request, a geometry that cannot be laid out) and
  retrying it will not help;
* :class:`Refused`: the call is well formed but the state does not allow it *now* (the table's
  guard is false); it also subclasses :class:`kvstate.spec.errors.ActionRefused`, which is the
  conformance harness's protocol for "the model would refuse this too".
"""

from __future__ import annotations

from collections.abc import Sequence

from kvstate.spec.errors import ActionRefused, GeometryError


class KVStateError(Exception):
    """Base class of every error raised by :mod:`kvstate.impl`."""


class InvalidArgument(KVStateError, ValueError):
    """A malformed argument: negative or absurd length, wrong type, out-of-range index.

    One rule for integers at every entry point (the library's, ``Run``'s and the core's: a
    count, ticks, a layer, a record, a request slot, a boundary): a Python ``int`` or a NumPy
    integer scalar (``np.int64(0)``) is an int; a ``bool`` (``np.bool_`` too), a float or
    anything else is refused (``tests/impl/test_impl_badinput.py`` checks that every int
    parameter answers the same to ``np.int64``, ``np.int32`` and ``np.uint16`` as to ``int``)."""


class UnknownRequest(KVStateError, KeyError):
    """A request (or request slot) this cache does not know."""

    def __str__(self) -> str:  # KeyError quotes its argument; keep the message readable
        return str(self.args[0]) if self.args else "unknown request"


class LayoutError(KVStateError, GeometryError):
    """The geometry (or a capacity override) cannot be laid out as device/host/disk storage."""


class Refused(KVStateError, ActionRefused):
    """The action is not allowed in the current state; nothing was changed.

    ``action`` is the table's action name and ``failed`` the names of the guard conjuncts that
    were false (empty when the refusal comes from the implementation's own resources, e.g. no
    free slot), so a refusal can be matched against the model's.
    """

    def __init__(self, action: str, failed: Sequence[str] = (), detail: str = "") -> None:
        self.action = action
        self.failed = tuple(failed)
        self.detail = detail
        parts = [f"{action} refused"]
        if self.failed:
            parts.append(f"guard {', '.join(self.failed)} false")
        if detail:
            parts.append(detail)
        super().__init__(": ".join(parts))


class AlreadyReleased(Refused):
    """Releasing, finishing or aborting a request that no longer holds anything."""


class OutOfCapacity(Refused):
    """No free slot in a tier and nothing may be evicted, offloaded or dropped to make one."""


class NotReady(Refused):
    """An admission's recovery jobs have not completed (manual pipelines: drive them first)."""


class RunReleased(Refused):
    """A :class:`~kvstate.impl.cache.Run` read after its request's pins were released (the
    ``with use()`` block exited, or the request was finished or aborted, from any thread):
    its blocks may have been evicted or overwritten, so nothing is read."""


class StaleAdmission(Refused):
    """An :class:`~kvstate.impl.cache.Admission` its request no longer holds (the request was
    released and admitted again): only the request's current admission can be used."""


class CacheClosed(KVStateError):
    """The cache was closed (``close()`` or leaving ``with cache``): its disk directory and
    pipelines are gone, so it serves nothing more."""


class WriterFailed(KVStateError):
    """The cache's ``writer`` raised while storing a block (its exception is ``__cause__``).
    The failing block was discarded and blocks stored before it stay stored; ``finish``
    releases the request all the same (nothing stays pinned), ``append`` leaves it in use."""


class StorageError(KVStateError):
    """The file system refused the cache directory: it cannot be created, locked, listed or
    written (a read-only or full file system, EACCES, EPERM, EIO: the OSError is
    ``__cause__``).  Raised by the constructor (nothing is left open) and by a disk write; a
    refused *unlink* is never raised: the file is left behind (``DiskTier.orphans``) and the
    cache goes on without it (its bytes are exact, see README's threat model)."""


class DirectoryInUse(StorageError):
    """Another cache (in this or another process) holds the directory's lock: two caches
    never share a directory, so neither deletes or overwrites the other's files."""


class DiskWriteError(StorageError):
    """Writing a disk entry failed (a full disk, an I/O error: the OSError is ``__cause__``).
    Its temporary file is removed and nothing is published; ``spill`` returns the blocks it
    spilled before the failure, and raises this only when it spilled none."""


class CorruptEntry(KVStateError):
    """A stored entry failed verification (checksum, header, format); it is recomputed."""


class InternalError(KVStateError, AssertionError):
    """An internal consistency check failed (a double free, a lost slot): a bug in the cache."""
