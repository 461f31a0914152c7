"""Benchmark: recovering a DeepSeek-V4-Flash prefix from the remote tier (Redis), against a raw
pipelined ``GET`` of the same bytes from the same server; and how much a stalled server delays
the requests that do not need it.

Recovery, per prefix length (one run, side by side, ``--repeats`` times each):

1. **raw**: every key the recovery reads, read with pipelined ``GET`` (one connection,
   ``--batch`` commands a round trip, in the order the recovery loads them): each block's load
   chunks, and the window sections of the blocks whose window the recovery restores (the last
   ones: learnt from the untimed recovery, and checked: each timed recovery must read exactly
   the raw read's keys); the server's and the socket's own rate on exactly these bytes (the
   reference the ratio divides by; the entries' headers, read when a cache opens, are not in
   it);
2. **store read alone**: the same keys read by the remote tier's own store read
   (``RedisStore.read_into``: one pipeline of ``GET`` s a block, received into a buffer) on
   ``io_cap`` threads, and nothing else (no MAC, no landing, no job): what the store and the
   socket give the tier's reads, beside what the whole recovery makes of it (column "to store
   read": kvstate's rate over this one's, paired).  Where the machine is loaded, the raw
   read's one connection waits for a CPU at every exchange with the server and this read's
   ``io_cap`` connections do not: the pair of ratios brackets what the recovery costs;
3. **kvstate**: a new request over the prefix is admitted with recovery on and used (threaded
   pipelines, ``io_cap`` remote loads in flight, each chunk's MAC verified), timed from
   ``admit`` to ``use`` returning; then, untimed, the request finishes and the prefix goes back
   to the server (a load forgets the remote copy locally: it is stored again).  One untimed
   recovery (``--warmup``) runs first: the tier tensors are sparse mappings (a device's memory
   is allocated up front), and the first recovery faults in the pages the prefix lands in.

The prefix's window sections (6.4 MB values, the last blocks') are read by redis-py and hiredis
at about half the rate of the 376 KB load chunks, and at about twice their CPU per byte.

Beside the rates: the I/O workers' seconds in the store's reads and in the MAC checks (summed
over the workers), and this process's CPU seconds (user+sys) over each timed interval: on a
shared machine a recovery that needs more CPU than it gets is CPU-bound, whatever its overlap.

The prefix is built through the public API by :class:`disk_recovery.Prefix` (the disk bench's
decode, offload and spill loop) on a cache whose offloaded blocks live in the server (at 1M in
a build cache of few device slots: :class:`RemotePrefix`).  The server holds 2.22 MiB a block
(0.55 GiB at 64K, measured; about 8.9 GiB at 1M), the caches touch about 8.1 GiB of tier
mappings at 1M.  Before each length the bench says what it needs (:func:`memory_needs`) and
refuses to start where ``--maxmemory`` cannot hold the prefix (an ``allkeys-random`` eviction
of one chunk fails the recovery), or without 1.2x the prefix, 1.3x the tier pages and 2 GiB of
RAM available, or 1.3x the pages free on /dev/shm.  After each recovery the copy it read is
deleted before the prefix is stored again, so the server holds one copy, never two.

Stall: a small-geometry cache on the same server starts a remote load; ``DEBUG SLEEP 5``
stalls the server; meanwhile requests that do not need the server (new prompts computed from
scratch: admit, use, finish) run one after the other.  The same requests run for as long just
before and just after the stall (the unstalled distribution, in the same run, bracketing the
machine's load); the delay at each percentile (median, p90, max) is the stalled latency minus
the unstalled one (goal: under 100 ms).

    .venv/bin/python bench/remote_recovery.py [--lengths 64K 1M] [--repeats 3] [--remote URL]

Without ``--remote`` a ``redis-server`` (``--redis-server PATH``, default the one on ``PATH``)
is started on a Unix socket in a temporary directory made in ``--server-dir`` (default the
system's temporary folder; ``--maxmemory``, default 12gb, no persistence).  ``--remote URL``
uses that server (its ``DEBUG`` command must be enabled for the stall).  At 1M, on a machine
with about 24 GiB of RAM to spare::

    .venv/bin/python bench/remote_recovery.py --lengths 64K 1M --repeats 5 --stall 0
"""

