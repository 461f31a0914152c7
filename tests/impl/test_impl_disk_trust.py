"""The disk tier and the recovery pipelines under hostile files and failing jobs.

Each test pins down one reliability property (issue 11, items 3-6 and 8-11): a failing job
never leaves a record stuck or a slot leaked; an admission never waits forever; disk I/O never
holds the cache lock; stray or planted files never stop, hang or fool a cache; a cache deletes
only its own files.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import struct
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from test_impl_cache import check_compressed as _check_compressed
from test_impl_disk import entry_path, files, persist

import kvstate.impl.disk as disk_mod
from kvstate.impl import EventKind, HeterogeneousKVCache, InvalidArgument
from kvstate.impl.disk import MAGIC, SUFFIX, DiskTier
from kvstate.impl.pipelines import OffloadJob
from kvstate.impl.testdata import harness_tokens
from kvstate.spec import small
from kvstate.spec.phases import CKV

G = small()
L = G.lcm_tokens
KEY = b"k" * 32


def persist_keyed(d: Path, toks: Any, key: bytes = KEY) -> None:
    c = HeterogeneousKVCache(G, cache_dir=d, executors="manual", disk_key=key)
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


class Proxy:
    """A job's view of its cache with some methods replaced (a compiled cache's methods cannot
    be patched; the job's reference to it can)."""

    def __init__(self, target: Any, **replaced: Any) -> None:
        self._target = target
        self.__dict__.update(replaced)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._target, name)


def check_compressed(run: Any, toks: Any) -> None:
    """Whatever a run serves is this prompt's content (nothing to check for an empty hit)."""
    if run.blocks:
        _check_compressed(run, toks)


def rewrite_header(path: Path, mutate: Any, key: bytes = KEY) -> None:
    """Rewrite an entry's header as a holder of the key would (a valid header MAC)."""
    raw = path.read_bytes()
    pre = struct.Struct("<8sI32s16s")
    magic, hlen, _, kid = pre.unpack(raw[: pre.size])
    header = json.loads(raw[pre.size : pre.size + hlen])
    hb = mutate(header)
    if not isinstance(hb, bytes):
        hb = json.dumps(hb, sort_keys=True).encode()
    tier = DiskTier(path.parent.parent / f"mac-{path.parent.name}", {}, G.load_steps, key=key)
    mac = tier.header_mac(hb)
    tier.close()
    path.write_bytes(pre.pack(magic, len(hb), mac, kid) + hb + raw[pre.size + hlen :])


# ---- item 3: a failing load job -----------------------------------------------------------
@pytest.mark.parametrize("mode", ["manual", "threads"])
def test_any_exception_in_a_load_fails_it_cleanly(
    tmp_path: Path, mode: str, monkeypatch: Any
) -> None:
    toks = harness_tokens(3 * L + 1)
    persist(tmp_path, toks)
    c = HeterogeneousKVCache(G, cache_dir=tmp_path, executors=mode)
    try:
        free, swa_free = c.inspect().tiers.slots.free, c.inspect().tiers.swa_pool.free
        # the first chunk read comes back one byte short, as from an inconsistent chunk table:
        # landing it raises inside the (possibly compiled) tiers, not a CorruptEntry
        # (a disk load reads its block with read_block, all chunks at once: the first chunk
        # of the first block read is the short one)
        name = "read_block"  # every disk load's read (DiskTier.read_block)
        real: Any = None
        calls = itertools.count(1)  # (atomic: the I/O workers read concurrently)

        def broken(*args: Any) -> Any:
            first = next(calls) == 1
            data = real(*args)
            if name == "read_block":
                base, chunks, swa = data
                return base, [chunks[0][:-1], *chunks[1:]] if first else chunks, swa
            return data[:-1] if first else data

        real = c.test_hooks().replace_disk_method(name, broken)
        a = c.admit(c.request(toks))
        if mode == "manual":
            c.pipelines.drain()
            c.pipelines.drain()  # does not raise again
        with c.use(a, timeout=20) as run:
            assert run.hit_tokens < 3 * L  # truncated to the valid prefix
            check_compressed(run, toks)
        assert c.events.of(EventKind.LOAD_FAILED)
        assert c.inspect().io_inflight == 0
        assert not any(c.inspect().meta.ckv[r] == CKV.LOADING for r in c.inspect().index.values())
        c.tick(100)
        c.evict(100)
        assert c.inspect().tiers.slots.free == free  # the failed load's slot came back
        assert c.inspect().tiers.swa_pool.free == swa_free  # and its window pages
    finally:
        c.close()


