"""The disk tier across restarts: valid entries are served, corrupt or foreign ones recomputed."""

from __future__ import annotations

import os
import struct
from pathlib import Path
from typing import Any

import pytest
import torch
from cache_checks import check_compressed, check_tail, check_window, make

from kvstate.impl import EventKind, HeterogeneousKVCache
from kvstate.impl.disk import FILE_FORMAT, KEY_FILE, SUFFIX, DiskTier, name_stem
from kvstate.impl.testdata import DeterministicWriter, harness_tokens
from kvstate.spec import small
from kvstate.spec.phases import CKV

G = small()
L = G.lcm_tokens


def persist(d: Path, toks: Any) -> None:
    """A first process stores ``toks`` and pushes every block to disk, then exits."""
    c = make(cache_dir=d)
    try:
        a = c.admit(c.request(toks))
        with c.use(a):
            pass
        c.tick(10)
        c.offload(100)
        c.pipelines.drain()
        assert c.spill(100) == toks.size // L
    finally:
        c.close()


def files(d: Path) -> list[Path]:
    return sorted(p for p in d.iterdir() if p.name.endswith(SUFFIX))


def entry_path(d: Path, key: bytes, disk_key: bytes | None = None) -> Path:
    """The file of block ``key``'s entry in ``d``: its name is keyed (a stem only the holder of
    the directory's key computes, and a random part), so it is found through the key."""
    secret = disk_key if disk_key is not None else (d / KEY_FILE).read_bytes()
    (path,) = [p for p in files(d) if p.name.startswith(name_stem(secret, key))]
    return path


def test_restart_serves_valid_entries(tmp_path: Path) -> None:
    toks = harness_tokens(4 * L + 1)
    persist(tmp_path, toks)
    assert len(files(tmp_path)) == 4
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]  # atomic: no leftovers
    c = make(cache_dir=tmp_path)
    try:
        assert c.stats()["blocks"]["disk"] == 4
        a = c.admit(c.request(toks))
        assert a.state == "pending" and a.hit_tokens == 4 * L
        assert all(s.state in ("On-disk Prefix", "Indexer State") for s in a.recovery.steps)
        c.pipelines.drain()
        with c.use(a) as run:
            assert run.hit_tokens == 4 * L
            check_compressed(run, toks)
            check_window(run, toks)
            check_tail(run, toks)
        assert files(tmp_path) == []  # loaded entries leave the disk tier
    finally:
        c.close()


def test_corrupt_payload_is_rejected_and_recomputed(tmp_path: Path) -> None:
    toks = harness_tokens(4 * L + 1)
    persist(tmp_path, toks)
    c0 = make(cache_dir=tmp_path / "x")
    key3 = c0.chain(toks).keys[3]  # block 3: the boundary before it keeps its window
    c0.close()
    victim = entry_path(tmp_path, key3)
    raw = bytearray(victim.read_bytes())
    raw[-100] ^= 0x40  # flip one payload bit of block 3
    victim.write_bytes(bytes(raw))
    c = make(cache_dir=tmp_path)
    try:
        a = c.admit(c.request(toks))
        c.pipelines.drain()
        with c.use(a) as run:
            assert run.hit_tokens == 3 * L  # truncated before the corrupt block
            check_compressed(run, toks)
        fails = c.events.of(EventKind.LOAD_FAILED)
        assert fails and "checksum" in fails[0].detail
        rid = c.inspect().resolve(c.chain(toks))[3]
        assert c.inspect().meta.corrupt[rid]
        # the corrupt entry is never planned again; dropping it lets the block be recomputed
        b = c.admit(c.request(toks))
        assert all(s.block < 3 for s in b.recovery.steps) and b.hit_tokens == 3 * L
        c.abort(b.request)
        c.tick(10)
        c.drop(100)
        assert c.inspect().meta.ckv[rid] == CKV.FREE and not victim.exists()
        a = c.admit(c.request(toks))
        with c.use(a):
            pass  # recomputes block 3 and stores it again
        d = c.admit(c.request(toks))
        assert d.hit_tokens == 4 * L
        with c.use(d) as run:
            check_compressed(run, toks)
    finally:
        c.close()