from __future__ import annotations

import os

os.environ.setdefault("KVSTATE_KERNEL_BACKEND", "torch")

import argparse  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import disk_recovery as DR  # noqa: E402
import impl_bench as B  # noqa: E402

from kvstate.impl import EventKind, RemoteConfig, native_modules, testdata  # noqa: E402
from kvstate.impl.cache import HeterogeneousKVCache  # noqa: E402

KEY = b"kvstate-bench-fleet-key-0123456789"
GB = 1e9


BUILD_BLOCKS = 3 * DR.CHUNK_BLOCKS + B.MARGIN_BLOCKS  # the build cache's device slots (1M)


class RemotePrefix(DR.Prefix):
    """The disk bench's prefix, its offloaded blocks in the server at ``url``.

    Where the disk bench builds in a first cache and recovers in a second one (``restart``: the
    1M row), the build cache here has :data:`BUILD_BLOCKS` device slots: the build decodes
    ``CHUNK_BLOCKS`` blocks at a time and sends the older ones to the server, so it never holds
    more, and no window file is written where the disk bench's build writes 24.6 GiB (its
    mappings on /dev/shm still took 8.3 GiB at 1M; the entries bind no slot count: the timed
    cache, with the full geometry, adopts them)."""

    url = ""
    built = False
    server_bytes = 0  # the bench's own server's maxmemory (0: a server elsewhere)
    two_caches_from = 1 << 20  # (the disk bench's class attribute: build in a small cache)
    entries_on_disk = False

    def __init__(self, n: int, root: Path, shm: str | None) -> None:
        need = memory_needs(n, self.server_bytes)
        print(f"  [{B.fmt_length(n)}: {need.text}]", flush=True)
        if need.short:
            raise MemoryError(f"{B.fmt_length(n)}: {need.short}")
        super().__init__(n, root, shm)

    def reopen(self) -> None:
        self.built = True
        super().reopen()

    def _open(self) -> HeterogeneousKVCache:
        g = self.g
        if self.restart and not self.built:
            g = g.with_changes(device_blocks=BUILD_BLOCKS, pin_cap_blocks=BUILD_BLOCKS)
        return HeterogeneousKVCache(
            g,
            # timeout: the default 2 s a call fails a block's load on a loaded machine (a 1M
            # recovery beside other jobs validated 3488 of its 4096 blocks): the bench measures
            # throughput, the stall part below measures what a slow server delays
            remote=RemoteConfig(
                url=self.url, key=KEY, model="bench", prefix=f"kvb:{self.n}:", timeout=120.0
            ),
            executors="threads",
            device="cpu",
            max_requests=4,
            max_model_len=self.n + 512,
            memory_limit=self.limit,
            writer=testdata.DeterministicWriter(),
        )

    windows: set[str] = set()  # the entries (their names' base) whose window a recovery reads

    def blocks(self) -> list[list[str]]:
        """Each block's keys that a recovery reads, in the order it loads them (chain order):
        its load chunks, and its window's section where the recovery restores the window (the
        entries :meth:`saw` a recovery read it of)."""
        view = self.cache.inspect()
        chain = self.cache.chain(self.tokens[: self.n])
        out: list[list[str]] = []
        for rid in view.resolve(chain):
            e = view.disk_entries.get(rid)
            if e is None:
                raise RuntimeError("a block of the prefix is not in the server")
            names = [view.disk.chunk_name(e, k) for k in range(len(e.chunks))]
            if str(e.path)[:-2] in self.windows:
                names.append(view.disk.chunk_name(e, -1))
            out.append(names)
        return out

    def saw(self, names: list[str]) -> None:
        """A recovery's reads: remember the entries whose window section it read."""
        for n in names:
            if n.endswith(":w"):
                self.windows.add(n.rsplit(":", 2)[0])

    def names(self) -> list[str]:
        return [n for b in self.blocks() for n in b]

    def stored(self) -> list[str]:
        """Every chunk and window key of the prefix's entries: once a recovery has read them
        (a load forgets the remote copy locally, :meth:`push_back` stores a new one under new
        names), deleted, so that the server holds one copy of the prefix, never two (at 1M a
        second copy overflows the cap, and the server evicts chunks of the current one)."""
        view = self.cache.inspect()
        out = []
        for rid in view.resolve(self.cache.chain(self.tokens[: self.n])):
            e = view.disk_entries.get(rid)
            if e is not None:
                out += [view.disk.chunk_name(e, k) for k in range(len(e.chunks))]
                if e.swa_section is not None:
                    out.append(view.disk.chunk_name(e, -1))
        return out

    def recycle(self, client: Any, old: list[str]) -> None:
        """Store the prefix again, after deleting the copy a recovery read (``old``)."""
        for i in range(0, len(old), 1000):
            client.delete(*old[i : i + 1000])
        self.push_back()

    def push_back(self) -> None:
        self._to_disk(self.nb)


