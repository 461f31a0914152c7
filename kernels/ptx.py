"""Compile every kernel to Hopper (sm_90) PTX without a GPU.

``cuda.compile_ptx`` runs NVVM only (no driver, no device), so CI proves that the kernel source
the simulator tests also type-checks and lowers for the target GPU: simulator-only constructs
(Python objects, unsupported numpy calls, dtype mix-ups) fail here.  It needs the NVVM library
(``pip install "numba-cuda[cu13]"``) and must run in a process where ``NUMBA_ENABLE_CUDASIM`` is
not set (the simulator has no compiler).

``python -m kvstate.kernels.ptx [--cc 9.0]`` prints one line per (kernel, signature) and exits
1 if any fails, 2 if NVVM is not installed.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from numba import types

from . import dequant, paged, splice

HOPPER = (9, 0)


def _arr(dtype: Any, ndim: int, layout: str = "A") -> Any:
    return types.Array(dtype, ndim, layout)  # type: ignore[call-overload]


@dataclass(frozen=True)
class PtxTarget:
    """One kernel specialisation to compile: a name, the Python function and its signature."""

    name: str
    pyfunc: Callable[..., None]
    signature: tuple[Any, ...]


def targets() -> list[PtxTarget]:
    """Every kernel with the signatures the dispatcher launches it with (word types and index
    types that occur in practice)."""
    i64, i32 = types.int64, types.int32
    out: list[PtxTarget] = []
    # word/index type pairs the dispatcher produces: int64 words for aligned rows, byte words
    # for unaligned ones; int32 and int64 block tables
    pairs: tuple[tuple[Any, Any], ...] = ((types.int64, i32), (types.uint8, i64))
    for word, index in pairs:
        tag = f"{word}/{index}"
        out.append(
            PtxTarget(
                f"gather[{tag}]",
                paged._gather,
                (_arr(word, 2), _arr(index, 1), _arr(word, 1, "C"), i64, _arr(i64, 1, "C")),
            )
        )
        out.append(
            PtxTarget(
                f"scatter[{tag}]",
                paged._scatter,
                (_arr(word, 1, "C"), _arr(index, 1), _arr(word, 2), i64, _arr(i64, 1, "C")),
            )
        )
    out.append(
        PtxTarget(
            "dequant[uint8->float32]",
            dequant._dequant,
            (_arr(types.uint8, 2), _arr(types.float32, 2)) + (i64,) * 5,
        )
    )
    for word in (types.int32,):
        out.append(
            PtxTarget(
                f"splice[{word}]",
                splice._splice,
                (_arr(word, 2), _arr(word, 2), _arr(i64, 1), i64, i64)
                + (_arr(word, 2, "C"), _arr(word, 2, "C"), _arr(i64, 1, "C")),
            )
        )
    return out


@dataclass(frozen=True)
class PtxResult:
    name: str
    ok: bool
    seconds: float
    detail: str  # PTX size and .target line on success, the error otherwise


class NvvmMissingError(RuntimeError):
    """NVVM (the CUDA IR -> PTX compiler) is not installed."""


def nvvm_available() -> tuple[bool, str]:
    """Whether NVVM can be loaded, and if not why (install ``numba-cuda[cu13]``)."""
    try:
        from numba.cuda.cudadrv import nvvm

        if nvvm.is_available():
            return True, "NVVM found"
        nvvm.NVVM()  # raises with the loader's reason
    except Exception as exc:
        return False, f"{type(exc).__name__}: {exc}".strip()
    return False, "NVVM not available"


def compile_all(cc: tuple[int, int] = HOPPER) -> list[PtxResult]:
    """Compile every target for compute capability ``cc``; never raises per kernel, so one
    failure does not hide the others."""
    if os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0"):
        raise RuntimeError(
            "PTX compilation needs NUMBA_ENABLE_CUDASIM unset (the simulator has no compiler)"
        )
    ok, why = nvvm_available()
    if not ok:
        raise NvvmMissingError(f'{why} -- install it with: pip install "numba-cuda[cu13]"')
    from numba import cuda

    results = []
    for t in targets():
        start = time.perf_counter()
        try:
            ptx, _ = cuda.compile_ptx(t.pyfunc, t.signature, cc=cc)
            target = next((ln.strip() for ln in ptx.splitlines() if ln.startswith(".target")), "?")
            results.append(
                PtxResult(t.name, True, time.perf_counter() - start, f"{len(ptx)} chars, {target}")
            )
        except Exception as exc:  # report every kernel, then fail as a whole
            msg = f"{type(exc).__name__}: {exc}".splitlines()[0]
            results.append(PtxResult(t.name, False, time.perf_counter() - start, msg))
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cc", default="9.0", help="compute capability, e.g. 9.0 (Hopper)")
    args = parser.parse_args(argv)
    major, minor = (int(x) for x in args.cc.split("."))
    try:
        results = compile_all((major, minor))
    except NvvmMissingError as exc:
        print(f"NVVM-MISSING {exc}")
        return 2
    for r in results:
        print(
            f"{'ok  ' if r.ok else 'FAIL'} sm_{major}{minor} {r.name:<28} {r.seconds:6.2f}s  {r.detail}"
        )
    failed = sum(not r.ok for r in results)
    print(f"{len(results) - failed}/{len(results)} kernels compiled to sm_{major}{minor} PTX")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
