"""Benchmark: admission cycles/s of HeterogeneousKVCache as the shared prefix grows.

One *cycle* is what an engine does per request on the cache: ``admit`` (hit search, pins,
validation under the pins), ``use`` (enter: block table refill) and ``finish`` (leaving the
block: store the new blocks, release the pins).  Building the request (hashing its prompt into
block keys) and the scheduler ``tick`` between cycles are timed separately, outside the cycle.

The trace is made of *families* of 5 requests.  Each family has its own prefix of ``N`` tokens
(the row's length); every request of the family is that prefix plus its own 64-token suffix
(shorter than one 256-token block, so it never adds a stored block).  The first request of a
family is a miss that stores the ``N / 256`` prefix blocks; the other four (80% of the trace)
hit the whole prefix.  The device pool holds one family plus a small margin, so storing the next
family evicts the previous one (requests live one tick; the bench ticks after every cycle, so
leases have expired by then).  Every hit is checked to be the full prefix, every miss to be 0.

Geometry: DeepSeek-V4-Flash (256-token LCM blocks), pools shrunk to one family.  No KV content
is written (``writer=None``: in an engine its kernels write every group's pages): the allocator's
metadata path, guards and validation are what is measured.  ``--derive-index`` adds what the
cache does when it writes content itself: deriving each stored block's indexer pages from its CSA
entries (a numpy pass over ~177 KB per block in this geometry).  Tensors: ``--tensors zeroed`` allocates the tiers as the library does (zero
filled, resident); ``lazy`` allocates them uninitialised (untouched pages are not resident, which
is safe because nothing reads KV content here); ``mapped`` makes them views of sparse files
(untouched pages cost no RAM, and the kernel does not refuse a mapping larger than RAM, which it
does for ``lazy``); ``auto`` (default) uses ``zeroed`` while the planned tier bytes fit
``--memory-gib`` and ``mapped`` above that.

    .venv/bin/python bench/impl_bench.py [--lengths 1K 4K 16K 64K 256K 1M] [--cycles 5000]
                                         [--max-seconds 25] [--profile 1K]
"""

from __future__ import annotations

import os

os.environ.setdefault("KVSTATE_KERNEL_BACKEND", "torch")

import argparse  # noqa: E402
import contextlib  # noqa: E402
import cProfile  # noqa: E402
import gc  # noqa: E402
import io  # noqa: E402
import math  # noqa: E402
import pstats  # noqa: E402
import re  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable, Iterator  # noqa: E402
from dataclasses import dataclass  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

from kvstate.impl import native_modules  # noqa: E402
from kvstate.impl.cache import HeterogeneousKVCache  # noqa: E402
from kvstate.impl.tiers import planned_bytes  # noqa: E402
from kvstate.spec.geometry import Geometry, deepseek_v4_flash  # noqa: E402

FAMILY = 5  # 1 miss + 4 hits: 80% of the requests hit the shared prefix
SUFFIX = 64  # tokens after the prefix, unique per request (< one LCM block)
MARGIN_BLOCKS = 8  # device slots beyond one family's prefix
# vLLM 0.33 KVCacheManager, two groups, block 16, 80% hits (measured on this kind of machine, 2026-11)
VLLM_CYCLES_S = 13_000.0
TARGET_RATIO = 3.0  # the target: >= 3x the vLLM reference at 1K tokens
GIB = 2**30
WARMUP_SHARE = 0.2  # at most this share of --max-seconds goes to the warm-up


def parse_length(s: str) -> int:
    s = s.strip().upper()
    mult = {"K": 1024, "M": 1024 * 1024}.get(s[-1:], 1)
    n = int(s[:-1]) if mult > 1 else int(s)
    return n * mult


def fmt_length(n: int) -> str:
    if n % (1024 * 1024) == 0:
        return f"{n // (1024 * 1024)}M"
    if n % 1024 == 0:
        return f"{n // 1024}K"
    return str(n)


def ram_gib() -> float:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024 / GIB
    except OSError:
        pass
    return float("nan")