@pytest.mark.parametrize(
    "damage", ["header", "magic", "truncate", "extended", "format", "geometry", "name"]
)
def test_bad_files_are_rejected_at_scan(tmp_path: Path, damage: str) -> None:
    toks = harness_tokens(2 * L + 1)
    persist(tmp_path, toks)
    victim = files(tmp_path)[0]
    raw = bytearray(victim.read_bytes())
    if damage == "header":
        raw[20] ^= 0x01
    elif damage == "magic":
        raw[0] ^= 0xFF
    elif damage == "truncate":
        raw = raw[:10]
    elif damage == "extended":  # bytes after the payload: not the file kvstate wrote
        raw += b"\0" * 16
    elif damage in ("format", "geometry"):
        c = make(cache_dir=tmp_path)
        fp = dict(c.inspect().disk.fingerprint)
        (vkey,) = [e.key for e in c.inspect().disk_entries.values() if e.path == victim]
        c.close()
        other = DiskTier(
            tmp_path / "z",
            {**fp, "head_dim": 1} if damage == "geometry" else fp,
            G.load_steps,
            key=(tmp_path / KEY_FILE).read_bytes(),  # this directory's key: a valid MAC
        )
        entry = other.write(vkey, ver=1, gen=1, fmt=0, tail=2, swa=1,
                            units=[("csa", 0, torch.zeros(8, dtype=torch.uint8))], swa_data=None)  # fmt: skip
        data = bytearray(entry.path.read_bytes())
        other.close()
        if damage == "format":
            pre = struct.Struct("<8sI32s16s")
            magic, hlen, _, kid = pre.unpack(bytes(data[: pre.size]))
            hb = bytes(data[pre.size : pre.size + hlen])
            hb = hb.replace(f'"format": {FILE_FORMAT}'.encode(), b'"format": 9')
            mac = other.header_mac(hb)
            data = bytearray(
                pre.pack(magic, len(hb), mac, kid) + hb + bytes(data[pre.size + hlen :])
            )
        raw = data
    elif damage == "name":
        victim.rename(victim.with_name("00" * 16 + SUFFIX))
        victim = victim.with_name("00" * 16 + SUFFIX)
    victim.write_bytes(bytes(raw))
    c = make(cache_dir=tmp_path)
    try:
        removed = c.events.of(EventKind.REMOVED)
        if damage == "magic":  # without kvstate's magic it is not kvstate's: ignored, kept
            assert removed == [] and victim.exists()
        elif damage == "geometry":  # authentic under this key, for another geometry: another
            # cache's entry, left alone and not counted (never deleted, never read)
            assert removed == [] and victim.exists()
            assert [why for _, why in c.inspect().disk.foreign] == [
                f"{victim.name}: written for another geometry/layout"
            ]
        else:
            assert len(removed) == 1 and "rejected" in removed[0].detail
            if damage == "format":  # (its MAC is valid: the header is at fault)
                assert damage in removed[0].detail
            assert not victim.exists()
        assert c.stats()["blocks"]["disk"] == 1
        a = c.admit(c.request(toks))
        c.pipelines.drain()
        with c.use(a) as run:
            assert run.hit_tokens in (0, L)  # only the intact entry can be served
    finally:
        c.close()


def test_threaded_restart(tmp_path: Path) -> None:
    toks = harness_tokens(5 * L + 1)
    persist(tmp_path, toks)
    c = HeterogeneousKVCache(
        G, cache_dir=tmp_path, executors="threads", writer=DeterministicWriter()
    )
    try:
        a = c.admit(c.request(toks))
        with c.use(a, timeout=20) as run:
            assert run.hit_tokens == 5 * L
            check_compressed(run, toks)
        assert c.pipelines.errors() == []
    finally:
        c.close()


