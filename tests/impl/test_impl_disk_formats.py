"""Entries this cache must not read: another key's (left alone, and served again under their
own key) and an older format's (kvstate's, but stale: deleted at open, never loaded).

Moved out of ``test_impl_disk_trust.py`` to keep both files small; the helpers rewrite an entry
as an older format of kvstate wrote it, every MAC valid under the directory's key.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import struct
from collections.abc import Callable
from pathlib import Path

import pytest
from cache_checks import make
from disk_checks import KEY, check_compressed, persist_keyed
from test_impl_disk import files

from kvstate.impl import EventKind, InvalidArgument
from kvstate.impl.disk import MAGIC, SUFFIX
from kvstate.impl.testdata import harness_tokens
from kvstate.spec import small

G = small()
L = G.lcm_tokens


def test_entries_written_under_another_key_are_misses_and_left_alone(tmp_path: Path) -> None:
    """Opening a directory with another key neither reads nor deletes the first key's entries
    (their key id names another key: someone else's, not damage), and the first key serves
    them again afterwards, every byte exact."""
    toks = harness_tokens(2 * L + 1)
    persist_keyed(tmp_path, toks, key=b"a" * 32)
    before = {p.name: p.read_bytes() for p in files(tmp_path)}
    assert len(before) == 2
    c = make(cache_dir=tmp_path, disk_key=b"b" * 32)
    try:
        assert c.stats()["disk_entries"] == 0 and c.events.of(EventKind.REMOVED) == []
        assert (
            sorted(why.split(": ")[1] for _, why in c.inspect().disk.foreign)
            == ["written under another key"] * 2
        )
        a = c.admit(c.request(toks))
        c.pipelines.drain()
        with c.use(a) as run:
            assert run.hit_tokens == 0
    finally:
        c.close()
    assert {p.name: p.read_bytes() for p in files(tmp_path)} == before
    c = make(cache_dir=tmp_path, disk_key=b"a" * 32)
    try:
        assert c.stats()["disk_entries"] == 2
        a = c.admit(c.request(toks))
        c.pipelines.drain()
        with c.use(a) as run:
            assert run.hit_tokens == 2 * L
            check_compressed(run, toks)
    finally:
        c.close()
    with pytest.raises(InvalidArgument):
        make(cache_dir=tmp_path, disk_key=b"short")


def _rewrite(
    path: Path,
    fmt: int,
    chunk_mac: Callable[[bytes, bytes, int, int, int, bytes], bytes],
    header_mac: Callable[[bytes, bytes], bytes],
) -> None:
    """Rewrite an entry as kvstate's format ``fmt`` wrote it: its magic and version, its
    prefix (no key id) and its name (the block key's hex), every MAC recomputed with that
    format's ``chunk_mac(blockkey, nonce, index, lo, hi, bytes)`` and ``header_mac(blockkey,
    header)`` (valid under the directory's key)."""
    raw = path.read_bytes()
    now = struct.Struct("<8sI32s16s")
    pre = struct.Struct("<8sI32s")
    _, hlen, _, _ = now.unpack(raw[: now.size])
    header = json.loads(raw[now.size : now.size + hlen])
    payload = raw[now.size + hlen :]
    blockkey = bytes.fromhex(header["key"])
    path.unlink()
    path = path.with_name(blockkey.hex() + SUFFIX)
    nonce = bytes.fromhex(header["nonce"])

    def mac(index: int, lo: int, hi: int) -> str:
        return chunk_mac(blockkey, nonce, index, lo, hi, payload[lo:hi]).hex()

    header["format"] = fmt
    header["chunks"] = [[*c[:4], mac(i, c[2], c[3])] for i, c in enumerate(header["chunks"])]
    if header["swa_section"] is not None:
        lo, hi, _ = header["swa_section"]
        header["swa_section"] = [lo, hi, mac(-1, lo, hi)]
    hb = json.dumps(header, sort_keys=True).encode()
    magic = b"KVSTATE" + bytes([fmt])
    path.write_bytes(pre.pack(magic, len(hb), header_mac(blockkey, hb)) + hb + payload)


def _as_format_2(path: Path, key: bytes) -> None:
    """Format 2: keyed BLAKE2b, personalised per domain."""

    def chunk(bk: bytes, nonce: bytes, i: int, lo: int, hi: int, data: bytes) -> bytes:
        h = hashlib.blake2b(key=key, digest_size=32, person=b"kvstate/chunk")
        for part in (bk, nonce, struct.pack("<qqq", i, lo, hi), data):
            h.update(part)
        return h.digest()

    def head(bk: bytes, hb: bytes) -> bytes:
        return hashlib.blake2b(bk + hb, key=key, digest_size=32, person=b"kvstate/header").digest()

    _rewrite(path, 2, chunk, head)


def _as_format_3(path: Path, key: bytes) -> None:
    """Format 3: HMAC-SHA256 per domain over the block key's length, the block key, the data."""

    def mac(domain: bytes, bk: bytes, *parts: bytes) -> bytes:
        h = hmac.new(key, domain, "sha256")
        for part in (struct.pack("<I", len(bk)), bk, *parts):
            h.update(part)
        return h.digest()

    def chunk(bk: bytes, nonce: bytes, i: int, lo: int, hi: int, data: bytes) -> bytes:
        return mac(b"kvstate/chunk/v3\x00", bk, nonce, struct.pack("<qqq", i, lo, hi), data)

    def head(bk: bytes, hb: bytes) -> bytes:
        return mac(b"kvstate/header/v3\x00", bk, hb)

    _rewrite(path, 3, chunk, head)


def _as_format_4(path: Path, key: bytes) -> None:
    """Format 4: keyed BLAKE3, one derived key per domain, over the block key's length, the
    block key and the data (entries named by the block key's hex)."""
    from blake3 import blake3

    def derived(context: str) -> bytes:
        return blake3(key, derive_key_context=context).digest()

    head_key = derived("kvstate 2026-12-01 disk entry header MAC, format 4")
    chunk_key = derived("kvstate 2026-12-01 disk entry chunk MAC, format 4")

    def chunk(bk: bytes, nonce: bytes, i: int, lo: int, hi: int, data: bytes) -> bytes:
        h = blake3(key=chunk_key)
        for part in (struct.pack("<I", len(bk)), bk, nonce, struct.pack("<qqq", i, lo, hi), data):
            h.update(part)
        return h.digest()

    def head(bk: bytes, hb: bytes) -> bytes:
        return blake3(struct.pack("<I", len(bk)) + bk + hb, key=head_key).digest()

    _rewrite(path, 4, chunk, head)


@pytest.mark.parametrize("old_format", [2, 3, 4])
def test_entries_of_a_previous_format_are_stale_never_read(tmp_path: Path, old_format: int) -> None:
    """Format 3 moved the MACs to HMAC-SHA256, format 4 to keyed BLAKE3, format 5 to keyed
    names and a key id: a file of an older format, valid under this directory's key, is
    kvstate's but stale (another magic): deleted at open, never loaded."""
    toks = harness_tokens(2 * L + 1)
    persist_keyed(tmp_path, toks)
    old = files(tmp_path)
    assert old and MAGIC == b"KVSTATE\x05"
    for f in old:
        {2: _as_format_2, 3: _as_format_3, 4: _as_format_4}[old_format](f, KEY)
    assert len(files(tmp_path)) == len(old)
    c = make(cache_dir=tmp_path, disk_key=KEY)
    try:
        removed = c.events.of(EventKind.REMOVED)
        assert len(removed) == len(old)
        assert all("bad magic" in e.detail for e in removed)
        assert c.stats()["disk_entries"] == 0 and files(tmp_path) == []
        a = c.admit(c.request(toks))
        c.pipelines.drain()
        with c.use(a) as run:
            assert run.hit_tokens == 0
        assert c.events.of(EventKind.LOADED) == []
    finally:
        c.close()