def describe_failure(exc: BaseException, row: Row) -> str:
    """One line: the exception, and for an allocation failure the sizes behind it."""
    text = f"{type(exc).__name__}: {exc}".splitlines()[0]
    m = re.search(r"tried to allocate (\d+) bytes", text)
    if m:
        return (
            f"{type(exc).__name__}: cannot allocate one {int(m.group(1)) / GIB:.1f} GiB tier tensor "
            f"(all tiers {row.planned_gib:.1f} GiB; this machine has {ram_gib():.1f} GiB RAM, "
            "no swap: the kernel refuses the mapping even uninitialised)"
        )
    return text[:200]


def rss_gib() -> float:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024 / GIB
    except OSError:
        pass
    return float("nan")


@contextlib.contextmanager
def lazy_tensors() -> Iterator[None]:
    """Make ``torch.zeros`` of CPU tensors uninitialised while the tiers are allocated."""
    real = torch.zeros

    def zeros(*size, dtype=None, device=None, pin_memory=False, **kw):  # type: ignore[no-untyped-def]
        on_cpu = device is None or torch.device(device).type == "cpu"
        if on_cpu and not pin_memory and not kw:
            return torch.empty(*size, dtype=dtype, device=device)
        return real(*size, dtype=dtype, device=device, pin_memory=pin_memory, **kw)

    torch.zeros = zeros  # type: ignore[assignment]
    try:
        yield
    finally:
        torch.zeros = real  # type: ignore[assignment]


@contextlib.contextmanager
def mapped_tensors(
    directory: str | None = None, by_size: dict[int, str] | None = None
) -> Iterator[None]:
    """Make ``torch.zeros`` of CPU tensors views of sparse, already-unlinked files while the
    tiers are allocated.  A shared file mapping is not refused by the kernel's overcommit check
    (an anonymous one bigger than RAM is, even uninitialised), its untouched pages cost neither
    RAM nor disk, and they read as zeros, exactly like ``torch.zeros``.  Pages the trace does
    write (indexer pages, block tables) go to the page cache.  Bench-only: it makes the 1M row
    possible on a machine whose RAM is smaller than the tiers.  ``by_size`` maps a tensor's
    exact byte size to another folder for it (``disk_recovery``'s build cache puts its SWA
    device tensor, which the build writes whole, on the disk instead of /dev/shm)."""
    import tempfile

    real = torch.zeros

    def zeros(*size, dtype=None, device=None, pin_memory=False, **kw):  # type: ignore[no-untyped-def]
        on_cpu = device is None or torch.device(device).type == "cpu"
        if not on_cpu or pin_memory or kw:
            return real(*size, dtype=dtype, device=device, pin_memory=pin_memory, **kw)
        shape = tuple(size[0]) if len(size) == 1 and isinstance(size[0], (tuple, list)) else size
        dt = dtype or torch.get_default_dtype()
        numel = math.prod(shape)
        nbytes = numel * torch.empty(0, dtype=dt).element_size()
        if nbytes < 2**20:  # small buffers: ordinary memory
            return real(*size, dtype=dtype, device=device)
        where = (by_size or {}).get(nbytes, directory)
        fd, path = tempfile.mkstemp(prefix="kvstate-bench-", dir=where)
        try:
            os.ftruncate(fd, nbytes)
            t = torch.from_file(path, shared=True, size=numel, dtype=dt)
        finally:
            os.close(fd)
            os.unlink(path)  # the mapping keeps the (sparse) file alive until the tensor dies
        return t.view(*shape)

    torch.zeros = zeros  # type: ignore[assignment]
    try:
        yield
    finally:
        torch.zeros = real  # type: ignore[assignment]


@dataclass
class Row:
    length: int
    blocks: int = 0
    mode: str = ""
    planned_gib: float = 0.0
    cycles: int = 0
    total_s: float = 0.0
    hit_s: float = 0.0
    hits: int = 0
    miss_s: float = 0.0
    misses: int = 0
    touched: int = 0
    request_s: float = 0.0
    tick_s: float = 0.0
    setup_s: float = 0.0
    rss_gib: float = 0.0
    error: str | None = None
    note: str = ""

    @property
    def us_cycle(self) -> float:
        return 1e6 * self.total_s / self.cycles

    @property
    def cycles_s(self) -> float:
        return self.cycles / self.total_s

    @property
    def blocks_per_req(self) -> float:
        return self.touched / self.cycles

    @property
    def us_block(self) -> float:
        return self.us_cycle / self.blocks_per_req if self.blocks_per_req else float("nan")