def test_inconsistent_chunk_table_is_a_corrupt_entry(tmp_path: Path) -> None:
    toks = harness_tokens(3 * L + 1)
    persist_keyed(tmp_path, toks)
    victim = files(tmp_path)[0]

    def swap(h: dict[str, Any]) -> dict[str, Any]:
        h["chunks"][0][1], h["chunks"][1][1] = h["chunks"][1][1], h["chunks"][0][1]
        return h

    rewrite_header(victim, swap)
    c = HeterogeneousKVCache(G, cache_dir=tmp_path, executors="manual", disk_key=KEY)
    try:
        assert c.stats()["blocks"]["disk"] == 2  # rejected when scanned, the rest adopted
        assert not victim.exists()
        a = c.admit(c.request(toks))
        c.pipelines.drain()
        with c.use(a) as run:
            check_compressed(run, toks)
        assert c.pipelines.errors() == []
    finally:
        c.close()


# ---- item 4: an admission never waits forever for a load that cannot start -----------------
def test_queued_loads_without_device_room_do_not_leave_admission_pending(tmp_path: Path) -> None:
    toks = harness_tokens(3 * L + 1)  # 3 blocks: the store keeps every window (swa_kept)
    persist(tmp_path, toks)
    c = HeterogeneousKVCache(G, cache_dir=tmp_path, executors="manual", device_blocks=4)
    try:
        other = harness_tokens(2 * L + 1, seed=5)
        a0 = c.admit(c.request(other))
        with c.use(a0):
            pass
        b = c.admit(c.request(other))
        with c.use(b):  # 2 device slots pinned; 2 left for 3 disk blocks (io_cap 2)
            a = c.admit(c.request(toks))
            assert a.state == "pending"
            c.pipelines.drain()
            c.pipelines.drain()
            with c.use(a) as run:  # truncated, not NotReady forever
                assert 0 < run.hit_tokens < 3 * L
                check_compressed(run, toks)
        assert not c.inspect().want_rebuild and not c.inspect().want_tail_check
        assert c.inspect().io_inflight == 0 and not c.inspect().io_waiting
    finally:
        c.close()


# ---- item 5: an offload's choice and transition are one step --------------------------------
def test_offload_done_is_atomic_with_its_guard(tmp_path: Path, monkeypatch: Any) -> None:
    c = HeterogeneousKVCache(G, executors="manual")
    try:
        toks = harness_tokens(2 * L + 1)
        a = c.admit(c.request(toks))
        with c.use(a):
            pass
        c.tick(10)
        host_free = c.inspect().tiers.host_slots.free
        assert c.offload(1) == 1
        core, act = c.inspect(), c.test_hooks().act
        (rid,) = [r for r in core.index.values() if core.meta.ckv[r] == CKV.OFFLOADING]
        raced = threading.Event()
        job = core.job("dma", rid)
        owner = job.owner

        def can(action: str, r: Any) -> bool:
            ok = owner.can(action, r)
            if action == "offload_done" and not raced.is_set():
                raced.set()  # another thread leases the block between the check and the step
                t = threading.Thread(target=act, args=("touch", rid, 2))
                t.start()
                t.join(timeout=0.5)  # blocked while the job holds the lock (as it must)
            return ok

        job.owner = Proxy(owner, can=can)  # the part the job calls back (works compiled too)
        c.pipelines.drain()
        time.sleep(0.2)  # the toucher ran after the job's step
        assert core.meta.ckv[rid] in (CKV.HOST, CKV.READY)  # never left OFFLOADING
        assert not core.busy()
        if core.meta.ckv[rid] == CKV.READY:
            assert core.tiers.host_slots.free == host_free
    finally:
        c.close()