@pytest.mark.parametrize("executors", ["manual", "threads"])
def test_loaded_files_are_unlinked_without_the_lock(
    tmp_path: Path, executors: str, monkeypatch: Any
) -> None:
    """A disk load dooms its file under the lock (the record no longer names it) and unlinks
    it after the lock is released: every unlink runs with the lock free, no rename runs at all,
    and once the loads are done no entry is left."""
    toks = harness_tokens(4 * L + 1)
    persist(tmp_path, toks)
    c = HeterogeneousKVCache(
        G, cache_dir=tmp_path, executors=executors, writer=DeterministicWriter()
    )
    core = c.inspect()
    real_unlink, real_rename = os.unlink, os.rename
    unlinks: list[tuple[str, bool]] = []
    renames: list[str] = []

    def unlink(path: Any, *a: Any, **kw: Any) -> None:
        unlinks.append((Path(path).name, core.lock._is_owned()))
        real_unlink(path, *a, **kw)

    def rename(src: Any, dst: Any, *a: Any, **kw: Any) -> None:
        renames.append(Path(src).name)
        real_rename(src, dst, *a, **kw)

    monkeypatch.setattr(os, "unlink", unlink)
    monkeypatch.setattr(os, "rename", rename)
    try:
        a = c.admit(c.request(toks))
        if executors == "manual":
            c.pipelines.drain()
        with c.use(a, timeout=60) as run:
            assert run.hit_tokens == 4 * L
            check_compressed(run, toks)
        if executors == "threads":
            c.pipelines.stop()  # (a reap runs after its load's lock section: let them end)
        loaded = [name for name, _ in unlinks if ".kvb" in name]
        assert len(loaded) == 4 and all(name.endswith(SUFFIX) for name in loaded)
        assert renames == []
        assert not [name for name, locked in unlinks if locked]  # none under the lock
        assert (
            sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(".kvstate-key"))
            == []
        )
    finally:
        c.close()


@pytest.mark.parametrize("executors", ["manual", "threads"])
def test_a_disk_load_opens_and_reads_its_file_once(
    tmp_path: Path, executors: str, monkeypatch: Any
) -> None:
    """A disk load reads its block's file in one read through one descriptor (each chunk's own
    open, ``fstat`` and read cost 0.2-0.4 ms of CPU a chunk), and still serves exactly the
    stored bytes: one open and one read per block, whatever ``load_steps`` is."""
    toks = harness_tokens(4 * L + 1)
    persist(tmp_path, toks)
    c = HeterogeneousKVCache(
        G, cache_dir=tmp_path, executors=executors, writer=DeterministicWriter()
    )
    assert c.inspect().consts.load_steps > 1
    hooks = c.test_hooks()
    real_open: Any = os.open
    real_pread: Any = None
    opened: list[str] = []
    reads: list[int] = []

    def counting_open(path: Any, *a: Any, **kw: Any) -> int:
        if str(path).endswith(SUFFIX):
            opened.append(Path(path).name)
        return real_open(path, *a, **kw)

    def counting_pread(*a: Any) -> int:
        reads.append(1)
        return real_pread(*a)

    monkeypatch.setattr(os, "open", counting_open)
    real_pread = hooks.replace_disk_read(counting_pread)
    try:
        a = c.admit(c.request(toks))
        if executors == "manual":
            c.pipelines.drain()
        with c.use(a, timeout=60) as run:
            assert run.hit_tokens == 4 * L
            check_compressed(run, toks)
            check_window(run, toks)
            check_tail(run, toks)
        assert len(opened) == 4 and len(set(opened)) == 4
        assert len(reads) == 4
    finally:
        c.close()