class Trace:
    """Families of FAMILY requests over one cache; runs cycles and accumulates a Row."""

    def __init__(self, cache: HeterogeneousKVCache, length: int, row: Row) -> None:
        self.cache = cache
        self.n = length
        self.nb = length // cache.L
        self.row = row
        self.family = 0
        self.serial = 0
        self.prefix = np.empty(0, dtype=np.int64)
        self.profilers: dict[str, cProfile.Profile] | None = None
        self.base = (np.arange(length, dtype=np.int64) * 7919 + 13) % 50_000
        self.clock = time.perf_counter  # vs_vllm.py may time CPU time instead
        # called before each timed cycle's admit (impl_instructions.py --split: a callgrind dump)
        self.mark: Callable[[], None] | None = None

    def _tokens(self, r: int) -> np.ndarray:
        if r == 0:  # a new family: a prefix no earlier family shares (unique first token)
            self.prefix = self.base.copy()
            self.prefix[0] = 100_000 + self.family
            self.family += 1
        self.serial += 1
        suffix = 1_000_000 + self.serial * SUFFIX + np.arange(SUFFIX, dtype=np.int64)
        return np.concatenate([self.prefix, suffix])

    def run_family(self, timed: bool) -> None:
        cache, row, nb = self.cache, self.row, self.nb
        clock = self.clock
        for r in range(FAMILY):
            tokens = self._tokens(r)
            t0 = clock()
            req = cache.request(tokens, lifetime=1)
            prof = None
            if timed and self.profilers is not None:
                prof = self.profilers["miss" if r == 0 else "hit"]
                prof.enable()
            if timed and self.mark is not None:
                self.mark()
            t1 = clock()
            adm = cache.admit(req)
            with cache.use(adm):
                pass
            t2 = clock()
            if prof is not None:
                prof.disable()
            cache.tick()
            t3 = clock()
            want = 0 if r == 0 else self.n
            if adm.hit_tokens != want or adm.state != "validated":
                raise RuntimeError(
                    f"request {r} of family {self.family}: hit {adm.hit_tokens} "
                    f"({adm.state}), expected {want}\n{adm.explanation}"
                )
            if r == 0 and req.stored != nb:
                raise RuntimeError(f"miss stored {req.stored} of {nb} blocks")
            if not timed:
                continue
            dt = t2 - t1
            row.cycles += 1
            row.total_s += dt
            row.request_s += t1 - t0
            row.tick_s += t3 - t2
            if r == 0:
                row.misses += 1
                row.miss_s += dt
                row.touched += req.stored  # blocks stored (the search stops at block 0)
            else:
                row.hits += 1
                row.hit_s += dt
                row.touched += len(adm.pins)  # blocks searched, pinned, validated, released


def geometry_for(length: int) -> tuple[Geometry, int]:
    nb = length // 256
    dev = nb + MARGIN_BLOCKS
    g = deepseek_v4_flash().with_changes(
        device_blocks=dev,
        host_blocks=1,
        disk_blocks=16,
        pin_cap_blocks=dev,
        max_requests=4,
    )
    return g, dev


