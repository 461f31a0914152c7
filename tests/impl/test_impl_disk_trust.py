"""The disk tier under hostile files: an inconsistent chunk table is a corrupt entry; stray or
planted files never stop, hang or fool a cache (authentication, a private directory key, no
planted symlink followed); a cache deletes only its own files."""

from __future__ import annotations

import hashlib
import json
import os
import struct
import threading
from pathlib import Path
from typing import Any

import pytest
from cache_checks import make
from disk_checks import KEY, check_compressed, persist_keyed, rewrite_header
from test_impl_disk import entry_path, files, persist

import kvstate.impl.disk as disk_mod
from kvstate.impl import EventKind, HeterogeneousKVCache, InvalidArgument
from kvstate.impl.disk import MAGIC, SUFFIX
from kvstate.impl.testdata import DeterministicWriter, harness_tokens
from kvstate.spec import small
from kvstate.spec.phases import CKV

G = small()
L = G.lcm_tokens


def test_inconsistent_chunk_table_is_a_corrupt_entry(tmp_path: Path) -> None:
    toks = harness_tokens(3 * L + 1)
    persist_keyed(tmp_path, toks)
    victim = files(tmp_path)[0]

    def swap(h: dict[str, Any]) -> dict[str, Any]:
        h["chunks"][0][1], h["chunks"][1][1] = h["chunks"][1][1], h["chunks"][0][1]
        return h

    rewrite_header(victim, swap)
    c = make(cache_dir=tmp_path, disk_key=KEY)
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
            out.append(make(cache_dir=tmp_path, disk_key=KEY))
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
    c0 = make(cache_dir=tmp_path / "keys")
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
    c = make(cache_dir=tmp_path)
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
    c = make(cache_dir=tmp_path)
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
    c0 = make(cache_dir=tmp_path / "keys", disk_key=KEY)
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
    c = HeterogeneousKVCache(
        G, cache_dir=tmp_path, executors="threads", disk_key=KEY, writer=DeterministicWriter()
    )
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
    c = make(cache_dir=tmp_path)
    c.close()
    key = tmp_path / getattr(disk_mod, "KEY_FILE", ".kvstate-key")
    st = key.stat()
    assert st.st_mode & 0o777 == 0o600 and st.st_size == 32
    key.chmod(0o644)
    with pytest.raises(InvalidArgument, match="0600"):
        make(cache_dir=tmp_path)
    key.unlink()
    secret = tmp_path / "elsewhere"
    secret.write_bytes(b"x" * 32)
    secret.chmod(0o600)
    key.symlink_to(secret)
    with pytest.raises(InvalidArgument):
        make(cache_dir=tmp_path)


# ---- item 10: temporaries never follow a planted symlink ------------------------------------
def test_spill_never_follows_a_planted_symlink(tmp_path: Path) -> None:
    d, outside = tmp_path / "cache", tmp_path / "outside"
    d.mkdir()
    outside.mkdir()
    c = make(cache_dir=d)
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
    c = make(cache_dir=tmp_path)
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
        make(cache_dir="")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.tmp"]
