"""Benchmark: recovering a DeepSeek-V4-Flash prefix from the disk tier, against the disk itself.

For each prefix length the bench builds the prefix on disk through the public API (untimed): one
request decodes the prefix chunk by chunk (``append`` stores each completed block and slides the
blocks that left the sliding window, as an engine's decode would), and the stored blocks are
offloaded to host and spilled to disk as they go.  Then, per repeat:

1. **raw**: the disk entry files are read sequentially (one ``readinto`` loop per file, 8 MiB
   at a time, in the order the recovery loads them) from a cold page cache: the disk's own
   sequential read bandwidth on exactly these bytes, through the page cache (the reference the
   ratio divides by); then the same with ``O_DIRECT`` (column ``raw O_DIRECT``, shown for
   honesty: kvstate's loads read direct where the file system allows, and a direct sequential
   read is the bound they run against);
2. **kvstate**: a new request over the prefix is admitted with recovery on and used: ``admit``
   starts every block's load on the I/O pipeline (capped at ``io_cap`` in flight, chunk
   checksums verified as the chunks land), the indexer rebuilds and the boundary's tail check on
   the CPU pipeline, and ``use`` returns when the hit is validated.  Timed from ``admit`` to
   ``use`` returning, from a cold page cache;
3. untimed: the request finishes and the prefix goes back to disk (a load deletes the disk copy).

Where the timed cache never wrote its tier pages (a prefix adopted with ``--keep``, or the
two-cache way's reopened cache), ``--warmup`` untimed recoveries (1) run first: the first one
faults in every tier page it lands, which a server's device tier, backed from its start, does
not pay on a recovery.

GB/s are the entry files' bytes (10^9) over the wall time.  Next to them: this process's CPU
seconds (user+sys) over each timed interval (on a shared machine a recovery that needs more CPU
than it gets is CPU-bound, whatever its overlap), and the overlap itself: how long after the
last disk read ``use`` returned, and how much MAC time ran after it (the disk tier's ``pread``
and ``_chunk_mac`` are timed by wrappers on its instance).  The page cache is emptied before
each timed read with ``os.sync()`` and ``posix_fadvise(POSIX_FADV_DONTNEED)`` on every file, and
``echo 3 > /proc/sys/vm/drop_caches`` where this process may write it; the header says which
worked.  Tier tensors are sparse shared mappings (``impl_bench.mapped_tensors``, on /dev/shm when
present) so that a 1M-token device tier fits a machine with less RAM than its nominal size.

    .venv/bin/python bench/disk_recovery.py [--lengths 64K 1M] [--repeats 3] [--dir /tmp]
"""

from __future__ import annotations

import os

os.environ.setdefault("KVSTATE_KERNEL_BACKEND", "torch")

import argparse  # noqa: E402
import cProfile  # noqa: E402
import gc  # noqa: E402
import io  # noqa: E402
import mmap  # noqa: E402
import pstats  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import impl_bench as B  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

import kvstate.impl.disk as D  # noqa: E402
from kvstate.impl import native_modules, testdata  # noqa: E402
from kvstate.impl.cache import HeterogeneousKVCache  # noqa: E402
from kvstate.impl.tiers import planned_bytes  # noqa: E402
from kvstate.spec.geometry import deepseek_v4_flash  # noqa: E402

CHUNK_BLOCKS = 64  # blocks decoded, offloaded and spilled per step while building the prefix
READ_BUF = 8 * 2**20
GB = 1e9


def drop_cache(files: list[Path]) -> list[str]:
    """Empty the page cache of ``files``; returns the methods that worked."""
    os.sync()
    done = []
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        done.append("drop_caches")
    except OSError:
        pass
    ok = 0
    for p in files:
        try:
            fd = os.open(p, os.O_RDONLY)
        except OSError:
            continue
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            ok += 1
        except OSError:
            pass
        finally:
            os.close(fd)
    if ok == len(files) and files:
        done.append("fadvise")
    return done


