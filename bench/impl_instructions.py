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

``--split`` counts hits and misses apart, in one callgrind run per length: the worker calls
``binascii.crc_hqx`` (which nothing else calls: ``zlib.adler32`` would not do, inflating calls
it) before each counted cycle's admit and once after the last, and
``--dump-before=binascii_crc_hqx`` makes callgrind write what it collected so far at each call,
so every dump after the first holds exactly one cycle (the toggles still limit collection to the
same entry points; the first dump holds the warm-up; a stray call would add a dump, and the
run is refused).  It prints the mean,
min and max instructions of the hit cycles and of the miss cycles, and the mean over all counted
cycles, the figure the default mode reads off two runs (the two should agree closely).

``--vllm`` (with ``--split``) counts vLLM 0.33.0's ``KVCacheManager`` on the same trace too, at
equal granularity (``bench/vs_vllm.py``'s ``equal`` layout and cycle: ``get_computed_blocks`` +
``allocate_slots`` + ``free``, the request built outside), one more callgrind run per length:
its cycle is pure Python, so it runs inside a call of ``functools.reduce`` (C:
``functools_reduce``, which the trace calls nowhere else) and that is the toggle.  The ratio
column is vLLM's instructions per cycle over kvstate's: the issue's 3x target in deterministic
instructions (CPU time also pays for cache misses, which instruction counts do not see).
"""

from __future__ import annotations

import argparse
import binascii
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

# the cycle's Python-visible entry points: (class, method); their mypyc wrappers are the toggles
CYCLE = (
    ("HeterogeneousKVCache", "admit"),
    ("HeterogeneousKVCache", "use"),
    ("UseContext", "__enter__"),
    ("UseContext", "__exit__"),
)


def entry_points() -> tuple[str, ...]:
    """mypyc's wrapper of each of :data:`CYCLE`'s methods, named after the module that defines
    it *now* (``CPyPy_<module>___<Class>___<method>``), each checked to be a symbol of the
    compiled library: callgrind ignores a toggle that names no function, so a method moved to
    another module would silently drop out of the count (``UseContext``, whose ``__exit__``
    finishes the request, moved from ``cache`` to ``handles``)."""
    import kvstate.impl.cache as cache
    from kvstate.impl import native

    lib = next(Path(cache.__file__).parent.glob(f"{native.GROUP}__mypyc*.so"), None)
    if lib is None:
        raise SystemExit("the request path is not compiled: reinstall with `pip install -e .`")
    symbols = lib.read_bytes()
    out = []
    for cls, meth in CYCLE:
        owner = next(c for c in getattr(cache, cls).__mro__ if meth in vars(c))
        name = f"CPyPy_{owner.__module__.rsplit('.', 1)[1]}___{owner.__name__}___{meth}"
        if name.encode() + b"\0" not in symbols:
            raise SystemExit(f"{name}: not a symbol of {lib.name}; the toggles would count nothing")
        out.append(name)
    return tuple(out)


def worker(length: str, warmup: int, families: int, split: bool = False) -> None:
    from kvstate.impl import native_modules

    B = impl_bench

    if "cache" not in native_modules():
        raise SystemExit("the request path is not compiled: reinstall with `pip install -e .`")
    n = B.parse_length(length)
    row = B.Row(n, blocks=n // 256)
    cache = B.make_cache(n, row, "auto", 4.0)
    trace = B.Trace(cache, n, row)
    for _ in range(warmup):
        trace.run_family(timed=False)
    # the collector's full passes land in a few cycles, whichever: over a handful of counted
    # cycles they would swamp the per-block cost, so they are left out here (the timed bench
    # includes them)
    gc.collect()
    gc.disable()
    if split:  # a callgrind dump before each counted cycle (see the module docstring)

        def mark() -> None:
            binascii.crc_hqx(b"", 0)

        trace.mark = mark
    for _ in range(families):
        trace.run_family(timed=True)
    if split:
        binascii.crc_hqx(b"", 0)  # closes the last cycle's dump
    gc.enable()
    print(f"RESULT cycles={row.cycles} touched={row.touched} hits={row.hits} misses={row.misses}")
    cache.close()


VLLM_TOGGLE = "functools_reduce"  # the C function each counted vLLM cycle runs inside


def worker_vllm(length: str, warmup: int, families: int) -> None:
    """The vLLM side's split worker: ``vs_vllm.VSide`` (equal layout), each counted cycle inside
    ``functools.reduce`` and after a split mark (the request is built before the mark)."""
    import functools

    import vs_vllm

    v = vs_vllm.import_vllm()
    if isinstance(v, str):
        raise SystemExit(f"vLLM is not importable: {v}")
    n = impl_bench.parse_length(length)
    side = vs_vllm.VSide(v, "equal", n, "cpu")
    for _ in range(warmup):
        side.family(None)
    gc.collect()
    gc.disable()
    cycles = 0
    for _ in range(families):
        for r in range(impl_bench.FAMILY):
            req, prompt = side.make_request(r)
            binascii.crc_hqx(b"", 0)

            def one(
                _a: object, _b: object, req: object = req, prompt: list[int] = prompt
            ) -> object:
                return side.cycle(req, prompt)

            hit, got = functools.reduce(one, (0, 0))  # type: ignore[misc]
            side.check(r, hit, got)
            cycles += 1
    binascii.crc_hqx(b"", 0)
    gc.enable()
    print(f"RESULT cycles={cycles} touched=0 hits=0 misses=0")


def _callgrind_cmd(
    out: Path, worker: str, length: str, warmup: int, families: int, *extra: str
) -> list[str]:
    """The worker under callgrind, collecting only inside the cycle's entry points (vLLM's
    worker: inside ``functools.reduce``)."""
    toggles = (VLLM_TOGGLE,) if worker == "--worker-vllm-split" else entry_points()
    return [
        "valgrind",
        "--tool=callgrind",
        "--collect-atstart=no",
        *(f"--toggle-collect={f}" for f in toggles),
        *extra,
        f"--callgrind-out-file={out}",
        sys.executable,
        __file__,
        worker,
        length,
        str(warmup),
        str(families),
    ]


def _callgrind(length: str, warmup: int, families: int) -> tuple[int, int, int]:
    """(instructions collected, cycles counted, blocks touched) of one worker run."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "callgrind.out"
        cmd = _callgrind_cmd(out, "--worker", length, warmup, families)
        p = subprocess.run(cmd, capture_output=True, text=True)
        res = re.search(r"RESULT cycles=(\d+) touched=(\d+)", p.stdout)
        ir = re.search(r"Collected : (\d+)", p.stderr)
        if p.returncode != 0 or res is None or ir is None:
            raise RuntimeError(
                f"callgrind run for {length} failed:\n{p.stdout}\n{p.stderr[-3000:]}"
            )
        return int(ir.group(1)), int(res.group(1)), int(res.group(2))


