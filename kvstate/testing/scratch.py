"""Per-example disk tiers on a RAM-backed folder for the verification stack's targets.

Every fuzz example builds a fresh cache, and every cache a fresh disk tier: a folder, a key file
written and ``fsync``-ed, entry files, and a ``rmtree`` at the end.  On this repository's CI kind
of machine those metadata operations cost about 15 ms an example on the overlay disk (``fsync``
6.6 ms, ``rmdir`` 4.6 ms, ``unlink`` 4.2 ms, profiled over 131 examples of ``kvstate fuzz
--profile ci``): a sixth of the run, spent on durability that a throw-away example does not
need.  On tmpfs the same files are real files (the disk tier's code paths, its MACs and its
trust checks all run) and those calls cost microseconds.

Process-wide (``tempfile.tempdir``), so only the verification stack's entry points apply it,
never the library; an explicit ``TMPDIR`` wins, and ``KVSTATE_SCRATCH=disk`` turns it off.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

RAM = Path("/dev/shm")
NEEDED = 256 * 2**20  # free bytes the folder must have (the fuzz targets' tiers are tiny)


def ram_scratch() -> Path | None:
    """Point ``tempfile`` at a private folder on ``/dev/shm`` (removed at exit); returns it,
    or None where there is none, ``TMPDIR`` is set, or ``KVSTATE_SCRATCH=disk``."""
    if "TMPDIR" in os.environ or os.environ.get("KVSTATE_SCRATCH", "ram") == "disk":
        return None
    try:
        if not (RAM.is_dir() and os.access(RAM, os.W_OK)) or shutil.disk_usage(RAM).free < NEEDED:
            return None
        path = Path(tempfile.mkdtemp(prefix="kvstate-scratch-", dir=RAM))
    except OSError:
        return None
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    tempfile.tempdir = str(path)
    return path