SERVER_PER_BLOCK = 2.23 * 2**20  # server memory a stored block takes (8.9 GiB for 4,096 at 1M)


class Needs:
    """What one length needs of the machine, said before anything starts: the server's memory
    for the prefix (its cap must hold it: an ``allkeys-random`` eviction of one chunk fails
    the recovery), the tier pages the caches touch (sparse mappings on /dev/shm), and 2 GiB to
    spare; ``short`` says what is missing (empty: nothing)."""

    def __init__(self, text: str, short: str) -> None:
        self.text, self.short = text, short


def memory_needs(n: int, server_cap: int) -> Needs:
    from kvstate.spec.geometry import deepseek_v4_flash

    nb = n // 256
    g = deepseek_v4_flash()
    dev = nb + B.MARGIN_BLOCKS
    g = g.with_changes(
        device_blocks=dev,
        host_blocks=DR.CHUNK_BLOCKS,
        disk_blocks=nb + 16,
        pin_cap_blocks=dev,
        max_requests=4,
    )  # (the geometry of the disk bench's Prefix)
    d, _ = DR.planned_bytes(g, dev, DR.CHUNK_BLOCKS)
    pages = d // dev * nb  # (each stored block's device slot: 8.1 GiB at 1M, 8.3 measured)
    server = SERVER_PER_BLOCK * nb
    avail = DR._available_ram()
    shm = shutil.disk_usage("/dev/shm").free if os.path.isdir("/dev/shm") else avail
    held = min(server_cap, 1.2 * server) if server_cap else 0.0  # (one copy: see recycle)
    want = held + 1.3 * pages + 2 * 2**30
    text = (
        f"the server holds about {server / 2**30:.1f} GiB for the prefix (cap "
        + (f"{server_cap / 2**30:.1f} GiB" if server_cap else "its own: --remote")
        + f"); the caches touch about {pages / 2**30:.1f} GiB of tier pages on /dev/shm "
        f"({shm / 2**30:.0f} GiB free there); 1.2x the prefix in the server, 1.3x the pages "
        f"and 2 GiB to spare: {want / 2**30:.1f} GiB of RAM wanted, {avail / 2**30:.1f} GiB "
        "available"
    )
    short = []
    if server_cap and server_cap < 1.1 * server:
        short.append(
            f"--maxmemory {server_cap / 2**30:.1f} GiB cannot hold the prefix "
            f"(about {server / 2**30:.1f} GiB): raise it to {1.2 * server / 2**30:.0f}gb"
        )
    if avail < want:
        short.append(f"{want / 2**30:.1f} GiB of RAM wanted, {avail / 2**30:.1f} available")
    if shm < 1.3 * pages:
        short.append(f"/dev/shm has {shm / 2**30:.1f} GiB free, {1.3 * pages / 2**30:.1f} wanted")
    return Needs(text, "; ".join(short))


def raw_get(client: Any, names: list[str], batch: int) -> tuple[float, int]:
    """Seconds to GET every key (pipelined, ``batch`` a round trip) and the bytes got."""
    got = 0
    t0 = time.perf_counter()
    for i in range(0, len(names), batch):
        pipe = client.pipeline(transaction=False)
        for n in names[i : i + batch]:
            pipe.get(n)
        for v in pipe.execute():
            if v is None:
                raise RuntimeError("a chunk vanished from the server")
            got += len(v)
    return time.perf_counter() - t0, got