SPLIT_MARK = "binascii_crc_hqx"  # the C function behind binascii.crc_hqx


def measure_split(
    length: str, warmup: int, families: int, keep: str | None = None, vllm: bool = False
) -> tuple[list[int], list[int], int]:
    """(instructions of each hit cycle, of each miss cycle, blocks touched): one callgrind run
    dumping before every counted cycle; cycle ``i`` is a miss when ``i % FAMILY == 0``
    (``vllm``: vLLM's cycles, blocks touched 0)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "callgrind.out"
        which = "--worker-vllm-split" if vllm else "--worker-split"
        cmd = _callgrind_cmd(out, which, length, warmup, families, f"--dump-before={SPLIT_MARK}")
        p = subprocess.run(cmd, capture_output=True, text=True)
        res = re.search(r"RESULT cycles=(\d+) touched=(\d+)", p.stdout)
        if p.returncode != 0 or res is None:
            raise RuntimeError(
                f"callgrind run for {length} failed:\n{p.stdout}\n{p.stderr[-3000:]}"
            )
        cycles, touched = int(res.group(1)), int(res.group(2))
        parts: dict[int, int] = {}
        for f in Path(tmp).glob("callgrind.out.*"):
            text = f.read_text()
            part = re.search(r"^part: (\d+)$", text, re.M)
            tot = re.search(r"^totals: (\d+)$", text, re.M)
            if part is None or tot is None:
                raise RuntimeError(f"unreadable callgrind dump {f}")
            parts[int(part.group(1))] = int(tot.group(1))
        # part 1: the warm-up (up to the first mark); parts 2..cycles+1: one counted cycle each
        if sorted(parts) != list(range(1, cycles + 2)):
            raise RuntimeError(f"expected {cycles + 1} dumps, got parts {sorted(parts)}")
        per = [parts[i + 2] for i in range(cycles)]
        if keep is not None:  # for callgrind_annotate: cycle i is callgrind.out.<i + 2>
            dest = Path(keep) / (f"{length}-vllm" if vllm else length)
            dest.mkdir(parents=True, exist_ok=True)
            for f in Path(tmp).glob("callgrind.out.*"):
                shutil.copy(f, dest / f.name)
        hits = [c for i, c in enumerate(per) if i % impl_bench.FAMILY != 0]
        misses = [c for i, c in enumerate(per) if i % impl_bench.FAMILY == 0]
        return hits, misses, touched


def measure(length: str, warmup: int, families: int) -> tuple[int, int, int]:
    """(instructions, cycles, blocks touched) of ``families`` counted families: the toggles
    also count the warm-up's cycles, so a run without counted families is subtracted."""
    ir, cycles, touched = _callgrind(length, warmup, families)
    base, _, _ = _callgrind(length, warmup, 0)
    return ir - base, cycles, touched