@pytest.mark.parametrize("mode", ["manual", "threads"])
def test_a_failing_offload_is_cancelled(mode: str, monkeypatch: Any) -> None:
    c = HeterogeneousKVCache(G, executors=mode)
    try:
        toks = harness_tokens(2 * L + 1)
        a = c.admit(c.request(toks))
        with c.use(a):
            pass
        c.tick(10)
        host_free = c.inspect().tiers.host_slots.free

        def broken(*args: Any) -> None:
            raise RuntimeError("DMA engine fault")

        real_step = OffloadJob.step

        def step(job: Any) -> bool:  # the jobs see a cache whose offload_done raises
            job.owner = Proxy(job.owner, offload_done=broken)
            return real_step(job)

        monkeypatch.setattr(OffloadJob, "step", step)
        assert c.offload(2) == 2
        if mode == "manual":
            c.pipelines.drain()
        deadline = time.monotonic() + 10
        while c.inspect().busy() and time.monotonic() < deadline:
            time.sleep(0.01)
        core = c.inspect()
        assert not any(core.meta.ckv[r] == CKV.OFFLOADING for r in core.index.values())
        assert core.tiers.host_slots.free == host_free
        assert len(c.pipelines.errors()) == 2  # recorded, not silent
        b = c.admit(c.request(toks))  # the device copies are still served
        assert b.state == "validated" and b.hit_tokens == 2 * L
        c.abort(b.request)
    finally:
        c.close()


# ---- item 6: a stalled disk read blocks nothing that does not need the disk -----------------
def test_stalled_disk_read_blocks_no_other_work(tmp_path: Path) -> None:
    toks = harness_tokens(2 * L + 1)
    persist(tmp_path, toks)
    c = HeterogeneousKVCache(G, cache_dir=tmp_path, executors="threads")
    try:
        resident = harness_tokens(3 * L + 1, seed=9)
        a0 = c.admit(c.request(resident))
        with c.use(a0):
            pass
        entered, release = threading.Event(), threading.Event()
        real: Any = None

        def stalled(*args: Any) -> Any:
            entered.set()
            release.wait(timeout=5)  # a disk that hangs (bounded so a failure cannot hang)
            return real(*args)

        real = c.test_hooks().replace_disk_method("read_block", stalled)
        a = c.admit(c.request(toks))
        assert entered.wait(timeout=10)
        t0 = time.perf_counter()
        stats = c.stats()
        c.tick(1)
        b = c.admit(c.request(resident))
        with c.use(b) as run:
            assert run.hit_tokens == 3 * L
        took = time.perf_counter() - t0
        stalled_meanwhile = not release.is_set()
        release.set()
        print(f"stats+tick+admit+use during a stalled disk read: {took * 1000:.1f} ms")
        assert stalled_meanwhile and stats["io_inflight"] >= 1
        assert took < 2.0, f"work that needs no disk waited {took:.2f} s on a stalled read"
        with c.use(a, timeout=20) as run:
            assert run.hit_tokens == 2 * L
            check_compressed(run, toks)
    finally:
        release.set()
        c.close()


def test_spill_writes_without_the_lock(tmp_path: Path) -> None:
    c = HeterogeneousKVCache(G, cache_dir=tmp_path, executors="manual")
    try:
        toks = harness_tokens(2 * L + 1)
        a = c.admit(c.request(toks))
        with c.use(a):
            pass
        c.tick(10)
        c.offload(100)
        c.pipelines.drain()
        seen: list[bool] = []
        real: Any = None

        def probe(*args: Any, **kw: Any) -> Any:
            free = threading.Thread(target=lambda: seen.append(c.stats() is not None))
            free.start()
            free.join(timeout=1)  # another thread can use the cache during the write
            seen.append(not free.is_alive())
            return real(*args, **kw)

        real = c.test_hooks().replace_disk_write(probe)
        assert c.spill(100) == 2
        assert seen and all(seen)
    finally:
        c.close()