def store_read(url: str, blocks: list[list[str]], sizes: dict[str, int], threads: int) -> float:
    """Seconds for ``threads`` threads (the I/O pipeline's ``io_cap``) to read every block's
    chunks with the remote tier's own store read (``RedisStore.read_into``: one pipeline a
    block, received into a buffer), and nothing else: no MAC, no landing, no job."""
    from kvstate.impl.remotestore import RedisStore

    store = RedisStore(url, timeout=600.0, max_connections=threads)
    biggest = max((sum(sizes[n] for n in b) for b in blocks), default=0)

    def work(mine: list[list[str]]) -> None:
        buf = memoryview(bytearray(biggest))
        for names in mine:
            spans, lo = [], 0
            for n in names:
                spans.append((lo, lo + sizes[n]))
                lo += sizes[n]
            if -1 in store.read_into(names, buf, spans):
                raise RuntimeError("a chunk vanished from the server")

    ths = [threading.Thread(target=work, args=(blocks[i::threads],)) for i in range(threads)]
    t0 = time.perf_counter()
    for t in ths:
        t.start()
    for t in ths:
        t.join()
    dt = time.perf_counter() - t0
    store.close()
    return dt


class Spent:
    """Seconds the I/O workers spent (summed over them) in the store's reads (``read_into``:
    one pipeline of ``GET`` s a load) and in the chunks' MAC checks: wrappers on the remote
    tier's instances (plain Python, not compiled)."""

    def __init__(self, tier: Any) -> None:
        self.tier, self.s = tier, {"get": 0.0, "mac": 0.0}
        self.names: list[str] = []  # every key the store read

    def _wrap(self, obj: Any, name: str, key: str) -> None:
        f = getattr(obj, name)

        def call(*a: Any) -> Any:
            if key == "get":
                self.names.extend(a[0])
            t = time.perf_counter()
            try:
                return f(*a)
            finally:
                self.s[key] += time.perf_counter() - t

        setattr(obj, name, call)

    def __enter__(self) -> Spent:
        self._wrap(self.tier.store, "read_into", "get")
        self._wrap(self.tier.macs, "verify", "mac")
        return self

    def __exit__(self, *exc: object) -> None:
        del self.tier.store.read_into, self.tier.macs.verify


class CpuSplit:
    """``--split`` (pure build only: compiled classes take no wrappers): the thread CPU seconds
    (``time.thread_time``, every thread) spent in each step of the recovery, summed over one
    recovery and printed after it.  Nested steps count in each (``read_block`` holds the
    receive and the MACs; a load step holds the rest)."""

    STEPS = (
        ("diskreads", "DiskReads", "disk_load_step", "load steps"),
        ("remote", "RemoteTier", "read_block", "read_block"),
        ("remotestore", "RedisStore", "read_into", "receive"),
        ("entrymac", "EntryMacs", "verify", "MACs"),
        ("tiers", "Tiers", "land_chunk", "landing copies"),
        ("recovery", "Recovery", "install_load", "installs (windows too)"),
        ("recovery", "Recovery", "rebuild_done", "indexer rebuilds"),
    )

    def __init__(self) -> None:
        import importlib

        if native_modules():
            raise SystemExit("--split needs the pure build: KVSTATE_PURE_PYTHON=1")
        self.s: dict[str, float] = {}
        for mod, cls, name, label in self.STEPS:
            owner = getattr(importlib.import_module(f"kvstate.impl.{mod}"), cls)
            setattr(owner, name, self._timed(getattr(owner, name), label))

    def _timed(self, f: Any, label: str) -> Any:
        def call(*a: Any, **k: Any) -> Any:
            t = time.thread_time()
            try:
                return f(*a, **k)
            finally:
                self.s[label] = self.s.get(label, 0.0) + time.thread_time() - t

        return call

    def report(self, cpu: float) -> None:
        parts = ", ".join(f"{k} {v:.3f}" for k, v in self.s.items())
        print(f"  [thread CPU-s of one recovery: {parts}; the process: {cpu:.3f}]", flush=True)
        self.s.clear()


