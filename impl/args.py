"""Argument checking for every public entry point, in one place.

Why a module of its own: the public methods take a caller's values as ``Any`` and check them
here, so the compiled (mypyc) and the pure-Python builds refuse the same values with the same
documented error.  A compiled parameter annotated ``int`` would refuse a ``str`` with a
``TypeError`` (and take ``True`` as 1) before any check ran.  Each helper raises
:class:`InvalidArgument` and changes nothing; the fast path of each is one type test and one or
two comparisons, so the request path pays almost nothing for it.
"""

from __future__ import annotations

import math
from typing import Any, Final

import numpy as np

from .errors import InvalidArgument

# the most ticks / counts / ids a caller may pass: far beyond any real use, and small enough
# that no int64 column or C-level wait overflows on them
MAX_COUNT: Final = 1 << 62
MAX_TIMEOUT: Final = 86400.0 * 365  # a year; threading's own limit is lower on some platforms


class Default:
    """A default standing for a value made per call (a fresh writer, a new list), compared by
    identity.  Its ``repr`` says what it stands for, so a signature (``help``) reads
    ``writer=<a new HandedRows>``, not ``<object object at 0x...>``."""

    def __init__(self, meaning: str) -> None:
        self.meaning = meaning

    def __repr__(self) -> str:
        return f"<{self.meaning}>"


def integer(name: str, v: Any, lo: int | None = None, hi: int | None = None) -> int:
    """An int (a numpy integer too; never a bool) within ``[lo, hi]``."""
    if v.__class__ is not int:
        if not isinstance(v, (int, np.integer)) or isinstance(v, (bool, np.bool_)):
            raise InvalidArgument(f"{name} must be an int, got {type(v).__name__}")
        v = int(v)
    if lo is not None and v < lo:
        raise InvalidArgument(f"{name}={v} is below {lo}")
    if hi is not None and v > hi:
        raise InvalidArgument(f"{name}={v} is above {hi}")
    return v


def optional_integer(name: str, v: Any, lo: int | None = None, hi: int | None = None) -> int | None:
    return None if v is None else integer(name, v, lo, hi)


def flag(name: str, v: Any) -> bool:
    """A bool (numpy's too); ``1``, ``"no"`` or ``None`` are not flags."""
    if v is True or v is False:
        return v
    if isinstance(v, np.bool_):
        return bool(v)
    raise InvalidArgument(f"{name} must be a bool, got {type(v).__name__}")


def optional_flag(name: str, v: Any) -> bool | None:
    return None if v is None else flag(name, v)


def text(name: str, v: Any) -> str:
    """A str that encodes as UTF-8 (a lone surrogate does not: it cannot name anything on disk
    or in a hash)."""
    if not isinstance(v, str):
        raise InvalidArgument(f"{name} must be a str, got {type(v).__name__}")
    if not v.isascii():
        try:
            v.encode()
        except UnicodeEncodeError as exc:
            raise InvalidArgument(f"{name} is not valid Unicode text: {exc.reason}") from None
    return v


def choice(name: str, v: Any, allowed: tuple[str, ...]) -> str:
    if not isinstance(v, str) or v not in allowed:
        raise InvalidArgument(f"{name} must be one of {', '.join(map(repr, allowed))}, got {v!r}")
    return v


def timeout(name: str, v: Any) -> float | None:
    """None (wait as long as it takes) or a finite number of seconds >= 0."""
    if v is None:
        return None
    if v.__class__ is float and 0.0 <= v <= MAX_TIMEOUT:  # the common case (NaN fails both)
        return v
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer, np.floating)):
        raise InvalidArgument(f"{name} must be a number of seconds or None, got {type(v).__name__}")
    f = float(v)
    if math.isnan(f) or f < 0 or f > MAX_TIMEOUT:
        raise InvalidArgument(f"{name}={v!r} is not a number of seconds in [0, {MAX_TIMEOUT:g}]")
    return f


def index(name: str, v: Any, n: int) -> int:
    """An index into ``n`` things: ``0 <= v < n`` (no negative indexing from the end)."""
    if v.__class__ is int and 0 <= v < n:
        return v
    return integer(name, v, 0, n - 1)


def device(v: Any) -> Any:
    """None, or a CPU / CUDA device (a str or ``torch.device``) that exists here."""
    import torch

    if v is None:
        return None
    if not isinstance(v, (str, torch.device)):
        raise InvalidArgument(f"device must be a str or torch.device, got {type(v).__name__}")
    try:
        d = torch.device(v)
    except (RuntimeError, ValueError, TypeError) as exc:
        raise InvalidArgument(f"device {v!r} is not a device: {exc}") from None
    if d.type == "cpu":
        return d
    if d.type != "cuda":
        raise InvalidArgument(f"device {v!r}: only 'cpu' and 'cuda' devices are supported")
    if not torch.cuda.is_available():
        raise InvalidArgument(f"device {v!r}: CUDA is not available here")
    return _cuda_device(v, d)  # pragma: no cover: CUDA device only (the fuzz runs on the CPU)


def _cuda_device(v: Any, d: Any) -> Any:  # pragma: no cover: CUDA device only (as above)
    """``d``, a CUDA device of this machine (its index, where it names one, in range)."""
    import torch

    if d.index is not None and not 0 <= d.index < torch.cuda.device_count():
        raise InvalidArgument(f"device {v!r}: no such CUDA device")
    return d


def kernel_backend(v: Any) -> str | None:
    """None (choose by device), or the name of a kernel backend that can run here."""
    if v is None:
        return None
    from kvstate.kernels.dispatch import select_backend
    from kvstate.kernels.errors import KernelError

    if not isinstance(v, str):
        raise InvalidArgument(f"kernel_backend must be a str or None, got {type(v).__name__}")
    try:
        select_backend(v)
    except KernelError as exc:
        raise InvalidArgument(f"kernel_backend {v!r}: {exc}") from None
    return v