def test_a_block_with_one_bad_chunk_lands_no_chunk(tmp_path: Path) -> None:
    """Every chunk of a disk load is authenticated before the first one lands: a block whose
    *last* chunk fails its MAC fails its load at its first step, with no chunk landed, and
    the hit is truncated before it (block 3 of a 4-block prefix: the boundary before it keeps
    its window under the store's window policy)."""
    toks = harness_tokens(4 * L + 1)
    persist(tmp_path, toks)
    c = make(cache_dir=tmp_path)
    try:
        core = c.inspect()
        rid = core.resolve(c.chain(toks))[3]
        entry = core.disk_entries[rid]
        lo, hi = entry.chunks[-1][2], entry.chunks[-1][3]
        assert lo < hi and len(entry.chunks) > 1
        raw = bytearray(entry.path.read_bytes())
        raw[entry.payload_offset + hi - 1] ^= 1  # the last byte of the last chunk
        entry.path.write_bytes(bytes(raw))
        a = c.admit(c.request(toks))
        io = c.pipelines.io
        while io.get(rid) is None:  # the I/O cap holds block 3's load back: run the others
            other = next(k for k in io.pending() if k != rid)
            io.run(other)
        assert io.step(rid)  # the first step: read, every MAC checked, failed
        assert core.meta.ckv[rid] == CKV.DISK and core.meta.corrupt[rid]
        c.pipelines.drain()
        with c.use(a) as run:
            assert run.hit_tokens == 3 * L
    finally:
        c.close()


def test_a_loaded_file_left_by_a_crash_is_adopted_with_exact_bytes(tmp_path: Path) -> None:
    """A crash between a load and its file's unlink (the unlink runs after the cache's lock is
    released) leaves the entry under its name: the next process adopts it, and what it serves
    is the block's exact content (entries are content-addressed: docs/library.md, threat model)."""
    toks = harness_tokens(2 * L + 1)
    persist(tmp_path, toks)
    c = make(cache_dir=tmp_path)
    try:
        c.test_hooks().replace_disk_method("reap", lambda: None)  # the crash: never reaped
        a = c.admit(c.request(toks))
        c.pipelines.drain()
        with c.use(a) as run:
            assert run.hit_tokens == 2 * L
        assert len(files(tmp_path)) == 2 and c.stats()["disk_unlinking"] == 2
    finally:
        c.close()  # (its reap is the no-op too)
    c2 = make(cache_dir=tmp_path)
    try:
        assert c2.stats()["disk_entries"] == 2
        a = c2.admit(c2.request(toks))
        c2.pipelines.drain()
        with c2.use(a) as run:
            assert run.hit_tokens == 2 * L
            check_compressed(run, toks)
            check_window(run, toks)
    finally:
        c2.close()


def loading(c: HeterogeneousKVCache) -> int:
    return int(c.stats()["blocks"].get("loading", 0))


@pytest.mark.parametrize("disk_blocks", [16, 300])
def test_loaded_files_wait_for_the_last_load_or_the_bound(tmp_path: Path, disk_blocks: int) -> None:
    """A loaded file's unlink waits while other disk loads run, and runs once the bound's
    doomed files wait, loads in flight or not (a server whose disk loads never all end still
    frees them).  The bound is ``REAP_AFTER``, or the disk tier's entries where they are more
    (the unlinks of a recovery larger than ``REAP_AFTER`` blocks wait for its end)."""
    from types import SimpleNamespace

    from kvstate.impl.diskreads import REAP_AFTER

    bound = max(REAP_AFTER, disk_blocks)
    toks = harness_tokens(4 * L + 1)
    persist(tmp_path, toks)
    c = HeterogeneousKVCache(
        G,
        cache_dir=tmp_path,
        executors="manual",
        writer=DeterministicWriter(),
        disk_blocks=disk_blocks,
    )
    try:
        on_disk = set(files(tmp_path))
        doom = c.test_hooks().replace_disk_method("delete", None)  # the tier's own
        extra = tmp_path / "extra"
        extra.mkdir()

        def doom_extra(n: int) -> None:  # files the test dooms itself
            for _ in range(n):
                f = extra / f"{len(list(extra.iterdir()))}"
                f.write_bytes(b"")
                doom(SimpleNamespace(path=f))

        c.admit(c.request(toks))
        io = c.pipelines.io
        assert len(io.pending()) == G.io_cap < 4  # the cap holds the other loads back
        io.run(io.pending()[0])  # one load ends while the others run: its unlink waits
        assert loading(c) > 0
        assert c.stats()["disk_unlinking"] == 1 and set(files(tmp_path)) == on_disk
        doom_extra(bound - 3)
        io.run(io.pending()[0])  # one short of the bound: nothing unlinked
        assert loading(c) > 0
        assert c.stats()["disk_unlinking"] == bound - 1 and set(files(tmp_path)) == on_disk
        doom_extra(1)
        io.run(io.pending()[0])  # the bound reached
        assert loading(c) > 0  # loads still run, yet every doomed file is gone
        assert c.stats()["disk_unlinking"] == 0 and not list(extra.iterdir())
        assert len(set(files(tmp_path))) == len(on_disk) - 3
        c.pipelines.drain()  # the last load's end unlinks the rest
        assert c.stats()["disk_unlinking"] == 0 and files(tmp_path) == []
    finally:
        c.close()


