"""Fault installers the operations and checks share: a full disk for one thread (an ``os``
whose files fail their writes, installed once into ``impl/disk.py``), and a pipeline job
stepped by hand, where an injected step failure is absorbed as a worker thread absorbs one.
"""

from __future__ import annotations

import errno
import threading
from typing import Any

from kvstate.targets.api.base import Harness

_FULL = threading.local()  # on: this thread's disk writes fail (the disk is full)


class _FailingFile:
    """A file whose writes fail as on a full disk, after the first few bytes land."""

    def __init__(self, f: Any) -> None:
        self.f = f
        self.written = 0

    def write(self, data: Any) -> int:
        if self.written:
            raise OSError(errno.ENOSPC, "No space left on device (injected)")
        self.written = self.f.write(bytes(memoryview(data)[:5]))
        return self.written

    def __getattr__(self, name: str) -> Any:
        return getattr(self.f, name)

    def __enter__(self) -> _FailingFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.f.close()


class _FullDiskOs:
    """``os`` as the disk tier sees it: ``fdopen`` hands out failing files while this
    thread's disk is full (``_FULL.on``); everything else is ``os`` itself."""

    def __init__(self, real: Any) -> None:
        self._real = real

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def fdopen(self, fd: int, *a: Any, **k: Any) -> Any:
        f = self._real.fdopen(fd, *a, **k)
        return _FailingFile(f) if getattr(_FULL, "on", False) else f


def _install_full_disk() -> None:
    from kvstate.impl import disk

    if not isinstance(disk.os, _FullDiskOs):
        disk.os = _FullDiskOs(disk.os)  # type: ignore[assignment]


def _jobs(h: Harness) -> list[tuple[Any, Any]]:
    return h.view.jobs()


class _InjectedJobError(RuntimeError):
    """A job step's failure the harness injected (``read_error`` on an offloading block)."""


def _step_job(h: Harness, e: Any, job: Any) -> None:
    from kvstate.impl.errors import KVStateError

    try:
        h.hooks.step_job(e, job)
    except Exception as exc:
        # as a worker thread and ``Pipelines.drain`` do: the job was abandoned (its record
        # back to a consistent phase: a load fails, an offload is cancelled) and dropped
        if not isinstance(exc, (KVStateError, _InjectedJobError)):
            raise  # (a bug in a job: an undocumented error of the call that ran it)