def _meminfo(field: str) -> int:
    """A /proc/meminfo field in bytes (Linux), else -1."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return -1


def _available_ram() -> int:
    """MemAvailable in bytes (Linux), else the whole RAM."""
    got = _meminfo("MemAvailable")
    return got if got >= 0 else os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def written_back() -> int:
    """Bytes the kernel has written back to disk so far (``nr_written`` in /proc/vmstat, the
    whole machine; 0 where unreadable): a recovery that lands its blocks in tier tensors
    mapped on the disk tier's own disk (the 1M row) shares the disk with their writeback."""
    try:
        with open("/proc/vmstat") as f:
            for line in f:
                if line.startswith("nr_written "):
                    return int(line.split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        pass
    return 0


def raw_read(files: list[Path]) -> float:
    """Seconds to read every file sequentially."""
    buf = bytearray(READ_BUF)
    view = memoryview(buf)
    t0 = time.perf_counter()
    for p in files:
        with open(p, "rb", buffering=0) as f:
            while f.readinto(view):
                pass
    return time.perf_counter() - t0


def raw_direct_read(files: list[Path]) -> float | None:
    """Seconds to read every file sequentially with ``O_DIRECT`` (an aligned 8 MiB buffer from
    ``mmap``; no page cache), or None where the file system refuses direct I/O."""
    flag = getattr(os, "O_DIRECT", 0)
    if not flag or not files:
        return None
    buf = mmap.mmap(-1, READ_BUF)
    view = memoryview(buf)
    t0 = time.perf_counter()
    try:
        for p in files:
            fd = os.open(p, os.O_RDONLY | flag)
            try:
                size, off = os.fstat(fd).st_size, 0
                while off < size:  # (stop at the end: a read there would be unaligned)
                    got = os.preadv(fd, [view], off)
                    if not got:
                        break
                    off += got
            finally:
                os.close(fd)
    except OSError:
        return None
    finally:
        view.release()
        buf.close()
    return time.perf_counter() - t0


ENTRY_PER_BLOCK = 1.54 * 2**20  # disk bytes a stored block takes (6.15 GiB for 4,096 at 1M)


class Prefix:
    """One cache and one prefix of ``n`` tokens, moved between disk and device.

    When the tiers' nominal size exceeds half the available RAM (the 1M row: 31 GiB nominal,
    most of it the SWA pool's one block of window pages per slot), the prefix is built in a
    first cache and recovered by a second one opened over the same disk folder (``restart``).
    The build decodes the whole prefix, and the SWA pool hands out its pages first in, first
    out, so the build writes every SWA page once (24.6 GiB at 1M): only in the build cache is
    the SWA device tensor a sparse file in the disk tier's folder (written back while the build
    runs, untimed).  Every other tier tensor of both caches is a sparse mapping on /dev/shm:
    only touched pages take RAM (at 1M about 6.5 GiB, the slots the prefix lands in).  The build
    cache is closed and dropped (its mappings unmapped) before the timed cache opens; that
    cache adopts the entries by their MACs under the directory's key, as any restart does, and
    its recoveries touch no file-backed tier page."""

    two_caches_from = 1 << 62  # a length from which the two-cache way is taken whatever the RAM
    entries_on_disk = True  # (the remote bench's entries live in its server)

    def __init__(self, n: int, root: Path, shm: str | None, keep: Path | None = None) -> None:
        self.n = n
        self.nb = n // 256
        dev = self.nb + B.MARGIN_BLOCKS
        self.g = deepseek_v4_flash().with_changes(
            device_blocks=dev,
            host_blocks=CHUNK_BLOCKS,
            disk_blocks=self.nb + 16,
            pin_cap_blocks=dev,
            max_requests=4,
        )
        g = self.g
        d, h = planned_bytes(g, dev, CHUNK_BLOCKS)
        self.limit = d + h + 2**30
        self.keep = keep
        if keep is not None:  # (a folder of its own per length: the key file is the folder's)
            keep.mkdir(parents=True, exist_ok=True)
            self.cache_dir = keep
        else:
            self.cache_dir = Path(tempfile.mkdtemp(prefix="kvstate-disk-bench-", dir=root))
        # a kept folder that holds the prefix already: no build, the timed cache opens over it
        self.reused = keep is not None and sum(1 for f in keep.glob("*" + D.SUFFIX)) >= self.nb
        self.restart = shm is not None and (
            d + h > _available_ram() // 2
            or os.environ.get("KVSTATE_BENCH_RESTART") == "1"
            or n >= self.two_caches_from
        )  # (the variable forces the two-cache way at any length, to try it on a short one)
        self.shm = shm
        self.mapped_on = shm or "the temporary folder"
        swa = None
        if self.restart and not self.reused:
            ppl = g.lcm_tokens // g.swa_block_tokens
            swa = len(g.layers) * (1 + dev * ppl) * g.swa_block_tokens * g.entry_bytes
            touched = d // dev * self.nb  # (each stored block's device slot)
            if _available_ram() < touched + 6 * 2**30:  # never risk an OOM of a shared machine
                raise MemoryError(
                    f"{touched / 2**30:.1f} GiB of tier pages will be touched on {shm}, and only "
                    f"{_available_ram() / 2**30:.1f} GiB are available (6 GiB spare wanted)"
                )
            self.mapped_on = (
                f"{shm} (the build cache's SWA device tensor, {swa / 2**30:.1f} GiB nominal, "
                f"in {root}; the timed cache opened afresh over the disk folder)"
            )
        # what the run needs, said before it starts: the tier pages in RAM (sparse mappings;
        # one cache: at most its nominal tiers, chosen only where they fit half the RAM) and
        # the entries on the disk tier's file system
        ram = d // dev * self.nb if self.restart else d + h
        on_disk = 0 if self.reused or not self.entries_on_disk else ENTRY_PER_BLOCK * self.nb
        free = shutil.disk_usage(root).free
        print(
            f"  [{B.fmt_length(n)}: about {ram / 2**30:.1f} GiB of tier pages "
            f"({'two caches' if self.restart else 'one cache'}), {_available_ram() / 2**30:.1f} "
            f"GiB available; about {on_disk / 2**30:.1f} GiB written in {root}, "
            f"{free / 2**30:.1f} GiB free there]",
            flush=True,
        )
        if free < on_disk + 2**30:
            raise OSError(
                f"{root} has {free / 2**30:.1f} GiB free, {on_disk / 2**30 + 1:.1f} wanted: --dir"
            )
        if self.reused:
            self.mapped_on = f"{shm} (the prefix's files kept from an earlier run, adopted)"
        with B.mapped_tensors(shm, {swa: str(root)} if swa else None):
            self.cache = self._open()
        base = (np.arange(n + 1, dtype=np.int64) * 7919 + 13) % 50_000
        self.tokens = base

    def _open(self) -> HeterogeneousKVCache:
        return HeterogeneousKVCache(
            self.g,
            cache_dir=self.cache_dir,
            executors="threads",
            device="cpu",
            max_requests=4,
            max_model_len=self.n + 512,
            memory_limit=self.limit,
            writer=testdata.DeterministicWriter(),  # the content the benchmark's checks recompute
        )

    def reopen(self) -> None:
        """Close the build cache and open the timed one over the same disk folder."""
        self.cache.close()
        del self.cache
        gc.collect()
        shmem = _meminfo("Shmem")
        with B.mapped_tensors(self.shm):
            self.cache = self._open()
        st = self.cache.stats()
        if st["disk_entries"] < self.nb:
            raise RuntimeError(f"the reopened cache adopted {st['disk_entries']} of {self.nb}")
        print(
            f"  [reopened over {self.cache_dir}: {st['disk_entries']} entries adopted; Shmem "
            f"{shmem / 2**30:.2f} GiB after closing the build cache; MemAvailable "
            f"{_available_ram() / 2**30:.1f} GiB]",
            flush=True,
        )

    def close(self) -> None:
        self.cache.close()
        if self.keep is None:
            shutil.rmtree(self.cache_dir, ignore_errors=True)

    def _settle(self) -> None:
        """Wait for the pipelines to go idle (offloads, rebuilds)."""
        cache = self.cache
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            st = cache.stats()["blocks"]
            if st.get("offloading", 0) == 0 and st.get("loading", 0) == 0:
                return
            time.sleep(0.001)
        raise TimeoutError("pipelines did not settle")

    def _to_disk(self, want: int) -> None:
        """Offload and spill until ``want`` blocks are on disk (host tier holds a chunk)."""
        cache = self.cache
        while cache.stats()["disk_entries"] < want:
            cache.tick()
            moved = cache.offload(CHUNK_BLOCKS)
            self._settle()
            spilled = cache.spill(CHUNK_BLOCKS)
            if moved == 0 and spilled == 0:
                raise RuntimeError(
                    f"stuck with {cache.stats()['disk_entries']} of {want} blocks on disk: "
                    f"{cache.stats()}"
                )

    def build(self) -> None:
        """Decode the prefix chunk by chunk, spilling the stored blocks as they go."""
        cache, L = self.cache, 256
        first = CHUNK_BLOCKS * L
        req = cache.request(self.tokens[: min(first, self.n)], lifetime=1)
        adm = cache.admit(req, recover=False)
        with cache.use(adm):
            pos = min(first, self.n)
            while pos < self.n:
                end = min(pos + first, self.n)
                cache.append(req, self.tokens[pos:end])
                pos = end
                self._to_disk(max(0, pos // L - CHUNK_BLOCKS))
        self._to_disk(self.nb)

    def files(self) -> list[Path]:
        """The entry files, in the order the recovery loads them (chain order)."""
        core = self.cache.core
        entries = core.recovery.disk_entries
        chain = self.cache.chain(self.tokens[: self.n])
        rids = self.cache.inspect().resolve(chain)
        out = [entries[r].path for r in rids if r in entries]
        if len(out) != self.nb:
            raise RuntimeError(f"{len(out)} of {self.nb} blocks are on disk")
        return out

    def recover(self, profile: cProfile.Profile | None = None) -> tuple[float, Overlap]:
        """Seconds from admit to use returning, for the whole prefix from disk, and when its
        reads and MACs ran."""
        cache = self.cache
        req = cache.request(self.tokens, lifetime=1)
        if profile is not None:
            profile.enable()
        ov = Overlap(cache.core.disk)
        t0 = time.perf_counter()
        with ov:
            adm = cache.admit(req)
            ctx = cache.use(adm, timeout=900)
            ctx.__enter__()
        try:
            t1 = time.perf_counter()
            dt = t1 - t0
            ov.end = t1
            if profile is not None:
                profile.disable()
            if adm.hit_tokens != self.n or adm.state != "validated":
                raise RuntimeError(
                    f"recovered {adm.hit_tokens} of {self.n} tokens ({adm.state})\n"
                    f"{adm.explanation}"
                )
        finally:
            ctx.__exit__(None, None, None)
        return dt, ov


class Overlap:
    """When a recovery's disk reads and chunk MACs ran: wrappers on the disk tier's instance
    (``pread``, ``_chunk_mac``: plain Python, the tests replace them the same way), a few
    microseconds a call.  ``after_io``: from the last read's end to ``use`` returning (what
    still ran after the disk was done: the last MACs, landings, rebuilds, the validation);
    ``mac_after_io``: the MAC seconds that ran after the last read (about one chunk's MAC per
    I/O worker when verification overlaps the reads; all of it if it followed them)."""

    def __init__(self, disk: Any) -> None:
        self.disk = disk
        self.spans: list[tuple[str, float, float]] = []
        self.end = 0.0

    def __enter__(self) -> Overlap:
        disk, spans = self.disk, self.spans
        pread, mac = disk.pread, disk._chunk_mac

        def timed(kind: str, f: Any) -> Any:
            def call(*args: Any) -> Any:
                t = time.perf_counter()
                try:
                    return f(*args)
                finally:
                    spans.append((kind, t, time.perf_counter()))  # (list.append is atomic)

            return call

        disk.pread = timed("read", pread)
        disk._chunk_mac = timed("mac", mac)
        return self

    def __exit__(self, *exc: object) -> None:
        del self.disk.pread, self.disk._chunk_mac

    def after_io(self) -> float:
        last = max((e for k, _, e in self.spans if k == "read"), default=self.end)
        return self.end - last

    def mac_after_io(self) -> float:
        last = max((e for k, _, e in self.spans if k == "read"), default=self.end)
        return sum(e - max(b, last) for k, b, e in self.spans if k == "mac" and e > last)

    def mac_seconds(self) -> float:
        return sum(e - b for k, b, e in self.spans if k == "mac")


def bench(n: int, args: argparse.Namespace, shm: str | None) -> dict[str, Any]:
    t0 = time.perf_counter()
    keep = None if args.keep is None else Path(args.keep) / B.fmt_length(n)
    p = Prefix(n, Path(args.dir), shm, keep)
    try:
        if not p.reused:
            p.build()
            if p.restart:
                p.reopen()
        files = p.files()
        nbytes = sum(f.stat().st_size for f in files)
        # the timed cache's tier pages were never written (an adopted or reopened prefix: no
        # build went through this cache): its first recovery faults in every page it lands
        # (7.3 GiB at 1M, about 3 s of CPU), which a server's device tier, backed when the
        # server starts, never pays on a recovery.  Untimed warm-up recoveries take them.
        warm = args.warmup if p.reused or p.restart else 0
        for _ in range(warm):
            drop_cache(files)
            p.recover()
            p._settle()
            p.cache.tick()
            p._to_disk(p.nb)
            files = p.files()
        setup = time.perf_counter() - t0
        raw, ours, methods = [], [], set()
        raw_direct: list[float] = []
        cpu_raw: list[float] = []
        cpu_ours: list[float] = []
        loads: list[float] = []
        after: list[float] = []
        mac_after: list[float] = []
        mac_s: list[float] = []
        prof = cProfile.Profile() if args.profile else None
        for rep in range(args.repeats):
            loads.append(os.getloadavg()[0])
            methods.update(drop_cache(files))
            c0 = os.times()
            raw.append(nbytes / raw_read(files) / GB)
            c1 = os.times()
            methods.update(drop_cache(files))
            direct = raw_direct_read(files)
            if direct is not None:
                raw_direct.append(nbytes / direct / GB)
                methods.update(drop_cache(files))
            c2, wb0, gc0 = os.times(), written_back(), [x["collections"] for x in gc.get_stats()]
            dt, ov = p.recover(prof if rep == 0 else None)
            ours.append(nbytes / dt / GB)
            c3, wb1 = os.times(), written_back()
            gcs = [x["collections"] - y for x, y in zip(gc.get_stats(), gc0, strict=True)]
            after.append(ov.after_io())
            mac_after.append(ov.mac_after_io())
            mac_s.append(ov.mac_seconds())
            cpu_raw.append(c1.user + c1.system - c0.user - c0.system)
            cpu_ours.append(c3.user + c3.system - c2.user - c2.system)
            loads.append(os.getloadavg()[0])
            print(  # as it goes: a long run that is stopped still shows what it measured
                f"  [{B.fmt_length(n)} repeat {rep + 1}: kvstate {ours[-1]:.2f} GB/s, raw "
                f"{raw[-1]:.2f} GB/s (O_DIRECT {raw_direct[-1] if raw_direct else float('nan'):.2f}), ratio {ours[-1] / raw[-1]:.2f} "
                f"(to O_DIRECT {ours[-1] / raw_direct[-1] if raw_direct else float('nan'):.2f}); process CPU (user+sys) "
                f"kvstate {cpu_ours[-1]:.2f} s, raw {cpu_raw[-1]:.2f} s; MACs {mac_s[-1]:.2f} "
                f"thread-s, {mac_after[-1] * 1e3:.0f} ms of them after the last read; use "
                f"returned {after[-1] * 1e3:.0f} ms after the last read; the kernel wrote "
                f"back {(wb1 - wb0) / 2**30:.2f} GiB meanwhile (machine-wide); gc collections "
                f"by generation {'/'.join(map(str, gcs))}; load "
                f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}]",
                flush=True,
            )
            if rep + 1 < args.repeats or p.keep:  # back to disk (untimed): the next repeat
                p._settle()
                p.cache.tick()
                p._to_disk(p.nb)
                files = p.files()
        out: dict[str, Any] = dict(
            n=n, blocks=p.nb, bytes=nbytes, raw=raw, raw_direct=raw_direct, ours=ours, methods=sorted(methods),
            setup=setup, warm=warm, mapped_on=p.mapped_on, cpu_raw=cpu_raw, cpu_ours=cpu_ours, loads=loads,
            after=after, mac_after=mac_after, direct=getattr(p.cache.core.disk, "direct", None),
        )  # fmt: skip
        if prof is not None:
            s = io.StringIO()
            pstats.Stats(prof, stream=s).strip_dirs().sort_stats("tottime").print_stats(18)
            out["profile"] = s.getvalue()
        return out
    finally:
        p.close()
        gc.collect()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", nargs="+", default=["64K", "1M"])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dir", default=tempfile.gettempdir(), help="where the disk tier lives")
    ap.add_argument("--profile", action="store_true", help="cProfile the first recovery")
    ap.add_argument(
        "--warmup",
        type=int,
        default=1,
        help="untimed recoveries first where the timed cache's tier pages were never written "
        "(an adopted or reopened prefix; 0: time the first touch of the pages too)",
    )
    ap.add_argument(
        "--keep",
        help="keep each length's disk tier in KEEP/<length> (put back on disk after the last "
        "repeat) and, where it holds the prefix already, recover from it without building it "
        "(a restart: another build's venv may run over the same files)",
    )
    args = ap.parse_args()
    torch.set_num_threads(1)
    if not hasattr(testdata, "_KEPT_BYTES"):  # (a build whose content memo is bounded only in
        testdata._KEPT_MAX = 32  # entries held 6 MiB a block of a 1M build: keep it small)
    shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
    compiled = native_modules()
    print(
        f"machine load (1/5/15 min): {' '.join(f'{x:.2f}' for x in os.getloadavg())}, "
        f"{os.cpu_count()} CPUs; python {sys.version.split()[0]}, torch {torch.__version__}"
    )
    print(
        "kvstate request path: "
        + (f"compiled by mypyc ({', '.join(compiled)})" if "cache" in compiled else "pure Python")
    )
    print(
        f"disk tier in {args.dir} ({shutil.disk_usage(args.dir).free / 2**30:.0f} GiB free); tier "
        f"tensors mapped on {shm or 'the disk tier folder'}; deepseek-v4-flash, threads executors"
    )
    rows = []
    for s in args.lengths:
        r = bench(B.parse_length(s), args, shm)
        rows.append(r)
        print(
            f"  [{s}: {r['blocks']} blocks, {r['bytes'] / 2**30:.2f} GiB on disk, setup "
            f"{r['setup']:.0f} s ({r['warm']} untimed warm-up recoveries); tier tensors on "
            f"{r['mapped_on']}; page cache dropped by: "
            f"{', '.join(r['methods']) or 'NOTHING'}; kvstate's loads read with O_DIRECT: "
            f"{ {True: 'yes', False: 'no (refused)', None: 'no (this build)'}[r['direct']] }]",
            flush=True,
        )
    print()
    build = "compiled" if "cache" in compiled else "pure Python"
    hdr = (
        f"{'prefix':>7} {'GiB':>5} {'kvstate GB/s':>16} {'raw GB/s':>16} {'raw O_DIRECT':>16} "
        f"{'ratio (paired)':>16} {'to O_DIRECT':>16} "
        f"{'CPU s kvstate/raw':>18} {'after I/O ms':>13} {'load 1-min':>11}  {'cache drop':<20} build"
    )
    mac = getattr(D, "MAC_NAME", None) or (
        f"HMAC-{D.MAC_DIGEST.upper()}" if hasattr(D, "MAC_DIGEST") else "keyed BLAKE2b"
    )
    print(f"{args.repeats} repeats each, min/median/max; MAC {mac} (disk format {D.FILE_FORMAT})")
    print(hdr)
    print("-" * len(hdr))

    def mmm(xs: list[float], d: int = 2) -> str:
        return "/".join(f"{x:.{d}f}" for x in (min(xs), statistics.median(xs), max(xs)))

    for r in rows:
        ours, raw = r["ours"], r["raw"]
        ratio = [a / b for a, b in zip(ours, raw, strict=True)]
        direct = r["raw_direct"]
        to_direct = (
            mmm([a / b for a, b in zip(ours, direct, strict=True)])
            if len(direct) == len(ours)
            else "-"
        )
        cpu = f"{statistics.median(r['cpu_ours']):.2f}/{statistics.median(r['cpu_raw']):.2f}"
        load = f"{min(r['loads']):.1f}-{max(r['loads']):.1f}"
        tail = f"{statistics.median(r['after']) * 1e3:.0f}/{statistics.median(r['mac_after']) * 1e3:.0f}"
        print(
            f"{B.fmt_length(r['n']):>7} {r['bytes'] / 2**30:>5.2f} {mmm(ours):>16} "
            f"{mmm(raw):>16} {mmm(r['raw_direct']) if r['raw_direct'] else '-':>16} {mmm(ratio):>16} {to_direct:>16} {cpu:>18} {tail:>13} {load:>11}  "
            f"{'+'.join(r['methods']) or 'NOT DROPPED':<20} {build}"
        )
    print(
        "(CPU s: this process's user+sys seconds over the timed interval, median; after I/O: "
        "from the last disk read's end to use returning / the MAC time in it, median; load: "
        f"the 1-minute load average before and after each timed pair, on {os.cpu_count()} CPUs)"
    )
    for r in rows:
        if "profile" in r:
            print(f"\ncProfile of the first {B.fmt_length(r['n'])} recovery (main thread):")
            text = str(r["profile"])
            print(text[text.find("   ncalls") :].rstrip())
    print(f"\nmachine load at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
