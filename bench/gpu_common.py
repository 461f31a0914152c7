"""What the GPU check's sections share: ``kvstate`` made importable from an uninstalled
checkout (the device machine), and the bit comparison, the CUDA-event timer and the check
log (``bench/gpu_check.py`` runs the sections)."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch


def _ensure_importable() -> None:
    """Make ``import kvstate.<sub>`` work from an uninstalled checkout (the device machine).

    ``kvstate/`` holds only the CLI; its subpackages are the repository's top-level folders
    (pyproject's ``package-dir``), which an install maps.  Without one, the repository root is
    added to ``sys.path`` and to ``kvstate.__path__`` (where ``kvstate.spec`` is ``spec/``)."""
    try:
        import kvstate.kernels  # noqa: F401
    except ModuleNotFoundError as exc:
        if not (exc.name or "").startswith("kvstate"):
            raise  # a missing dependency (numba, z3 ...), not the package layout
        root = str(Path(__file__).resolve().parents[1])
        if root not in sys.path:
            sys.path.insert(0, root)
        import kvstate

        if root not in kvstate.__path__:
            kvstate.__path__.append(root)


_ensure_importable()


from kvstate.kernels import (  # noqa: E402
    Backend,
)

CUDA, REF = Backend.CUDA, Backend.TORCH


# ---- helpers --------------------------------------------------------------------------------
def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equality (NaN matches NaN: payloads are unspecified)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.dtype.is_floating_point:
        na, nb = torch.isnan(a), torch.isnan(b)
        if not torch.equal(na, nb):
            return False
        a, b = a[~na], b[~nb]
    return torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def timed(fn: Callable[[], object], iters: int, warmup: int = 2) -> float:
    """Mean seconds per call, measured with CUDA events around ``iters`` back-to-back calls."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3 / iters


@dataclass
class Row:
    name: str
    bytes_moved: int
    seconds: float
    correct: bool
    note: str = ""


class Checks:
    """Collects pass/fail lines of a section (edge cases, graph replay)."""

    def __init__(self) -> None:
        self.failed: list[str] = []
        self.count = 0
        self.verdicts: dict[str, bool] = {}  # title of a numbered check -> passed

    @contextlib.contextmanager
    def check(self, title: str) -> Iterator[None]:
        """A numbered check made of the ``expect`` lines inside it: prints ``PASS``/``FAIL``."""
        before = len(self.failed)
        print(f"{title}:")
        try:
            yield
        except BaseException:
            self.verdicts[title] = False
            print(f"FAIL {title} (raised, see below)")
            raise
        ok = len(self.failed) == before
        self.verdicts[title] = ok
        print(f"{'PASS' if ok else 'FAIL'} {title}")

    def expect(self, name: str, ok: bool) -> None:
        self.count += 1
        print(f"  {'ok  ' if ok else 'FAIL'} {name}")
        if not ok:
            self.failed.append(name)

    def raises(self, name: str, exc: type[BaseException], fn: Callable[[], object]) -> None:
        try:
            fn()
        except exc:
            self.expect(name, True)
            return
        except Exception as other:  # wrong error type is a failure, reported
            print(f"       got {type(other).__name__}: {other}")
        self.expect(name, False)