def make_cache(
    length: int, row: Row, tensors: str, budget: float, derive_index: bool = False
) -> HeterogeneousKVCache:
    g, dev = geometry_for(length)
    d, h = planned_bytes(g, dev, 1)
    row.planned_gib = (d + h) / GIB
    mode = tensors
    if mode == "auto":
        mode = "zeroed" if d + h <= budget * GIB else "mapped"
    if mode == "zeroed" and d + h > budget * GIB:
        raise MemoryError(
            f"zeroed tiers need {row.planned_gib:.1f} GiB > --memory-gib {budget:g} "
            f"({dev} device slots x {(d / dev) / 2**20:.2f} MiB)"
        )
    row.mode = mode
    kw = dict(
        cache_dir=None,
        executors="manual",
        device="cpu",
        device_blocks=dev,
        host_blocks=1,
        disk_blocks=16,
        max_requests=4,
        writer=None,
        derive_index=derive_index,
        max_model_len=length + 256,  # the prefix plus its suffix
        memory_limit=d + h + GIB,
    )
    ctx = {"lazy": lazy_tensors, "mapped": mapped_tensors}.get(mode, contextlib.nullcontext)()
    with ctx:
        return HeterogeneousKVCache(g, **kw)  # type: ignore[arg-type]


def bench_length(length: int, args: argparse.Namespace) -> Row:
    row = Row(length, blocks=length // 256)
    cache = None
    try:
        if length % 256:
            raise ValueError("length must be a multiple of the 256-token LCM block")
        t0 = time.perf_counter()
        cache = make_cache(length, row, args.tensors, args.memory_gib, args.derive_index)
        trace = Trace(cache, length, row)
        row.setup_s = time.perf_counter() - t0
        start = time.perf_counter()
        for _ in range(args.warmup):  # steady state: records, pools and LRU in use
            trace.run_family(timed=False)
            if time.perf_counter() - start > args.max_seconds * WARMUP_SHARE:
                break
        want = max(FAMILY, math.ceil(args.cycles / FAMILY) * FAMILY)
        while row.cycles < want:
            trace.run_family(timed=True)
            if time.perf_counter() - start > args.max_seconds:
                row.note = f"stopped at --max-seconds {args.max_seconds:g}"
                break
        row.rss_gib = rss_gib()
    except BaseException as exc:  # noqa: BLE001 - a failed row is reported, the rest goes on
        if isinstance(exc, KeyboardInterrupt):
            raise
        row.error = describe_failure(exc, row)
        row.rss_gib = rss_gib()
    finally:
        if cache is not None:
            cache.close()
        del cache
        gc.collect()
    return row


def lstsq(xs: list[float], ys: list[float]) -> tuple[float, float, float]:
    """(a, b, r2) of y = a + b x."""
    x, y = np.array(xs), np.array(ys)
    A = np.vstack([np.ones_like(x), x]).T
    (a, b), *_ = np.linalg.lstsq(A, y, rcond=None)
    pred = a + b * x
    ss = float(((y - y.mean()) ** 2).sum())
    r2 = 1 - float(((y - pred) ** 2).sum()) / ss if ss > 0 else 1.0
    return float(a), float(b), r2


def report(rows: list[Row]) -> None:
    hdr = (
        f"{'prefix':>7} {'blocks':>6} {'tensors':>7} {'tiers':>7} {'cycles':>6} "
        f"{'cycles/s':>10} {'us/cycle':>10} {'blk/req':>7} {'us/block':>8} "
        f"{'hit us':>10} {'miss us':>10} {'req() us':>9} {'RSS':>6}"
    )
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        if r.error is not None:
            print(
                f"{fmt_length(r.length):>7} {r.blocks:>6} {r.mode or '-':>7} "
                f"{r.planned_gib:>6.1f}G  FAILED: {r.error}"
            )
            continue
        print(
            f"{fmt_length(r.length):>7} {r.blocks:>6} {r.mode:>7} {r.planned_gib:>6.1f}G "
            f"{r.cycles:>6} {r.cycles_s:>10.1f} {r.us_cycle:>10.1f} {r.blocks_per_req:>7.1f} "
            f"{r.us_block:>8.2f} {1e6 * r.hit_s / r.hits:>10.1f} {1e6 * r.miss_s / r.misses:>10.1f} "
            f"{1e6 * r.request_s / r.cycles:>9.1f} {r.rss_gib:>5.2f}G"
            + (f"  ({r.note})" if r.note else "")
        )
    print(
        "columns: tiers = planned tier bytes; hit/miss us = mean cycle time of the hit (80%) and"
        " miss (20%) requests;\n         req() us = building the request (prompt hashing),"
        " not in the cycle; RSS = process resident set after the row"
    )

    ok = [r for r in rows if r.error is None]
    print()
    if len(ok) >= 2:
        xs = [r.blocks_per_req for r in ok]
        a, b, r2 = lstsq(xs, [r.us_cycle for r in ok])
        print(
            f"fit  us/cycle = a + b * blocks   a = {a:.1f} us   b = {b:.2f} us/block   R^2 = {r2:.4f}"
        )
        ah, bh, r2h = lstsq([float(r.blocks) for r in ok], [1e6 * r.hit_s / r.hits for r in ok])
        am, bm, r2m = lstsq([float(r.blocks) for r in ok], [1e6 * r.miss_s / r.misses for r in ok])
        print(f"     hit cycles only:  a = {ah:.1f} us   b = {bh:.2f} us/block   R^2 = {r2h:.4f}")
        print(f"     miss cycles only: a = {am:.1f} us   b = {bm:.2f} us/block   R^2 = {r2m:.4f}")
        big = [r for r in ok if r.blocks >= 4]
        if len(big) >= 2:
            lx = np.log([r.blocks_per_req for r in big])
            ly = np.log([r.us_cycle for r in big])
            k = float(np.polyfit(lx, ly, 1)[0])
            steps = [
                f"{fmt_length(p.length)}->{fmt_length(q.length)}: x{q.us_cycle / p.us_cycle:.2f}"
                f" for x{q.blocks / p.blocks:.0f} blocks"
                for p, q in zip(big, big[1:], strict=False)
            ]
            verdict = "at most linear" if k <= 1.10 else "SUPER-LINEAR"
            print(f"growth: log-log slope {k:.3f} over rows with >= 4 blocks -> {verdict}")
            print("        " + "; ".join(steps))
            above = [
                f"{fmt_length(q.length)}"
                for p, q in zip(big, big[1:], strict=False)
                if q.us_cycle / p.us_cycle > q.blocks / p.blocks
            ]
            if above:  # a slope over the whole range can hide a step that grows faster
                print(
                    f"        time per block rises at {', '.join(above)} (steps above x4): "
                    "wall-clock time also measures the memory hierarchy; "
                    "bench/impl_instructions.py counts instructions"
                )
    else:
        print("fit: needs at least two successful rows")

    print()
    one_k = next((r for r in ok if r.length == 1024), None)
    print(
        f"reference (measured 2026-11): vLLM 0.33 KVCacheManager ~{VLLM_CYCLES_S:,.0f} "
        "get_computed_blocks+allocate_slots+free cycles/s (full + sliding-window group, block 16, "
        "1024 blocks, 80% prefix hits, CPU)"
    )
    if one_k is None:
        print("ours at 1K tokens: not measured (no successful 1K row)")
    else:
        ratio = one_k.cycles_s / VLLM_CYCLES_S
        target = TARGET_RATIO * VLLM_CYCLES_S
        verdict = "MET" if one_k.cycles_s >= target else "NOT MET"
        print(
            f"ours at 1K tokens: {one_k.cycles_s:,.0f} cycles/s = {ratio:.2f}x the reference; "
            f"target >= {TARGET_RATIO:g}x ({target:,.0f} cycles/s): {verdict}"
        )
        hits_s = one_k.hits / one_k.hit_s
        print(
            f"  hit cycles alone at 1K: {hits_s:,.0f} cycles/s = {hits_s / VLLM_CYCLES_S:.2f}x; "
            f"miss cycles alone: {one_k.misses / one_k.miss_s:,.0f} cycles/s"
        )
        print(
            "  (not like for like: ours is 5 groups (CSA, HCA, indexer, SWA, compressor) in "
            "256-token blocks with guarded transitions and validation under pins)"
        )


def profile(length: int, args: argparse.Namespace) -> None:
    """cProfile of the cycle only (admit + use + finish), hit and miss cycles separately."""
    row = Row(length, blocks=length // 256)
    cache = make_cache(length, row, args.tensors, args.memory_gib, args.derive_index)
    try:
        trace = Trace(cache, length, row)
        for _ in range(args.warmup):
            trace.run_family(timed=False)
        trace.profilers = {"hit": cProfile.Profile(), "miss": cProfile.Profile()}
        for _ in range(max(1, math.ceil(args.profile_cycles / FAMILY))):
            trace.run_family(timed=True)
        profs = trace.profilers
    finally:
        cache.close()
    for kind, n in (("hit", row.hits), ("miss", row.misses)):
        out = io.StringIO()
        pstats.Stats(profs[kind], stream=out).strip_dirs().sort_stats("cumulative").print_stats(
            args.profile_top
        )
        text = out.getvalue()
        start = text.find("   ncalls")
        print()
        print(
            f"cProfile of {n} {kind} cycles (admit + use + finish), {fmt_length(length)} prefix, "
            f"top {args.profile_top} by cumulative time (profiler overhead inflates times):"
        )
        print(text[start:].rstrip() if start >= 0 else text.rstrip())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--lengths",
        nargs="+",
        default=["1K", "4K", "16K", "64K", "256K", "1M"],
        help="shared prefix lengths in tokens (suffixes K, M; multiples of 256)",
    )
    ap.add_argument("--cycles", type=int, default=5000, help="timed cycles per length")
    ap.add_argument(
        "--max-seconds", type=float, default=25.0, help="wall-clock cap per length (warm-up incl.)"
    )
    ap.add_argument(
        "--warmup",
        type=int,
        default=100,
        help=f"untimed families before timing (at most {round(WARMUP_SHARE * 100)}%% of --max-seconds)",
    )
    ap.add_argument("--tensors", choices=["auto", "zeroed", "lazy", "mapped"], default="auto")
    ap.add_argument("--memory-gib", type=float, default=4.0, help="budget for zeroed tiers")
    ap.add_argument(
        "--torch-threads",
        type=int,
        default=1,
        help="torch intra-op threads (0: torch's default; waking the pool costs ms on small VMs)",
    )
    ap.add_argument(
        "--derive-index",
        action="store_true",
        help="the cache derives each stored block's indexer pages from its CSA entries (what it "
        "does when it writes the content itself); default: the engine's kernels wrote them",
    )
    ap.add_argument("--profile", default=None, help="also cProfile this length (e.g. 1K)")
    ap.add_argument("--profile-cycles", type=int, default=500)
    ap.add_argument("--profile-top", type=int, default=15)
    args = ap.parse_args()

    lengths = [parse_length(s) for s in args.lengths]
    if args.torch_threads > 0:
        torch.set_num_threads(args.torch_threads)
    print(
        f"kvstate HeterogeneousKVCache, deepseek-v4-flash (L=256), CPU tiers, "
        f"KVSTATE_KERNEL_BACKEND={os.environ['KVSTATE_KERNEL_BACKEND']}, torch {torch.__version__} "
        f"({torch.get_num_threads()} intra-op threads), python {sys.version.split()[0]}"
    )
    compiled = native_modules()
    print(
        "request path: "
        + (
            f"compiled by mypyc ({', '.join(compiled)})"
            if compiled
            else "pure Python (not compiled: KVSTATE_PURE_PYTHON set, or no mypyc build)"
        )
    )
    print(
        f"trace: families of {FAMILY} (1 miss storing the prefix + {FAMILY - 1} full-prefix hits), "
        f"{SUFFIX}-token unique suffix; cycle = admit + use + finish; "
        f"{args.cycles} cycles or {args.max_seconds:g} s per length"
    )
    print(
        "indexer pages of stored blocks: "
        + (
            "derived by the cache from the CSA entries (--derive-index)"
            if args.derive_index
            else "written by the engine (writer=None); the cache stamps their version"
        )
    )
    print()
    t0 = time.perf_counter()
    rows = []
    for n in lengths:
        row = bench_length(n, args)
        rows.append(row)
        status = "failed" if row.error else f"{row.cycles} cycles"
        print(f"  [{fmt_length(n)}: {status}, {time.perf_counter() - t0:.0f} s so far]", flush=True)
    print()
    report(rows)
    if args.profile:
        profile(parse_length(args.profile), args)
    print(f"\ntotal wall time {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
