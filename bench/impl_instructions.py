"""Instructions per admit+use+finish cycle, counted by callgrind: the cost model without the
memory hierarchy or the machine's load.

``impl_bench.py`` times cycles; on a 2-core VM its large rows also measure cache misses and
whatever else runs.  Here the same trace (``impl_bench.Trace``: families of one miss storing
the prefix and four full-prefix hits, DeepSeek-V4-Flash geometry) runs under
``valgrind --tool=callgrind`` with collection switched on only inside the cycle's entry points
(``admit``, ``use``, ``UseContext.__enter__`` / ``__exit__``; everything they call is counted;
the garbage collector is paused while counting, since its full passes would land in a few of
the counted cycles).  Instruction counts are repeatable, so the
growth with the blocks a request touches is read off exactly: linear means instructions per
block stay flat.

It needs valgrind and the compiled request path (the toggles name mypyc's C entry points).
Each length starts a Python under callgrind twice (about a minute of start-up each): both run
``--warmup`` families (records, pools, LRU and tombstones in steady state), one then runs the
counted families, and the difference of the two counts is theirs (the toggles count the
warm-up's cycles too).  Under callgrind code runs about 50x slower than natively.

    .venv/bin/python bench/impl_instructions.py [--lengths 1K 16K 64K 256K] [--families 2]
        [--misses-only]

``--misses-only`` runs families of one request (the miss), warm-up included: each miss still
evicts the previous family's blocks, as in the mixed trace, but no hit runs between them, so
the count is what a miss costs (the LRU order a miss meets differs only in the hits' touches).
"""

from __future__ import annotations

import argparse
import gc
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("KVSTATE_KERNEL_BACKEND", "torch")

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import impl_bench  # noqa: E402 - the trace and its helpers

ENTRY_POINTS = (  # mypyc's wrappers of the cycle's Python-visible entry points
    "CPyPy_cache___HeterogeneousKVCache___admit",
    "CPyPy_cache___HeterogeneousKVCache___use",
    "CPyPy_cache___UseContext_____enter__",
    "CPyPy_cache___UseContext_____exit__",
)


def worker(length: str, warmup: int, families: int, misses_only: bool = False) -> None:
    from kvstate.impl import native_modules

    B = impl_bench

    if "cache" not in native_modules():
        raise SystemExit("the request path is not compiled: reinstall with `pip install -e .`")
    n = B.parse_length(length)
    row = B.Row(n, blocks=n // 256)
    cache = B.make_cache(n, row, "auto", 4.0)
    trace = B.Trace(cache, n, row)
    if misses_only:
        trace.family_size = 1
    for _ in range(warmup):
        trace.run_family(timed=False)
    # the collector's full passes land in a few cycles, whichever: over a handful of counted
    # cycles they would swamp the per-block cost, so they are left out here (the timed bench
    # includes them)
    gc.collect()
    gc.disable()
    for _ in range(families):
        trace.run_family(timed=True)
    gc.enable()
    print(f"RESULT cycles={row.cycles} touched={row.touched} hits={row.hits} misses={row.misses}")
    cache.close()


def _callgrind(length: str, warmup: int, families: int, misses_only: bool) -> tuple[int, int, int]:
    """(instructions collected, cycles counted, blocks touched) of one worker run."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "callgrind.out"
        cmd = [
            "valgrind",
            "--tool=callgrind",
            "--collect-atstart=no",
            *(f"--toggle-collect={f}" for f in ENTRY_POINTS),
            f"--callgrind-out-file={out}",
            sys.executable,
            __file__,
            "--worker",
            length,
            str(warmup),
            str(families),
            *(["--misses-only"] if misses_only else []),
        ]
        p = subprocess.run(cmd, capture_output=True, text=True)
        res = re.search(r"RESULT cycles=(\d+) touched=(\d+)", p.stdout)
        ir = re.search(r"Collected : (\d+)", p.stderr)
        if p.returncode != 0 or res is None or ir is None:
            raise RuntimeError(
                f"callgrind run for {length} failed:\n{p.stdout}\n{p.stderr[-3000:]}"
            )
        return int(ir.group(1)), int(res.group(1)), int(res.group(2))


def measure(
    length: str, warmup: int, families: int, misses_only: bool = False
) -> tuple[int, int, int]:
    """(instructions, cycles, blocks touched) of ``families`` counted families: the toggles
    also count the warm-up's cycles, so a run without counted families is subtracted."""
    ir, cycles, touched = _callgrind(length, warmup, families, misses_only)
    base, _, _ = _callgrind(length, warmup, 0, misses_only)
    return ir - base, cycles, touched


def main() -> None:
    if len(sys.argv) in (5, 6) and sys.argv[1] == "--worker":
        worker(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5:] == ["--misses-only"])
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", nargs="+", default=["1K", "16K", "64K", "256K"])
    ap.add_argument("--warmup", type=int, default=8, help="untimed families before counting")
    ap.add_argument("--families", type=int, default=2, help="counted families (5 cycles each)")
    ap.add_argument(
        "--misses-only", action="store_true", help="count misses alone (families of 1 request)"
    )
    args = ap.parse_args()
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed")
    print(
        f"callgrind instructions inside admit/use/finish (collector paused), deepseek-v4-flash, "
        f"warm-up {args.warmup} families, then >= {args.families} counted families "
        + ("(1 miss each, no hits)" if args.misses_only else "(1 miss + 4 hits each)")
    )
    print(f"{'prefix':>7} {'blocks':>6} {'cycles':>6} {'instr/cycle':>13} {'instr/block':>12}")
    rows = []
    for length in args.lengths:
        blocks_req = max(1, impl_bench.parse_length(length) // 256)
        families = max(args.families, min(20, 1024 // blocks_req))  # >= ~10 cycles, small rows more
        ir, cycles, touched = measure(length, args.warmup, families, args.misses_only)
        blocks = touched / cycles
        rows.append((blocks, ir / cycles))
        print(
            f"{length:>7} {blocks:>6.0f} {cycles:>6} {ir / cycles:>13,.0f} {ir / touched:>12,.0f}"
        )
    for (b0, i0), (b1, i1) in zip(rows, rows[1:], strict=False):
        print(f"  x{b1 / b0:g} blocks: x{i1 / i0:.2f} instructions")


if __name__ == "__main__":
    main()
