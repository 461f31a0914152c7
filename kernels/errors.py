"""Exceptions raised by the kernel layer.

Every data-path failure is raised as one of these, whichever backend ran, so the caller (impl/)
handles a bad block table or a broken tail the same way on a GPU, under the simulator and on
the CPU reference.  Each names the first offending index so a recovery path can truncate there.
"""

from __future__ import annotations


class KernelError(RuntimeError):
    """Base class of every error the kernel layer raises."""


class BackendUnavailableError(KernelError):
    """A backend was forced (argument or KVSTATE_KERNEL_BACKEND) but cannot run here."""


class KernelInputError(KernelError, ValueError):
    """Arguments with the wrong shape, dtype, device or layout, caught before any launch."""


class BlockTableError(KernelError, IndexError):
    """A block table holds a slot that is neither -1 nor a valid block index, or a scatter
    table names one destination block twice (a write race)."""

    def __init__(self, message: str, index: int) -> None:
        super().__init__(message)
        self.index = index  # position in the block table of the first bad slot


class TailDiscontinuityError(KernelError):
    """The compressor-state rows do not continue the compressed entries (a gap or a stale row)."""

    def __init__(self, message: str, position: int) -> None:
        super().__init__(message)
        self.position = position  # first token position whose row is missing or stale