SPLIT: CpuSplit | None = None


def recover(p: RemotePrefix, spent: dict[str, list[float]], same: list[str] | None = None) -> float:
    """Seconds from ``admit`` to ``use`` returning; ``same``: the keys the raw read read, which
    the recovery must read too (no more, no fewer)."""
    cache = p.cache
    req = cache.request(p.tokens, lifetime=1)
    t0 = time.perf_counter()
    with Spent(cache.core.disk) as sp:
        adm = cache.admit(req)
        ctx = cache.use(adm, timeout=900)
        ctx.__enter__()
    dt = time.perf_counter() - t0
    for k, v in sp.s.items():
        spent.setdefault(k, []).append(v)
    p.saw(sp.names)
    if same is not None and sorted(sp.names) != sorted(same):
        raise RuntimeError(
            f"the recovery read {len(sp.names)} keys, the raw read {len(same)}: not the same"
        )
    try:
        if adm.hit_tokens != p.n or adm.state != "validated":
            failed = cache.events_of(EventKind.LOAD_FAILED)
            raise RuntimeError(
                f"recovered {adm.hit_tokens} of {p.n} tokens ({adm.state}); "
                f"{len(failed)} load_failed events, the last: {failed[-1] if failed else None}"
            )
    finally:
        ctx.__exit__(None, None, None)
    return dt


def mmm(xs: list[float]) -> str:
    return f"{statistics.median(xs):.2f} ({min(xs):.2f}-{max(xs):.2f})"


def bench_recovery(n: int, url: str, args: argparse.Namespace, client: Any) -> None:
    RemotePrefix.url = url
    t0 = time.perf_counter()
    p = RemotePrefix(n, Path(args.dir), "/dev/shm" if os.path.isdir("/dev/shm") else None)
    try:
        p.build()
        if p.restart:
            p.reopen()
        names = p.names()
        setup = time.perf_counter() - t0
        raw, ours, ratio = [], [], []
        spent: dict[str, list[float]] = {}
        nbytes = 0
        cpu_raw: list[float] = []
        cpu_ours: list[float] = []
        used = int(client.info("memory")["used_memory"])
        print(
            f"  [{B.fmt_length(n)}: the server holds {used / 2**30:.2f} GiB with the prefix "
            f"({used / p.nb / 2**20:.2f} MiB a block; the memory check assumed "
            f"{SERVER_PER_BLOCK / 2**20:.2f})]",
            flush=True,
        )
        for _ in range(args.warmup):  # (untimed: faults in the tier pages the prefix lands in)
            old = p.stored()
            recover(p, {})
            p.recycle(client, old)
            names = p.names()
        store_s: list[float] = []
        to_store: list[float] = []  # kvstate's rate over the store read's, paired
        for _ in range(args.repeats):
            old = p.stored()
            sizes = {n: int(client.strlen(n)) for n in names}
            store_s.append(store_read(p.url, p.blocks(), sizes, p.g.io_cap))
            c0 = os.times()
            dt_raw, nbytes = raw_get(client, names, args.batch)
            c1 = os.times()
            if SPLIT is not None:
                SPLIT.s.clear()
            dt = recover(p, spent, names)
            c2 = os.times()
            if SPLIT is not None:
                SPLIT.report(c2.user + c2.system - c1.user - c1.system)
            cpu_raw.append(c1.user + c1.system - c0.user - c0.system)
            cpu_ours.append(c2.user + c2.system - c1.user - c1.system)
            raw.append(nbytes / dt_raw / GB)
            ours.append(nbytes / dt / GB)
            ratio.append(dt_raw / dt)
            to_store.append(store_s[-1] / dt)
            p.recycle(client, old)
            names = p.names()
        print(
            f"| {B.fmt_length(n)} | {nbytes / 2**30:.2f} GiB | {mmm(raw)} | "
            f"{mmm([nbytes / GB / t for t in store_s])} | {mmm(ours)} | "
            f"**{mmm(ratio)}** | {mmm(to_store)} | {mmm([nbytes / GB / r for r in raw])} | "
            f"{mmm([nbytes / GB / r for r in ours])} | {mmm(spent['get'])} | "
            f"{mmm(spent['mac'])} | {mmm(cpu_ours)} / {mmm(cpu_raw)} | {setup:.0f} s | "
            f"{os.getloadavg()[0]:.1f} |",
            flush=True,
        )
    finally:
        p.close()
        for k in client.scan_iter(match=f"kvb:{n}:*", count=1000):
            client.delete(k)