# ---- item 8: stray entries never stop or hang an open ---------------------------------------
def test_stray_entries_do_not_stop_or_hang_open(tmp_path: Path) -> None:
    toks = harness_tokens(3 * L + 1)
    persist_keyed(tmp_path, toks)
    entries = files(tmp_path)
    h = "ab" * 16
    (tmp_path / f"{h}{SUFFIX}").mkdir()
    (tmp_path / f".{h}{SUFFIX}.1.2.tmp").mkdir()
    os.mkfifo(tmp_path / f"{'cd' * 16}{SUFFIX}")
    (tmp_path / f"{'ef' * 16}{SUFFIX}").symlink_to(entries[0])
    victims = entries
    shapes = [b"[1, 2]", b"null", b"[" * 100_000 + b"]" * 100_000]
    for path, shape in zip(victims, shapes, strict=True):
        rewrite_header(path, lambda _h, s=shape: s)
    out: list[Any] = []

    def open_it() -> None:
        try:
            out.append(
                HeterogeneousKVCache(G, cache_dir=tmp_path, executors="manual", disk_key=KEY)
            )
        except BaseException as exc:  # noqa: BLE001
            out.append(exc)

    t = threading.Thread(target=open_it, daemon=True)
    t.start()
    t.join(timeout=20)
    assert not t.is_alive(), "opening the cache hung"
    (c,) = out
    assert isinstance(c, HeterogeneousKVCache), c
    try:
        assert c.stats()["disk_entries"] == 0  # the malformed headers were rejected
        assert (tmp_path / f"{h}{SUFFIX}").is_dir()  # strays are left where they are
        assert (tmp_path / f"{'cd' * 16}{SUFFIX}").exists()
    finally:
        c.close()


# ---- item 9: authentication ----------------------------------------------------------------
def test_planted_entry_under_a_victims_key_is_not_served(tmp_path: Path) -> None:
    victim_toks = harness_tokens(2 * L + 1, seed=1)
    other_toks = harness_tokens(2 * L + 1, seed=2)
    persist(tmp_path, other_toks)
    c0 = HeterogeneousKVCache(G, cache_dir=tmp_path / "keys", executors="manual")
    vkeys, okeys = c0.chain(victim_toks).keys, c0.chain(other_toks).keys
    c0.close()
    attacker_key = os.urandom(32)  # all an attacker without the directory's key can use
    for vk, ok in zip(vkeys[:2], okeys[:2], strict=True):
        # the names a predictable scheme would give the victim's entries (the keyed names
        # cannot be computed without the directory's key)
        src, dst = entry_path(tmp_path, ok), tmp_path / (vk.hex() + SUFFIX)
        raw = src.read_bytes()
        magic = raw[:8]
        if magic == b"KVSTATE\x01":  # the unkeyed layout: CRC-32 of the header
            import zlib

            hlen = struct.unpack("<I", raw[8:12])[0]
            hb = raw[16 : 16 + hlen].replace(ok.hex().encode(), vk.hex().encode())
            dst.write_bytes(
                raw[:8] + struct.pack("<II", hlen, zlib.crc32(hb)) + hb + raw[16 + hlen :]
            )
        else:
            pre = struct.Struct("<8sI32s16s")
            _, hlen, _, kid = pre.unpack(raw[: pre.size])
            hb = raw[pre.size : pre.size + hlen].replace(ok.hex().encode(), vk.hex().encode())
            mac = hashlib.blake2b(attacker_key + vk + hb, digest_size=32).digest()
            forged = pre.pack(magic, hlen, mac, kid) + hb + raw[pre.size + hlen :]
            dst.write_bytes(forged)
            src.write_bytes(forged)  # and under the other entry's own (keyed) name
    c = HeterogeneousKVCache(G, cache_dir=tmp_path, executors="manual")
    try:
        a = c.admit(c.request(victim_toks))
        c.pipelines.drain()
        with c.use(a) as run:
            check_compressed(run, victim_toks)  # whatever is served is the victim's content
            assert run.hit_tokens == 0
    finally:
        c.close()


