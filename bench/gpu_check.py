"""Real-GPU check of kvstate.kernels and of CUDA-graph replay across a recovery (one H200).

What it does, in order (``--sections`` picks a subset):

1. selects the CUDA backend explicitly; with no usable CUDA device it says so and exits 3
   (nothing was checked);
2. ``edge``: every dispatch function on small, awkward inputs (empty tables, all -1, ragged
   last block, strided and unaligned tiers, bf16, discontinuities), CUDA result vs the torch
   reference on the same GPU, bit for bit;
3. ``bandwidth``: each kernel at DeepSeek-V4-Flash sizes (hundreds of MiB per call, times
   ``--scale``), timed with CUDA events and reported as a fraction of a plain device-to-device
   copy measured the same way, with its output compared to the torch reference;
4. ``graph`` (:func:`check_cuda_graph_replay`): a ``HeterogeneousKVCache`` with its tiers on the
   GPU; a ``torch.cuda.CUDAGraph`` is captured (through the cache's graph registry,
   ``impl/graphs.py``) over an attention step that reads only persistent buffers; the prefix is
   offloaded to host and disk, its device slots are overwritten, a request is admitted and
   recovered (loads back into the device slots, block table refilled in place), the graph is
   replayed, and three checks print PASS/FAIL: (1) outputs equal an eager recompute and the
   writer's bytes, (2) every persistent address is unchanged and no recapture was forced,
   (3) a recovery that moves blocks is flagged STALE and replay is refused until recaptured.

Exit status: 0 every check of the sections run passed; 1 a check failed or a section raised
(the traceback is printed); 2 bad command line; 3 no usable CUDA device (torch or numba sees
none, or ``NUMBA_ENABLE_CUDASIM=1`` is set): nothing was checked.

Usage::

    python bench/gpu_check.py [--quick] [--scale 0.25] [--iters 10] [--sections edge,graph]
    python bench/gpu_check.py --cpu-dry-run   # no GPU: section 4's protocol on CPU, no capture

Budget: well under 5 minutes on one H200 at the default sizes; ``--quick`` (bandwidth at 5 %
size, 3 timed iterations) should take 1-2 minutes, most of it Numba compiling the kernels on
first launch and torch/CUDA start-up; the graph section is tiny (small geometry, a few seconds).
These are estimates: the script has not yet run on a GPU.

With the ``device`` tool (15 minutes of device time per task, 10 minutes per command): its
image's ``python3`` (3.12) has torch, numba and numba-cuda but not z3-solver, which
``kvstate.spec`` imports.  Once, here (no device time), fetch its wheel into an ignored folder::

    echo /.whl/ >> .git/info/exclude
    python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_17_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_34_x86_64 -d .whl z3-solver

then one ``run`` with ``carry=[".whl"]`` and ``timeout_s=480`` (the checkout need not be
installed: the script maps ``kvstate.*`` onto the repository's folders itself)::

    python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 NUMBA_ENABLE_CUDASIM=0 python3 bench/gpu_check.py --quick

(``--sections graph`` runs only section 4, in well under a minute.)
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from pathlib import Path

import torch

# the sibling modules of this script (``bench/`` is not a package)
sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_graph import GRAPH_EXIT_NO_CUDA, check_cuda_graph_replay  # noqa: E402
from gpu_kernels import bandwidth, check_edge_cases  # noqa: E402

from kvstate.kernels import (  # noqa: E402
    Backend,
    BackendUnavailableError,
    select_backend,
)
from kvstate.kernels._launch import GPU_LAUNCH  # noqa: E402

__all__ = ["check_cuda_graph_replay", "main"]


# ---- main -----------------------------------------------------------------------------------
EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_NO_CUDA = 0, 1, 2, GRAPH_EXIT_NO_CUDA
SECTIONS = ("edge", "bandwidth", "graph")


def _sections(text: str) -> tuple[str, ...]:
    names = tuple(s.strip() for s in text.split(",") if s.strip())
    bad = [s for s in names if s not in SECTIONS]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"sections: comma-separated of {', '.join(SECTIONS)}")
    return names


def _cuda_unavailable(kernels: bool) -> str | None:
    """Why there is no usable CUDA device for the sections asked for, or None.  The Numba
    backend is needed only by the kernel sections (``kernels``); the graph section is torch."""
    if not torch.cuda.is_available():
        return f"torch {torch.__version__} sees no CUDA device"
    if kernels:
        try:
            select_backend(Backend.CUDA)
        except BackendUnavailableError as exc:
            return f"{exc} (the graph section alone may still run: --sections graph)"
    return None


def _run_graph(device: str) -> list[str]:
    """Section 4; the names of the failed checks (a raised exception is one, traceback shown)."""
    print("\n== cuda-graph replay across a recovery ==")
    try:
        checks = check_cuda_graph_replay(device)
    except Exception:
        traceback.print_exc()
        return ["cuda-graph replay raised"]
    print(f"cuda-graph replay: {checks.count - len(checks.failed)}/{checks.count} passed")
    return [f"graph: {name}" for name in checks.failed]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="kvstate real-GPU check: kernels vs torch references, bandwidth vs a copy, "
        "CUDA-graph replay across a recovery",
        epilog="exit status: 0 all passed, 1 a check failed or a section raised, 2 bad command "
        "line, 3 no usable CUDA device (nothing checked)",
    )
    parser.add_argument(
        "--scale", type=float, default=1.0, help="shrink the bandwidth sizes (0 < s <= 1)"
    )
    parser.add_argument("--iters", type=int, default=10, help="timed iterations per kernel")
    parser.add_argument(
        "--quick", action="store_true", help="bandwidth at --scale 0.05 with --iters 3"
    )
    parser.add_argument(
        "--sections",
        type=_sections,
        default=SECTIONS,
        help=f"comma-separated subset of {','.join(SECTIONS)} (default: all)",
    )
    parser.add_argument(
        "--cpu-dry-run",
        action="store_true",
        help="no GPU needed: run only the graph section on CPU (eager replay, no capture)",
    )
    args = parser.parse_args(argv)
    wall = time.perf_counter()
    if args.cpu_dry_run:
        failed = _run_graph("cpu")
        print(f"total {time.perf_counter() - wall:.1f} s")
        print(f"FAILED: {failed}" if failed else "cpu dry run: every check passed")
        return EXIT_FAILED if failed else EXIT_OK

    kernels = "edge" in args.sections or "bandwidth" in args.sections
    why = _cuda_unavailable(kernels)
    if why is not None:
        print(f"NO CUDA DEVICE: {why}; nothing was checked (exit {EXIT_NO_CUDA}).")
        print("Run it where a GPU is lent, or use --cpu-dry-run for the graph protocol on CPU.")
        return EXIT_NO_CUDA
    scale, iters = (0.05, 3) if args.quick else (args.scale, args.iters)
    dev = torch.device("cuda")
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
    if kernels:
        choice = select_backend(Backend.CUDA)
        print(f"backend: {choice.backend.value} ({choice.reason})")
        print(f"launch: {GPU_LAUNCH.threads} threads/block, grid <= {GPU_LAUNCH.max_blocks}")
    failed: list[str] = []

    if "edge" in args.sections:
        try:
            checks = check_edge_cases(dev)
            print(f"edge cases: {checks.count - len(checks.failed)}/{checks.count} passed")
            failed += checks.failed
        except Exception:
            traceback.print_exc()
            failed.append("edge cases raised")

    if "bandwidth" in args.sections:
        try:
            copy_bw, rows = bandwidth(dev, min(max(scale, 1e-3), 1.0), max(iters, 1))
            print(f"\ndevice-to-device copy: {copy_bw / 1e9:8.1f} GB/s (read + write)")
            print(
                f"{'kernel':<18} {'MiB moved':>10} {'time us':>10} {'GB/s':>8} {'% copy':>7}  ok    note"
            )
            for r in rows:
                bw = r.bytes_moved / r.seconds
                print(
                    f"{r.name:<18} {r.bytes_moved / 2**20:10.1f} {r.seconds * 1e6:10.1f} "
                    f"{bw / 1e9:8.1f} {100 * bw / copy_bw:6.1f}%  {'yes' if r.correct else 'NO '}"
                    f"   {r.note}"
                )
            failed += [r.name for r in rows if not r.correct]
        except Exception:
            traceback.print_exc()
            failed.append("bandwidth raised")

    if "graph" in args.sections:
        failed += _run_graph("cuda")

    print(f"\ntotal {time.perf_counter() - wall:.1f} s")
    if failed:
        print(f"FAILED: {failed}")
        return EXIT_FAILED
    print("every check passed")
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