def main() -> None:
    if len(sys.argv) == 5 and sys.argv[1] in ("--worker", "--worker-split"):
        worker(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[1] == "--worker-split")
        return
    if len(sys.argv) == 5 and sys.argv[1] == "--worker-vllm-split":
        worker_vllm(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", nargs="+", default=["1K", "16K", "64K", "256K"])
    ap.add_argument("--warmup", type=int, default=8, help="untimed families before counting")
    ap.add_argument("--families", type=int, default=2, help="counted families (5 cycles each)")
    ap.add_argument(
        "--split", action="store_true", help="count hit and miss cycles apart (one run per length)"
    )
    ap.add_argument("--keep", default=None, help="with --split: keep the dumps in this folder")
    ap.add_argument(
        "--vllm",
        action="store_true",
        help="with --split: count vLLM's KVCacheManager on the same trace too (equal layout)",
    )
    args = ap.parse_args()
    if args.vllm and not args.split:
        raise SystemExit("--vllm needs --split")
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed")
    if args.split:
        split_main(args)
        return
    print(
        f"callgrind instructions inside admit/use/finish (collector paused), deepseek-v4-flash, "
        f"warm-up {args.warmup} families, then >= {args.families} counted families "
        "(1 miss + 4 hits each)"
    )
    print(f"{'prefix':>7} {'blocks':>6} {'cycles':>6} {'instr/cycle':>13} {'instr/block':>12}")
    rows = []
    for length in args.lengths:
        blocks_req = max(1, impl_bench.parse_length(length) // 256)
        families = max(args.families, min(20, 1024 // blocks_req))  # >= ~10 cycles, small rows more
        ir, cycles, touched = measure(length, args.warmup, families)
        blocks = touched / cycles
        rows.append((blocks, ir / cycles))
        print(
            f"{length:>7} {blocks:>6.0f} {cycles:>6} {ir / cycles:>13,.0f} {ir / touched:>12,.0f}"
        )
    for (b0, i0), (b1, i1) in zip(rows, rows[1:], strict=False):
        print(f"  x{b1 / b0:g} blocks: x{i1 / i0:.2f} instructions")


def split_main(args: argparse.Namespace) -> None:
    print(
        f"callgrind instructions per cycle inside admit/use/finish (collector paused), hits and "
        f"misses apart, deepseek-v4-flash, warm-up {args.warmup} families, then counted families "
        "(1 miss + 4 hits each); mean (min-max)"
    )
    print(
        f"{'prefix':>7} {'side':>8} {'hits':>5} {'hit instr':>30} {'misses':>6} "
        f"{'miss instr':>34} {'all/cycle':>11}" + (f" {'vLLM/kvstate':>22}" if args.vllm else "")
    )

    def fmt(xs: list[int]) -> str:
        return f"{sum(xs) / len(xs):,.0f} ({min(xs):,}-{max(xs):,})"

    def mean(xs: list[int]) -> float:
        return sum(xs) / len(xs)

    for length in args.lengths:
        blocks_req = max(1, impl_bench.parse_length(length) // 256)
        families = max(args.families, min(20, 1024 // blocks_req))
        sides = [("kvstate", False), ("vLLM", True)] if args.vllm else [("kvstate", False)]
        got: dict[str, tuple[list[int], list[int]]] = {}
        for name, vllm in sides:
            hits, misses, _ = measure_split(length, args.warmup, families, args.keep, vllm)
            got[name] = (hits, misses)
            allc = (sum(hits) + sum(misses)) / (len(hits) + len(misses))
            extra = ""
            if vllm:  # all / hit / miss: vLLM's instructions per cycle over kvstate's
                (kh, km), (vh, vm) = got["kvstate"], got["vLLM"]
                ka = (sum(kh) + sum(km)) / (len(kh) + len(km))
                extra = f" {allc / ka:>8.2f} ({mean(vh) / mean(kh):.2f}/{mean(vm) / mean(km):.2f})"
            print(
                f"{length:>7} {name:>8} {len(hits):>5} {fmt(hits):>30} {len(misses):>6} "
                f"{fmt(misses):>34} {allc:>11,.0f}{extra}",
                flush=True,
            )
    if args.vllm:
        print("vLLM/kvstate: all cycles (hits/misses), vLLM's instructions over kvstate's")


if __name__ == "__main__":
    main()