def pct(xs: list[float], q: float) -> float:
    """The ``q`` quantile of ``xs`` (nearest rank; 1.0: the maximum)."""
    ys = sorted(xs)
    return ys[min(len(ys) - 1, max(0, round(q * len(ys) + 0.5) - 1))]


class GcPauses:
    """The cyclic garbage collector's pauses while the block runs (``gc.callbacks``): a request
    that stops for a full collection of the process's heap (the recovery rows leave a large
    one) is the collector's delay, not the stalled server's."""

    def __init__(self) -> None:
        self.longest, self.gen, self.count, self._t = 0.0, -1, 0, 0.0

    def _cb(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._t = time.perf_counter()
            return
        dt = time.perf_counter() - self._t
        self.count += 1
        if dt > self.longest:
            self.longest, self.gen = dt, info["generation"]

    def __enter__(self) -> GcPauses:
        import gc

        gc.callbacks.append(self._cb)
        return self

    def __exit__(self, *exc: object) -> None:
        import gc

        gc.callbacks.remove(self._cb)


def bench_stall(url: str, client: Any, seconds: float, ops: int) -> None:
    """Delays of requests that do not need the server while it sleeps ``seconds``."""
    from kvstate.spec import small

    g = small()
    L = g.lcm_tokens
    cfg = RemoteConfig(url=url, key=KEY, model="bench-stall", prefix="kvs:", timeout=30.0)
    a = HeterogeneousKVCache(
        g, remote=cfg, executors="manual", writer=testdata.DeterministicWriter()
    )
    toks = testdata.harness_tokens(4 * L + 1)
    adm = a.admit(a.request(toks))
    with a.use(adm):
        pass
    a.tick(10)
    a.offload(100)
    a.pipelines.drain()
    a.spill(100)
    a.close()
    b = HeterogeneousKVCache(
        g, remote=cfg, executors="threads", writer=testdata.DeterministicWriter()
    )

    def one(seed: int) -> float:
        t = time.perf_counter()
        other = testdata.harness_tokens(2 * L + 1, seed=seed)
        ad = b.admit(b.request(other))
        with b.use(ad) as run:
            assert run.hit_tokens == 0
        dt = time.perf_counter() - t
        b.tick(g.lease_max)  # (untimed) an engine's clock: the request's lease runs out
        return dt

    def window(secs: float, seed: int) -> list[float]:
        """Latencies of the requests run one after the other for ``secs`` (at most ``ops``)."""
        t0, out = time.perf_counter(), []
        while time.perf_counter() - t0 < secs and len(out) < ops:
            out.append(one(seed + len(out)))
        return out

    try:
        span = seconds - 0.5  # (the stall's length, less the wait before its first request)
        window(1.0, 100_000)  # (warm-up: first admissions build the cache's structures)
        # the heap so far (the recovery rows' caches and prefixes among it) collected and
        # frozen out of the collector's reach: a full collection traversed it in 346 ms during
        # one stall, a pause of the collector's whatever the server does (GcPauses reports
        # what the collector still costs inside the stall)
        import gc

        gc.collect()
        gc.freeze()
        before = window(span, 200_000)
        sleeper = threading.Thread(target=lambda: client.execute_command("DEBUG", "SLEEP", seconds))
        sleeper.start()
        time.sleep(0.1)
        waiting = b.admit(b.request(toks))  # its loads wait on the stalled server
        with GcPauses() as gcp:
            during = window(span, 300_000)
        sleeper.join()
        after = window(span, 400_000)
        waiting.wait(60)
        with b.use(waiting) as run:
            hit = run.hit_tokens
        base = before + after
        qs = (("median", 0.5), ("p90", 0.9), ("max", 1.0))
        row = [(q, pct(during, f), pct(base, f)) for q, f in qs]
        print(
            f"stall {seconds:.0f} s (DEBUG SLEEP) while a {4 * L}-token remote load waits on it; "
            f"requests that do not need the server (admit, use, finish of a new prompt, one "
            f"after the other): {len(during)} during the stall, {len(base)} without it "
            f"({len(before)} just before, {len(after)} just after; load "
            f"{os.getloadavg()[0]:.1f}).  Latency ms during / without, and the delay (during "
            f"minus without, at the same percentile; goal < 100 ms): "
            + "; ".join(
                f"{q} {d * 1e3:.1f} / {w * 1e3:.1f}, delay {(d - w) * 1e3:+.1f}" for q, d, w in row
            )
            + f".  The collector's longest pause during the stall: {gcp.longest * 1e3:.1f} ms "
            f"(generation {gcp.gen}; {gcp.count} collections)"
            + f".  The waiting request hit {hit} of {4 * L} tokens after the stall"
            + ("" if hit else f" ({waiting.explanation})".replace("\n", "; ")),
            flush=True,
        )
    finally:
        import gc

        gc.unfreeze()
        b.close()
        for k in client.scan_iter(match="kvs:*", count=1000):
            client.delete(k)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lengths", nargs="+", default=["64K", "1M"])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--batch", type=int, default=64, help="GETs a round trip of the raw read")
    ap.add_argument(
        "--warmup",
        type=int,
        default=1,
        help="untimed recoveries before the timed ones (the first one faults in the pages of "
        "the tier tensors, sparse mappings here, that the prefix lands in)",
    )
    ap.add_argument("--remote", default=None, metavar="URL", help="an existing server")
    ap.add_argument("--maxmemory", default="12gb", help="the bench's own server's cap")
    ap.add_argument(
        "--redis-server", default=None, metavar="PATH", help="the redis-server binary to start"
    )
    ap.add_argument(
        "--server-dir",
        default=None,
        metavar="DIR",
        help="where the bench's own server's directory (socket, working directory) is made",
    )
    ap.add_argument("--dir", default="/tmp", help="where the build's temporary files go")
    ap.add_argument("--stall", type=float, default=5.0, help="DEBUG SLEEP seconds (0: skip)")
    ap.add_argument("--skip-recovery", action="store_true")
    ap.add_argument(
        "--split", action="store_true", help="thread CPU-s per step of each recovery (pure build)"
    )
    args = ap.parse_args()
    if args.split:
        global SPLIT
        SPLIT = CpuSplit()
    import redis
    import torch

    torch.set_num_threads(1)  # (as the disk bench: the landing copies are small, the CPUs shared)

    from kvstate.testing.redisserver import RedisServer

    server = (
        None
        if args.remote
        else RedisServer(maxmemory=args.maxmemory, exe=args.redis_server, root=args.server_dir)
    )
    if server is not None:
        units = {"kb": 2**10, "mb": 2**20, "gb": 2**30}
        m = args.maxmemory.lower()
        RemotePrefix.server_bytes = int(m[:-2]) * units[m[-2:]] if m[-2:] in units else int(m)
    url = args.remote or server.url  # type: ignore[union-attr]
    client = redis.Redis.from_url(url, socket_timeout=600)
    from redis.utils import HIREDIS_AVAILABLE

    parser = "hiredis" if HIREDIS_AVAILABLE else "redis-py's own"
    print(f"# remote recovery vs a raw pipelined GET, server {url}; compiled: "
          f"{', '.join(native_modules()) or 'none (pure)'}; the raw read's reply parser: "
          f"{parser}; load {' '.join(f'{x:.1f}' for x in os.getloadavg())}")  # fmt: skip
    try:
        if not args.skip_recovery:
            print(
                "| length | bytes read | raw GET GB/s | store read alone GB/s | kvstate GB/s | "
                "ratio | to store read | raw s | "
                "kvstate s | GET s (workers) | MAC s (workers) | CPU s kvstate / raw | build | "
                "load after |"
            )
            print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
            for n in (B.parse_length(x) for x in args.lengths):
                bench_recovery(n, url, args, client)
        if args.stall > 0:
            bench_stall(url, client, args.stall, 2000)
    finally:
        if server is not None:
            server.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