def test_payload_edit_is_not_served(tmp_path: Path) -> None:
    toks = harness_tokens(2 * L + 1)
    persist(tmp_path, toks)
    for f in files(tmp_path):
        raw = bytearray(f.read_bytes())
        for i in (-3, -200, -400):
            raw[i] ^= 0x5A
        f.write_bytes(bytes(raw))
    c = HeterogeneousKVCache(G, cache_dir=tmp_path, executors="manual")
    try:
        a = c.admit(c.request(toks))
        c.pipelines.drain()
        with c.use(a) as run:
            assert run.hit_tokens == 0
        assert len(c.events.of(EventKind.LOAD_FAILED)) >= 1
    finally:
        c.close()


@pytest.mark.parametrize("section", ["chunk", "window"])
def test_a_mac_failure_in_a_concurrent_load_fails_it_cleanly(tmp_path: Path, section: str) -> None:
    """Loads verify their chunks on the I/O workers, concurrently with the other loads' reads: a
    MAC mismatch found there (a middle chunk, or the window's section) fails that load alone,
    serves none of its bytes, and leaves no block loading and no slot or page taken."""
    toks = harness_tokens(4 * L + 1)
    persist_keyed(tmp_path, toks)
    c0 = HeterogeneousKVCache(G, cache_dir=tmp_path / "keys", executors="manual", disk_key=KEY)
    keys = c0.chain(toks).keys
    c0.close()
    pre = struct.Struct("<8sI32s16s")
    victim = 3  # blocks 1-3 kept their windows at the store (Geometry.swa_kept)
    path = entry_path(tmp_path, keys[victim], KEY)
    raw = bytearray(path.read_bytes())
    _, hlen, _, _ = pre.unpack(bytes(raw[: pre.size]))
    header = json.loads(raw[pre.size : pre.size + hlen])
    lo, hi = header["chunks"][1][2:4] if section == "chunk" else header["swa_section"][:2]
    raw[pre.size + hlen + (lo + hi) // 2] ^= 0x01
    path.write_bytes(bytes(raw))
    c = HeterogeneousKVCache(G, cache_dir=tmp_path, executors="threads", disk_key=KEY)
    try:
        free, swa_free = c.inspect().tiers.slots.free, c.inspect().tiers.swa_pool.free
        a = c.admit(c.request(toks))
        with c.use(a, timeout=20) as run:
            assert run.hit_tokens == victim * L  # truncated at the damaged block
            check_compressed(run, toks)
        failed = c.events.of(EventKind.LOAD_FAILED)
        assert len(failed) == 1 and "MAC" in failed[0].detail
        assert c.pipelines.errors() == []  # a verification failure is a failed load, not a bug
        assert c.inspect().io_inflight == 0
        assert not any(c.inspect().meta.ckv[r] == CKV.LOADING for r in c.inspect().index.values())
        c.tick(100)
        c.evict(100)
        assert c.inspect().tiers.slots.free == free  # every slot came back, the failed load's too
        assert c.inspect().tiers.swa_pool.free == swa_free  # and every window page
    finally:
        c.close()


def test_directory_key_is_private_and_checked(tmp_path: Path) -> None:
    c = HeterogeneousKVCache(G, cache_dir=tmp_path, executors="manual")
    c.close()
    key = tmp_path / getattr(disk_mod, "KEY_FILE", ".kvstate-key")
    st = key.stat()
    assert st.st_mode & 0o777 == 0o600 and st.st_size == 32
    key.chmod(0o644)
    with pytest.raises(InvalidArgument, match="0600"):
        HeterogeneousKVCache(G, cache_dir=tmp_path, executors="manual")
    key.unlink()
    secret = tmp_path / "elsewhere"
    secret.write_bytes(b"x" * 32)
    secret.chmod(0o600)
    key.symlink_to(secret)
    with pytest.raises(InvalidArgument):
        HeterogeneousKVCache(G, cache_dir=tmp_path, executors="manual")


# ---- item 10: temporaries never follow a planted symlink ------------------------------------
def test_spill_never_follows_a_planted_symlink(tmp_path: Path) -> None:
    d, outside = tmp_path / "cache", tmp_path / "outside"
    d.mkdir()
    outside.mkdir()
    c = HeterogeneousKVCache(G, cache_dir=d, executors="manual")
    try:
        toks = harness_tokens(2 * L + 1)
        a = c.admit(c.request(toks))
        with c.use(a):
            pass
        for k in c.chain(toks).keys:  # every name the predictable scheme could use next
            for n in range(64):
                target = outside / f"{k.hex()}.{n}"
                (d / f".{k.hex()}{SUFFIX}.{os.getpid()}.{n}.tmp").symlink_to(target)
        c.tick(10)
        c.offload(100)
        c.pipelines.drain()
        assert c.spill(100) == 2
        assert list(outside.iterdir()) == []  # nothing written through a symlink
        assert len(files(d)) == 2
    finally:
        c.close()


# ---- item 11: only kvstate's own files are deleted ------------------------------------------
def test_open_deletes_only_its_own_files(tmp_path: Path) -> None:
    toks = harness_tokens(2 * L + 1)
    persist(tmp_path, toks)
    foreign = {
        ".editor.swp.tmp": b"user data",
        f".{'aa' * 16}{SUFFIX}.123.4.tmp": b"not kvstate's",
        "notes.kvb": b"a user's file",
        f"{'bb' * 16}{SUFFIX}": b"JUNK" * 10,
        "README": b"hello",
    }
    for name, data in foreign.items():
        (tmp_path / name).write_bytes(data)
    own_tmp = tmp_path / f".{'cc' * 16}{SUFFIX}.x1y2.tmp"
    own_tmp.write_bytes(MAGIC[:5])  # a kvstate writer killed mid-prefix
    c = HeterogeneousKVCache(G, cache_dir=tmp_path, executors="manual")
    try:
        for name, data in foreign.items():
            assert (tmp_path / name).read_bytes() == data, name
        assert not own_tmp.exists()
        assert c.stats()["disk_entries"] == 2
    finally:
        c.close()


def test_empty_cache_dir_is_refused(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "keep.tmp").write_bytes(b"x")
    with pytest.raises(InvalidArgument):
        HeterogeneousKVCache(G, cache_dir="", executors="manual")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.tmp"]


@pytest.mark.parametrize("direct", [True, False], ids=["direct", "buffered"])
def test_scratch_reads_serve_each_chunk_or_nothing(tmp_path: Path, direct: bool) -> None:
    """A load step reads its chunk into the thread's reusable buffer: each read returns that
    chunk's own bytes (a longer chunk read before does not show through a shorter one), a chunk
    whose bytes were edited raises instead of returning them, and the next read after the
    failure is whole again: through the page cache and with direct reads (the chunks start and
    end off the alignment, the last one at an unaligned end of file)."""
    import torch

    tier = DiskTier(tmp_path, {}, 2, key=KEY)
    tier.direct = direct and tier.direct
    g = torch.Generator().manual_seed(3)
    sizes = {b"\x01": (700, 300), b"\x02": (40, 90)}
    want = {}
    for key, (a, b) in sizes.items():
        units = [("u", i, torch.randint(0, 256, (n,), generator=g, dtype=torch.uint8))
                 for i, n in enumerate((a, b))]  # fmt: skip
        tier.write(key, ver=1, gen=1, fmt=0, tail=0, swa=0, units=units, swa_data=None)
        want[key] = [t.clone() for _, _, t in units]
    entries = {e.key: e for e in tier.scan()[0]}
    for key in (b"\x01", b"\x02", b"\x01"):
        for k in range(2):
            got = tier.read_chunk(entries[key], k, True)
            assert torch.equal(got, want[key][k])
    e = entries[b"\x01"]
    raw = bytearray(e.path.read_bytes())
    raw[e.payload_offset + 5] ^= 1  # one bit of chunk 0
    e.path.write_bytes(bytes(raw))
    with pytest.raises(disk_mod.CorruptEntry):
        tier.read_chunk(e, 0, True)
    assert torch.equal(tier.read_chunk(entries[b"\x02"], 1, True), want[b"\x02"][1])


def _direct_supported(d: Path) -> bool:
    flag = getattr(os, "O_DIRECT", 0)
    if not flag:
        return False
    p = d / "probe"
    p.write_bytes(b"x" * 4096)
    try:
        os.close(os.open(p, os.O_RDONLY | flag))
    except OSError:
        return False
    finally:
        p.unlink()
    return True


def _random_entry(tier: DiskTier, key: bytes, seed: int) -> tuple[Any, Any, Any]:
    """Write an entry whose units have odd sizes; returns (entry, payload bytes, window)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    units = [("u", i, torch.randint(0, 256, (n,), generator=g, dtype=torch.uint8))
             for i, n in enumerate((5000, 12345, 777, 9001, 4096))]  # fmt: skip
    swa = torch.randint(0, 256, (333,), generator=g, dtype=torch.uint8)
    tier.write(key, ver=1, gen=1, fmt=0, tail=0, swa=0, units=units, swa_data=swa)
    entry = {e.key: e for e in tier.scan()[0]}[key]
    return entry, torch.cat([t for _, _, t in units]), swa


def test_direct_reads_are_the_buffered_bytes(tmp_path: Path) -> None:
    """Where the file system takes ``O_DIRECT``, payload reads use it (and keep using it), and
    every chunk and the window read direct, fresh or into the scratch buffer, are the bytes a
    buffered read returns (the aligned window around a chunk never leaks into it)."""
    import torch

    if not _direct_supported(tmp_path):
        pytest.skip("this file system refuses O_DIRECT")
    tier = DiskTier(tmp_path, {}, 3, key=KEY)
    assert tier.direct
    entry, flat, swa = _random_entry(tier, b"\x05", 11)
    for scratch in (True, False, True):
        for k in range(3):
            lo, hi = entry.chunks[k][2], entry.chunks[k][3]
            assert torch.equal(tier.read_chunk(entry, k, scratch), flat[lo:hi])
    assert torch.equal(tier.read_swa(entry), swa)
    assert tier.direct  # nothing was refused: still direct
    tier.direct = False
    for k in range(3):
        lo, hi = entry.chunks[k][2], entry.chunks[k][3]
        assert torch.equal(tier.read_chunk(entry, k, True), flat[lo:hi])


@pytest.mark.parametrize("direct", [True, False], ids=["direct", "buffered"])
def test_a_block_read_serves_every_chunk_or_nothing(tmp_path: Path, direct: bool) -> None:
    """``read_block`` (a disk load's one read of its file) returns each chunk's and the
    window's own bytes, through a buffer given back and reused by a bigger and a smaller entry
    (nothing of a previous block shows through); one edited byte anywhere it covers (any chunk,
    the window when asked for) raises and returns nothing; the window is not read unless
    asked for (an edit there does not fail a load that does not restore it)."""
    import torch

    tier = DiskTier(tmp_path, {}, 3, key=KEY)
    tier.direct = direct and tier.direct and _direct_supported(tmp_path)
    small_entry = _random_entry(tier, b"\x07", 13)
    big_entry = _random_entry(tier, b"\x08", 14)
    for entry, flat, swa in (big_entry, small_entry, big_entry, small_entry):
        for with_swa in (True, False):
            base, chunks, got_swa = tier.read_block(entry, with_swa)
            assert len(chunks) == 3
            for k, data in enumerate(chunks):
                lo, hi = entry.chunks[k][2], entry.chunks[k][3]
                assert torch.equal(data, flat[lo:hi])
            assert (got_swa is not None) == with_swa
            if got_swa is not None:
                assert torch.equal(got_swa, swa)
            tier.give_back(base)
    entry, flat, swa = big_entry
    good = entry.path.read_bytes()
    spots = [entry.chunks[k][2] + (entry.chunks[k][3] - entry.chunks[k][2]) // 2 for k in range(3)]
    assert entry.swa_section is not None
    for at in [*spots, entry.chunks[2][3] - 1, entry.swa_section[0], entry.swa_section[1] - 1]:
        raw = bytearray(good)
        raw[entry.payload_offset + at] ^= 1
        entry.path.write_bytes(bytes(raw))
        in_window = at >= entry.swa_section[0]
        with pytest.raises(disk_mod.CorruptEntry):
            tier.read_block(entry, True)
        if in_window:
            tier.read_block(entry, False)  # the window is not read, nor needed
        else:
            with pytest.raises(disk_mod.CorruptEntry):
                tier.read_block(entry, False)
    entry.path.write_bytes(good)
    assert torch.equal(tier.read_block(entry, True)[1][2], flat[entry.chunks[2][2] :])


@pytest.mark.parametrize("where", ["open", "read"])
def test_refused_direct_io_falls_back_to_the_page_cache(
    tmp_path: Path, monkeypatch: Any, where: str
) -> None:
    """A file system that refuses ``O_DIRECT`` (EINVAL at open, as tmpfs did, or at the read)
    gets buffered reads: the same bytes, the same checks (an edited chunk still raises), and
    the tier stops asking for direct I/O."""
    import errno

    import torch

    flag = getattr(os, "O_DIRECT", 0)
    if not flag:
        pytest.skip("no O_DIRECT on this platform")
    tier = DiskTier(tmp_path, {}, 3, key=KEY)
    entry, flat, swa = _random_entry(tier, b"\x06", 12)
    tier.direct = True
    real_open, real_preadv = os.open, os.preadv
    refused: list[str] = []

    def open_(path: Any, flags: int, *a: Any) -> int:
        if where == "open" and flags & flag:
            refused.append("open")
            raise OSError(errno.EINVAL, "Invalid argument (O_DIRECT refused)")
        return real_open(path, flags, *a)

    def preadv(fd: int, bufs: Any, off: int) -> int:
        if where == "read" and fcntl_direct(fd):
            refused.append("read")
            raise OSError(errno.EINVAL, "Invalid argument (O_DIRECT refused)")
        return real_preadv(fd, bufs, off)

    def fcntl_direct(fd: int) -> bool:
        import fcntl

        return bool(fcntl.fcntl(fd, fcntl.F_GETFL) & flag)

    monkeypatch.setattr(disk_mod.os, "open", open_)
    monkeypatch.setattr(disk_mod.os, "preadv", preadv)
    lo, hi = entry.chunks[1][2], entry.chunks[1][3]
    assert torch.equal(tier.read_chunk(entry, 1, True), flat[lo:hi])
    assert refused == [where] and not tier.direct
    for k in range(3):
        lo, hi = entry.chunks[k][2], entry.chunks[k][3]
        assert torch.equal(tier.read_chunk(entry, k), flat[lo:hi])
    assert torch.equal(tier.read_swa(entry), swa)
    monkeypatch.undo()
    raw = bytearray(entry.path.read_bytes())
    raw[entry.payload_offset + entry.chunks[2][2] + 7] ^= 1
    entry.path.write_bytes(bytes(raw))
    with pytest.raises(disk_mod.CorruptEntry):
        tier.read_chunk(entry, 2, True)
    assert refused == [where]  # asked once, then buffered for good