def test_a_failure_from_another_thread_waits_for_the_landing(tmp_path: Path) -> None:
    """A disk load's job copies its chunks into its slot without the lock (``job.landing``
    up meanwhile); a failure delivered from another thread (a test hook, the step-by-step
    surface) waits until the copy is over, so it never frees a slot being written."""
    import threading

    toks = harness_tokens(2 * L + 1)
    persist(tmp_path, toks)
    c = HeterogeneousKVCache(
        G, cache_dir=tmp_path, executors="manual", writer=DeterministicWriter()
    )
    lock = threading.RLock()
    changed = threading.Condition(lock)
    c.test_hooks().set_lock(lock, changed)  # (ours: the test ends the landing itself)
    try:
        c.admit(c.request(toks))
        io = c.pipelines.io
        rid = io.pending()[0]
        job = io.get(rid)
        job.landing = True  # (as its job's thread holds it while copying)
        failed = threading.Event()

        def fail() -> None:
            c.test_hooks().fail_load(rid, job, "a late I/O error", True)
            failed.set()

        t = threading.Thread(target=fail)
        t.start()
        assert not failed.wait(0.3)  # waiting for the landing: the load is still running
        assert c.inspect().meta.ckv[rid] == CKV.LOADING
        assert job.awaited  # (so the landing's end wakes it)
        with lock:  # the copy is over (as ``DiskReads._land`` ends it)
            job.landing = False
            changed.notify_all()
        assert failed.wait(10)
        t.join()
        assert c.inspect().meta.ckv[rid] == CKV.DISK
    finally:
        c.close()


def test_a_landing_copy_that_raises_fails_the_load(tmp_path: Path) -> None:
    """A chunk copy that raises while the job lands its chunks without the lock (here: chunks
    of the wrong size) is a failed load, as any failure under the lock was: the record back
    on disk and marked corrupt, its slot free again, no load left running, and the admission
    waiting for it truncates (``use`` serves nothing over the failed block)."""
    toks = harness_tokens(2 * L + 1)
    persist(tmp_path, toks)
    c = HeterogeneousKVCache(
        G, cache_dir=tmp_path, executors="manual", writer=DeterministicWriter()
    )
    try:
        free = c.stats()["device_free"]
        hooks = c.test_hooks()
        real = hooks.replace_disk_method("read_block", None)

        def short_chunks(entry: Any, with_swa: bool) -> Any:
            buf, chunks, swa = real(entry, with_swa)
            return buf, [x[:-1] for x in chunks], swa  # (authenticated, then cut: a bug's)

        hooks.replace_disk_method("read_block", short_chunks)
        a = c.admit(c.request(toks))
        rids = list(c.pipelines.io.pending())
        assert rids
        c.pipelines.drain()
        hooks.replace_disk_method("read_block", None)
        meta = c.inspect().meta
        for rid in rids:
            assert meta.ckv[rid] == CKV.DISK and meta.corrupt[rid]
        assert loading(c) == 0 and c.pipelines.errors() == []
        with c.use(a) as run:
            assert run.hit_tokens == 0
        assert c.stats()["device_free"] == free
    finally:
        c.close()
